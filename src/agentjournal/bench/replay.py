"""2-4. Replay throughput, recovery time and snapshot writes."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from functools import partial
from pathlib import Path
from typing import NamedTuple

import msgspec

from ..events import Event, decode, encode
from ..snapshots import (
    Segments,
    gc_paused,
    load_state,
    named_segments,
    state_of,
    write_snapshot,
)
from ..state import RunState, apply, fold
from ..store import Store, open_store
from ..store.base import Snapshot
from ._common import (
    RECOVERY_TAIL,
    RUN,
    SNAPSHOT_EVERY,
    Figure,
    Say,
    append_one_by_one,
    as_new_process,
    clock,
    figure,
    medians,
    store_url,
    timed,
)
from .postgres import postgres_problem, throwaway_schema

# --- 2. replay throughput ------------------------------------------------------------------

_event_decoder = msgspec.json.Decoder(Event)


def _decode_only(lines: list[bytes]) -> int:
    decode = _event_decoder.decode
    for line in lines:
        decode(line)
    return len(lines)


def _fold_lines(lines: list[bytes]) -> RunState:
    return fold(decode(line) for line in lines)


def _decode_kept(lines: list[bytes]) -> int:
    decode = _event_decoder.decode
    return len([decode(line) for line in lines])


def replay_at(lines: list[bytes], reps: int) -> list[Figure]:
    n = len(lines)
    floor, kept, off, on = (n / t for t in medians(reps, [
        partial(timed, partial(_decode_only, lines), gc_off=True),
        partial(timed, partial(_decode_kept, lines), gc_off=True),
        partial(timed, partial(_fold_lines, lines), gc_off=True),
        partial(timed, partial(_fold_lines, lines), gc_off=False),
    ]))
    floor_name = "msgspec.json.Decoder(Event).decode only"
    # A replay must keep what it decodes; decoding into a list that is kept is the
    # floor for that (its objects cannot reuse the memory of the one before).
    kept_name = "msgspec.json.Decoder(Event).decode into a kept list"
    return [
        figure(f"replay.gc_off.{n}", off, "events/s", floor, floor_name,
               "fold(decode(b) for b in lines), GC paused; target ≥ 0.5x"),
        figure(f"replay.vs_kept.{n}", off, "events/s", kept, kept_name,
               "the same fold against decoding into a kept list, GC paused"),
        figure(f"replay.gc_on.{n}", on, "events/s", floor, floor_name,
               "the same fold, cyclic GC on (for comparison)"),
    ]


def replay_figures(events: list[Event], sizes: Sequence[int], reps: int, say: Say) -> list[Figure]:
    figures = []
    for n in sizes:
        say(f"replay: {n:,} events")
        figures += replay_at([encode(e) for e in events[:n]], reps)
    return figures


# --- 3 & 4. recovery and snapshot writes ----------------------------------------------------


class Written(NamedTuple):
    """One snapshot ``fill`` wrote: its body and new segments per event since the one
    before, and the milliseconds ``write_snapshot`` took."""

    bytes_per_event: float
    ms: float


def fill(
    store: Store, events: list[Event], *, batch: int, snapshot_at: int | None,
    written: list[Written] | None = None,
) -> Snapshot | None:
    """Append ``events`` ``batch`` at a time, folding as the run grows and writing a
    snapshot whenever the last seq is ``snapshot_at`` modulo the interval, as a run's
    journal does (each writes the segments the store lacks). Returns the last; each
    write goes in ``written``."""
    state, last, segments = RunState(), None, Segments()
    with gc_paused():
        for i in range(0, len(events), batch):
            chunk = events[i:i + batch]
            append_one_by_one(store, chunk)
            for e in chunk:
                apply(state, e)
            if snapshot_at is not None and state.last_seq % SNAPSHOT_EVERY == snapshot_at:
                before, started = segments.digests(), time.perf_counter()
                snapshot = write_snapshot(store, state, segments=segments)
                ms = (time.perf_counter() - started) * 1e3
                if snapshot is not None and written is not None:
                    new = store.segments(state.run_id, segments.digests() - before)
                    since = state.last_seq - (last.seq if last else 0)
                    size = len(snapshot.body) + sum(map(len, new.values()))
                    written.append(Written(size / since, ms))
                last = snapshot or last
    return last


def _recover(url: str, *, use_snapshots: bool) -> float:
    """Seconds to open the store and have the state ready, as a journal loads it (lazily:
    see keyed.py), with the cyclic GC on; it starts from a collected heap, as a new
    process does, not with the garbage of the bench's last recovery."""
    as_new_process()
    start = time.perf_counter()
    store = open_store(url)
    loaded = load_state(store, RUN, use_snapshots=use_snapshots, lazy=True)
    elapsed = time.perf_counter() - start
    store.close()
    del loaded
    return elapsed


