"""``agentjournal bench``: every figure measured beside its physical floor, in one process.

Machines of this class are shared and noisy (±30 % run to run, up to 2x for
micro-benchmarks), so an absolute number means little on its own; the ratio
to a floor measured moments earlier, in the same process, holds. One
convention everywhere: ``ratio = value / floor``. For a duration or a size
that is "how many floors it costs" (lower is better); for a throughput
(events/s) it is "what fraction of the floor's speed it reaches" (higher is
better).

Figure families (a name up to its first dot):

    append, tool_call              durable appends (fsync) per backend vs a raw write + sync
    replay                         fold(decode(...)) vs decode-only, events/s
    recovery, recovery_growth      open the store + load_state, with and without snapshots
    snapshot_write                 write_snapshot vs msgpack encode + write + fsync
    storage, storage_growth        bytes per event and per step as the run grows
    cpu_per_event                  envelope + encode + write with syncing off
    agent_step, agent_step_growth  a real Agent loop: µs per step at 200 and 2,000 steps

Scratch stores are throwaway: the command removes its directory afterwards,
and Postgres runs in its own ``bench_<random>`` schema, dropped at the end.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import itertools
import os
import platform
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
import zlib
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple, NoReturn

import click
import msgspec
from rich.console import Console
from rich.table import Table

from .agent import Agent
from .events import SCHEMA_VERSION, Event, EventType, decode, encode, make_events
from .keys import idempotency_key, run_scope
from .models import Model, ModelRequest, ModelResponse, ScriptedModel, calls, reply
from .snapshots import gc_paused, load_state, write_snapshot
from .state import RunState, ToolCall, apply, fold
from .store import Durability, Store, open_store
from .store.base import Snapshot
from .store.jsonl import JsonlStore
from .tools import Tool, tool

E = EventType
RUN = "bench-run"
DEFAULT_POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"
SNAPSHOT_EVERY = 1000
# Recovery stores get their snapshots at seq % 1000 == 500, so every size
# recovers the same 500-event tail (the mean tail at interval 1000) and only
# the run's length varies.
RECOVERY_TAIL = 500
NEVER = 10**9  # a jsonl batch_every that never fsyncs: "syncing off"

Say = Callable[[str], None]
Fact = tuple[EventType, dict[str, Any]]
Write = Callable[[int, bytes], None]  # store (seq, bytes), nothing else: a floor


class Figure(msgspec.Struct, frozen=True):
    name: str
    value: float | None  # None: not measured here (the note says why)
    unit: str
    floor: float | None = None
    floor_name: str | None = None
    ratio: float | None = None  # value / floor
    note: str = ""


def figure(
    name: str, value: float | None, unit: str, floor: float | None = None,
    floor_name: str | None = None, note: str = "",
) -> Figure:
    ratio = value / floor if value is not None and floor else None
    return Figure(name, value, unit, floor, floor_name, ratio, note)


class Plan(msgspec.Struct, frozen=True, kw_only=True):
    appends: int  # durable appends timed per backend
    reps: int  # repetitions behind each median
    sizes: tuple[int, ...]  # event counts for replay and recovery
    steps: tuple[int, ...]  # run lengths for storage
    cpu_events: int  # events per round, syncing off
    agent_steps: tuple[int, int] = (200, 2000)
    agent_reps: int = 5  # the loop's µs/step swings ±30 % run to run here


QUICK = Plan(appends=240, reps=5, sizes=(1_000, 10_000), steps=(100, 1_000), cpu_events=1_500)
FULL = Plan(appends=1_500, reps=5, sizes=(1_000, 10_000, 100_000), steps=(100, 1_000, 10_000),
            cpu_events=4_000, agent_reps=9)


# --- the workload: what Agent records for a run calling one tool per turn ----------------

TASK = "Reconcile this week's shipped orders against the carrier manifest; report mismatches."
TURN_TEXT = "Checking the next order against the manifest before I mark it reconciled."


def order_result(i: int) -> dict[str, Any]:
    """A tool result of about 200 bytes."""
    return {
        "order": f"ord-{i:06d}", "status": "shipped", "carrier": "DHL Express",
        "eta": "2026-12-03", "items": [{"sku": "A-1001", "qty": 2}, {"sku": "B-2002", "qty": 1}],
        "note": "left at the front desk; customer notified by email",
    }


def _step_facts(scope: str, i: int, started_seq: int) -> list[Fact]:
    call_id, args = f"call_{i}_0", {"order": f"ord-{i:06d}"}
    key = idempotency_key(scope, "lookup", args)
    result = order_result(i)
    # The prompt grows every step (input_tokens), the recorded facts do not.
    usage = {"input_tokens": 40 + 110 * i, "output_tokens": 26, "cached_input_tokens": 0,
             "cost_usd": 0.0004}
    return [
        (E.MODEL_TURN, {"text": TURN_TEXT, "usage": usage,
                        "tool_calls": [{"id": call_id, "name": "lookup", "args": args}]}),
        (E.TOOL_CALL_STARTED, {"key": key, "tool": "lookup", "args": args, "call_id": call_id,
                               "effect": "read_only", "attempt": 1}),
        (E.TOOL_CALL_COMPLETED, {"started_seq": started_seq, "call_id": call_id,
                                 "tool": "lookup", "idempotency_key": key, "result": result,
                                 "source": "tool"}),  # as the loop writes it: result once
    ]


def _facts(run_id: str) -> Iterator[Fact]:
    scope = run_scope(run_id)
    yield E.RUN_STARTED, {"task": TASK, "scope": scope, "agent": None}
    yield E.USER_MESSAGE, {"content": TASK}
    for i in itertools.count():
        yield from _step_facts(scope, i, started_seq=4 + 3 * i)


def workload(run_id: str, n: int) -> list[Event]:
    """The first ``n`` events of the run (2 opening events, then 3 per step)."""
    return make_events(run_id, 0, 0, itertools.islice(_facts(run_id), n))


# --- timing --------------------------------------------------------------------------


def _clock(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    result = fn()
    elapsed = time.perf_counter() - start
    del result  # freeing a big result is not part of what was measured
    return elapsed


def _timed(fn: Callable[[], object], *, gc_off: bool) -> float:
    if not gc_off:
        return _clock(fn)
    with gc_paused():
        return _clock(fn)


def _medians(reps: int, cases: Sequence[Callable[[], float]]) -> list[float]:
    """The median of each case's measurement, the cases taken in turn round by round,
    so the machine's drift over the run hits every case alike."""
    rounds: list[list[float]] = [[] for _ in cases]
    for _ in range(reps):
        for case, results in zip(cases, rounds, strict=True):
            gc.collect()  # every measurement starts from the same heap
            results.append(case())
    return [statistics.median(r) for r in rounds]


