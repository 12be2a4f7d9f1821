"""JournalSaver under real LangGraph graphs, on every backend: growing message threads,
interrupts and Command(resume=...), subgraphs, fencing between two savers, and a thread
deleted, archived by gc, restored and resumed."""

from __future__ import annotations

import json
import operator
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest

pytest.importorskip("langgraph.graph")

from click.testing import CliRunner
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import Command, interrupt

from agentjournal import (
    ArchivedRunError,
    EventType,
    FencedError,
    LeaseHeldError,
    open_store,
)
from agentjournal.cli import cli
from agentjournal.integrations.langgraph import (
    JournalSaver,
    invoke,
    thread_run_id,
)
from agentjournal.retention import RetentionPolicy, gc, restore
from agentjournal.store import Store

from .conftest import backend_params

E = EventType


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    s = open_store(store_url)
    yield s
    s.close()


def chat_graph(saver: JournalSaver) -> Any:
    """A node that answers each human message, so the history grows by two a turn."""
    def answer(state: MessagesState) -> dict[str, Any]:
        asked = state["messages"][-1].content
        return {"messages": [AIMessage(f"answer to {asked}: " + "x" * 200)]}

    builder = StateGraph(MessagesState)
    builder.add_node("answer", answer)
    builder.add_edge(START, "answer")
    builder.add_edge("answer", END)
    return builder.compile(checkpointer=saver)


def config(thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}}


def graph_events(store: Store, thread: str, kind: EventType) -> list[Any]:
    return [e for e in store.read(thread_run_id(thread)) if e.type is kind]


@backend_params()
def test_a_growing_thread_stores_each_step_in_constant_bytes(
        request: pytest.FixtureRequest, store: Store, store_url: str) -> None:
    if not store_url.startswith("sqlite") and not request.config.getoption("--slow"):
        pytest.skip("on this backend with --slow (40 invocations; the encoding is the same)")
    saver = JournalSaver(store)
    graph = chat_graph(saver)
    for turn in range(40):
        result = invoke(graph, {"messages": [HumanMessage(f"q{turn}")]}, config("chat"))
    assert len(result["messages"]) == 80
    assert result["messages"][-1].content.startswith("answer to q39")
    # A fresh saver (another process) reads the same history back from the log alone.
    again = JournalSaver(store).get_tuple(config("chat"))
    assert again is not None
    assert [m.content for m in again.checkpoint["channel_values"]["messages"]] == [
        m.content for m in result["messages"]]
    # Only changed channels are stored, a list a chunk at a time: the bytes a late
    # checkpoint adds are no more than an early one's (the history is 8x longer by then).
    sizes = [len(json.dumps(e.payload.get("blobs", {})))
             for e in graph_events(store, "chat", E.GRAPH_CHECKPOINT)]
    early, late = max(sizes[10:40]), max(sizes[-30:])
    assert late <= early * 1.5
    saver.close()


@backend_params()
def test_an_interrupt_resumes_with_command_and_a_subgraph_shares_the_run(store: Store) -> None:
    class S(TypedDict):
        log: Annotated[list[str], operator.add]

    def ask(state: S) -> dict[str, Any]:
        return {"log": [f"approved:{interrupt('approve?')}"]}

    sub = StateGraph(S)
    sub.add_node("inner", lambda s: {"log": ["inner"]})
    sub.add_edge(START, "inner")
    sub.add_edge("inner", END)
    builder = StateGraph(S)
    builder.add_node("sub", sub.compile())
    builder.add_node("ask", ask)
    builder.add_edge(START, "sub")
    builder.add_edge("sub", "ask")
    builder.add_edge("ask", END)
    # LangGraph's own InMemorySaver gives the reference outcome.
    memory = builder.compile(checkpointer=InMemorySaver())
    expected_first = memory.invoke({"log": ["start"]}, config("hitl"))
    expected_done = memory.invoke(Command(resume="yes"), config("hitl"))
    saver = JournalSaver(store)
    graph = builder.compile(checkpointer=saver)
    first = invoke(graph, {"log": ["start"]}, config("hitl"))
    assert first["log"] == expected_first["log"] and "__interrupt__" in first
    assert not graph_events(store, "hitl", E.RUN_FINISHED)  # it waits for a person
    done = invoke(graph, Command(resume="yes"), config("hitl"))
    assert done == expected_done and done["log"][-1] == "approved:yes"
    spaces = {e.payload["ns"] for e in graph_events(store, "hitl", E.GRAPH_CHECKPOINT)}
    assert "" in spaces and any(ns.startswith("sub:") for ns in spaces)
    assert len(graph_events(store, "hitl", E.RUN_FINISHED)) == 1
    saver.close()


