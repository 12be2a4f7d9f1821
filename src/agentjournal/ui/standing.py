"""How a run goes on, for the viewer's pages: its lease and queue entry (``driver``),
what continues it (``continuation``) and whether the workers it waits for were heard
from lately (``going_on``). Plain data. Where a run stands and the words for it
(``standing_of``, ``decision_said``, ...) live below the CLI and the viewer, in
``agentjournal.summaries``."""

from __future__ import annotations

from typing import Any

from ..continuation import continuation
from ..errors import NoQueueError
from ..fleet import QueuedRun, queue_of
from ..state import RunState
from ..store import Lease, Store
from ..summaries import DONE as DONE  # (the viewer's app takes it from here)
from ..summaries import clock


def driver(store: Store, run_id: str, state: RunState,
           now: float) -> tuple[Lease | None, QueuedRun | None]:
    """The run's lease, and its queue entry unless it is not needed (the run ended, or
    its lease is held): the queue is read whole, and a live tail asks at every batch."""
    holder = store.holder(run_id)  # not state.run_id: '' in a log without run_started
    if state.status in DONE or (holder is not None and holder.expires_at > now):
        return holder, None
    return holder, queue_runs(store).get(run_id)


def queue_runs(store: Store) -> dict[str, QueuedRun]:
    """The fleet's queue entries by run id; none when the store has no queue (JSONL)."""
    try:
        return {q.run_id: q for q in queue_of(store).runs()}
    except NoQueueError:
        return {}


#: A worker whose last heartbeat is older than this is "not seen for a while".
WORKER_SILENT_S = 60.0


def going_on(store: Store, state: RunState, queued: QueuedRun | None, now: float,
             started: dict[str, Any] | None, store_hint: str = "") -> dict[str, Any]:
    """How the run continues (``continuation``), and whether the workers it waits for
    were heard from lately."""
    how = continuation(state, started=started, store_hint=store_hint,
                       queue_state=queued.state if queued else None,
                       waiting_for=queued.waiting_for if queued else None)
    return {"next": how.sentence, "command": how.command, "shell": how.shell,
            "silent": _workers_silent(store, now) if how.kind == "worker" else ""}


def _workers_silent(store: Store, now: float) -> str:
    """A sentence when no worker of the queue was heard from lately; empty otherwise."""
    try:
        beats = [w.heartbeat_at for w in queue_of(store).workers()]
    except NoQueueError:
        return ""
    if not beats:
        return ("no worker has been seen on this store: start one (agentjournal worker) "
                "or the run waits")
    quiet = now - max(beats)
    if quiet < WORKER_SILENT_S:
        return ""
    return (f"no worker has been seen for {quiet / 60:.0f} min (last heartbeat "
            f"{clock(max(beats))}): the run waits until one runs")


