"""7. The fleet on PostgreSQL: throughput with 1, 2, 4 and 8 worker processes, and
the latency of a claim.

Each round starts N ``agentjournal worker`` processes on a queue of its own, waits
until every one has sent its first heartbeat (process start-up is not timed), then
submits R runs of :func:`bench_agent` and times until all are done: runs/s and
durable events/s. Beside them stands the Postgres commit floor measured in the same
run: raw INSERT+COMMITs per second on one connection, in the same database (for
runs/s, that floor divided by the events of a run). Several workers commit on
several connections, so the ratio may pass 1 as they are added (group commit).

Claim latency: ``queue.claim`` + ``hand_back`` in this process on a pre-filled
queue, p50 and p99, beside two raw commits (a claim and a hand-back are one
transaction each).

Takeover latency: two workers (lease TTL 2 s) hold slow runs, a third stands by, and a
worker holding runs is SIGKILLed, K times. For each run it held: the dead worker's last
heartbeat to the first event its successor appends, p50 and p99, beside the TTL (no
takeover can come before the lease expires). The target: p99 at most TTL + 1 s.
"""

from __future__ import annotations

import contextlib
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ..agent import Agent
from ..models import ScriptedModel, calls, reply
from ..policy import Budget
from ..store import Store, open_store
from ..tools import Tool, tool
from ._common import Figure, Plan, Say, _p99, figure
from .fleet_settings import (
    CONCURRENCY,
    FLOOR_COMMITS,
    ROUND_TIMEOUT,
    STEPS,
    TAKEOVER_NAP,
    TAKEOVER_STEPS,
    TAKEOVER_TTL,
)
from .postgres import drop_schema, in_schema, postgres_problem


@tool(effect="read_only")
def lookup(i: int) -> dict[str, Any]:
    """Look up item `i`."""
    return {"item": i, "status": "ok"}


def _scripted(step: Tool, steps: int) -> Agent:
    """An agent that calls ``step`` once a turn, ``steps`` turns, then replies."""
    script = [*(calls((step.name, {"i": i})) for i in range(steps)), reply("done")]
    return Agent(ScriptedModel(script), [step], snapshot_every=None,
                 budget=Budget(max_turns=steps + 5, max_tool_calls=steps + 5))


def bench_agent() -> Agent:
    """The cheap scripted agent the workers run: ``agentjournal.bench.fleet:bench_agent``."""
    return _scripted(lookup, STEPS)


AGENT_REF = "agentjournal.bench.fleet:bench_agent"


@tool(effect="read_only")
def nap(i: int) -> dict[str, Any]:
    """Take a moment over item `i`."""
    time.sleep(TAKEOVER_NAP)
    return {"item": i, "status": "ok"}


def slow_agent() -> Agent:
    """Runs long enough to be held when a worker is killed: ``...fleet:slow_agent``."""
    return _scripted(nap, TAKEOVER_STEPS)


SLOW_AGENT_REF = "agentjournal.bench.fleet:slow_agent"


@contextlib.contextmanager
def _schema(url: str) -> Iterator[tuple[str, str]]:
    """A throwaway ``bench_fleet_<random>`` schema: (store URL, schema), dropped afterwards."""
    schema = f"bench_fleet_{uuid.uuid4().hex[:12]}"
    try:
        yield in_schema(url, schema), schema
    finally:
        drop_schema(url, schema)


def commit_floor(url: str, schema: str, n: int) -> list[float]:
    """Seconds per raw INSERT+COMMIT of a ~200-byte row on one connection."""
    import psycopg
    from psycopg import sql

    name = sql.Identifier(schema)
    times = []
    with psycopg.connect(url) as conn:
        conn.execute(sql.SQL("CREATE TABLE {}.floor (seq bigint PRIMARY KEY, body bytea NOT NULL)")
                     .format(name))
        conn.commit()
        insert = sql.SQL("INSERT INTO {}.floor VALUES (%s, %s)").format(name)
        body = b"x" * 200
        for seq in range(n):
            start = time.perf_counter()
            conn.execute(insert, (seq, body))
            conn.commit()
            times.append(time.perf_counter() - start)
    return times


