"""8. Group commit: many runs appending at once to one shared SQLite store.

100 threads in this process, each its own run, each appending its events one per
``store.append`` (every append durable: WAL + synchronous=FULL), all started together.
Durable events/s is set beside the raw commit rate of one connection measured in the same
run: a store that shares one fsync among concurrent appends passes 1x, one that commits
each append alone cannot. Beside it, the same appends made by one thread with syncing
off: what this machine's CPU allows a store's appends when no sync is waited for and no
thread is woken, a ceiling the hundred threads, syncing, do not pass.
"""

from __future__ import annotations

import statistics
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

from ..events import Event
from ..store import Store, open_store
from ._common import Figure, Plan, Say, figure, medians, store_url, workload
from .appends import raw_sqlite

RUNS = 100
FLOOR_COMMITS = 300
TARGET = 20_000  # durable events/s


def _runs(per_run: int) -> dict[str, list[Event]]:
    return {f"group-{i:03d}": workload(f"group-{i:03d}", per_run) for i in range(RUNS)}


def _append_each(store: Store, run_id: str, events: list[Event],
                 start: threading.Barrier) -> None:
    start.wait()
    for e in events:
        store.append(run_id, [e], expected_seq=e.seq - 1, epoch=0)


def _concurrent_rate(workdir: Path, per_run: int) -> float:
    """Durable events/s of RUNS threads appending to one fresh store."""
    runs = _runs(per_run)
    store = open_store(store_url("sqlite", workdir / f"group-{uuid.uuid4().hex[:8]}"))
    start = threading.Barrier(RUNS + 1)  # the threads exist before the clock starts
    try:
        with ThreadPoolExecutor(max_workers=RUNS) as pool:
            futures = [pool.submit(_append_each, store, run_id, events, start)
                       for run_id, events in runs.items()]
            start.wait()
            began = time.perf_counter()
            for future in futures:
                future.result()  # an append's error is the bench's error
            elapsed = time.perf_counter() - began
    finally:
        store.close()
    return RUNS * per_run / elapsed


def _unsynced_rate(workdir: Path, per_run: int) -> float:
    """Events/s of the same appends made by one thread, run after run in turn, syncing
    off (WAL + synchronous=NORMAL): each append still its own transaction."""
    runs = _runs(per_run)
    store = open_store(store_url("sqlite", workdir / f"group-{uuid.uuid4().hex[:8]}",
                                 "durability=batched"))
    try:
        began = time.perf_counter()
        for i in range(per_run):
            for run_id, events in runs.items():
                store.append(run_id, [events[i]], expected_seq=i, epoch=0)
        elapsed = time.perf_counter() - began
    finally:
        store.close()
    return RUNS * per_run / elapsed


def _commit_rate(workdir: Path) -> float:
    """Raw INSERT+COMMITs per second on one connection, WAL + synchronous=FULL."""
    db, write = raw_sqlite(workdir / f"group-floor-{uuid.uuid4().hex[:8]}.db", "FULL")
    body, times = b"x" * 400, []
    try:
        for seq in range(FLOOR_COMMITS):
            began = time.perf_counter()
            write(seq, body)
            times.append(time.perf_counter() - began)
    finally:
        db.close()
    return 1 / statistics.median(times)


def group_commit_figures(workdir: Path, plan: Plan, say: Say) -> list[Figure]:
    reps = min(plan.reps, 3)
    say(f"group commit: {RUNS} runs x {plan.group_events} appends on one sqlite store, "
        f"x {reps}")
    ours, floor, unsynced = medians(reps, [
        partial(_concurrent_rate, workdir, plan.group_events), partial(_commit_rate, workdir),
        partial(_unsynced_rate, workdir, plan.group_events)])
    return [figure("group_commit.sqlite", ours, "events/s", floor,
                   "sqlite3 INSERT+COMMITs per second, one connection, WAL+FULL",
                   f"{RUNS} threads, a run each, {plan.group_events} one-event appends each, "
                   f"one shared store; target ≥ {TARGET:,} events/s"),
            figure("group_commit_ceiling.sqlite", unsynced, "events/s",
                   note="the same appends from one thread, syncing off (WAL+NORMAL): the "
                   "CPU's ceiling for them, no sync waited for, no thread woken")]