def _p99(xs: Sequence[float]) -> float:
    return sorted(xs)[min(len(xs) - 1, int(len(xs) * 0.99))]


def _store_url(backend: str, path: Path, query: str = "") -> str:
    suffix = ".db" if backend == "sqlite" else ""
    return f"{backend}:///{path}{suffix}" + (f"?{query}" if query else "")


def _append(store: Store, events: Sequence[Event]) -> None:
    store.append(RUN, events, expected_seq=events[0].seq - 1, epoch=0)


# --- 1. durable appends ------------------------------------------------------------------


class Target(NamedTuple):
    """A store under test and the raw durable write it is measured against."""

    backend: str
    store: Store
    floor: Write  # the raw durable write
    floor_name: str
    frame: Callable[[bytes], bytes] = bytes  # the bytes the store writes for one body


def _jsonl_frame(body: bytes) -> bytes:
    return b"%08x %s\n" % (zlib.crc32(body), body)


@contextlib.contextmanager
def jsonl_target(workdir: Path) -> Iterator[Target]:
    store = open_store(_store_url("jsonl", workdir / "append-jsonl"))
    fd = os.open(workdir / "append-jsonl" / "floor.raw",
                 os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)

    def write(_seq: int, data: bytes) -> None:
        os.write(fd, data)
        os.fsync(fd)

    try:
        yield Target("jsonl", store, write, "os.write + os.fsync, same dir", _jsonl_frame)
    finally:
        os.close(fd)
        store.close()


