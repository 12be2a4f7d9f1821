"""Pydantic AI agents made durable by ``JournalDurability`` (agentjournal[pydantic-ai]).

Real parts: Pydantic AI's own ``FunctionModel`` (with a counter), child processes killed
with SIGKILL in each window and resumed, a receiver process that counts the effects it is
sent (tests/crash_agent.py), a real stdio MCP server process (tests/mcp_server.py), and,
for the comparison, Pydantic AI's own ``DBOSDurability`` on SQLite."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from pydantic_ai import (
    Agent,
    ApprovalRequired,
    DeferredToolRequests,
    DeferredToolResults,
    RunContext,
)
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from agentjournal import EventType, NondeterminismError, fold, open_store
from agentjournal.cli import cli
from agentjournal.integrations.pydantic_ai import JournalDurability, effect_of_annotations

from .conftest import BACKENDS
from .pydantic_agent import CountingModel, drive, drive_dbos, make_agent, poster

E = EventType
ROOT = Path(__file__).resolve().parents[1]
RUN = "pyd"


def counted(receiver: Any, prefix: str) -> dict[str, int]:
    """The receiver's own count of this test's effects, by label."""
    return {k.removeprefix(prefix): v for k, v in receiver.by_label().items()
            if k.startswith(prefix)}


def log_of(store_url: str, run_id: str = RUN) -> list[Any]:
    store = open_store(store_url)
    try:
        return list(store.read(run_id))
    finally:
        store.close()


def killed_child(*args: str, env: dict[str, str]) -> None:
    done = subprocess.run([sys.executable, "-m", "tests.pydantic_agent", *args], cwd=ROOT,
                          capture_output=True, text=True, env={**os.environ, **env},
                          timeout=180)
    assert done.returncode == -signal.SIGKILL, done.stdout + done.stderr


def done_text(prefix: str) -> str:
    return f"posted {prefix}a (applied), {prefix}b (applied)"


# --- crashes ----------------------------------------------------------------------------


#: By default (the suite's time budget) each window on one backend and the after-POST
#: one on jsonl and postgres too; on SQLite the after-POST kill is the comparison with
#: DBOSDurability below (the same window, killed inside the tool). Streamed
#: (``run_stream``), each window on another backend. --slow: every one.
DEFAULT_PAIRS = {("model_call:1", "run", "sqlite"), ("before_effect:1", "run", "postgres"),
                 ("after_effect:1", "run", "jsonl"), ("after_effect:1", "run", "postgres"),
                 ("model_call:1", "stream", "postgres"), ("before_effect:1", "stream", "jsonl"),
                 ("after_effect:1", "stream", "sqlite")}


@pytest.mark.parametrize("store_url", BACKENDS, indirect=True)
@pytest.mark.parametrize("fault, asked", [
    ("model_call:1", 2), ("before_effect:1", 1), ("after_effect:1", 1)],
    ids=["during-model-request", "start-durable-before-post", "after-post-before-completion"])
@pytest.mark.parametrize("how", ["run", "stream"])
def test_killed_in_each_window_then_resumed_each_effect_happens_once(
        request: pytest.FixtureRequest, store_url: str, module_receiver: Any, fault: str,
        asked: int, how: str) -> None:
    backend = request.node.callspec.params["store_url"]
    if (fault, how, backend) not in DEFAULT_PAIRS and not request.config.getoption("--slow"):
        pytest.skip("this window runs on another backend by default (--slow: all)")
    prefix = f"{request.node.callspec.id}-"
    stream = how == "stream"  # killed and resumed through agent.run_stream
    killed_child("--store", store_url, "--run-id", RUN, "--receiver", module_receiver.url,
                 "--prefix", prefix, *(["--stream"] if stream else []),
                 env={"AGENTJOURNAL_FAULT": fault})
    out = drive(store_url, RUN, module_receiver.url, "lookup", prefix,
                stream=stream)  # resumed here
    assert out["status"] == "finished" and out["output"] == done_text(prefix)
    assert counted(module_receiver, prefix) == {"a": 1, "b": 1}
    assert out["model_calls"] == asked  # a recorded turn is not asked again
    log = log_of(store_url)
    unit = "poster__model.request_stream" if stream else "poster__model.request"
    assert [e.payload["step"]["name"] for e in log if e.type is E.MODEL_TURN] == [unit] * 2
    # The same output as a run that was never interrupted, on the same receiver.
    plain = drive(store_url, "uninterrupted", module_receiver.url, "lookup", prefix + "u-")
    assert plain["output"] == done_text(prefix + "u-") and plain["model_calls"] == 2


def test_a_resumed_finished_run_replays_everything(
        request: pytest.FixtureRequest, tmp_path: Path, module_receiver: Any) -> None:
    url, prefix = f"sqlite:///{tmp_path / 'j.db'}", "replay-"
    first = drive(url, RUN, module_receiver.url, "lookup", prefix)
    again = drive(url, RUN, module_receiver.url, "lookup", prefix)
    assert first["output"] == again["output"] == done_text(prefix)
    assert (first["model_calls"], again["model_calls"]) == (2, 0)
    assert counted(module_receiver, prefix) == {"a": 1, "b": 1}


# --- a person decides -------------------------------------------------------------------


def lost_after_post(url: str) -> Any:
    """A tool whose connection drops after the receiver applied the effect."""
    post = poster(url)

    def post_effect(label: str) -> dict[str, Any]:
        """Apply the effect named `label` once at the receiver."""
        post(label)
        raise ConnectionResetError("the connection dropped after the request was sent")
    return post_effect


@pytest.mark.parametrize("store_url", BACKENDS, indirect=True)
def test_an_uncertain_irreversible_call_is_deferred_then_resolved_by_a_person(
        request: pytest.FixtureRequest, store_url: str, module_receiver: Any) -> None:
    prefix = f"person-{request.node.callspec.id}-"
    model = CountingModel([prefix + "a"])
    broken = Agent(FunctionModel(model), name="poster", output_type=[str, DeferredToolRequests],
                   capabilities=[JournalDurability(store_url, RUN)])
    broken.tool_plain(lost_after_post(module_receiver.url))
    first = broken.run_sync(f"post {prefix}a").output
    assert isinstance(first, DeferredToolRequests)
    assert [c.tool_call_id for c in first.calls] == [f"call-{prefix}a"]
    key = first.metadata[f"call-{prefix}a"]["agentjournal"]["key"]
    assert fold(log_of(store_url)).status == "paused"
    result = CliRunner().invoke(cli, [
        "resolve", RUN, key[:16], "--happened", "--by", "ana", "--store", store_url,
        "--result", json.dumps({"label": f"{prefix}a", "status": "applied"})])
    assert result.exit_code == 0, result.output
    model.asked = 0
    fixed = Agent(FunctionModel(model), name="poster", output_type=[str, DeferredToolRequests],
                  capabilities=[JournalDurability(store_url, RUN)])
    fixed.tool_plain(poster(module_receiver.url))
    assert fixed.run_sync(f"post {prefix}a").output == f"posted {prefix}a (applied)"
    assert counted(module_receiver, prefix) == {"a": 1}  # not made again
    assert model.asked == 1  # only the turn after the call
    state = fold(log_of(store_url))
    assert state.status == "finished" and not state.pending


def test_a_kill_after_the_post_with_no_lookup_defers_then_resolve_finishes(
        tmp_path: Path, module_receiver: Any) -> None:
    """SIGKILL after the POST, no lookup: the resume yields DeferredToolRequests naming the
    uncertain call (its effect is never guessed); after `agentjournal resolve --happened`
    the same call finishes without calling the tool again."""
    url, prefix = f"sqlite:///{tmp_path / 'j.db'}", "nolookup-"
    killed_child("--store", url, "--run-id", RUN, "--receiver", module_receiver.url,
                 "--prefix", prefix, "--mode", "none", env={"KILL_AFTER_POST": "1"})
    out = drive(url, RUN, module_receiver.url, "none", prefix)
    assert out["status"] == "paused" and out["deferred"] and out["model_calls"] == 0
    posted = counted(module_receiver, prefix)
    for key in out["uncertain"]:  # each call the kill left uncertain, as a person saw it
        label = next(e.payload["args"]["label"] for e in log_of(url)
                     if e.type is E.TOOL_CALL_STARTED and e.payload["key"] == key)
        happened = posted.get(label.removeprefix(prefix), 0) > 0
        outcome = (["--happened", "--result", json.dumps({"label": label,
                                                          "status": "applied"})]
                   if happened else ["--did-not-happen"])
        result = CliRunner().invoke(cli, ["resolve", RUN, key[:16], *outcome, "--by", "ana",
                                          "--store", url])
        assert result.exit_code == 0, result.output
    done = drive(url, RUN, module_receiver.url, "none", prefix)
    assert done["status"] == "finished" and done["output"] == done_text(prefix)
    assert counted(module_receiver, prefix) == {"a": 1, "b": 1}
    assert done["model_calls"] == 1  # only the turn after the calls


def test_the_callers_deferred_result_is_recorded_as_its_decision(
        tmp_path: Path, module_receiver: Any) -> None:
    url, prefix = f"sqlite:///{tmp_path / 'j.db'}", "caller-"
    model = CountingModel([prefix + "a"])
    agent = Agent(FunctionModel(model), name="poster", output_type=[str, DeferredToolRequests],
                  capabilities=[JournalDurability(url, RUN)])
    agent.tool_plain(lost_after_post(module_receiver.url))
    first = agent.run_sync(f"post {prefix}a")
    assert isinstance(first.output, DeferredToolRequests)
    answer = {"label": f"{prefix}a", "status": "applied"}
    results = DeferredToolResults(calls={f"call-{prefix}a": answer})
    done = agent.run_sync(message_history=first.all_messages(), deferred_tool_results=results)
    assert done.output == f"posted {prefix}a (applied)"
    assert counted(module_receiver, prefix) == {"a": 1}
    verdicts = [(e.payload["verdict"], e.payload["by"]) for e in log_of(url)
                if e.type is E.TOOL_CALL_RECONCILED]
    assert verdicts == [("found", "caller")]
    assert fold(log_of(url)).status == "finished"


def approval_agent(url: str, made: list[int]) -> Agent[None, str | DeferredToolRequests]:
    def pay(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) == 1:
            return ModelResponse(parts=[ToolCallPart("refund", {"order": 7, "amount": 5},
                                                     tool_call_id="r1")])
        return ModelResponse(parts=[TextPart(f"refund: {messages[-1].parts[0].content}")])

    agent: Agent[None, str | DeferredToolRequests] = Agent(
        FunctionModel(pay), name="refunds", output_type=[str, DeferredToolRequests],
        capabilities=[JournalDurability(url, RUN)])

    @agent.tool_plain(requires_approval=True, metadata={"agentjournal": {"identity": ["order"]}})
    def refund(order: int, amount: int) -> str:
        made.append(amount)
        return f"refunded {amount}"

    return agent


def test_an_approval_a_person_recorded_is_bound_to_the_arguments(tmp_path: Path) -> None:
    url, made = f"sqlite:///{tmp_path / 'j.db'}", []
    first = approval_agent(url, made).run_sync("refund order 7").output
    assert isinstance(first, DeferredToolRequests) and [
        c.tool_call_id for c in first.approvals] == ["r1"]
    (approval_id,) = fold(log_of(url)).approvals
    result = CliRunner().invoke(cli, ["approve", RUN, approval_id, "--by", "ana",
                                      "--store", url])
    assert result.exit_code == 0, result.output
    # The caller kept nothing: the same call again, and the journal holds the approval.
    assert approval_agent(url, made).run_sync("refund order 7").output == "refund: refunded 5"
    assert approval_agent(url, made).run_sync("refund order 7").output == "refund: refunded 5"
    assert made == [5]  # approved once, made once, never again on a resume
    approved = [e.payload for e in log_of(url) if e.type is E.APPROVAL_REQUESTED]
    assert [a["args"] for a in approved] == [{"order": 7, "amount": 5}]


def test_the_callers_approval_is_recorded_and_bound(tmp_path: Path) -> None:
    url, made = f"sqlite:///{tmp_path / 'j.db'}", []
    agent = approval_agent(url, made)
    first = agent.run_sync("refund order 7")
    assert isinstance(first.output, DeferredToolRequests)
    done = agent.run_sync(message_history=first.all_messages(),
                          deferred_tool_results=DeferredToolResults(approvals={"r1": True}))
    assert done.output == "refund: refunded 5" and made == [5]
    decided = [e.payload for e in log_of(url) if e.type is E.APPROVAL_DECIDED]
    assert [(d["approved"], d["by"]) for d in decided] == [(True, "caller")]


# --- what the log says ------------------------------------------------------------------


def test_a_changed_request_at_a_recorded_place_in_strict_mode_is_a_nondeterminism_error(
        tmp_path: Path, module_receiver: Any) -> None:
    url = f"sqlite:///{tmp_path / 'j.db'}"
    drive(url, RUN, module_receiver.url, "lookup", "nd-")
    agent = make_agent(module_receiver.url, CountingModel(["nd-a", "nd-b"]),
                       JournalDurability(url, RUN, strict=True), "lookup")
    agent.instructions("Be terse.")  # the request the run recorded asked without it
    with pytest.raises(NondeterminismError) as caught:
        agent.run_sync("post nd-a, nd-b")
    assert caught.value.recorded != caught.value.given
    assert caught.value.recorded in str(caught.value) and caught.value.given in str(caught.value)


def test_show_events_and_runs_display_the_run_like_a_native_one(
        tmp_path: Path, module_receiver: Any) -> None:
    url = f"sqlite:///{tmp_path / 'j.db'}"
    drive(url, RUN, module_receiver.url, "lookup", "show-")
    wide = {"COLUMNS": "250"}  # the summaries whole, whatever width an earlier test left
    shown = CliRunner().invoke(cli, ["show", RUN, "--store", url], env=wide)
    assert shown.exit_code == 0, shown.output
    assert "finished" in shown.output and "model_turn" in shown.output
    assert 'post_effect({"label": "show-a"})' in shown.output
    assert "tool_call_completed" in shown.output and "show-a" in shown.output
    runs = CliRunner().invoke(cli, ["runs", "--json", "--store", url])
    (row,) = json.loads(runs.output)
    assert (row["run_id"], row["status"], row["turns"]) == (RUN, "finished", 2)
    events = CliRunner().invoke(cli, ["events", RUN, "--store", url])
    kinds = [json.loads(line)["type"] for line in events.output.splitlines()]
    assert kinds.count("tool_call_started") == 2 and kinds[-1] == "run_finished"


def test_mcp_annotations_map_to_effect_classes() -> None:
    assert effect_of_annotations({"readOnlyHint": True}) == "read_only"
    assert effect_of_annotations({"idempotentHint": True}) == "idempotent"
    assert effect_of_annotations({"destructiveHint": False}) == "irreversible"
    assert effect_of_annotations(None) == "irreversible"


def test_outside_asyncio_run_in_a_loop_it_works_too(tmp_path: Path, module_receiver: Any) -> None:
    """``agent.run`` awaited on the caller's own event loop (not run_sync)."""
    url = f"sqlite:///{tmp_path / 'j.db'}"
    model = CountingModel(["loop-a", "loop-b"])
    agent = make_agent(module_receiver.url, model, JournalDurability(url, RUN), "lookup")
    assert asyncio.run(agent.run("post")).output == done_text("loop-")