@backend_params()
def test_a_second_saver_is_refused_while_the_first_holds_the_thread(store_url: str) -> None:
    first_store, second_store = open_store(store_url), open_store(store_url)
    first = JournalSaver(first_store, owner="worker-a", ttl=60)
    second = JournalSaver(second_store, owner="worker-b", ttl=60)
    graph_a, graph_b = chat_graph(first), chat_graph(second)
    graph_a.invoke({"messages": [HumanMessage("one")]}, config("shared"), durability="sync")
    with pytest.raises(LeaseHeldError) as held:
        graph_b.invoke({"messages": [HumanMessage("two")]}, config("shared"),
                       durability="sync")
    # The error names the thread as the caller knows it, and the run that holds it.
    assert "LangGraph thread 'shared'" in str(held.value)
    assert thread_run_id("shared") in str(held.value) and held.value.owner == "worker-a"
    first.release("shared")
    graph_b.invoke({"messages": [HumanMessage("two")]}, config("shared"), durability="sync")
    # The first saver took the lease again? No: the second holds it now, and the first's
    # stale journal (if it kept one) would be fenced. Taking it while held is refused.
    with pytest.raises(LeaseHeldError):
        graph_a.invoke({"messages": [HumanMessage("three")]}, config("shared"),
                       durability="sync")
    events = list(first_store.read(thread_run_id("shared")))
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert len({e.epoch for e in events}) == 2  # one writer at a time, each its own epoch
    second.close()
    first.close()
    first_store.close()
    second_store.close()


@backend_params()
def test_a_writer_whose_lease_was_taken_over_is_fenced(store_url: str) -> None:
    a_store, b_store = open_store(store_url), open_store(store_url)
    a = JournalSaver(a_store, owner="worker-a", ttl=60)
    graph_a = chat_graph(a)
    graph_a.invoke({"messages": [HumanMessage("one")]}, config("fenced"), durability="sync")
    journal = a.hold("fenced")
    journal.close()  # its heartbeat stops and its lease goes, but the saver still uses it
    b = JournalSaver(b_store, owner="worker-b", ttl=60)
    chat_graph(b).invoke({"messages": [HumanMessage("two")]}, config("fenced"),
                         durability="sync")
    with pytest.raises(FencedError) as fenced:
        graph_a.invoke({"messages": [HumanMessage("three")]}, config("fenced"),
                       durability="sync")
    assert "LangGraph thread 'fenced'" in str(fenced.value)
    b.close()
    a_store.close()
    b_store.close()


