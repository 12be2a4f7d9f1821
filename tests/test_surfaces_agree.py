"""The viewer and the CLI say the same of every run: on a store holding native, Pydantic
AI, LangGraph and Agents SDK runs (each framework's own agent, scripted by its own test
model), finished, stopped for a person (an approval, a call whose effect is unknown) and
interrupted, the viewer's JSON pages (the runs list, a run's page) and the CLI's
`agentjournal runs --json` and `agentjournal show RUN --json` give the same status,
reason and counts, run by run."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("starlette")

from click.testing import CliRunner
from starlette.testclient import TestClient

from agentjournal import open_store
from agentjournal.cli import cli
from agentjournal.ui import Viewer

from .conftest import BACKENDS
from .ui_runs import approval_run, interrupted_run, long_run, markup_run, uncertain_run

TASK = "post x"


def posting(lose: bool) -> Callable[[str], str]:
    """A tool whose connection drops after the request left (its effect is unknown)
    when ``lose``; else it posts."""
    def post(name: str) -> str:
        """Post an entry."""
        if lose:
            raise ConnectionResetError("the connection dropped after the request was sent")
        return "posted " + name
    return post


def pydantic_run(url: str, run_id: str, lose: bool) -> None:
    from pydantic_ai import Agent, DeferredToolRequests
    from pydantic_ai.messages import (
        ModelMessage,
        ModelResponse,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
    )
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from agentjournal.integrations.pydantic_ai import JournalDurability

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if not any(isinstance(p, ToolReturnPart) for m in messages
                   for p in getattr(m, "parts", [])):
            return ModelResponse(parts=[ToolCallPart("post", {"name": "x"}, "call-x")])
        return ModelResponse(parts=[TextPart("done")])

    agent = Agent(FunctionModel(model), name="poster", output_type=[str, DeferredToolRequests],
                  capabilities=[JournalDurability(url, run_id)])
    agent.tool_plain(posting(lose))
    agent.run_sync(TASK)


def sdk_run(url: str, run_id: str, lose: bool) -> None:
    from agents import Agent, function_tool
    from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call

    from agentjournal.integrations.openai_agents import JournalRunner

    def answer(call: Any) -> Any:
        if not any(isinstance(i, dict) and i.get("type") == "function_call_output"
                   for i in call.input):
            return [function_call("post", {"name": "x"}, call_id="call_x")]
        return [assistant_message("done")]

    agent = Agent(name="poster", model=ScriptedModel([ModelStep.respond(answer)] * 4),
                  tools=[function_tool(posting(lose))])
    store = open_store(url)
    try:
        JournalRunner.run_sync(agent, TASK, store=store, run_id=run_id,
                               policies={"post": "irreversible"})
    finally:
        store.close()


def langgraph_run(url: str, thread_id: str, lose: bool) -> None:
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    from agentjournal.integrations.langgraph import JournalSaver, ToolEffect, exactly_once
    from agentjournal.integrations.langgraph import invoke as lg_invoke

    def model(state: MessagesState) -> dict[str, Any]:
        if not any(isinstance(m, ToolMessage) for m in state["messages"]):
            return {"messages": [AIMessage("", tool_calls=[
                {"id": "call-x", "name": "post", "args": {"name": "x"}}])]}
        return {"messages": [AIMessage("done")]}

    store = open_store(url)
    try:
        saver = JournalSaver(store)
        builder = StateGraph(MessagesState)
        builder.add_node("model", model)
        builder.add_node("tools", ToolNode([tool(posting(lose))], wrap_tool_call=exactly_once(
            saver, {"post": ToolEffect("irreversible")})))
        builder.add_edge(START, "model")
        builder.add_conditional_edges("model", tools_condition, ["tools", END])
        builder.add_edge("tools", "model")
        graph = builder.compile(checkpointer=saver)
        lg_invoke(graph, {"messages": [HumanMessage(TASK)]},
                  {"configurable": {"thread_id": thread_id}})
    finally:
        store.close()


def made(url: str) -> list[str]:
    """Runs of every kind on the store at ``url``: finished, stopped for a person,
    interrupted. Their run ids."""
    from agentjournal.integrations.langgraph import thread_run_id

    store = open_store(url)
    try:
        approval_run(store, "native-approval")
        uncertain_run(store, "native-uncertain")
        markup_run(store, "native-done")
        long_run(store, "native-long", 12)
        interrupted_run(store, "native-interrupted")
    finally:
        store.close()
    for lose, name in ((False, "done"), (True, "lost")):
        pydantic_run(url, f"pydantic-{name}", lose)
        sdk_run(url, f"sdk-{name}", lose)
        langgraph_run(url, f"graph-{name}", lose)
    return ["native-approval", "native-uncertain", "native-done", "native-long",
            "native-interrupted", "pydantic-done", "pydantic-lost", "sdk-done", "sdk-lost",
            thread_run_id("graph-done"), thread_run_id("graph-lost")]


def cli_json(*args: str) -> Any:
    result = CliRunner().invoke(cli, [*args, "--json"],
                                env={"COLUMNS": "200", "AGENTJOURNAL_STORE": ""})
    assert result.exit_code in (0, 1), (args, result.stdout, result.stderr)
    return json.loads(result.stdout)


# --- what each surface says of a run, in the same words ----------------------------------


def viewer_row(row: dict[str, Any]) -> dict[str, Any]:
    return {"status": row["status"], "events": row["events"], "approvals": row["approvals"],
            "uncertain": row["uncertain"], "unpriced_turns": row["unpriced_turns"]}


def cli_row(row: dict[str, Any]) -> dict[str, Any]:
    return {"status": row["status"], "events": row["events"], "approvals": row["approvals"],
            "uncertain": row["uncertain"], "unpriced_turns": row["unpriced_turns"]}


def viewer_run(page: dict[str, Any]) -> dict[str, Any]:
    run = page["run"]
    return {"status": run["status"], "reason": run["pause_reason"], "events": run["events"],
            "turns": run["turns"], "tool_calls": run["tool_calls"], "resumes": run["resumes"],
            "approvals": len(run["approvals"]), "uncertain": len(run["uncertain"]),
            "tokens": [run["usage"]["input_tokens"], run["usage"]["output_tokens"]],
            "agent": run["agent"], "escalated": run["escalation"] is not None}


def cli_run(shown: dict[str, Any]) -> dict[str, Any]:
    state = shown["state"]
    return {"status": state["status"], "reason": state["pause_reason"],
            "events": len(shown["events"]), "turns": state["turns"],
            "tool_calls": state["tool_calls"], "resumes": state["resumes"],
            "approvals": len(state["approvals"]), "uncertain": len(state["pending"]),
            "tokens": [state["usage"]["input_tokens"], state["usage"]["output_tokens"]],
            "agent": state["agent"], "escalated": state["escalation"] is not None}


@pytest.mark.parametrize("store_url", BACKENDS, indirect=True)
def test_the_viewer_and_the_cli_say_the_same_of_every_run(store_url: str) -> None:
    pytest.importorskip("pydantic_ai")
    pytest.importorskip("agents")
    pytest.importorskip("langgraph")
    run_ids = made(store_url)
    viewer = Viewer(store_url)
    try:
        client = TestClient(viewer.app, base_url="http://127.0.0.1")
        listed = client.get("/runs.json?per_page=500").json()
        pages = {r: client.get(f"/runs/{r}.json").json() for r in run_ids}
    finally:
        viewer.close()
    in_viewer = {row["run_id"]: viewer_row(row) for row in listed["runs"]}
    in_cli = {row["run_id"]: cli_row(row) for row in cli_json("runs", "--all",
                                                                "--store", store_url)}
    assert sorted(in_viewer) == sorted(in_cli) == sorted(run_ids)
    for run_id in run_ids:
        assert in_viewer[run_id] == in_cli[run_id], run_id
        shown = cli_json("show", run_id, "--store", store_url)
        assert viewer_run(pages[run_id]) == cli_run(shown), run_id
    # The store holds what the test means it to: every kind of stop, each framework's.
    statuses = {r: in_cli[r]["status"] for r in run_ids}
    assert {"finished", "paused", "running", "waiting_approval"} <= set(statuses.values())
    assert in_cli["native-approval"]["approvals"] == 1
    assert all(in_cli[r]["uncertain"] == 1 for r in ("native-uncertain", "pydantic-lost",
                                                       "sdk-lost", run_ids[-1])), in_cli
    assert all(statuses[r] == "finished" for r in ("pydantic-done", "sdk-done", run_ids[-2]))
