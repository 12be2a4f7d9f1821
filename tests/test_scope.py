"""Effects belong to the idempotency scope, not to one log: a fork (or another run of the
same operation) serves an effect another run of its scope recorded, treats one that run
left uncertain as uncertain here too, and never makes either again. The world does not
fork with the log; the receiver's own counts are the judge."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from agentjournal import Agent, EventType, fold, fork, open_run, open_store, operation_scope
from agentjournal.decisions import resolve_uncertain
from agentjournal.demo.ledger import LedgerService
from agentjournal.demo.reconcile import LEDGERS
from agentjournal.models import ModelResponse, ScriptedModel, calls, reply
from agentjournal.policy import Rules
from agentjournal.state import PendingCall
from agentjournal.store import Store
from agentjournal.tools import Conflict, Found, ToolContext, tool

from .builders import Crash
from .conftest import BACKENDS

E = EventType


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return open_store(f"sqlite:///{tmp_path / 'j.db'}")


class Receiver:
    """Applies every post it receives (no key dedupe unless asked) and counts them."""

    def __init__(self, *, dedupe: bool = False) -> None:
        self.applied: Counter[str] = Counter()
        self.by_key: dict[str, dict[str, Any]] = {}
        self.dedupe = dedupe
        self.lose: set[str] = set()  # names whose response is lost once, after applying

    def post(self, key: str, name: str, amount: int) -> dict[str, Any]:
        if not (self.dedupe and key in self.by_key):
            self.applied[name] += 1
            self.by_key[key] = {"name": name, "amount": amount, "n": self.applied[name]}
        if name in self.lose:
            self.lose.discard(name)
            raise TimeoutError("read timed out")
        return dict(self.by_key[key])


def posting(receiver: Receiver, effect: str = "irreversible", reconcile: Any = None) -> Any:
    @tool(effect=effect, identity=["name"], reconcile=reconcile)
    def post(ctx: ToolContext, name: str, amount: int) -> dict[str, Any]:
        """Post an entry."""
        return receiver.post(ctx.key, name, amount)

    return post


def one(name: str, amount: int = 1) -> ModelResponse:
    return calls(("post", {"name": name, "amount": amount}))


def script(*names: str) -> ScriptedModel:
    return ScriptedModel([calls(("post", {"name": "warmup", "amount": 0})),
                          *[one(n) for n in names], reply("posted")])


def first_start(store: Store, run_id: str, name: str) -> int:
    return next(e.seq for e in store.read(run_id)
                if e.type is E.TOOL_CALL_STARTED and e.payload["args"]["name"] == name)


def completions(store: Store, run_id: str) -> list[dict[str, Any]]:
    return [e.payload for e in store.read(run_id) if e.type is E.TOOL_CALL_COMPLETED]


def test_a_fork_serves_effects_its_origin_made_after_the_fork(store: Store) -> None:
    receiver = Receiver()
    origin = Agent(script("a", "b", "c"), [posting(receiver)])
    assert origin.run(store, "r1", "post a, b, c").status == "finished"
    at = first_start(store, "r1", "a") - 2  # before the turn that asks for "a"
    forked = fork(store, "r1", at, "r1-fork")
    result = Agent(script("a", "b", "c"), [posting(receiver)]).run(store, forked)
    assert result.status == "finished"
    assert receiver.applied == {"warmup": 1, "a": 1, "b": 1, "c": 1}
    origin_done = {c["idempotency_key"]: c for c in completions(store, "r1")}
    origin_seq = {e.payload["idempotency_key"]: e.seq for e in store.read("r1")
                  if e.type is E.TOOL_CALL_COMPLETED}
    served = [c for c in completions(store, forked)[1:]]  # the first is the prefix's warmup
    assert [c["source"] for c in served] == ["scope"] * 3
    for c in served:
        key = c["idempotency_key"]
        assert c["from"] == {"run_id": "r1", "seq": origin_seq[key]}
        assert c["result"] == origin_done[key]["result"]
    assert fold(store.read(forked)).completed[served[0]["idempotency_key"]].source == "scope"


def test_another_run_of_the_same_operation_serves_it_too(store: Store) -> None:
    receiver = Receiver()
    scope = operation_scope("acme", "q3-close")
    Agent(script("a"), [posting(receiver)]).run(store, "monday", "close q3", scope=scope)
    Agent(script("a"), [posting(receiver)]).run(store, "tuesday", "close q3", scope=scope)
    assert receiver.applied == {"warmup": 1, "a": 1}
    assert [c["source"] for c in completions(store, "tuesday")] == ["scope", "scope"]


@pytest.mark.parametrize("store_url", BACKENDS, indirect=True)
def test_a_call_another_run_of_the_scope_made_is_served_without_asking_a_person(
        store_url: str) -> None:
    """An approval is asked only for a call the scope has not made: the peers are asked
    first, even by a run that has not yet found it shares its scope."""
    receiver = Receiver()
    scope = operation_scope("acme", "q3-close")
    store = open_store(store_url)
    Agent(script("a"), [posting(receiver)]).run(store, "monday", "close q3", scope=scope)
    gated = Agent(script("a"), [posting(receiver)], policy=Rules(require_approval={"post"}))
    assert gated.run(store, "tuesday", "close q3", scope=scope).status == "finished"
    assert receiver.applied == {"warmup": 1, "a": 1}
    assert not [e for e in store.read("tuesday") if e.type is E.APPROVAL_REQUESTED]
    assert [c["source"] for c in completions(store, "tuesday")] == ["scope", "scope"]


def test_other_arguments_for_an_identity_done_elsewhere_are_denied(store: Store) -> None:
    receiver = Receiver()
    Agent(script("a"), [posting(receiver)]).run(store, "r1", "t")
    forked = fork(store, "r1", first_start(store, "r1", "a") - 2, "r1-fork")
    model = ScriptedModel([reply("unused"), one("a", amount=500), reply("ok")])
    assert Agent(model, [posting(receiver)]).run(store, forked).status == "finished"
    assert receiver.applied == {"warmup": 1, "a": 1}
    (denied,) = [e.payload for e in store.read(forked) if e.type is E.TOOL_CALL_DENIED]
    assert '"amount":1' in denied["reason"] and '"amount":500' in denied["reason"]
    assert "r1" in denied["reason"]
    assert not [c for c in completions(store, forked) if c.get("source") == "scope"]


def test_a_call_left_uncertain_elsewhere_waits_for_a_person_here(store: Store) -> None:
    receiver = Receiver()
    receiver.lose.add("a")
    paused = Agent(script("a"), [posting(receiver)]).run(store, "r1", "t")
    assert paused.status == "paused" and receiver.applied["a"] == 1
    forked = fork(store, "r1", first_start(store, "r1", "a") - 2, "r1-fork")
    waiting = Agent(script("a"), [posting(receiver)]).run(store, forked)
    assert waiting.status == "paused" and receiver.applied["a"] == 1  # never a blind call
    assert "r1" in (waiting.pause_reason or "") and "uncertain" in (waiting.pause_reason or "")
    # Settled where it is uncertain, the fork serves the effect.
    resolve_uncertain(store, "r1", paused.uncertain[0].key, outcome="happened", by="ana",
                      result={"name": "a", "amount": 1, "n": 1})
    assert Agent(script("a"), [posting(receiver)]).run(store, forked).status == "finished"
    assert receiver.applied["a"] == 1
    assert completions(store, forked)[-1]["from"]["run_id"] == "r1"


def test_a_call_left_uncertain_elsewhere_is_reconciled_here(store: Store) -> None:
    receiver = Receiver()
    receiver.lose.add("a")
    lookups: list[PendingCall] = []

    def lookup(call: PendingCall) -> Found:
        lookups.append(call)
        return Found({"name": "a", "found": True})

    Agent(script("a"), [posting(receiver)]).run(store, "r1", "t")  # paused: no lookup there
    forked = fork(store, "r1", first_start(store, "r1", "a") - 2, "r1-fork")
    result = Agent(script("a"), [posting(receiver, reconcile=lookup)]).run(store, forked)
    assert result.status == "finished" and receiver.applied["a"] == 1
    assert lookups[0].args == {"name": "a", "amount": 1}
    (verdict,) = [e.payload for e in store.read(forked) if e.type is E.TOOL_CALL_RECONCILED]
    assert verdict["verdict"] == "found" and verdict["from"]["run_id"] == "r1"
    assert completions(store, forked)[-1]["source"] == "reconciliation"


def test_a_conflict_found_for_a_call_left_elsewhere_waits_for_a_decision_there(
    store: Store,
) -> None:
    receiver = Receiver()
    receiver.lose.add("a")
    paused = Agent(script("a"), [posting(receiver)]).run(store, "r1", "t")
    forked = fork(store, "r1", first_start(store, "r1", "a") - 2, "r1-fork")
    lookups: list[PendingCall] = []

    def conflicting(call: PendingCall) -> Any:
        lookups.append(call)
        return Conflict({"name": "a", "amount": 999})

    def agent() -> Agent:
        return Agent(script("a"), [posting(receiver, reconcile=conflicting)])

    first = agent().run(store, forked)
    assert first.status == "escalated" and (first.escalation or {})["from"]["run_id"] == "r1"
    for _ in range(3):  # nothing was decided, here or there: nothing to append
        assert agent().run(store, forked).last_seq == first.last_seq
    assert len(lookups) == 1 and receiver.applied["a"] == 1
    # A person settles the call where it was started; the fork goes on from there.
    resolve_uncertain(store, "r1", paused.uncertain[0].key, outcome="happened", by="ana",
                      result={"name": "a", "amount": 1, "n": 1})
    assert agent().run(store, forked).status == "finished"
    assert receiver.applied["a"] == 1
    assert completions(store, forked)[-1]["source"] == "scope"


def test_an_idempotent_call_left_uncertain_elsewhere_is_retried_with_its_key(
    store: Store,
) -> None:
    receiver = Receiver(dedupe=True)

    @tool(effect="idempotent", identity=["name"])
    def post(ctx: ToolContext, name: str, amount: int) -> dict[str, Any]:
        receiver.post(ctx.key, name, amount)
        if name == "a":
            raise Crash  # applied, then the worker died
        return {"name": name}

    with pytest.raises(Crash):
        Agent(script("a"), [post]).run(store, "r1", "t")
    (uncertain,) = fold(store.read("r1")).pending.values()
    forked = fork(store, "r1", first_start(store, "r1", "a") - 2, "r1-fork")
    result = Agent(script("a"), [posting(receiver, effect="idempotent")]).run(store, forked)
    assert result.status == "finished" and receiver.applied["a"] == 1  # the receiver deduped
    (verdict,) = [e.payload for e in store.read(forked) if e.type is E.TOOL_CALL_RECONCILED]
    assert verdict["verdict"] == "retry" and verdict["from"] == {
        "run_id": "r1", "seq": uncertain.started_seq}
    (start,) = [e.payload for e in store.read(forked)
                if e.type is E.TOOL_CALL_STARTED and e.payload["args"]["name"] == "a"]
    assert start["key"] == uncertain.key


def test_a_fork_taken_mid_call_settles_it_from_the_origins_completion(store: Store) -> None:
    # The fork copies a start whose completion the origin recorded after the fork's seq:
    # it happened, so the fork must not pause for a person (nor make it again).
    receiver = Receiver()
    Agent(script("a"), [posting(receiver)]).run(store, "r1", "t")
    forked = fork(store, "r1", first_start(store, "r1", "a"), "r1-fork")
    assert fold(store.read(forked)).pending  # the copied start, without its completion
    result = Agent(script("a"), [posting(receiver)]).run(store, forked)
    assert result.status == "finished" and receiver.applied == {"warmup": 1, "a": 1}
    verdicts = [e.payload for e in store.read(forked) if e.type is E.TOOL_CALL_RECONCILED]
    assert [v["verdict"] for v in verdicts] == ["found"]
    assert completions(store, forked)[-1]["source"] == "scope"


def test_peers_are_folded_once_then_only_their_new_events(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    receiver = Receiver()
    Agent(script("a", "b", "c"), [posting(receiver)]).run(store, "r1", "t")
    forked = fork(store, "r1", first_start(store, "r1", "a") - 2, "r1-fork")
    reads: list[tuple[str, int]] = []
    real_read = store.read

    def spy(run_id: str, after_seq: int = 0) -> Any:
        reads.append((run_id, after_seq))
        return real_read(run_id, after_seq)

    monkeypatch.setattr(store, "read", spy)
    Agent(script("a", "b", "c"), [posting(receiver)]).run(store, forked)
    origin_reads = [after for run_id, after in reads if run_id == "r1"]
    assert origin_reads and origin_reads[0] == 0
    assert all(after == store.last_seq("r1") for after in origin_reads[1:])
    assert receiver.applied == {"warmup": 1, "a": 1, "b": 1, "c": 1}


def test_a_run_alone_in_its_scope_asks_no_peer(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each start is appended on condition that no other run shares the scope, checked in
    the append's own transaction: no scope query beside it (a round trip on PostgreSQL)."""
    asked: list[str] = []
    real_scope_runs = store.scope_runs

    def spy(scope: str) -> list[str]:
        asked.append(scope)
        return real_scope_runs(scope)

    monkeypatch.setattr(store, "scope_runs", spy)
    receiver = Receiver()
    assert Agent(script("a", "b"), [posting(receiver)]).run(store, "r1", "t").status == "finished"
    assert receiver.applied == {"warmup": 1, "a": 1, "b": 1}
    assert asked == []