def raw_sqlite(path: Path, synchronous: str) -> tuple[sqlite3.Connection, Write]:
    """A minimal table with the store's pragmas, and an INSERT+COMMIT of one row."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute(f"PRAGMA synchronous={synchronous}")
    db.execute("CREATE TABLE floor (seq INTEGER PRIMARY KEY, body BLOB NOT NULL)")

    def write(seq: int, data: bytes) -> None:
        db.execute("BEGIN")
        db.execute("INSERT INTO floor VALUES (?, ?)", (seq, data))
        db.execute("COMMIT")

    return db, write


@contextlib.contextmanager
def sqlite_target(workdir: Path) -> Iterator[Target]:
    store = open_store(_store_url("sqlite", workdir / "append-sqlite"))
    db, write = raw_sqlite(workdir / "append-floor.db", "FULL")
    try:
        yield Target("sqlite", store, write, "sqlite3 INSERT+COMMIT, WAL, synchronous=FULL")
    finally:
        db.close()
        store.close()


@contextlib.contextmanager
def postgres_target(url: str) -> Iterator[Target]:
    """The store in a throwaway ``bench_<random>`` schema, dropped afterwards."""
    import psycopg
    from psycopg import sql

    schema = f"bench_{uuid.uuid4().hex[:12]}"
    name = sql.Identifier(schema)
    insert = sql.SQL("INSERT INTO {}.floor VALUES (%s, %s)").format(name)
    with contextlib.ExitStack() as cleanup:
        # Registered first, so it runs last: after the store and the floor let go.
        cleanup.callback(_drop_schema, url, schema)
        store = open_store(f"{url}{'&' if '?' in url else '?'}schema={schema}")
        cleanup.callback(store.close)
        conn = cleanup.enter_context(psycopg.connect(url))
        # A logged table: a temp table's commit writes no WAL, so it would not wait for a flush.
        conn.execute(sql.SQL("CREATE TABLE {}.floor (seq bigint PRIMARY KEY, body bytea NOT NULL)")
                     .format(name))
        conn.commit()

        def write(seq: int, data: bytes) -> None:
            conn.execute(insert, (seq, data))
            conn.commit()

        yield Target("postgres", store, write, "psycopg INSERT+COMMIT, minimal table")


def _drop_schema(url: str, schema: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


class AppendTimes(NamedTuple):
    single: list[float]  # one event per append
    pairs: list[float]  # tool_call_started + tool_call_completed, two appends
    floor: list[float]  # one raw durable write


def time_appends(t: Target, events: list[Event]) -> AppendTimes:
    """Store appends and floor writes interleaved step by step, so drift hits both alike."""
    framed = [t.frame(encode(e)) for e in events]
    for e in events[:2]:  # warm-up: creates files, tables and cached statements
        _append(t.store, [e])
        t.floor(e.seq, framed[e.seq - 1])
    out = AppendTimes([], [], [])
    for i in range(2, len(events) - 2, 3):
        turn, started, done = events[i:i + 3]
        a = time.perf_counter()
        _append(t.store, [turn])
        b = time.perf_counter()
        _append(t.store, [started])
        c = time.perf_counter()
        _append(t.store, [done])
        d = time.perf_counter()
        out.single.extend((b - a, c - b, d - c))
        out.pairs.append(d - b)
        for e in (turn, started, done):
            start = time.perf_counter()
            t.floor(e.seq, framed[e.seq - 1])
            out.floor.append(time.perf_counter() - start)
    return out


def append_figures(t: Target, n: int) -> list[Figure]:
    times = time_appends(t, workload(RUN, n))
    us = 1e6
    floor = statistics.median(times.floor) * us
    note = (f"target ≤ 1.3x; p99 {_p99(times.single) * us:,.0f} µs, floor's "
            f"{_p99(times.floor) * us:,.0f} µs")
    return [
        figure(f"append.{t.backend}", statistics.median(times.single) * us, "µs/event",
               floor, t.floor_name, note),
        figure(f"tool_call.{t.backend}", statistics.median(times.pairs) * us, "µs/tool call",
               2 * floor, f"2 x ({t.floor_name})", "started + completed: two durable appends"),
    ]


def _skipped_appends(backend: str, reason: str) -> list[Figure]:
    return [figure(f"append.{backend}", None, "µs/event", note=f"skipped: {reason}"),
            figure(f"tool_call.{backend}", None, "µs/tool call", note=f"skipped: {reason}")]


def postgres_problem(url: str | None) -> str | None:
    """Why Postgres cannot be measured here, or None."""
    if not url:
        return "no Postgres URL given"
    try:
        import psycopg
    except ImportError:
        return "psycopg is not installed: pip install 'agentjournal[postgres]'"
    try:
        with psycopg.connect(url, connect_timeout=3):
            return None
    except psycopg.Error as exc:
        return f"no PostgreSQL server reachable at {url}: {' '.join(str(exc).split())}"


def durable_figures(workdir: Path, postgres_url: str | None, plan: Plan, say: Say) -> list[Figure]:
    targets = [jsonl_target(workdir), sqlite_target(workdir)]
    figures: list[Figure] = []
    if problem := postgres_problem(postgres_url):
        figures += _skipped_appends("postgres", problem)
    elif postgres_url:
        targets.append(postgres_target(postgres_url))
    for target in targets:  # each opened only when its turn comes
        with target as t:
            say(f"durable appends: {t.backend}, {plan.appends} events")
            figures += append_figures(t, plan.appends + 2)
    return figures


# --- 2. replay throughput ------------------------------------------------------------------

_event_decoder = msgspec.json.Decoder(Event)


def _decode_only(lines: list[bytes]) -> int:
    decode = _event_decoder.decode
    for line in lines:
        decode(line)
    return len(lines)


def _fold_lines(lines: list[bytes]) -> RunState:
    return fold(decode(line) for line in lines)


def replay_at(lines: list[bytes], reps: int) -> list[Figure]:
    n = len(lines)
    floor, off, on = (n / t for t in _medians(reps, [
        partial(_timed, partial(_decode_only, lines), gc_off=True),
        partial(_timed, partial(_fold_lines, lines), gc_off=True),
        partial(_timed, partial(_fold_lines, lines), gc_off=False),
    ]))
    floor_name = "msgspec.json.Decoder(Event).decode only"
    return [
        figure(f"replay.gc_off.{n}", off, "events/s", floor, floor_name,
               "fold(decode(b) for b in lines), GC paused; target ≥ 0.5x"),
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


def fill(
    store: Store, events: list[Event], *, batch: int, snapshot_at: int | None
) -> Snapshot | None:
    """Append ``events`` ``batch`` at a time, folding as the run grows and writing a
    snapshot whenever the last seq is ``snapshot_at`` modulo the interval. Returns the last."""
    state, last = RunState(), None
    with gc_paused():
        for i in range(0, len(events), batch):
            chunk = events[i:i + batch]
            _append(store, chunk)
            for e in chunk:
                apply(state, e)
            if snapshot_at is not None and state.last_seq % SNAPSHOT_EVERY == snapshot_at:
                last = write_snapshot(store, state) or last
    return last


def _recover(url: str, *, use_snapshots: bool) -> float:
    """Seconds to open the store and have the state ready (the cyclic GC as it is)."""
    start = time.perf_counter()
    store = open_store(url)
    loaded = load_state(store, RUN, use_snapshots=use_snapshots)
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


_state_decoder = msgspec.msgpack.Decoder(RunState)


def _decode_snapshot_and_tail(body: bytes, tail: list[bytes]) -> int:
    _state_decoder.decode(body)
    return _decode_only(tail)


def recovery_at(backend: str, url: str, events: list[Event], snap: Snapshot,
                reps: int) -> list[Figure]:
    n = len(events)
    lines = [encode(e) for e in events]
    replayed = _replayed(url, n)
    snap_floor, with_snap, full_floor, without = (t * 1e3 for t in _medians(reps, [
        partial(_timed, partial(_decode_snapshot_and_tail, snap.body, lines[snap.seq:]),
                gc_off=True),
        partial(_recover, url, use_snapshots=True),
        partial(_timed, partial(_decode_only, lines), gc_off=True),
        partial(_recover, url, use_snapshots=False),
    ]))
    return [
        figure(f"recovery.{backend}.snapshots.{n}", with_snap, "ms", snap_floor,
               "decode the snapshot body + the tail's events, in memory",
               f"snapshot at seq {snap.seq:,} ({len(snap.body) / 1e6:.1f} MB) + {replayed} "
               "events"),
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


def snapshot_write_figure(backend: str, workdir: Path, events: list[Event],
                          reps: int) -> Figure:
    """write_snapshot of the state at len(events), into a scratch store of the same backend."""
    state = fold(events)
    store = open_store(_store_url(backend, workdir / f"snapwrite-{backend}"))
    raw = workdir / f"snapwrite-{backend}.raw"
    try:
        ours, floor = (t * 1e3 for t in _medians(reps, [
            partial(_clock, partial(_snapshot, store, state)),
            partial(_clock, partial(_raw_snapshot, raw, state)),
        ]))
    finally:
        store.close()
    n = len(events)
    return figure(f"snapshot_write.{backend}.{n}", ours, "ms", floor,
                  "msgpack encode + os.write + os.fsync", f"state of {n:,} events")


def recovery_figures(workdir: Path, events: list[Event], sizes: Sequence[int], reps: int,
                     say: Say) -> list[Figure]:
    figures: list[Figure] = []
    for backend in ("sqlite", "jsonl"):
        ms: dict[int, float] = {}
        for n in sizes:
            say(f"recovery: {backend}, {n:,} events (building the log and its snapshots)")
            url = _store_url(backend, workdir / f"recovery-{backend}-{n}")
            store = open_store(url)
            snap = fill(store, events[:n], batch=RECOVERY_TAIL, snapshot_at=RECOVERY_TAIL)
            store.close()
            if snap is None:
                raise RuntimeError(f"no snapshot was written for {n} events on {backend}")
            at_n = recovery_at(backend, url, events[:n], snap, reps)
            ms[n] = at_n[0].value or 0.0
            figures += at_n
            figures.append(snapshot_write_figure(backend, workdir, events[:n], min(reps, 3)))
        small, large = min(ms), max(ms)
        figures.append(figure(
            f"recovery_growth.{backend}", ms[large] / ms[small], "x",
            note=f"with snapshots, {large:,} / {small:,} events; target ≤ 2x"))
    return figures


# --- 5. storage ---------------------------------------------------------------------------


def _sqlite_bytes(path: Path) -> int:
    """The file plus its WAL, after a checkpoint has moved the WAL into the file."""
    db = sqlite3.connect(path)
    try:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        db.close()
    wal = path.with_name(path.name + "-wal")
    return path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)


def _jsonl_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def _stored_bytes(variant: str, workdir: Path, events: list[Event]) -> int:
    """Bytes a run of ``events`` adds to an empty store, appended one event per call
    (batched durability: syncing changes the time, not the bytes)."""
    path = workdir / f"storage-{variant}-{len(events)}"
    if variant == "jsonl":
        with JsonlStore(path, durability=Durability.BATCHED, batch_every=NEVER) as log:
            fill(log, events, batch=1, snapshot_at=None)
        return _jsonl_bytes(path)
    url, db = _store_url("sqlite", path, "durability=batched"), Path(f"{path}.db")
    open_store(url).close()
    empty = _sqlite_bytes(db)  # schema pages: a fixed cost, not a per-step one
    store = open_store(url)
    try:
        # The journal's default: a snapshot every 1000 events, the newest 2 kept.
        fill(store, events, batch=1, snapshot_at=0 if variant == "sqlite+snapshots" else None)
    finally:
        store.close()
    return _sqlite_bytes(db) - empty


def storage_figures(workdir: Path, steps: Sequence[int], say: Say) -> list[Figure]:
    figures: list[Figure] = []
    per_step: dict[str, dict[int, float]] = {}
    for s in steps:
        say(f"storage: {s:,} steps")
        events = workload(RUN, 2 + 3 * s)
        canonical = sum(len(encode(e)) for e in events)
        for variant in ("sqlite", "jsonl", "sqlite+snapshots"):
            size = _stored_bytes(variant, workdir, events)
            per_step.setdefault(variant, {})[s] = size / s
            figures.append(figure(f"storage.{variant}.step.{s}", size / s, "B/step",
                                  canonical / s, "canonical JSON of the step's events",
                                  "model_turn + tool_call_started + tool_call_completed"))
            if variant != "sqlite+snapshots":
                figures.append(figure(f"storage.{variant}.event.{s}", size / len(events),
                                      "B/event", canonical / len(events),
                                      "canonical JSON of the event"))
    for variant, by_steps in per_step.items():
        small, large = min(by_steps), max(by_steps)
        note = f"B/step, {large:,} / {small:,} steps; target 0.9-1.1x"
        if variant == "sqlite+snapshots":
            note = f"B/step, {large:,} / {small:,} steps; no target: 2 whole-state snapshots kept"
        figures.append(figure(f"storage_growth.{variant}", by_steps[large] / by_steps[small],
                              "x", note=note))
    return figures


# --- 6. CPU cost with syncing off, and the loop ------------------------------------------------


def _store_round(store: Store, facts: list[Fact], after: int) -> float:
    """Seconds per event to build each envelope and append it alone, as RunJournal does."""
    start = time.perf_counter()
    for seq, fact in enumerate(facts, start=after):
        events = make_events(RUN, seq, 0, [fact])
        store.append(RUN, events, expected_seq=seq, epoch=0)
    return (time.perf_counter() - start) / len(facts)


def _floor_round(write: Write, facts: list[Fact], after: int) -> float:
    """The hand-written floor: a dict envelope, one msgspec encode, one raw write."""
    encoder = msgspec.json.Encoder()
    start = time.perf_counter()
    for seq, (kind, payload) in enumerate(facts, start=after + 1):
        write(seq, encoder.encode({"run_id": RUN, "seq": seq, "type": kind.value,
                                   "ts": datetime.now(UTC), "epoch": 0, "v": SCHEMA_VERSION,
                                   "payload": payload}))
    return (time.perf_counter() - start) / len(facts)


def _cpu_figure(backend: str, store: Store, write: Write,
                floor_name: str, facts: list[Fact], reps: int) -> Figure:
    after, ours, floors = 0, [], []
    for _ in range(reps + 1):  # the first round warms up and is dropped
        ours.append(_store_round(store, facts, after))
        floors.append(_floor_round(write, facts, after))
        after += len(facts)
    return figure(f"cpu_per_event.{backend}", statistics.median(ours[1:]) * 1e6, "µs/event",
                  statistics.median(floors[1:]) * 1e6, floor_name,
                  "make_events + append, one event per call; target ≤ 15 µs")


def cpu_figures(workdir: Path, plan: Plan, say: Say) -> list[Figure]:
    """Syncing off: jsonl never fsyncs; sqlite batched is WAL + synchronous=NORMAL, whose
    floor keeps its per-transaction cost (a raw INSERT+COMMIT alone is ~30 µs here)."""
    facts = list(itertools.islice(_facts(RUN), plan.cpu_events))
    fd = os.open(workdir / "cpu-floor.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    db, write_row = raw_sqlite(workdir / "cpu-floor.db", "NORMAL")

    def write_line(_seq: int, data: bytes) -> None:
        os.write(fd, data + b"\n")

    jsonl = JsonlStore(workdir / "cpu-jsonl", durability=Durability.BATCHED, batch_every=NEVER)
    sqlite = open_store(_store_url("sqlite", workdir / "cpu-sqlite", "durability=batched"))
    try:
        say("CPU per event, syncing off: jsonl, sqlite")
        return [
            _cpu_figure("jsonl", jsonl, write_line, "dict envelope + msgspec encode + os.write",
                        facts, plan.reps),
            _cpu_figure("sqlite", sqlite, write_row,
                        "dict envelope + encode + sqlite3 INSERT+COMMIT (WAL, NORMAL)",
                        facts, plan.reps),
        ]
    finally:
        os.close(fd)
        db.close()
        jsonl.close()
        sqlite.close()


def _lookup_tool() -> Tool:
    @tool(effect="read_only")
    def lookup(order: str) -> dict[str, Any]:
        """Look an order up in the carrier's manifest."""
        return order_result(int(order.removeprefix("ord-")))

    return lookup


