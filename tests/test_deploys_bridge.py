"""Deploys under the bridge: Pydantic AI (``JournalDurability``) and the OpenAI Agents SDK
(``JournalRunner``) runs survive new agent code (issue 43).

The change matrix: one child process (tests/deploy_bridge_agents.py) starts a run per
framework and change, each posts its irreversible effect to a receiver process and is
SIGKILLed before the completion is recorded; each run is resumed here under the changed
code. The receiver applies each effect once; a recorded turn is never asked again (the
models count their asks); a run finishes, or pauses with a reason naming the change, never
posts under a new key. SQLite by default, every backend with --slow. In-process tests
cover strict mode, ``request_changed`` (what changed, once), versions and the describers.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from agentjournal import (
    EventType,
    NeedsPerson,
    NondeterminismError,
    fold,
    open_run,
    open_store,
)
from agentjournal.bridge import CodeChanged, Turn
from agentjournal.deploys import describe, forecast

from .conftest import BACKENDS
from .deploy_bridge_agents import (
    FRAMEWORKS,
    TASK,
    VARIANTS,
    Asked,
    pydantic_agent,
    resume,
    sdk_agent,
)

E = EventType
ROOT = Path(__file__).resolve().parents[1]

#: What a resume under each change does: the run finishes having asked the model once
#: (the turn after the call, served from the receiver's lookup), or pauses for a person
#: without asking it, its reason naming the change (a word of it).
FINISHES = ("finished", 1, None)
#: Per framework and change: (status, turns asked, a word of the pause reason).
EXPECTED: dict[tuple[str, str], tuple[str, int, str | None]] = {
    **{(f, v): FINISHES for f in FRAMEWORKS
       for v in ("instructions", "tool_added", "model_switched")},
    **{(f, "tool_removed"): ("paused", 0, "no tool 'post_effect'") for f in FRAMEWORKS},
    **{(f, "tool_renamed"): ("paused", 0, "no tool 'post_effect'") for f in FRAMEWORKS},
    **{(f, "identity_changed"): ("paused", 0, "key changed") for f in FRAMEWORKS},
    **{(f, "effect_changed"): ("paused", 0, "effect changed") for f in FRAMEWORKS},
    # A recorded call is settled by the bridge before the tool parses its arguments: the
    # receiver's lookup finds it (a framework that refused the recorded arguments first
    # would leave it open: test_a_call_the_code_does_not_make_again_pauses_the_next_turn).
    **{(f, "args_changed"): FINISHES for f in FRAMEWORKS},
}
#: The parts of the request a served turn's request_changed names, where the fingerprint
#: covers what changed (neither names the model: its switch shows in the run's versions).
CHANGED_PARTS = {("pydantic_ai", "instructions"): "instructions",
                 ("pydantic_ai", "tool_added"): "tools",
                 ("openai_agents", "instructions"): "instructions",
                 ("openai_agents", "tool_added"): "tools"}


def shape_of(framework: str, variant: str, receiver: str) -> Any:
    """The variant's agent as `agentjournal check` describes it."""
    if framework == "pydantic_ai":
        shape = describe(pydantic_agent(variant, receiver, "x", "sqlite://", "x", Asked()))
    else:
        from agentjournal.integrations.openai_agents import JournalAgent

        agent, policies = sdk_agent(variant, receiver, "x", Asked())
        shape = describe(JournalAgent(agent, policies=policies))
    assert shape is not None
    return shape


def read_log(store_url: str, run_id: str) -> list[Any]:
    store = open_store(store_url)
    try:
        return list(store.read(run_id))
    finally:
        store.close()