@pytest.mark.parametrize("store_url", BACKENDS, indirect=True)
def test_a_run_joining_the_scope_of_an_open_one_is_asked_from_then_on(store_url: str) -> None:
    """r1 is alone in its scope until, during its model's second turn, another run of the
    same operation starts and posts "b". Then r1 asks for "b" too: its start, made on
    condition that r1 is alone, is refused, and r1 asks the other run instead (served);
    its next call asks it first. The receiver applies each entry once."""
    receiver = Receiver()
    scope = operation_scope("acme", "q3-close")
    store = open_store(store_url)

    def another_run_posts_b(_: Any) -> ModelResponse:
        other = Agent(ScriptedModel([one("b"), reply("posted")]), [posting(receiver)])
        assert other.run(store, "other", "post b", scope=scope).status == "finished"
        return one("b")

    model = ScriptedModel([one("a"), another_run_posts_b, one("c"), reply("posted")])
    try:
        result = Agent(model, [posting(receiver)]).run(store, "r1", "post a, b, c", scope=scope)
        assert result.status == "finished"
        assert receiver.applied == {"a": 1, "b": 1, "c": 1}
        assert [c["source"] for c in completions(store, "r1")] == ["tool", "scope", "tool"]
        assert len([e for e in store.read("r1") if e.type is E.TOOL_CALL_STARTED]) == 2
    finally:
        store.close()


