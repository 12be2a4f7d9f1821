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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from pydantic_ai import Agent, DeferredToolRequests, DeferredToolResults
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from agentjournal import EventType, NondeterminismError, fold, open_store
from agentjournal.cli import cli
from agentjournal.integrations.pydantic_ai import JournalDurability, effect_of_annotations

from .conftest import BACKENDS
from .pydantic_agent import CountingModel, drive, make_agent, poster

E = EventType
ROOT = Path(__file__).resolve().parents[1]
RUN = "pyd"


@pytest.fixture(scope="module")
def module_receiver() -> Iterator[Any]:
    """One receiver process for the module; each test's labels carry its own prefix."""
    from .test_crash_models import Receiver

    r = Receiver()
    try:
        yield r
    finally:
        r.close()


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


@pytest.mark.parametrize("store_url", BACKENDS, indirect=True)
@pytest.mark.parametrize("fault, asked", [
    ("model_call:1", 2), ("before_effect:1", 1), ("after_effect:1", 1)],
    ids=["during-model-request", "start-durable-before-post", "after-post-before-completion"])
def test_killed_in_each_window_then_resumed_each_effect_happens_once(
        request: pytest.FixtureRequest, store_url: str, module_receiver: Any, fault: str,
        asked: int) -> None:
    prefix = f"{request.node.callspec.id}-"
    killed_child("--store", store_url, "--run-id", RUN, "--receiver", module_receiver.url,
                 "--prefix", prefix, env={"AGENTJOURNAL_FAULT": fault})
    out = drive(store_url, RUN, module_receiver.url, "lookup", prefix)  # resumed here
    assert out["status"] == "finished" and out["output"] == done_text(prefix)
    assert counted(module_receiver, prefix) == {"a": 1, "b": 1}
    assert out["model_calls"] == asked  # a recorded turn is not asked again
    log = log_of(store_url)
    assert sum(e.type is E.MODEL_TURN for e in log) == 2
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


def test_a_changed_request_at_a_recorded_place_is_a_nondeterminism_error(
        tmp_path: Path, module_receiver: Any) -> None:
    url = f"sqlite:///{tmp_path / 'j.db'}"
    drive(url, RUN, module_receiver.url, "lookup", "nd-")
    agent = make_agent(module_receiver.url, CountingModel(["nd-a", "nd-b"]),
                       JournalDurability(url, RUN), "lookup")
    agent.instructions("Be terse.")  # the request the run recorded asked without it
    with pytest.raises(NondeterminismError) as caught:
        agent.run_sync("post nd-a, nd-b")
    assert caught.value.recorded != caught.value.given
    assert caught.value.recorded in str(caught.value) and caught.value.given in str(caught.value)


def test_show_events_and_runs_display_the_run_like_a_native_one(
        tmp_path: Path, module_receiver: Any) -> None:
    url = f"sqlite:///{tmp_path / 'j.db'}"
    drive(url, RUN, module_receiver.url, "lookup", "show-")
    shown = CliRunner().invoke(cli, ["show", RUN, "--store", url])
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
