"""Deploys under the native Agent (issue 43): a run survives new agent code.

The change matrix: a real child process (tests/deploy_agents.py) runs the agent, whose
irreversible tool posts to a receiver process, and is SIGKILLed after effect A reached
the receiver (its completion never recorded); the code changes; the run resumes in a new
process. The receiver's own counts say each effect happened once; the run finishes, or
pauses with a reason naming the change; the model's asks are counted (a recorded turn is
never asked again). SQLite by default, every backend with --slow.

Then fast in-process tests: strict mode, versions recorded and folded, and the forecast
``agentjournal check`` makes agreeing with what the resume does.
"""

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

from agentjournal import Agent, EventType, decide_approval, open_store, resolve_uncertain
from agentjournal.deploys import describe, forecast
from agentjournal.errors import RunMismatchError
from agentjournal.models import ScriptedModel, calls
from agentjournal.policy import RequireApproval
from agentjournal.snapshots import load_state
from agentjournal.state import RunState, ToolCall
from agentjournal.store import Store
from agentjournal.tools import Tool, tool

from .conftest import BACKENDS
from .test_crash_models import Receiver

E = EventType
ROOT = Path(__file__).resolve().parent.parent

#: variant -> what the resume under it does: None to continue, else words its pause
#: reason must hold (naming the change).
MATRIX: dict[str, str | None] = {
    "instructions": None,
    "tool_added": None,
    "model_switched": None,
    "tool_renamed_mapped": None,
    "tool_removed": "tool 'post_effect' is no longer in the agent",
    "tool_renamed": "tool 'post_effect' is no longer in the agent",
    "args_changed": "no longer accepts the recorded arguments",
    "identity_changed": "changed its identity fields",
    "effect_changed": "changed its effect class from irreversible to idempotent",
}


def child(store_url: str, receiver: Receiver, turns: Path, variant: str,
          fault: str = "", *extra: str) -> tuple[int, dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-m", "tests.deploy_agents", "--store", store_url, "--run-id", "d1",
         "--receiver", receiver.url, "--turns", str(turns), "--variant", variant, *extra],
        cwd=ROOT, env={**os.environ, "AGENTJOURNAL_FAULT": fault}, capture_output=True,
        text=True, timeout=60)
    assert done.returncode in (0, -signal.SIGKILL), done.stderr
    return done.returncode, json.loads(done.stdout) if done.returncode == 0 else {}


def asks(turns: Path) -> list[int]:
    """The turns the model was asked for, in order, over every process."""
    return [int(n) for n in turns.read_text().split()] if turns.exists() else []


def state_of(store: Store, run_id: str) -> RunState:
    return load_state(store, run_id).state


def events_of(store_url: str) -> list[Any]:
    store = open_store(store_url)
    try:
        return list(store.read("d1"))
    finally:
        store.close()


@pytest.mark.parametrize("store_url", BACKENDS, indirect=True)
@pytest.mark.parametrize("variant", list(MATRIX))
def test_a_run_killed_after_its_effect_resumes_under_new_code(
        store_url: str, receiver: Receiver, tmp_path: Path, variant: str,
        request: pytest.FixtureRequest) -> None:
    if not store_url.startswith("sqlite") and not request.config.getoption("--slow"):
        pytest.skip("on this backend with --slow (the default suite runs on sqlite)")
    turns = tmp_path / "turns"
    code, _ = child(store_url, receiver, turns, "base", fault="after_effect:1")
    assert code == -signal.SIGKILL
    assert receiver.by_label() == {"A": 1} and asks(turns) == [0]

    code, out = child(store_url, receiver, turns, variant)
    pauses = MATRIX[variant]
    if pauses is None:
        assert out["status"] == "finished", out
        assert receiver.by_label() == {"A": 1, "B": 1}
        assert asks(turns) == [0, 1, 2]  # turn 0 served from the log, never asked again
        log = events_of(store_url)
        started = next(e for e in log if e.type is E.RUN_STARTED).payload["agent_version"]
        assert out["versions"] == [started, out["version"]] and started != out["version"]
        changed = [e.payload["instructions"] for e in log if e.type is E.INSTRUCTIONS_CHANGED]
        assert changed == (["You post effects at the receiver. Be brief."]
                           if variant == "instructions" else [])
        return
    assert out["status"] == "paused", out
    assert pauses in out["pause_reason"] and "agentjournal resolve d1" in out["pause_reason"]
    assert receiver.by_label() == {"A": 1} and asks(turns) == [0]  # nothing made or asked

    # Resumed again, nothing settled: it stays paused and appends nothing.
    _, again = child(store_url, receiver, turns, variant)
    assert (again["status"], again["last_seq"]) == ("paused", out["last_seq"])

    # A person settles A (it reached the receiver); the run goes on under the new code.
    store = open_store(store_url)
    try:
        (pending,) = state_of(store, "d1").pending.values()
        resolve_uncertain(store, "d1", pending.key, outcome="happened", by="ops",
                          result={"label": "A", "status": "applied"})
    finally:
        store.close()
    _, out = child(store_url, receiver, turns, variant)
    assert out["status"] == "finished", out
    posts_b = variant != "tool_removed"  # that code has no tool to post B with
    assert receiver.by_label() == ({"A": 1, "B": 1} if posts_b else {"A": 1})
    assert asks(turns) == [0, 1, 2] if posts_b else [0, 1]


