"""Time: a hung tool is abandoned at its timeout and recorded as uncertain, a stuck run
lets its lease lapse so another worker can take it over, and a wall clock going
backwards cannot extend the time budget."""

from __future__ import annotations

import contextvars
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Generator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from agentjournal import EventType, FencedError, LeaseHeldError, fold, open_store, ops
from agentjournal import journal as journal_module
from agentjournal import settle as settle_module
from agentjournal.agent import Agent
from agentjournal.models import ModelRequest, ModelResponse, ScriptedModel, calls, reply
from agentjournal.policy import Budget
from agentjournal.store import Lease, Store
from agentjournal.tools import ToolContext, tool

E = EventType


@pytest.fixture
def store(each_backend: str) -> Iterator[Store]:
    store = open_store(each_backend)
    yield store
    store.close()


@pytest.fixture
def hang() -> Iterator[threading.Event]:
    """Set at the end of the test, so abandoned tool threads can finish."""
    gate = threading.Event()
    yield gate
    gate.set()


def types(store: Store, run_id: str) -> list[str]:
    return [e.type.value for e in store.read(run_id)]


def one_call(name: str, args: dict[str, Any] | None = None) -> ScriptedModel:
    return ScriptedModel([calls((name, args or {})), reply("done")])


# --- tool timeouts -------------------------------------------------------------------


def test_irreversible_tool_past_its_timeout_is_uncertain_and_pauses(
    store: Store, hang: threading.Event
) -> None:
    @tool(effect="irreversible", timeout=0.2)
    def post() -> str:
        hang.wait()
        return "posted"

    result = Agent(one_call("post"), [post]).run(store, "r1", "t")  # hang guard: pytest's
    assert result.status == "paused" and len(result.uncertain) == 1
    (uncertain,) = [e for e in store.read("r1") if e.type is E.TOOL_CALL_UNCERTAIN]
    assert uncertain.payload["error"].startswith("ToolTimedOut: post did not return within 0.2s")


def test_idempotent_tool_past_its_timeout_is_retried_with_the_same_key(
    store: Store, hang: threading.Event
) -> None:
    keys: list[str] = []

    @tool(effect="idempotent", timeout=0.2)
    def send(ctx: ToolContext) -> str:
        keys.append(ctx.key)
        if len(keys) == 1:
            hang.wait()  # the first attempt hangs; the retry answers
        return "sent"

    result = Agent(one_call("send"), [send]).run(store, "r1", "t")
    assert result.status == "finished"
    assert len(keys) == 2 and keys[0] == keys[1]
    verdicts = [e.payload["verdict"] for e in store.read("r1")
                if e.type is E.TOOL_CALL_RECONCILED]
    assert verdicts == ["retry"]


def test_read_only_tool_past_the_agents_default_timeout_fails(
    store: Store, hang: threading.Event
) -> None:
    @tool(effect="read_only")
    def look() -> str:
        hang.wait()
        return "seen"

    result = Agent(one_call("look"), [look], tool_timeout=0.2).run(store, "r1", "t")
    assert result.status == "finished"
    (done,) = [e for e in store.read("r1") if e.type is E.TOOL_CALL_COMPLETED]
    assert done.payload["is_error"] and "did not return within 0.2s" in done.payload["content"]
    assert "tool_call_uncertain" not in types(store, "r1")


def test_a_tool_may_lift_the_agents_default_timeout(store: Store) -> None:
    @tool(effect="irreversible", timeout=float("inf"))
    def slow() -> str:
        time.sleep(0.3)
        return "ok"

    result = Agent(one_call("slow"), [slow], tool_timeout=0.1).run(store, "r1", "t")
    assert result.status == "finished"


def test_an_abandoned_call_can_no_longer_remember(store: Store, hang: threading.Event) -> None:
    refused: list[BaseException] = []
    returned = threading.Event()

    @tool(effect="read_only", timeout=0.2)
    def late(ctx: ToolContext) -> str:
        hang.wait()
        try:
            ctx.remember("late", 1)
        except Exception as exc:
            refused.append(exc)
        returned.set()
        return "too late"

    Agent(one_call("late"), [late]).run(store, "r1", "t")
    hang.set()
    assert returned.wait(60)
    assert [type(e).__name__ for e in refused] == ["ToolTimedOut"]
    assert "memory_written" not in types(store, "r1")


def test_a_call_after_one_abandoned_in_the_same_batch_still_runs(
    store: Store, hang: threading.Event
) -> None:
    """One call at a time: the run's driver is stuck in the first call, so a new driver
    records its timeout and makes the second."""
    made: list[str] = []

    @tool(effect="read_only", timeout=0.2)
    def look(n: int) -> str:
        made.append(f"look {n}")
        if n == 1:
            hang.wait()
        return f"seen {n}"

    model = ScriptedModel([calls(("look", {"n": 1}), ("look", {"n": 2})), reply("done")])
    result = Agent(model, [look], parallel_calls=1).run(store, "r1", "t")
    assert result.status == "finished" and made == ["look 1", "look 2"]
    completed = [e.payload for e in store.read("r1") if e.type is E.TOOL_CALL_COMPLETED]
    assert [(p.get("is_error", False), "did not return" in str(p.get("content")))
            for p in completed] == [(True, True), (False, False)]


