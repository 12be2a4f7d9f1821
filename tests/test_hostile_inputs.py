"""What a model or a tool may hand the loop that it must not trust: a tool name the agent
does not have (a secret in it, quotes, braces, control characters, 10 kB of it). Each is
answered with a clear denial, the run goes on, and nothing of it reaches the store's bytes,
a span or a metric."""

from __future__ import annotations

import asyncio
import hashlib
import math
import threading
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agentjournal import Agent, EventType, Rules, ScriptedModel, calls, open_store, reply
from agentjournal.bridge import open_run
from agentjournal.decisions import decide_approval
from agentjournal.errors import ResultNotKeptError
from agentjournal.metrics import METRICS
from agentjournal.models import ModelRequest, ModelResponse
from agentjournal.otel import GenAITracer
from agentjournal.providers._common import parse_call
from agentjournal.results import MAX_DEPTH
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


# --- values nested too deep (results.MAX_DEPTH) ---------------------------------------------


def nested(depth: int) -> Any:
    """``[[...[1]...]]``: ``depth`` lists, built without recursion."""
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def deep_agent(made: list[str], returns: Any) -> Agent:
    @tool(effect="irreversible")
    def pay(order: int) -> Any:
        made.append(f"pay {order}")
        return returns

    @tool(effect="irreversible")
    def store_tree(tree: Any) -> str:
        made.append("store_tree")
        return "stored"

    model = ScriptedModel([calls(("pay", {"order": 7})),
                           calls(("store_tree", {"tree": nested(20_000)})), reply("done")])
    return Agent(model, [pay, store_tree])


@pytest.mark.parametrize("runner", ["run", "arun"])
@pytest.mark.parametrize("store_url", BACKENDS, indirect=True)
def test_a_result_and_arguments_nested_20000_deep_are_not_kept_and_the_run_finishes(
        runner: str, store_url: str) -> None:
    made: list[str] = []
    agent = deep_agent(made, nested(20_000))
    store = open_store(store_url)
    try:
        result = (agent.run(store, "deep", "pay order 7") if runner == "run"
                  else asyncio.run(agent.arun(store, "deep", "pay order 7")))
        assert result.status == "finished" and result.outcome == "done"
        # A resume has nothing to ask anyone and nothing to make again.
        again = deep_agent(made, nested(20_000)).run(store, "deep", "pay order 7")
        log = list(store.read("deep"))
    finally:
        store.close()
    assert again.status == "finished"
    assert made == ["pay 7"]  # the effect once; the deep arguments never reached their tool
    assert not any(e.type in (E.TOOL_CALL_UNCERTAIN, E.RUN_PAUSED) for e in log)
    (done,) = [e.payload for e in log if e.type is E.TOOL_CALL_COMPLETED]
    body = b"[" * 20_000 + b"1" + b"]" * 20_000
    assert done["result"] is None and done["idempotency_key"]
    assert done["result_bytes"] == len(body)
    assert done["result_sha256"] == hashlib.sha256(body).hexdigest()
    assert f"more than {MAX_DEPTH} levels deep" in done["encoding_error"]
    assert done["content"].startswith("error: the call was made, but its result was not kept")
    # The deep arguments: recorded as their size only, denied, the model told why.
    turn = [e.payload for e in log if e.type is E.MODEL_TURN][1]
    assert turn["tool_calls"] == [{"id": turn["tool_calls"][0]["id"], "name": "store_tree",
                                   "too_large": len(b'{"tree":') + len(body) + 1}]
    (denied,) = [e.payload for e in log if e.type is E.TOOL_CALL_DENIED]
    assert denied["tool"] == "store_tree" and "unknown_tool" not in denied
    assert f"nest lists or objects more than {MAX_DEPTH} levels deep" in denied["reason"]


def test_the_depth_limit_is_exact(tmp_path: Path) -> None:
    for depth, kept in ((MAX_DEPTH, True), (MAX_DEPTH + 1, False)):
        made: list[str] = []
        agent = Agent(ScriptedModel([calls(("pay", {"order": 7})), reply("done")]),
                      [deep_agent(made, nested(depth)).tools["pay"]])
        store = open_store(f"sqlite:///{tmp_path / f'{depth}.db'}")
        try:
            assert agent.run(store, "r", "t").status == "finished"
            (done,) = [e.payload for e in store.read("r") if e.type is E.TOOL_CALL_COMPLETED]
        finally:
            store.close()
        assert (done["result"] == nested(depth)) is kept
        assert ("encoding_error" not in done) is kept


