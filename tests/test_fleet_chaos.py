"""Chaos on a fleet of real worker processes on PostgreSQL.

Worker processes (``agentjournal worker``) drain runs of a ledger agent
(tests/chaos_agents.py) whose corrections go to ONE LedgerService process. For a
bounded time a chaos loop SIGKILLs random workers (starting replacements), SIGSTOPs
another past its TTL and SIGCONTs it, and restarts the PostgreSQL server once: a
throwaway cluster of the test's own (tests/pg_cluster.py), never the machine's server.
Afterwards effects are judged by the ledger's own counts, never the library's view:
every run finished or waits for a person with a reason; every correction applied
exactly once; every log contiguous, its epochs never decreasing (a woken worker that
lost its lease appended nothing); every snapshot the writers took equal to a fresh
fold. The takeover latency of each SIGKILL (the killed worker's last heartbeat to
its successor's first event) is printed, not bounded: on a loaded machine it says more
about the load than the fleet. `agentjournal bench` measures it (takeover.p99) against
its target, TTL + 1 s.

CI size: 6 workers, 40 runs, 20 s of chaos; ``--slow``: 16 workers, 200 runs, 60 s.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from typing import Any, TypeVar

import pytest

from agentjournal import open_store
from agentjournal.demo.ledger import LedgerService
from agentjournal.fleet import queue_of, submit
from agentjournal.snapshots import load_state, verify

from .chaos_agents import DELAY_ENV, SNAPSHOT_ENV, URL_ENV, correction_ids
from .conftest import POSTGRES_URL
from .pg_cluster import ThrowawayCluster

ROOT = Path(__file__).resolve().parent.parent
AGENT = "tests.chaos_agents:ledger_agent"
TTL, GRACE, CONCURRENCY, POLL = 2.0, 5.0, 8, 0.2
STOP_FOR = 3.0  # a SIGSTOP lasts past the TTL
EXIT_MARGIN = 60.0  # a hang guard: a SIGTERMed worker exits 0 after at most GRACE
T = TypeVar("T")


@dataclass(frozen=True)
class Size:
    workers: int
    runs: int
    chaos: float  # seconds of chaos at most (it ends early once every run is done)
    finish: float  # a hang guard: seconds after the chaos for the fleet to finish
    delay: float  # seconds per model turn


CI_SIZE = Size(workers=6, runs=40, chaos=20.0, finish=300.0, delay=0.8)
SLOW_SIZE = Size(workers=16, runs=200, chaos=60.0, finish=600.0, delay=0.8)


@dataclass
class Kill:
    pid: int
    at: float  # wall clock once it is dead: any later event is another worker's
    heartbeat_at: float | None = None  # the killed worker's last heartbeat
    held: list[str] = field(default_factory=list)  # the runs it held, as of that beat


class Fleet:
    def __init__(self, url: str, tmp: Path, ledger_url: str, delay: float) -> None:
        self.url, self.tmp = url, tmp
        self.env = {**os.environ, URL_ENV: ledger_url, DELAY_ENV: str(delay),
                    SNAPSHOT_ENV: "3", "PYTHONUNBUFFERED": "1"}
        self.env.pop("AGENTJOURNAL_STORE", None)
        self.procs: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start(self) -> subprocess.Popen[bytes]:
        log = self.tmp / f"worker-{len(self.procs)}.log"
        with open(log, "wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "agentjournal", "worker", "--store", self.url,
                 "--agents", AGENT, "--import-path", str(ROOT),
                 "--concurrency", str(CONCURRENCY), "--ttl", str(TTL), "--poll", str(POLL),
                 "--grace", str(GRACE)], cwd=ROOT, env=self.env, stdout=subprocess.DEVNULL,
                stderr=err)
        self.procs.append((proc, log))
        return proc

    def alive(self) -> list[subprocess.Popen[bytes]]:
        return [p for p, _ in self.procs if p.poll() is None]

    def wait_started(self, timeout: float = 120.0) -> None:
        """Wait until every live worker has its SIGTERM handler (it logs "started"):
        a worker signalled while still importing dies by the signal, holding nothing."""
        deadline = time.monotonic() + timeout
        for proc, log in self.procs:
            while (proc.poll() is None and b"started:" not in log.read_bytes()
                   and time.monotonic() < deadline):
                time.sleep(0.05)

    def logs(self, tail: int = 4000) -> str:
        return "\n".join(f"--- {log.name} (pid {p.pid}, rc {p.poll()})\n"
                         f"{log.read_text(errors='replace')[-tail:]}" for p, log in self.procs)

    def kill_all(self) -> None:
        for proc, _ in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
                proc.wait()

    def query(self, fn: Callable[[Any], T], timeout: float = 120.0) -> T:
        """``fn(store)`` on a fresh handle, retried while the server is away."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                with open_store(self.url) as store:
                    return fn(store)
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)


