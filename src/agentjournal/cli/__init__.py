"""``agentjournal``: the command line, a thin layer over the public API.

    init                                                   create a store (reading never does)
    runs | show RUN [--at SEQ] | events RUN | state RUN    inspect runs (reading never writes)
    verify RUN | --all                                     snapshots against a full replay
    approvals | approve | deny | uncertain | resolve       a person's decisions
    run MODULE:OBJECT TASK | resume RUN | fork RUN         drive runs
    compensate RUN [--through SEQ] | cancel RUN [--compensate]   undo a run's effects (a saga)
    workspace RUN [--at SEQ | --restore SEQ]               a run's files, version by version
    gc --finished-older-than D --archive URL | restore RUN   archive old runs, bring one back
    demo                                                   the crash-and-resume story, end to end

Exit codes: 0 ok; 1 usage or user error, a bad store URL, or a write the store
refused (a full disk, a read-only store); 2 run or store not found, or refused (a
lease, a fence, nothing pending by that id); 3 the store's data cannot be read
(corrupt or damaged, not a store, or written by a newer release); 4 ``compensate``
stopped where a person must decide. Errors are one line on
stderr; ``--json`` output is the only thing on stdout.
"""

from . import (  # noqa: F401  (each registers its commands)
    decide,
    fleet,
    reading,
    retention,
    running,
    sagas,
    setup,
    snapshots,
    workspaces,
)
from ._base import cli, main

__all__ = ["cli", "main"]