def test_a_bridged_call_returning_a_value_nested_too_deep_completes_not_kept(
        tmp_path: Path) -> None:
    made: list[int] = []

    def body(ctx: Any) -> Any:
        made.append(1)
        return nested(20_000)

    store = open_store(f"sqlite:///{tmp_path / 'j.db'}")
    try:
        for _ in range(2):  # made, then answered from the log
            with open_run(store, "b1", agent="test:bridge") as run, pytest.raises(
                    ResultNotKeptError, match="levels deep"):
                run.call("pay", {"order": 7}, call_id="c1", body=body)
        log = list(store.read("b1"))
    finally:
        store.close()
    assert made == [1]
    (done,) = [e.payload for e in log if e.type is E.TOOL_CALL_COMPLETED]
    assert done["result_bytes"] == 40_001 and len(done["result_sha256"]) == 64
    assert not any(e.type is E.TOOL_CALL_UNCERTAIN for e in log)


# --- a value with no JSON form, and NaN: one rule under every shell -------------------------

NO_JSON_FORM = {"lock": threading.Lock, "object": object, "nan": lambda: {"rate": math.nan}}


def native_run(store_url: str, made: list[str], value: Any) -> list[Any]:
    @tool(effect="irreversible")
    def make(order: int) -> Any:
        made.append("make")
        return value()

    agent = Agent(ScriptedModel([calls(("make", {"order": 7})), reply("done")]), [make])
    store = open_store(store_url)
    try:
        for _ in range(2):  # a resume of the finished run makes nothing again
            assert agent.run(store, "r", "make order 7").status == "finished"
        return list(store.read("r"))
    finally:
        store.close()


def pydantic_ai_run(store_url: str, made: list[str], value: Any) -> list[Any]:
    pytest.importorskip("pydantic_ai")
    from pydantic_ai import Agent as PydanticAgent
    from pydantic_ai.messages import ModelMessage, TextPart, ToolCallPart
    from pydantic_ai.messages import ModelResponse as PydanticResponse
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from agentjournal.integrations.pydantic_ai import JournalDurability

    def model(messages: list[ModelMessage], info: AgentInfo) -> PydanticResponse:
        if len(messages) == 1:
            return PydanticResponse(parts=[ToolCallPart("make", {"order": 7},
                                                        tool_call_id="c1")])
        return PydanticResponse(parts=[TextPart("done")])

    agent = PydanticAgent(FunctionModel(model), name="maker",
                          capabilities=[JournalDurability(store_url, "r")])

    @agent.tool_plain
    def make(order: int) -> Any:
        made.append("make")
        return value()

    for _ in range(2):  # a resume of the finished run makes nothing again
        assert agent.run_sync("make order 7").output == "done"
    store = open_store(store_url)
    try:
        return list(store.read("r"))
    finally:
        store.close()


def langgraph_run(store_url: str, made: list[str], value: Any,
                  **saver_options: Any) -> list[Any]:
    """The call made by a ToolNode wrapped by exactly_once, then replayed from the
    checkpoint before the tools ran (the same call, answered from the log). Each time the
    model is told the call was made and its result not kept, and the graph goes on."""
    pytest.importorskip("langgraph")
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    from langchain_core.tools import tool as lc_tool
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    from agentjournal.integrations.langgraph import (
        JournalSaver,
        exactly_once,
        invoke,
        thread_run_id,
    )

    @lc_tool
    def make(order: int) -> Any:
        """Make order `order` (an irreversible effect)."""
        made.append("make")
        return value()

    def model(state: MessagesState) -> dict[str, Any]:
        if any(isinstance(m, ToolMessage) for m in state["messages"]):
            return {"messages": [AIMessage("done")]}
        return {"messages": [AIMessage("", tool_calls=[
            {"id": "c1", "name": "make", "args": {"order": 7}}])]}

    store = open_store(store_url)
    try:
        saver = JournalSaver(store, **saver_options)
        calls_ = exactly_once(saver)
        builder = StateGraph(MessagesState)
        builder.add_node("model", model)
        builder.add_node("tools", ToolNode([make], wrap_tool_call=calls_,
                                           awrap_tool_call=calls_.awrap))
        builder.add_edge(START, "model")
        builder.add_conditional_edges("model", tools_condition, ["tools", END])
        builder.add_edge("tools", "model")
        graph = builder.compile(checkpointer=saver)
        conf: Any = {"configurable": {"thread_id": "t1"}}
        ran = [invoke(graph, {"messages": [HumanMessage("make order 7")]}, conf)]
        before = next(s for s in graph.get_state_history(conf) if s.next == ("tools",))
        ran.append(invoke(graph, None, before.config))  # the same call id, again
        log = list(store.read(thread_run_id("t1")))
    finally:
        store.close()
    for out in ran:
        told = [m for m in out["messages"] if isinstance(m, ToolMessage)]
        assert [m.status for m in told] == ["error"]
        assert str(told[0].content).startswith(
            "error: the call was made, but its result was not kept")
        assert out["messages"][-1].content == "done"
    return log


