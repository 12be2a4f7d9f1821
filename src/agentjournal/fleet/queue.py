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

Each crash counted is a stop the run may have caused, and the queue keeps what it was,
one line a stop (``- epoch E: worker W ...``: the lease lapsed, or the run raised), in
the run's ``reason`` until the run is parked (the reason then names them) or handed
back clean. A worker that lost a run's lease while it was alive (paused past its lease,
the store away) did not crash: when it finds out, fenced, it takes its stop back
(``absolve``), even from a run already parked on it.

Versions (a rollout: old and new workers side by side). A claim says which versions of
which agent refs the claimer serves (``served``, fleet/versions.py). A run submitted
with ``pin_version`` is claimed only by a claim serving that version of its agent, in
the claim's one statement; an unpinned run by any claim, which runs it with its newest
version (the run moves to it). A pinned run that no live worker serves stays in its
state, never parked: ``QueuedRun.waiting_for`` says why (``unserved``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Literal, Protocol

import msgspec

from ..errors import RunMismatchError
from ..store import Lease, Store

QueueState = Literal["queued", "running", "waiting", "parked", "done"]
QUEUE_STATES: tuple[QueueState, ...] = ("queued", "running", "waiting", "parked", "done")

#: What a stop counted at a claim was, as far as the claim knows: the holder's lease
#: lapsed without a hand-back (its process killed, its host lost, or it hung; one that
#: was only paused takes the stop back when it wakes).
LAPSED = ("held it and stopped without handing it back: its lease lapsed (killed, or "
          "hung)")
_STOP = re.compile(r"- epoch \d+: ")
_WHOSE = re.compile(r"- epoch (\d+): worker (\S+)")
#: How the reason of a run parked as poison starts (a worker's _poison writes it).
POISONED = "parked by a worker: its workers stopped"


def stop_line(epoch: int, worker: str, what: str) -> str:
    """The line for a stop of the run's holder under ``epoch`` (what a claim writes)."""
    return f"- epoch {epoch}: worker {worker} {what}"


def whose(stop: str) -> str:
    """A stop line's epoch and worker, as ``epoch E (worker W)``."""
    found = _WHOSE.match(stop)
    return f"epoch {found[1]} (worker {found[2]})" if found else stop


def parked_reason(state: str, reason: str | None) -> str | None:
    """A row's reason as QueuedRun shows it: a parked run's, its stops on the same line."""
    return " ".join(reason.splitlines()) if state == "parked" and reason else None


def stops_in(reason: str | None) -> list[str]:
    """The stop lines a queue row's reason holds, oldest first."""
    return [line for line in (reason or "").splitlines() if _STOP.match(line)]


def has_stop(reason: str | None, epoch: int) -> bool:
    return any(line.startswith(f"- epoch {epoch}: ") for line in stops_in(reason))


def taken_back(state: str, crashes: int, reason: str | None,
               epoch: int | None) -> tuple[int, str | None] | None:
    """A queue row's crashes and reason once the stop under ``epoch`` (the newest if
    None) is taken back (``Queue.absolve``); None if it holds no such stop. A run parked
    as poison keeps only its other stops: its park is being withdrawn. One parked for
    another reason (its agent refused) is left as it is."""
    if crashes <= 0 or (state == "parked" and not (reason or "").startswith(POISONED)):
        return None
    lines = stops_in(reason)
    gone = lines[-1:] if epoch is None else [
        line for line in lines if line.startswith(f"- epoch {epoch}: ")]
    if not gone and epoch is not None:
        return None
    kept = [line for line in lines if line not in gone]
    return crashes - 1, "\n".join(kept) or None


#: What a claimer serves: for each agent ref, the versions of it it runs, newest first.
Served = Mapping[str, Sequence[str]]


def served_keys(served: Served | None) -> list[str]:
    """``served`` as the claim statements match it: ``"REF VERSION"`` (a ref has no
    spaces: fleet/trust.py's ``ref_problem``)."""
    return [f"{ref} {version}" for ref, versions in (served or {}).items()
            for version in versions]


def serves(served: Served | None, agent: str, pin_version: str | None) -> bool:
    """Whether a claim serving ``served`` may take a run of ``agent`` pinned to
    ``pin_version`` (None: unpinned, any claim may)."""
    return pin_version is None or pin_version in (served or {}).get(agent, ())


def live(worker: WorkerInfo, now: float) -> bool:
    """A worker that claims: not draining, and its last heartbeat within its TTL (it
    renews every third of one). A row of a release before versions has no TTL: 30 s."""
    return not worker.draining and now - worker.heartbeat_at <= (worker.ttl or 30.0)


def unserved(agent: str, pin_version: str | None, workers: Sequence[WorkerInfo],
             now: float) -> str | None:
    """Why no worker claims a run of ``agent`` pinned to ``pin_version``: no live
    worker serves that version (None if one does, or if the run is not pinned)."""
    if pin_version is None:
        return None
    alive = [w for w in workers if live(w, now)]
    if any(pin_version in w.versions.get(agent, ()) for w in alive):
        return None
    others = sorted({v for w in alive for v in w.versions.get(agent, ())})
    if others:
        now_served = f"live workers serve {', '.join(others)}"
    else:
        now_served = "no live worker serves it" if alive else "no worker is live"
    return (f"waiting for a worker serving version {pin_version} of {agent} ({now_served}):"
            f" start one whose code has that version (agentjournal worker --agents ...)")


class Claim(msgspec.Struct, frozen=True, kw_only=True):
    """A run a worker now owns, with what it needs to run it."""

    lease: Lease
    agent: str  # "module:object"
    task: str
    queue: str
    crashes: int  # earlier claims of this run that never handed it back
    stops: list[str] = []  # what each counted crash was (stop_line), oldest first
    pin_version: str | None = None  # run it with this version of its agent only


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
    runnable: bool  # a claim would take it now (if pinned: one serving its version)
    reason: str | None = None  # why a worker parked it (parked runs only), on one line
    stops: list[str] = []  # what each crash counted was (stop_line), oldest first
    pin_version: str | None = None  # only a worker serving this version claims it
    #: Why no worker claims it though it is runnable: pinned to a version no live worker
    #: serves (``unserved``, judged by the workers' heartbeats); None otherwise.
    waiting_for: str | None = None


class WorkerInfo(msgspec.Struct, frozen=True, kw_only=True):
    worker_id: str  # host:pid:nonce
    host: str
    pid: int
    queues: list[str]
    runs: list[str]  # the runs it holds
    started_at: float
    heartbeat_at: float
    draining: bool = False
    #: The versions it serves of each agent ref it has loaded, newest first.
    versions: dict[str, list[str]] = {}
    ttl: float | None = None  # its lease TTL: a heartbeat older than that is a dead worker's


class Queue(Protocol):
    """What a store with a queue offers (SQLite: one host; Postgres: many)."""

    @property
    def store(self) -> Store: ...

    def submit(self, run_id: str, agent: str, task: str, *, queue: str = "default",
               priority: int = 0, pin_version: str | None = None) -> bool:
        """Queue a new run (``pin_version``: claimed only by workers serving that version
        of ``agent``); False if ``run_id`` was already submitted with this agent, task and
        pin (nothing changes). Another one under that id: RunMismatchError."""
        ...

    def claim(self, owner: str, ttl: float, queues: Sequence[str], *,
              served: Served | None = None) -> Claim | None:
        """Take the most urgent runnable run of ``queues``, with its lease, or None.
        ``served``: the versions the claimer serves; a pinned run is taken only if it
        serves the run's version (None serves none: unpinned runs only)."""
        ...

    def claim_many(self, owner: str, ttl: float, queues: Sequence[str], n: int, *,
                   served: Served | None = None) -> list[Claim]:
        """Up to ``n`` runs claimed at once (one statement on PostgreSQL, one transaction
        on SQLite), most urgent first: a worker with many free slots, taking over the
        runs of one that died. ``served`` as for :meth:`claim`."""
        ...

    def pinned_agents(self, queues: Sequence[str]) -> list[str]:
        """The agent refs of the unfinished pinned runs in ``queues``: a worker trusting
        module prefixes loads those it trusts, so it knows which versions it serves."""
        ...

    def hand_back(self, lease: Lease, state: QueueState, at_seq: int,
                  reason: str | None = None) -> bool:
        """Give the run back in ``state`` (queued, waiting, parked or done) as of its log's
        ``at_seq``, and release the lease. ``reason``: why (kept with a parked run, shown
        by ``agentjournal queue``), followed by the stops counted (a run handed back
        done or waiting has none: its crashes are forgotten). False if the lease was no
        longer ours."""
        ...

    def note_stop(self, lease: Lease, what: str) -> None:
        """Say what the stop of the run under ``lease`` is, before the next claim counts
        it: the run raised (``what``) in a worker that leaves it to its lease. Nothing
        if the lease is no longer the run's."""
        ...

    def keep_waiting(self, run_id: str, at_seq: int) -> None:
        """A person decided part of what the waiting run waits for (an approval, or an
        uncertain call, of several): it stays waiting as of its log's ``at_seq``. Called
        by the decision's writer while it holds the run's lease, so no claim came in
        between."""
        ...

    def absolve(self, run_id: str, epoch: int | None = None) -> QueueState | None:
        """Take back the crash counted for the stop under ``epoch`` (one crash, the
        newest stop, if None): the worker that held the lease then lost it while it
        was alive (the store was away, the machine paused it), and the run did not
        kill it. Returns the run's state if a crash was taken back (``parked``: the
        park counted it, and the caller withdraws it), else None."""
        ...

    def retry(self, run_id: str, *, forget_crashes: bool = True) -> bool:
        """Make a parked (or waiting) run runnable again and forget its crashes (and
        the reason it was parked); ``forget_crashes=False`` keeps them, and the stops
        they were (a park withdrawn by the worker that was counted but alive)."""
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


def check_pin(run_id: str, recorded: str | None, given: str | None) -> None:
    """A second submit of ``run_id`` asks for the pin it was submitted with, or is refused
    (RunMismatchError): a run's pin is part of the request, never changed by a resubmit."""
    if recorded != given:
        raise RunMismatchError(run_id, "pin_version", recorded, given, advice=(
            "A run is pinned (or not) when it is first submitted; other work goes under a "
            "new run id (submit it without a run id, or with new_run_id())."))