def test_a_bridged_run_joined_by_another_of_its_scope_is_answered_from_it(
        store: Store) -> None:
    """The bridge clears its calls as the loop does: alone, a start asks no peer; once
    another run of the operation has posted "b", the bridged run's own "b" is refused
    alone, then answered from that run (its body never runs, and the framework is never
    told it did)."""
    receiver = Receiver()
    scope = operation_scope("acme", "q3-close")
    told: list[tuple[str, bool]] = []

    def post_via_bridge(run: Any, name: str, call_id: str) -> Any:
        return run.call("post", {"name": name, "amount": 1}, call_id=call_id,
                        identity=["name"], body=lambda ctx: receiver.post(ctx.key, name, 1),
                        executed=lambda ran: told.append((name, ran)))

    with open_run(store, "bridged", input="close q3", scope=scope) as run:
        assert post_via_bridge(run, "a", "c1")["n"] == 1
        other = Agent(ScriptedModel([one("b"), reply("posted")]), [posting(receiver)])
        assert other.run(store, "other", "post b", scope=scope).status == "finished"
        assert post_via_bridge(run, "b", "c2") == {"name": "b", "amount": 1, "n": 1}
    assert receiver.applied == {"a": 1, "b": 1}
    assert [c["source"] for c in completions(store, "bridged")] == ["tool", "scope"]
    assert told == [("a", True)]