def _order_turn(i: int) -> ModelResponse:
    return calls(("lookup", {"order": f"ord-{i:06d}"}), text=TURN_TEXT)


class FixedCostModel:
    """ScriptedModel's turns at a constant cost per turn.

    ScriptedModel estimates usage by summing the length of every message in the
    prompt, so its own cost grows with the run; this model isolates the loop's.
    """

    def __init__(self, steps: int) -> None:
        self.steps = steps

    def complete(self, request: ModelRequest) -> ModelResponse:
        n = request.turn
        if n >= self.steps:
            return reply("all reconciled")
        call = ToolCall(id=f"call_{n}_0", name="lookup", args={"order": f"ord-{n:06d}"})
        return ModelResponse(text=TURN_TEXT, tool_calls=[call])


def _model(kind: str, steps: int) -> Model:
    if kind == "fixed_model":
        return FixedCostModel(steps)
    return ScriptedModel([_order_turn(i) for i in range(steps)] + [reply("all reconciled")])


def _agent_run_us(workdir: Path, kind: str, steps: int, lookup: Tool) -> float:
    agent = Agent(_model(kind, steps), [lookup], snapshot_every=None)
    path = workdir / f"agent-{uuid.uuid4().hex[:8]}"
    store = open_store(_store_url("sqlite", path, "durability=batched"))
    try:
        start = time.perf_counter()
        result = agent.run(store, f"agent-{steps}", TASK)
        elapsed = time.perf_counter() - start
    finally:
        store.close()
    if result.status != "finished":
        raise RuntimeError(f"the benchmark agent stopped {result.status}: {result.pause_reason}")
    return elapsed / steps * 1e6