@pytest.mark.parametrize("store_url", BACKENDS, indirect=True)
def test_runs_killed_after_their_effect_resume_under_changed_code_each_effect_once(
        request: pytest.FixtureRequest, store_url: str, module_receiver: Any) -> None:
    if not store_url.startswith("sqlite") and not request.config.getoption("--slow"):
        pytest.skip("on this backend with --slow (the default suite runs on sqlite)")
    prefix = f"deploy-{uuid.uuid4().hex[:6]}-"
    killed = subprocess.run(
        [sys.executable, "-m", "tests.deploy_bridge_agents", "--store", store_url,
         "--receiver", module_receiver.url, "--prefix", prefix],
        cwd=ROOT, capture_output=True, text=True, timeout=240, env=dict(os.environ))
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    runs = [(f, v) for f in FRAMEWORKS for v in VARIANTS]
    posted = {k.removeprefix(prefix): n for k, n in module_receiver.by_label().items()
              if k.startswith(prefix)}
    assert posted == {f"{f}-{v}": 1 for f, v in runs}  # each effect reached the receiver

    seen: dict[tuple[str, str], tuple[str, int, str | None]] = {}
    for framework, variant in runs:
        run_id = f"{framework}-{variant}"
        # What `agentjournal check` says of it before the deploy: what the resume does.
        said = forecast(fold(read_log(store_url, run_id)),
                        shape_of(framework, variant, module_receiver.url))
        assert said.action == {"finished": "continue", "paused": "pause"}[
            EXPECTED[framework, variant][0]], (run_id, said.sentence)
        out = resume(framework, variant, module_receiver.url, prefix + run_id, store_url,
                     run_id)
        state = fold(read_log(store_url, run_id))
        reason = state.pause_reason or ""
        want = EXPECTED[framework, variant][2]
        seen[framework, variant] = (state.status, len(out["asked"]),
                                    want if want and want in reason else reason or None)
        assert state.versions[0] != state.versions[-1], run_id  # the new code's version
        if state.status == "finished":
            assert out["output"] == f"posted {prefix}{run_id}", run_id
        if (framework, variant) in CHANGED_PARTS:
            told = [e.payload for e in read_log(store_url, run_id)
                    if e.type is E.REQUEST_CHANGED]
            assert len(told) == 1 and told[0]["n"] == 0, (run_id, told)
            assert CHANGED_PARTS[framework, variant] in told[0]["changed"], (run_id, told)
    assert seen == EXPECTED
    # Each effect once: nothing was posted again, under its key or under a new one.
    again = {k.removeprefix(prefix): n for k, n in module_receiver.by_label().items()
             if k.startswith(prefix)}
    assert again == posted


# --- in process ---------------------------------------------------------------------------


def turn_of(value: Any) -> Turn:
    return Turn(text=value["text"])


def test_a_changed_request_is_served_and_told_once_naming_its_parts(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'j.db'}")
    asked = {"instructions": "i1", "tools": "t1", "model": "m1"}
    with open_run(store, "r", input="hi", agent_version="v1") as run:
        run.step("model.request", "fp-1", lambda: {"text": "one"}, turn=turn_of, parts=asked)
    ran: list[str] = []
    for _ in range(2):  # two resumes under the new code: the change is told once
        with open_run(store, "r", agent_version="v2") as run:
            served = run.step("model.request", "fp-2", lambda: ran.append("x"), turn=turn_of,
                              parts=lambda: {**asked, "tools": "t2", "model": "m2"})
            run.step("model.request", "fp-2", lambda: ran.append("x"), turn=turn_of,
                     position=0)  # the same position asked again in this process
        assert served == {"text": "one"} and ran == []
    told = [e.payload for e in store.read("r") if e.type is E.REQUEST_CHANGED]
    assert told == [{"step": "model.request", "n": 0, "recorded": "fp-1", "asked": "fp-2",
                     "changed": ["model", "tools"], "seq": told[0]["seq"]}]
    state = fold(store.read("r"))
    assert state.versions == ["v1", "v2"] and state.resumes == 2
    with pytest.raises(NondeterminismError), open_run(store, "r", strict=True) as run:
        run.step("model.request", "fp-3", lambda: {"text": "x"}, turn=turn_of)
    store.close()


