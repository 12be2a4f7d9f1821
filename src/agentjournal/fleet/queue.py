"""The runs of a store as a durable queue: submit, claim, hand back.

A run is in the queue from ``submit`` on. Its state says what it waits for:

    queued   submitted, or handed back by a draining worker: any worker may take it
    running  a worker holds its lease; once the lease has expired, its worker died
             (or stalled) and any worker may take it over, with the next epoch
    waiting  it stopped for a person (paused, waiting for an approval, escalated);
             runnable again as soon as anything is appended to its log after that
             (a person's approval or verdict) and its lease is free (a person's
             decision holds it while it writes); a decision that leaves it waiting
             for the person still (approvals open, uncertain calls without a
             lookup) keeps it waiting (``keep_waiting``), so the person decides
             the next one at once, never meeting a worker's lease
    parked   it killed its worker too many times (a poison run), or a worker refused
             its agent ref (not trusted, not an agent): the reason is kept with it,
             and it is escalated in its log if it has one; like waiting, runnable
             again once a person has appended a decision or requeued it
    done     finished

``claim`` takes a runnable run (``claim_many``: several), its lease and the next epoch
in one statement (Postgres: ``FOR UPDATE SKIP LOCKED``; SQLite: one immediate
transaction), so the lease and its epoch stay the only owner of a run: a worker that
lost the lease is fenced on its next append. A claim of a run whose previous claim
never handed it back counts a crash; a clean hand-back (done or waiting) forgets them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Protocol

import msgspec

from ..store import Lease, Store

QueueState = Literal["queued", "running", "waiting", "parked", "done"]
QUEUE_STATES: tuple[QueueState, ...] = ("queued", "running", "waiting", "parked", "done")


class Claim(msgspec.Struct, frozen=True, kw_only=True):
    """A run a worker now owns, with what it needs to run it."""

    lease: Lease
    agent: str  # "module:object"
    task: str
    queue: str
    crashes: int  # earlier claims of this run that never handed it back


class QueuedRun(msgspec.Struct, frozen=True, kw_only=True):
    run_id: str
    queue: str
    state: QueueState
    priority: int
    agent: str
    worker: str | None
    crashes: int
    claims: int
    submitted_at: float  # seconds since the epoch
    changed_at: float
    runnable: bool  # a claim would take it now
    reason: str | None = None  # why a worker parked it


class WorkerInfo(msgspec.Struct, frozen=True, kw_only=True):
    worker_id: str  # host:pid:nonce
    host: str
    pid: int
    queues: list[str]
    runs: list[str]  # the runs it holds
    started_at: float
    heartbeat_at: float
    draining: bool = False


class Queue(Protocol):
    """What a store with a queue offers (SQLite: one host; Postgres: many)."""

    @property
    def store(self) -> Store: ...

    def submit(self, run_id: str, agent: str, task: str, *, queue: str = "default",
               priority: int = 0) -> bool:
        """Queue a new run; False if ``run_id`` was already submitted with this agent and
        task (nothing changes). Another agent or task under that id: RunMismatchError."""
        ...

    def claim(self, owner: str, ttl: float, queues: Sequence[str]) -> Claim | None:
        """Take the most urgent runnable run of ``queues``, with its lease, or None."""
        ...

    def claim_many(self, owner: str, ttl: float, queues: Sequence[str],
                   n: int) -> list[Claim]:
        """Up to ``n`` runs claimed at once (one statement on PostgreSQL, one transaction
        on SQLite), most urgent first: a worker with many free slots, taking over the
        runs of one that died."""
        ...

    def hand_back(self, lease: Lease, state: QueueState, at_seq: int,
                  reason: str | None = None) -> bool:
        """Give the run back in ``state`` (queued, waiting, parked or done) as of its log's
        ``at_seq``, and release the lease. ``reason``: why (kept with a parked run, shown
        by ``agentjournal queue``). False if the lease was no longer ours."""
        ...

    def keep_waiting(self, run_id: str, at_seq: int) -> None:
        """A person decided part of what the waiting run waits for (an approval, or an
        uncertain call, of several): it stays waiting as of its log's ``at_seq``. Called
        by the decision's writer while it holds the run's lease, so no claim came in
        between."""
        ...

    def absolve(self, run_id: str) -> None:
        """Take back one crash: a worker that lost the run's lease while it was alive
        (the store was away, the machine paused it) was not killed by the run."""
        ...

    def retry(self, run_id: str) -> bool:
        """Make a parked (or waiting) run runnable again and forget its crashes (and
        the reason it was parked)."""
        ...

    def runs(self) -> list[QueuedRun]: ...

    def beat(self, worker: WorkerInfo) -> None:
        """Record that ``worker`` is alive, what it holds, and whether it drains."""
        ...

    def forget(self, worker_id: str) -> None: ...

    def workers(self) -> list[WorkerInfo]: ...

    def next_expiry(self, queues: Sequence[str]) -> float | None:
        """Seconds until the soonest lease of a running run in ``queues`` expires (0.0
        if one has), None if no run there is running: an idle worker sleeps no longer
        than that, so it takes a dead worker's runs over as their leases expire, not at
        its next poll."""
        ...

    def wait(self, timeout: float) -> bool:
        """Block until work may be there (a coalesced wake-up) or ``timeout`` passes."""
        ...

    def wake(self) -> None:
        """Tell idle workers there may be work (Postgres: NOTIFY; elsewhere a no-op)."""
        ...

    def close(self) -> None: ...
