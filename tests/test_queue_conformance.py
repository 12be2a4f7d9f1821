"""The queue's contract, one suite for every backend that has a queue (sqlite, postgres):
claims, races, takeovers, hand-backs, decisions, poison counts. JSONL has none."""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from agentjournal import (
    Agent,
    EventType,
    FencedError,
    NoQueueError,
    RunMismatchError,
    ScriptedModel,
    calls,
    decide_approval,
    make_events,
    open_store,
    reply,
    resolve_uncertain,
    tool,
)
from agentjournal.agent import RunResult
from agentjournal.bridge import open_run
from agentjournal.cli import cli
from agentjournal.fleet import queue_of, submit
from agentjournal.fleet.queue import Claim, Queue
from agentjournal.journal import open_journal
from agentjournal.policy import Rules
from agentjournal.store import Store
from agentjournal.tools import Unknown

from .conftest import fresh_url

QUEUED = ("sqlite", "postgres")


@pytest.fixture(params=QUEUED)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from fresh_url(request.param, tmp_path)


@pytest.fixture
def store(url: str) -> Iterator[Store]:
    with open_store(url) as opened:
        yield opened


def test_jsonl_has_no_queue(tmp_path: Path) -> None:
    with open_store(f"jsonl:///{tmp_path / 'runs'}") as store, pytest.raises(NoQueueError,
                                                                               match="SQLite"):
        queue_of(store)


def test_submit_is_idempotent_and_never_a_second_run(store: Store) -> None:
    run_id = submit(store, "m:agent", "do it", "r1")
    assert submit(store, "m:agent", "do it", "r1") == "r1"
    with pytest.raises(RunMismatchError, match="task"):
        submit(store, "m:agent", "do something else", "r1")
    with pytest.raises(RunMismatchError, match="agent"):
        submit(store, "m:other", "do it", "r1")
    assert [r.run_id for r in queue_of(store).runs()] == [run_id]


def test_a_submitted_task_is_stored_redacted(store: Store) -> None:
    submit(store, "m:agent", "use sk-abcdefghijklmnopqrstuvwxyz123456 to pay", "r1")
    claim = queue_of(store).claim("w", 30, ["default"])
    assert claim is not None and "sk-abcdefghijklmnop" not in claim.task


def test_claims_take_the_most_urgent_first_and_each_once(store: Store) -> None:
    for run_id, priority in (("low", 0), ("high", 5), ("low2", 0)):
        submit(store, "m:a", "t", run_id, priority=priority)
    submit(store, "m:a", "t", "elsewhere", queue="other")
    queue = queue_of(store)
    taken = [queue.claim("w", 30, ["default"]) for _ in range(4)]
    assert [c.lease.run_id if c else None for c in taken] == ["high", "low", "low2", None]
    assert all(c.lease.epoch == 1 and c.crashes == 0 for c in taken if c)
    other = queue.claim("w", 30, ["other", "default"])
    assert other is not None and other.lease.run_id == "elsewhere"


def _claim_in_process(url: str, barrier: multiprocessing.synchronize.Barrier,
                      out: multiprocessing.queues.Queue[str | None]) -> None:
    with open_store(url) as store:
        queue = queue_of(store)
        barrier.wait()
        claim = queue.claim(f"proc-{multiprocessing.current_process().pid}", 30, ["default"])
        out.put(claim.lease.run_id if claim else None)


def test_no_double_claim_under_a_race_of_threads(url: str, store: Store) -> None:
    submit(store, "m:a", "t", "only")
    n = 8
    barrier, won = threading.Barrier(n), []

    def race(i: int) -> None:
        with open_store(url) as mine:
            queue = queue_of(mine)
            barrier.wait()
            claim = queue.claim(f"thread-{i}", 30, ["default"])
            if claim is not None:
                won.append(claim.lease.owner)

    threads = [threading.Thread(target=race, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1


def test_no_double_claim_under_a_race_of_processes(url: str, store: Store) -> None:
    submit(store, "m:a", "t", "only")
    submit(store, "m:a", "t", "second")
    ctx = multiprocessing.get_context("spawn")
    n = 4
    barrier, out = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_claim_in_process, args=(url, barrier, out)) for _ in range(n)]
    for p in procs:
        p.start()
    got = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    assert sorted(r for r in got if r) == ["only", "second"] and got.count(None) == n - 2