def test_a_recording_without_parts_says_the_request_changed(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'j.db'}")
    with open_run(store, "r", input="hi") as run:
        run.step("model.request", "fp-1", lambda: {"text": "one"}, turn=turn_of)
    with open_run(store, "r") as run:
        run.step("model.request", "fp-2", lambda: {"text": "x"}, turn=turn_of,
                 parts={"instructions": "i2"})
    (told,) = [e.payload for e in store.read("r") if e.type is E.REQUEST_CHANGED]
    assert told["changed"] == ["request"]
    store.close()


def test_a_call_made_under_another_key_pauses_and_resolve_settles_it(tmp_path: Path) -> None:
    """The bridge's rule by itself: a call id the log holds open under another key is not
    made; a person's verdict on the recorded call then answers it."""
    from click.testing import CliRunner

    from agentjournal.cli import cli

    url = f"sqlite:///{tmp_path / 'j.db'}"
    store = open_store(url)
    made: list[str] = []

    def lost(ctx: Any) -> Any:
        made.append(ctx.key)
        raise ConnectionResetError("dropped after sending")

    with open_run(store, "r", input="hi") as run, pytest.raises(NeedsPerson):
        run.call("post", {"label": "a", "note": "x"}, call_id="c1", body=lost,
                 identity=["label"])
    with open_run(store, "r") as run, pytest.raises(CodeChanged) as caught:
        run.call("post", {"label": "a", "note": "x"}, call_id="c1", body=lost)
    assert len(made) == 1 and "key changed" in caught.value.reason
    assert "agentjournal resolve r" in caught.value.reason
    state = fold(store.read("r"))
    assert state.status == "paused" and "key changed" in (state.pause_reason or "")
    old_key = next(iter(state.pending.values())).key
    store.close()
    decided = CliRunner().invoke(cli, ["resolve", "r", old_key[:16], "--happened", "--by",
                                       "ana", "--store", url, "--result", '"sent"'])
    assert decided.exit_code == 0, decided.output
    store = open_store(url)
    with open_run(store, "r") as run:
        assert run.call("post", {"label": "a", "note": "x"}, call_id="c1", body=lost) == "sent"
    assert len(made) == 1
    store.close()


def test_a_call_the_code_does_not_make_again_pauses_the_next_turn(tmp_path: Path) -> None:
    """A call left uncertain that the new code never makes again (its tool refused the
    recorded arguments, say) is not left behind: the next turn is not asked."""
    store = open_store(f"sqlite:///{tmp_path / 'j.db'}")

    def lost(ctx: Any) -> Any:
        raise ConnectionResetError("dropped after sending")

    with open_run(store, "r", input="hi") as run, pytest.raises(NeedsPerson):
        run.call("post", {"label": "a"}, call_id="c1", body=lost)
    asked: list[str] = []
    with open_run(store, "r") as run, pytest.raises(CodeChanged) as caught:
        run.step("model.request", "fp", lambda: asked.append("x"), turn=turn_of,
                 tools={"post"})
    assert asked == [] and "did not make it again" in caught.value.reason
    assert fold(store.read("r")).status == "paused"
    store.close()


def test_an_sdk_run_waiting_on_an_uncertain_call_keeps_its_recorded_key_across_a_deploy(
        tmp_path: Path, module_receiver: Any) -> None:
    """The SDK's interruption for an uncertain call, resumed after the tool's identity
    changed: the pause names the key the call was started under (the one a person
    resolves), and once resolved the call is answered from that, never made again."""
    from click.testing import CliRunner

    from agentjournal.cli import cli
    from agentjournal.integrations.openai_agents import JournalRunner

    url, label = f"sqlite:///{tmp_path / 'j.db'}", "sdk-wait-a"
    counted = lambda: module_receiver.by_label().get(label)  # noqa: E731
    store = open_store(url)
    agent, policies = sdk_agent("base", module_receiver.url, label, Asked(), lookup=False,
                                lost=True)
    first = JournalRunner.run_sync(agent, TASK, store=store, run_id="w", policies=policies)
    assert first.interruptions and counted() == 1
    (pending,) = fold(store.read("w")).pending.values()
    asked = Asked()
    changed, changed_policies = sdk_agent("identity_changed", module_receiver.url, label,
                                          asked, lookup=False)
    again = JournalRunner.run_sync(changed, TASK, store=store, run_id="w",
                                   policies=changed_policies, version="release-2")
    state = fold(store.read("w"))
    assert state.versions[-1] == "release-2" and len(state.versions) == 2
    assert again.interruptions and state.status == "paused" and asked.turns == []
    assert pending.key[:16] in (state.pause_reason or "")
    assert "identity fields changed" in (state.pause_reason or "")
    decided = CliRunner().invoke(cli, ["resolve", "w", pending.key[:16], "--happened", "--by",
                                       "ana", "--store", url, "--result", '"posted"'])
    assert decided.exit_code == 0, decided.output
    done = JournalRunner.run_sync(changed, TASK, store=store, run_id="w",
                                  policies=changed_policies)
    assert done.final_output == f"posted {label}" and counted() == 1
    assert asked.turns == ["openai_agents:identity_changed:1"]  # only the turn after it
    store.close()


