"""11. Density: many runs held by one process, on one event loop, sharing one store.

An agent run waits on its model almost all its life, so one process should hold
hundreds of them, as an async server holds connections. N runs (``Agent.arun``), each
of ``turns`` turns, each turn an async model that answers after ``latency`` seconds
asking for one read-only async tool call, all started together on one loop sharing one
store. The ideal wall time is ``turns * latency`` (the models' waits alone, the
final answer's turn included); the figure is wall / ideal, beside LangGraph's async
savers running the same workload in the same run (``durability="sync"``; the
``peers`` extra). On PostgreSQL the commits are counted by the server in the
bench's own database (``pg_stat_database.xact_commit`` of a database created for it),
per step (a model turn and its tool call). Resident memory per held run is the
process's growth while the runs are held, over N; each measurement runs in a fresh
process.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import multiprocessing
import resource
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..agent import Agent
from ..models import ModelRequest, ModelResponse, reply
from ..policy import Budget
from ..state import ToolCall
from ..store import Store, open_store
from ..tools import Tool, tool
from ._common import Figure, Plan, Say, figure, store_url
from .peers import Conversation, wired

TURN_TEXT = "Looking the order up."


class SlowAsyncModel:
    """An async model that answers each turn after ``latency`` seconds: a tool call for
    turns before ``turns - 1``, then the final answer (so a run makes ``turns`` model
    calls and ``turns - 1`` tool calls)."""

    def __init__(self, latency: float, turns: int) -> None:
        self.latency, self.turns = latency, turns

    async def acomplete(self, request: ModelRequest) -> ModelResponse:
        await asyncio.sleep(self.latency)
        n = request.turn
        if n >= self.turns - 1:
            return reply("all reconciled")
        call = ToolCall(id=f"call_{n}_0", name="lookup", args={"order": f"ord-{n:06d}"})
        return ModelResponse(text=TURN_TEXT, tool_calls=[call])


def async_lookup() -> Tool:
    @tool(effect="read_only")
    async def lookup(order: str) -> dict[str, Any]:
        """Look an order up in the carrier's manifest."""
        return {"order": order, "status": "delivered"}

    return lookup


def density_agent(latency: float, turns: int) -> Agent:
    model = SlowAsyncModel(latency, turns)  # an AsyncModel: arun only
    return Agent(model, [async_lookup()], budget=Budget.unlimited())  # type: ignore[arg-type]


async def run_many(agent: Agent, store: Store, n: int, prefix: str,
                   while_running: Callable[[], Awaitable[None]] | None = None) -> list[str]:
    """Run ``n`` runs of ``agent`` at once on this loop; their statuses. ``while_running``
    (a coroutine function) runs beside them and is cancelled when they are done."""
    beside = asyncio.ensure_future(while_running()) if while_running is not None else None
    try:
        results = await asyncio.gather(*(agent.arun(store, f"{prefix}-{i:05d}", "reconcile")
                                         for i in range(n)))
    finally:
        if beside is not None:
            beside.cancel()
    return [r.status for r in results]


def _rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize() / 2**20


@dataclass
class Measured:
    wall: float
    rss_growth_mb: float
    commits: int | None = None
    cpu: float = 0.0  # the process's CPU seconds (user + system) while the runs ran
    late: float = 0.0  # the loop's worst wake lateness while the runs ran (s)
    idle_late: float = 0.0  # ... and on the same loop with nothing else to do


#: How often the lateness probe asks to wake, and how long it probes an idle loop.
PROBE_EVERY, IDLE_PROBE = 0.010, 1.0