def _env() -> dict[str, str]:
    # The workers import this package (and this agent) even when it is not installed.
    src = str(Path(__file__).resolve().parents[2])
    env = {k: v for k, v in os.environ.items() if k != "AGENTJOURNAL_STORE"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    return env


def _wait(what: str, check: Any, timeout: float, procs: Sequence[subprocess.Popen[bytes]],
          logs: Sequence[Path]) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        dead = [p for p in procs if p.poll() is not None]
        if dead or time.monotonic() > deadline:
            tail = "\n".join(log.read_text(errors="replace")[-2000:] for log in logs)
            raise RuntimeError(f"fleet bench: timed out waiting for {what}\n{tail}")
        time.sleep(0.05)


def _worker(url: str, queue: str, log: Path, ttl: float,
            agent: str) -> subprocess.Popen[bytes]:
    """A worker process draining ``queue``, trusting only ``agent``."""
    with open(log, "wb") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "agentjournal", "worker", "--store", url, "--agents", agent,
             "--queue", queue, "--concurrency", str(CONCURRENCY), "--poll", "0.05",
             "--ttl", str(ttl), "--grace", "5",
             # The takeover bench kills whoever holds runs, so a run may be killed with
             # its holder many times: what is timed is its takeover, not its parking.
             "--max-crashes", "1000"],
            env=_env(), stdout=subprocess.DEVNULL, stderr=err)


def fleet_round(store: Store, url: str, workdir: Path, workers: int,
                runs: int) -> tuple[float, int]:
    """(seconds from the first submit until every run is done, events recorded)."""
    from ..fleet import queue_of, submit

    queue, name = queue_of(store), f"w{workers}"
    logs = [workdir / f"fleet-{name}-{i}.log" for i in range(workers)]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs += [_worker(url, name, log, 30, AGENT_REF) for log in logs]
        pids = {p.pid for p in procs}
        _wait("the workers' first heartbeats",
              lambda: pids <= {w.pid for w in queue.workers()}, 60, procs, logs)
        ids = [f"{name}-{i:04d}" for i in range(runs)]
        start = time.perf_counter()
        for run_id in ids:
            submit(store, AGENT_REF, "bench", run_id, queue=name)

        def done() -> bool:
            return sum(r.state == "done" for r in queue.runs() if r.queue == name) == runs

        _wait(f"{runs} runs on {workers} worker(s)", done, ROUND_TIMEOUT, procs, logs)
        elapsed = time.perf_counter() - start
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=15)
        return elapsed, sum(store.last_seq(run_id) for run_id in ids)
    finally:
        _kill_all(procs)
        queue.close()