def agent_figures(workdir: Path, plan: Plan, say: Say) -> list[Figure]:
    """A real Agent, a read-only tool, sqlite batched, snapshots off: µs per step (a model
    turn + a tool call, 3 events), whole run including open and close, median of runs."""
    lookup, figures = _lookup_tool(), []
    small, large = plan.agent_steps
    for kind in ("scripted", "fixed_model"):
        say(f"agent loop: {kind}, {small:,} and {large:,} steps x {plan.agent_reps}")
        us = dict(zip(plan.agent_steps, _medians(plan.agent_reps, [
            partial(_agent_run_us, workdir, kind, steps, lookup) for steps in plan.agent_steps
        ]), strict=True))
        model = "ScriptedModel" if kind == "scripted" else "FixedCostModel (O(1) per turn)"
        figures += [figure(f"agent_step.{kind}.{n}", v, "µs/step", note=model)
                    for n, v in us.items()]
        figures.append(figure(f"agent_step_growth.{kind}", us[large] / us[small], "x",
                              note=f"µs/step, {large:,} / {small:,} steps; target ≤ 1.1x"))
    return figures


# --- the whole run -----------------------------------------------------------------------------


def log_figures(workdir: Path, plan: Plan, say: Say) -> list[Figure]:
    """Replay and recovery over one generated log, freed before the next measurements,
    so its heap is not theirs to scan."""
    say(f"generating {max(plan.sizes):,} events")
    events = workload(RUN, max(plan.sizes))
    return [*replay_figures(events, plan.sizes, plan.reps, say),
            *recovery_figures(workdir, events, plan.sizes, plan.reps, say)]