def _queued() -> float:
    """Seconds this thread has waited for a CPU (Linux schedstat; 0 where there is none):
    the machine's other work, not the loop being blocked."""
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/schedstat") as stat:
            return int(stat.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


async def _probe(lateness: list[float]) -> None:
    """Wake every PROBE_EVERY and record how late each wake was (less the time the
    thread waited for a CPU meanwhile): what a loop blocked by a store call shows."""
    loop = asyncio.get_running_loop()
    while True:
        due, queued = loop.time() + PROBE_EVERY, _queued()
        await asyncio.sleep(PROBE_EVERY)
        lateness.append(loop.time() - due - (_queued() - queued))


async def _idle_lateness() -> float:
    lateness: list[float] = []
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(_probe(lateness), IDLE_PROBE)
    return max(lateness, default=0.0)


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _ours(url: str, n: int, latency: float, turns: int,
          commits: Callable[[], int] | None) -> Measured:
    store = open_store(url)
    agent = density_agent(latency, turns)
    try:
        gc.collect()
        before, peak = _rss_mb(), [0.0]

        lateness: list[float] = []

        async def sample() -> None:
            probe = asyncio.ensure_future(_probe(lateness))
            try:
                while True:
                    peak[0] = max(peak[0], _rss_mb())
                    await asyncio.sleep(latency / 2)
            finally:
                probe.cancel()

        idle = asyncio.run(_idle_lateness())
        committed = commits() if commits else None
        began, cpu = time.perf_counter(), _cpu()
        statuses = asyncio.run(run_many(agent, store, n, f"d{uuid.uuid4().hex[:6]}", sample))
        wall, cpu = time.perf_counter() - began, _cpu() - cpu
        if set(statuses) != {"finished"}:
            raise RuntimeError(f"density runs ended {sorted(set(statuses))}")
        spent = commits() - committed if commits and committed is not None else None
        return Measured(wall, max(0.0, peak[0] - before), spent, cpu,
                        max(lateness, default=0.0), idle)
    finally:
        store.close()


# --- PostgreSQL: a database of the bench's own, so its commits are ours alone -------------


def _admin_url(url: str) -> str:
    return url.split("?")[0]


def _own_database(url: str) -> tuple[str, str]:
    """(a URL to a fresh database of the bench's own, its name)."""
    import psycopg

    name = f"aj_density_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(_admin_url(url), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = _admin_url(url).rsplit("/", 1)[0]
    return f"{base}/{name}", name


def _drop_database(url: str, name: str) -> None:
    import psycopg

    with psycopg.connect(_admin_url(url), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _commit_counter(url: str, name: str) -> Callable[[], int]:
    """The server's count of commits in database ``name`` (stats flushed first)."""
    import psycopg

    def count() -> int:
        time.sleep(1.1)  # backends flush their counters at most once a second
        with psycopg.connect(_admin_url(url), autocommit=True) as conn:
            conn.execute("SELECT pg_stat_clear_snapshot()")
            (row,) = conn.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = %s",
                                  (name,)).fetchall()
        return int(row[0])

    return count


def measure(backend: str, workdir: Path, n: int, latency: float, turns: int,
            postgres_url: str | None) -> Measured:
    if backend == "sqlite":
        return _ours(store_url("sqlite", workdir / f"density-{uuid.uuid4().hex[:8]}"), n,
                     latency, turns, None)
    assert postgres_url is not None
    url, name = _own_database(postgres_url)
    try:
        return _ours(f"{url}?schema=density", n, latency, turns, _commit_counter(url, name))
    finally:
        _drop_database(postgres_url, name)


# --- LangGraph's async savers on the same workload ------------------------------------------


def _async_graph(latency: float, turns: int) -> Any:
    """Model node (an async wait of ``latency``) -> tool node -> model ... for ``turns``
    model turns, each message appended to a messages list."""
    async def model(state: Conversation) -> dict[str, Any]:
        await asyncio.sleep(latency)
        n = (len(state["messages"]) - 1) // 2  # the task, then 2 messages per turn
        if n >= turns - 1:
            return {"messages": [{"role": "assistant", "content": "all reconciled"}]}
        call = {"id": f"call_{n}_0", "name": "lookup", "args": {"order": f"ord-{n:06d}"}}
        return {"messages": [{"role": "assistant", "content": TURN_TEXT, "tool_calls": [call]}]}

    async def tools(state: Conversation) -> dict[str, Any]:
        call = state["messages"][-1]["tool_calls"][0]
        result = {"order": call["args"]["order"], "status": "delivered"}
        return {"messages": [{"role": "tool", "tool_call_id": call["id"], "content": result}]}

    return wired(model, tools)


async def _graph_runs(saver: Any, n: int, latency: float, turns: int) -> None:
    graph = _async_graph(latency, turns).compile(checkpointer=saver)
    prefix = uuid.uuid4().hex[:6]

    async def one(i: int) -> None:
        config = {"configurable": {"thread_id": f"{prefix}-{i}"}, "recursion_limit": 4 * turns}
        out = await graph.ainvoke({"messages": [{"role": "user", "content": "reconcile"}]},
                                  config, durability="sync")
        if len(out["messages"]) != 2 * turns:
            raise RuntimeError(f"a LangGraph run ended after {len(out['messages'])} messages")

    await asyncio.gather(*(one(i) for i in range(n)))


async def _langgraph_sqlite(path: Path, n: int, latency: float,
                            turns: int) -> tuple[float, float]:
    import aiosqlite
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    async with aiosqlite.connect(path) as conn:
        await conn.execute("PRAGMA journal_mode=WAL")
        await conn.execute("PRAGMA synchronous=FULL")
        saver = AsyncSqliteSaver(conn)
        await saver.setup()
        began, cpu = time.perf_counter(), _cpu()
        await _graph_runs(saver, n, latency, turns)
        return time.perf_counter() - began, _cpu() - cpu


async def _langgraph_postgres(url: str, n: int, latency: float, turns: int,
                              commits: Callable[[], int]) -> tuple[float, int, float]:
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    from psycopg.rows import dict_row
    from psycopg_pool import AsyncConnectionPool

    kwargs = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}
    async with AsyncConnectionPool(url, max_size=10, kwargs=kwargs, open=False) as pool:
        saver = AsyncPostgresSaver(pool)  # type: ignore[arg-type]
        await saver.setup()
        committed = await asyncio.to_thread(commits)
        began, cpu = time.perf_counter(), _cpu()
        await _graph_runs(saver, n, latency, turns)
        wall, cpu = time.perf_counter() - began, _cpu() - cpu
        return wall, await asyncio.to_thread(commits) - committed, cpu


