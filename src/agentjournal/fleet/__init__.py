"""Runs as a durable queue, drained by any number of workers (``agentjournal worker``).

``submit`` puts a run in the queue; a worker claims it with its lease and the next
epoch, runs it with the agent named by its ``agent_ref``, and hands it back done,
waiting for a person, or (draining) queued for another worker. The agent may be
another framework's, driven by an integration: a :class:`Runnable` (fleet/runnable.py).
SQLite serves the workers of one host; PostgreSQL those of many. JSONL has no queue.

During a rollout old and new workers run side by side: each serves the versions of the
agents it has (a ref naming :class:`Versions` serves several); a run moves to the newest
version of the worker that claims it, unless submitted with ``pin_version``: then only a
worker serving that version claims it (fleet/queue.py, fleet/versions.py).
"""

from __future__ import annotations

from ..agent import new_run_id, require_run_id
from ..errors import NoQueueError
from ..events import EventType
from ..journal import open_journal
from ..redaction import Redaction
from ..store import Store
from .queue import QUEUE_STATES, Claim, Queue, QueuedRun, QueueState, WorkerInfo
from .runnable import Runnable, Stopped
from .trust import ref_problem
from .versions import Versions, version_of

__all__ = ["QUEUE_STATES", "Claim", "Queue", "QueueState", "QueuedRun", "Runnable", "Stopped",
           "Versions", "WorkerInfo", "keep_waiting", "queue_of", "requeue", "submit",
           "version_of"]


def queue_of(store: Store) -> Queue:
    """The queue of ``store``; NoQueueError for a store that has none (JSONL). A handle
    standing for a store (the CLI's, read-only until a command writes) gives the store it
    writes through as ``writable``."""
    from ..store.sqlite import SQLiteStore

    store = getattr(store, "writable", store)

    if isinstance(store, SQLiteStore):
        from .sqlite import SQLiteQueue
        return SQLiteQueue(store)
    try:
        from ..store.postgres import PostgresStore
    except ImportError:  # no [postgres] extra: it cannot be a Postgres store
        PostgresStore = None  # type: ignore[assignment,misc]
    if PostgresStore is not None and isinstance(store, PostgresStore):
        from .postgres import PostgresQueue
        return PostgresQueue(store)
    raise NoQueueError(store.url)


def keep_waiting(store: Store, run_id: str, at_seq: int) -> None:
    """A person's decision left the run waiting for more of them (approvals, or uncertain
    calls only a person settles, still open): keep it waiting as of ``at_seq``, so no
    worker claims it, and holds its lease, while the person decides the next one. Call
    it holding the run's lease. Nothing on a store without a queue (JSONL), nor for a
    run that is not in the queue or not waiting."""
    try:
        queue = queue_of(store)
    except NoQueueError:
        return
    queue.keep_waiting(run_id, at_seq)


def submit(store: Store, agent_ref: str, task: str, run_id: str | None = None, *,
           queue: str = "default", priority: int = 0,
           redaction: Redaction | None = None, pin_version: str | None = None) -> str:
    """Put a run in the queue for a worker to run with the agent ``agent_ref``
    ("module:object"; workers run only the agents they trust, see fleet/trust.py);
    returns its run id (a new one unless given).

    ``pin_version``: only a worker serving that version of the agent claims the run,
    and runs it with that version, for its whole life; until one is live it waits
    queued (``QueuedRun.waiting_for`` says so), never parked. Unpinned (the default),
    any worker serving the agent claims it, and it moves to that worker's newest version.

    Submitting a run id again with the same agent, task and pin changes nothing and
    returns it; with another one it is refused (RunMismatchError): never a second run.
    The task is stored as the run would record it: with ``redaction`` (default: the
    common credential patterns) applied, since it waits on disk until a worker takes it.
    """
    if problem := ref_problem(agent_ref):
        raise ValueError(f"agent_ref {agent_ref!r}: {problem}")
    if pin_version is not None and not pin_version.strip():
        raise ValueError("pin_version is empty: give the version to pin the run to, or None")
    run_id = new_run_id() if run_id is None else require_run_id(run_id)
    kept = (Redaction() if redaction is None else redaction).scrub(task)
    queue_of(store).submit(run_id, agent_ref, kept, queue=queue, priority=priority,
                           pin_version=pin_version)
    return run_id


def requeue(store: Store, run_id: str, *, by: str, reason: str = "",
            forget_crashes: bool = True) -> bool:
    """A person sends a parked (poison) or waiting run back to the workers, its crash
    count forgotten (unless ``forget_crashes`` is False: a worker withdrawing a park
    that counted its own stop). False if it is neither. An escalated run waits for a
    person's decision: this is one, recorded in its log (``run_resumed`` with ``by`` and
    ``reason``) before the run is queued, so a worker drives it again."""
    queue = queue_of(store)
    if not any(r.run_id == run_id and r.state in ("parked", "waiting") for r in queue.runs()):
        return False
    if store.last_seq(run_id):
        with open_journal(store, run_id, owner=f"decision:{by}", must_exist=True) as j:
            if j.state.waits_for_a_person:
                j.record(EventType.RUN_RESUMED, by=by, reason=reason or "requeued")
    return queue.retry(run_id, forget_crashes=forget_crashes)