@pytest.mark.parametrize("shell", [native_run, pydantic_ai_run, langgraph_run],
                         ids=["native", "pydantic_ai", "langgraph"])
@pytest.mark.parametrize("value", NO_JSON_FORM, ids=list(NO_JSON_FORM))
@pytest.mark.parametrize("store_url", BACKENDS, indirect=True)
def test_a_result_with_no_json_form_or_a_nan_completes_not_kept_under_every_shell(
        shell: Any, value: str, store_url: str) -> None:
    """The call was made: it completes with its key, its result not kept, and the run
    finishes; never an uncertain call for a person, never a NaN stored as null."""
    made: list[str] = []
    log = shell(store_url, made, NO_JSON_FORM[value])
    assert made == ["make"]
    assert not any(e.type in (E.TOOL_CALL_UNCERTAIN, E.RUN_PAUSED) for e in log)
    (done,) = [e.payload for e in log if e.type is E.TOOL_CALL_COMPLETED]
    assert done["idempotency_key"] and done["result"] is None and done["is_error"] is True
    assert done["encoding_error"]
    assert done["content"].startswith("error: the call was made, but its result was not kept")
    assert ("NaN" in done["encoding_error"]) is (value == "nan")
    assert [e.type for e in log if e.type is E.RUN_FINISHED] == [E.RUN_FINISHED]


#: A result LangGraph would store whole but agentjournal does not keep, and how it is kept.
LANGGRAPH_NOT_KEPT = {
    "deep": (lambda: nested(20_000), {}, b"[" * 20_000 + b"1" + b"]" * 20_000),
    "big": (lambda: "x" * 2_000, {"max_result_bytes": 1_000},
            b'{"tool_message":{"content":"' + b"x" * 2_000 + b'","status":"success"}}'),
}


@pytest.mark.parametrize("case", LANGGRAPH_NOT_KEPT, ids=list(LANGGRAPH_NOT_KEPT))
@pytest.mark.parametrize("store_url", BACKENDS, indirect=True)
def test_a_langgraph_result_too_deep_or_too_big_completes_not_kept_with_its_digest(
        case: str, store_url: str) -> None:
    """Nested 20,000 deep (LangChain's own encoder exhausts the stack on it) or over
    the saver's ``max_result_bytes``: the call completes not kept with the size and
    sha256 of what it returned, the graph goes on, and a replay does not make it again
    (never an uncertain call for a person, never ResultNotKeptError out of the graph)."""
    value, options, body = LANGGRAPH_NOT_KEPT[case]
    made: list[str] = []
    log = langgraph_run(store_url, made, value, **options)
    assert made == ["make"]
    assert not any(e.type in (E.TOOL_CALL_UNCERTAIN, E.RUN_PAUSED) for e in log)
    (done,) = [e.payload for e in log if e.type is E.TOOL_CALL_COMPLETED]
    assert done["idempotency_key"] and done["result"] is None
    assert done["result_bytes"] == len(body)
    assert done["result_sha256"] == hashlib.sha256(body).hexdigest()