def system_server_started() -> datetime | None:
    """When the machine's own PostgreSQL server (POSTGRES_URL) started; None if not up."""
    try:
        import psycopg

        with psycopg.connect(POSTGRES_URL, connect_timeout=10) as conn:
            row = conn.execute("SELECT pg_postmaster_start_time()").fetchone()
    except Exception:  # no server here: nothing of it to leave alone
        return None
    return row[0] if row else None


def unfinished(store: Any) -> int:
    return sum(r.state in ("queued", "running") for r in queue_of(store).runs())


def chaos(fleet: Fleet, size: Size, cluster: ThrowawayCluster, rng: random.Random,
          kills: list[Kill]) -> dict[str, Any]:
    """The chaos loop; returns what it did."""
    did: dict[str, Any] = {"kills": 0, "stops": 0, "pg_restart": None, "paused": set()}
    start = time.monotonic()
    next_kill = start + rng.uniform(1.0, 2.0)
    next_stop = start + rng.uniform(1.5, 3.0)
    restart_at: float | None = start + size.chaos / 4
    stopped: tuple[subprocess.Popen[bytes], float] | None = None
    next_check = start
    while time.monotonic() < start + size.chaos:
        now = time.monotonic()
        if now >= next_check:
            next_check = now + 0.5
            if fleet.query(unfinished) == 0:
                break
        if stopped is not None and now >= stopped[1]:
            stopped[0].send_signal(signal.SIGCONT)
            stopped = None
        if now >= next_kill:
            candidates = [p for p in fleet.alive() if stopped is None or p is not stopped[0]]
            victim = rng.choice(candidates)
            victim.kill()
            victim.wait()
            kill = Kill(victim.pid, time.time())
            fleet.start()
            kills.append(kill)
            did["kills"] += 1
            next_kill = time.monotonic() + rng.uniform(1.0, 2.0)
        if stopped is None and now >= next_stop:
            candidates = [p for p in fleet.alive()]
            sleeper = rng.choice(candidates)
            sleeper.send_signal(signal.SIGSTOP)
            stopped = (sleeper, time.monotonic() + STOP_FOR)
            did["stops"] += 1
            did["paused"].add(sleeper.pid)
            next_stop = time.monotonic() + STOP_FOR + rng.uniform(1.0, 3.0)
        if restart_at is not None and now >= restart_at:
            down = time.time()
            cluster.restart()
            did["pg_restart"] = (down, time.time())
            restart_at = None
        time.sleep(0.05)
    if stopped is not None:
        stopped[0].send_signal(signal.SIGCONT)
    did["seconds"] = time.monotonic() - start
    return did


#: How long no run may be queued or running before the fleet counts as settled: a worker
#: woken from SIGSTOP takes back its stop at its next beat, withdrawing a park that counted
#: it (the run is queued again), so a moment with every run done or parked is not the end.
SETTLED = 2 * TTL + 1.0


def wait_settled(fleet: Fleet, within: float) -> None:
    """Until no run has been queued or running for SETTLED seconds, or ``within`` passed."""
    deadline = time.monotonic() + within
    quiet_since: float | None = None
    while time.monotonic() < deadline:
        now = time.monotonic()
        if fleet.query(unfinished):
            quiet_since = None
        elif quiet_since is None:
            quiet_since = now
        elif now - quiet_since >= SETTLED:
            return
        time.sleep(0.25)


