"""14. A Pydantic AI agent made durable by JournalDurability: what a step costs.

The same agent (a ``FunctionModel`` asking for one call of a local tool per turn, N
turns, then an answer) runs in the same rounds three ways: with no durability (the
floor: Pydantic AI's own cost), with ``JournalDurability`` on a fresh SQLite store (a
model turn, a start and a completion made durable per step), and with Pydantic AI's own
``DBOSDurability`` on a fresh SQLite database (the peer: its model request a DBOS step,
the tool not journaled at all). ms per step; ratios: ours / no durability, ours / DBOS.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ._common import Figure, Plan, Say, figure, medians


def pydantic_ai_problem() -> str | None:
    try:
        import pydantic_ai  # noqa: F401
    except ImportError:
        return "skipped: the pydantic-ai extra is not installed"
    return None


def dbos_problem() -> str | None:
    try:
        import dbos  # noqa: F401
    except ImportError:
        return "skipped: dbos is not installed (pip install dbos)"
    return None


def _agent(steps: int, capability: Any) -> Any:
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import FunctionModel

    def model(messages: list[Any], info: Any) -> ModelResponse:
        turn = sum(isinstance(m, ModelResponse) for m in messages)
        if turn < steps:
            return ModelResponse(parts=[ToolCallPart("tick", {"i": turn},
                                                     tool_call_id=f"t{turn}")])
        return ModelResponse(parts=[TextPart("done")])

    agent = Agent(FunctionModel(model), name="bench", capabilities=[capability] if capability
                  else [])

    @agent.tool_plain
    def tick(i: int) -> int:
        """Count step `i`."""
        return i

    return agent


def _unlimited() -> Any:
    from pydantic_ai.usage import UsageLimits

    return UsageLimits(request_limit=None)


class _Rounds:
    def __init__(self, workdir: Path, steps: int) -> None:
        self.workdir, self.steps = workdir, steps
        self._workflow: Any = None  # the DBOS workflow, once launched

    def _timed(self, agent: Any) -> float:
        start = time.perf_counter()
        if agent.run_sync("count", usage_limits=_unlimited()).output != "done":
            raise RuntimeError("the bench agent did not finish")
        return (time.perf_counter() - start) * 1e3 / self.steps

    def plain(self) -> float:
        return self._timed(_agent(self.steps, None))

    def journal(self) -> float:
        from ..integrations.pydantic_ai import JournalDurability

        url = f"sqlite:///{self.workdir / f'pyd-{uuid.uuid4().hex[:8]}.db'}"
        return self._timed(_agent(self.steps, JournalDurability(url, "bench")))

    def dbos(self) -> float:
        from dbos import SetWorkflowID

        start = time.perf_counter()
        with SetWorkflowID(f"bench-{uuid.uuid4().hex[:8]}"):
            output = asyncio.run(self._workflow("count"))
        if output != "done":
            raise RuntimeError("the bench agent did not finish under DBOS")
        return (time.perf_counter() - start) * 1e3 / self.steps

    @contextlib.contextmanager
    def dbos_launched(self) -> Iterator[None]:
        """DBOS on its own SQLite file for the section, its workflow registered."""
        from dbos import DBOS
        from pydantic_ai.durable_exec.dbos import DBOSDurability

        DBOS(config={"name": "agentjournal-bench", "log_level": "WARNING",
                     "system_database_url": f"sqlite:///{self.workdir / 'dbos.sqlite'}"})
        agent = _agent(self.steps, DBOSDurability())

        @DBOS.workflow(name="bench_run")
        async def bench_run(prompt: str) -> str:
            return str((await agent.run(prompt, usage_limits=_unlimited())).output)

        self._workflow = bench_run
        DBOS.launch()
        try:
            yield
        finally:
            DBOS.destroy(destroy_registry=True)


def pydantic_ai_figures(workdir: Path, plan: Plan, say: Say) -> list[Figure]:
    steps = plan.pydantic_steps
    if problem := pydantic_ai_problem():
        return [figure("pydantic_ai.step", None, "ms/step", note=problem),
                figure("pydantic_ai.step_vs_dbos", None, "ms/step", note=problem)]
    rounds = _Rounds(workdir, steps)
    note = f"{steps} steps (a FunctionModel turn and one local tool call each), SQLite"
    if problem := dbos_problem():
        say(f"pydantic-ai: a {steps}-step agent with JournalDurability and without, "
            f"x {plan.reps}")
        ours, plain = medians(plan.reps, [rounds.journal, rounds.plain])
        theirs = None
    else:
        say(f"pydantic-ai: a {steps}-step agent with JournalDurability, without durability "
            f"and with DBOSDurability, x {plan.reps}")
        with rounds.dbos_launched():
            ours, plain, theirs = medians(plan.reps, [rounds.journal, rounds.plain,
                                                      rounds.dbos])
    return [
        figure("pydantic_ai.step", ours, "ms/step", plain,
               "the same agent with no durability", note),
        figure("pydantic_ai.step_vs_dbos", ours, "ms/step", theirs,
               "the same agent with DBOSDurability (SQLite; its tool calls not journaled)",
               note if theirs is not None else f"{note}; {dbos_problem()}"),
    ]