def _stderr(message: str) -> None:
    click.echo(message, err=True)


def run_bench(*, quick: bool, postgres_url: str | None, workdir: Path,
              progress: Say = _stderr) -> list[Figure]:
    """Measure every figure family; scratch stores go under ``workdir``.

    Postgres is skipped (with a note) when unreachable, except under ``CI=true``,
    where that raises ``RuntimeError``.
    """
    if os.environ.get("CI") == "true" and (problem := postgres_problem(postgres_url)):
        raise RuntimeError(f"CI=true, so Postgres must be measured, but {problem}")
    plan = QUICK if quick else FULL
    workdir.mkdir(parents=True, exist_ok=True)
    return [
        *durable_figures(workdir, postgres_url, plan, progress),
        *log_figures(workdir, plan, progress),
        *storage_figures(workdir, plan.steps, progress),
        *cpu_figures(workdir, plan, progress),
        *agent_figures(workdir, plan, progress),
    ]


def machine() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "sqlite": sqlite3.sqlite_version,
        "msgspec": msgspec.__version__,
    }


# --- output --------------------------------------------------------------------------------


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def print_table(figures: Sequence[Figure]) -> None:
    table = Table(title="agentjournal bench", caption="ratio = value / floor, measured side by "
                  "side: for events/s the fraction of the floor's speed, else floors spent")
    table.add_column("name", overflow="fold")
    for column in ("value", "unit", "floor", "ratio"):
        table.add_column(column, justify="right" if column != "unit" else "left", no_wrap=True)
    table.add_column("note", min_width=24)
    for f in figures:
        ratio = f"{f.ratio:.2f}x" if f.ratio is not None else "-"
        table.add_row(f.name, _num(f.value), f.unit, _num(f.floor), ratio, f.note)
    Console().print(table)


