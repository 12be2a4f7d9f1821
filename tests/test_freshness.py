"""Observations with a freshness: a result older than its tool's ``fresh_for`` that the
model still reads is re-read (read-only) or marked stale before the next model turn; the
model is told what changed; a replay of the log gives the context the live run had."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import pytest
from click.testing import CliRunner

from agentjournal import (
    Agent,
    EventType,
    ModelRequest,
    ModelResponse,
    Rules,
    ScriptedModel,
    calls,
    decide_approval,
    fold,
    open_store,
    reply,
    tool,
)
from agentjournal.cli import cli
from agentjournal.demo.ledger import http_json
from agentjournal.events import Event
from agentjournal.state import RunState

from .conftest import backend_params
from .test_crash_models import Receiver

E = EventType
FRESH_FOR = 0.3  # seconds
HOLDS = 2.0  # seconds: a freshness a test's quick resume must stay within


class World:
    """What the tools read and change, and how often each was asked."""

    def __init__(self) -> None:
        self.balance = 100
        self.reads: Counter[str] = Counter()
        self.posted: list[int] = []
        self.requests: list[ModelRequest] = []


def make_agent(world: World, *, fresh_for: float | None = FRESH_FOR) -> Agent:
    @tool(effect="read_only", fresh_for=fresh_for)
    def balance(account: str) -> dict[str, Any]:
        world.reads[account] += 1
        return {"account": account, "balance": world.balance}

    @tool(effect="irreversible", identity=["ref"], fresh_for=fresh_for)
    def post(ref: str, amount: int) -> dict[str, Any]:
        world.posted.append(amount)
        return {"ref": ref, "posted": amount}

    def seen(response: ModelResponse) -> Any:
        def turn(request: ModelRequest) -> ModelResponse:
            world.requests.append(request)
            return response
        return turn

    script = [seen(calls(("balance", {"account": "cash"}))),
              seen(calls(("post", {"ref": "r1", "amount": 5}))),
              seen(calls(("post", {"ref": "r2", "amount": 7}))),
              seen(reply("done"))]
    return Agent(ScriptedModel(script), [balance, post],
                 policy=Rules(require_approval={"post"}))


def approve_all(store: Any, run_id: str) -> None:
    state = fold(list(store.read(run_id)))
    for approval_id in state.approvals:
        decide_approval(store, run_id, approval_id, approved=True, by="ana")


class Live:
    def __init__(self) -> None:
        self.states: dict[int, bytes] = {}

    def __call__(self, event: Event, state: RunState) -> None:
        self.states[event.seq] = msgspec.json.encode(state.messages)


@backend_params()
def test_a_stale_observation_is_re_read_before_the_next_turn_and_the_model_told(
        store_url: str, tmp_path: Path) -> None:
    world = World()
    agent = make_agent(world)
    live = Live()
    with open_store(store_url) as store:
        # Turn 1 reads the balance, turn 2 asks to post: the run waits for a person.
        assert agent.run(store, "r1", "post", observer=live).status == "waiting_approval"
        assert world.reads["cash"] == 1
        approve_all(store, "r1")
        world.balance = 80  # the world moves on while the run is paused
        time.sleep(FRESH_FOR + 0.1)
        agent.run(store, "r1", observer=live)  # posts r1, then turn 3 asks for r2: waits
        # One re-read before turn 3, never more.
        assert world.reads["cash"] == 2 and world.posted == [5]
        turn3 = world.requests[2]
        note = turn3.messages[-1]
        assert note.role == "user" and note.content.startswith("The world since")
        assert 'balance({"account":"cash"}), observed 0.' in note.content
        assert 'changed from {"account":"cash","balance":100} to' in note.content
        assert note.content.endswith('{"account":"cash","balance":80}')
        # The old observation is superseded in the context: the model reads 80 now.
        result = next(m for m in turn3.messages if m.role == "tool" and m.name == "balance")
        assert result.content == '{"account":"cash","balance":80}'
        checked = [e for e in store.read("r1") if e.type is E.OBSERVATIONS_CHECKED]
        assert len(checked) == 1
        verdicts = {i["tool"]: i["verdict"] for i in checked[0].payload["items"]}
        # post's completion came after the pause (fresh); balance was 0.4 s old.
        assert verdicts == {"balance": "changed"}
        # Replay gives the context the live run had, at every event.
        log = list(store.read("r1"))
        for seq, messages in live.states.items():
            assert msgspec.json.encode(fold(log[:seq]).messages) == messages, seq


def test_an_effect_past_its_freshness_is_marked_stale_not_re_made(tmp_path: Path) -> None:
    world = World()
    agent = make_agent(world)
    with open_store(f"sqlite:///{tmp_path / 'j.db'}") as store:
        agent.run(store, "r1", "post")
        approve_all(store, "r1")
        agent.run(store, "r1")  # posts r1, turn 3 asks r2
        approve_all(store, "r1")
        time.sleep(FRESH_FOR + 0.1)
        assert agent.run(store, "r1").status == "finished"
        assert world.posted == [5, 7]  # nothing re-made
        checked = [e for e in store.read("r1") if e.type is E.OBSERVATIONS_CHECKED]
        verdicts = sorted((i["tool"], i["verdict"]) for e in checked
                          for i in e.payload["items"])
        assert ("post", "stale") in verdicts
        note = world.requests[-1].messages[-1]
        assert "post(" in note.content and "may no longer hold" in note.content
        # Marked once: it is no longer tracked, so the next turn does not say it again.
        state = fold(list(store.read("r1")))
        stale = {i["call_id"] for e in checked for i in e.payload["items"]
                 if i["verdict"] == "stale"}
        assert stale and not stale & state.observations.keys()


def test_a_fresh_observation_is_not_re_read(tmp_path: Path) -> None:
    world = World()
    agent = make_agent(world, fresh_for=3600)
    with open_store(f"sqlite:///{tmp_path / 'j.db'}") as store:
        agent.run(store, "r1", "post")
        approve_all(store, "r1")
        agent.run(store, "r1")
        assert world.reads["cash"] == 1
        assert not any(e.type is E.OBSERVATIONS_CHECKED for e in store.read("r1"))


def test_show_says_what_the_world_did_since(tmp_path: Path) -> None:
    world = World()
    agent = make_agent(world)
    url = f"sqlite:///{tmp_path / 'j.db'}"
    with open_store(url) as store:
        agent.run(store, "r1", "post")
        approve_all(store, "r1")
        world.balance = 80
        time.sleep(FRESH_FOR + 0.1)
        agent.run(store, "r1")
    shown = CliRunner().invoke(cli, ["show", "r1", "--store", url], env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.stderr
    line = next(ln for ln in shown.stdout.splitlines() if "observations_checked" in ln)
    assert "the world since: 1 re-read (1 changed)" in line


@pytest.mark.parametrize("fresh_for", [-1.0, float("nan"), float("inf")])
def test_a_bad_freshness_is_refused(fresh_for: float) -> None:
    with pytest.raises(ValueError, match="fresh_for"):
        tool(effect="read_only", fresh_for=fresh_for)(lambda: 1)


def guarded_agent(world: World) -> Agent:
    @tool(effect="read_only", fresh_for=FRESH_FOR)
    def balance(account: str) -> dict[str, Any]:
        world.reads[account] += 1
        return {"account": account, "balance": world.balance}

    @tool(effect="irreversible", identity=["ref"], requires_fresh=["balance"])
    def post(ref: str, amount: int) -> dict[str, Any]:
        world.posted.append(amount)
        return {"ref": ref, "posted": amount}

    def seen(request: ModelRequest) -> ModelResponse:
        world.requests.append(request)
        return reply("done")

    script = [calls(("balance", {"account": "cash"})),
              calls(("post", {"ref": "r1", "amount": 5})), seen]
    return Agent(ScriptedModel(script), [balance, post], policy=Rules(require_approval={"post"}))


@pytest.mark.parametrize("moved", [True, False])
def test_a_tool_that_requires_a_fresh_read_re_reads_first(tmp_path: Path, moved: bool) -> None:
    world = World()
    agent = guarded_agent(world)
    with open_store(f"sqlite:///{tmp_path / 'j.db'}") as store:
        assert agent.run(store, "r1", "post").status == "waiting_approval"
        approve_all(store, "r1")  # approved on the balance it read then
        if moved:
            world.balance = 40
        time.sleep(FRESH_FOR + 0.1)
        assert agent.run(store, "r1").status == "finished"
        assert world.reads["cash"] == 2  # re-read once, before the post
        if moved:  # the post is denied with what changed; the model decides again
            assert world.posted == []
            denial = next(m for m in world.requests[-1].messages if m.name == "post")
            assert denial.is_error and 'balance({"account":"cash"}) changed' in denial.content
        else:
            assert world.posted == [5]
        log = list(store.read("r1"))
        before_last_turn = max(e.seq for e in log if e.type is E.MODEL_TURN) - 1
        assert msgspec.json.encode(fold(log[:before_last_turn]).messages) == (
            msgspec.json.encode(world.requests[-1].messages))


@backend_params()
def test_a_denied_stale_call_tells_the_model_what_it_believed_and_what_holds_now(
        store_url: str) -> None:
    """The same note as before a turn: the old value, the new one and the age, after the
    turn's results (never between them), and a replay gives the context the model read."""
    world = World()
    agent = guarded_agent(world)
    live = Live()
    with open_store(store_url) as store:
        assert agent.run(store, "r1", "post", observer=live).status == "waiting_approval"
        approve_all(store, "r1")
        world.balance = 40
        time.sleep(FRESH_FOR + 0.1)
        assert agent.run(store, "r1", observer=live).status == "finished"
        assert world.posted == []
        messages = world.requests[-1].messages
        denial = next(i for i, m in enumerate(messages) if m.name == "post")
        assert messages[denial].is_error and "balance(" in messages[denial].content
        note = messages[denial + 1]  # right after the last result, before the next turn
        assert note.role == "user" and note.content.startswith("The world since")
        assert 'balance({"account":"cash"}), observed 0.' in note.content
        assert ('changed from {"account":"cash","balance":100} to '
                '{"account":"cash","balance":40}') in note.content
        assert len(messages) == denial + 2
        log = list(store.read("r1"))
        for seq, seen in live.states.items():
            assert msgspec.json.encode(fold(log[:seq]).messages) == seen, seq
        # A log written before the check named its call (fold v7) folds as it did: no note.
        old = [msgspec.structs.replace(e, payload={
            k: v for k, v in e.payload.items() if k != "for_call"})
            if e.type is E.OBSERVATIONS_CHECKED else e for e in log]
        then = fold(old).messages
        assert not any(m.content.startswith("The world since") for m in then)
        assert then[-2].name == "post" and then[-2].is_error  # the denial, then the answer


