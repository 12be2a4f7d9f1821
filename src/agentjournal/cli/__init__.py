"""``agentjournal``: the command line, a thin layer over the public API.

    init                                                   create a store (reading never does)
    runs [--limit N | --all] | show RUN [--at SEQ]         inspect runs, queued ones too
    events RUN | state RUN                                 (reading never writes)
    verify RUN | --all                                     snapshots against a full replay
    approvals | approve | deny | uncertain | resolve       a person's decisions
    run MODULE:OBJECT TASK | resume RUN | fork RUN         drive runs
    compensate RUN [--through SEQ] | cancel RUN [--compensate]   undo a run's effects (a saga)
    workspace RUN [--at SEQ | --restore SEQ]               a run's files, version by version
    gc --finished-older-than D --archive URL | restore RUN   archive old runs, bring one back
    demo                                                   the crash-and-resume story, end to end
    ui [--allow-decisions]                                 the operator's window in a browser

Exit codes, one convention for every command (``EXIT_CODES_HELP``, printed by every
``--help``): 0 done (a run finished, a saga compensated, a run cancelled, a decision
recorded); 1 usage or user error, a bad store URL, or a write the store refused (a
full disk, a read-only store); 2 run or store not found, or refused (a lease, a fence,
nothing pending by that id); 3 the store's data cannot be read (corrupt or damaged,
not a store, or written by a newer release); 4 stopped: a person must decide (``run``
and ``resume`` stopped for an approval, an uncertain call, an escalation or a pause;
``compensate`` and ``cancel --compensate`` stopped before an effect). Errors are one
line on stderr; ``--json`` output is the only thing on stdout.
"""

from . import (  # noqa: F401  (each registers its commands)
    check,
    decide,
    fleet,
    reading,
    reindex,
    retention,
    running,
    sagas,
    setup,
    snapshots,
    ui,
    workspaces,
)
from ._base import cli, main

__all__ = ["cli", "main"]