def test_a_tool_sees_the_callers_context_variables(store: Store) -> None:
    """The run is driven on a thread of its own, in a copy of the caller's context (a
    tracing span set around ``run`` is the parent of what the tool does)."""
    request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id")
    seen: list[str] = []

    @tool(effect="read_only")
    def look() -> str:
        seen.append(request_id.get("unset"))
        return "seen"

    request_id.set("req-7")
    Agent(one_call("look"), [look]).run(store, "r1", "t")
    assert seen == ["req-7"]


INTERRUPTED = """
import os, signal, sys, threading, time
from agentjournal import open_store
from agentjournal.agent import Agent
from agentjournal.models import ScriptedModel, calls, reply
from agentjournal.tools import tool

returned = threading.Event()

@tool(effect="read_only")
def look(n: int) -> str:
    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)  # Ctrl-C
    time.sleep(0.5)
    returned.set()
    return "seen"

store = open_store(sys.argv[1])
model = ScriptedModel([calls(("look", {"n": 1})), calls(("look", {"n": 2})), reply("done")])
try:
    Agent(model, [look]).run(store, "r1", "t")
except KeyboardInterrupt:
    print("interrupted while the call ran:", not returned.is_set())
returned.wait(60)
time.sleep(0.5)  # a driver that went on would have recorded the outcome and asked again
print(" ".join(e.type.value for e in store.read("r1")))
"""


def test_ctrl_c_stops_a_sync_run_at_once_and_no_step_goes_on(each_backend: str) -> None:
    """The caller's thread is interrupted while the run's driver is in a tool call: run
    raises KeyboardInterrupt without waiting for the call, and nothing after it is
    recorded (the call stays started, for a resume to settle). On every backend."""
    out = subprocess.run([sys.executable, "-c", INTERRUPTED, each_backend], capture_output=True,
                         text=True, timeout=120, check=True).stdout.splitlines()
    assert out[0] == "interrupted while the call ran: True"
    assert out[1].split()[-1] == "tool_call_started"
    assert out[1].split().count("tool_call_started") == 1


def test_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError, match="timeout"):
        @tool(timeout=0)
        def never() -> None: ...


# --- a stuck run lets its lease lapse --------------------------------------------------


def test_a_stuck_run_lets_its_lease_lapse_so_another_worker_can_take_over(
    store: Store, hang: threading.Event
) -> None:
    asked = threading.Event()

    def stuck(request: ModelRequest) -> ModelResponse:
        asked.set()
        hang.wait()  # a model call that never answers
        return reply("late")

    agent = Agent(ScriptedModel([stuck]), [], lease_ttl=0.3, stuck_after=0.5)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            agent.run(store, "r1", "t")
        except BaseException as exc:
            errors.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    assert asked.wait(60)  # the run holds its lease and waits for the model
    deadline = time.monotonic() + 120  # a hang guard, for a loaded machine
    while True:  # the heartbeat keeps renewing until the run counts as stuck
        try:
            lease = store.acquire("r1", "successor", 30)
            break
        except LeaseHeldError:
            assert time.monotonic() < deadline, "a stuck run kept its lease"
            time.sleep(0.05)
    assert lease.epoch == 2
    hang.set()
    worker.join(60)
    assert [type(e) for e in errors] == [FencedError]


def test_renewals_resume_when_a_stalled_run_makes_progress(store: Store) -> None:
    second_turn = threading.Event()
    release = threading.Event()

    def slow(request: ModelRequest) -> ModelResponse:
        time.sleep(1.2)  # stalled past stuck_after: the lease lapses, nobody takes it
        return calls(("noop", {}))

    def waiting(request: ModelRequest) -> ModelResponse:
        second_turn.set()
        release.wait(60)
        return reply("done")

    @tool(effect="read_only")
    def noop() -> str:
        return "ok"

    agent = Agent(ScriptedModel([slow, waiting]), [noop], lease_ttl=0.3, stuck_after=0.8)
    worker = threading.Thread(target=lambda: agent.run(store, "r1", "t"))
    worker.start()
    try:
        assert second_turn.wait(60)
        time.sleep(0.3)  # a heartbeat or two after the progress
        with pytest.raises(LeaseHeldError):
            store.acquire("r1", "successor", 30)
    finally:
        release.set()
        worker.join(60)
    assert fold(list(store.read("r1"))).status == "finished"