def _series(figures: Sequence[Figure]) -> dict[str, list[tuple[int, float]]]:
    """Duration (ms) against event count: recovery per backend and mode, in-memory replay."""
    out: dict[str, list[tuple[int, float]]] = {}
    for f in figures:
        parts = f.name.split(".")
        if f.value is None or len(parts) < 3 or not parts[-1].isdigit():
            continue
        family, middle, n = parts[0], parts[1:-1], int(parts[-1])
        if family == "recovery":
            label, ms = " ".join(middle).replace("full", "full replay"), f.value
        elif family == "replay" and middle == ["gc_off"]:
            label, ms = "fold in memory (no I/O)", n / f.value * 1e3
        else:
            continue
        out.setdefault(label, []).append((n, ms))
    return out


def _pyplot() -> Any:
    matplotlib = importlib.import_module("matplotlib")
    matplotlib.use("Agg")  # files only: no display needed
    return importlib.import_module("matplotlib.pyplot")


def write_plot(figures: Sequence[Figure], path: Path) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, points in sorted(_series(figures).items()):
        xs, ys = zip(*sorted(points), strict=True)
        ax.plot(xs, ys, marker="o", linestyle="--" if "full" in label else "-", label=label)
    ax.set(xscale="log", yscale="log", xlabel="events in the run", ylabel="ms",
           title="Recovery (open + state ready) against run length")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --- the command ---------------------------------------------------------------------------


