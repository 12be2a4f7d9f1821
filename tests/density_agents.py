"""The ledger agent of tests/test_density_worker.py with an async model, run by an
``agentjournal worker --on-loop`` process as ``tests.density_agents:ledger_agent``.

The chaos test's agent (tests/chaos_agents.py, configured by the same environment
variables), its model awaited: a model that waits on the network holds no thread, so one
worker holds hundreds of runs on one event loop.
"""

from __future__ import annotations

import asyncio
import os

from agentjournal import Agent
from agentjournal.demo.reconcile import ledger_tools
from agentjournal.models import ModelRequest, ModelResponse, ScriptedModel
from agentjournal.policy import Budget

from .chaos_agents import DELAY_ENV, SNAPSHOT_ENV, URL_ENV
from .chaos_agents import ledger_agent as chaos_agent


class AsyncScripted:
    """A ScriptedModel's turns, each answered after an async wait of ``delay`` seconds."""

    def __init__(self, script: ScriptedModel, delay: float) -> None:
        self.script, self.delay = script, delay

    async def acomplete(self, request: ModelRequest) -> ModelResponse:
        await asyncio.sleep(self.delay)
        return self.script.complete(request)


def ledger_agent() -> Agent:
    chaos = chaos_agent()
    assert isinstance(chaos.model, ScriptedModel)
    script = ScriptedModel(chaos.model.turns)  # the same turns, answered at once
    model = AsyncScripted(script, float(os.environ.get(DELAY_ENV, "0.4")))
    return Agent(model, ledger_tools(os.environ[URL_ENV], "lookup"),  # type: ignore[arg-type]
                 snapshot_every=int(os.environ.get(SNAPSHOT_ENV, "3")),
                 budget=Budget(max_turns=len(script.turns) + 10, max_tool_calls=200))