def test_a_bridged_call_whose_encoder_refuses_its_value_completes_not_kept(
        tmp_path: Path) -> None:
    """A shell's own encoder (Agents SDK, LangGraph) refusing the value a call returned:
    the call was made, so it completes not kept, as under the loop."""
    made: list[int] = []

    def refuse(value: Any) -> Any:
        raise TypeError(f"cannot encode a {type(value).__name__}")

    def body(ctx: Any) -> Any:
        made.append(1)
        return threading.Lock()

    store = open_store(f"sqlite:///{tmp_path / 'j.db'}")
    try:
        for _ in range(2):  # made, then answered from the log
            with open_run(store, "b1", agent="test:bridge") as run, pytest.raises(
                    ResultNotKeptError, match="cannot encode a lock"):
                run.call("pay", {"order": 7}, call_id="c1", body=body, encode=refuse)
        log = list(store.read("b1"))
    finally:
        store.close()
    assert made == [1]
    assert not any(e.type is E.TOOL_CALL_UNCERTAIN for e in log)
    (done,) = [e.payload for e in log if e.type is E.TOOL_CALL_COMPLETED]
    assert done["idempotency_key"] and done["result"] is None


@pytest.mark.parametrize("store_url", BACKENDS, indirect=True)
def test_a_made_up_tool_name_under_pydantic_ai_reaches_no_byte_of_the_store(
        store_url: str, tmp_path: Path) -> None:
    """The bridge records the framework's turn (its summary and Pydantic AI's own JSON):
    a secret in a tool name the model made up is redacted there like any model text."""
    pytest.importorskip("pydantic_ai")
    from pydantic_ai import Agent as PydanticAgent
    from pydantic_ai.messages import ModelMessage, TextPart, ToolCallPart
    from pydantic_ai.messages import ModelResponse as PydanticResponse
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from agentjournal.integrations.pydantic_ai import JournalDurability

    def model(messages: list[ModelMessage], info: AgentInfo) -> PydanticResponse:
        if len(messages) == 1:
            return PydanticResponse(parts=[
                ToolCallPart(HOSTILE["secret"], {"order": 7}, tool_call_id="c1"),
                ToolCallPart("lookup", {"order": 7}, tool_call_id="c2")])
        return PydanticResponse(parts=[TextPart("order 7 is shipped")])

    agent = PydanticAgent(FunctionModel(model), name="shop",
                          capabilities=[JournalDurability(store_url, "r1")])

    @agent.tool_plain
    def lookup(order: int) -> str:
        return "shipped"

    assert agent.run_sync("where is order 7?").output == "order 7 is shipped"
    # Replayed from the log (the model not asked): the redacted turn is the one the next
    # request was fingerprinted with, so the replay asks what the live run asked.
    assert agent.run_sync("where is order 7?").output == "order 7 is shipped"
    blobs = written_bytes(tmp_path)
    if store_url.startswith("postgresql"):
        blobs += postgres_rows(store_url)
    assert blobs and not any(b"CANARY" in blob for blob in blobs)
    store = open_store(store_url)
    try:
        turn = next(e.payload for e in store.read("r1") if e.type is E.MODEL_TURN)
    finally:
        store.close()
    assert [c["name"] for c in turn["tool_calls"]] == ["tool_[redacted:api_key]", "lookup"]


def test_argument_text_nested_20000_deep_from_a_provider_is_denied_not_raised(
        tmp_path: Path) -> None:
    """A provider's argument string (OpenAI's ``arguments``) nested too deep to decode:
    the call is recorded by its size only and denied; the run goes on."""
    text = '{"tree": ' + "[" * 20_000 + "]" * 20_000 + "}"
    parsed = parse_call("c1", "store_tree", text)
    assert parsed.args == {} and parsed.too_large == len(text)
    made: list[str] = []
    agent = deep_agent(made, None)
    agent.model = ScriptedModel([ModelResponse(tool_calls=[parsed]), reply("done")])
    store = open_store(f"sqlite:///{tmp_path / 'j.db'}")
    try:
        assert agent.run(store, "r", "t").status == "finished"
        (denied,) = [e.payload for e in store.read("r") if e.type is E.TOOL_CALL_DENIED]
    finally:
        store.close()
    assert made == [] and "levels deep" in denied["reason"]


