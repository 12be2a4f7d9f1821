"""The bridge (agentjournal.bridge): a run another framework's loop steps through, on
every backend. Crash tests run a small foreign loop (tests/bridge_agent.py) in a child
process killed with SIGKILL in each window, resumed in a new one; the receiver process
(tests/crash_agent.py) counts the effects it is sent, deduping nothing."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from agentjournal import (
    CallRefused,
    CallSpec,
    EventType,
    LeaseHeldError,
    NeedsApproval,
    NeedsPerson,
    NondeterminismError,
    RunMismatchError,
    ToolContext,
    ToolFailed,
    Turn,
    current_call,
    decide_approval,
    fold,
    open_run,
    open_store,
)
from agentjournal.cli import cli
from agentjournal.demo.ledger import http_json
from agentjournal.store import Store

from .bridge_agent import drive
from .conftest import BACKENDS

pytestmark = pytest.mark.parametrize("store_url", BACKENDS, indirect=True)

E = EventType
ROOT = Path(__file__).resolve().parents[1]
RUN = "bridged"


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    opened = open_store(store_url)
    yield opened
    opened.close()


def turn_of(value: dict[str, Any]) -> Turn:
    return Turn(text=value.get("text", ""), tool_calls=value.get("calls", []),
                usage={"input_tokens": 3, "output_tokens": 2})


# --- steps ------------------------------------------------------------------------------


def test_a_resumed_run_serves_recorded_steps_without_calling_their_body(store: Store) -> None:
    ran: list[str] = []
    executed: list[bool] = []

    def answer(text: str) -> Callable[[], dict[str, Any]]:
        return lambda: ran.append(text) or {"text": text}

    with open_run(store, RUN, agent="test", input="hi") as run:
        first = run.step("model.request", "fp-1", answer("one"), turn=turn_of)
        tools = run.step("toolset.get_tools", "fp-t", lambda: ["post"])
    with open_run(store, RUN, input="hi") as run:
        again = run.step("model.request", "fp-1", answer("other"), turn=turn_of,
                         executed=executed.append)
        again_tools = run.step("toolset.get_tools", "fp-t", lambda: ["changed"],
                               executed=executed.append)
        third = run.step("model.request", "fp-2", answer("two"), turn=turn_of,
                         executed=executed.append)
        run.finish(third["text"])
    assert (first, tools) == (again, again_tools) == ({"text": "one"}, ["post"])
    assert ran == ["one", "two"] and executed == [False, False, True]
    state = fold(store.read(RUN))
    assert state.status == "finished" and state.outcome == "two" and state.turns == 2
    assert [m.content for m in state.messages if m.role == "assistant"] == ["one", "two"]


def test_a_changed_fingerprint_in_strict_mode_is_a_nondeterminism_error_naming_both(
        store: Store) -> None:
    with open_run(store, RUN, input="hi") as run:
        run.step("model.request", "fp-recorded", lambda: {"text": "x"}, turn=turn_of)
    with pytest.raises(NondeterminismError) as caught, open_run(store, RUN, strict=True) as run:
        run.step("model.request", "fp-asked", lambda: {"text": "y"}, turn=turn_of)
    assert "fp-recorded" in str(caught.value) and "fp-asked" in str(caught.value)
    assert (caught.value.name, caught.value.position) == ("model.request", 0)


def test_a_resume_with_another_input_is_refused(store: Store) -> None:
    open_run(store, RUN, input={"q": 1}).close()
    with pytest.raises(RunMismatchError):
        open_run(store, RUN, input={"q": 2})


def test_the_lease_is_held_while_the_run_is_open(store: Store) -> None:
    with open_run(store, RUN, input="hi"), pytest.raises(LeaseHeldError):
        open_run(store, RUN, owner="someone-else:1:x")


# --- calls ------------------------------------------------------------------------------


def test_a_call_answered_in_the_log_is_not_made_again(store: Store) -> None:
    made: list[str] = []

    def body(ctx: ToolContext) -> dict[str, Any]:
        assert current_call() == ctx
        made.append(ctx.key)
        return {"n": len(made)}

    for _ in range(2):
        with open_run(store, RUN, input="hi") as run:
            assert run.call("post", {"x": 1}, call_id="c1", body=body) == {"n": 1}
    assert len(made) == 1 and current_call() is None
    kinds = [e.type for e in store.read(RUN)]
    assert kinds.count(E.TOOL_CALL_STARTED) == 1 and kinds.count(E.TOOL_CALL_COMPLETED) == 1


def test_the_same_identity_with_other_arguments_is_refused(store: Store) -> None:
    with open_run(store, RUN, input="hi") as run:
        run.call("pay", {"order": 7, "amount": 5}, call_id="c1", identity=["order"],
                 body=lambda ctx: "paid")
        assert run.call("pay", {"order": 7, "amount": 5}, call_id="c2", identity=["order"],
                        body=lambda ctx: "again") == "paid"  # served, not made
        with pytest.raises(CallRefused, match="already done"):
            run.call("pay", {"order": 7, "amount": 9}, call_id="c3", identity=["order"],
                     body=lambda ctx: "twice")
    kinds = [e.type for e in store.read(RUN)]
    assert kinds.count(E.TOOL_CALL_STARTED) == 1
    assert E.TOOL_RESULT_SERVED in kinds and E.TOOL_CALL_DENIED in kinds


def test_a_proven_failure_is_recorded_and_replayed_as_one(store: Store) -> None:
    made = 0

    def refuse(ctx: ToolContext) -> None:
        nonlocal made
        made += 1
        raise ToolFailed("the receiver said no")

    for _ in range(2):
        with open_run(store, RUN, input="hi") as run, pytest.raises(ToolFailed, match="said no"):
            run.call("post", {"x": 1}, call_id="c1", body=refuse)
    assert made == 1


def test_an_idempotent_call_left_uncertain_is_retried_with_the_same_key(
        request: pytest.FixtureRequest, store: Store, module_receiver: Any) -> None:
    receiver, args = module_receiver, {"test": request.node.callspec.id}
    tries = 0

    def post(ctx: ToolContext) -> str:
        nonlocal tries
        tries += 1
        http_json("POST", f"{receiver.url}/effects", {"label": "i"}, {"Idempotency-Key": ctx.key})
        if tries == 1:
            raise TimeoutError("no answer after sending")
        return "ok"

    with open_run(store, RUN, input="hi") as run:
        assert run.call("post", args, call_id="c1", effect="idempotent", body=post) == "ok"
    keys = [e.payload["key"] for e in store.read(RUN) if e.type is E.TOOL_CALL_STARTED]
    assert len(keys) == 2 and len(set(keys)) == 1  # made again with the same key
    assert receiver.by_key()[keys[0]] == 2  # sent twice: the receiver dedupes on the key
    verdicts = [e.payload["verdict"] for e in store.read(RUN) if e.type is E.TOOL_CALL_RECONCILED]
    assert verdicts == ["retry"]


def test_an_uncertain_irreversible_call_pauses_for_a_person(store: Store) -> None:
    def lost(ctx: ToolContext) -> None:
        raise ConnectionResetError("reset after sending")

    with open_run(store, RUN, input="hi") as run, pytest.raises(NeedsPerson) as caught:
        run.call("charge", {"order": 7}, call_id="c1", body=lost)
    assert caught.value.key and caught.value.pending is not None
    state = fold(store.read(RUN))
    assert state.status == "paused" and [p.key for p in state.pending.values()] == [
        caught.value.key]


def test_an_approval_is_bound_to_the_exact_arguments(store: Store) -> None:
    made: list[int] = []

    def pay(amount: int) -> Callable[[ToolContext], int]:
        return lambda ctx: made.append(amount) or amount

    with open_run(store, RUN, input="hi") as run, pytest.raises(NeedsApproval) as caught:
        run.call("pay", {"amount": 5}, call_id="c1", approval=True, body=pay(5))
    assert fold(store.read(RUN)).status == "waiting_approval"
    decide_approval(store, RUN, caught.value.approval_id, approved=True, by="ana")
    with open_run(store, RUN, input="hi") as run:
        assert run.call("pay", {"amount": 5}, call_id="c1", approval=True, body=pay(5)) == 5
        with pytest.raises(NeedsApproval) as other:  # other arguments: another approval
            run.call("pay", {"amount": 6}, call_id="c2", approval=True, body=pay(6))
    assert made == [5] and other.value.approval_id != caught.value.approval_id


def test_a_batch_starts_in_one_append_in_the_order_given(store: Store) -> None:
    async def body(ctx: ToolContext) -> str:
        await asyncio.sleep(0)
        return ctx.call_id

    async def main() -> list[Any]:
        async with open_run(store, RUN, input="hi") as run:
            specs = [CallSpec(tool="t", args={"i": i}, call_id=f"c{i}", body=body)
                     for i in (2, 0, 1)]
            return [o.value for o in await run.acall_batch(specs)]

    assert asyncio.run(main()) == ["c2", "c0", "c1"]
    starts = [e for e in store.read(RUN) if e.type is E.TOOL_CALL_STARTED]
    assert [e.payload["call_id"] for e in starts] == ["c2", "c0", "c1"]
    assert [e.seq for e in starts] == list(range(starts[0].seq, starts[0].seq + 3))
    assert len({e.ts for e in starts}) == 1  # one batch: stamped together


def test_calls_from_several_threads_each_happen_once(store: Store) -> None:
    made: list[str] = []
    gate = threading.Barrier(4)

    def body(ctx: ToolContext) -> str:
        made.append(ctx.call_id)
        return ctx.call_id

    with open_run(store, RUN, input="hi") as run:
        def one(i: int) -> None:
            gate.wait()
            assert run.call("t", {"i": i}, call_id=f"c{i}", body=body) == f"c{i}"

        threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        run.finish("ok")
    assert sorted(made) == ["c0", "c1", "c2", "c3"]
    assert len(fold(store.read(RUN)).completed) == 4


# --- crashes: a real child process, SIGKILL, a receiver process --------------------------


def killed_child(store_url: str, receiver: Any, mode: str, fault: str, prefix: str) -> None:
    """The foreign loop in a child process, killed with SIGKILL at ``fault``."""
    done = subprocess.run([sys.executable, "-m", "tests.bridge_agent", "--store", store_url,
                           "--run-id", RUN, "--receiver", receiver.url, "--mode", mode,
                           "--prefix", prefix], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "AGENTJOURNAL_FAULT": fault}, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr


def counted(receiver: Any, prefix: str) -> dict[str, int]:
    """The receiver's own count of this test's effects, by label."""
    return {k.removeprefix(prefix): v for k, v in receiver.by_label().items()
            if k.startswith(prefix)}


#: (window, model requests the resume asks, verdicts): the after-POST window on every
#: backend by default (test_pydantic_ai.py kills the same bridge in the other windows);
#: every pair with --slow.
WINDOWS = [("model_call:1", 2, []), ("turn_staged:1", 2, []),
           ("before_effect:1", 1, ["absent"]), ("after_effect:1", 1, ["found"])]
DEFAULT_PAIRS = {("after_effect:1", "jsonl"), ("after_effect:1", "sqlite"),
                 ("after_effect:1", "postgres"), ("turn_staged:1", "sqlite")}


@pytest.mark.parametrize("fault, asked, verdicts", WINDOWS,
                         ids=["during-model-request", "turn-not-yet-stored",
                              "start-durable-before-post", "after-post-before-completion"])
def test_killed_in_a_window_and_resumed_each_effect_happens_once(
        request: pytest.FixtureRequest, store_url: str, module_receiver: Any, fault: str,
        asked: int, verdicts: list[str]) -> None:
    backend = request.node.callspec.params["store_url"]
    if (fault, backend) not in DEFAULT_PAIRS and not request.config.getoption("--slow"):
        pytest.skip("this window runs on another backend by default (--slow: all)")
    prefix = f"{request.node.callspec.id}-"
    killed_child(store_url, module_receiver, "lookup", fault, prefix)
    out = drive(store_url, RUN, module_receiver.url, "lookup", prefix)  # resumed here
    assert out["status"] == "finished" and out["outcome"] == done_text(prefix)
    assert counted(module_receiver, prefix) == {"a": 1, "b": 1}
    assert out["model_calls"] == asked  # the recorded turn was not asked again
    store = open_store(store_url)
    try:
        log = list(store.read(RUN))
    finally:
        store.close()
    assert [e.payload["verdict"] for e in log if e.type is E.TOOL_CALL_RECONCILED] == verdicts
    assert sum(e.type is E.MODEL_TURN for e in log) == 2


def test_an_uninterrupted_run_gives_the_same_output(
        request: pytest.FixtureRequest, store_url: str, module_receiver: Any) -> None:
    prefix = f"{request.node.callspec.id}-plain-"
    out = drive(store_url, RUN, module_receiver.url, "lookup", prefix)
    assert out["status"] == "finished" and out["outcome"] == done_text(prefix)
    assert counted(module_receiver, prefix) == {"a": 1, "b": 1} and out["model_calls"] == 2


def test_an_uncertain_call_without_a_lookup_is_resolved_by_a_person_then_not_made_again(
        request: pytest.FixtureRequest, store_url: str, module_receiver: Any) -> None:
    if request.node.callspec.params["store_url"] != "sqlite" and not request.config.getoption(
            "--slow"):
        pytest.skip("on SQLite by default (--slow: every backend); NeedsPerson and resolve "
                    "run on every backend in process above and in test_pydantic_ai.py")
    prefix = f"{request.node.callspec.id}-person-"
    killed_child(store_url, module_receiver, "none", "after_effect:1", prefix)
    out = drive(store_url, RUN, module_receiver.url, "none", prefix)
    assert out["status"] == "paused" and out["needs_person"] and out["model_calls"] == 0
    result = CliRunner().invoke(cli, [
        "resolve", RUN, out["needs_person"][:16], "--happened", "--by", "ana",
        "--result", json.dumps({"label": f"{prefix}a", "status": "applied"}),
        "--store", store_url])
    assert result.exit_code == 0, result.output
    out = drive(store_url, RUN, module_receiver.url, "none", prefix)
    assert out["status"] == "finished" and out["outcome"] == done_text(prefix)
    assert counted(module_receiver, prefix) == {"a": 1, "b": 1} and out["model_calls"] == 1


def done_text(prefix: str) -> str:
    return f"posted {prefix}a (applied), {prefix}b (applied)"


def test_a_step_at_a_given_position_replays_that_unit(store: Store) -> None:
    """A framework that continues a run from its history names the position itself."""
    with open_run(store, RUN, input="hi") as run:
        for n in range(3):
            run.step("model.request", f"fp-{n}", lambda n=n: {"text": str(n)}, turn=turn_of)
    ran: list[int] = []
    with open_run(store, RUN, strict=True) as run:
        assert run.step("model.request", "fp-2", lambda: ran.append(2), turn=turn_of,
                        position=2) == {"text": "2"}
        assert run.step("model.request", "fp-3", lambda: ran.append(3) or {"text": "3"},
                        turn=turn_of) == {"text": "3"}  # the next one: position 3
        with pytest.raises(NondeterminismError):
            run.step("model.request", "fp-other", lambda: {"text": "x"}, turn=turn_of,
                     position=1)
    assert ran == [3]


def test_concurrent_calls_of_one_action_make_it_once(store: Store) -> None:
    """Two tasks (a framework's parallel calls) asking for the same action at once: the
    second waits for the first, in flight, and is served its result; a start in flight is
    not an uncertain call, so nobody is asked to decide anything."""
    made: list[str] = []

    async def charge(ctx: ToolContext) -> str:
        made.append(ctx.call_id)
        await asyncio.sleep(0.05)  # still in flight when the second call arrives
        return "charged"

    async def main() -> list[Any]:
        async with open_run(store, RUN, input="hi") as run:
            return list(await asyncio.gather(*(
                run.acall("charge", {"order": 7}, call_id=f"c{i}", body=charge)
                for i in range(2))))

    assert asyncio.run(main()) == ["charged", "charged"]
    assert len(made) == 1
    kinds = [e.type for e in store.read(RUN)]
    assert kinds.count(E.TOOL_CALL_STARTED) == 1 and E.TOOL_RESULT_SERVED in kinds
    assert fold(store.read(RUN)).status == "running"


def test_one_action_twice_in_a_batch_is_made_once(store: Store) -> None:
    made: list[str] = []

    def charge(ctx: ToolContext) -> str:
        made.append(ctx.call_id)
        return "charged"

    with open_run(store, RUN, input="hi") as run:
        outcomes = run.call_batch([CallSpec(tool="charge", args={"order": 7}, call_id=f"c{i}",
                                            body=charge) for i in range(2)])
    assert [o.value for o in outcomes] == ["charged", "charged"] and made == ["c0"]


def test_recorded_lists_a_names_values_without_claiming_them(store: Store) -> None:
    with open_run(store, RUN, input="hi") as run:
        assert run.recorded("state") == []
        run.step("state", "s0", lambda: {"at": 0})
        run.step("state", "s1", lambda: {"at": 1})
    with open_run(store, RUN) as run:
        assert run.recorded("state") == [{"at": 0}, {"at": 1}]
        assert run.recorded("other") == []
        # Nothing was claimed: the next step of the name is still the first one, served.
        assert run.step("state", "s0", lambda: {"at": "again"}) == {"at": 0}