def test_a_renamed_tool_settles_its_open_call_under_the_old_key(
        tmp_path: Path, receiver: Receiver) -> None:
    """``renamed=``: the open call is looked up (and would be retried) under the key it
    was recorded with, never a new one the receiver has not seen."""
    url, turns = f"sqlite:///{tmp_path / 'j.db'}", tmp_path / "turns"
    child(url, receiver, turns, "base", fault="after_effect:1")
    (old_key,) = receiver.by_key()
    _, out = child(url, receiver, turns, "tool_renamed_mapped")
    assert out["status"] == "finished"
    log = events_of(url)
    (verdict,) = [e.payload for e in log if e.type is E.TOOL_CALL_RECONCILED]
    assert (verdict["key"], verdict["verdict"], verdict["tool"]) == (
        old_key, "found", "post_effect")
    assert receiver.by_key()[old_key] == 1 and sum(receiver.by_key().values()) == 2


def test_an_open_read_whose_tool_is_gone_is_told_to_the_model_not_to_a_person(
        tmp_path: Path, receiver: Receiver) -> None:
    """Killed with a read-only call open, resumed by code without that tool: the read
    made nothing, so it completes as failed (the model told why) and the run goes on."""
    url, turns = f"sqlite:///{tmp_path / 'j.db'}", tmp_path / "turns"
    code, _ = child(url, receiver, turns, "base", "before_effect:1", "--read-first")
    assert code == -signal.SIGKILL and asks(turns) == [0]
    _, out = child(url, receiver, turns, "note_removed", "", "--read-first")
    assert out["status"] == "finished", out
    assert receiver.by_label() == {"A": 1, "B": 1} and asks(turns) == [0, 1, 2, 3]
    (failed,) = [e.payload for e in events_of(url) if e.type is E.TOOL_CALL_COMPLETED
                 and e.payload.get("is_error")]
    assert failed["tool"] == "note" and "no longer in the agent" in failed["content"]


# --- in process: strict mode, versions, forecast == resume ------------------------------


class AskAPerson:
    """Every call waits for a person's approval."""

    def decide(self, call: ToolCall, tool: Tool, state: RunState) -> RequireApproval:
        return RequireApproval("a person approves every call")


def poster(*, name: str = "post", effect: str = "irreversible",
           identity: tuple[str, ...] = ("label",), needs_memo: bool = False) -> Tool:
    if needs_memo:
        def post_memo(label: str, memo: str, amount: int = 1) -> str:
            """Post."""
            return label
        fn: Any = post_memo
    else:
        def post_plain(label: str, amount: int = 1) -> str:
            """Post."""
            return label
        fn = post_plain
    made: Tool = tool(name=name, effect=effect, identity=list(identity))(fn)
    return made


def waiting_run(store: Store, run_id: str = "r1") -> Agent:
    """A run waiting for approval of post(label=A): the agent that started it."""
    agent = Agent(ScriptedModel([calls(("post", {"label": "A", "amount": 1}))]),
                  [poster()], instructions="v1", policy=AskAPerson())
    assert agent.run(store, run_id, "post A").status == "waiting_approval"
    return agent


def new_agent(variant: str, **kw: Any) -> Agent:
    tools = {"same": [poster()], "removed": [poster(name="other")],
             "renamed": [poster(name="post2")], "args": [poster(needs_memo=True)],
             "identity": [poster(identity=("label", "amount"))]}[variant]
    return Agent(ScriptedModel([]), tools, instructions=kw.pop("instructions", "v1"),
                 policy=AskAPerson(), **kw)


@pytest.fixture
def store(tmp_path: Path) -> Any:
    s = open_store(f"sqlite:///{tmp_path / 'j.db'}")
    yield s
    s.close()


def test_strict_mode_refuses_a_changed_agent_and_says_what_changed(store: Store) -> None:
    waiting_run(store)
    last = store.last_seq("r1")
    for agent, strict in ((new_agent("same", instructions="v2", strict=True), None),
                          (new_agent("same", instructions="v2"), True)):
        with pytest.raises(RunMismatchError) as refused:
            agent.run(store, "r1", strict=strict)
        assert "refused in strict mode" in str(refused.value)
        assert "instructions" in str(refused.value)
        assert store.last_seq("r1") == last  # refused before anything was appended
    with pytest.raises(RunMismatchError, match="strict mode"):  # the async shell too
        asyncio.run(new_agent("same", instructions="v2").arun(store, "r1", strict=True))
    # Strict, unchanged: a plain resume. Strict, told to accept the change: it goes on.
    assert new_agent("same", strict=True).run(store, "r1").status == "waiting_approval"
    resumed = new_agent("same", instructions="v2", strict=True).run(
        store, "r1", change_instructions=True)
    assert resumed.state.instructions == "v2"