def langgraph_measure(backend: str, workdir: Path, n: int, latency: float, turns: int,
                      postgres_url: str | None) -> Measured:
    if backend == "sqlite":
        path = workdir / f"density-langgraph-{uuid.uuid4().hex[:8]}.db"
        wall, cpu = asyncio.run(_langgraph_sqlite(path, n, latency, turns))
        return Measured(wall, 0.0, cpu=cpu)
    assert postgres_url is not None
    url, name = _own_database(postgres_url)
    try:
        wall, spent, cpu = asyncio.run(_langgraph_postgres(url, n, latency, turns,
                                                           _commit_counter(url, name)))
        return Measured(wall, 0.0, spent, cpu)
    finally:
        _drop_database(postgres_url, name)


def langgraph_problem(backend: str) -> str | None:
    """Why LangGraph's async saver for ``backend`` cannot run here, or None."""
    module = ("langgraph.checkpoint.sqlite.aio" if backend == "sqlite"
              else "langgraph.checkpoint.postgres.aio")
    try:
        __import__(module)
    except ImportError as exc:
        return f"{module} is not installed ({exc.name}): pip install 'agentjournal[peers]'"
    return None


# --- the figures ------------------------------------------------------------------------------


def _fresh(fn: Callable[..., Measured], *args: Any) -> Measured:
    """``fn(*args)`` in a fresh process: its resident memory is the runs' alone (a process
    reuses the memory an earlier measurement freed, which would hide the growth)."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


def density_figures(workdir: Path, postgres_url: str | None, plan: Plan,
                    say: Say) -> list[Figure]:
    latency, turns = plan.density_latency, plan.density_turns
    ideal = latency * turns
    steps_per_run = turns - 1  # a model turn and its tool call (the last turn answers)
    backends = ["sqlite", *(["postgres"] if postgres_url else [])]
    figures = []
    for n in plan.density_runs:
        for backend in backends:
            say(f"density: {n} runs x {turns} turns of {latency:g} s on one loop, {backend}")
            ours = _fresh(measure, backend, workdir, n, latency, turns, postgres_url)
            name = f"density.{backend}.{n}"
            figures.append(figure(f"{name}.wall", ours.wall / ideal, "x ideal", note=(
                f"wall {ours.wall:.2f} s for {n} runs; ideal {ideal:g} s = {turns} turns "
                f"x {latency:g} s; target ≤ 1.15")))
            events = n * (4 + 3 * steps_per_run)  # start, task, steps, final turn + finish
            figures.append(figure(f"{name}.events_per_s", events / ours.wall, "events/s"))
            steps = n * steps_per_run
            figures.append(figure(f"{name}.cpu_per_step", ours.cpu / steps * 1e6, "µs/step",
                                  note="the process's CPU (user + system) over the steps; "
                                  "the event loop, stepper threads and store together"))
            figures.append(figure(f"{name}.rss_per_run", ours.rss_growth_mb * 1024 / n,
                                  "KiB/run", note="resident growth while held, over N"))
            figures.append(figure(
                f"{name}.loop_late", ours.late * 1e3, "ms", ours.idle_late * 1e3,
                f"the same probe on the idle loop, {IDLE_PROBE:g} s",
                f"the event loop's worst wake late (a {PROBE_EVERY * 1e3:g} ms probe, less "
                "the time its thread waited for a CPU) while the runs appended"))
            if ours.commits is not None:
                figures.append(figure(
                    f"{name}.commits_per_step", ours.commits / (n * steps_per_run),
                    "commits/step", note="pg_stat_database.xact_commit of the bench's own "
                    "database; target ≤ 1"))
            if langgraph_problem(backend) is not None:
                continue
            theirs = _fresh(langgraph_measure, backend, workdir, n, latency, turns,
                            postgres_url)
            figures.append(figure(f"{name}.langgraph.wall", theirs.wall / ideal, "x ideal",
                                  ours.wall / ideal, "agentjournal arun, same run",
                                  note="LangGraph async saver, durability='sync'"))
            figures.append(figure(f"{name}.langgraph.cpu_per_step", theirs.cpu / steps * 1e6,
                                  "µs/step", ours.cpu / steps * 1e6,
                                  "agentjournal arun, same run"))
            if theirs.commits is not None and ours.commits is not None:
                figures.append(figure(
                    f"{name}.langgraph.commits_per_step", theirs.commits / (n * steps_per_run),
                    "commits/step", ours.commits / (n * steps_per_run),
                    "agentjournal arun, same run"))
    return figures