def test_an_expired_lease_is_taken_over_with_the_next_epoch_and_a_crash(store: Store) -> None:
    submit(store, "m:a", "t", "r1")
    queue = queue_of(store)
    first = queue.claim("dead", 0.3, ["default"])
    assert first is not None and queue.claim("other", 30, ["default"]) is None  # held
    time.sleep(0.4)
    second = queue.claim("successor", 30, ["default"])
    assert second is not None and second.lease.epoch == first.lease.epoch + 1
    assert second.crashes == 1
    # The dead worker's lease is fenced: its append and its hand-back do nothing.
    (event,) = make_events("r1", 0, first.lease.epoch, [(EventType.RUN_STARTED, {"task": "t"})])
    with pytest.raises(FencedError):
        store.append("r1", [event], expected_seq=0, epoch=first.lease.epoch)
    assert not queue.hand_back(first.lease, "done", 0)
    assert queue.hand_back(second.lease, "done", 0)
    (row,) = queue.runs()
    assert (row.state, row.crashes, row.runnable) == ("done", 0, False)


def test_a_claimed_run_opens_on_the_claim_s_lease_without_acquiring_another(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker's run adopts its claim's lease: no second acquire (a round trip and a
    commit per run taken over). The claim says where the log ends, so a new run's open
    reads nothing, and a run resumed after a hand-back resumes from its log."""
    submit(store, "m:a", "t", "r1")
    queue = queue_of(store)
    claim = queue.claim("w1", 30, ["default"])
    assert claim is not None and claim.lease.last_seq == 0

    def no_acquire(*args: object) -> None:
        raise AssertionError("the run acquired a lease it was given")

    monkeypatch.setattr(store, "acquire", no_acquire)
    drain = threading.Event()
    drain.set()  # it starts, then stops at its first step: handed back queued
    first = Agent(ScriptedModel([reply("done")]), [pay]).run(
        store, "r1", "t", owner="w1", keep_lease=True, lease=claim.lease, stop=drain)
    assert first.last_seq > 0 and {e.epoch for e in store.read("r1")} == {claim.lease.epoch}
    assert queue.hand_back(claim.lease, "queued", first.last_seq)
    again = queue.claim("w2", 30, ["default"])
    assert again is not None and again.lease.last_seq == first.last_seq
    done = Agent(ScriptedModel([reply("done")]), [pay]).run(
        store, "r1", "t", owner="w2", keep_lease=True, lease=again.lease)
    assert done.status == "finished"
    assert [e.epoch for e in store.read("r1")][first.last_seq:] == [again.lease.epoch] * (
        done.last_seq - first.last_seq)


def test_a_run_on_a_claim_s_lease_lost_meanwhile_appends_nothing(store: Store) -> None:
    submit(store, "m:a", "t", "r1")
    queue = queue_of(store)
    lost = queue.claim("dead", 0.3, ["default"])
    assert lost is not None
    time.sleep(0.4)
    taken = queue.claim("successor", 30, ["default"])
    assert taken is not None
    with pytest.raises(FencedError):
        Agent(ScriptedModel([reply("done")]), [pay]).run(
            store, "r1", "t", owner="dead", keep_lease=True, lease=lost.lease)
    assert store.last_seq("r1") == 0


def test_an_idle_worker_learns_when_the_soonest_running_lease_expires(store: Store) -> None:
    """So it claims a dead worker's runs as their leases expire, not at its next poll."""
    queue = queue_of(store)
    assert queue.next_expiry(["default"]) is None  # nothing runs
    for run_id in ("r1", "r2"):
        submit(store, "m:a", "t", run_id)
    assert queue.next_expiry(["default"]) is None  # queued, not running
    assert queue.claim("long", 30, ["default"]) is not None
    assert queue.claim("short", 0.4, ["default"]) is not None
    soon = queue.next_expiry(["default"])
    assert soon is not None and 0.0 < soon <= 0.4  # the short lease, not the long one
    assert queue.next_expiry(["elsewhere"]) is None
    time.sleep(0.5)
    assert queue.next_expiry(["default"]) == 0.0  # expired: claimable now


def test_a_run_handed_back_queued_is_claimable_at_once_without_a_crash(store: Store) -> None:
    submit(store, "m:a", "t", "r1")
    queue = queue_of(store)
    drained = queue.claim("draining", 30, ["default"])
    assert drained is not None and queue.hand_back(drained.lease, "queued", 0)
    taken = queue.claim("other", 30, ["default"])
    assert taken is not None and taken.lease.epoch == drained.lease.epoch + 1
    assert taken.crashes == 0


def test_crashes_count_until_a_clean_hand_back(store: Store) -> None:
    submit(store, "m:a", "t", "r1")
    queue = queue_of(store)
    seen = []
    for _ in range(3):
        claim = queue.claim("w", 0.05, ["default"])
        assert claim is not None
        seen.append(claim.crashes)
        time.sleep(0.1)
    assert seen == [0, 1, 2]
    claim = queue.claim("w", 30, ["default"])
    assert claim is not None and claim.crashes == 3
    assert queue.hand_back(claim.lease, "parked", 0)
    assert queue.claim("w", 30, ["default"]) is None  # parked: a person decides
    assert queue.retry("r1")
    again = queue.claim("w", 30, ["default"])
    assert again is not None and again.crashes == 0


def test_a_parked_run_keeps_the_reason_until_it_is_requeued(store: Store) -> None:
    submit(store, "m:a", "t", "r1")
    queue = queue_of(store)
    claim = queue.claim("w", 30, ["default"])
    assert claim is not None and queue.hand_back(claim.lease, "parked", 0, "refused: m:a")
    (row,) = queue.runs()
    assert (row.state, row.reason, row.claims, row.crashes) == ("parked", "refused: m:a", 1, 0)
    assert queue.retry("r1")
    (row,) = queue.runs()
    assert (row.state, row.reason) == ("queued", None)
    again = queue.claim("w", 30, ["default"])
    assert again is not None and queue.hand_back(again.lease, "done", 0)
    assert queue.runs()[0].reason is None


def test_a_crash_is_taken_back_when_the_holder_was_alive(store: Store) -> None:
    submit(store, "m:a", "t", "r1")
    queue = queue_of(store)
    assert queue.claim("paused", 0.05, ["default"]) is not None
    time.sleep(0.1)
    taken = queue.claim("successor", 30, ["default"])
    assert taken is not None and taken.crashes == 1
    queue.absolve("r1")  # the paused worker woke, was fenced: the run did not kill it
    queue.absolve("r1")  # never below zero
    (row,) = queue.runs()
    assert row.crashes == 0


@tool(effect="irreversible")
def pay(amount: int) -> str:
    return f"paid {amount}"


def _handed_back_waiting(store: Store) -> tuple[Queue, Claim, Agent, RunResult]:
    """Run r1, whose one call waits for approval, from a claim to its hand-back."""
    submit(store, "m:a", "pay 5", "r1")
    queue = queue_of(store)
    claim = queue.claim("w1", 30, ["default"])
    assert claim is not None
    agent = Agent(ScriptedModel([calls(("pay", {"amount": 5})), reply("done")]), [pay],
                  policy=Rules(approve_if={"pay": lambda c: True}))
    result = agent.run(store, "r1", claim.task, owner="w1", keep_lease=True)
    assert result.status == "waiting_approval"
    assert queue.hand_back(claim.lease, "waiting", result.last_seq)
    return queue, claim, agent, result


def test_a_person_s_decision_makes_a_waiting_run_runnable(store: Store) -> None:
    queue, claim, agent, result = _handed_back_waiting(store)
    assert queue.claim("w2", 30, ["default"]) is None  # nothing new: it waits
    decide_approval(store, "r1", result.approvals[0].approval_id, approved=True, by="ana")
    (row,) = queue.runs()
    assert row.state == "waiting" and row.runnable
    again = queue.claim("w2", 30, ["default"])  # (the decision's writer took an epoch too)
    assert again is not None and again.lease.epoch > claim.lease.epoch
    done = agent.run(store, "r1", again.task, owner="w2", keep_lease=True)
    assert done.status == "finished" and queue.hand_back(again.lease, "done", done.last_seq)


def _waits_for_the_person(queue: Queue) -> None:
    """Still waiting for the person: no worker takes the run (and its lease) from under
    the person's next decision, which is recorded at once."""
    (row,) = queue.runs()
    assert row.state == "waiting" and not row.runnable
    assert queue.claim("w2", 30, ["default"]) is None


def _taken_up_again(queue: Queue) -> None:
    """The person decided all: a worker takes the run up."""
    (row,) = queue.runs()
    assert row.state == "waiting" and row.runnable
    again = queue.claim("w2", 30, ["default"])
    assert again is not None and again.lease.run_id == "r1"


def test_a_run_waiting_on_two_approvals_waits_until_a_person_decided_both(
        url: str, store: Store) -> None:
    # Two calls of one turn wait for approval at once, as an SDK run stops (the bridge).
    submit(store, "m:a", "pay 5 and 7", "r1")
    queue = queue_of(store)
    claim = queue.claim("w1", 30, ["default"])
    assert claim is not None
    with open_run(store, "r1", task=claim.task, owner="w1", keep_lease=True) as run:
        asked = [run.request_approval("pay", {"amount": n}, call_id=f"c{n}") for n in (5, 7)]
        run.pause("waiting for approvals")
    assert queue.hand_back(claim.lease, "waiting", run.state.last_seq)
    approved = CliRunner().invoke(cli, ["approve", "r1", asked[0], "--store", url])
    assert approved.exit_code == 0, approved.output
    _waits_for_the_person(queue)
    decide_approval(store, "r1", asked[1], approved=False, by="ana", reason="not 7")
    _taken_up_again(queue)


def test_a_waiting_run_is_not_claimed_while_a_person_s_decision_holds_its_lease(
        store: Store) -> None:
    queue, _, _, result = _handed_back_waiting(store)
    with open_journal(store, "r1", owner="decision:ana") as decision:
        decision.record(EventType.APPROVAL_DECIDED, approval_id=result.approvals[0].approval_id,
                        approved=True, by="ana", reason="")
        assert queue.claim("w2", 30, ["default"]) is None  # the person writes still
    again = queue.claim("w2", 30, ["default"])
    assert again is not None and again.lease.epoch == decision.lease.epoch + 1


@tool(effect="irreversible")
def post(name: str) -> str:
    """Times out (its outcome unknown), as a call cut off mid-request would."""
    raise TimeoutError(f"posting {name}: read timed out")


@tool(effect="irreversible", reconcile=lambda pending: Unknown("the ledger is away"))
def post_looked_up(name: str) -> str:
    raise TimeoutError(f"posting {name}: read timed out")


def _paused_on_two_uncertain(store: Store, second: str) -> tuple[Queue, list[str]]:
    """Run r1 to a pause on two uncertain calls (``post``, then ``second``), handed back
    waiting; their keys."""
    submit(store, "m:a", "post x and y", "r1")
    queue = queue_of(store)
    claim = queue.claim("w1", 30, ["default"])
    assert claim is not None
    model = ScriptedModel([calls(("post", {"name": "x"}), (second, {"name": "y"})),
                           reply("done")])
    result = Agent(model, [post, post_looked_up]).run(store, "r1", claim.task, owner="w1",
                                                     keep_lease=True)
    assert result.status == "paused" and len(result.uncertain) == 2
    assert queue.hand_back(claim.lease, "waiting", result.last_seq)
    return queue, [p.key for p in result.uncertain]


def test_a_run_paused_on_two_uncertain_calls_waits_until_a_person_resolved_both(
        url: str, store: Store) -> None:
    # Neither tool can be looked up: a resume would hand both back to the person.
    queue, (x, y) = _paused_on_two_uncertain(store, "post")
    resolved = CliRunner().invoke(cli, ["resolve", "r1", x, "--did-not-happen", "--store", url])
    assert resolved.exit_code == 0, resolved.output
    _waits_for_the_person(queue)
    resolve_uncertain(store, "r1", y, outcome="happened", by="ana", result="posted y")
    _taken_up_again(queue)


def test_a_resolution_leaving_a_call_a_lookup_may_settle_makes_the_run_runnable(
        store: Store) -> None:
    # The second call's lookup said "unknown": a resume asks it again, so a worker may.
    queue, (x, y) = _paused_on_two_uncertain(store, "post_looked_up")
    assert [(e.payload["key"], e.payload["verdict"]) for e in store.read("r1")
            if e.type is EventType.TOOL_CALL_RECONCILED] == [(y, "unknown")]
    resolve_uncertain(store, "r1", x, outcome="did_not_happen", by="ana")
    (row,) = queue.runs()
    assert row.state == "waiting" and row.runnable


def test_workers_are_seen_and_forgotten(store: Store) -> None:
    from agentjournal.fleet import WorkerInfo

    queue = queue_of(store)
    info = WorkerInfo(worker_id="h:1:ab", host="h", pid=1, queues=["default"], runs=["r1"],
                      started_at=time.time(), heartbeat_at=time.time())
    queue.beat(info)
    queue.beat(info)  # a heartbeat replaces, never duplicates
    assert queue.workers() == [info]
    queue.forget(info.worker_id)
    assert queue.workers() == []