def settle_kills(fleet: Fleet, kills: list[Kill]) -> None:
    """Each kill's last heartbeat and the runs it held, from the rows it left."""
    def read(store: Any) -> None:
        queue = queue_of(store)
        workers = {w.pid: w for w in queue.workers()}
        for kill in kills:
            info = workers.get(kill.pid)
            if info is not None:
                kill.heartbeat_at = info.heartbeat_at
                kill.held = list(info.runs)
    fleet.query(read)


def p99(xs: list[float]) -> float:
    ordered = sorted(xs)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def p50(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


@pytest.fixture
def size(request: pytest.FixtureRequest) -> Size:
    return SLOW_SIZE if request.config.getoption("--slow") else CI_SIZE


@pytest.mark.timeout(1800)  # a hang guard for the whole fleet, sized for a loaded machine
def test_fleet_survives_kills_stops_and_a_postgres_restart(
    own_postgres: ThrowawayCluster, tmp_path: Path, size: Size
) -> None:
    rng = random.Random(int(os.environ.get("CHAOS_SEED", str(time.time_ns()))))
    pg_url = f"{own_postgres.url}?schema=chaos"
    system_started = system_server_started()
    started = time.monotonic()
    kills: list[Kill] = []
    with LedgerService(tmp_path / "ledger.db", latency_ms=5) as ledger:
        fleet = Fleet(pg_url, tmp_path, ledger.url, size.delay)
        try:
            with open_store(pg_url) as store:
                runs = [submit(store, AGENT, f"chaos run {i}", f"chaos-{i:03d}")
                        for i in range(size.runs)]
            for _ in range(size.workers):
                fleet.start()
            did = chaos(fleet, size, own_postgres, rng, kills)
            wait_settled(fleet, size.finish)
            left = fleet.query(unfinished)
            assert left == 0, f"{left} runs unfinished after the deadline\n{fleet.logs()}"
            fleet.wait_started()
            stopping = time.monotonic()
            workers = fleet.alive()
            for proc in workers:
                proc.send_signal(signal.SIGTERM)
            codes = [proc.wait(timeout=GRACE + EXIT_MARGIN) for proc in workers]
            assert codes == [0] * len(workers), fleet.logs()
            drained = time.monotonic() - stopping
            settle_kills(fleet, kills)
            effects = ledger.effects()
            judge(fleet, runs, effects, kills, did, drained, time.monotonic() - started)
        finally:
            fleet.kill_all()
    assert system_server_started() == system_started  # the machine's server was left alone


def judge(fleet: Fleet, runs: list[str], effects: dict[str, Any], kills: list[Kill],
          did: dict[str, Any], drained: float, wall: float) -> None:
    with open_store(fleet.url) as store:
        rows = {r.run_id: r for r in queue_of(store).runs()}
        states = {run: r.state for run, r in rows.items()}
        logs = {run: list(store.read(run)) for run in runs}
        finished, snapshots, waiting = 0, 0, []
        for run in runs:
            state = load_state(store, run).state
            if states[run] == "done":
                assert state.status == "finished", (run, state.status)
                finished += 1
            else:  # waits for a person, with a reason
                assert states[run] in ("waiting", "parked"), (run, states[run])
                reason = state.pause_reason or (state.escalation or {}).get("reason")
                assert state.status in ("paused", "escalated", "waiting_approval") and reason, (
                    run, state.status, state.pause_reason, state.escalation)
                waiting.append(f"{run} {states[run]}: {reason[:60]}")
            report = verify(store, run)
            assert report.ok, (run, report)
            snapshots += report.snapshots_checked
    # Effects, by the ledger's own counts: each correction once (a run that waits for
    # a person may not have posted them all), nothing else.
    expected = {cid: run for run in runs for cid in correction_ids(run)}
    counts = effects["corrections"]
    assert set(counts) <= set(expected), set(counts) - set(expected)
    assert all(n == 1 for n in counts.values()), {c: n for c, n in counts.items() if n != 1}
    for run in runs:
        if states[run] == "done":
            assert all(counts.get(cid) == 1 for cid in correction_ids(run)), run
    assert snapshots > 0, "no snapshot was verified"
    for run, log in logs.items():
        assert [e.seq for e in log] == list(range(1, len(log) + 1)), run
        epochs = [e.epoch for e in log]
        stale = [(e.seq, e.epoch) for a, e in pairwise(log) if e.epoch < a.epoch]
        assert not stale, (run, "an append after a lost lease", stale, epochs)
    judge_stops(rows, kills, did["paused"])
    latencies, excluded = takeover_latencies(logs, kills, did.get("pg_restart"))
    print(f"\nchaos: {did['kills']} SIGKILLs, {did['stops']} SIGSTOPs, PG restart "
          f"{'yes' if did['pg_restart'] else 'no'}, chaos {did['seconds']:.1f}s; "
          f"{finished} finished, {len(waiting)} waiting for a person {waiting}; "
          f"{len(counts)} corrections applied once; {snapshots} snapshots verified; "
          f"ledger fenced {effects['fenced']} stale request(s), replayed {effects['replays']}; "
          f"drain {drained:.1f}s; wall {wall:.1f}s")
    if did.get("pg_restart"):
        down, up = did["pg_restart"]
        print(f"PG restart took {up - down:.1f}s")
    print(f"{len(excluded)} takeover(s) overlapping the restart or chained (the successor "
          f"disrupted too) left out of the p99: {[round(x, 2) for x in sorted(excluded)]}")
    if latencies:
        print(f"takeover latency over {len(latencies)} runs of {len(kills)} kills: "
              f"p50 {p50(latencies):.2f}s p99 {p99(latencies):.2f}s max {max(latencies):.2f}s "
              f"(TTL {TTL:g}s)")
    else:
        print("no killed worker held a run that a successor continued")


def judge_stops(rows: dict[str, Any], kills: list[Kill], paused: set[int]) -> None:
    """A run parked as poison names each stop it counts, and none of them is a worker
    that was only paused (SIGSTOP, then SIGCONT) and never killed: woken, fenced, it
    took its stop back (withdrawing a park that had counted it)."""
    alive = paused - {kill.pid for kill in kills}
    for run, row in rows.items():
        if row.state != "parked":
            continue
        assert len(row.stops) == row.crashes, (run, row.crashes, row.reason)
        pids = {int(stop.split(": worker ")[1].split(":")[1]) for stop in row.stops}
        assert not pids & alive, (run, "a paused worker's stop counted", row.reason)


def takeover_latencies(logs: dict[str, list[Any]], kills: list[Kill],
                       pg_restart: tuple[float, float] | None) -> tuple[list[float], list[float]]:
    """For each run a killed worker held: its successor's first event (the first event
    after the kill: the dead worker appends nothing) minus the dead worker's last
    heartbeat. Returned apart: takeovers whose window overlaps the PostgreSQL restart
    (no worker can claim while the server is away), and chained ones (the successor
    was killed or stopped too, before its first append)."""
    latencies, excluded = [], []
    for kill in kills:
        if kill.heartbeat_at is None:
            continue
        for run in kill.held:
            log = logs.get(run, ())
            after = [e for e in log if e.ts.timestamp() > kill.at]
            if not after:
                continue  # it finished before the kill; the hand-back had not landed
            before = [e for e in log if e.ts.timestamp() <= kill.at]
            latency = after[0].ts.timestamp() - kill.heartbeat_at
            window = (kill.heartbeat_at, after[0].ts.timestamp())
            overlaps = bool(pg_restart) and window[0] <= pg_restart[1] + 1.0 and (
                window[1] >= pg_restart[0])
            # A successor that was itself killed or stopped before its first append
            # leaves the run to a third worker: two takeovers, not one.
            chained = bool(before) and after[0].epoch > before[-1].epoch + 1
            (excluded if overlaps or chained else latencies).append(latency)
    return latencies, excluded
