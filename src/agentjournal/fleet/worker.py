"""A worker: claims runnable runs from a store's queue and runs them, until drained.

``Worker(url, agents=...).run()`` is what ``agentjournal worker`` runs. It runs only
the agents it was told to trust (fleet/trust.py): a run whose agent ref it refuses is
parked at once, with the reason, and nothing it names is imported or called.

It keeps one store handle (thread-safe; on PostgreSQL a pool of at most ``POOL``
connections) for claims, heartbeats and its runs, each run in its own thread, or with
``on_loop`` each run a task on one event loop (``Agent.arun``: a thousand runs waiting on
their models cost a thousand tasks, not a thousand threads, and their appends meet in
the store's group commit); a handle broken by a failed commit is reopened, and the runs
it interrupted are handed back.

The lease and its epoch are the only owner of a run: a run is claimed with the
worker's id as the lease owner (as many at once as there are free slots: a successor
takes a dead worker's runs over in one claim), renewed by the worker until the run's
journal is open, run with ``Agent.run(..., owner=worker_id, keep_lease=True)`` (the
same owner, so the journal renews the claimed epoch), and handed back with the lease
released in the same transaction: ``done`` when it finished, ``waiting`` when it
stopped for a person, ``queued`` when drained.

Versions: the worker serves, for each agent ref it has loaded, the versions of what
the ref names (several if it names :class:`~agentjournal.fleet.Versions`, during a
rollout); it loads the refs it was given whole at start, and says what it serves in its
first log line and in its heartbeat row (``agentjournal workers``). A worker trusting
module prefixes loads a trusted ref when a run of it is claimed, or when a run pinned
to a version of it waits in its queues. Its claims take a pinned run only if it serves
that version, and an unpinned one runs with its newest version (fleet/queue.py).

It logs through ``logging.getLogger("agentjournal.worker")``, one line per event,
each starting with the worker id; a crash's traceback only at DEBUG.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import logging
import os
import socket
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from concurrent.futures import wait as futures_wait
from typing import TYPE_CHECKING, Any

import msgspec

from ..agent import Agent
from ..errors import (
    AgentRefError,
    DurabilityError,
    FencedError,
    JournalError,
    LeaseExpiredError,
    LeaseHeldError,
    StoreIOError,
    StoreUnavailableError,
    StoreUrlError,
    UnsettledError,
    UnsupportedVersionError,
)
from ..events import Event, EventType
from ..journal import SHORT_LOG, RunJournal, default_owner, heartbeat_of, open_journal, stateless
from ..metrics import METRICS
from ..ops import in_thread
from ..saga import run_saga
from ..store import Lease, Store, open_store
from . import queue_of, requeue
from .queue import POISONED, Claim, Queue, QueueState, WorkerInfo, whose
from .runnable import Stopped
from .trust import AgentTrust, Driven, Loaded, Trusted
from .versions import Versions, pick, served_by

if TYPE_CHECKING:
    from ..agent import RunResult
    from ..state import RunState

#: Store trouble that is retried with backoff: the server is away, a commit failed
#: (the handle is then reopened), or the disk refused a write.
TROUBLE = (StoreUnavailableError, DurabilityError, StoreIOError)
LOST = (FencedError, LeaseHeldError, LeaseExpiredError)
BACKOFF_FIRST, BACKOFF_MAX = 0.2, 5.0
#: After the soonest lease's expiry, how long an idle worker waits more before it claims
#: (a lease that expired but cannot be claimed yet is not polled in a busy loop).
EXPIRY_SLACK = 0.05
#: Seconds at least between two writes of a worker's row between heartbeats (a run
#: claimed or let go changes it; a takeover claims hundreds at once).
ROW_EVERY = 0.2
#: PostgreSQL connections a worker's handle opens at most, however many runs it holds
#: (an append holds one for milliseconds): with the LISTEN connection, five a worker,
#: so a default server (100 connections) serves a fleet of some 16 workers.
POOL = 4

logger = logging.getLogger("agentjournal.worker")

_STATE_OF: dict[str, QueueState] = {
    "finished": "done", "paused": "waiting", "waiting_approval": "waiting",
    "escalated": "waiting", "compensated": "done", "compensating": "waiting",
    "cancelled": "done",
}


class Worker:
    """Drains the queues of the store at ``store_url`` until :meth:`drain` is called.

    ``agents`` (required): the agents it runs, as module prefixes or whole refs
    (``["myapp.agents"]``), or a registry mapping refs to an Agent or a factory of one
    (``{"myapp.agents:reconciler": reconciler}``): see fleet/trust.py. A ref naming
    ``Versions(new, old)`` serves both versions (a rollout: see fleet/versions.py). A run whose ref
    it refuses is parked on its first claim, the reason in the queue (and escalated in
    its log, if it has one); what it names is never imported or called.
    ``queues``: the queues it claims from (most urgent first across them).
    ``concurrency``: how many runs it holds at once, each in its own thread, or, with
    ``on_loop``, each a task on the worker's one event loop (``Agent.arun``; sync models
    and tools still run in threads): for hundreds or thousands of runs at once.
    ``ttl``: the lease TTL in seconds, for the claim and for the run (it overrides
    the agent's ``lease_ttl``): how long a run sits unowned after this worker dies
    without draining (SIGKILL, a lost host) before another worker takes it over.
    Leases are renewed every ttl/3, and so is the worker's heartbeat row.
    ``poll``: seconds an idle worker waits before looking again (PostgreSQL wakes it
    earlier on a NOTIFY; SQLite has only the poll).
    ``grace``: on drain, how long :meth:`run` waits for the runs to reach their next
    step boundary and be handed back; a run still busy after that keeps its lease,
    which expires after ``ttl``.
    ``max_crashes``: a run claimed after that many claims that never handed it back
    (each one killed its worker, or raised) is not run again: it is escalated in its
    log, naming each stop, and parked until a person runs ``agentjournal requeue RUN``.
    A worker that lost a run's lease while alive (paused past it, the store away) did
    not crash: fenced, it takes its stop back, and withdraws a park that counted it.
    ``compensate_parked``: a run parked as poison has failed for good: undo its
    completed effects first (a saga, with its agent's tools); a run so compensated is
    done, one whose saga stopped for a person stays parked and escalated. An undo
    cannot be withdrawn as a park can, so the run is held one more ``ttl`` first and
    its stops read again: a worker only paused that came back meanwhile took its stop
    back, and the run goes on instead.
    ``worker_id``: the lease owner, ``host:pid:nonce`` by default.

    Store trouble (StoreUnavailableError, DurabilityError: a PostgreSQL restart;
    StoreIOError: a disk that refused a write) is
    retried with backoff (0.2 s doubling to 5 s) and never ends the worker; a run it
    interrupted is handed back queued once the store answers. A lost lease (fenced,
    held by another, expired) lets the run go: another worker owns it. Any other
    exception from a run is logged (one line; its traceback at DEBUG) and the run is
    left as crashed: its lease expires and the next claim counts the crash.
    """

    def __init__(self, store_url: str, *, agents: Trusted,
                 queues: Sequence[str] = ("default",), concurrency: int = 1,
                 ttl: float = 30.0, poll: float = 1.0, grace: float = 30.0,
                 max_crashes: int = 3, worker_id: str | None = None,
                 compensate_parked: bool = False, on_loop: bool = False) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, not {concurrency!r}")
        if ttl <= 0 or poll <= 0 or grace < 0:
            raise ValueError("ttl and poll must be positive and grace not negative")
        if max_crashes < 1:
            raise ValueError(f"max_crashes must be at least 1, not {max_crashes!r}")
        if not queues:
            raise ValueError("give at least one queue")
        self.trust = AgentTrust(agents)
        self.store_url = store_url
        self.queues = list(queues)
        self.concurrency = concurrency
        self.ttl = ttl
        self.poll = poll
        self.grace = grace
        self.max_crashes = max_crashes
        self.compensate_parked = compensate_parked
        self.on_loop = on_loop
        self._loop: asyncio.AbstractEventLoop | None = None  # on_loop: the runs' loop
        # Claimed runs whose journal is not open yet: the worker renews their leases.
        self._unopened: dict[str, Lease] = {}
        self._unopened_lock = threading.Lock()  # guards _unopened
        self._renewing = threading.Lock()  # held while a renewal of them is in flight
        self.worker_id = worker_id or default_owner()
        self._draining = threading.Event()
        self._done = threading.Event()  # run() is over: the heartbeat stops
        self._beat_now = threading.Event()  # the row says something new: write it soon
        self._renewed_at = time.time()  # the last heartbeat that renewed every lease
        self._slot_free = threading.Event()
        self._lock = threading.Lock()
        self._held: dict[str, threading.Thread | Future[None]] = {}
        self._agents: dict[str, Loaded] = {}  # each ref loaded, its versions if several
        self._served: dict[str, list[str]] = {}  # each ref loaded: its versions, newest first
        self._looked_for_pins = 0.0  # (monotonic) when pinned runs' refs were last loaded
        self._unloadable: set[str] = set()  # pinned runs' refs that failed to load (logged)
        self._started_at = time.time()
        self._store: Store | None = None
        self._queue: Queue | None = None
        self._control = threading.Lock()
        self._opened_once = False

    # --- logging -----------------------------------------------------------------------

    def log(self, message: str, level: int = logging.INFO) -> None:
        logger.log(level, "%s %s", self.worker_id, message)

    # --- the control handle ------------------------------------------------------------

    def _control_queue(self) -> Queue:
        with self._control:
            if self._queue is None:
                # The first open fails fast (a bad URL, no queue); reopens retry.
                store = self._open() if self._opened_once else open_store(
                    self.store_url, pool_size=POOL)
                self._opened_once = True
                try:
                    self._queue = queue_of(store)
                except BaseException:
                    store.close()
                    raise
                self._store = store
            return self._queue

    def _reopen_control(self) -> None:
        """Drop the control handle (a broken one refuses every write); the next use
        opens a new one."""
        with self._control:
            queue, store = self._queue, self._store
            self._queue = self._store = None
        if queue is not None:
            with contextlib.suppress(Exception):
                queue.close()
        if store is not None:
            with contextlib.suppress(Exception):
                store.close()

    # --- the main loop -----------------------------------------------------------------

    def drain(self) -> None:
        """Claim nothing more; runs return at their next step boundary and are handed
        back queued. Safe to call from a signal handler (it only sets events)."""
        self._draining.set()
        self._beat_now.set()
        self._slot_free.set()

    @property
    def draining(self) -> bool:
        return self._draining.is_set()

    def held(self) -> list[str]:
        with self._lock:
            return sorted(self._held)

    def run(self) -> int:
        """Claim and run until drained; returns 0 (the exit code) once drained.

        NoQueueError (a JSONL store) and a bad URL are raised at once."""
        self._control_queue()  # a store without a queue is refused before anything runs
        self._load_whole_refs()
        self.log(f"started: queues {','.join(self.queues)}, concurrency {self.concurrency},"
                 f" ttl {self.ttl:g}s, max crashes {self.max_crashes}, trusting "
                 f"{self.trust.describe()}; serving {self.describe_served()}")
        beats = threading.Thread(target=self._heartbeat, name="worker-heartbeat",
                                 daemon=True)
        beats.start()
        loop = self._start_loop() if self.on_loop else None
        try:
            self._claim_loop()
            self._wait_for_runs()
        finally:
            self._done.set()
            self._beat_now.set()
            beats.join(timeout=5)
            if loop is not None:
                self._stop_loop(*loop)
            self._forget()
            self._reopen_control()  # closes it
        return 0

    def _start_loop(self) -> tuple[asyncio.AbstractEventLoop, threading.Thread]:
        """The event loop the runs are tasks on (on_loop), in a thread of its own."""
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="worker-runs", daemon=True)
        thread.start()
        self._loop = loop
        return loop, thread

    def _stop_loop(self, loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
        if not thread.is_alive():
            loop.close()
        self._loop = None

    def _claim_loop(self) -> None:
        backoff, troubled = BACKOFF_FIRST, False
        while not self._draining.is_set():
            with self._lock:
                free = self.concurrency - len(self._held)
                self._slot_free.clear()
            if free <= 0:
                self._slot_free.wait(self.poll)
                continue
            try:
                queue = self._control_queue()
                claims = queue.claim_many(self.worker_id, self.ttl, self.queues, free,
                                          served=self.served())
                if len(claims) < free and self._load_pinned_refs(queue):
                    continue  # it serves more versions now: claim again at once
                idle = self.poll if claims else self._idle_for(queue)
            except TROUBLE as exc:
                if not troubled:
                    self.log(f"store unavailable, retrying claims with backoff: {exc}",
                             logging.WARNING)
                troubled = True
                if isinstance(exc, DurabilityError):
                    self._reopen_control()
                self._draining.wait(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX)
                continue
            if troubled:
                self.log("store answers again")
            backoff, troubled = BACKOFF_FIRST, False
            if not claims:
                queue.wait(idle)
                continue
            with self._unopened_lock:
                self._unopened.update((c.lease.run_id, c.lease) for c in claims)
            self._read_ahead(claims)
            self._start(claims)

    def _read_ahead(self, claims: list[Claim]) -> None:
        """The short logs of the runs just claimed, read in one round trip where the store
        can (PostgreSQL), so that a takeover of hundreds opens them without one apiece."""
        prefetch = getattr(self._run_store(), "prefetch", None)
        short = [c.lease.run_id for c in claims
                 if c.lease.last_seq is not None and 0 < c.lease.last_seq <= SHORT_LOG]
        if prefetch is not None and len(short) > 1:
            with contextlib.suppress(*TROUBLE):  # a hint: each run reads its own log
                prefetch(short)

    def _idle_for(self, queue: Queue) -> float:
        """How long to wait for work with nothing to claim: the poll, or until just after
        the soonest lease of a running run expires (a dead worker's, maybe), if sooner."""
        due = queue.next_expiry(self.queues)
        return self.poll if due is None else min(self.poll, due + EXPIRY_SLACK)

    def _renew_unopened(self) -> None:
        """Renew the leases of the claimed runs whose journal is not open yet (with
        hundreds claimed at once, a stepper thread may be a while coming). One the store
        no longer grants (another worker took the run) is left to the run's open."""
        with self._renewing:
            with self._unopened_lock:
                leases = list(self._unopened.values())
            if not leases:
                return
            store: Any = self._run_store()  # SQLite's or PostgreSQL's: both renew_all
            renewed = store.renew_all(leases, self.ttl)
            with self._unopened_lock:
                for lease in leases:
                    if lease.run_id not in renewed:
                        self._unopened.pop(lease.run_id, None)

    def _stop_renewing(self, run_id: str, *, handing_back: bool = True) -> None:
        """The run's journal renews its lease now, or the run is about to be handed back:
        the worker renews it no more. ``handing_back``: returns once no renewal of it is
        in flight, so none follows the hand-back's release."""
        with self._unopened_lock:
            self._unopened.pop(run_id, None)
        if handing_back:
            with self._renewing:
                pass

    def _start(self, claims: list[Claim]) -> None:
        """Each run claimed started: on a thread of its own, or as a task on the runs'
        loop, all made there in one call (a takeover of hundreds wakes the loop once)."""
        for claim in claims:
            self.log(f"claimed {claim.lease.run_id} (epoch {claim.lease.epoch}, agent "
                     f"{claim.agent!r}, crashes {claim.crashes})")
        with self._lock:
            if self._loop is not None:
                held: dict[str, Future[None]] = {c.lease.run_id: Future() for c in claims}
                self._held.update(held)
                self._loop.call_soon_threadsafe(self._spawn, claims, held)
            else:
                for claim in claims:
                    thread = threading.Thread(target=self._work, args=(claim,),
                                              name=f"run:{claim.lease.run_id}", daemon=True)
                    self._held[claim.lease.run_id] = thread
                    thread.start()
            METRICS.gauge("worker_runs_held", len(self._held))
        METRICS.count("worker_claims", len(claims))
        self._beat_now.set()

    def _spawn(self, claims: list[Claim], held: dict[str, Future[None]]) -> None:
        """(On the runs' loop) a task for each claim, its end told to its future in held."""
        for claim in claims:
            task = asyncio.ensure_future(self._awork(claim))
            task.add_done_callback(functools.partial(_tell, held[claim.lease.run_id]))

    def _wait_for_runs(self) -> None:
        held = self.held()
        if held:
            self.log(f"draining: waiting up to {self.grace:g}s for {len(held)} run(s) to "
                     "reach a step boundary")
        deadline = time.monotonic() + self.grace
        with self._lock:
            runs = list(self._held.values())
        for run in runs:
            remaining = max(0.0, deadline - time.monotonic())
            if isinstance(run, threading.Thread):
                run.join(timeout=remaining)
            else:
                futures_wait([run], timeout=remaining)
        left = self.held()
        if left:
            self.log(f"grace expired with {len(left)} run(s) still busy ({', '.join(left)}); "
                     f"their leases expire after {self.ttl:g}s and others take them over",
                     logging.WARNING)
        else:
            self.log("drained")

    # --- heartbeats --------------------------------------------------------------------

    def info(self) -> WorkerInfo:
        return WorkerInfo(worker_id=self.worker_id, host=socket.gethostname(),
                          pid=os.getpid(), queues=list(self.queues), runs=self.held(),
                          started_at=self._started_at, heartbeat_at=self._renewed_at,
                          draining=self.draining, versions=self.served(), ttl=self.ttl)

    # --- versions served ---------------------------------------------------------------

    def served(self) -> dict[str, list[str]]:
        """The versions it serves of each agent ref it has loaded, newest first (a ref
        whose agent carries no version serves unpinned runs only)."""
        with self._lock:
            return {ref: list(versions) for ref, versions in self._served.items()}

    def describe_served(self) -> str:
        """What it serves, for its log: ``ref v2, v1; ref2 (no version)``."""
        served = self.served()
        return "; ".join(f"{ref} {', '.join(v) or '(no version)'}"
                         for ref, v in sorted(served.items())) or (
            "nothing loaded yet (it loads each trusted agent its first run names)")

    def _load_whole_refs(self) -> None:
        """Load the refs it was given whole, so its first heartbeat says which versions
        it serves (a pinned run is claimed only by a worker that says so). One that does
        not load is logged; a run of it is parked on its claim, as before."""
        for ref in self.trust.whole_refs():
            try:
                self._load(ref, announce=False)  # (the start's line says what it serves)
            except Exception as exc:
                self.log(f"could not load {ref}: {type(exc).__name__}: {exc}; a run of it "
                         "will be parked when claimed", logging.WARNING)

    def _load_pinned_refs(self, queue: Queue) -> bool:
        """A worker trusting module prefixes has not loaded every ref it trusts: load
        those of the pinned runs waiting in its queues (at most once a poll), so it
        serves them if it has their version. True if it loaded one."""
        whole = self.trust.registry is not None or all(":" in p for p in self.trust.prefixes)
        if whole or time.monotonic() < self._looked_for_pins:
            return False  # (whole refs were all loaded at start)
        self._looked_for_pins = time.monotonic() + self.poll
        pinned = queue.pinned_agents(self.queues)
        with self._lock:
            new = [ref for ref in pinned
                   if ref not in self._agents and ref not in self._unloadable]
        loaded = False
        for ref in new:
            try:
                self.trust.check(ref)
            except AgentRefError:
                continue  # not this worker's to serve (nothing imported)
            try:
                self._load(ref)
            except Exception as exc:
                self._unloadable.add(ref)
                self.log(f"could not load {ref}, which a pinned run names: "
                         f"{type(exc).__name__}: {exc}", logging.WARNING)
                continue
            loaded = True
        return loaded

    def _heartbeat(self) -> None:
        """Every third of a TTL, renew every lease this worker holds, then write its row
        (the heartbeat a takeover is timed from). Between, a change the row shows (a run
        claimed or let go, a drain) is written on its own, at most every ROW_EVERY
        seconds, with the time of the last renewal: a run started or ended renews no
        lease (a thousand runs starting would otherwise renew a thousand leases each)."""
        troubled, renew_at = False, 0.0
        while not self._done.is_set():
            try:
                if time.monotonic() >= renew_at:
                    renew_at = time.monotonic() + self.ttl / 3
                    # The runs' leases first, then the row: if this worker dies, they
                    # expire no later than a TTL after its last heartbeat, all together.
                    self._renew_unopened()
                    heartbeat_of(self._run_store()).beat_now()
                    self._renewed_at = time.time()
                self._control_queue().beat(self.info())
                troubled = False
            except TROUBLE as exc:
                if not troubled:
                    self.log(f"store unavailable for the heartbeat: {exc}", logging.WARNING)
                troubled = True
                if isinstance(exc, DurabilityError):
                    self._reopen_control()
            except Exception as exc:  # never let the heartbeat die silently
                self.log(f"heartbeat failed: {type(exc).__name__}: {exc}", logging.ERROR)
                logger.debug("the heartbeat's failure", exc_info=True)
            if self._beat_now.wait(max(0.0, renew_at - time.monotonic())):
                self._done.wait(min(ROW_EVERY, max(0.0, renew_at - time.monotonic())))
            self._beat_now.clear()

    def _forget(self) -> None:
        for attempt in range(3):
            try:
                self._control_queue().forget(self.worker_id)
                return
            except TROUBLE as exc:
                if isinstance(exc, DurabilityError):
                    self._reopen_control()
                if attempt == 2:
                    self.log(f"could not remove this worker's row: {exc}", logging.WARNING)
                time.sleep(BACKOFF_FIRST * 2 ** attempt)

    # --- one run -----------------------------------------------------------------------

    def _load(self, ref: str, *, announce: bool = True) -> Loaded:
        """What ``ref`` names, loaded once, if this worker trusts it (else AgentRefError):
        an Agent, another framework's agent (a Runnable, fleet/runnable.py), or the
        Versions of one it serves."""
        with self._lock:
            loaded = self._agents.get(ref)
        if loaded is None:
            made = self.trust.load_versions(ref)
            loaded = (Versions(*map(self._own, made.agents)) if isinstance(made, Versions)
                      else self._own(made))
            versions = served_by(loaded)  # (once: an integration's digest is not free)
            with self._lock:
                new = ref not in self._agents
                loaded = self._agents.setdefault(ref, loaded)
                self._served.setdefault(ref, versions)
            if new and announce:
                self.log(f"serving {ref}: {', '.join(versions) or '(no version)'}")
            if new:
                self._beat_now.set()  # its row says so soon: pinned runs wait on it
        return loaded

    def _own(self, agent: Driven) -> Driven:
        """A copy of an Agent: the worker's TTL governs the lease, not its own default."""
        if isinstance(agent, Agent):
            agent = copy.copy(agent)
            agent.lease_ttl = self.ttl
        return agent

    def _agent(self, ref: str, pin_version: str | None = None) -> Driven | None:
        """The agent of ``ref`` to run a run pinned to ``pin_version`` with (the newest
        for None), if this worker trusts it (else AgentRefError); None if it does not
        serve that version."""
        return pick(self._load(ref), pin_version)

    def _driven(self, agent: Driven, claim: Claim) -> Stopped:
        """Run the claimed run with another framework's agent (a Runnable), holding the
        claimed lease and keeping it; where it stopped."""
        assert not isinstance(agent, Agent)
        return agent.run_claimed(self._run_store(), claim.lease.run_id, claim.task,
                                 agent_ref=claim.agent, owner=self.worker_id, ttl=self.ttl,
                                 stop=self._draining)

    def _work(self, claim: Claim) -> None:
        """Run a claimed run in this thread, then hand it back."""
        seen = {"epoch": claim.lease.epoch, "seq": 0}
        try:
            agent = self._prepared(claim)
            result: Stopped | None = None
            if isinstance(agent, Agent):
                result = _stopped(agent.run(self._run_store(), claim.lease.run_id, claim.task,
                                            **self._run_args(claim, seen)), claim)
            elif agent is not None:
                self._stop_renewing(claim.lease.run_id, handing_back=False)  # its journal's
                result = self._driven(agent, claim)
        except Exception as exc:
            self._ended(claim, seen, None, exc)
        else:
            self._ended(claim, seen, result, None)
        finally:
            self._let_go(claim.lease.run_id)

    async def _awork(self, claim: Claim) -> None:
        """:meth:`_work` as a task on the runs' loop: the run is ``Agent.arun``; what
        waits on the store before and after it waits on a stepper thread."""
        seen = {"epoch": claim.lease.epoch, "seq": 0}
        try:
            # An agent already loaded needs no trip to a thread (a takeover of hundreds
            # would make one each before the first of their opens).
            agent = self._loaded(claim)
            if agent is None:
                agent = await in_thread(self._prepared, claim)
            result: Stopped | None = None
            if isinstance(agent, Agent):
                result = _stopped(await agent.arun(
                    self._run_store(), claim.lease.run_id, claim.task,
                    **self._run_args(claim, seen)), claim)
            elif agent is not None:  # another framework's: its own loop, in a thread
                self._stop_renewing(claim.lease.run_id, handing_back=False)
                result = await asyncio.to_thread(self._driven, agent, claim)
        except Exception as exc:
            await in_thread(self._ended, claim, seen, None, exc)
        else:
            await in_thread(self._ended, claim, seen, result, None)
        finally:
            self._let_go(claim.lease.run_id)

    def _run_args(self, claim: Claim, seen: dict[str, int]) -> dict[str, Any]:
        """What the worker passes ``Agent.run``/``arun``: its id as the lease owner, the
        lease kept for the hand-back, the drain as the stop, and an observer keeping the
        newest epoch and seq in ``seen`` (at the first event, the run's journal renews
        the lease: the worker no more)."""

        @stateless  # (so a read's result may wait for the next turn)
        def observe(event: Event, _state: RunState) -> None:
            if not seen["seq"]:
                self._stop_renewing(claim.lease.run_id, handing_back=False)
            seen["epoch"] = max(seen["epoch"], event.epoch)
            seen["seq"] = event.seq

        return {"owner": self.worker_id, "agent_ref": claim.agent, "stop": self._draining,
                "keep_lease": True, "observer": observe, "lease": claim.lease,
                "settle": False}  # the status is enough

    def _loaded(self, claim: Claim) -> Driven | None:
        """The claimed run's agent if it is loaded and the run is not to be parked."""
        if claim.crashes >= self.max_crashes:
            return None
        with self._lock:
            loaded = self._agents.get(claim.agent)
        return None if loaded is None else pick(loaded, claim.pin_version)

    def _prepared(self, claim: Claim) -> Driven | None:
        """The claimed run's agent; None when the run was parked instead (poison, or an
        agent this worker does not trust)."""
        run_id = claim.lease.run_id
        if claim.crashes >= self.max_crashes and self.compensate_parked:
            standing = self._crashes_evidenced(claim)
            if standing is None:
                return None  # drained while it waited: handed back queued
            claim = standing
        if claim.crashes >= self.max_crashes:
            self._park(claim, self._poison(claim), undo=self.compensate_parked)
            return None
        try:
            agent = self._agent(claim.agent, claim.pin_version)
            if agent is None:  # (its claim served the version: never, but never park it)
                self._stop_renewing(run_id)
                self._hand_back(claim.lease, "queued", 0)
                self.log(f"handed back {run_id} (now queued): it is pinned to version "
                         f"{claim.pin_version} of {claim.agent}, which this worker does not "
                         "serve", logging.WARNING)
            return agent
        except AgentRefError as exc:  # it would refuse every time: park it now
            self._park(claim, f"refused by a worker: {exc}. Submit the run again with a "
                       "trusted agent, or start workers that trust it (--agents), then "
                       f"run: agentjournal requeue {run_id}", undo=False)
            return None

    def _crashes_evidenced(self, claim: Claim) -> Claim | None:
        """The claim with the crashes that still stand after holding the run (its lease
        renewed) for one more TTL: compensating is an undo no one can withdraw, so a
        stop is taken as a crash only once its worker has had a TTL past its lapsed
        lease to come back. A worker that was only paused (SIGSTOP, a frozen VM) wakes
        fenced in that time and takes its stop back (``_absolve``): then the run is
        below ``max_crashes`` and runs on. None if the worker drained meanwhile (the
        run handed back queued, its crashes kept for the next claim to weigh)."""
        run_id = claim.lease.run_id
        self.log(f"{run_id} was claimed after {claim.crashes} stops: holding it {self.ttl:g}s "
                 "before parking and compensating it, for a worker only paused to come "
                 "back and take its stop back")
        if self._draining.wait(self.ttl):
            self._stop_renewing(run_id)
            if self._hand_back(claim.lease, "queued", 0):
                self.log(f"handed back {run_id} (now queued): drained before its stops "
                         "were evidenced as crashes")
            return None
        row = next((r for r in self._control_queue().runs() if r.run_id == run_id), None)
        if row is None or row.crashes >= claim.crashes:
            return claim
        self.log(f"{run_id}: {claim.crashes - row.crashes} of its stops taken back while "
                 f"it was held ({row.crashes} still counted)", logging.WARNING)
        return msgspec.structs.replace(claim, crashes=row.crashes, stops=row.stops)

    def _ended(self, claim: Claim, seen: dict[str, int], result: Stopped | None,
               error: Exception | None) -> None:
        """Hand the run back as it ended (``result``), or let it go as ``error`` says."""
        run_id = claim.lease.run_id
        self._stop_renewing(run_id)  # a run that appended nothing (it waits), or failed
        try:
            if error is not None:
                raise error
            if result is None:
                return  # parked
            state = _STATE_OF.get(result.status, "queued")
            lease = Lease(run_id, self.worker_id, max(seen["epoch"], result.epoch), 0.0)
            if self._hand_back(lease, state, result.last_seq):
                METRICS.count("worker_runs_done" if state == "done" else "worker_hand_backs")
                self.log(f"{'finished' if state == 'done' else 'handed back'} {run_id} "
                         f"({result.status} at seq {result.last_seq}; now {state})")
            else:  # alive, and fenced: paused past the lease between its end and now
                self._absolve(run_id, claim.lease.epoch)
        except LOST as exc:
            METRICS.count("worker_leases_lost")
            self.log(f"lost the lease of {run_id}, letting it go: {type(exc).__name__}: {exc}",
                     logging.WARNING)
            self._absolve(run_id, claim.lease.epoch)
        except TROUBLE as exc:
            self.log(f"store unavailable while running {run_id}: {exc}; handing it back "
                     "queued once the store answers", logging.WARNING)
            lease = Lease(run_id, self.worker_id, seen["epoch"], 0.0)
            if self._hand_back(lease, "queued", seen["seq"]):
                self.log(f"handed back {run_id} (now queued)")
            else:
                self._absolve(run_id, claim.lease.epoch)
        except UnsupportedVersionError as exc:  # a later release wrote it: no crash of it
            self.log(f"{run_id} holds records of a later agentjournal release ({exc}): "
                     "handing it back queued for an upgraded worker, and draining this one: "
                     "upgrade it", logging.ERROR)
            if self._hand_back(Lease(run_id, self.worker_id, seen["epoch"], 0.0), "queued",
                               seen["seq"]):
                self.log(f"handed back {run_id} (now queued)")
            self.drain()  # every run it would claim next may be the same: claim none
        except Exception as exc:
            METRICS.count("worker_runs_crashed")
            self.log(f"run {run_id} crashed: {type(exc).__name__}: {exc}; not handing it back "
                     "(its lease expires and the next claim counts the crash)", logging.ERROR)
            logger.debug("the crash of %s", run_id, exc_info=exc)
            self._note_crash(Lease(run_id, self.worker_id, seen["epoch"], 0.0), exc)

    def _let_go(self, run_id: str) -> None:
        self._stop_renewing(run_id)  # (done before any hand-back; here if cancelled)
        with self._lock:
            self._held.pop(run_id, None)
            METRICS.gauge("worker_runs_held", len(self._held))
        self._slot_free.set()
        self._beat_now.set()

    def _absolve(self, run_id: str, epoch: int) -> None:
        """The successor that took this run from us (alive all along: the store was away,
        or we were paused past the lease) counted a crash the run did not cause: take it
        back, and if a worker parked the run as poison counting it, withdraw the park."""
        try:
            state = self._control_queue().absolve(run_id, epoch)
            if state is None:
                return
            self.log(f"fenced from {run_id} while alive: its stop under epoch {epoch} was "
                     "no crash of the run, taken back", logging.WARNING)
            if state == "parked":
                self._withdraw_park(run_id, [f"epoch {epoch} (worker {self.worker_id})"])
        except TROUBLE as exc:  # best effort: at worst the run parks one crash early
            self.log(f"could not take back the crash counted for {run_id}: {exc}",
                     logging.WARNING)

    def _withdraw_park(self, run_id: str, taken: list[str]) -> None:
        """A worker parked the run as poison counting the stops ``taken`` back since: the
        run goes back to the workers with its other stops still counted, the withdrawal
        recorded in its log (where the park escalated it) as the decision that it goes
        on."""
        store = self._run_store()
        left = next((r for r in queue_of(store).runs() if r.run_id == run_id), None)
        why = (f"the park is withdrawn: the stop under {'; '.join(taken)} was no crash of "
               "the run (its worker was alive all along: paused past its lease, or cut off "
               "from the store, it came back fenced); "
               f"{left.crashes if left else 0} stop(s) still counted")
        try:
            withdrawn = requeue(store, run_id, by=f"agentjournal worker {self.worker_id}",
                                reason=why, forget_crashes=False)
        except JournalError as exc:  # (a person deciding holds its lease, say)
            self.log(f"could not withdraw the park of {run_id} ({why}): {exc}; a person "
                     f"can: agentjournal requeue {run_id}", logging.WARNING)
            return
        if withdrawn:
            self.log(f"withdrew the park of {run_id}: {why}", logging.WARNING)

    def _note_crash(self, lease: Lease, exc: Exception) -> None:
        """What the stop the next claim counts was: the run raised here."""
        what = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
        try:
            self._control_queue().note_stop(lease, f"raised {what}")
        except Exception as trouble:  # best effort: the next claim counts the stop anyway
            self.log(f"could not note the crash of {lease.run_id}: {trouble}", logging.WARNING)

    def _run_store(self) -> Store:
        """The handle a run uses: the control handle, shared (both stores' handles are
        thread-safe; a handle per run would multiply a fleet's PostgreSQL connections).
        A failed commit breaks it for every run: they hand back once it is reopened."""
        return self._control_queue().store

    def _open(self) -> Store:
        """A new handle on the store, retrying store trouble with backoff. A URL that
        opened before and now fails to (SQLite: a lock met mid-open) is retried too."""
        backoff = BACKOFF_FIRST
        for attempt in range(8):
            try:
                return open_store(self.store_url, pool_size=POOL)
            except (*TROUBLE, StoreUrlError) as exc:
                if attempt == 7:
                    raise
                self.log(f"opening the store failed, retrying: {exc}", logging.WARNING)
                time.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX)
        raise AssertionError("unreachable")

    def _hand_back(self, lease: Lease, state: QueueState, at_seq: int,
                   reason: str | None = None) -> bool:
        """Hand the run back, retrying store trouble with backoff (on a reopened handle
        after a failed commit). False (logged) if the lease went to another worker."""
        backoff, troubled = BACKOFF_FIRST, False
        while True:
            try:
                mine = self._control_queue().hand_back(lease, state, at_seq, reason)
            except TROUBLE as exc:
                if not troubled:
                    self.log(f"store unavailable handing back {lease.run_id}, retrying: {exc}",
                             logging.WARNING)
                troubled = True
                if isinstance(exc, DurabilityError):
                    self._reopen_control()  # if it was the shared handle, it is broken
                time.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX)
                continue
            if not mine:
                self.log(f"lost the lease of {lease.run_id} before handing it back: another "
                         "worker owns it now", logging.WARNING)
            return mine

    def _poison(self, claim: Claim) -> str:
        """Why the run is parked; the stops counted follow it, one a line (a worker that
        was only paused and comes back takes its stop back, withdrawing the park)."""
        return (f"{POISONED} without handing it back {claim.crashes} times (max crashes "
                f"{self.max_crashes}): find the cause (the workers' logs), fix it, then run: "
                f"agentjournal requeue {claim.lease.run_id}. The stops counted, each one "
                "the run may have caused:")

    def _park(self, claim: Claim, reason: str, *, undo: bool) -> None:
        """A run not to run again until a person decides: escalate it in its log, with
        the reason, and park it with the reason (``agentjournal queue`` shows it)."""
        run_id = claim.lease.run_id
        with open_journal(self._run_store(), run_id, owner=self.worker_id, ttl=self.ttl,
                          keep_lease=True) as journal:
            self._stop_renewing(run_id)  # the journal renews it
            if journal.state.last_seq:  # an empty log has no run to escalate yet
                journal.record(EventType.RUN_ESCALATED, crashes=claim.crashes,
                               reason="\n".join([reason, *claim.stops]),
                               by="agentjournal worker", worker=self.worker_id)
                if undo and self._stops_stand(claim):
                    self._undo(journal, claim)
            epoch, seq = journal.lease.epoch, journal.state.last_seq
            undone = journal.state.status == "compensated"
        lease = Lease(run_id, self.worker_id, epoch, 0.0)
        if undone:
            if self._hand_back(lease, "done", seq):
                METRICS.count("worker_runs_compensated")
                self.log(f"compensated {run_id} after {claim.crashes} crashes (now done)")
        elif self._hand_back(lease, "parked", seq, reason):
            METRICS.count("worker_runs_parked")
            said = " ".join([reason.removeprefix("parked by a worker: "), *claim.stops])
            self.log(f"parked {run_id}: {said}", logging.WARNING)
            self._unless_taken_back(claim)

    def _unless_taken_back(self, claim: Claim) -> None:
        """A stop this park counted, taken back while the run was being parked (its
        worker woke fenced before the park landed, and saw the run running): the park
        stands on fewer crashes than it counted, and is withdrawn here."""
        run_id = claim.lease.run_id
        row = next((r for r in self._control_queue().runs() if r.run_id == run_id), None)
        if row is None or row.state != "parked" or row.crashes >= claim.crashes:
            return
        taken = [whose(line) for line in claim.stops if line not in row.stops]
        self._withdraw_park(run_id, taken or ["one of them"])

    def _stops_stand(self, claim: Claim) -> bool:
        """Whether every stop the claim counted is still counted (none taken back since
        ``_crashes_evidenced`` read them): read again just before an undo."""
        run_id = claim.lease.run_id
        row = next((r for r in self._control_queue().runs() if r.run_id == run_id), None)
        if row is not None and row.crashes < claim.crashes:
            self.log(f"not compensating {run_id}: a stop it counted was taken back",
                     logging.WARNING)
            return False
        return True

    def _undo(self, journal: RunJournal, claim: Claim) -> None:
        """The saga of a failed run; where it cannot go on, the run stays parked."""
        agent = None
        with contextlib.suppress(AgentRefError):
            agent = self._agent(claim.agent, claim.pin_version)
        if not isinstance(agent, Agent):
            self.log(f"cannot compensate {claim.lease.run_id}: its agent is not an "
                     "agentjournal Agent with the tools that undo its effects", logging.WARNING)
            return
        try:
            result = run_saga(journal, agent.tools,
                              reason=f"failed: parked after {claim.crashes} crashes",
                              by="agentjournal worker")
        except (UnsettledError, AgentRefError) as exc:
            self.log(f"cannot compensate {claim.lease.run_id}: {exc}", logging.WARNING)
            return
        if result.status != "compensated":
            self.log(f"the saga of {claim.lease.run_id} stopped for a person: {result.status}",
                     logging.WARNING)


def _tell(future: Future[None], task: asyncio.Future[None]) -> None:
    """``task``'s end, told to the ``future`` that stands for it off the loop."""
    if task.cancelled():
        future.cancel()
    elif (error := task.exception()) is not None:
        future.set_exception(error)
    else:
        future.set_result(None)


def _stopped(result: RunResult, claim: Claim) -> Stopped:
    """Where an Agent's run stopped, as a Runnable reports it."""
    return Stopped(result.status, result.last_seq, claim.lease.epoch)