# --- acceptance: real processes, a real ledger service counting -------------------------


def reconcile(store_url: str, run_id: str, ledger: LedgerService) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "agentjournal.demo.reconcile", "--store", store_url,
         "--run-id", run_id, "--ledger", ledger.url, "--mode", "lookup"],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert '"status": "finished"' in done.stdout, done.stdout


@pytest.mark.parametrize("store_url", BACKENDS, indirect=True)
def test_a_resumed_fork_does_not_repeat_its_origins_corrections(
    store_url: str, tmp_path: Path
) -> None:
    # A ledger that ignores idempotency keys: only the agent can prevent a repeat.
    with LedgerService(tmp_path / "ledger.db", idempotency=False) as ledger:
        reconcile(store_url, "q3", ledger)  # the origin: three corrections, a ticket
        store = open_store(store_url)
        try:
            log = list(store.read("q3"))
            turn = next(e.seq for e in log if e.type is E.MODEL_TURN and any(
                c["name"] == "post_correction" for c in e.payload["tool_calls"]))
            forked = fork(store, "q3", turn - 1, "q3-fork")  # before any correction
        finally:
            store.close()
        reconcile(store_url, forked, ledger)  # resumed in a new process
        effects = ledger.effects()
    assert effects["corrections"] == {f"q3-{name}": 1 for name in LEDGERS}
    assert list(effects["tickets"].values()) == [1]
    store = open_store(store_url)
    try:
        origin = {e.payload["idempotency_key"]: e.seq for e in store.read("q3")
                  if e.type is E.TOOL_CALL_COMPLETED and e.payload.get("idempotency_key")}
        fork_log = list(store.read(forked))
    finally:
        store.close()
    served = [e.payload for e in fork_log if e.type is E.TOOL_CALL_COMPLETED
              and e.payload.get("source") == "scope"]
    assert sorted(p["tool"] for p in served) == ["file_ticket", *["post_correction"] * 3]
    for p in served:  # the fork's log says where each result came from
        assert p["from"] == {"run_id": "q3", "seq": origin[p["idempotency_key"]]}
    assert not [e for e in fork_log if e.type is E.TOOL_CALL_STARTED
                and e.payload["tool"] != "read_ledger"]