def renewals(store: Store, monkeypatch: pytest.MonkeyPatch) -> list[set[str]]:
    """The runs each of the shared heartbeat's renewals held, as they happen."""
    seen: list[set[str]] = []
    real = store.renew_all  # type: ignore[attr-defined]

    def renew_all(leases: list[Lease], ttl: float) -> dict[str, Lease]:
        seen.append({lease.run_id for lease in leases})
        return real(leases, ttl)  # type: ignore[no-any-return]

    monkeypatch.setattr(store, "renew_all", renew_all)
    return seen


def test_leases_opened_apart_converge_on_one_renewal(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Runs opened at scattered moments are renewed together after a beat or two (one
    statement for all, and if the process dies their leases expire together)."""
    with open_store(f"sqlite:///{tmp_path / 'runs.db'}") as store:
        seen = renewals(store, monkeypatch)
        first = journal_module.open_journal(store, "r1", ttl=0.9)
        time.sleep(0.2)  # between two beats of r1 (every 0.3 s)
        second = journal_module.open_journal(store, "r2", ttl=0.9)
        deadline = time.monotonic() + 60  # a hang guard, for a loaded machine
        while len(seen) < 4 or seen[-1] != {"r1", "r2"}:
            assert time.monotonic() < deadline, seen
            time.sleep(0.05)
        first.close()
        second.close()
    assert {"r1", "r2"} in seen


def test_a_worker_s_heartbeat_renews_every_lease_at_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with open_store(f"sqlite:///{tmp_path / 'runs.db'}") as store:
        seen = renewals(store, monkeypatch)
        journals = [journal_module.open_journal(store, f"r{i}", ttl=60) for i in range(3)]
        journal_module.heartbeat_of(store).beat_now()  # the next beat is 20 s away
        deadline = time.monotonic() + 10
        while not seen:
            assert time.monotonic() < deadline, "beat_now renewed nothing"
            time.sleep(0.05)
        for j in journals:
            j.close()
    assert seen[0] == {"r0", "r1", "r2"}


def test_a_worker_beating_every_third_of_a_ttl_is_the_only_one_renewing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Between a worker's beats the heartbeat thread renews nothing: a renewal after the
    worker's heartbeat row would outlive it, and a successor would wait that much longer
    after the heartbeat the worker was last seen at."""
    ttl = 3.0
    with open_store(f"sqlite:///{tmp_path / 'runs.db'}") as store:
        seen = renewals(store, monkeypatch)
        journals = [journal_module.open_journal(store, f"r{i}", ttl=ttl) for i in range(3)]
        beats = 4
        for _ in range(beats):  # as Worker._heartbeat: the beat, then a wait of ttl / 3
            journal_module.heartbeat_of(store).beat_now()
            time.sleep(ttl / 3 + 0.05)
        for j in journals:
            j.close()
    assert seen == [{"r0", "r1", "r2"}] * beats


# --- the time budget -----------------------------------------------------------------


def test_a_wall_clock_going_backwards_does_not_extend_the_time_budget(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    wall = [datetime.now(UTC)]
    ticks = [1000.0]
    monkeypatch.setattr(settle_module, "now", lambda: wall[0])
    monkeypatch.setattr(journal_module, "now", lambda: wall[0], raising=False)
    monkeypatch.setattr(journal_module, "_clock", lambda: ticks[0], raising=False)

    @tool(effect="read_only")
    def work(n: int) -> str:
        ticks[0] += 10  # ten seconds pass...
        wall[0] -= timedelta(hours=1)  # ...while the wall clock is set back an hour
        return "ok"

    model = ScriptedModel([calls(("work", {"n": n})) for n in range(5)])
    agent = Agent(model, [work], budget=Budget(max_seconds=15))
    result = agent.run(store, "r1", "t")
    assert result.status == "paused" and "seconds" in (result.pause_reason or "")
    (hit,) = [e for e in store.read("r1") if e.type is E.BUDGET_EXCEEDED]
    assert hit.payload["used"] == pytest.approx(20)


def test_a_run_that_ends_as_the_watcher_s_wait_times_out_is_seen_to_end() -> None:
    """The watcher waits in slices (Ctrl-C); a driver's notify that comes as a slice times
    out is lost: Condition.wait returns False. The watcher must still see the run end (a
    woken SIGSTOPped worker hung so in CI). Here every notify is lost."""

    class Deaf(threading.Condition):
        def wait(self, timeout: float | None = None) -> bool:
            super().wait(0.01)
            return False

    def steps() -> Generator[Any, Any, int]:
        return 42
        yield  # (a generator)

    watch = ops._Watch(steps())
    watch.lock = Deaf(threading.Lock())

    def too_long(signum: int, frame: Any) -> None:
        raise TimeoutError("the watcher did not see the run end")

    previous = signal.signal(signal.SIGALRM, too_long)
    signal.alarm(10)
    try:
        assert watch.run() == 42
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