# --- MCP, names, telemetry ----------------------------------------------------------------


def banker(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    if len(messages) == 1:
        account = {"account": "mcp-acct"}
        return ModelResponse(parts=[
            ToolCallPart("read_balance", account, tool_call_id="m1"),
            ToolCallPart("set_limit", {**account, "limit": 5}, tool_call_id="m2"),
            ToolCallPart("transfer", {**account, "amount": 3}, tool_call_id="m3")])
    return ModelResponse(parts=[TextPart("done")])


def test_an_mcp_stdio_servers_tools_are_journaled_with_their_annotations(
        tmp_path: Path, module_receiver: Any) -> None:
    from fastmcp.client.transports import StdioTransport
    from pydantic_ai.mcp import MCPToolset

    url = f"sqlite:///{tmp_path / 'j.db'}"
    for _ in range(2):  # the second run replays: the server is not called again
        server = StdioTransport(sys.executable, [str(ROOT / "tests" / "mcp_server.py"),
                                                 module_receiver.url])
        agent = Agent(FunctionModel(banker), name="banker",
                      toolsets=[MCPToolset(server, id="bank")],
                      capabilities=[JournalDurability(url, RUN)])
        assert agent.run_sync("look, limit, move").output == "done"
    calls = {k: v for k, v in module_receiver.by_label().items() if k.endswith(":mcp-acct")}
    assert calls == {"read_balance:mcp-acct": 1, "set_limit:mcp-acct": 1,
                     "transfer:mcp-acct": 1}
    log = log_of(url)
    effects = {e.payload["tool"]: e.payload["effect"] for e in log
               if e.type is E.TOOL_CALL_STARTED}
    assert effects == {"read_balance": "read_only", "set_limit": "idempotent",
                       "transfer": "irreversible"}
    assert step_names(log) == {"banker__mcp_server__bank.get_tools", "banker__model.request"}


def step_names(log: list[Any]) -> set[str]:
    """The operation names a run persisted (its steps)."""
    return {(e.payload["step"] if e.type is E.MODEL_TURN else e.payload)["name"]
            for e in log if e.type is E.STEP_RECORDED or
            (e.type is E.MODEL_TURN and "step" in e.payload)}


def test_the_persisted_operation_names_are_pinned() -> None:
    """Pydantic AI's guidance: the names a journal persists are compatibility data. An
    upgrade that renames one strands every run recorded under the old name, so it must
    fail here, loudly, not in production."""
    from pydantic_ai.durable_exec import (
        CapabilityOperationId,
        EventStreamHandlerId,
        JournalOperationNamer,
        ModelRequestId,
        ToolsetCallToolId,
        ToolsetGetInstructionsId,
        ToolsetGetToolsId,
    )

    namer = JournalOperationNamer("shop", default_model_id="default")
    names = {
        namer.operation_name(ModelRequestId(model_name="m")): "shop__model.request",
        namer.operation_name(ModelRequestId("gpt", model_name="m")): "shop__model.request.gpt",
        namer.operation_name(ModelRequestId(model_name="m", streaming=True)):
            "shop__model.request_stream",
        namer.operation_name(ToolsetGetToolsId("mcp", toolset_id="bank")):
            "shop__mcp_server__bank.get_tools",
        namer.operation_name(ToolsetGetInstructionsId("bank")):
            "shop__mcp_server__bank.get_instructions",
        namer.operation_name(EventStreamHandlerId()): "shop__event_stream_handler",
        namer.operation_name(CapabilityOperationId("memo", operation="save")):
            "shop__capability__memo.save",
        namer.invocation_name(ToolsetCallToolId("function", toolset_id="t"),
                              label="post").operation_name:
            "shop__function_toolset__t.call_tool:post",
    }
    assert list(names) == list(names.values())


def test_replayed_units_are_reported_as_replayed(tmp_path: Path, module_receiver: Any) -> None:
    """record_durable_unit(executed=False): Pydantic AI's own telemetry exports no span of
    a model request or tool call that a resume served from the journal."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from pydantic_ai.models.instrumented import InstrumentationSettings

    url, exporter, provider = f"sqlite:///{tmp_path / 'j.db'}", InMemorySpanExporter(), \
        TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    spans = []
    for _ in range(2):
        agent = make_agent(module_receiver.url, CountingModel(["otel-a", "otel-b"]),
                           JournalDurability(url, RUN), "lookup")
        agent.instrument = InstrumentationSettings(tracer_provider=provider)
        agent.run_sync("post otel-a, otel-b")
        spans.append(sorted(s.name.split()[0] for s in exporter.get_finished_spans()))
        exporter.clear()
    assert spans[0] == ["chat", "chat", "execute_tool", "execute_tool", "invoke_agent"]
    assert spans[1] == ["invoke_agent"]  # everything replayed: nothing reported as done


@pytest.mark.parametrize("store_url", BACKENDS, indirect=True)
def test_a_call_settled_by_its_lookup_is_exported_as_reconciled_not_executed(
        request: pytest.FixtureRequest, store_url: str, module_receiver: Any) -> None:
    """SIGKILL right after a POST, resumed here with Pydantic AI's instrumentation: the
    call its lookup found is one ``execute_tool`` span with outcome ``reconciled`` (as
    the native loop's GenAITracer exports it), under the run's span, never a span of
    the tool running with the lookup's result as its output."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from pydantic_ai.models.instrumented import InstrumentationSettings

    prefix = f"otel-settled-{request.node.callspec.id}-"
    killed_child("--store", store_url, "--run-id", RUN, "--receiver", module_receiver.url,
                 "--prefix", prefix, env={"KILL_AFTER_POST": "1"})
    exporter, provider = InMemorySpanExporter(), TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    agent = make_agent(module_receiver.url, CountingModel([prefix + "a", prefix + "b"]),
                       JournalDurability(store_url, RUN), "lookup")
    agent.instrument = InstrumentationSettings(tracer_provider=provider)
    assert agent.run_sync(f"post {prefix}a, {prefix}b").output == done_text(prefix)
    assert counted(module_receiver, prefix) == {"a": 1, "b": 1}
    log = log_of(store_url)
    labels = {e.payload["key"]: e.payload["args"]["label"] for e in log
              if e.type is E.TOOL_CALL_STARTED}
    verdicts = {f"call-{labels[e.payload['key']]}": e.payload["verdict"] for e in log
                if e.type is E.TOOL_CALL_RECONCILED}
    assert "found" in verdicts.values()  # the premise: the kill left a call its lookup finds
    spans = exporter.get_finished_spans()
    (run_span,) = [s for s in spans if s.name == "invoke_agent poster"]
    for call_id in (f"call-{prefix}a", f"call-{prefix}b"):
        shown = [s for s in spans if s.name == "execute_tool post_effect"
                 and s.attributes.get("gen_ai.tool.call.id") == call_id]
        outcomes = [s.attributes.get("agentjournal.tool.outcome") for s in shown]
        if verdicts.get(call_id) == "found":  # settled: the tool did not run here
            (span,) = shown
            assert dict(span.attributes or {}) | {"agentjournal.seq": 0} == {
                "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "post_effect",
                "gen_ai.tool.call.id": call_id, "gen_ai.tool.type": "function",
                "agentjournal.tool.effect": "irreversible",
                "agentjournal.tool.outcome": "reconciled",
                "agentjournal.tool.verdict": "found", "agentjournal.seq": 0}
            assert span.parent is not None
            assert span.parent.span_id == run_span.context.span_id
        elif verdicts.get(call_id) == "absent":  # looked up, then made here
            assert sorted(outcomes, key=str) == [None, "reconciled"]
            (made,) = [s for s in shown if "agentjournal.tool.outcome" not in s.attributes]
            assert "gen_ai.tool.call.result" in made.attributes
        else:  # never started before the kill: made here
            assert outcomes == [None]


def test_a_call_served_from_another_run_of_the_scope_is_not_exported_as_made(
        tmp_path: Path, module_receiver: Any) -> None:
    """A second run of the same operation (scope) is answered from the first's effects:
    as the native loop, no ``execute_tool`` span says the tool ran; the model's turn
    after it, which did run, is exported."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from pydantic_ai.models.instrumented import InstrumentationSettings

    url, prefix = f"sqlite:///{tmp_path / 'j.db'}", "served-"
    exporter, provider = InMemorySpanExporter(), TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    spans = {}
    for run_id in ("first", "second"):
        agent = make_agent(module_receiver.url, CountingModel([prefix + "a", prefix + "b"]),
                           JournalDurability(url, run_id, scope="op-served"), "lookup")
        agent.instrument = InstrumentationSettings(tracer_provider=provider)
        assert agent.run_sync(f"post {prefix}a, {prefix}b").output == done_text(prefix)
        spans[run_id] = sorted(s.name.split()[0] for s in exporter.get_finished_spans())
        exporter.clear()
    assert counted(module_receiver, prefix) == {"a": 1, "b": 1}
    sources = [e.payload["source"] for e in log_of(url, "second")
               if e.type is E.TOOL_CALL_COMPLETED]
    assert sources == ["scope", "scope"]  # the premise: the second run made no call
    assert spans["first"] == ["chat", "chat", "execute_tool", "execute_tool", "invoke_agent"]
    assert spans["second"] == ["chat", "chat", "invoke_agent"]


def test_the_effects_map_wins_over_the_tools_metadata(tmp_path: Path, module_receiver: Any) -> None:
    url = f"sqlite:///{tmp_path / 'j.db'}"
    agent = make_agent(module_receiver.url, CountingModel(["map-a", "map-b"]),
                       JournalDurability(url, RUN, effects={"post_effect": "idempotent"}),
                       "lookup")
    agent.run_sync("post map-a, map-b")
    assert {e.payload["effect"] for e in log_of(url) if e.type is E.TOOL_CALL_STARTED} == {
        "idempotent"}


# --- beside Pydantic AI's own DBOSDurability ------------------------------------------------


def test_the_after_post_kill_under_dbos_durability_and_under_ours(
        tmp_path: Path, module_receiver: Any, record_property: Any) -> None:
    """The same agent, killed inside its tool right after the POST, then recovered: under
    DBOSDurability (SQLite; DBOS does not wrap function tools, so recovery calls the tool
    again) and under JournalDurability (the start was durable: the lookup finds the effect).
    The receiver counts both; ours must be one, DBOS's is recorded as measured."""
    base = ["--run-id", "cmp", "--receiver", module_receiver.url]
    dbos_file = str(tmp_path / "dbos.sqlite")
    killed_child(*base, "--dbos", dbos_file, "--prefix", "dbos-", env={"KILL_AFTER_POST": "1"})
    # DBOS recovers the killed workflow when it launches here, and runs it to its end.
    recovered = drive_dbos(dbos_file, "cmp", module_receiver.url, "dbos-")
    assert recovered["output"] == done_text("dbos-")
    url = f"sqlite:///{tmp_path / 'ours.db'}"
    killed_child(*base, "--store", url, "--prefix", "ours-", env={"KILL_AFTER_POST": "1"})
    ours = drive(url, "cmp", module_receiver.url, "lookup", "ours-")
    assert ours["output"] == done_text("ours-")
    theirs, mine = counted(module_receiver, "dbos-"), counted(module_receiver, "ours-")
    record_property("dbos_receiver_counts", theirs)
    record_property("agentjournal_receiver_counts", mine)
    print(f"\nafter-POST kill, receiver counts: DBOSDurability {theirs}, "
          f"JournalDurability {mine}")
    assert mine == {"a": 1, "b": 1}
    assert min(theirs.values()) >= 1  # the effect happened (how often is what we measure)


# --- the fleet --------------------------------------------------------------------------


def test_workers_drive_a_pydantic_ai_agent_and_take_over_after_a_kill(
        tmp_path: Path, module_receiver: Any) -> None:
    """agentjournal submit names a factory of a DurableAgent; a worker hangs right after a
    POST and is killed with SIGKILL; another worker takes the run over, settles the call
    by its lookup and finishes it. The receiver counts each effect once."""
    from .test_worker import Fleet

    fleet = Fleet(f"sqlite:///{tmp_path / 'fleet.db'}", tmp_path)
    fleet.env["FLEET_RECEIVER"] = module_receiver.url
    try:
        submitted = fleet.cli("submit", "--agent", "tests.pydantic_fleet_agents:poster",
                              "--task", "fleet", "--run-id", "f1", "--json")
        assert submitted.returncode == 0, submitted.stderr
        fleet.env["FLEET_HANG"] = "fleet-a"
        first = fleet.worker("--ttl", "2", agents="tests.pydantic_fleet_agents")
        fleet.until("the first effect", lambda: counted(module_receiver, "fleet-") == {"a": 1})
        first.kill()
        first.wait()
        fleet.env.pop("FLEET_HANG")
        fleet.worker("--ttl", "2", agents="tests.pydantic_fleet_agents")
        fleet.until("the run done", lambda: fleet.runs()["f1"].state == "done")
    finally:
        fleet.close()
    assert counted(module_receiver, "fleet-") == {"a": 1, "b": 1}, fleet.logs()
    log = log_of(fleet.url, "f1")
    assert [e.payload["verdict"] for e in log if e.type is E.TOOL_CALL_RECONCILED] == ["found"]
    state = fold(log)
    assert state.status == "finished" and state.outcome == "posted fleet-a, fleet-b"
    assert state.agent == "tests.pydantic_fleet_agents:poster"
    assert len({e.epoch for e in log}) == 2  # two workers, two epochs: fenced takeover


def test_a_tool_that_asks_for_approval_itself_runs_once_approved(tmp_path: Path) -> None:
    url, made = f"sqlite:///{tmp_path / 'j.db'}", []

    def pay(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) == 1:
            return ModelResponse(parts=[ToolCallPart("wire", {"cents": 900},
                                                     tool_call_id="w1")])
        return ModelResponse(parts=[TextPart(f"wire: {messages[-1].parts[0].content}")])

    agent: Agent[None, str | DeferredToolRequests] = Agent(
        FunctionModel(pay), name="wires", output_type=[str, DeferredToolRequests],
        capabilities=[JournalDurability(url, RUN)])

    @agent.tool
    def wire(ctx: RunContext[None], cents: int) -> str:
        if cents > 500 and not ctx.tool_call_approved:
            raise ApprovalRequired  # the tool's own rule: large wires need a person
        made.append(cents)
        return f"sent {cents}"

    first = agent.run_sync("wire 900")
    assert isinstance(first.output, DeferredToolRequests)
    assert [c.tool_call_id for c in first.output.approvals] == ["w1"]
    done = agent.run_sync(message_history=first.all_messages(),
                          deferred_tool_results=DeferredToolResults(approvals={"w1": True}))
    assert done.output == "wire: sent 900" and made == [900]
    again = agent.run_sync(message_history=first.all_messages(),
                           deferred_tool_results=DeferredToolResults(approvals={"w1": True}))
    assert again.output == "wire: sent 900" and made == [900]  # replayed, not sent again