@pytest.mark.parametrize("store_url", BACKENDS, indirect=True)
def test_a_made_up_tool_name_under_langgraph_is_left_to_the_tool_node(store_url: str) -> None:
    """LangGraph's ToolNode hands the wrapper a call to a tool it does not have (``tool``
    None): the wrapper records nothing for it (no start, no key, no span under its name)
    and LangGraph answers it with its own error."""
    pytest.importorskip("langgraph")
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage, HumanMessage
    from langchain_core.tools import tool as lc_tool
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    from agentjournal.integrations.langgraph import JournalSaver, exactly_once, invoke

    asked = [{"id": f"c{i}", "name": name, "args": {"order": 7}}
             for i, name in enumerate(HOSTILE.values())]
    script = [AIMessage("", tool_calls=[*asked, {"id": "cl", "name": "lookup",
                                                 "args": {"order": 7}}]),
              AIMessage("order 7 is shipped")]

    @lc_tool
    def lookup(order: int) -> str:
        """Where an order is."""
        return "shipped"

    def model(state: MessagesState) -> dict[str, Any]:
        answered = sum(isinstance(m, AIMessage) for m in state["messages"])
        chat = GenericFakeChatModel(messages=iter([script[answered]]))
        return {"messages": [chat.invoke(state["messages"])]}

    store = open_store(store_url)
    try:
        saver = JournalSaver(store)
        calls_ = exactly_once(saver)
        builder = StateGraph(MessagesState)
        builder.add_node("model", model)
        builder.add_node("tools", ToolNode([lookup], wrap_tool_call=calls_,
                                           awrap_tool_call=calls_.awrap))
        builder.add_edge(START, "model")
        builder.add_conditional_edges("model", tools_condition, ["tools", END])
        builder.add_edge("tools", "model")
        out = invoke(builder.compile(checkpointer=saver),
                     {"messages": [HumanMessage("where is order 7?")]},
                     {"configurable": {"thread_id": "t1"}})
        (run_id,) = [r.run_id for r in store.list_runs()]
        log = list(store.read(run_id))
    finally:
        store.close()
    assert out["messages"][-1].content == "order 7 is shipped"
    errors = [m.content for m in out["messages"] if getattr(m, "status", None) == "error"]
    assert len(errors) == len(HOSTILE)  # LangGraph's own answer to each
    started = [e.payload["tool"] for e in log if e.type is E.TOOL_CALL_STARTED]
    assert started == ["lookup"]
    assert [e.payload["call_id"] for e in log if e.type is E.TOOL_CALL_COMPLETED] == ["cl"]


def test_a_secret_in_an_agents_sdk_turn_does_not_change_what_its_replay_asks(
        tmp_path: Path) -> None:
    """The Agents SDK's run replays the model's turns as recorded (redacted): the next
    request is fingerprinted over the same, so a secret the model wrote (in its text, in
    a tool name it made up) does not make the resume a NondeterminismError."""
    pytest.importorskip("agents")
    from agents import Agent as SdkAgent
    from agents import function_tool
    from agents.testing import ModelStep, assistant_message, function_call
    from agents.testing import ScriptedModel as SdkScripted

    from agentjournal.integrations.openai_agents import JournalRunner

    def answer(call: Any) -> Any:
        if not any(isinstance(i, dict) and i.get("type") == "function_call_output"
                   for i in call.input):
            return [assistant_message(f"I will use {SECRET}"),
                    function_call("lookup", {"order": 7}, call_id="c1")]
        return [assistant_message("order 7 is shipped")]

    @function_tool
    def lookup(order: int) -> str:
        """Where an order is."""
        return "shipped"

    store = open_store(f"sqlite:///{tmp_path / 'j.db'}")
    try:
        for _ in range(2):  # run, then replayed from the log
            agent = SdkAgent(name="shop", tools=[lookup],
                             model=SdkScripted([ModelStep.respond(answer) for _ in range(4)]))
            result = JournalRunner.run_sync(agent, "where is order 7?", store=store,
                                            run_id="r1")
            assert result.final_output == "order 7 is shipped"
    finally:
        store.close()
    assert not any(b"CANARY" in blob for blob in written_bytes(tmp_path))


# --- tool-call ids the model (or its server) sends --------------------------------------------

#: Call ids a provider may send that are no call id (a plain one is 1 to 128 letters, digits,
#: ``_``, ``-``, ``.``, ``:``): each is model output, kept nowhere, replaced before recording.
HOSTILE_IDS = {
    "huge": "i" * 10_000,
    "quotes": 'call"; DROP TABLE runs; --',
    "braces": "{call}",
    "control": "call\x00one\x1b[31m\r\n",
    "secret_huge": f"call_{SECRET}" + "j" * 200,
}


