"""Snapshots: a cached partial fold, and the gate that proves the cache tells the truth.

Loading a run is ``fold(snapshot_state, events_after_it)``. A snapshot is used
only if its versions match this release, its digest matches its body, the
body decodes to the state at its seq, and the log continues right after it;
anything else is a miss (counted) and the next older snapshot is tried, then
a full replay from event 1. Deleting every snapshot never prevents recovery.

``verify`` reads the whole log (which checks every event's digest chain),
folds it twice in lockstep (determinism at every prefix) and checks every
stored snapshot, plus its tail, against the full replay on every durable
field; a mismatch quarantines that fold version so its snapshots are never
loaded again. A damaged log is reported with the first seq that does not
check out, and then proves nothing about snapshots, so none is judged.
"""

from __future__ import annotations

import gc
import hashlib
import logging
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager

import msgspec

from .errors import CorruptLogError, JournalError
from .events import SCHEMA_VERSION, Event, now
from .metrics import METRICS
from .state import FOLD_VERSION, RunState, apply, durable_fields
from .store import Store
from .store.base import Snapshot

log = logging.getLogger("agentjournal")

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(RunState)

# A body is the state's msgpack, compressed with zlib at level 1: 7-8x smaller (a run's
# state repeats its keys and much of its text), and it costs less to compress than the
# bytes saved cost to sync. Bodies written before are plain msgpack (a map, whose first
# byte is never zlib's 0x78) and load as they are.
_ZLIB = b"\x78\x01"  # zlib's header at level 1


@contextmanager
def gc_paused() -> Iterator[None]:
    """Hold the cyclic GC off during a bulk fold: it rescans a growing heap for nothing."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def take(state: RunState) -> Snapshot:
    body = zlib.compress(_encoder.encode(state), 1)
    return Snapshot(
        run_id=state.run_id, seq=state.last_seq, schema_version=SCHEMA_VERSION,
        fold_version=FOLD_VERSION, digest=hashlib.sha256(body).hexdigest(), body=body,
        created_at=now(),
    )


def write_snapshot(store: Store, state: RunState, *, keep: int = 2) -> Snapshot | None:
    """Publish a snapshot of ``state``; None if this fold version is quarantined.

    A snapshot is only a cache: failing to write one is logged, never fatal.
    """
    started = time.perf_counter()
    try:
        if FOLD_VERSION in store.quarantined():
            return None
        snapshot = take(state)
        store.put_snapshot(snapshot, keep=keep)
    except (JournalError, OSError) as exc:
        log.warning("snapshot of run %s at seq %d not written: %s",
                    state.run_id, state.last_seq, exc)
        return None
    METRICS.time("snapshot_write_ms", (time.perf_counter() - started) * 1000,
                 schema_version=SCHEMA_VERSION)
    return snapshot


def refusal(snapshot: Snapshot, quarantined: dict[int, str]) -> str | None:
    """Why ``snapshot`` is never loaded (so is dead weight), or None."""
    if snapshot.fold_version in quarantined:
        return f"fold version {snapshot.fold_version} is quarantined"
    if (snapshot.schema_version, snapshot.fold_version) != (SCHEMA_VERSION, FOLD_VERSION):
        return (f"written by schema v{snapshot.schema_version} / fold v{snapshot.fold_version}; "
                f"this release is v{SCHEMA_VERSION} / v{FOLD_VERSION}")
    if hashlib.sha256(snapshot.body).hexdigest() != snapshot.digest:
        return "digest does not match the body"
    return None


def state_of(body: bytes) -> RunState:
    """The state a snapshot body holds (msgspec.DecodeError, zlib.error if none)."""
    return _decoder.decode(zlib.decompress(body) if body[:2] == _ZLIB else body)


def _decode(snapshot: Snapshot) -> RunState | None:
    try:
        state = state_of(snapshot.body)
    except (msgspec.DecodeError, msgspec.ValidationError, zlib.error):
        return None
    ok = state.last_seq == snapshot.seq and state.run_id == snapshot.run_id
    return state if ok else None


class Loaded(msgspec.Struct, frozen=True):
    state: RunState
    snapshot_seq: int  # 0 when the whole log was replayed
    replayed: int
    misses: list[str]


def load_state(store: Store, run_id: str, *, use_snapshots: bool = True) -> Loaded:
    """The run's current state: the newest sound snapshot plus its tail, else a full fold."""
    with gc_paused():  # decoding and folding allocate many objects and free none
        return _load(store, run_id, use_snapshots)