def test_the_async_loop_re_reads_too(tmp_path: Path) -> None:
    import asyncio

    world = World()
    agent = make_agent(world)
    with open_store(f"sqlite:///{tmp_path / 'j.db'}") as store:
        asyncio.run(agent.arun(store, "r1", "post"))
        approve_all(store, "r1")
        world.balance = 80
        time.sleep(FRESH_FOR + 0.1)
        asyncio.run(agent.arun(store, "r1"))
        assert world.reads["cash"] == 2
        assert world.requests[2].messages[-1].content.endswith('"balance":80}')


@backend_params()
def test_the_receiver_sees_one_re_read_after_a_long_pause(store_url: str) -> None:
    """The receiver process's own count of reads: once before the pause, once after it
    (before the next turn), never again while the result is fresh."""
    receiver = Receiver()
    try:
        http_json("PUT", f"{receiver.url}/facts/cash", {"balance": 100})

        # Fresh long enough that the quick resume below stays within it on a loaded
        # machine (approving and resuming a JSONL run there took over 0.3 s).
        @tool(effect="read_only", fresh_for=HOLDS)
        def balance(account: str) -> dict[str, Any]:
            status, body = http_json("GET", f"{receiver.url}/facts/{account}")
            assert status == 200, body
            return dict(body)

        @tool(effect="irreversible", identity=["ref"])
        def post(ref: str) -> str:
            return ref

        requests: list[ModelRequest] = []

        def turn(response: ModelResponse) -> Any:
            return lambda request: requests.append(request) or response

        agent = Agent(ScriptedModel([turn(calls(("balance", {"account": "cash"}))),
                                     turn(calls(("post", {"ref": "r1"}))),
                                     turn(calls(("post", {"ref": "r2"}))), turn(reply("done"))]),
                      [balance, post], policy=Rules(require_approval={"post"}))

        def reads() -> int:
            return int(http_json("GET", f"{receiver.url}/effects")[1]["reads"].get("cash", 0))

        with open_store(store_url) as store:
            agent.run(store, "r1", "post")
            assert reads() == 1
            approve_all(store, "r1")
            http_json("PUT", f"{receiver.url}/facts/cash", {"balance": 55})
            time.sleep(HOLDS + 0.1)  # the run is down longer than the balance holds
            agent.run(store, "r1")
            assert reads() == 2  # re-read once, before turn 3
            assert requests[2].messages[-1].content.endswith('to {"balance":55}')
            approve_all(store, "r1")
            agent.run(store, "r1")  # resumed at once: the balance is still fresh
            assert reads() == 2
    finally:
        receiver.close()