def _replayed(url: str, n: int) -> int:
    """Events a recovery with snapshots replays; raises unless it recovers all ``n``."""
    store = open_store(url)
    try:
        loaded = load_state(store, RUN)
    finally:
        store.close()
    if loaded.state.last_seq != n:
        raise RuntimeError(f"recovered {loaded.state.last_seq} events of {n}: {loaded.misses}")
    return loaded.replayed


def _decode_snapshot_and_tail(body: bytes, segments: dict[str, bytes],
                              tail: list[bytes]) -> int:
    state_of(body, segments)
    return _decode_only(tail)


def recovery_at(backend: str, url: str, events: list[Event], snap: Snapshot,
                reps: int) -> list[Figure]:
    n = len(events)
    lines = [encode(e) for e in events]
    replayed = _replayed(url, n)
    store = open_store(url)
    try:  # the segments the snapshot names, read beforehand: the floor is in memory
        segments = store.segments(RUN, named_segments(snap.body))
    finally:
        store.close()
    snap_floor, with_snap, full_floor, without = (t * 1e3 for t in medians(reps, [
        partial(timed, partial(_decode_snapshot_and_tail, snap.body, segments,
                               lines[snap.seq:]), gc_off=True),
        partial(_recover, url, use_snapshots=True),
        partial(timed, partial(_decode_only, lines), gc_off=True),
        partial(_recover, url, use_snapshots=False),
    ]))
    return [
        figure(f"recovery.{backend}.snapshots.{n}", with_snap, "ms", snap_floor,
               "inflate and decode the snapshot body, its segments and the tail's events, "
               "in memory",
               f"snapshot at seq {snap.seq:,} ({len(snap.body) / 1e3:.1f} kB and "
               f"{sum(map(len, segments.values())) / 1e6:.2f} MB in {len(segments)} segments)"
               f" + {replayed} events"),
        figure(f"recovery.{backend}.full.{n}", without, "ms", full_floor,
               "decode every event, in memory", "snapshots ignored: the whole log folded"),
    ]


def _snapshot(store: Store, state: RunState) -> Snapshot:
    # write_snapshot only logs a failure (a snapshot is a cache): a failed write must not
    # pass for a fast one here.
    if (snapshot := write_snapshot(store, state)) is None:
        raise RuntimeError(f"write_snapshot into {store.url} failed; see the log")
    return snapshot


def _raw_snapshot(path: Path, state: RunState) -> None:
    body = msgspec.msgpack.encode(state)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, body)
        os.fsync(fd)
    finally:
        os.close(fd)


def snapshot_write_figure(backend: str, url: str, raw: Path, events: list[Event],
                          reps: int) -> Figure:
    """write_snapshot of the state at len(events), into a scratch store of the same backend."""
    state = fold(events)
    store = open_store(url)
    try:
        ours, floor = (t * 1e3 for t in medians(reps, [
            partial(clock, partial(_snapshot, store, state)),
            partial(clock, partial(_raw_snapshot, raw, state)),
        ]))
    finally:
        store.close()
    n = len(events)
    return figure(f"snapshot_write.{backend}.{n}", ours, "ms", floor,
                  "msgpack encode + os.write + os.fsync", f"state of {n:,} events")


StoreUrl = Callable[[str], AbstractContextManager[str]]  # a scratch store's name -> its URL