def _load(store: Store, run_id: str, use_snapshots: bool) -> Loaded:
    misses: list[str] = []
    quarantined: dict[int, str] | None = None
    for snapshot in _newest_first(store, run_id) if use_snapshots else ():
        if quarantined is None:
            quarantined = store.quarantined()
        started = time.perf_counter()
        reason = refusal(snapshot, quarantined)
        state = None if reason else _decode(snapshot)
        if state is None:
            reason = reason or "body does not decode to the state at its seq"
        METRICS.time("snapshot_load_ms", (time.perf_counter() - started) * 1000,
                     schema_version=snapshot.schema_version)
        if state is not None:
            tail = _fold_tail(store, run_id, state)
            if tail is not None:
                METRICS.gauge("snapshot_seq_gap", tail, schema_version=SCHEMA_VERSION)
                return Loaded(state, snapshot.seq, tail, misses)
            reason = "the log does not continue right after it"
        misses.append(f"snapshot at seq {snapshot.seq}: {reason}")
        METRICS.count("snapshot_misses", schema_version=snapshot.schema_version)
        log.info("run %s: snapshot at seq %d not used: %s", run_id, snapshot.seq, reason)
    state = RunState()
    replayed = _fold_tail(store, run_id, state)
    assert replayed is not None  # an empty state continues any log
    return Loaded(state, 0, replayed, misses)


def _newest_first(store: Store, run_id: str) -> Iterator[Snapshot]:
    """The run's snapshots, newest first; older bodies are read only if the newest fails."""
    newest = store.snapshots(run_id, limit=1)
    yield from newest
    if newest:
        yield from store.snapshots(run_id)[1:]


def _fold_tail(store: Store, run_id: str, state: RunState) -> int | None:
    """Fold the events after ``state`` into it; None (state untouched) on a gap."""
    started = time.perf_counter()
    after = state.last_seq
    events = list(store.read(run_id, after_seq=after))
    if (events and events[0].seq != after + 1) or (not events and after
                                                   and store.last_seq(run_id) != after):
        return None
    for event in events:  # (load_state holds the GC off)
        apply(state, event)
    METRICS.count("events_replayed", len(events), schema_version=SCHEMA_VERSION)
    METRICS.time("replay_duration_ms", (time.perf_counter() - started) * 1000,
                 schema_version=SCHEMA_VERSION)
    return len(events)


# --- the equivalence gate ----------------------------------------------------------


class Mismatch(msgspec.Struct, frozen=True):
    check: str  # "determinism" | "snapshot"
    seq: int
    fields: list[str]
    snapshot_seq: int | None = None


class VerifyReport(msgspec.Struct, frozen=True):
    run_id: str
    events: int
    snapshots_checked: int
    mismatches: list[Mismatch]
    quarantined: list[int]
    corrupt_seq: int | None = None  # the first event that does not check out (digest, bytes)
    corrupt: str | None = None  # what is wrong with it

    @property
    def ok(self) -> bool:
        return not self.mismatches and self.corrupt_seq is None


def _differing(a: dict[str, object], b: dict[str, object]) -> list[str]:
    return sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))


def _read_to_damage(store: Store, run_id: str) -> tuple[list[Event], CorruptLogError | None]:
    """The run's events, up to the first damaged one (some backends stop before reading
    any), and the damage."""
    events: list[Event] = []
    try:
        events.extend(store.read(run_id))
    except CorruptLogError as exc:
        return events, exc
    return events, None


def verify(store: Store, run_id: str) -> VerifyReport:
    """Check the log's digest chain, determinism at every prefix and every snapshot
    against the full replay."""
    events, damage = _read_to_damage(store, run_id)
    # A snapshot checked against a damaged log would be blamed for the log's fault.
    snapshots = store.snapshots(run_id) if damage is None else []
    wanted = {s.seq for s in snapshots}
    first, second = RunState(), RunState()
    at_seq: dict[int, dict[str, object]] = {}
    mismatches: list[Mismatch] = []
    with gc_paused():
        for event in events:
            apply(first, event)
            apply(second, event)
            view = durable_fields(first)
            if fields := _differing(view, durable_fields(second)):
                mismatches.append(Mismatch("determinism", event.seq, fields))
            if event.seq in wanted:
                at_seq[event.seq] = view
    final = durable_fields(first)
    quarantined: set[int] = set()
    for snapshot in snapshots:
        state = _decode(snapshot)
        if state is None or hashlib.sha256(snapshot.body).hexdigest() != snapshot.digest:
            continue  # unreadable snapshots are misses at load time, not wrong folds
        fields = _differing(durable_fields(state), at_seq.get(snapshot.seq, {}))
        for event in events[snapshot.seq:]:
            apply(state, event)
        fields += [f"final.{f}" for f in _differing(durable_fields(state), final)]
        if fields:
            mismatches.append(Mismatch("snapshot", snapshot.seq, fields, snapshot.seq))
            METRICS.count("full_replay_equivalence_failures",
                          schema_version=snapshot.schema_version)
            store.quarantine(snapshot.fold_version,
                             f"run {run_id} snapshot at seq {snapshot.seq}: {', '.join(fields)}")
            quarantined.add(snapshot.fold_version)
    return VerifyReport(run_id, len(events), len(snapshots), mismatches, sorted(quarantined),
                        damage.seq if damage else None, damage.detail if damage else None)
