"""Deploys under LangGraph (issue 43): a thread SIGKILLed in a real child process after
its irreversible call reached the receiver process is resumed by a release that changed
one thing (tests/langgraph_deploy_agent.py). The receiver counts each effect once; the
thread finishes, or stops for a person (an interrupt, and its run paused with a reason
that names the change and what to do); a recorded model turn is never asked again (the
model's calls are counted). SQLite by default, every backend with --slow."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph.prebuilt")

from langchain_core.messages import HumanMessage

from agentjournal import EventType, open_store
from agentjournal.check import check_runs
from agentjournal.cli._base import opened
from agentjournal.deploys import describe
from agentjournal.errors import RunMismatchError
from agentjournal.integrations.langgraph import (
    JournalSaver,
    agent_version,
    invoke,
    thread_run_id,
)
from agentjournal.state import RunState, fold

from .conftest import backend_params
from .langgraph_deploy_agent import CHANGES, FINAL, LABEL, STARTED_BY, build, release_of, run
from .test_check import fingerprint
from .test_crash_models import Receiver

ROOT = Path(__file__).resolve().parents[1]
THREAD = "deploys/order-42"
HANG = 120  # seconds: a hang guard, never a timing assertion
#: The changes a person must look at, by what the run's pause reason says of them.
PAUSES = {"tool_removed": "has no tool", "tool_renamed": "has no tool",
          "identity": "key changed", "effect": "effect changed",
          "arguments": "no longer accepts the recorded arguments"}


#: The changes the default suite kills and resumes under (each costs a child process
#: importing LangGraph); --slow runs every change on every backend.
DEFAULT = {"tool_renamed", "tool_renamed_mapped", "identity", "arguments", "node_added",
           "prompt", "read_removed"}
#: Resumed by ainvoke (the ToolNode's async wrapper); the others by invoke.
ASYNC = {"tool_renamed_mapped", "arguments", "tool_removed", "effect", "model"}


@pytest.fixture(autouse=True)
def on_sqlite_unless_slow(request: pytest.FixtureRequest) -> None:
    params = getattr(request.node, "callspec", None)
    given = params.params if params is not None else {}
    if request.config.getoption("--slow"):
        return
    if given.get("store_url", "sqlite") != "sqlite":
        pytest.skip("on this backend with --slow (the default suite runs on sqlite)")
    if given.get("change", "prompt") not in DEFAULT:
        pytest.skip("this change with --slow (the default suite runs one of each kind)")


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def kill_after_effect(store_url: str, receiver: Receiver, model_log: Path,
                      release: str) -> None:
    """Release 1 in a child, SIGKILLed once its call reached the receiver."""
    cmd = [sys.executable, "-m", "tests.langgraph_deploy_agent", "--store", store_url,
           "--thread", THREAD, "--receiver", receiver.url, "--model-log", str(model_log),
           "--change", release, "--block", "after"]
    child = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True,
                             start_new_session=True)
    assert child.stdout is not None
    try:
        line = child.stdout.readline()
        assert line.strip() == "WINDOW after", line
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait(timeout=HANG)
        child.stdout.close()
    assert child.returncode == -signal.SIGKILL


def model_calls(model_log: Path) -> int:
    return len(model_log.read_text().splitlines())


def version_of(change: str, receiver: Receiver, model_log: Path) -> str:
    """The version a thread run by release ``change`` records (derived from its code;
    the saver is not part of it)."""
    with tempfile.TemporaryDirectory() as scratch, open_store(f"jsonl:///{scratch}") as store:
        graph = build(release_of(change), JournalSaver(store), receiver.url,
                      model_log=str(model_log))
        return agent_version(graph)


def thread_state(store_url: str) -> tuple[RunState, list[EventType]]:
    store = open_store(store_url)
    try:
        events = list(store.read(thread_run_id(THREAD)))
    finally:
        store.close()
    return fold(events), [e.type for e in events]


@backend_params()
@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_thread_killed_after_its_effect_resumes_under_changed_code(
        store_url: str, receiver: Receiver, tmp_path: Path, change: str) -> None:
    model_log = tmp_path / "model.log"
    started_by = STARTED_BY.get(change, "none")
    kill_after_effect(store_url, receiver, model_log, started_by)
    assert receiver.by_label() == {LABEL: 1} and model_calls(model_log) == 1
    resume = {"model_log": str(model_log), "change": change,
              "how": "ainvoke" if change in ASYNC else "invoke"}
    out = run(store_url, THREAD, receiver.url, resume=True, **resume)
    assert receiver.by_label() == {LABEL: 1}, out
    if change in PAUSES:  # a person is asked, never a silent re-run or a made-up failure
        (question,) = out["interrupts"]
        assert PAUSES[change] in question["change"], question
        assert question["tool"] == "post_effect" and question["call_id"] == "call-refund-42"
        state, kinds = thread_state(store_url)
        assert state.status == "paused", kinds
        assert PAUSES[change] in state.pause_reason and "agentjournal resolve" in (
            state.pause_reason)
        assert model_calls(model_log) == 1
        # Strict mode refuses the thread under another version, appending nothing.
        with pytest.raises(RunMismatchError, match="strict mode refuses"):
            run(store_url, THREAD, receiver.url, resume=True, strict=True,
                **{**resume, "change": started_by})
        assert thread_state(store_url)[1] == kinds
        out = run(store_url, THREAD, receiver.url, decide="happened", **resume)
        assert receiver.by_label() == {LABEL: 1}
    assert out["messages"][-1] == ["AIMessage", FINAL], out
    assert [m for m in out["messages"] if m[0] == "ToolMessage"] == [
        ["ToolMessage", out["messages"][2][1]]]  # the one call, answered once
    told = out["messages"][2][1]  # a read whose tool is gone is told; an effect, never
    assert ("not a valid tool" in told) is (change == "read_removed"), told
    assert model_calls(model_log) == 2  # the recorded turn was not asked again
    state, kinds = thread_state(store_url)
    assert kinds[-1] is EventType.RUN_FINISHED and state.status == "finished"
    assert kinds.count(EventType.TOOL_CALL_STARTED) == 1
    # The version that started the thread (in the child) and the one that continued it.
    first, now = (version_of(c, receiver, model_log) for c in (started_by, change))
    assert state.versions == ([first] if change == "none" else [first, now])
    assert first != now or change == "none"


def test_a_graph_is_described_for_check_and_a_given_version_is_recorded(
        tmp_path: Path, receiver: Receiver) -> None:
    """The describer ``agentjournal check`` uses: a graph's tools as its exactly_once
    declares them, its renamed tools, and its version (derived, or given to the saver
    and recorded by the thread, at its start and when new input reopens it)."""
    store = open_store(f"sqlite:///{tmp_path / 'journal.db'}")
    try:
        log = str(tmp_path / "model.log")
        mapped = describe(build(CHANGES["tool_renamed_mapped"], JournalSaver(store),
                                receiver.url, model_log=log))
        assert mapped is not None and set(mapped.tools) == {"post_correction"}
        tool = mapped.tools["post_correction"]
        assert (tool.effect, tool.identity) == ("irreversible", ("label",))
        assert mapped.renamed == {"post_effect": "post_correction"}
        assert mapped.tool("post_effect") == tool
        assert tool.check_args is not None and tool.check_args({"label": "x"}) is not None
        assert mapped.version == version_of("tool_renamed_mapped", receiver, Path(log))
        for release, version in (("none", "2026.12-a"), ("tool_added", "2026.12-b")):
            with JournalSaver(store, agent_version=version) as saver:
                graph = build(CHANGES[release], saver, receiver.url, model_log=log)
                shape = describe(graph)
                assert shape is not None and shape.version == version
                invoke(graph, {"messages": [HumanMessage("Refund order 42 once.")]},
                       {"configurable": {"thread_id": THREAD}})
        state = fold(store.read(thread_run_id(THREAD)))
        assert state.versions == ["2026.12-a", "2026.12-b"] and state.status == "finished"
        assert receiver.by_label() == {LABEL: 1}  # (the second input asked for no call)
    finally:
        store.close()


#: What ``agentjournal check`` forecasts for the thread killed under release 1, by the
#: release it would be resumed under (as the resumes above do).
CHECKED = {"none": "continue", "prompt": "continue", "node_added": "continue",
           "tool_renamed_mapped": "continue", "tool_renamed": "pause",
           "identity": "pause", "effect": "pause", "arguments": "pause"}


@backend_params()
def test_check_says_what_each_release_would_do_to_the_thread_and_writes_nothing(
        store_url: str, receiver: Receiver, tmp_path: Path) -> None:
    model_log = tmp_path / "model.log"
    kill_after_effect(store_url, receiver, model_log, "none")
    before = fingerprint(store_url)
    with opened(store_url) as store:  # read-only, as `agentjournal check` opens it
        def check(change: str, **given: Any) -> Any:
            graph = build(CHANGES[change], JournalSaver(store), receiver.url,
                          model_log=str(model_log))
            (ahead,) = check_runs(store, "tests.langgraph_deploy_agent:graph", graph,
                                  recorded_as="langgraph", **given)
            return ahead

        for change, action in CHECKED.items():
            ahead = check(change)
            assert ahead.action == action, (change, ahead.sentence)
            assert [tool for _, tool, _ in ahead.calls] == (
                ["post_effect"] if action == "pause" else [])
            assert (change == "none") is (ahead.changes == ())
        assert check("prompt", strict=True).action == "refuse"
    assert fingerprint(store_url) == before  # read only: every byte as it was