@backend_params()
def test_a_tool_call_of_a_thread_taken_over_is_fenced_and_names_the_thread(
        store_url: str) -> None:
    from langchain_core.tools import tool
    from langgraph.prebuilt import ToolNode

    from agentjournal.integrations.langgraph import exactly_once

    a_store, b_store = open_store(store_url), open_store(store_url)
    a = JournalSaver(a_store, owner="worker-a", ttl=60)
    b = JournalSaver(b_store, owner="worker-b", ttl=60)
    made: list[str] = []

    @tool
    def post(label: str) -> str:
        """Apply the effect named `label`."""
        made.append(label)
        return "applied"

    def model(state: MessagesState) -> dict[str, Any]:
        a.hold("taken").close()  # A's lease goes while its graph runs, and B takes over
        b.hold("taken")
        return {"messages": [AIMessage("", tool_calls=[
            {"id": "call-1", "name": "post", "args": {"label": "x"}}])]}

    builder = StateGraph(MessagesState)
    builder.add_node("model", model)
    builder.add_node("tools", ToolNode([post], wrap_tool_call=exactly_once(a)))
    builder.add_edge(START, "model")
    builder.add_edge("model", "tools")
    builder.add_edge("tools", END)
    # durability="exit": no checkpoint is put before the call, whose start is fenced.
    with pytest.raises(FencedError) as fenced:
        invoke(builder.compile(checkpointer=a), {"messages": [HumanMessage("go")]},
               config("taken"), durability="exit")
    assert str(fenced.value).startswith("LangGraph thread 'taken': run ")
    assert made == []  # the effect was not made
    assert graph_events(a_store, "taken", E.TOOL_CALL_STARTED) == []
    b.close()
    a_store.close()
    b_store.close()


@backend_params()
def test_delete_thread_then_gc_archive_restore_and_resume(store: Store, tmp_path: Path) -> None:
    saver = JournalSaver(store)
    graph = chat_graph(saver)
    invoke(graph, {"messages": [HumanMessage("gone")]}, config("deleted"))
    saver.delete_thread("deleted")
    assert saver.get_tuple(config("deleted")) is None
    again = invoke(graph, {"messages": [HumanMessage("anew")]}, config("deleted"))
    assert again["messages"][0].content == "anew"  # a fresh thread
    reader = JournalSaver(store)  # (a fresh handle reads the second generation's head)
    latest = reader.get_tuple(config("deleted"))
    assert latest is not None and latest.checkpoint["channel_values"]["messages"][
        0].content == "anew"
    assert reader._threads["deleted"].run_id == thread_run_id("deleted", 2)
    reader.close()

    invoke(graph, {"messages": [HumanMessage("kept")]}, config("archived"))
    archive = f"file://{tmp_path / 'archive'}"
    report = gc(store, RetentionPolicy(finished_older_than=timedelta(0), archive=archive))
    assert report.archived >= 1 and store.tombstone(thread_run_id("archived")) is not None
    fresh = JournalSaver(store)
    with pytest.raises(ArchivedRunError):
        fresh.get_tuple(config("archived"))
    restore(store, thread_run_id("archived"), archive)
    resumed = invoke(chat_graph(fresh), {"messages": [HumanMessage("more")]},
                     config("archived"))
    assert [m.content[:9] for m in resumed["messages"]] == [
        "kept", "answer to", "more", "answer to"]
    kinds = [e.type for e in store.read(thread_run_id("archived"))]
    assert kinds.count(E.RUN_FINISHED) == 2 and E.RUN_RESUMED in kinds
    fresh.close()
    saver.close()


@backend_params()
def test_show_and_events_display_a_thread(store: Store, store_url: str) -> None:
    saver = JournalSaver(store)
    invoke(chat_graph(saver), {"messages": [HumanMessage("hello")]}, config("shown"))
    saver.close()
    runner = CliRunner()
    shown = runner.invoke(cli, ["show", "shown", "--store", store_url, "--json"])
    assert shown.exit_code == 0, shown.output
    thread = json.loads(shown.output)["thread"]
    assert thread["thread_id"] == "shown" and thread["checkpoints"] == 3
    assert thread["latest"]["step"] == 1 and thread["input_not_yet_checkpointed"] is False
    text = runner.invoke(cli, ["show", "shown", "--store", store_url])
    assert "LangGraph thread shown" in text.output and "graph_checkpoint" in text.output
    lines = runner.invoke(cli, ["events", "shown", "--store", store_url]).output.splitlines()
    kinds = [json.loads(line)["type"] for line in lines]
    assert kinds[:4] == ["run_started", "user_message", "graph_input", "graph_checkpoint"]
    assert json.loads(lines[0])["payload"]["input"] == {"thread_id": "shown"}
    runs = runner.invoke(cli, ["runs", "--store", store_url, "--json"])
    (row,) = json.loads(runs.output)
    assert row["agent"] == "langgraph" and row["status"] == "finished"
    # verify takes the thread id as show does (the same resolution), and checks its run.
    verified = runner.invoke(cli, ["verify", "shown", "--store", store_url, "--json"])
    assert verified.exit_code == 0, verified.output
    (report,) = json.loads(verified.output)
    assert report["run_id"] == thread_run_id("shown") and report["ok"] is True
    assert report["events"] == len(lines)


