"""Real processes, real SIGKILL: a LangGraph agent (tests/langgraph_agent.py) is killed in
each window of its one irreversible tool call and resumed from its thread in a new
process. The receiver process counts the effects it was sent; nothing is read from the
library's view of them. The same kills with LangGraph's stock SqliteSaver and a plain
ToolNode record what LangGraph does on its own (printed, and checked: the after-effect
window repeats the effect)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph.prebuilt")

from click.testing import CliRunner

from agentjournal import EventType, open_store
from agentjournal.cli import cli
from agentjournal.integrations.langgraph import thread_run_id

from .conftest import backend_params
from .langgraph_agent import LABEL
from .test_crash_models import Receiver

ROOT = Path(__file__).resolve().parents[1]
THREAD = "refunds/order-42"  # a thread id is any string, not a run id
HANG = 120  # seconds: a hang guard, never a timing assertion


@pytest.fixture(autouse=True)
def default_size(request: pytest.FixtureRequest) -> None:
    """Each child imports LangGraph (2-3 s of CPU): the default suite kills ours in every
    window on SQLite (streamed: after the effect), and the stock saver after the effect
    (the window LangGraph repeats); --slow kills in every window on every backend (the
    saver's appends are the same code on each, which the conformance and graph tests
    run on all three). Decided before the receiver starts."""
    params = getattr(request.node, "callspec", None)
    given = params.params if params is not None else {}
    if request.config.getoption("--slow") or request.node.name.startswith((
            "test_killed_as_the_thread_opens", "test_killed_as_an_unfinished_thread")):
        return  # (those windows on every backend: where a thread's run is opened)
    if given.get("store_url", "sqlite") != "sqlite":
        pytest.skip("on this backend with --slow (the default suite kills on sqlite)")
    stock = request.node.name.startswith("test_stock")
    streamed = given.get("how") == "stream"
    if (stock or streamed) and given.get("window", "after") != "after":
        pytest.skip("in this window with --slow (the default suite kills after the effect)")


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def agent(*args: str) -> list[str]:
    return [sys.executable, "-m", "tests.langgraph_agent", "--thread", THREAD, *args]


def finish(cmd: list[str]) -> dict[str, Any]:
    """Run the agent to its end; its JSON result (or the error that refused it)."""
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=HANG)
    assert done.stdout.strip(), done.stderr
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def kill_in(cmd: list[str], window: str) -> None:
    """Start the agent, wait until it reports ``window``, SIGKILL it there."""
    child = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True,
                             start_new_session=True)
    assert child.stdout is not None
    try:
        line = child.stdout.readline()
        assert line.strip() == f"WINDOW {window}", line
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait(timeout=HANG)
        child.stdout.close()
    assert child.returncode == -signal.SIGKILL


def stock_count(tmp_path: Path, receiver: Receiver, window: str) -> int:
    db = str(tmp_path / f"stock-{window}.db")
    base = ["--saver", "stock", "--db", db, "--receiver", receiver.url]
    kill_in(agent(*base, "--block", window), window)
    out = finish(agent(*base, "--resume"))
    assert out["messages"][-1] == ["AIMessage", "Refunded order 42."]
    return receiver.by_label().get(LABEL, 0)


@pytest.mark.parametrize("window", ["model", "before", "after"])
def test_stock_sqlitesaver_and_toolnode_repeat_the_effect_after_it(
        tmp_path: Path, receiver: Receiver, window: str) -> None:
    count = stock_count(tmp_path, receiver, window)
    print(f"stock SqliteSaver + ToolNode, killed in window {window!r}: receiver count {count}")
    assert count == (2 if window == "after" else 1)


def journal(store_url: str, receiver: Receiver, *extra: str) -> list[str]:
    return agent("--saver", "journal", "--store", store_url, "--receiver", receiver.url,
                 *extra)


def log_of(store_url: str) -> list[Any]:
    store = open_store(store_url)
    try:
        return list(store.read(thread_run_id(THREAD)))
    finally:
        store.close()


@backend_params()
@pytest.mark.parametrize("window", ["model", "before", "after"])
@pytest.mark.parametrize("how", ["invoke", "stream"])
def test_killed_in_each_window_the_effect_happens_once(
        store_url: str, receiver: Receiver, window: str, how: str) -> None:
    streamed = ["--stream"] if how == "stream" else []  # killed and resumed by stream()
    kill_in(journal(store_url, receiver, "--lookup", *streamed, "--block", window), window)
    out = finish(journal(store_url, receiver, "--lookup", *streamed, "--resume"))
    assert out["messages"][-1] == ["AIMessage", "Refunded order 42."], out
    assert receiver.by_label() == {LABEL: 1}
    kinds = [e.type for e in log_of(store_url)]
    assert kinds.count(EventType.TOOL_CALL_STARTED) == (2 if window == "before" else 1)
    assert kinds.count(EventType.TOOL_CALL_COMPLETED) == 1
    if window == "after":  # settled by the lookup, not by calling again
        assert EventType.TOOL_CALL_RECONCILED in kinds
    assert kinds[-1] is EventType.RUN_FINISHED


@backend_params()
def test_an_uncertain_irreversible_call_interrupts_and_a_person_decides(
        store_url: str, receiver: Receiver) -> None:
    kill_in(journal(store_url, receiver, "--block", "after"), "after")
    paused = finish(journal(store_url, receiver, "--resume"))
    (question,) = paused["interrupts"]
    assert question["agentjournal"] == "uncertain" and question["tool"] == "post_effect"
    assert question["args"] == {"label": LABEL} and question["key"]
    assert receiver.by_label() == {LABEL: 1}  # nothing was called again to find out
    out = finish(journal(store_url, receiver, "--decide", "happened"))
    assert out["messages"][-1] == ["AIMessage", "Refunded order 42."], out
    assert receiver.by_label() == {LABEL: 1}
    verdicts = [e for e in log_of(store_url) if e.type is EventType.TOOL_CALL_RECONCILED]
    assert [v.payload["verdict"] for v in verdicts] == ["found"]  # as `resolve --happened`
    assert verdicts[0].payload["by"] == "test"
    # `agentjournal show THREAD` tells the whole story: checkpoints, the call, the verdict.
    shown = CliRunner().invoke(cli, ["show", THREAD, "--store", store_url, "--json"])
    assert shown.exit_code == 0, shown.output
    doc = json.loads(shown.output)
    lines = {e["type"]: e["summary"] for e in doc["events"]}
    assert "post_effect" in lines["tool_call_started"] and "irreversible" in lines[
        "tool_call_started"]
    assert "(by test)" in lines["tool_call_reconciled"]
    assert doc["thread"]["thread_id"] == THREAD and doc["thread"]["checkpoints"] >= 4
    assert doc["state"]["status"] == "finished"


@backend_params()
def test_a_crash_before_the_first_checkpoint_keeps_the_input(
        store_url: str, receiver: Receiver) -> None:
    # durability="exit": LangGraph itself writes nothing before the run ends.
    kill_in(journal(store_url, receiver, "--lookup", "--durability", "exit",
                    "--block", "model"), "model")
    kinds = [e.type for e in log_of(store_url)]
    assert kinds == [EventType.RUN_STARTED, EventType.USER_MESSAGE, EventType.GRAPH_INPUT]
    out = finish(journal(store_url, receiver, "--lookup", "--resume"))
    assert out["messages"][0] == ["HumanMessage", "Refund order 42 once."]
    assert out["messages"][-1] == ["AIMessage", "Refunded order 42."]
    assert receiver.by_label() == {LABEL: 1}


@backend_params()
def test_killed_as_the_thread_opens_it_resumes_with_no_input(
        store_url: str, receiver: Receiver) -> None:
    # Killed right after the thread's run was opened: its input is in that same append,
    # so invoke(graph, None, thread) runs the graph on it (no EmptyInputError).
    kill_in(journal(store_url, receiver, "--lookup", "--block", "opened"), "opened")
    kinds = [e.type for e in log_of(store_url)]
    assert kinds == [EventType.RUN_STARTED, EventType.USER_MESSAGE, EventType.GRAPH_INPUT]
    out = finish(journal(store_url, receiver, "--lookup", "--resume"))
    assert out["messages"][0] == ["HumanMessage", "Refund order 42 once."], out
    assert out["messages"][-1] == ["AIMessage", "Refunded order 42."]
    assert receiver.by_label() == {LABEL: 1}
    assert [e.type for e in log_of(store_url)][-1] is EventType.RUN_FINISHED


@backend_params()
def test_killed_as_an_unfinished_thread_reopens_its_new_input_is_kept(
        store_url: str, receiver: Receiver) -> None:
    # A thread left unfinished (killed before its model answered), then given a new input
    # by a process killed right after it opened the thread's run again: the input is in
    # that same append (run_resumed with graph_input), so invoke(graph, None, thread)
    # runs the graph on it; it was a second append, lost with the kill.
    kill_in(journal(store_url, receiver, "--lookup", "--block", "model"), "model")
    first = len(log_of(store_url))
    kill_in(journal(store_url, receiver, "--lookup", "--ask", "Refund it, please.",
                    "--block", "opened"), "opened")
    reopened = log_of(store_url)[first:]
    assert [e.type for e in reopened] == [EventType.RUN_RESUMED, EventType.GRAPH_INPUT]
    out = finish(journal(store_url, receiver, "--lookup", "--resume"))
    assert [m for m in out["messages"] if m[0] == "HumanMessage"] == [
        ["HumanMessage", "Refund order 42 once."], ["HumanMessage", "Refund it, please."]], out
    assert out["messages"][-1] == ["AIMessage", "Refunded order 42."]
    assert receiver.by_label() == {LABEL: 1}
    assert [e.type for e in log_of(store_url)][-1] is EventType.RUN_FINISHED


@backend_params()
def test_two_processes_resuming_one_thread_one_proceeds_one_is_refused(
        store_url: str, receiver: Receiver, tmp_path: Path) -> None:
    kill_in(journal(store_url, receiver, "--lookup", "--block", "before"), "before")
    gate = tmp_path / "go"
    first = subprocess.Popen(
        journal(store_url, receiver, "--lookup", "--resume", "--block", "before",
                "--gate", str(gate)), cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert first.stdout is not None
    try:
        assert first.stdout.readline().strip() == "WINDOW before"  # it holds the thread
        second = finish(journal(store_url, receiver, "--lookup", "--resume"))
        assert second["error"] == "LeaseHeldError", second
        gate.touch()
        out, _ = first.communicate(timeout=HANG)
    finally:
        first.kill()
        first.wait()
        first.stdout.close()
    assert json.loads(out.strip().splitlines()[-1])["messages"][-1] == [
        "AIMessage", "Refunded order 42."]
    assert receiver.by_label() == {LABEL: 1}
    events = log_of(store_url)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    resumed = [e for e in events if e.epoch == events[-1].epoch]
    assert resumed[0].seq > 1 and all(e.epoch == resumed[0].epoch for e in events[
        resumed[0].seq - 1:])  # after the takeover, one writer only