@pytest.mark.parametrize("store_url", BACKENDS, indirect=True)
def test_a_call_id_that_is_no_call_id_is_replaced_before_it_reaches_a_byte_or_span(
        store_url: str, tmp_path: Path) -> None:
    """The turn records a derived id (``call_{turn}_{place}``) for each, in its calls and
    in the provider items that repeat it; the run pauses for approval of the calls and a
    resume replays that turn from the log: each call is approved, made and answered under
    the same derived id, and a plain provider id (``functions.lookup:0``) is kept."""
    ids = [*HOSTILE_IDS.values(), "functions.lookup:0"]
    turn = ModelResponse(
        tool_calls=[ToolCall(id=cid, name="lookup", args={"order": n})
                    for n, cid in enumerate(ids)],
        items=[{"type": "function_call", "id": f"fc_{n}", "call_id": cid, "name": "lookup",
                "arguments": f'{{"order": {n}}}'} for n, cid in enumerate(ids)],
        provider="openai.responses")
    asked: list[ModelRequest] = []

    def answer(request: ModelRequest) -> ModelResponse:
        asked.append(request)
        return reply("all shipped")

    made: list[int] = []

    @tool(effect="read_only")
    def lookup(order: int) -> dict[str, Any]:
        made.append(order)
        return {"order": order, "status": "shipped"}

    def agent() -> Agent:
        return Agent(ScriptedModel([turn, answer]), [lookup],
                     policy=Rules(require_approval=["lookup"]))

    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    store = open_store(store_url)
    try:
        result = agent().run(store, "ids", "where are my orders?",
                             observer=GenAITracer(provider))
        resumes = 0
        while result.status == "waiting_approval":  # a call at a time; each resume replays
            (ask,) = [e.payload for e in store.read("ids")  # the turn from the log
                      if e.type is E.APPROVAL_REQUESTED][resumes:]
            decide_approval(store, "ids", ask["approval_id"], approved=True, by="test")
            result = agent().run(store, "ids", observer=GenAITracer(provider))
            resumes += 1
        log = list(store.read("ids"))
    finally:
        store.close()

    assert resumes == len(ids)
    asks = [e.payload for e in log if e.type is E.APPROVAL_REQUESTED]

    assert result.status == "finished" and result.outcome == "all shipped"
    assert sorted(made) == list(range(len(ids)))  # each call made once
    (recorded,) = [e.payload for e in log if e.type is E.MODEL_TURN][:1]
    derived = [f"call_0_{n}" for n in range(len(HOSTILE_IDS))]
    assert [c["id"] for c in recorded["tool_calls"]] == [*derived, "functions.lookup:0"]
    assert [i["call_id"] for i in recorded["items"]] == [*derived, "functions.lookup:0"]
    assert all("provider_id" not in c for c in recorded["tool_calls"])
    assert [a["call_id"] for a in asks] == [*derived, "functions.lookup:0"]
    done = [e.payload["call_id"] for e in log if e.type is E.TOOL_CALL_COMPLETED]
    assert sorted(done) == sorted([*derived, "functions.lookup:0"])
    # The model reads each result paired with its call under the derived id.
    (request,) = asked
    (assistant,) = [m for m in request.messages if m.role == "assistant"]
    assert [c.id for c in assistant.tool_calls] == [*derived, "functions.lookup:0"]
    assert sorted(m.tool_call_id for m in request.messages if m.role == "tool") == sorted(
        [*derived, "functions.lookup:0"])

    blobs = written_bytes(tmp_path)
    if store_url.startswith("postgresql"):
        blobs += postgres_rows(store_url)
    assert blobs
    for blob in blobs:
        assert b"CANARY" not in blob and b"i" * 200 not in blob and b"j" * 200 not in blob
        assert b"DROP TABLE" not in blob and b"{call}" not in blob
        assert b"call\\u0000one" not in blob and b"call\x00one" not in blob
    spans = [as_dict(s) for s in exporter.get_finished_spans()]
    call_ids = {s["attributes"]["gen_ai.tool.call.id"] for s in spans
                if "gen_ai.tool.call.id" in s["attributes"]}
    assert call_ids == {*derived, "functions.lookup:0"}
    exported = repr(spans)
    assert "CANARY" not in exported and "i" * 200 not in exported
    assert "DROP TABLE" not in exported and "{call}" not in exported
