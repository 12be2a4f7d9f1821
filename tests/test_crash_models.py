"""Real processes, real SIGKILL, real provider SDKs: the agent (tests/crash_agent.py) runs in
a child process against the loopback LLM stub (a thread of this process, so only the agent
dies), is killed in a chosen window, and is resumed in a new process. A receiver process
counts the effects, by idempotency key, deduping nothing; the library's own view is only
checked against a fresh fold of its log."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from agentjournal import EventType, fold, open_store
from agentjournal.demo.ledger import http_json
from agentjournal.errors import RunNotFoundError
from agentjournal.events import Event
from agentjournal.state import durable_fields
from agentjournal.testing.llm_stub import Reply, StubServer
from tests.crash_agent import READY

E = EventType
ROOT = Path(__file__).resolve().parents[1]
RUN = "crash-models"
PROVIDERS = ("openai-chat", "openai-responses", "anthropic")
#: The stub's counter for each provider's generating endpoint.
ENDPOINT = {"openai-chat": "chat", "openai-responses": "responses_create",
            "anthropic": "messages"}
#: Turn 2, the one a kill lands in: long enough that only a kill ends it.
SLOW = 60.0


class Receiver:
    """The receiver process: counts every effect it is sent, by key and by label."""

    def __init__(self) -> None:
        self.process = subprocess.Popen([sys.executable, "-m", "tests.crash_agent", "receiver"],
                                        cwd=ROOT, stdout=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line.startswith(READY), f"receiver did not start: {line!r}"
        self.url = line.removeprefix(READY).strip()

    def by_label(self) -> dict[str, int]:
        return dict(http_json("GET", f"{self.url}/effects")[1]["by_label"])

    def reads(self) -> dict[str, int]:
        return dict(http_json("GET", f"{self.url}/effects")[1]["reads"])

    def by_key(self) -> dict[str, int]:
        return dict(http_json("GET", f"{self.url}/effects")[1]["by_key"])

    def close(self) -> None:
        self.process.kill()
        self.process.wait()
        assert self.process.stdout is not None
        self.process.stdout.close()


@pytest.fixture
def stub() -> Iterator[StubServer]:
    with StubServer() as s:
        yield s
    assert s.rejections == [] and s.errors == []  # every request was one the real API takes


class Log:
    """The run's log, read from the store as the test goes (one connection)."""

    def __init__(self, store_url: str) -> None:
        self.store = open_store(store_url)

    def events(self) -> list[Event]:
        try:
            return list(self.store.read(RUN))
        except RunNotFoundError:
            return []

    def count(self, kind: EventType) -> int:
        return sum(e.type is kind for e in self.events())


@pytest.fixture
def log(store_url: str) -> Iterator[Log]:
    opened = Log(store_url)
    yield opened
    opened.store.close()


def agent_cmd(store_url: str, stub: StubServer, receiver: Receiver, provider: str,
              *extra: str) -> list[str]:
    return [sys.executable, "-m", "tests.crash_agent", "run", "--store", store_url,
            "--run-id", RUN, "--provider", provider, "--base-url", stub.url,
            "--receiver", receiver.url, *extra]


def start(cmd: list[str], fault: str = "") -> subprocess.Popen[str]:
    return subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "AGENTJOURNAL_FAULT": fault},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(ready: Callable[[], bool], what: str, child: subprocess.Popen[str]) -> None:
    """Poll ``ready`` every 10 ms until it holds, while ``child`` lives (120 s at most: the
    child blocks once there, so the bound only ends a hung test; a loaded machine takes
    tens of seconds to start a child that imports a model SDK)."""
    deadline = time.monotonic() + 120
    while not ready():
        if child.poll() is not None:
            out, err = child.communicate()
            pytest.fail(f"the agent exited ({child.returncode}) before {what}:\n{out}\n{err}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def kill(child: subprocess.Popen[str]) -> None:
    os.kill(child.pid, signal.SIGKILL)
    _, err = child.communicate(timeout=30)  # reaped: its lease is provably a dead one's
    assert child.returncode == -signal.SIGKILL, err


def resume(cmd: list[str]) -> dict[str, Any]:
    done = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "AGENTJOURNAL_FAULT": ""},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    out: dict[str, Any] = json.loads(done.stdout)
    assert out["status"] == "finished", out
    return out


