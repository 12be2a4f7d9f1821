"""A run's identity and a call's intent: an empty run id never starts a new run, a resumed
run must be the run that was started, the same identity with other arguments is another
action (refused, never answered with the old result), and an escalated run waits for a
person instead of escalating again on every open."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from agentjournal import (
    Agent,
    EventType,
    InvalidRunIdError,
    JournalError,
    RunMismatchError,
    fold,
    new_run_id,
    open_store,
)
from agentjournal.decisions import resolve_uncertain
from agentjournal.models import ModelRequest, ModelResponse, ScriptedModel, calls, reply
from agentjournal.policy import Rules
from agentjournal.state import PendingCall
from agentjournal.store import Store, validate_run_id
from agentjournal.tools import Conflict, ToolContext, tool

E = EventType


@pytest.fixture
def store(each_backend: str) -> Store:
    return open_store(each_backend)


class Ledger:
    """Counts what it applies, by correction id; a lost response on request."""

    def __init__(self) -> None:
        self.applied: Counter[str] = Counter()
        self.rows: dict[str, dict[str, Any]] = {}
        self.lose_next = False

    def post(self, correction_id: str, amount: int) -> dict[str, Any]:
        self.applied[correction_id] += 1
        self.rows[correction_id] = {"correction_id": correction_id, "amount": amount}
        if self.lose_next:
            self.lose_next = False
            raise TimeoutError("read timed out")
        return dict(self.rows[correction_id])


def corrections(ledger: Ledger, reconcile: Any = None) -> Any:
    @tool(effect="irreversible", identity=["correction_id"], reconcile=reconcile)
    def post_correction(ctx: ToolContext, correction_id: str, amount: int) -> dict[str, Any]:
        """Post a correction."""
        return ledger.post(correction_id, amount)

    return post_correction


def post(cid: str, amount: int) -> ModelResponse:
    return calls(("post_correction", {"correction_id": cid, "amount": amount}))


# --- 1. run identity ---------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["", "   ", "\t\n", None])
def test_an_empty_run_id_is_refused_and_starts_nothing(store: Store, bad: Any) -> None:
    # A supervisor passing os.environ.get("RUN_ID", "") after a crash must not start a
    # fresh run that repeats every effect: it must be told its id is missing.
    ledger = Ledger()
    agent = Agent(ScriptedModel([post("C-1", 10), reply("ok")]), [corrections(ledger)])
    with pytest.raises(InvalidRunIdError, match="empty"):
        agent.run(store, bad, "post C-1")
    assert store.list_runs() == [] and ledger.applied == {}


def test_a_new_run_id_is_asked_for_explicitly(store: Store) -> None:
    ids = {new_run_id() for _ in range(100)}
    assert len(ids) == 100 and all(validate_run_id(i).startswith("run-") for i in ids)
    ledger = Ledger()
    run_id = new_run_id()
    agent = Agent(ScriptedModel([post("C-1", 10), reply("ok")]), [corrections(ledger)])
    assert agent.run(store, run_id, "post C-1").status == "finished"
    assert agent.run(store, run_id, "post C-1").status == "finished"  # same task: a resume
    assert ledger.applied == {"C-1": 1} and [r.run_id for r in store.list_runs()] == [run_id]


@pytest.mark.parametrize("field, given, recorded", [
    ("task", {"task": "post C-2 instead"}, "post C-1"),
    ("scope", {"scope": "op:acme:other"}, "op:acme:q3"),
    ("agent", {"agent_ref": "other:agent"}, "mine:agent"),
])
def test_resuming_with_another_task_scope_or_agent_is_refused(
    store: Store, field: str, given: dict[str, str], recorded: str
) -> None:
    ledger = Ledger()
    agent = Agent(ScriptedModel([post("C-1", 10), reply("ok")]), [corrections(ledger)],
                  policy=Rules(require_approval=["post_correction"]))
    first = agent.run(store, "r1", "post C-1", scope="op:acme:q3", agent_ref="mine:agent")
    assert first.status == "waiting_approval"
    with pytest.raises(RunMismatchError) as refused:
        agent.run(store, "r1", **{"task": "post C-1", **given})
    message = str(refused.value)
    assert isinstance(refused.value, JournalError)
    assert repr(recorded) in message and repr(next(iter(given.values()))) in message
    assert "new run id" in message and "resume" in message
    assert (refused.value.field, refused.value.recorded) == (field, recorded)
    assert store.last_seq("r1") == first.last_seq  # nothing appended
    # The recorded values, or none at all, are a plain resume.
    same = agent.run(store, "r1", "post C-1", scope="op:acme:q3", agent_ref="mine:agent")
    assert agent.run(store, "r1").status == same.status == "waiting_approval"


# --- 2. the same identity with different arguments is a different intent --------------


def test_same_identity_other_arguments_is_denied_not_served(store: Store) -> None:
    # C-6 was posted for 840 (approved). The model then asks for C-6 with 8400, over
    # the approval limit: it must not be told that the 8400 call succeeded.
    ledger = Ledger()
    seen: list[str] = []

    def then_ask_8400(req: ModelRequest) -> ModelResponse:
        return post("C-6", 8400)

    def look(req: ModelRequest) -> ModelResponse:
        seen.append(req.messages[-1].content)
        return reply("understood")

    limit = Rules(approve_if={"post_correction": lambda call: call.args["amount"] > 1000})
    agent = Agent(ScriptedModel([post("C-6", 840), then_ask_8400, look]),
                  [corrections(ledger)], policy=limit)
    result = agent.run(store, "r1", "fix C-6")
    assert result.status == "finished", result.pause_reason
    assert ledger.applied == {"C-6": 1} and ledger.rows["C-6"]["amount"] == 840
    log = list(store.read("r1"))
    assert not [e for e in log if e.type is E.TOOL_RESULT_SERVED]
    assert not [e for e in log if e.type is E.APPROVAL_REQUESTED]
    (denied,) = [e.payload for e in log if e.type is E.TOOL_CALL_DENIED]
    assert '"amount":840' in denied["reason"] and '"amount":8400' in denied["reason"]
    assert seen == [f"denied: {denied['reason']}"]
    state = fold(log)
    (done,) = state.completed.values()
    assert done.args == {"correction_id": "C-6", "amount": 840}


def test_an_approved_identity_asked_again_over_the_limit_is_denied(store: Store) -> None:
    # The reported case: C-6 for 840 needed approval and got it; C-6 for 8400 must
    # neither ride on that approval nor be answered with the 840 result.
    from agentjournal.decisions import decide_approval

    ledger = Ledger()
    limit = Rules(approve_if={"post_correction": lambda call: call.args["amount"] > 500})
    agent = Agent(ScriptedModel([post("C-6", 840), post("C-6", 8400), reply("ok")]),
                  [corrections(ledger)], policy=limit)
    waiting = agent.run(store, "r1", "fix C-6")
    decide_approval(store, "r1", waiting.approvals[0].approval_id, approved=True, by="ana")
    assert agent.run(store, "r1").status == "finished"
    assert ledger.applied == {"C-6": 1} and ledger.rows["C-6"]["amount"] == 840
    log = list(store.read("r1"))
    assert [e.type for e in log].count(E.APPROVAL_REQUESTED) == 1
    assert not [e for e in log if e.type is E.TOOL_RESULT_SERVED]
    (denied,) = [e.payload for e in log if e.type is E.TOOL_CALL_DENIED]
    assert '"amount":8400' in denied["reason"] and "not made" in denied["reason"]


def test_the_same_arguments_in_another_order_are_served(store: Store) -> None:
    ledger = Ledger()
    again = calls(("post_correction", {"amount": 840, "correction_id": "C-6"}))
    agent = Agent(ScriptedModel([post("C-6", 840), again, reply("ok")]), [corrections(ledger)])
    assert agent.run(store, "r1", "fix C-6").status == "finished"
    assert ledger.applied == {"C-6": 1}
    assert [e.type for e in store.read("r1")].count(E.TOOL_RESULT_SERVED) == 1


def test_a_reconciled_completion_keeps_the_calls_arguments(store: Store) -> None:
    ledger = Ledger()
    ledger.lose_next = True

    def lookup(call: PendingCall) -> Any:
        from agentjournal.tools import Found
        return Found(ledger.rows[call.args["correction_id"]])

    agent = Agent(ScriptedModel([post("C-6", 840), post("C-6", 8400), reply("ok")]),
                  [corrections(ledger, reconcile=lookup)])
    assert agent.run(store, "r1", "fix C-6").status == "finished"
    assert ledger.applied == {"C-6": 1}
    state = fold(store.read("r1"))
    (done,) = state.completed.values()
    assert done.source == "reconciliation"
    assert done.args == {"correction_id": "C-6", "amount": 840}
    assert [e.type for e in store.read("r1")].count(E.TOOL_CALL_DENIED) == 1


# --- 3. an escalated run waits for a person -----------------------------------------------


def test_an_escalated_run_stays_escalated_until_a_person_decides(store: Store) -> None:
    ledger = Ledger()
    lookups: list[str] = []

    def conflicting(call: PendingCall) -> Any:
        lookups.append(call.key)
        return Conflict({"correction_id": "C-6", "amount": 999})

    def agent() -> Agent:
        return Agent(ScriptedModel([post("C-6", 840), reply("ok")]),
                     [corrections(ledger, reconcile=conflicting)])

    ledger.lose_next = True
    first = agent().run(store, "r1", "fix C-6")
    assert first.status == "escalated" and len(lookups) == 1
    for _ in range(3):
        again = agent().run(store, "r1")
        assert again.status == "escalated" and again.last_seq == first.last_seq
    assert store.last_seq("r1") == first.last_seq and len(lookups) == 1
    # A person decides; the next open proceeds (and does not post again).
    resolve_uncertain(store, "r1", first.uncertain[0].key, outcome="happened", by="ana",
                      reason="checked by hand", result={"amount": 840})
    assert agent().run(store, "r1").status == "finished"
    assert ledger.applied == {"C-6": 1}
    log = [e.type for e in store.read("r1")]
    assert log.count(E.RUN_ESCALATED) == 1 and log.count(E.RUN_RESUMED) == 1


def test_a_person_who_says_conflict_keeps_the_run_escalated(store: Store) -> None:
    ledger = Ledger()
    ledger.lose_next = True
    paused = Agent(ScriptedModel([post("C-6", 840), reply("ok")]), [corrections(ledger)]).run(
        store, "r1", "fix C-6")
    assert paused.status == "paused"
    resolve_uncertain(store, "r1", paused.uncertain[0].key, outcome="conflict", by="ana",
                      reason="ledger shows 999")
    last = store.last_seq("r1")
    again = Agent(ScriptedModel([reply("ok")]), [corrections(ledger)]).run(store, "r1")
    assert again.status == "escalated" and again.last_seq == last


@pytest.mark.parametrize("bad", ["", "  "])
def test_a_fork_under_an_empty_id_is_refused(store: Store, bad: str) -> None:
    from agentjournal import fork

    Agent(ScriptedModel([reply("ok")]), []).run(store, "r1", "t")
    with pytest.raises(InvalidRunIdError, match="empty"):
        fork(store, "r1", 2, bad)
    assert [r.run_id for r in store.list_runs()] == ["r1"]
    assert fork(store, "r1", 2).startswith("r1.fork-")  # omitted: a new id, asked for
