"""Forking a run: a new run from a prefix of another's log, with the files of that seq.

Above both the journal and workspaces (a fork restores a workspace's files), so that the
journal knows no workspace.
"""

from __future__ import annotations

import uuid

import msgspec

from .errors import ConflictError
from .events import EventType
from .state import fold
from .store import Store, validate_run_id
from .store.base import missing_run
from .workspace import files_at_fork

__all__ = ["fork"]


def fork(store: Store, run_id: str, at_seq: int, new_run_id: str | None = None, *,
         force: bool = False) -> str:
    """Start a new run from the first ``at_seq`` events of ``run_id``; returns its id.

    The fork records its origin and keeps the origin's idempotency scope, so
    it never re-executes an effect its prefix recorded, nor one its origin (or any
    run of the scope) recorded after ``at_seq``: the loop asks the scope's other
    runs before making an effect (see peers.py). The world does not fork; the run's
    files do, so a tool declared ``local`` (one that edits them) is called.

    ``new_run_id`` omitted asks for a new id; an empty one is refused
    (InvalidRunIdError), never replaced by a made-up one.

    A run with a workspace: the fork starts from the files of ``at_seq`` (restored in
    their directory), refused (WorkspaceError) when the directory holds changes no
    checkpoint of the origin holds, unless ``force``.
    """
    log = list(store.read(run_id))
    prefix = log[:at_seq]
    if not prefix:
        raise missing_run(store, run_id)
    if at_seq < 1 or at_seq > len(prefix) or prefix[0].type is not EventType.RUN_STARTED:
        raise ValueError(f"run {run_id!r} has events 1..{len(prefix)}; fork at one of them")
    if new_run_id is None:
        new_run_id = f"{run_id[:100]}.fork-{uuid.uuid4().hex[:8]}"
    new_id = validate_run_id(new_run_id if new_run_id.strip() else "")  # "" is refused: empty
    origin_scope = fold(prefix[:1]).scope
    first = {**prefix[0].payload, "scope": origin_scope,
             "origin": {"run_id": run_id, "at_seq": at_seq}}
    # Copies keep their times, so an uncertain call's age stays true.
    copies = [msgspec.structs.replace(prefix[0], payload=first), *prefix[1:]]
    events = [msgspec.structs.replace(e, run_id=new_id, epoch=0) for e in copies]
    if taken := store.last_seq(new_id):
        raise ConflictError(new_id, 0, taken)
    restore = files_at_fork(run_id, log, at_seq, force=force)  # may refuse: nothing written
    store.append(new_id, events, expected_seq=0, epoch=0)
    # Only now, so a refused append (the id taken meanwhile, or archived) touches no
    # file. Should a restore fail, the fork's first resume finds its files differ from
    # the version it starts at, and tells the model.
    if restore is not None:
        restore(new_id)
    return new_id
