"""A run's single writer: it holds the lease, the folded state, and appends facts.

Every state change goes through ``RunJournal.record``: the event is made
durable first, then folded into the in-memory state with the same rule a
replay uses. Nothing else mutates run state, so the live run and any later
replay agree by construction (and the prefix tests check it).

The journal also keeps the writer's own view of time: a local deadline for its
lease (``check_lease``, consulted right before an effect), whether the run is
making progress (a stuck run stops renewing, so it can be taken over), and the
run's elapsed time for budgets. All three use a monotonic clock, never the wall
clock, which can be set back.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import threading
import uuid
import weakref
from collections.abc import Callable
from typing import Any

from .errors import (
    FencedError,
    JournalError,
    LeaseExpiredError,
    LeaseHeldError,
    ScopeSharedError,
)
from .events import Event, EventType, make_events, now
from .redaction import Redaction
from .snapshots import Loaded, Segments, load_state, write_snapshot
from .state import Message, RunState, apply
from .store import Lease, Store, validate_run_id
from .store.base import boot_seconds, missing_run

Observer = Callable[[Event, RunState], None]


def stateless(observer: Observer) -> Observer:
    """``observer``, marked as one that reads the event it is given, never the state: a
    run it observes may store a read's result with its next facts (StepMachine.reads_ride),
    since such an observer is not called with the state as of each fact."""
    observer.reads_state = False  # type: ignore[attr-defined]
    return observer


#: The share of a lease's TTL this writer does not count on: its clock and the
#: store's may run at slightly different rates, and the check comes a moment
#: before the effect leaves the process.
LEASE_MARGIN = 0.1

# Boot time is monotonic and keeps counting while the machine is suspended, as the
# store's clock does; CLOCK_MONOTONIC would stop and let a lease look younger than it is.
_clock = boot_seconds


def default_owner() -> str:
    """``host:pid:nonce``: unique per process incarnation, and checkable on this host."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def holder_is_dead(owner: str) -> bool:
    """True only if ``owner`` names a process on this host that no longer runs.

    A dead process cannot append, so its lease may be taken over at once rather
    than after its TTL; anything we cannot prove dead (another host, a stopped
    but living process) keeps its lease until it expires.
    """
    host, _, rest = owner.partition(":")
    pid_text = rest.partition(":")[0]
    if host != socket.gethostname() or not pid_text.isdigit() or int(pid_text) == os.getpid():
        return False
    try:
        os.kill(int(pid_text), 0)  # signal 0: does it exist?
    except ProcessLookupError:
        return True
    except OSError:  # it exists, owned by someone else
        return False
    try:  # it exists; on Linux, a killed child not yet reaped is a zombie: dead too
        with open(f"/proc/{pid_text}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except OSError:
        return False


#: A log at most this long is folded from its events when a journal opens, without
#: looking for a snapshot: decoding one would cost about what the fold does. A store
#: may say otherwise (``short_log``). Measured 2026-12-06 (a run of tool-call turns, a
#: snapshot at the log's end, median of 40 opens): on PostgreSQL the fold is cheaper up
#: to some 45 events (31: 760 against 915 µs; 61: 1,274 against 960), and looking for
#: a snapshot that is not there costs a round trip (90-240 µs); on SQLite the look
#: costs nothing measurable and the snapshot is cheaper from 16 events (164 against
#: 129 µs; 61: 518 against 188).
SHORT_LOG = 64


def take_lease(store: Store, run_id: str, owner: str, ttl: float) -> Lease:
    """Acquire the run's lease, taking it over at once from a holder proven dead."""
    try:
        return store.acquire(run_id, owner, ttl)
    except LeaseHeldError as held:
        if not holder_is_dead(held.owner):
            raise
        store.release(Lease(run_id, held.owner, held.epoch, 0.0))  # no-op if it moved on
        return store.acquire(run_id, owner, ttl)


class RunJournal:
    def __init__(
        self,
        store: Store,
        lease: Lease,
        state: RunState,
        observer: Observer | None = None,
        snapshot_every: int | None = None,
        *,
        ttl: float = 30.0,
        leased_at: float | None = None,
        redaction: Redaction | None = None,
        segments: Segments | None = None,
        snapshot_seq: int | None = None,
    ) -> None:
        self.store, self.lease, self.state = store, lease, state
        # Every fact passes record_all: redacting there keeps secrets off every copy.
        self.redaction = Redaction() if redaction is None else redaction
        # The arguments of calls whose recorded form was redacted, by call id, as this
        # process was given them: only this process may make such a call again.
        self.live_args: dict[str, dict[str, Any]] = {}
        # The ids of the calls in the model's context, read from the messages once and
        # then only from the ones added since (see call_ids_in_context).
        self._call_ids: set[str] = set()
        self._call_ids_read: tuple[list[Message] | None, int] = (None, 0)  # list, read up to
        self.run_id = lease.run_id
        self.observer = observer
        self.snapshot_every = snapshot_every
        self.ttl = ttl
        # The seq of the run's newest snapshot (``state``'s, when not given): the tail
        # after it is what the next open replays.
        self._snapshot_seq = state.last_seq if snapshot_seq is None else snapshot_seq
        # The run's stored snapshot segments this writer knows: each is written once.
        self._segments = Segments() if segments is None else segments
        self._staged: list[Event] = []  # folded, not yet stored (see stage)
        #: Another run shares the run's idempotency scope: each effect asks the peers
        #: first. False until an append ``alone_in`` the scope was refused (a scope only
        #: grows): until then a start is appended on condition that none exists.
        self.shared_scope = False
        self._stop = threading.Event()
        self._writing = threading.RLock()
        #: Leave the lease held on close: its taker releases it (a worker hands the run
        #: back to the queue and releases the lease in one transaction).
        self.keep_lease = False
        self._beats: Heartbeat | None = None
        # The lease is surely ours until then, by our clock. ``leased_at`` is taken
        # before the request that got the lease, so a slow store never makes it look longer.
        self._renewing = threading.Lock()
        self._valid_until = (_clock() if leased_at is None else leased_at) + self._trusted_ttl()
        # Progress (an append, a tool's return) and how long the run may go without it.
        self._progress_at = _clock()
        self._stall_limit: float | None = None
        # Elapsed time: the wall clock once, at open; our own clock from then on.
        self._opened_at, self._opened_wall, self._opened_seq = _clock(), now(), state.last_seq
        self._elapsed_at_open: float | None = None

    def record(self, kind: EventType, **payload: Any) -> Event:
        """Append one fact durably, then fold it into the state."""
        (event,) = self.record_all([(kind, payload)])
        return event

    def call_ids_in_context(self) -> set[str]:
        """The ids of the tool calls in the run's messages. Messages are only appended,
        except by a compaction, which makes a new list: then they are read again."""
        messages = self.state.messages
        read_in, read = self._call_ids_read
        if read_in is not messages or read > len(messages):
            self._call_ids, read = set(), 0
        for m in messages[read:]:
            self._call_ids.update(c.id for c in m.tool_calls)
        self._call_ids_read = (messages, len(messages))
        return self._call_ids

    def as_recorded(self, value: Any) -> Any:
        """``value`` as it would be recorded (redacted), to compare with what was."""
        return self.redaction.scrub(value)

    def record_all(self, facts: list[tuple[EventType, dict[str, Any]]], *,
                   redact: bool = True, alone: bool = False) -> list[Event]:
        """Append facts that must stand or fall together, in one atomic batch.

        Staged facts (see :meth:`stage`) go first in the same batch. Each payload is
        redacted first (see redaction.py): the raw value never reaches the store, and
        the state (so snapshots, observers, the model) is folded from exactly what was
        stored. ``redact=False`` only for payloads that are opaque encodings (a LangGraph
        checkpoint's serialized values, base64): a rule matching inside one would corrupt
        it, not hide a secret. ``alone``: only if no other run of the scope has events;
        else ScopeSharedError, nothing is stored, and :attr:`shared_scope` is set.
        """
        if redact:
            facts = [(kind, self.redaction.recorded(p)) for kind, p in facts]
        with self._writing:  # a tool's remember() may write from its own thread
            events = make_events(self.run_id, self.state.last_seq, self.lease.epoch, facts)
            batch = self._staged + events
            if not batch:
                return events
            try:
                self.store.append(self.run_id, batch, expected_seq=batch[0].seq - 1,
                                  epoch=self.lease.epoch,
                                  alone_in=self.state.scope if alone else None)
            except ScopeSharedError:
                self.shared_scope = True
                raise
            staged, self._staged = self._staged, []  # kept on failure: tried again next
            self._progress_at = _clock()
            for event in staged:
                self._observe(event)
            for event in events:
                apply(self.state, event)
                self._observe(event)
            if self.snapshot_every and (
                    self.state.last_seq - self._snapshot_seq >= self.snapshot_every):
                self._snapshot()
        return events

    def _snapshot(self) -> None:
        write_snapshot(self.store, self.state, segments=self._segments)
        self._snapshot_seq = self.state.last_seq

    def at_rest(self) -> None:
        """The run stopped cleanly (finished, paused, handed back): snapshot it if the
        tail since its last snapshot is a quarter of ``snapshot_every`` or more, so the
        next open replays less. (Not after a failure, nor with facts staged: the state
        would then be ahead of what was stored.)"""
        with self._writing:
            if self.snapshot_every and not self._staged and (
                    self.state.last_seq - self._snapshot_seq
                    >= max(1, self.snapshot_every // 4)):
                self._snapshot()

    @property
    def observes_state(self) -> bool:
        """Whether an observer is given each fact with the state as of it (see stateless)."""
        return self.observer is not None and getattr(self.observer, "reads_state", True)

    def _observe(self, event: Event) -> None:
        if self.observer is not None:
            self.observer(event, self.state)

    def stage(self, facts: list[tuple[EventType, dict[str, Any]]]) -> list[Event]:
        """Fold facts into the state now and store them with the next append.

        For a fact that is only relied on through what follows it: a model turn is
        stored with the starts of the calls it asks for, one sync instead of two. The
        caller must append (or :meth:`flush`) before waiting on the world; a crash
        before that loses only the staged facts, as if it came just before them.
        """
        facts = [(kind, self.redaction.recorded(p)) for kind, p in facts]
        with self._writing:
            events = make_events(self.run_id, self.state.last_seq, self.lease.epoch, facts)
            for event in events:
                apply(self.state, event)
            self._staged.extend(events)
        return events

    def flush(self) -> None:
        """Store the staged facts, if any."""
        if self._staged:
            self.record_all([])

    # --- the lease -------------------------------------------------------------------

    def _trusted_ttl(self) -> float:
        return self.ttl * (1 - LEASE_MARGIN)

    def _renew(self) -> None:
        with self._renewing:  # the heartbeat and check_lease may both renew
            started = _clock()
            self.lease = self.store.renew(self.lease, self.ttl)
            self._valid_until = max(self._valid_until, started + self._trusted_ttl())

    def check_lease(self, tool: str) -> None:
        """Raise LeaseExpiredError unless the lease is surely still this writer's.

        Called right before a tool with an effect. Within the TTL of the last
        acquire or renew (by our clock, less a margin) it costs a clock read;
        past it, the lease is renewed now, which the store refuses if another
        worker took the run over: then the call is not made. A pause between this
        check and the request leaving the process can still let a stale request
        out; only a receiver that refuses an older epoch (``ctx.epoch``) closes it.
        """
        if _clock() < self._valid_until:
            return
        try:
            self._renew()
        except JournalError as exc:
            detail = f"{type(exc).__name__}: {str(exc).split('. ')[0]}"
            raise LeaseExpiredError(self.run_id, self.lease.epoch, tool, detail) from exc

    def keep_alive(self) -> None:
        """Renew the lease every ttl/3 in the background while the run makes progress.

        A run that is stuck (see ``expect_progress``) is not renewed: its lease
        lapses, so another worker can take the run over. Renewal resumes once it
        makes progress again, if the lease is still its own. The journals of one store
        handle share one heartbeat (see :class:`Heartbeat`): a worker holding a thousand
        runs renews them in one statement, from one thread.
        """
        self._beats = heartbeat_of(self.store)
        self._beats.add(self)

    def _renewed(self, lease: Lease | None, started: float) -> None:
        """The heartbeat's renewal of this lease, begun at ``started``; None: refused."""
        with self._renewing:
            if lease is not None:
                self.lease = lease
                self._valid_until = max(self._valid_until, started + self._trusted_ttl())

    # --- progress --------------------------------------------------------------------

    def expect_progress(self, within: float | None) -> None:
        """From now, expect progress (an append, a tool's return) within ``within``
        seconds; None: no limit. Past it the run counts as stuck."""
        self._stall_limit = within
        self._progress_at = _clock()

    def stalled(self) -> bool:
        limit = self._stall_limit
        return limit is not None and _clock() - self._progress_at > limit

    # --- elapsed time ----------------------------------------------------------------

    def elapsed(self) -> float:
        """Seconds since the run started, counted so that a wall clock set back cannot
        rewind it: by the wall clock up to this open (never earlier than the last event
        recorded), by our own monotonic clock since."""
        if self._elapsed_at_open is None:
            self._elapsed_at_open = self._elapsed_before_open()
        return self._elapsed_at_open + (_clock() - self._opened_at)

    def _elapsed_before_open(self) -> float:
        started = self.state.started_at
        if started is None or self._opened_seq == 0:
            return 0.0  # started by this writer: all of it is on our clock
        tail = list(self.store.read(self.run_id, after_seq=self._opened_seq - 1))
        latest = max(self._opened_wall, tail[0].ts) if tail else self._opened_wall
        return max(0.0, (latest - started).total_seconds())

    def close(self) -> None:
        self._stop.set()
        if self._beats is not None:
            self._beats.remove(self)  # waits for a renewal in flight: none after release
        if not self.keep_lease:
            with contextlib.suppress(JournalError):  # fenced or broken: nothing to release
                self.store.release(self.lease)

    def __enter__(self) -> RunJournal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Heartbeat:
    """One thread renewing the leases of every journal open on one store handle: each
    every ttl/3 unless its run is stuck, all those due together in one call
    (``store.renew_all``: one statement on PostgreSQL, one transaction on SQLite; lease by
    lease on a store without it). Those due within half a period come along, so the
    leases of runs opened at scattered moments converge on one beat: one statement per
    beat, and if the process dies they all expire together, for a successor to take
    over at once. A lease the store no longer grants (another worker took the run) is
    dropped from the heartbeat; the run's next append says it was fenced."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._journals: dict[RunJournal, float] = {}  # journal -> when its next renewal is due
        self._lock = threading.Lock()  # guards _journals
        self._renewing = threading.Lock()  # held while a renewal is in flight
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._beaten_at = -math.inf  # the last beat_now

    def add(self, journal: RunJournal) -> None:
        with self._lock:
            self._journals[journal] = max(_clock() + journal.ttl / 3,
                                          self._beaten_at + journal.ttl / 2)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._beat, daemon=True,
                                                name=f"leases:{id(self.store):x}")
                self._thread.start()
        self._wake.set()

    def beat_now(self) -> None:
        """Renew every lease now, in this thread: a worker renews them right before its
        own heartbeat, so that if it dies they expire when its heartbeat says it was
        last alive, plus the TTL (or sooner), all together. This thread's own renewals
        then wait half a TTL, not a third, so the worker's next beat (a third of a TTL
        on) comes first: one renewal a period, never one after the heartbeat that the
        takeover is timed from."""
        with self._renewing:
            self._beaten_at = _clock()
            self._renew_due(everything=True, next_in=0.5)

    def remove(self, journal: RunJournal) -> None:
        """Stop renewing ``journal``'s lease; returns once no renewal of it is in flight."""
        with self._renewing, self._lock:
            self._journals.pop(journal, None)

    def _beat(self) -> None:
        while True:
            with self._lock:
                if not self._journals:
                    self._thread = None  # the next add starts another
                    return
                next_due = min(self._journals.values())
            self._wake.wait(max(0.0, next_due - _clock()))
            self._wake.clear()
            with self._renewing:
                self._renew_due()

    def _renew_due(self, everything: bool = False, next_in: float = 1 / 3) -> None:
        """Renew the leases due (within half a period; ``everything``: all), each next
        due ``next_in`` of its TTL from now."""
        now_ = _clock()
        with self._lock:
            due = [j for j, at in self._journals.items()
                   if everything or at <= now_ + j.ttl / 6]
            for j in due:
                self._journals[j] = now_ + j.ttl * next_in
        by_ttl: dict[float, list[RunJournal]] = {}
        for j in due:
            if not j.stalled():
                by_ttl.setdefault(j.ttl, []).append(j)
        for ttl, journals in by_ttl.items():
            for j, lease in zip(journals, self._renew(journals, ttl, now_), strict=True):
                j._renewed(lease if isinstance(lease, Lease) else None, now_)
                if isinstance(lease, JournalError) and not lease.retryable:
                    with self._lock:  # fenced or broken: the next append will say so
                        self._journals.pop(j, None)

    def _renew(self, journals: list[RunJournal], ttl: float,
               started: float) -> list[Lease | JournalError | None]:
        """Each journal's renewed lease, or why not (None: retry at its next beat)."""
        renew_all = getattr(self.store, "renew_all", None)
        if renew_all is None:
            return [self._renew_one(j, ttl) for j in journals]
        try:
            renewed = renew_all([j.lease for j in journals], ttl)
        except JournalError as exc:
            return [exc] * len(journals)
        return [renewed.get(j.run_id) or FencedError(j.run_id, j.lease.epoch, -1)
                for j in journals]

    def _renew_one(self, journal: RunJournal, ttl: float) -> Lease | JournalError:
        try:
            return self.store.renew(journal.lease, ttl)
        except JournalError as exc:
            return exc


_HEARTBEATS: weakref.WeakKeyDictionary[Store, Heartbeat] = weakref.WeakKeyDictionary()
_HEARTBEATS_LOCK = threading.Lock()


def heartbeat_of(store: Store) -> Heartbeat:
    """The heartbeat shared by the journals open on ``store``."""
    with _HEARTBEATS_LOCK:
        beats = _HEARTBEATS.get(store)
        if beats is None:
            beats = _HEARTBEATS[store] = Heartbeat(store)
        return beats


def open_journal(
    store: Store,
    run_id: str,
    *,
    owner: str | None = None,
    ttl: float = 30.0,
    observer: Observer | None = None,
    must_exist: bool = False,
    snapshot_every: int | None = None,
    redaction: Redaction | None = None,
    keep_lease: bool = False,
    lease: Lease | None = None,
) -> RunJournal:
    """Take the run's lease and load its state (snapshot + tail, or a full fold).

    The state's completed calls and attempts are loaded lazily (see keyed.py): they
    read ``store`` when a lookup needs a segment, so keep it open while the state is in
    use, or ``snapshots.settle`` the state first. Appends nothing.

    ``keep_lease``: closing does not release the lease (its caller
    does, as a queue's hand-back). ``redaction`` is applied to every fact recorded (default:
    ``Redaction()``, the default rules). With ``snapshot_every``, a snapshot is written each time
    that many events have been appended since the last one.

    ``lease``: one the caller holds already (a worker's claim), adopted instead of
    acquiring one: a round trip and a commit fewer per run a worker takes over. It is
    trusted for nothing until renewed (the heartbeat's, or check_lease's before a call
    with an effect), and an append under it after it was lost is fenced.
    """
    validate_run_id(run_id)
    if lease is None:
        leased_at = _clock()
        lease = take_lease(store, run_id, owner or default_owner(), ttl)
    elif lease.run_id != run_id:
        raise ValueError(f"the lease given is run {lease.run_id!r}'s, not {run_id!r}'s")
    else:
        leased_at = -math.inf  # granted we know not when: valid, by our clock, never
    try:
        # A new run's log is empty, and the lease keeps it so: nothing to read. A short
        # one is folded from its events: looking for a snapshot would cost a round trip.
        short = (lease.last_seq is not None
                 and lease.last_seq <= getattr(store, "short_log", SHORT_LOG))
        loaded = (Loaded(RunState(), 0, 0, []) if lease.last_seq == 0
                  else load_state(store, run_id, lazy=True, use_snapshots=not short))
        if must_exist and loaded.state.last_seq == 0:
            raise missing_run(store, run_id)
    except BaseException:
        store.release(lease)
        raise
    journal = RunJournal(store, lease, loaded.state, observer, snapshot_every, ttl=ttl,
                         leased_at=leased_at, redaction=redaction, segments=loaded.segments,
                         snapshot_seq=loaded.snapshot_seq)
    journal.keep_lease = keep_lease
    journal.keep_alive()
    return journal