def test_history_is_history_a_changed_prompt_continues_by_default(store: Store) -> None:
    waiting_run(store)
    result = new_agent("same", instructions="v2").run(store, "r1")
    assert result.status == "waiting_approval" and result.state.instructions == "v2"
    kinds = [e.type for e in store.read("r1", after_seq=result.last_seq - 2)]
    assert kinds == [E.RUN_RESUMED, E.INSTRUCTIONS_CHANGED]


def test_versions_are_recorded_and_folded(store: Store) -> None:
    model = ScriptedModel([calls(("post", {"label": "A", "amount": 1}))])
    Agent(model, [poster()], policy=AskAPerson(), version="v1").run(store, "r1", "go")
    for version in ("v2", "v2", "v1"):
        Agent(model, [poster()], policy=AskAPerson(), version=version).run(store, "r1")
    log = list(store.read("r1"))
    assert [e.payload["agent_version"] for e in log if e.type in (E.RUN_STARTED,
                                                                  E.RUN_RESUMED)] == [
        "v1", "v2", "v2", "v1"]
    assert state_of(store, "r1").versions == ["v1", "v2", "v1"]


def test_a_derived_version_is_a_digest_of_what_a_deploy_changes() -> None:
    def version(**kw: Any) -> str:
        model = ScriptedModel([])
        if "model" in kw:
            model.model = kw.pop("model")  # type: ignore[attr-defined]
        return Agent(model, kw.pop("tools", [poster()]), instructions=kw.pop("i", "v1")).version

    base = version()
    assert base.startswith("sha256:") and len(base) == len("sha256:") + 12
    assert version() == base  # stable: the same code, the same version
    others = [version(i="v2"), version(tools=[poster(), poster(name="more")]),
              version(tools=[poster(effect="idempotent")]),
              version(tools=[poster(identity=("label", "amount"))]),
              version(tools=[poster(needs_memo=True)]), version(model="other-model")]
    assert len({base, *others}) == 1 + len(others)
    assert Agent(ScriptedModel([]), [poster()], version="2026.12").version == "2026.12"


@pytest.mark.parametrize("variant, expected", [
    ("same", "continue"), ("removed", "pause"), ("renamed", "pause"), ("args", "pause"),
    ("identity", "pause")])
def test_forecast_is_what_the_resume_does(store: Store, variant: str, expected: str) -> None:
    """A run waiting for approval of post(A), resumed under new code: what
    ``deploys.forecast`` says (as ``agentjournal check`` would) is what happens."""
    waiting_run(store)
    agent = new_agent(variant, instructions="v2")
    shape = describe(agent)
    assert shape is not None
    said = forecast(state_of(store, "r1"), shape)
    assert said.action == expected
    last = store.last_seq("r1")
    assert state_of(store, "r1").last_seq == last  # forecasting appended nothing
    result = agent.run(store, "r1")
    if expected == "continue":
        assert result.status == "waiting_approval" and result.pause_reason is None
        assert said.calls == () and "instructions" in said.changes
        return
    assert result.status == "paused" and result.pause_reason == said.sentence
    ((call_id, name, why),) = said.calls
    assert (call_id, name) == ("call_0_0", "post") and why in said.sentence
    # A person denies the approval: the call is then denied as asked, the run goes on.
    (approval,) = result.approvals
    decide_approval(store, "r1", approval.approval_id, approved=False, by="ops", reason="no")
    assert forecast(state_of(store, "r1"), shape).action == "continue"
    after = agent.run(store, "r1")
    if variant == "identity":  # under its new key the call is another action: asked anew
        (asked,) = after.approvals
        assert after.status == "waiting_approval" and asked.key != approval.key
        return
    assert after.status == "finished"
    denied = [e.payload for e in store.read("r1") if e.type is E.TOOL_CALL_DENIED]
    assert [d["call_id"] for d in denied] == ["call_0_0"]


def test_a_run_recorded_before_versions_is_judged_on_what_it_recorded(store: Store) -> None:
    waiting_run(store)
    state = state_of(store, "r1")
    state.versions = []  # as a run started before schema v8 folds
    strict_same = new_agent("same", strict=True)
    assert forecast(state, strict_same.shape).action == "continue"
    changed = forecast(state, new_agent("same", instructions="v2", strict=True).shape)
    assert (changed.action, changed.changes) == ("refuse", ("instructions",))


def test_a_called_tool_renamed_is_named_among_the_changes(store: Store) -> None:
    waiting_run(store)
    state = state_of(store, "r1")
    mapped = new_agent("renamed", renamed={"post": "post2"})
    said = forecast(state, mapped.shape)
    assert said.action == "continue" and "tools renamed: post -> post2" in said.changes
    assert "tools removed: post" in forecast(state, new_agent("renamed").shape).changes