@backend_params()
@pytest.mark.parametrize("how", ["ainvoke", "astream"])
def test_async_graph_tools_run_once_through_the_call_protocol(store: Store, how: str) -> None:
    """ainvoke (or astream), awrap_tool_call: an async ToolNode's call is started durably,
    completed, and when LangGraph runs the node again (a replay from an earlier
    checkpoint) answered from the log, the tool not called."""
    import asyncio

    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.tools import tool
    from langgraph.prebuilt import ToolNode, tools_condition

    from agentjournal.integrations.langgraph import (
        ToolEffect,
        ainvoke,
        astream,
        current_call,
        exactly_once,
    )

    made: list[str] = []

    @tool
    async def charge(order: str) -> str:
        """Charge an order."""
        made.append(current_call().key)
        return f"charged {order}"

    script = [AIMessage("", tool_calls=[{"id": "c-1", "name": "charge",
                                         "args": {"order": "o-9"}}]), AIMessage("done")]

    async def model(state: MessagesState) -> dict[str, Any]:
        answered = sum(isinstance(m, AIMessage) for m in state["messages"])
        chat = GenericFakeChatModel(messages=iter([script[answered]]))
        return {"messages": [await chat.ainvoke(state["messages"])]}

    saver = JournalSaver(store)
    calls = exactly_once(saver, {"charge": ToolEffect("irreversible", identity=("order",))})
    builder = StateGraph(MessagesState)
    builder.add_node("model", model)
    builder.add_node("tools", ToolNode([charge], wrap_tool_call=calls,
                                       awrap_tool_call=calls.awrap))
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", tools_condition, ["tools", END])
    builder.add_edge("tools", "model")
    graph = builder.compile(checkpointer=saver)

    async def run(given: Any, conf: Any) -> Any:
        if how == "ainvoke":
            return await ainvoke(graph, given, conf)
        states = [s async for s in astream(graph, given, conf, stream_mode="values")]
        return states[-1]  # the state after each step, as it comes

    out = asyncio.run(run({"messages": [HumanMessage("charge o-9")]}, config("async")))
    assert [m.content for m in out["messages"]][-2:] == ["charged o-9", "done"]
    assert len(made) == 1 and len(made[0]) == 64  # the idempotency key the tool sent
    log = list(store.read(thread_run_id("async")))
    assert log[-1].type is E.RUN_FINISHED  # and the thread's lease is free again:
    store.release(store.acquire(thread_run_id("async"), "someone else", ttl=30))
    # Time travel: replaying from the checkpoint before the tools node runs the node
    # again with the same call (LangGraph re-executes it); the journal serves it.
    before_tools = next(s for s in graph.get_state_history(config("async"))
                        if s.next == ("tools",))
    replayed = asyncio.run(run(None, before_tools.config))
    assert [m.content for m in replayed["messages"]][-2:] == ["charged o-9", "done"]
    assert len(made) == 1
    kinds = [e.type for e in store.read(thread_run_id("async"))]
    assert kinds.count(E.TOOL_CALL_STARTED) == 1 and kinds.count(E.TOOL_CALL_COMPLETED) == 1
    saver.close()