def check_log(log: Log, out: dict[str, Any]) -> list[Event]:
    """No seq gaps, finished, and a fresh fold equal to the live process's final state."""
    events = log.events()
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert events[-1].type is E.RUN_FINISHED and events[-1].seq == out["last_seq"]
    replayed = json.loads(json.dumps(msgspec.to_builtins(durable_fields(fold(events)))))
    assert replayed == out["durable"]
    return events


def verdicts_by_label(events: list[Event]) -> dict[str, str]:
    label = {e.payload["key"]: e.payload["args"]["label"]
             for e in events if e.type is E.TOOL_CALL_STARTED}
    return {label[e.payload["key"]]: e.payload["verdict"]
            for e in events if e.type is E.TOOL_CALL_RECONCILED}


# --- 1. SIGKILL while waiting for the model ------------------------------------------------


@pytest.mark.parametrize(
    "provider, store_url",
    [*[pytest.param(p, "sqlite", id=f"{p}-sqlite") for p in PROVIDERS],
     *[pytest.param("openai-chat", b, id=f"openai-chat-{b}") for b in ("jsonl", "postgres")]],
    indirect=["store_url"],
)
def test_kill_while_waiting_for_the_model_then_resume(
    store_url: str, stub: StubServer, receiver: Receiver, log: Log, provider: str
) -> None:
    asked = threading.Event()

    def slow(body: dict[str, Any]) -> Reply:  # turn 2: answers only after the kill
        asked.set()
        return Reply(text="never delivered", delay=SLOW)

    stub.script([Reply(calls=[("post_effect", {"label": "e1"})]), slow, Reply(text="all done")])
    cmd = agent_cmd(store_url, stub, receiver, provider)
    child = start(cmd)
    wait_for(asked.is_set, "the turn-2 request reached the stub", child)
    # The window: turn 1's effect is applied and recorded, turn 2 is in flight.
    assert receiver.by_label() == {"e1": 1}
    assert log.count(E.TOOL_CALL_COMPLETED) == 1 and log.count(E.MODEL_TURN) == 1
    kill(child)

    out = resume(cmd)
    assert out["outcome"] == "all done"
    assert receiver.by_label() == {"e1": 1}  # the effect was not made again
    assert stub.counts[ENDPOINT[provider]] == 3  # turn 1, the killed turn 2, turn 2 again
    events = check_log(log, out)
    assert [e.type for e in events].count(E.MODEL_TURN) == 2
    assert [e.type for e in events].count(E.RUN_RESUMED) == 1


@pytest.mark.parametrize("store_url", ["jsonl", "sqlite", "postgres"], indirect=True)
def test_kill_while_the_model_answers_a_read_makes_the_read_again_and_no_effect(
    store_url: str, stub: StubServer, receiver: Receiver, log: Log
) -> None:
    """A read's result is stored with the next turn (StepMachine.reads_ride): killed
    while the model answers, the run has the read's start only; resumed, it reads again
    and makes no effect again (by the receiver's own counts)."""
    http_json("PUT", f"{receiver.url}/facts/cash", {"balance": 100})
    asked = threading.Event()

    def slow(body: dict[str, Any]) -> Reply:  # turn 3: answers only after the kill
        asked.set()
        return Reply(text="never delivered", delay=SLOW)

    stub.script([Reply(calls=[("post_effect", {"label": "e1"})]),
                 Reply(calls=[("read_fact", {"name": "cash"})]), slow, Reply(text="all done")])
    cmd = agent_cmd(store_url, stub, receiver, "openai-chat")
    child = start(cmd)
    wait_for(asked.is_set, "the turn-3 request reached the stub", child)
    assert receiver.by_label() == {"e1": 1} and receiver.reads() == {"cash": 1}
    assert log.count(E.TOOL_CALL_COMPLETED) == 1  # the effect's; the read's waits
    kill(child)

    out = resume(cmd)
    assert out["outcome"] == "all done"
    assert receiver.by_label() == {"e1": 1}  # the effect was not made again
    assert receiver.reads() == {"cash": 2}  # the read was
    events = check_log(log, out)
    assert [e.payload["verdict"] for e in events if e.type is E.TOOL_CALL_RECONCILED] == [
        "retry"]