def _default_postgres() -> str:
    return os.environ.get("AGENTJOURNAL_TEST_POSTGRES", DEFAULT_POSTGRES)


@contextlib.contextmanager
def _scratch(store_dir: Path | None) -> Iterator[Path]:
    if store_dir is not None:
        store_dir.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix="agentjournal-bench-", dir=store_dir))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _fail(message: str) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(1)


@click.command()
@click.option("--quick", is_flag=True,
              help="Smaller sizes (1k and 10k events, 100 and 1,000 steps): under a minute.")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object on stdout (progress stays on stderr).")
@click.option("--plot", type=click.Path(dir_okay=False, path_type=Path), metavar="FILE",
              help="Also draw recovery time against event count to FILE (PNG; needs matplotlib).")
@click.option("--store-dir", type=click.Path(file_okay=False, path_type=Path), metavar="DIR",
              help="Put scratch stores in a fresh subdirectory of DIR, removed afterwards "
                   "(default: the system temp directory). Pick the disk you will deploy on.")
@click.option("--postgres", "postgres_url", default=_default_postgres, metavar="URL",
              show_default="$AGENTJOURNAL_TEST_POSTGRES or " + DEFAULT_POSTGRES,
              help="Server for the Postgres figures, used in a throwaway bench_<random> "
                   "schema; '' to skip.")
def bench(quick: bool, as_json: bool, plot: Path | None, store_dir: Path | None,
          postgres_url: str) -> None:
    """Measure durability, replay, recovery, storage and CPU cost on this machine.

    Every figure with a physical floor (a raw write + fsync, a raw INSERT +
    COMMIT, a decode-only loop) is measured beside that floor in the same run
    and reported as ratio = value / floor: for times and sizes, floors spent
    (lower is better); for events/s, the fraction of the floor's speed
    (higher is better). Ratios survive a noisy machine; absolute values do not.

    \b
    Examples:
        agentjournal bench --quick
        agentjournal bench --json --plot recovery.png > bench.json
        agentjournal bench --store-dir /mnt/nvme --postgres ''
    """
    if plot is not None:
        try:
            _pyplot()
        except ImportError:
            _fail("--plot needs matplotlib: pip install matplotlib")
    with _scratch(store_dir) as workdir:
        try:
            figures = run_bench(quick=quick, postgres_url=postgres_url or None, workdir=workdir)
        except RuntimeError as exc:
            _fail(str(exc))
    if plot is not None:
        write_plot(figures, plot)
        _stderr(f"plot written to {plot}")
    if as_json:
        doc = {"figures": figures, "machine": machine(), "quick": quick}
        click.echo(msgspec.json.encode(doc).decode())
    else:
        print_table(figures)


if __name__ == "__main__":
    bench()
