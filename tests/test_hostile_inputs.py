"""What a model or a tool may hand the loop that it must not trust: a tool name the agent
does not have (a secret in it, quotes, braces, control characters, 10 kB of it). Each is
answered with a clear denial, the run goes on, and nothing of it reaches the store's bytes,
a span or a metric."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agentjournal import Agent, EventType, ScriptedModel, calls, open_store, reply
from agentjournal.metrics import METRICS
from agentjournal.models import ModelRequest, ModelResponse
from agentjournal.otel import GenAITracer
from agentjournal.state import ToolCall
from agentjournal.steps import NOT_A_TOOL_NAME
from agentjournal.tools import tool

from .conftest import BACKENDS
from .otel_agent import as_dict
from .test_secrets import postgres_rows, written_bytes

E = EventType
SECRET = "sk-live-CANARY1234567890abcdefXYZ"
#: Names a model may send for a tool the agent does not have.
HOSTILE = {
    "secret": f"tool_{SECRET}",
    "quotes": 'lookup"; DROP TABLE runs; --',
    "braces": "{lookup}",
    "huge": "n" * 10_000,
    "control": "look\x00up\x1b[31m\r\n",
}


def run_with(runner: str, store_url: str, model: ScriptedModel, exporter: InMemorySpanExporter,
             run_id: str = "r1") -> tuple[Any, list[Any]]:
    """Run the agent (``run`` or ``arun``) traced; its result and its log."""

    @tool(effect="read_only")
    def lookup(order: int) -> dict[str, Any]:
        return {"order": order, "status": "shipped"}

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    agent = Agent(model, [lookup], snapshot_every=1)
    store = open_store(store_url)
    try:
        tracer = GenAITracer(provider)
        if runner == "run":
            result = agent.run(store, run_id, "where is order 7?", observer=tracer)
        else:
            result = asyncio.run(agent.arun(store, run_id, "where is order 7?",
                                            observer=tracer))
        return result, list(store.read(run_id))
    finally:
        store.close()


@pytest.mark.parametrize("runner", ["run", "arun"])
@pytest.mark.parametrize("store_url", BACKENDS, indirect=True)
def test_a_tool_name_the_agent_lacks_is_denied_and_reaches_no_byte_span_or_metric(
        runner: str, store_url: str, tmp_path: Path) -> None:
    asked: list[ModelRequest] = []

    def answer(request: ModelRequest) -> ModelResponse:
        asked.append(request)
        return reply("order 7 is shipped")

    model = ScriptedModel([
        calls(("lookup", {"order": 7}), *[(name, {"order": 7}) for name in HOSTILE.values()]),
        answer])
    exporter = InMemorySpanExporter()
    METRICS.reset()
    result, log = run_with(runner, store_url, model, exporter)

    assert result.status == "finished" and result.outcome == "order 7 is shipped"
    assert [e.payload["tool"] for e in log if e.type is E.TOOL_CALL_COMPLETED] == ["lookup"]
    denials = [e.payload for e in log if e.type is E.TOOL_CALL_DENIED]
    assert len(denials) == len(HOSTILE)
    assert all(d["unknown_tool"] is True for d in denials)
    assert all("this agent has no tool" in d["reason"] and "lookup" in d["reason"]
               for d in denials)
    # The model reads each denial, and its turn as recorded: no hostile name in either.
    (request,) = asked
    told = [m.content for m in request.messages if m.role == "tool"]
    assert len(told) == 1 + len(HOSTILE)
    assert sum(m.startswith("denied: this agent has no tool") for m in told) == len(HOSTILE)
    names = [c.name for m in request.messages for c in m.tool_calls]
    assert names[0] == "lookup" and len(names) == 1 + len(HOSTILE)
    for name in HOSTILE.values():
        assert name not in names and all(name not in m for m in told)

    # Nothing of a hostile name in the store's bytes: files, WAL, snapshots, rows.
    blobs = written_bytes(tmp_path)
    if store_url.startswith("postgresql"):
        blobs += postgres_rows(store_url)
    assert blobs
    for blob in blobs:
        assert b"CANARY" not in blob
        assert b"n" * 200 not in blob and b"DROP TABLE" not in blob
        assert b"{lookup}" not in blob and b"look\\u0000up" not in blob

    # Nor in a span: a denied unknown name is no span name and no gen_ai.tool.name.
    spans = [as_dict(s) for s in exporter.get_finished_spans()]
    tools = [s for s in spans if s["name"].startswith("execute_tool")]
    assert sorted(s["name"] for s in tools) == ["execute_tool"] * len(HOSTILE) + [
        "execute_tool lookup"]
    assert [s["attributes"].get("gen_ai.tool.name") for s in tools
            if s["name"] == "execute_tool"] == [None] * len(HOSTILE)
    assert all(s["attributes"]["agentjournal.tool.outcome"] == "denied" for s in tools
               if s["name"] == "execute_tool")
    exported = repr(spans)
    assert "CANARY" not in exported and "n" * 200 not in exported
    assert "DROP TABLE" not in exported and "{lookup}" not in exported
    # Nor in a metric.
    assert "CANARY" not in repr(METRICS.snapshot()) and "CANARY" not in METRICS.prometheus()


def test_the_provider_items_that_repeat_a_made_up_name_carry_the_stand_in(
        tmp_path: Path) -> None:
    """OpenAI Responses and Anthropic repeat a call's name in their items, which the turn
    records and sends back: a name that is no tool name is replaced there too."""
    huge = HOSTILE["huge"]
    turn = ModelResponse(
        tool_calls=[ToolCall(id="fc1", name=huge, args={"order": 7})],
        items=[{"type": "reasoning", "id": "rs1", "summary": []},
               {"type": "function_call", "call_id": "fc1", "name": huge,
                "arguments": '{"order": 7}'}],
        provider="openai.responses")
    asked: list[ModelRequest] = []

    def answer(request: ModelRequest) -> ModelResponse:
        asked.append(request)
        return reply("sorry")

    result, log = run_with("run", f"sqlite:///{tmp_path / 'j.db'}",
                           ScriptedModel([turn, answer]), InMemorySpanExporter())
    assert result.status == "finished"
    recorded = next(e.payload for e in log if e.type is E.MODEL_TURN)
    assert [c["name"] for c in recorded["tool_calls"]] == [NOT_A_TOOL_NAME]
    assert [i.get("name") for i in recorded["items"]] == [None, NOT_A_TOOL_NAME]
    (request,) = asked
    (assistant,) = [m for m in request.messages if m.role == "assistant"]
    assert assistant.items[1]["name"] == NOT_A_TOOL_NAME
    assert not any(huge[:200].encode() in blob for blob in written_bytes(tmp_path))
