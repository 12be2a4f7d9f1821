"""Graphs run inside a thread's graph, on every backend: a compiled subgraph used as a
node, and a graph invoked inside a tool call (its ToolNode wrapped by ``exactly_once``,
or not). Each posts corrections to the demo ledger, a process of its own that honours
idempotency keys, with the key ``current_call()`` gives: a call of an inner graph never
sends its parent call's key (the ledger would answer the second correction from the
first: an effect lost)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph.graph")

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from agentjournal import EventType, JournalError, fold, open_store
from agentjournal.demo.ledger import FENCING_HEADER, LedgerService, http_json
from agentjournal.integrations.langgraph import (
    JournalSaver,
    ToolEffect,
    ainvoke,
    current_call,
    exactly_once,
    invoke,
    thread_run_id,
)

from .conftest import BACKENDS

E = EventType
THREAD = {"configurable": {"thread_id": "t-1"}}


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[LedgerService]:
    with LedgerService(tmp_path / "ledger.db") as service:
        yield service


@pytest.fixture
def saver(store_url: str) -> Iterator[JournalSaver]:
    store = open_store(store_url)
    with JournalSaver(store) as s:
        yield s
    store.close()


def tool_node(tools: list[Any], saver: JournalSaver, *, wrapped: bool = True,
              handles_errors: bool = False) -> ToolNode:
    if not wrapped:
        return ToolNode(tools, handle_tool_errors=handles_errors)
    calls = exactly_once(saver, {"corrector": ToolEffect("idempotent")})
    return ToolNode(tools, wrap_tool_call=calls, awrap_tool_call=calls.awrap)


def poster(ledger: str) -> Any:
    @tool
    def post_correction(correction_id: str, amount: int) -> str:
        """Apply correction `correction_id` of `amount` cents to ledger-a."""
        ctx = current_call()
        body = {"correction_id": correction_id, "ledger": "ledger-a", "amount": amount}
        status, applied = http_json("POST", f"{ledger}/corrections", body,
                                    {"Idempotency-Key": ctx.key,
                                     FENCING_HEADER: str(ctx.epoch)})
        return f"{correction_id}: {status} {applied.get('status') or applied.get('error')}"
    return post_correction


def run(graph: Any, how: str) -> Any:
    """The graph on thread t-1, by ``invoke`` or ``ainvoke`` (its ToolNode's awrap)."""
    given = {"messages": [HumanMessage("go")]}
    if how == "ainvoke":
        return asyncio.run(ainvoke(graph, given, THREAD))
    return invoke(graph, given, THREAD)


def ask(name: str, call_id: str, **args: Any) -> dict[str, Any]:
    return {"messages": [AIMessage("", tool_calls=[{"name": name, "id": call_id,
                                                    "args": args}])]}


def corrections(state: MessagesState) -> dict[str, Any]:
    """The corrector's model: C-1 then C-2 (ids call_1, call_2: the parent's ids too)."""
    done = sum(isinstance(m, ToolMessage) and str(m.content)[:3] in ("C-1", "C-2")
               for m in state["messages"])
    if done < 2:
        n = done + 1
        return ask("post_correction", f"call_{n}", correction_id=f"C-{n}", amount=100 * n)
    return {"messages": [AIMessage("corrected")]}


def corrector_graph(ledger: str, saver: JournalSaver, *, wrapped: bool = True,
                    handles_errors: bool = False) -> Any:
    builder = StateGraph(MessagesState)
    builder.add_node("model", corrections)
    builder.add_node("tools", tool_node([poster(ledger)], saver, wrapped=wrapped,
                                        handles_errors=handles_errors))
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", tools_condition, ["tools", END])
    builder.add_edge("tools", "model")
    return builder.compile()


def delegating_graph(ledger: str, saver: JournalSaver, *, inner_wrapped: bool,
                     inner_handles_errors: bool = False) -> Any:
    """A graph whose tool ``corrector`` (idempotent, wrapped) invokes the corrector graph."""
    inner = corrector_graph(ledger, saver, wrapped=inner_wrapped,
                            handles_errors=inner_handles_errors)

    @tool
    def corrector(task: str) -> str:
        """Have the corrections a ledger needs made."""
        return str(inner.invoke({"messages": [HumanMessage(task)]})["messages"][-1].content)

    def delegate(state: MessagesState) -> dict[str, Any]:
        if not any(isinstance(m, ToolMessage) for m in state["messages"]):
            return ask("corrector", "call_1", task="close ledger-a")
        return {"messages": [AIMessage(f"delegated: {state['messages'][-1].content}")]}

    builder = StateGraph(MessagesState)
    builder.add_node("model", delegate)
    builder.add_node("tools", tool_node([corrector], saver))
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", tools_condition, ["tools", END])
    builder.add_edge("tools", "model")
    return builder.compile(checkpointer=saver)


@pytest.mark.parametrize("store_url", BACKENDS, indirect=True)
def test_a_subgraph_used_as_a_node_makes_each_of_its_calls_with_a_key_of_its_own(
        saver: JournalSaver, ledger: LedgerService) -> None:
    def first(state: MessagesState) -> dict[str, Any]:  # C-0, with the id C-1 has below
        if not any(isinstance(m, ToolMessage) for m in state["messages"]):
            return ask("post_correction", "call_1", correction_id="C-0", amount=5)
        return {"messages": [AIMessage("now the corrector")]}

    builder = StateGraph(MessagesState)
    builder.add_node("model", first)
    builder.add_node("tools", tool_node([poster(ledger.url)], saver))
    builder.add_node("corrector", corrector_graph(ledger.url, saver))
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", tools_condition, {"tools": "tools", END: "corrector"})
    builder.add_edge("tools", "model")
    builder.add_edge("corrector", END)
    out = invoke(builder.compile(checkpointer=saver), {"messages": [HumanMessage("go")]}, THREAD)
    assert out["messages"][-1].content == "corrected"
    effects = ledger.effects()
    assert effects["corrections"] == {"C-0": 1, "C-1": 1, "C-2": 1} and effects["replays"] == 0
    keys = [e.payload["key"] for e in saver.store.read(thread_run_id("t-1"))
            if e.type is E.TOOL_CALL_STARTED]
    assert len(keys) == len(set(keys)) == 3


@pytest.mark.parametrize("store_url", BACKENDS, indirect=True)
@pytest.mark.parametrize("how", ["invoke", "ainvoke"])
def test_a_graph_run_in_a_tool_call_makes_each_of_its_calls_with_a_key_of_its_own(
        saver: JournalSaver, ledger: LedgerService, how: str) -> None:
    graph = delegating_graph(ledger.url, saver, inner_wrapped=True)
    out = run(graph, how)
    assert out["messages"][-1].content == "delegated: corrected"
    effects = ledger.effects()
    assert effects["corrections"] == {"C-1": 1, "C-2": 1} and effects["replays"] == 0
    started = [(e.payload["tool"], e.payload["key"])
               for e in saver.store.read(thread_run_id("t-1")) if e.type is E.TOOL_CALL_STARTED]
    assert [tool for tool, _ in started] == ["corrector", "post_correction", "post_correction"]
    assert len({key for _, key in started}) == 3


@pytest.mark.parametrize("store_url", BACKENDS, indirect=True)
@pytest.mark.parametrize("how", ["invoke", "ainvoke"])
def test_a_graph_run_in_a_tool_call_with_tools_not_wrapped_is_refused_the_calls_key(
        saver: JournalSaver, ledger: LedgerService, how: str) -> None:
    # Its tools are not journaled, and each read the outer call's context: the ledger
    # answered C-2 from C-1 (422) and the graph finished with C-2 never applied. Refused
    # now, before either is sent, saying what to do; the call is left to the usual rules.
    graph = delegating_graph(ledger.url, saver, inner_wrapped=False)
    with pytest.raises(JournalError) as refused:
        run(graph, how)
    message = str(refused.value)
    assert "tool call 'corrector' (call_1)" in message and "exactly_once" in message
    effects = ledger.effects()
    assert effects["corrections"] == {} and effects["replays"] == 0
    log = list(saver.store.read(thread_run_id("t-1")))
    errors = [e.payload["error"] for e in log if e.type is E.TOOL_CALL_UNCERTAIN]
    assert len(errors) == 3 and all("exactly_once" in e for e in errors)  # idempotent: retried
    state = fold(log)  # left uncertain (not completed), for the usual rules
    assert [p.tool for p in state.pending.values()] == ["corrector"] and not state.completed


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_a_refused_read_the_inner_graph_answers_itself_does_not_complete_the_call(
        saver: JournalSaver, ledger: LedgerService) -> None:
    # Its ToolNode turns every error into the model's message (handle_tool_errors=True):
    # the inner graph finishes "corrected" with nothing sent. Not a result to complete
    # the outer call with (a resume would answer it from the log): refused the same way.
    graph = delegating_graph(ledger.url, saver, inner_wrapped=False, inner_handles_errors=True)
    with pytest.raises(JournalError, match="exactly_once"):
        run(graph, "invoke")
    assert ledger.effects()["corrections"] == {}
    state = fold(list(saver.store.read(thread_run_id("t-1"))))
    assert [p.tool for p in state.pending.values()] == ["corrector"] and not state.completed
