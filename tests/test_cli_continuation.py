"""After a person's decision, the CLI names what continues *that* run, and the call it names
continues it; a verdict "it happened" given without a result reaches the model in one
form under every shell (the native loop, Pydantic AI, LangGraph, the Agents SDK).

Each shell runs a real agent of its framework in this process, scripted: its one tool's
connection drops after the effect (the call is uncertain, no lookup), a person resolves it
with `agentjournal resolve --happened` and no --result, then the run is continued with
the call the CLI printed; the model's next turn records the tool result it was given."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from agentjournal import EventType, RunMismatchError, fold, open_store
from agentjournal.cli import cli
from agentjournal.decisions import NO_RESULT_GIVEN

from . import test_worker as workers
from .conftest import BACKENDS, fresh_url

E = EventType
RUN = "cont-1"
TASK = "post x"


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), env={"COLUMNS": "200", "AGENTJOURNAL_STORE": ""})


def uncertain_key(url: str, run_id: str) -> str:
    store = open_store(url)
    try:
        (pending,) = fold(store.read(run_id)).pending.values()
    finally:
        store.close()
    return pending.key


def resolved(url: str, run_id: str) -> str:
    """`agentjournal resolve RUN KEY --happened` with no --result; its stdout."""
    result = invoke("resolve", run_id, uncertain_key(url, run_id)[:16], "--happened",
                    "--by", "ana", "--store", url)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return result.stdout


# --- one scripted agent per shell: the run, then its continuation -----------------------
#
# Each returns (start, go_on): start(task) runs until a person is needed; go_on()
# continues it as the hint says; ``seen`` collects the tool result the model was given.

NATIVE = '''
from agentjournal import Agent, ScriptedModel, calls, reply, tool

SEEN = []
LOST = {"x"}


@tool(effect="irreversible")
def post(name: str) -> str:
    """Post an entry."""
    if name in LOST:
        LOST.discard(name)
        raise TimeoutError("the connection dropped after the request was sent")
    return "posted " + name


def answer(request):
    SEEN.append(request.messages[-1].content)
    return reply("done")


agent = Agent(ScriptedModel([calls(("post", {"name": "x"})), answer]), [post])
'''


@pytest.fixture
def native(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    name = f"cont_agents_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(NATIVE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield name
    sys.modules.pop(name, None)


def lost_connection(made: list[str]) -> Callable[[str], str]:
    def post(name: str) -> str:
        """Post an entry."""
        if not made:
            made.append(name)
            raise ConnectionResetError("the connection dropped after the request was sent")
        return "posted " + name
    return post


def pydantic_shell(url: str, seen: list[Any]) -> tuple[Callable[..., Any], Callable[[], Any]]:
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
        returned = [p for m in messages for p in getattr(m, "parts", [])
                    if isinstance(p, ToolReturnPart)]
        if not returned:
            return ModelResponse(parts=[ToolCallPart("post", {"name": "x"}, "call-x")])
        seen.append(returned[-1].model_response_str())
        return ModelResponse(parts=[TextPart("done")])

    def agent() -> Any:  # each process builds its own: the continuation is a new one
        built = Agent(FunctionModel(model), name="poster",
                      output_type=[str, DeferredToolRequests],
                      capabilities=[JournalDurability(url, RUN)])
        built.tool_plain(lost_connection([]))
        return built

    return (lambda task: agent().run_sync(task).output), \
        (lambda: agent().run_sync(TASK).output)


def sdk_shell(url: str, seen: list[Any]) -> tuple[Callable[..., Any], Callable[[], Any]]:
    from agents import Agent, function_tool
    from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call

    from agentjournal.integrations.openai_agents import JournalRunner

    def answer(call: Any) -> Any:
        outputs = [i for i in call.input if isinstance(i, dict)
                   and i.get("type") == "function_call_output"]
        if not outputs:
            return [function_call("post", {"name": "x"}, call_id="call_x")]
        seen.append(outputs[-1]["output"])
        return [assistant_message("done")]

    made: list[str] = []
    agent = Agent(name="poster", model=ScriptedModel([ModelStep.respond(answer)] * 4),
                  tools=[function_tool(lost_connection(made))])
    store = open_store(url)

    def run(task: str | None) -> Any:
        return JournalRunner.run_sync(agent, task, store=store, run_id=RUN,
                                      policies={"post": "irreversible"}).final_output
    return run, (lambda: run(None))


def langgraph_shell(url: str, seen: list[Any]) -> tuple[Callable[..., Any], Callable[[], Any]]:
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    from agentjournal.integrations.langgraph import JournalSaver, ToolEffect, exactly_once
    from agentjournal.integrations.langgraph import invoke as lg_invoke

    def model(state: MessagesState) -> dict[str, Any]:
        results = [m for m in state["messages"] if isinstance(m, ToolMessage)]
        if not results:
            return {"messages": [AIMessage("", tool_calls=[
                {"id": "call-x", "name": "post", "args": {"name": "x"}}])]}
        seen.append(results[-1].content)
        return {"messages": [AIMessage("done")]}

    store = open_store(url)
    saver = JournalSaver(store)
    post = tool(lost_connection([]))
    calls = exactly_once(saver, {"post": ToolEffect("irreversible")})
    builder = StateGraph(MessagesState)
    builder.add_node("model", model)
    builder.add_node("tools", ToolNode([post], wrap_tool_call=calls))
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", tools_condition, ["tools", END])
    builder.add_edge("tools", "model")
    graph = builder.compile(checkpointer=saver)
    thread = {"configurable": {"thread_id": "t-7"}}
    return (lambda task: lg_invoke(graph, {"messages": [HumanMessage(task)]}, thread)), \
        (lambda: lg_invoke(graph, None, thread))


SHELLS = {"pydantic_ai": pydantic_shell, "openai_agents": sdk_shell,
          "langgraph": langgraph_shell}
#: What the CLI says continues each kind of run (continuation.py).
CALLS = {"pydantic_ai": "agent.run_sync('post x')",
         "openai_agents": "JournalRunner.run_sync(agent, None, store=store, run_id='cont-1')",
         "langgraph": "invoke(graph, None, {'configurable': {'thread_id': 't-7'}})"}


@pytest.mark.parametrize("store_url", BACKENDS, indirect=True)
@pytest.mark.parametrize("shell", SHELLS)
def test_an_integrations_run_goes_on_by_the_call_the_cli_names(store_url: str,
                                                               shell: str) -> None:
    from agentjournal.integrations.langgraph import thread_run_id

    seen: list[Any] = []
    start, go_on = SHELLS[shell](store_url, seen)
    start(TASK)  # stops: the call is uncertain, only a person can say
    run_id = thread_run_id("t-7") if shell == "langgraph" else RUN
    said = resolved(store_url, run_id)
    assert CALLS[shell] in said and "agentjournal resume" not in said, said
    if shell != "langgraph":  # (its input is the thread: another task is another thread)
        with pytest.raises(RunMismatchError) as refused:
            start("post y")  # another input under the run's id: refused, pointing at the call
        assert CALLS[shell] in str(refused.value)
        assert "agentjournal resume" not in str(refused.value)
    go_on()
    assert seen == [NO_RESULT_GIVEN]  # what the model read for the person's verdict
    store = open_store(store_url)
    try:
        assert fold(store.read(run_id)).status == "finished"
    finally:
        store.close()


@pytest.mark.parametrize("store_url", BACKENDS, indirect=True)
def test_a_native_run_goes_on_by_the_command_the_cli_names(store_url: str,
                                                           native: str) -> None:
    started = invoke("run", f"{native}:agent", TASK, "--run-id", RUN, "--store", store_url)
    assert started.exit_code == 4, (started.stdout, started.stderr)
    said = resolved(store_url, RUN)
    assert f"next: continue it with: agentjournal resume {RUN} --store" in said, said
    done = invoke("resume", RUN, "--store", store_url)
    assert done.exit_code == 0, (done.stdout, done.stderr)
    assert sys.modules[native].SEEN == [NO_RESULT_GIVEN]


# --- a run in the fleet's queue ------------------------------------------------------------


@pytest.fixture(params=workers.QUEUED)
def fleet(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """Workers and CLI calls on a store with a queue (tests/test_worker.py's Fleet)."""
    for url in fresh_url(request.param, tmp_path):
        started = workers.Fleet(url, tmp_path)
        yield started
        started.close()


def test_a_queued_runs_decisions_say_what_the_fleet_does_next(fleet: Any) -> None:
    """Two uncertain calls of a worker's run: after the first verdict the run still waits
    for the person (a worker would only ask again); after the second a worker takes it
    up, and the CLI says so, never `agentjournal resume`."""
    from agentjournal.snapshots import load_state

    workers._submit(fleet.url, "two_uncertain", "post both", "cut")
    proc = fleet.worker()
    fleet.until("the run to wait", lambda: fleet.runs()["cut"].state == "waiting")
    with open_store(fleet.url) as store:
        pending = {p.args["label"]: p.key for p in load_state(store, "cut").state.pending.values()}
    first = fleet.cli("resolve", "cut", pending["landed"], "--happened", "--by", "ana")
    assert first.returncode == 0, first.stderr
    assert "run cut still waits for a person" in first.stdout, first.stdout
    second = fleet.cli("resolve", "cut", pending["lost"], "--did-not-happen", "--by", "ana")
    assert second.returncode == 0, second.stderr
    # (a worker may have claimed, even finished, it by the time the CLI reads the queue)
    assert any(said in second.stdout for said in (
        "run cut is in the queue: a worker will take it up",
        "run cut is held by a worker, which goes on with it",
        "run cut is finished: nothing to continue")), second.stdout
    assert "agentjournal resume" not in first.stdout + second.stdout
    fleet.until("the run to finish", lambda: fleet.runs()["cut"].state == "done")
    assert fleet.stop(proc) == 0


# --- a second submit of a run id with another agent or task ------------------------------


@pytest.fixture(params=workers.QUEUED)
def queued_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from fresh_url(request.param, tmp_path)


def test_a_refused_submit_names_what_continues_the_run_already_submitted(
        queued_url: str) -> None:
    """Queued, the run is the workers' to take up; parked, `requeue` hands it back: the
    refusal says which, never `agentjournal resume` (which cannot run a worker's run)."""
    from agentjournal.fleet import queue_of, submit

    with open_store(queued_url) as store:
        submit(store, "m:agent", "do it", "r1")
        with pytest.raises(RunMismatchError) as queued:
            submit(store, "m:agent", "do something else", "r1")
        claim = queue_of(store).claim("w", 30, ["default"])
        assert claim is not None
        assert queue_of(store).hand_back(claim.lease, "parked", 0, "refused: no such agent")
        with pytest.raises(RunMismatchError) as parked:
            submit(store, "m:other", "do it", "r1")
        assert [(r.run_id, r.state) for r in queue_of(store).runs()] == [("r1", "parked")]
    said = (str(queued.value), str(parked.value))
    assert "run r1 is in the queue: a worker will take it up" in said[0], said[0]
    assert "agentjournal requeue r1" in said[1], said[1]
    assert queued.value.field == "task" and parked.value.field == "agent"
    assert not any("agentjournal resume" in text for text in said), said


# --- a child run: an agent run inside a call of a journaled parent -------------------------


@pytest.mark.parametrize("store_url", BACKENDS, indirect=True)
def test_a_child_run_goes_on_by_continuing_its_parent(store_url: str) -> None:
    """A Pydantic AI agent run inside a tool call of another (its run_started names that
    call): the parent's call, made again, resumes it, so its hint is the parent's call,
    never the child's own prompt run alone (outside the call it would have no parent)."""
    from agentjournal.bridge import open_run

    with open_store(store_url) as store:
        for run_id, agent, prompt, parent in (
                ("boss", "pydantic_ai:orchestrator", "plan the day", None),
                ("helper", "pydantic_ai:worker", "post x",
                 {"run_id": "boss", "key": "k" * 64, "call_id": "call-7"})):
            with pytest.raises(RuntimeError), open_run(store, run_id, agent=agent,
                                                       input=prompt, parent=parent):
                raise RuntimeError("stopped")  # leaves each run paused
    shown = invoke("show", "helper", "--store", store_url)
    assert shown.exit_code == 0, (shown.stdout, shown.stderr)
    (said,) = [line for line in shown.stdout.splitlines() if line.startswith("next: ")]
    assert "inside call call-7 of run boss" in said, said
    assert "agent.run_sync('plan the day')" in said and "'post x'" not in said, said
    as_json = invoke("show", "helper", "--json", "--store", store_url)
    how = __import__("json").loads(as_json.stdout)["next"]
    assert (how["kind"], how["command"]) == ("pydantic_ai", "agent.run_sync('plan the day')")


def test_a_child_runs_hint_without_its_parents_names_the_parent_to_continue() -> None:
    """Given no parent's continuation (a caller that read only the child), the hint still
    points at the parent run, never at the child's own call."""
    from agentjournal.continuation import continuation
    from agentjournal.state import RunState

    child = RunState(run_id="helper", status="paused", agent="pydantic_ai:worker",
                     task="post x")
    how = continuation(child, started={"parent": {"run_id": "boss", "key": "k" * 64,
                                                  "call_id": "call-7"}},
                       store_hint=" --store sqlite:///r.db")
    assert (how.kind, how.command) == ("parent", "agentjournal show boss --store sqlite:///r.db")
    assert "inside call call-7 of run boss" in how.sentence and "post x" not in how.sentence


def test_show_of_a_parked_run_with_no_events_names_the_command_that_requeues_it(
        queued_url: str) -> None:
    """A run a worker parked before it recorded anything: show says where it waits, on
    lines of its own (stdout; nothing on stderr), and the requeue that continues it."""
    from agentjournal.fleet import queue_of, submit

    with open_store(queued_url) as store:
        submit(store, "m:agent", "do it", "r1")
        claim = queue_of(store).claim("w", 30, ["default"])
        assert claim is not None
        assert queue_of(store).hand_back(claim.lease, "parked", 0, "refused: no such agent")
    shown = invoke("show", "r1", "--store", queued_url)
    assert shown.exit_code == 0 and shown.stderr == "", (shown.stdout, shown.stderr)
    lines = shown.stdout.splitlines(keepends=True)
    assert len(lines) == 2 and all(line.endswith("\n") for line in lines), lines
    assert lines[0].startswith("run r1: parked in queue 'default'"), lines
    assert lines[1] == ("next: a worker parked run r1; once its cause is fixed, hand it "
                        f"back to the workers with: agentjournal requeue r1 --store "
                        f"{queued_url}\n"), lines