# --- 2. Responses background mode: SIGKILL while polling ----------------------------------


def handles(log: Log) -> list[str]:
    return [e.payload["handle"] for e in log.events() if e.type is E.MODEL_CALL_STARTED]


def retrieved(stub: StubServer, handle: str) -> int:
    with stub.lock:
        return sum(path == f"/v1/responses/{handle}" for path, _, _ in stub.requests)


def background_script(stub: StubServer) -> None:
    # Turn 2 stays in_progress at the "provider" for 1.5 s after it is created.
    stub.script([Reply(calls=[("post_effect", {"label": "e1"})]),
                 Reply(text="all done", delay=1.5)])


def check_background_resumed(stub: StubServer, receiver: Receiver, log: Log,
                             out: dict[str, Any], polled_before_kill: int) -> None:
    assert out["outcome"] == "all done"
    assert receiver.by_label() == {"e1": 1}
    # One response created per turn: the killed turn was collected, not created again.
    assert stub.counts["created"] == 2
    events = check_log(log, out)
    started = [e for e in events if e.type is E.MODEL_CALL_STARTED]
    assert [e.payload["turn"] for e in started] == [0, 1]  # one start per turn, none again
    handle = started[1].payload["handle"]
    assert retrieved(stub, handle) > polled_before_kill  # the new process polled that id
    turn2 = [e for e in events if e.type is E.MODEL_TURN][1]
    assert turn2.payload["response_id"] == handle


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_background_response_is_collected_after_a_kill_while_polling(
    store_url: str, stub: StubServer, receiver: Receiver, log: Log
) -> None:
    background_script(stub)
    cmd = agent_cmd(store_url, stub, receiver, "openai-responses", "--background")
    child = start(cmd)
    # The window: turn 2's response id is durable and the worker is polling it.
    wait_for(lambda: len(handles(log)) == 2 and retrieved(stub, handles(log)[1]) > 0,
             "the worker polls turn 2's response", child)
    assert stub.counts["created"] == 2
    polled = retrieved(stub, handles(log)[1])
    kill(child)
    check_background_resumed(stub, receiver, log, resume(cmd), polled)


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_background_kill_at_the_model_started_fault_point(
    store_url: str, stub: StubServer, receiver: Receiver, log: Log
) -> None:
    background_script(stub)
    cmd = agent_cmd(store_url, stub, receiver, "openai-responses", "--background")
    child = start(cmd, fault="model_started:2")  # right after turn 2's id is durable
    _, err = child.communicate(timeout=60)
    assert child.returncode == -signal.SIGKILL, err
    assert len(handles(log)) == 2 and stub.counts["created"] == 2
    check_background_resumed(stub, receiver, log, resume(cmd), 0)


# --- 3. One turn's parallel calls, killed mid-batch ----------------------------------------