def _kill_all(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    """Kill the workers still alive (a round that failed part-way leaves some)."""
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _first_event_after(store: Store, run_id: str, moment: float) -> float | None:
    """The timestamp of the run's first event written after ``moment``, if any."""
    return next((e.ts.timestamp() for e in store.read(run_id) if e.ts.timestamp() > moment),
                None)


def _takeovers_of(store: Store, victim: int, killed_at: float,
                  procs: Sequence[subprocess.Popen[bytes]], logs: Sequence[Path]) -> list[float]:
    """Per run the killed worker held: its last heartbeat to its successor's first event.
    A run it had finished but not yet handed back gets no new event: it is left out."""
    from ..fleet import queue_of

    queue = queue_of(store)
    try:
        dead = next((w for w in queue.workers() if w.pid == victim), None)
        if dead is None:  # its row is gone: nothing to measure from
            return []
        latencies = []
        for run_id in dead.runs:
            def settled(run_id: str = run_id) -> bool:
                done = any(r.run_id == run_id and r.state == "done" for r in queue.runs())
                return done or _first_event_after(store, run_id, killed_at) is not None

            _wait(f"a successor to take {run_id} over", settled, ROUND_TIMEOUT, procs, logs)
            if (first := _first_event_after(store, run_id, killed_at)) is not None:
                latencies.append(first - dead.heartbeat_at)
        return latencies
    finally:
        queue.close()


def takeover_times(store: Store, url: str, workdir: Path, kills: int) -> list[float]:
    """Seconds from a SIGKILLed worker's last heartbeat to its successor's first event,
    one per run it held, over ``kills`` rounds. In each, on a queue of its own, two
    workers fill their slots with slow runs (nothing more is queued), a third stands by
    with free slots, and a worker holding runs is killed: the standby takes them over.
    (Behind a backlog, a successor's slots fill with queued runs before the dead
    worker's leases expire, and what is timed is the wait for a free slot.)"""
    from ..fleet import queue_of, submit

    queue = queue_of(store)
    logs: list[Path] = []
    procs: list[subprocess.Popen[bytes]] = []

    def start(name: str) -> subprocess.Popen[bytes]:
        logs.append(workdir / f"takeover-{len(logs)}.log")
        procs.append(_worker(url, name, logs[-1], TAKEOVER_TTL, SLOW_AGENT_REF))
        return procs[-1]

    def holding(pids: set[int]) -> int:
        return sum(len(w.runs) for w in queue.workers() if w.pid in pids)

    def round_(name: str) -> list[float]:
        mine = [start(name), start(name)]
        pair = {p.pid for p in mine}
        for i in range(2 * CONCURRENCY):
            submit(store, SLOW_AGENT_REF, "bench", f"{name}-{i:02d}", queue=name)
        _wait("two workers holding every run", lambda: holding(pair) == 2 * CONCURRENCY,
              ROUND_TIMEOUT, mine, logs)
        mine.append(standby := start(name))
        _wait("the standby's first heartbeat", lambda: standby.pid in {
            w.pid for w in queue.workers()}, ROUND_TIMEOUT, mine, logs)
        victim = mine[0]
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        killed_at = time.time()  # the dead append nothing: later events are a successor's
        return _takeovers_of(store, victim.pid, killed_at, mine[1:], logs)

    try:
        latencies: list[float] = []
        for k in range(kills):
            latencies += round_(f"takeover-{k}")
            _kill_all(procs)  # the round's runs stay on its own queue
        return latencies
    finally:
        _kill_all(procs)
        queue.close()


def claim_times(store: Store, n: int) -> list[float]:
    """Seconds per claim + hand_back, in this process, on a queue holding ``n`` runs."""
    from ..fleet import queue_of

    queue = queue_of(store)
    try:
        for i in range(n):
            queue.submit(f"claim-{i:05d}", AGENT_REF, "bench", queue="claims")
        times = []
        for _ in range(n):
            start = time.perf_counter()
            claim = queue.claim("bench:claims", 30.0, ["claims"])
            assert claim is not None
            queue.hand_back(claim.lease, "done", 0)
            times.append(time.perf_counter() - start)
        return times
    finally:
        queue.close()


def _skipped(reason: str, workers: Sequence[int]) -> list[Figure]:
    note = f"skipped: {reason}"
    return [*(f for n in workers for f in (
                figure(f"fleet.runs_per_s.{n}", None, "runs/s", note=note),
                figure(f"fleet.events_per_s.{n}", None, "events/s", note=note))),
            figure("claim.p50", None, "ms", note=note),
            figure("claim.p99", None, "ms", note=note),
            figure("takeover.p50", None, "s", note=note),
            figure("takeover.p99", None, "s", note=note)]


def fleet_figures(workdir: Path, postgres_url: str | None, plan: Plan, say: Say) -> list[Figure]:
    workers, runs = plan.fleet_workers, plan.fleet_runs
    if (problem := postgres_problem(postgres_url)) or not postgres_url:
        return _skipped(problem or "no Postgres URL given", workers)
    figures: list[Figure] = []
    floor_name = "psycopg INSERT+COMMIT, one connection"
    with _schema(postgres_url) as (url, schema), contextlib.closing(open_store(url)) as store:
        say(f"fleet: Postgres commit floor, {FLOOR_COMMITS} commits")
        floor = commit_floor(postgres_url, schema, FLOOR_COMMITS)
        commits_per_s = 1 / statistics.median(floor)
        for n in workers:
            say(f"fleet: {runs} runs on {n} worker process(es)")
            elapsed, events = fleet_round(store, url, workdir, n, runs)
            per_run = events / runs
            note = (f"{runs} runs of {per_run:.0f} events, {n} x concurrency {CONCURRENCY};"
                    " floor: commits/s / events per run")
            figures += [
                figure(f"fleet.runs_per_s.{n}", runs / elapsed, "runs/s",
                       commits_per_s / per_run, f"{floor_name}, per run's events", note),
                figure(f"fleet.events_per_s.{n}", events / elapsed, "events/s", commits_per_s,
                       floor_name, f"durable events of {n} worker process(es)"),
            ]
        claims = plan.fleet_claims
        say(f"fleet: claim + hand_back latency, {claims} claims")
        times = claim_times(store, claims)
        ms, two = 1e3, 2 * statistics.median(floor) * 1e3
        two_name = f"2 x ({floor_name})"
        note = f"claim + hand_back in-process, {claims} queued runs"
        figures += [figure("claim.p50", statistics.median(times) * ms, "ms", two, two_name,
                           note),
                    figure("claim.p99", _p99(times) * ms, "ms", 2 * _p99(floor) * ms,
                           f"2 x p99 ({floor_name})", note)]
        kills = plan.takeover_kills
        say(f"fleet: takeover after a SIGKILL, {kills} kills, lease TTL {TAKEOVER_TTL:g} s")
        figures += takeover_figures(takeover_times(store, url, workdir, kills), kills)
    return figures


def takeover_figures(latencies: Sequence[float], kills: int) -> list[Figure]:
    """Takeover p50 and p99 beside the lease TTL, the floor no takeover can beat."""
    note = f"{len(latencies)} runs held by {kills} SIGKILLed workers; target p99 ≤ TTL + 1 s"
    floor_name = "the lease TTL"
    if not latencies:
        return [figure(f"takeover.{p}", None, "s", note="skipped: no killed worker held a run")
                for p in ("p50", "p99")]
    return [figure("takeover.p50", statistics.median(latencies), "s", TAKEOVER_TTL, floor_name,
                   note),
            figure("takeover.p99", _p99(latencies), "s", TAKEOVER_TTL, floor_name, note)]