def test_a_call_waiting_for_approval_under_changed_code_goes_to_a_person(
        tmp_path: Path) -> None:
    """A call waiting for a person's approval: asked again under another key (identity
    changed), or its tool gone from the turn that asked for it, pauses; nothing runs."""
    store = open_store(f"sqlite:///{tmp_path / 'j.db'}")
    args = {"order": 7, "cents": 500}

    def refund(ctx: Any) -> Any:
        raise AssertionError("a refund waiting for approval must not run")

    with open_run(store, "r", input="hi") as run:
        run.step("model.request", "fp", lambda: {"text": "", "calls": ["c1"]},
                 turn=lambda v: Turn(tool_calls=[{"id": "c1", "name": "refund", "args": args}]))
        with pytest.raises(NeedsPerson):  # NeedsApproval: recorded, waiting
            run.call("refund", args, call_id="c1", body=refund, identity=["order"],
                     approval=True)
    with open_run(store, "r") as run, pytest.raises(CodeChanged) as rekeyed:
        run.call("refund", args, call_id="c1", body=refund, approval=True)
    assert "waits for approval" in rekeyed.value.reason
    assert "key changed" in rekeyed.value.reason
    with open_run(store, "r") as run, pytest.raises(CodeChanged) as gone:
        run.step("model.request", "fp-2", lambda: {"text": "x"}, turn=turn_of,
                 tools={"refund_v2"})
    assert "no tool 'refund'" in gone.value.reason
    state = fold(store.read("r"))
    assert state.status == "paused" and state.approvals
    store.close()


def test_versions_and_describers_agree_with_what_a_run_records(
        tmp_path: Path, module_receiver: Any) -> None:
    """A Pydantic AI agent's describer gives the version its runs record; forecast says a
    resume under an unchanged agent continues, under a renamed tool pauses."""
    url = f"sqlite:///{tmp_path / 'j.db'}"
    agent = pydantic_agent("base", module_receiver.url, "ver-a", url, "v", Asked())
    shape = describe(agent)
    assert shape is not None and shape.tools["post_effect"].identity == ("label",)
    assert agent.run_sync(TASK).output == "posted ver-a"
    state = fold(read_log(url, "v"))
    assert state.versions == [shape.version] and state.instructions
    assert forecast(state, shape).action == "done"
    renamed = describe(pydantic_agent("tool_renamed", module_receiver.url, "x", url, "v",
                                      Asked()))
    assert renamed is not None and renamed.version != shape.version

    sdk, policies = sdk_agent("base", module_receiver.url, "x", Asked())
    from agentjournal.integrations.openai_agents import JournalAgent

    journal_agent = describe(JournalAgent(sdk, policies=policies))
    assert journal_agent is not None and journal_agent.tools["post_effect"].identity == (
        "label",)
    other, other_policies = sdk_agent("identity_changed", module_receiver.url, "x", Asked())
    changed = describe(JournalAgent(other, policies=other_policies))
    assert changed is not None and changed.version != journal_agent.version
