"""1. Durable appends per backend against a raw write + sync."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import statistics
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

from ..events import Event, encode
from ..store import Store, open_store
from ._common import (
    RUN,
    Figure,
    Plan,
    Say,
    Write,
    _p99,
    append_one_by_one,
    figure,
    store_url,
    workload,
)
from .postgres import drop_schema, in_schema, postgres_problem

# --- 1. durable appends ------------------------------------------------------------------


class Target(NamedTuple):
    """A store under test and the raw durable write it is measured against."""

    backend: str
    store: Store
    floor: Write  # the raw durable write
    floor_name: str
    frame: Callable[[bytes], bytes] = bytes  # the bytes the store writes for one body


def _jsonl_frame(body: bytes) -> bytes:
    # The store's framing of a one-record batch: crc over the end mark and the body.
    return b"%08x .%s\n" % (zlib.crc32(body, zlib.crc32(b".")), body)


@contextlib.contextmanager
def jsonl_target(workdir: Path) -> Iterator[Target]:
    store = open_store(store_url("jsonl", workdir / "append-jsonl"))
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
    store = open_store(store_url("sqlite", workdir / "append-sqlite"))
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
        cleanup.callback(drop_schema, url, schema)
        store = open_store(in_schema(url, schema))
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


class AppendTimes(NamedTuple):
    single: list[float]  # one event per append
    pairs: list[float]  # tool_call_started + tool_call_completed, two appends
    floor: list[float]  # one raw durable write


def time_appends(t: Target, events: list[Event]) -> AppendTimes:
    """Store appends and floor writes interleaved step by step, so drift hits both alike."""
    framed = [t.frame(encode(e)) for e in events]
    for e in events[:2]:  # warm-up: creates files, tables and cached statements
        append_one_by_one(t.store, [e])
        t.floor(e.seq, framed[e.seq - 1])
    out = AppendTimes([], [], [])
    for i in range(2, len(events) - 2, 3):
        turn, started, done = events[i:i + 3]
        a = time.perf_counter()
        append_one_by_one(t.store, [turn])
        b = time.perf_counter()
        append_one_by_one(t.store, [started])
        c = time.perf_counter()
        append_one_by_one(t.store, [done])
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


