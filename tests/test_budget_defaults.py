"""Budgets are on by default: a looping model stops with budget_exceeded and a pause."""

from __future__ import annotations

from pathlib import Path

from agentjournal import Agent, Budget, EventType, calls, open_store
from agentjournal.models import ModelRequest, ModelResponse, ScriptedModel
from agentjournal.policy import DEFAULT_MAX_TOKENS, DEFAULT_MAX_TOOL_CALLS, DEFAULT_MAX_TURNS
from agentjournal.state import Usage
from agentjournal.tools import tool

E = EventType


class Looping:
    """A model that never stops asking for a tool, a fresh one every turn."""

    def __init__(self, tokens: int = 10) -> None:
        self.tokens = tokens

    def complete(self, request: ModelRequest) -> ModelResponse:
        turn = calls(("look", {"n": request.turn}))
        return ModelResponse(tool_calls=[c.__class__(id=f"c{request.turn}", name=c.name,
                                                     args=c.args) for c in turn.tool_calls],
                             usage=Usage(input_tokens=self.tokens, output_tokens=1))


@tool(effect="read_only")
def look(n: int) -> int:
    return n


def test_defaults_are_documented_numbers() -> None:
    budget = Budget()
    assert (budget.max_turns, budget.max_tool_calls, budget.max_tokens) == (
        DEFAULT_MAX_TURNS, DEFAULT_MAX_TOOL_CALLS, DEFAULT_MAX_TOKENS) == (100, 500, 2_000_000)
    unlimited = Budget.unlimited()
    assert (unlimited.max_turns, unlimited.max_tool_calls, unlimited.max_tokens,
            unlimited.max_cost_usd, unlimited.max_seconds) == (None,) * 5


def test_a_looping_model_stops_by_default(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'j.db'}")
    result = Agent(Looping(), [look], snapshot_every=None).run(store, "r1", "t")
    assert result.status == "paused" and "turns" in (result.pause_reason or "")
    hit = [e.payload for e in store.read("r1") if e.type is E.BUDGET_EXCEEDED]
    assert hit == [{"budget": "turns", "limit": 100, "used": 100}]


def test_tokens_are_limited_by_default(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'j.db'}")
    result = Agent(Looping(tokens=500_000), [look]).run(store, "r1", "t")
    assert result.status == "paused"
    (hit,) = [e.payload for e in store.read("r1") if e.type is E.BUDGET_EXCEEDED]
    assert hit["budget"] == "tokens" and hit["used"] >= 2_000_000


def test_unlimited_lets_a_long_run_finish(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'j.db'}")
    model = ScriptedModel([calls(("look", {"n": i})) for i in range(120)])
    result = Agent(model, [look], budget=Budget.unlimited(), snapshot_every=None).run(
        store, "r1", "t")
    assert result.status == "finished" and result.state.turns == 121
