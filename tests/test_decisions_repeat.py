"""A person's decisions are idempotent: repeating one that already stands the same way
reports that it stands and appends nothing; a contradicting repeat is refused, naming
what stands. In Python and through the command line."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner, Result

from agentjournal import (
    Agent,
    AlreadyDecidedError,
    NotPendingError,
    Rules,
    ScriptedModel,
    ToolContext,
    calls,
    decide_approval,
    open_store,
    reply,
    resolve_uncertain,
    tool,
)
from agentjournal.cli import cli
from agentjournal.decisions import record_approval, record_resolution
from agentjournal.store import Store
from agentjournal.tools import Found

from .builders import unsealed

FAIL_NEXT: set[str] = set()


@tool(effect="irreversible", identity=["name"])
def post(ctx: ToolContext, name: str, amount: int = 0) -> dict[str, Any]:
    """Post an entry; a name in FAIL_NEXT times out once (an uncertain call)."""
    if name in FAIL_NEXT:
        FAIL_NEXT.discard(name)
        raise TimeoutError("read timed out")
    return {"name": name}


def agent(**kw: Any) -> Agent:
    return Agent(ScriptedModel([calls(("post", {"name": "x", "amount": 5})), reply("ok")]),
                 [post], **kw)


@pytest.fixture
def url(each_backend: str) -> str:
    return each_backend


@pytest.fixture
def store(url: str) -> Any:
    s = open_store(url)
    yield s
    s.close()


def waiting(store: Store) -> str:
    """A run waiting for an approval; its approval id."""
    result = agent(policy=Rules(require_approval=["post"])).run(store, "r1", "t")
    return result.approvals[0].approval_id


def uncertain(store: Store) -> str:
    """A run paused on an uncertain irreversible call; its key."""
    FAIL_NEXT.add("x")
    return agent().run(store, "r1", "t").uncertain[0].key


def seqs(store: Store) -> int:
    return store.last_seq("r1")


# --- approvals -------------------------------------------------------------------------


def test_repeated_approval_returns_the_standing_decision(store: Store) -> None:
    approval_id = waiting(store)
    first = decide_approval(store, "r1", approval_id, approved=True, by="ana", reason="ok")
    end = seqs(store)
    again = record_approval(store, "r1", approval_id, approved=True, by="ana", reason="ok")
    assert not again.appended and unsealed(again.events) == [first] and seqs(store) == end
    assert unsealed([decide_approval(store, "r1", approval_id, approved=True, by="bo")]) == [
        first]
    assert seqs(store) == end


@pytest.mark.parametrize("first, then", [(True, False), (False, True)])
def test_contradicting_approval_is_refused_and_names_what_stands(
        store: Store, first: bool, then: bool) -> None:
    approval_id = waiting(store)
    decide_approval(store, "r1", approval_id, approved=first, by="ana", reason="because")
    end = seqs(store)
    with pytest.raises(AlreadyDecidedError) as err:
        decide_approval(store, "r1", approval_id, approved=then, by="bo", reason="no")
    stood = "approved" if first else "denied"
    assert f"{stood} by 'ana'" in str(err.value) and "'because'" in str(err.value)
    assert isinstance(err.value, NotPendingError) and seqs(store) == end


def test_an_unknown_approval_is_still_not_pending(store: Store) -> None:
    waiting(store)
    with pytest.raises(NotPendingError) as err:
        decide_approval(store, "r1", "approval-nope", approved=True, by="ana")
    assert not isinstance(err.value, AlreadyDecidedError)


def test_a_repeat_needs_no_lease_so_a_live_worker_does_not_block_it(store: Store) -> None:
    approval_id = waiting(store)
    decide_approval(store, "r1", approval_id, approved=True, by="ana")
    store.acquire("r1", "worker-on-another-host", 60)  # the resumed run is live
    assert not record_approval(store, "r1", approval_id, approved=True, by="ana").appended


# --- uncertain calls -------------------------------------------------------------------


def test_repeated_happened_returns_the_verdict_and_completion(store: Store) -> None:
    key = uncertain(store)
    first = resolve_uncertain(store, "r1", key[:10], outcome="happened", by="ana",
                              result={"n": 1})
    end = seqs(store)
    again = record_resolution(store, "r1", key[:10], outcome="happened", by="ana",
                              result={"n": 1})
    assert not again.appended and unsealed(again.events) == first and seqs(store) == end
    assert unsealed(resolve_uncertain(store, "r1", key, outcome="happened", by="ana")) == first
    for other in ("did_not_happen", "conflict"):
        with pytest.raises(AlreadyDecidedError, match="happened"):
            resolve_uncertain(store, "r1", key, outcome=other, by="bo")  # type: ignore[arg-type]
    assert seqs(store) == end


def test_did_not_happen_stands_after_the_run_retried_it(store: Store) -> None:
    key = uncertain(store)
    first = resolve_uncertain(store, "r1", key, outcome="did_not_happen", by="ana")
    assert agent().run(store, "r1").status == "finished"  # retried with the same key
    end = seqs(store)
    assert unsealed(resolve_uncertain(store, "r1", key, outcome="did_not_happen",
                                      by="ana")) == first
    with pytest.raises(AlreadyDecidedError, match="did_not_happen"):
        resolve_uncertain(store, "r1", key, outcome="happened", by="ana")
    assert seqs(store) == end


def test_repeated_conflict_does_not_escalate_twice_and_can_be_settled(store: Store) -> None:
    key = uncertain(store)
    first = resolve_uncertain(store, "r1", key, outcome="conflict", by="ana", reason="r")
    end = seqs(store)
    assert unsealed(resolve_uncertain(store, "r1", key, outcome="conflict", by="ana")) == first
    assert seqs(store) == end
    # A conflict leaves the call open for a person: settling it later is the next
    # decision, not a contradiction.
    settled = record_resolution(store, "r1", key, outcome="happened", by="ana")
    assert settled.appended and seqs(store) == end + 2


def test_a_call_the_agent_reconciled_stands_as_happened(store: Store) -> None:
    key = uncertain(store)
    found = tool(effect="irreversible", identity=["name"],
                 reconcile=lambda call: Found({"name": "x"}))(post.fn)
    Agent(ScriptedModel([reply("ok")]), [found]).run(store, "r1")
    end = seqs(store)
    assert not record_resolution(store, "r1", key, outcome="happened", by="ana").appended
    with pytest.raises(AlreadyDecidedError, match="reconciliation"):
        resolve_uncertain(store, "r1", key, outcome="did_not_happen", by="ana")
    with pytest.raises(NotPendingError):
        resolve_uncertain(store, "r1", "zz", outcome="happened", by="ana")
    assert seqs(store) == end


# --- the command line ------------------------------------------------------------------


def invoke(*args: Any) -> Result:
    return CliRunner().invoke(cli, [str(a) for a in args],
                              env={"COLUMNS": "200", "AGENTJOURNAL_STORE": ""})


def test_cli_repeated_approve_exits_0_and_contradiction_exits_2(url: str,
                                                                store: Store) -> None:
    approval_id = waiting(store)
    first = invoke("approve", "r1", approval_id, "--by", "ana", "--json", "--store", url)
    assert first.exit_code == 0, first.stderr
    end = seqs(store)
    again = invoke("approve", "r1", approval_id, "--by", "ana", "--store", url)
    assert again.exit_code == 0, again.stderr
    assert "already" in again.stdout and "nothing was appended" in again.stdout
    assert "appended seq" not in again.stdout
    # --json prints the events the first attempt printed (with their stored digests).
    repeat = invoke("approve", "r1", approval_id, "--by", "ana", "--json", "--store", url)
    assert [{**e, "digest": ""} for e in json.loads(repeat.stdout)] == json.loads(first.stdout)
    denied = invoke("deny", "r1", approval_id, "--reason", "no", "--store", url)
    assert denied.exit_code == 2 and denied.stderr.startswith("error: ")
    assert "approved by 'ana'" in denied.stderr and "Traceback" not in denied.stderr
    assert seqs(store) == end


def test_cli_repeated_resolve_exits_0_and_contradiction_exits_2(url: str,
                                                                store: Store) -> None:
    key = uncertain(store)
    args = ("resolve", "r1", key[:8], "--by", "ana", "--store", url)
    assert invoke(*args, "--did-not-happen").exit_code == 0
    end = seqs(store)
    again = invoke(*args, "--did-not-happen")
    assert again.exit_code == 0 and "already" in again.stdout, again.stderr
    other = invoke(*args, "--happened")
    assert other.exit_code == 2 and "did_not_happen" in other.stderr
    assert seqs(store) == end
