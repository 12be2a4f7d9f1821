"""A Pydantic AI agent for the fleet test in tests/test_pydantic_ai.py, run by real worker
processes as ``tests.pydantic_fleet_agents:poster`` (a factory of a DurableAgent).

Its model asks for ``post_effect(LABEL-a)`` then ``post_effect(LABEL-b)``, one per turn
(LABEL: the task); the tool POSTs to the receiver at ``$FLEET_RECEIVER`` with the call's
key and declares the receiver's lookup. With ``$FLEET_HANG`` naming a label, the tool
hangs right after that POST (the test kills the worker there).
"""

from __future__ import annotations

import os
import threading
from typing import Any

from pydantic_ai import Agent, DeferredToolRequests
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from agentjournal.integrations.pydantic_ai import DurableAgent, JournalDurability

from .pydantic_agent import lookup_at
from .pydantic_agent import poster as post_to


def _model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    task = str(messages[0].parts[-1].content)
    turn = sum(isinstance(m, ModelResponse) for m in messages)
    if turn < 2:
        label = f"{task}-{'ab'[turn]}"
        return ModelResponse(parts=[ToolCallPart("post_effect", {"label": label},
                                                 tool_call_id=f"call-{label}")])
    return ModelResponse(parts=[TextPart(f"posted {task}-a, {task}-b")])


def _tool(label: str) -> Any:
    url = os.environ["FLEET_RECEIVER"]
    result = post_to(url)(label)
    if os.environ.get("FLEET_HANG") == label:
        threading.Event().wait()  # applied, its completion never recorded: killed here
    return result


durability: JournalDurability[None] = JournalDurability()
agent: Agent[None, str | DeferredToolRequests] = Agent(
    FunctionModel(_model), name="fleet_poster", output_type=[str, DeferredToolRequests],
    capabilities=[durability])


@agent.tool_plain(metadata={"agentjournal": {
    "identity": ["label"], "lookup": lookup_at(os.environ.get("FLEET_RECEIVER", ""))}})
def post_effect(label: str) -> Any:
    """Apply the effect named `label` once at the receiver."""
    return _tool(label)


def poster() -> DurableAgent:
    """The agent as a worker drives it."""
    return DurableAgent(agent, durability)