def _backend_recovery(backend: str, url_of: StoreUrl, workdir: Path, events: list[Event],
                      sizes: Sequence[int], reps: int, say: Say) -> list[Figure]:
    figures: list[Figure] = []
    ms: dict[int, float] = {}
    per_event: dict[int, float] = {}
    for n in sizes:
        say(f"recovery: {backend}, {n:,} events (building the log and its snapshots)")
        with url_of(f"recovery-{backend}-{n}") as url:
            store = open_store(url)
            written: list[Written] = []
            snap = fill(store, events[:n], batch=RECOVERY_TAIL, snapshot_at=RECOVERY_TAIL,
                        written=written)
            store.close()
            if snap is None:
                raise RuntimeError(f"no snapshot was written for {n} events on {backend}")
            at_n = recovery_at(backend, url, events[:n], snap, reps)
        ms[n] = at_n[0].value or 0.0
        per_event[n] = written[-1].bytes_per_event
        figures += [*at_n, figure(
            f"snapshot_bytes.{backend}.{n}", per_event[n], "B/event",
            note=f"what the snapshot at seq {snap.seq:,} wrote (its body and the segments "
                 "the store lacked) per event since the one before"), figure(
            f"snapshot_next.{backend}.{n}", written[-1].ms, "ms",
            note=f"write_snapshot at seq {snap.seq:,}, the writer knowing the segments of "
                 "the one before (as a journal does; one every 1,000 events)")]
        with url_of(f"snapwrite-{backend}-{n}") as url:
            figures.append(snapshot_write_figure(backend, url, workdir / f"snapwrite-{backend}.raw",
                                                 events[:n], min(reps, 3)))
    small, large = min(ms), max(ms)
    figures += [
        figure(f"recovery_growth.{backend}", ms[large] / ms[small], "x",
               note=f"with snapshots, {large:,} / {small:,} events; target ≤ 2x"),
        figure(f"snapshot_bytes_growth.{backend}", per_event[large] / per_event[small], "x",
               note=f"a snapshot's bytes per event since the one before, {large:,} / "
                    f"{small:,} events: what changed, not the run"),
    ]
    return figures


def _skipped_recovery(backend: str, sizes: Sequence[int], reason: str) -> list[Figure]:
    note = f"skipped: {reason}"
    names = [name for n in sizes for name in (
        f"recovery.{backend}.snapshots.{n}", f"recovery.{backend}.full.{n}",
        f"snapshot_write.{backend}.{n}")]
    return [*(figure(name, None, "ms", note=note) for name in names),
            *(figure(f"snapshot_bytes.{backend}.{n}", None, "B/event", note=note)
              for n in sizes),
            *(figure(f"snapshot_next.{backend}.{n}", None, "ms", note=note) for n in sizes),
            figure(f"recovery_growth.{backend}", None, "x", note=note),
            figure(f"snapshot_bytes_growth.{backend}", None, "x", note=note)]


def _local_url(workdir: Path, backend: str, name: str) -> AbstractContextManager[str]:
    return nullcontext(store_url(backend, workdir / name))


def _postgres_url(server: str, _name: str) -> AbstractContextManager[str]:
    return throwaway_schema(server)


def recovery_figures(workdir: Path, events: list[Event], sizes: Sequence[int], reps: int,
                     say: Say, postgres_url: str | None = None) -> list[Figure]:
    """Recovery on every backend: Postgres in throwaway schemas, skipped (with the reason)
    when it cannot be reached."""
    figures: list[Figure] = []
    for backend in ("sqlite", "jsonl"):
        figures += _backend_recovery(backend, partial(_local_url, workdir, backend), workdir,
                                     events, sizes, reps, say)
    problem = postgres_problem(postgres_url)
    if problem or not postgres_url:
        return [*figures, *_skipped_recovery("postgres", sizes, problem or "no Postgres URL")]
    return [*figures, *_backend_recovery("postgres", partial(_postgres_url, postgres_url),
                                         workdir, events, sizes, reps, say)]
