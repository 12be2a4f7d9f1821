"""Compensation sagas in process: the plan, the order, a blocked saga, failures and
uncertain undos handed to a person, live state against the fold, and the run never
driven again. (Real processes killed mid-saga: test_saga_crash.py.)"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from agentjournal import (
    Absent,
    Agent,
    EventType,
    Found,
    NotCancellableError,
    Rules,
    ScriptedModel,
    ToolContext,
    ToolFailed,
    Undo,
    Unknown,
    UnsettledError,
    calls,
    cancel,
    compensate,
    fold,
    open_store,
    reply,
    resolve_uncertain,
    tool,
)
from agentjournal.events import Event
from agentjournal.state import RunState
from agentjournal.store import Store

from .conftest import backend_params

E = EventType


class Ledger:
    """A receiver that keeps balances, applies each key once, and says what it holds."""

    def __init__(self) -> None:
        self.balance: Counter[str] = Counter()
        self.done: dict[str, Any] = {}  # key -> result
        self.applied: Counter[str] = Counter()  # what the receiver itself applied, by kind
        self.fail_undo: list[Exception] = []  # raised before an undo is applied
        self.lose_after_undo = 0  # undos applied whose response is then lost

    def post(self, key: str, account: str, amount: int) -> dict[str, Any]:
        if key not in self.done:
            self.balance[account] += amount
            self.applied["post"] += 1
            self.done[key] = {"account": account, "amount": amount}
        return dict(self.done[key])

    def reverse(self, undo: Undo) -> dict[str, Any]:
        if self.fail_undo:
            raise self.fail_undo.pop(0)
        if undo.key not in self.done:
            self.balance[undo.args["account"]] -= undo.args["amount"]
            self.applied["reverse"] += 1
            self.done[undo.key] = {"reversed": undo.effect_key[:8]}
        if self.lose_after_undo:
            self.lose_after_undo -= 1
            raise TimeoutError("the response to the reversal was lost")
        return dict(self.done[undo.key])


def agent_for(ledger: Ledger, posts: list[tuple[str, int]], *, lookup: Any = None,
              irreversible_at: int | None = None) -> Agent:
    def reversal_lookup(undo: Undo) -> Any:
        if lookup is not None:
            return lookup(undo)
        return Found(ledger.done[undo.key]) if undo.key in ledger.done else Absent()

    @tool(effect="reversible", identity=["account", "ref"], compensate=ledger.reverse,
          compensation_lookup=reversal_lookup)
    def post(ctx: ToolContext, account: str, ref: str, amount: int) -> dict[str, Any]:
        return ledger.post(ctx.key, account, amount)

    @tool(effect="irreversible", identity=["to"])
    def send_email(ctx: ToolContext, to: str) -> str:
        ledger.applied["email"] += 1
        return "sent"

    @tool(effect="read_only")
    def balance(account: str) -> int:
        return ledger.balance[account]

    turns = []
    for i, (account, amount) in enumerate(posts):
        if i == irreversible_at:
            turns.append(calls(("send_email", {"to": "cfo@example.com"})))
        turns.append(calls(("post", {"account": account, "ref": f"r{i}", "amount": amount}),
                           ("balance", {"account": account})))
    return Agent(ScriptedModel([*turns, reply("posted")]), [post, send_email, balance])


POSTS = [("cash", 100), ("fees", 7), ("cash", -30)]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with open_store(f"sqlite:///{tmp_path / 'j.db'}") as opened:
        yield opened


def types(store: Store, run_id: str) -> list[str]:
    return [e.type.value for e in store.read(run_id)]


class Live:
    """The live state after each event a saga appends, to compare with the fold."""

    def __init__(self) -> None:
        self.states: dict[int, bytes] = {}

    def __call__(self, event: Event, state: RunState) -> None:
        self.states[event.seq] = msgspec.json.encode(state)

    def equal_the_fold(self, store: Store, run_id: str) -> None:
        log = list(store.read(run_id))
        assert self.states and [e.seq for e in log] == list(range(1, len(log) + 1))
        for seq, live in self.states.items():
            assert msgspec.json.encode(fold(log[:seq])) == live, f"differs at seq {seq}"


@backend_params()
def test_three_effects_undone_newest_first_each_once(store_url: str) -> None:
    ledger = Ledger()
    agent = agent_for(ledger, POSTS)
    with open_store(store_url) as store:
        assert agent.run(store, "r1", "post them").status == "finished"
        assert dict(ledger.balance) == {"cash": 70, "fees": 7}
        live = Live()
        result = compensate(store, "r1", agent.tools.values(), reason="wrong batch", by="ana",
                            observer=live)
        assert result.status == "compensated" and result.remaining == []
        assert dict(+ledger.balance) == {} and ledger.applied["reverse"] == 3
        log = list(store.read("r1"))
        undone = [e.payload["effect_seq"] for e in log if e.type is E.COMPENSATION_COMPLETED]
        assert undone == sorted(undone, reverse=True)  # newest first
        assert types(store, "r1")[-1] == "saga_finished"
        # Again: nothing more is undone, nothing appended.
        again = compensate(store, "r1", agent.tools.values(), by="ana")
        assert again.status == "compensated" and ledger.applied["reverse"] == 3
        assert len(list(store.read("r1"))) == len(log)
        # The loop never drives a compensated run again.
        assert agent.run(store, "r1").status == "compensated"
        assert ledger.applied["post"] == 3 and len(list(store.read("r1"))) == len(log)
        live.equal_the_fold(store, "r1")


def test_through_seq_undoes_only_what_came_after(store: Store) -> None:
    ledger = Ledger()
    agent = agent_for(ledger, POSTS)
    agent.run(store, "r1", "post them")
    first_post = next(e.seq for e in store.read("r1") if e.type is E.TOOL_CALL_COMPLETED
                      and e.payload["tool"] == "post")
    result = compensate(store, "r1", agent.tools.values(), through_seq=first_post)
    assert result.status == "compensated" and len(result.undone) == 2
    assert dict(+ledger.balance) == {"cash": 100}


def test_an_irreversible_effect_stops_the_saga_before_it(store: Store) -> None:
    ledger = Ledger()
    agent = agent_for(ledger, POSTS, irreversible_at=2)  # an email between post 1 and 2
    agent.run(store, "r1", "post them")
    result = compensate(store, "r1", agent.tools.values())
    assert result.status == "escalated" and len(result.undone) == 1
    assert result.blocked is not None and result.blocked["tool"] == "send_email"
    assert result.escalation is not None and "send_email" in result.escalation["reason"]
    assert dict(+ledger.balance) == {"cash": 100, "fees": 7}  # the two before it stand
    assert ledger.applied["email"] == 1
    # Nothing decided: asked again, the saga stays where it stopped.
    assert compensate(store, "r1", agent.tools.values()).status == "escalated"
    # A person goes on: the email stands, the saga finishes naming it, nothing more undone.
    done = compensate(store, "r1", agent.tools.values(), by="ana", reason="email stands")
    assert done.status == "compensated" and ledger.applied["reverse"] == 1
    finished = list(store.read("r1"))[-1]
    assert finished.type is E.SAGA_FINISHED
    assert finished.payload["blocked_stands"]["tool"] == "send_email"


def test_an_uncertain_undo_the_lookup_cannot_tell_waits_for_a_person(store: Store) -> None:
    ledger = Ledger()
    agent = agent_for(ledger, POSTS, lookup=lambda undo: Unknown("ledger API down"))
    agent.run(store, "r1", "post them")
    ledger.lose_after_undo = 1  # the newest reversal is applied, its response lost
    result = compensate(store, "r1", agent.tools.values())
    assert result.status == "escalated" and len(result.uncertain) == 1
    assert len(result.remaining) == 3 and ledger.applied["reverse"] == 1
    assert result.escalation is not None
    assert "lookup said unknown" in result.escalation["reason"]
    left = [u["effect_seq"] for u in result.escalation["left"]]
    assert left == sorted(left, reverse=True) and len(left) == 3
    # Asked again with nothing decided: no new lookup, no second reversal.
    assert compensate(store, "r1", agent.tools.values()).status == "escalated"
    assert ledger.applied["reverse"] == 1
    resolve_uncertain(store, "r1", result.uncertain[0], outcome="happened", by="ana",
                      reason="the ledger shows the reversal")
    live = Live()
    done = compensate(store, "r1", agent.tools.values(), observer=live)
    assert done.status == "compensated" and ledger.applied["reverse"] == 3
    assert dict(+ledger.balance) == {}
    live.equal_the_fold(store, "r1")


def test_an_uncertain_undo_found_by_its_lookup_is_not_sent_again(store: Store) -> None:
    ledger = Ledger()
    agent = agent_for(ledger, POSTS)
    agent.run(store, "r1", "post them")
    ledger.lose_after_undo = 1
    result = compensate(store, "r1", agent.tools.values())
    assert result.status == "compensated" and ledger.applied["reverse"] == 3
    verdicts = [e.payload["verdict"] for e in store.read("r1")
                if e.type is E.TOOL_CALL_RECONCILED]
    assert verdicts == ["found"]


def test_a_failing_undo_is_retried_then_escalated_with_what_is_left(store: Store) -> None:
    ledger = Ledger()
    agent = agent_for(ledger, POSTS)
    agent.run(store, "r1", "post them")
    ledger.fail_undo = [ToolFailed("account frozen")] * 3
    result = compensate(store, "r1", agent.tools.values(), retries=2)
    assert result.status == "escalated" and ledger.applied["reverse"] == 0
    assert result.escalation is not None
    assert "failed 3 times: account frozen" in result.escalation["reason"]
    assert len(result.escalation["left"]) == 3
    assert list(result.failures.values()) == ["account frozen"]
    # Nothing decided: asking as the library changes nothing.
    assert compensate(store, "r1", agent.tools.values()).status == "escalated"
    # A person who fixed the account asks again: recorded as their decision, and it goes on.
    done = compensate(store, "r1", agent.tools.values(), by="ana", reason="account thawed")
    assert done.status == "compensated" and ledger.applied["reverse"] == 3
    resumed = [e for e in store.read("r1") if e.type is E.RUN_RESUMED]
    assert resumed[-1].payload == {"by": "ana", "reason": "account thawed"}


def test_an_undo_the_lookup_finds_absent_is_made_again_once(store: Store) -> None:
    ledger = Ledger()
    agent = agent_for(ledger, POSTS)
    agent.run(store, "r1", "post them")
    ledger.fail_undo = [ConnectionResetError("reset before the request left")]
    result = compensate(store, "r1", agent.tools.values())
    assert result.status == "compensated" and ledger.applied["reverse"] == 3
    verdicts = [e.payload["verdict"] for e in store.read("r1")
                if e.type is E.TOOL_CALL_RECONCILED]
    assert verdicts == ["absent"]
    starts = [e.payload["attempt"] for e in store.read("r1")
              if e.type is E.COMPENSATION_STARTED]
    assert starts == [1, 2, 1, 1]


def test_a_cancelled_run_is_never_driven_again(store: Store) -> None:
    ledger = Ledger()
    agent = agent_for(ledger, POSTS)
    agent.run(store, "done", "post them")
    with pytest.raises(NotCancellableError, match="finished: there is nothing to cancel"):
        cancel(store, "done", by="ana")
    waiting = Agent(agent.model, list(agent.tools.values()),
                    policy=Rules(approve_if={"post": lambda c: c.args["ref"] == "r1"}))
    assert waiting.run(store, "r1", "post them").status == "waiting_approval"
    assert cancel(store, "r1", by="ana", reason="withdrawn") is None
    log = list(store.read("r1"))
    assert log[-1].type is E.RUN_CANCELLED and log[-1].payload == {"by": "ana",
                                                                   "reason": "withdrawn"}
    assert cancel(store, "r1", by="ana") is None  # again: nothing new
    assert waiting.run(store, "r1").status == "cancelled"
    assert len(list(store.read("r1"))) == len(log) and ledger.applied["post"] == 4
    # Its effects can still be undone.
    result = compensate(store, "r1", agent.tools.values(), by="ana")
    assert result.status == "compensated" and len(result.undone) == 1


def test_a_saga_waits_until_uncertain_calls_are_settled(store: Store) -> None:
    ledger = Ledger()

    @tool(effect="irreversible", identity=["ref"])
    def wire(ref: str) -> str:
        raise TimeoutError("no answer")

    agent = Agent(ScriptedModel([calls(("wire", {"ref": "w1"})), reply("sent")]), [wire])
    agent.run(store, "r1", "wire it")
    before = len(list(store.read("r1")))
    with pytest.raises(UnsettledError, match="settle each first"):
        compensate(store, "r1", agent.tools.values(), by="ana")
    assert len(list(store.read("r1"))) == before  # nothing recorded
    assert ledger.applied == Counter()