@pytest.mark.parametrize("store_url", ["jsonl", "sqlite", "postgres"], indirect=True)
def test_kill_mid_batch_of_parallel_calls_settles_each_call_once(
    store_url: str, stub: StubServer, receiver: Receiver, log: Log
) -> None:
    labels = [f"c{i}" for i in range(1, 6)]
    stub.script([Reply(calls=[("post_effect", {"label": x}) for x in labels]),
                 Reply(text="all five posted")])
    cmd = agent_cmd(store_url, stub, receiver, "openai-chat")
    # c1, c2 complete; c3 is applied and then blocks; c4, c5 block before their request.
    child = start([*cmd, "--block-after", "c3", "--block-before", "c4,c5"])

    def window() -> bool:
        return log.count(E.TOOL_CALL_COMPLETED) == 2 and sum(receiver.by_label().values()) == 3

    wait_for(window, "2 completions and 3 effects", child)
    assert receiver.by_label() == {"c1": 1, "c2": 1, "c3": 1}
    kill(child)

    out = resume(cmd)
    assert out["outcome"] == "all five posted"
    assert receiver.by_label() == dict.fromkeys(labels, 1)
    events = check_log(log, out)
    starts = [e for e in events if e.type is E.TOOL_CALL_STARTED]
    batch = starts[:5]  # the turn's calls started in one batch: consecutive seqs
    assert [e.seq for e in batch] == list(range(batch[0].seq, batch[0].seq + 5))
    assert [e.payload["args"]["label"] for e in batch] == labels
    # Each key the receiver saw once, and each is one the log started.
    assert receiver.by_key() == {e.payload["key"]: 1 for e in batch}
    assert verdicts_by_label(events) == {"c3": "found", "c4": "absent", "c5": "absent"}
    # Recovery made c4 and c5 again (second attempts), never c3.
    again = Counter(e.payload["args"]["label"] for e in starts[5:])
    assert again == {"c4": 1, "c5": 1}
    assert {e.payload["attempt"] for e in starts[5:]} == {2}
    done = [e for e in events if e.type is E.TOOL_CALL_COMPLETED]
    assert Counter(e.payload["source"] for e in done) == {"tool": 4, "reconciliation": 1}


# --- 4. A turn whose calls share one id, killed mid-batch -----------------------------------


# Every provider and both id forms on SQLite; each other backend with one of each form.
SHARED_ID_CASES = [
    *(("sqlite", p, c) for p in PROVIDERS for c in ("", "call_0")),
    *((b, p, c) for b in ("jsonl", "postgres")
      for p, c in (("openai-chat", ""), ("anthropic", "call_0"))),
]


@pytest.mark.parametrize(("store_url", "provider", "call_id"), SHARED_ID_CASES,
                         indirect=["store_url"])
def test_kill_mid_batch_of_calls_that_share_an_id_makes_each_once(
    store_url: str, stub: StubServer, receiver: Receiver, log: Log, provider: str, call_id: str
) -> None:
    labels = ["g1", "g2", "g3"]
    stub.script([Reply(calls=[("post_effect", {"label": x}) for x in labels],
                       call_ids=[call_id] * 3),
                 Reply(text="all three posted")])
    cmd = agent_cmd(store_url, stub, receiver, provider)
    # g1 completes; g2 is applied and then blocks; g3 blocks before its request.
    child = start([*cmd, "--block-after", "g2", "--block-before", "g3"])

    def window() -> bool:
        return log.count(E.TOOL_CALL_COMPLETED) == 1 and sum(receiver.by_label().values()) == 2

    wait_for(window, "1 completion and 2 effects", child)
    kill(child)

    out = resume(cmd)
    assert out["outcome"] == "all three posted"
    assert receiver.by_label() == dict.fromkeys(labels, 1)  # each made once, none dropped
    events = check_log(log, out)
    (turn, _) = [e.payload for e in events if e.type is E.MODEL_TURN]
    ids = [c["id"] for c in turn["tool_calls"]]
    assert len(set(ids)) == 3 and {c["provider_id"] for c in turn["tool_calls"]} == {call_id}
    assert verdicts_by_label(events) == {"g2": "found", "g3": "absent"}
    # Each call answered once, under its own id; the model read the three results.
    answers = Counter(e.payload["call_id"] for e in events if e.type in (
        E.TOOL_CALL_COMPLETED, E.TOOL_RESULT_SERVED, E.TOOL_CALL_DENIED))
    assert answers == dict.fromkeys(ids, 1)
