"""Real processes, real SIGKILL, a real receiver: the agent runs in a child process, is
killed in a chosen (or random) window, and is resumed in a new process; the ledger
service, itself a separate process with its own SQLite file, counts the effects.

Every test runs on every backend (``store_url`` from conftest.py)."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from agentjournal import EventType, fold, open_store
from agentjournal.demo.ledger import LedgerService, http_json
from agentjournal.demo.reconcile import LEDGERS
from agentjournal.snapshots import load_state, named_segments

from .conftest import BACKENDS

pytestmark = pytest.mark.parametrize("store_url", BACKENDS, indirect=True)

E = EventType
CORRECTIONS = {f"q3-{n}" for n in LEDGERS}
#: Random kills per mode and backend; ``--slow`` is the soak.
KILLS, SOAK_KILLS = 12, 200


@pytest.fixture
def ledger(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[LedgerService]:
    idempotency = getattr(request, "param", True)
    with LedgerService(tmp_path / "ledger.db", idempotency=idempotency, latency_ms=5) as svc:
        yield svc


# The reconciliation demo with snapshots in segments of 2 items, so a short run writes
# many of them (and kills land in those writes too).
SMALL_SEGMENTS = ("import sys, agentjournal.snapshots as s; s.SEGMENT = 2; "
                  "from agentjournal.demo.reconcile import main; sys.exit(main())")


def agent_cmd(store_url: str, ledger: LedgerService, *extra: str) -> list[str]:
    run = (["-c", SMALL_SEGMENTS] if "--snapshot-every" in extra
           else ["-m", "agentjournal.demo.reconcile"])
    return [sys.executable, *run, "--store", store_url, "--run-id", "q3",
            "--ledger", ledger.url, *extra]


def run_agent(store_url: str, ledger: LedgerService, *extra: str,
              fault: str | None = None) -> tuple[int, dict[str, Any]]:
    env = {**os.environ, "AGENTJOURNAL_FAULT": fault or ""}
    done = subprocess.run(agent_cmd(store_url, ledger, *extra), env=env, capture_output=True,
                          text=True, timeout=60)
    out = json.loads(done.stdout) if done.stdout.strip() else {}
    assert done.returncode in (0, -signal.SIGKILL), done.stderr
    return done.returncode, out


def log_of(store_url: str) -> list[Any]:
    store = open_store(store_url)
    try:
        return list(store.read("q3"))
    finally:
        store.close()


def why_stopped(store_url: str) -> list[tuple[int, str, dict[str, Any]]]:
    """The run's pauses, escalations and budget stops, for a failure's message."""
    stops = (E.RUN_PAUSED, E.RUN_ESCALATED, E.BUDGET_EXCEEDED)
    return [(e.seq, e.type.value, e.payload) for e in log_of(store_url) if e.type in stops]


def verdicts(log: list[Any]) -> list[str]:
    return [e.payload["verdict"] for e in log if e.type is E.TOOL_CALL_RECONCILED]


@pytest.mark.parametrize("mode", ["lookup", "idempotent"])
@pytest.mark.parametrize(
    "fault, expected",
    [("model_call:3", []), ("turn_staged:3", []), ("before_effect:4", ["absent", "retry"]),
     ("after_effect:4", ["found", "retry"])],
    ids=["during-model-call", "turn-not-yet-stored", "before-effect", "after-effect"],
)
def test_kill_in_window_then_resume_applies_each_effect_once(
    store_url: str, ledger: LedgerService, mode: str, fault: str, expected: list[str]
) -> None:
    code, _ = run_agent(store_url, ledger, "--mode", mode, fault=fault)
    assert code == -signal.SIGKILL
    code, out = run_agent(store_url, ledger, "--mode", mode)
    assert code == 0 and out["status"] == "finished"
    effects = ledger.effects()
    assert effects["corrections"] == dict.fromkeys(CORRECTIONS, 1)
    assert list(effects["tickets"].values()) == [1]
    got = verdicts(log_of(store_url))
    if expected:  # lookup mode reconciles; idempotent mode retries with the same key
        assert got == [expected[0] if mode == "lookup" else expected[1]]
    else:
        assert got == []


@pytest.mark.parametrize("ledger", [False], indirect=True, ids=["receiver-ignores-keys"])
@pytest.mark.parametrize("fault, applied", [("after_effect:4", 1), ("before_effect:4", 0)],
                         ids=["after-effect", "before-effect"])
def test_irreversible_without_keys_or_lookup_pauses_for_a_person(
    store_url: str, ledger: LedgerService, fault: str, applied: int
) -> None:
    code, _ = run_agent(store_url, ledger, "--mode", "none", fault=fault)
    assert code == -signal.SIGKILL
    code, out = run_agent(store_url, ledger, "--mode", "none")
    assert code == 0 and out["status"] == "paused" and len(out["uncertain"]) == 1
    assert ledger.effects()["corrections"].get("q3-ledger-a", 0) == applied
    state = fold(log_of(store_url))
    (pending,) = state.pending.values()
    assert pending.tool == "post_correction" and pending.args["correction_id"] == "q3-ledger-a"
    # Opening it again changes nothing: it is never guessed.
    code, out = run_agent(store_url, ledger, "--mode", "none")
    assert out["status"] == "paused" and ledger.effects()["corrections"].get(
        "q3-ledger-a", 0) == applied


def kill_at_random(store_url: str, ledger: LedgerService, kills: int, seed: int,
                   extra: tuple[str, ...]) -> tuple[int, dict[str, Any]]:
    """Kill the agent ``kills`` times at random moments, resuming each time, then let it end.

    Each kill waits for the log to grow by 0-2 events (so kills land all along the
    run, not only in start-up), then a random 0-20 ms more, so they land at
    arbitrary instructions: mid-model-call, mid-tool-call, mid-append.
    """
    rng = random.Random(seed)
    store = open_store(store_url)
    done = 0
    try:
        while done < kills:
            start_seq = store.last_seq("q3")
            child = subprocess.Popen(agent_cmd(store_url, ledger, *extra),
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            target = start_seq + rng.randint(0, 2)
            deadline = time.monotonic() + 120  # a hang guard, for a loaded machine
            while child.poll() is None and store.last_seq("q3") < target:
                assert time.monotonic() < deadline, "the agent made no progress"
                time.sleep(0.002)
            time.sleep(rng.uniform(0, 0.02))
            if child.poll() is None:
                child.send_signal(signal.SIGKILL)
                done += 1
            out, err = child.communicate(timeout=30)
            if child.returncode == 0 and json.loads(out)["status"] == "finished":
                break
            assert child.returncode in (0, -signal.SIGKILL), err
    finally:
        store.close()
    return done, run_agent(store_url, ledger, *extra)[1]


@pytest.mark.parametrize("mode, snapshots", [("lookup", ()), ("idempotent", ()),
                                             ("lookup", ("--snapshot-every", "2"))],
                         ids=["lookup", "idempotent", "lookup-snapshots"])
def test_random_kills_every_effect_exactly_once(
    store_url: str, ledger: LedgerService, mode: str, snapshots: tuple[str, ...],
    request: pytest.FixtureRequest
) -> None:
    """With snapshots every 2 events (segments of 2), resumes load from snapshots a kill
    may have left half written."""
    kills = SOAK_KILLS if request.config.getoption("--slow") else KILLS
    parts = max(6, kills // 6)  # enough steps that every kill lands inside the run
    # A resume first appends run_resumed and settles what the last kill left, so on a
    # loaded machine many kills land in that settling, and one call can be interrupted
    # again and again: the crash-loop guard (max_recoveries) would rightly pause the run
    # for a person. The soak kills on purpose, so the guard is set past its kills.
    done, out = kill_at_random(store_url, ledger, kills, seed=len(mode),
                               extra=("--mode", mode, "--parts", str(parts),
                                      "--model-delay", "0.02",
                                      "--max-recoveries", str(kills + 1), *snapshots))
    assert out["status"] == "finished", (out, why_stopped(store_url))
    effects = ledger.effects()
    expected = {f"q3-{n}-{p}of{parts}" for n in LEDGERS for p in range(1, parts + 1)}
    assert effects["corrections"] == dict.fromkeys(expected, 1)
    assert list(effects["tickets"].values()) == [1]
    assert done == kills, f"the run finished after only {done} kills"
    log = log_of(store_url)
    assert [e.seq for e in log] == list(range(1, len(log) + 1))
    replayed = fold(log)
    assert replayed.status == "finished"
    assert hashlib.sha256(msgspec.json.encode(replayed)).hexdigest() == out["state_digest"]
    if snapshots:  # the last resume loaded a snapshot with its segments
        with open_store(store_url) as store:
            assert named_segments(store.snapshots("q3")[0].body)
            assert load_state(store, "q3").snapshot_seq > 0


def test_handover_race_on_a_crashed_prefix_one_takes_the_next_epoch(
    store_url: str, ledger: LedgerService, tmp_path: Path
) -> None:
    # A worker dies mid-run, leaving a prefix and its lease (epoch 1). Two workers are
    # released together to resume it: one takes the next epoch and finishes the run;
    # the other is refused the lease, or (if it comes late) finds the run finished.
    # Either way it appends nothing. The barrier is the test's own: each racer says
    # it is ready (store open, imports done), and both go when both are ready.
    code, _ = run_agent(store_url, ledger, fault="after_effect:4")
    assert code == -signal.SIGKILL
    prefix = len(log_of(store_url))
    go = tmp_path / "go"
    ready = [tmp_path / f"ready-{i}" for i in range(2)]
    racers = [subprocess.Popen(agent_cmd(store_url, ledger, "--ready-file", str(r),
                                         "--go-file", str(go)),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for r in ready]
    deadline = time.monotonic() + 120  # a hang guard, for a loaded machine
    while not all(r.exists() for r in ready):
        assert time.monotonic() < deadline and all(p.poll() is None for p in racers)
        time.sleep(0.005)
    go.touch()
    outs = [json.loads(p.communicate(timeout=60)[0]) for p in racers]
    results = sorted(o.get("error", o.get("status")) for o in outs)
    assert results in (["LeaseHeldError", "finished"], ["finished", "finished"])
    log = log_of(store_url)
    assert {e.epoch for e in log[:prefix]} == {1}
    assert {e.epoch for e in log[prefix:]} == {2}  # only the winner wrote
    assert [e.type for e in log[prefix:]].count(E.RUN_RESUMED) == 1
    assert log[-1].type is E.RUN_FINISHED
    assert ledger.effects()["corrections"] == dict.fromkeys(CORRECTIONS, 1)


def wait_until_stopped(process: subprocess.Popen[str]) -> None:
    """Until ``process`` is stopped by SIGSTOP (state T in /proc)."""
    deadline = time.monotonic() + 120  # a hang guard, for a loaded machine
    while True:
        assert process.poll() is None and time.monotonic() < deadline
        with open(f"/proc/{process.pid}/stat", "rb") as stat:
            if stat.read().rsplit(b")", 1)[1].split()[0] == b"T":
                return
        time.sleep(0.01)


def test_worker_frozen_after_effect_is_fenced_and_successor_reconciles(
    store_url: str, ledger: LedgerService
) -> None:
    first = subprocess.Popen(agent_cmd(store_url, ledger, "--lease-ttl", "1"),
                             env={**os.environ, "AGENTJOURNAL_FAULT": "after_effect:4:stop",
                                  "PYTHONFAULTHANDLER": "1"},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120  # a hang guard, for a loaded machine
    while ledger.effects()["corrections"].get("q3-ledger-a") != 1:
        assert time.monotonic() < deadline and first.poll() is None
        time.sleep(0.01)
    time.sleep(1.5)  # frozen after the effect, before its completion, past its lease
    code, out = run_agent(store_url, ledger, "--lease-ttl", "1")
    assert code == 0 and out["status"] == "finished"
    first.send_signal(signal.SIGCONT)  # it wakes up and tries to record its completion
    try:
        stdout, _ = first.communicate(timeout=120)  # a hang guard, as above
    except subprocess.TimeoutExpired:  # (seen once in a loaded run): where it waits
        first.send_signal(signal.SIGABRT)
        raise AssertionError(f"the woken worker hung:\n{first.communicate()[1]}") from None
    assert json.loads(stdout)["error"] == "FencedError"
    log = log_of(store_url)
    takeover = next(e.seq for e in log if e.epoch == 2)
    assert all(e.epoch == 2 for e in log[takeover - 1:])  # the old epoch appended nothing
    assert verdicts(log) == ["found"]
    assert ledger.effects()["corrections"] == dict.fromkeys(CORRECTIONS, 1)


def freeze_past_lease_then_succeed(store_url: str, ledger: LedgerService,
                                   fault: str) -> tuple[subprocess.Popen[str], int]:
    """A worker SIGSTOPped at ``fault`` past its 1 s lease, and a successor that finishes
    the run; returns the frozen worker and the log's length the successor left."""
    first = subprocess.Popen(agent_cmd(store_url, ledger, "--lease-ttl", "1"),
                             env={**os.environ, "AGENTJOURNAL_FAULT": f"{fault}:stop"},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_until_stopped(first)
    time.sleep(1.5)  # past its lease
    code, out = run_agent(store_url, ledger, "--lease-ttl", "1")
    assert code == 0 and out["status"] == "finished"
    return first, len(log_of(store_url))


@pytest.mark.parametrize("ledger", [False], indirect=True, ids=["receiver-ignores-keys"])
def test_worker_frozen_before_effect_wakes_and_does_not_send(
    store_url: str, ledger: LedgerService
) -> None:
    # Frozen after its call's start is durable, before the request leaves, past its
    # lease: a successor settles the call (absent at the ledger: posted again). The
    # woken worker must not send its request (the receiver here dedupes nothing).
    first, settled = freeze_past_lease_then_succeed(store_url, ledger, "before_effect:4")
    first.send_signal(signal.SIGCONT)
    stdout, stderr = first.communicate(timeout=30)
    assert json.loads(stdout)["error"] == "LeaseExpiredError", stderr
    log = log_of(store_url)
    assert len(log) == settled  # the woken worker appended nothing
    assert verdicts(log) == ["absent"]
    effects = ledger.effects()
    assert effects["corrections"] == dict.fromkeys(CORRECTIONS, 1)
    assert effects["fenced"] == 0  # its request never left: the receiver saw none
    # The successor's request carried its epoch (ctx.epoch) to the receiver.
    status, applied = http_json("GET", f"{ledger.url}/corrections/q3-ledger-a")
    assert status == 200 and applied["epoch"] == 2


@pytest.mark.parametrize("ledger", [False], indirect=True, ids=["receiver-ignores-keys"])
def test_worker_frozen_after_its_lease_check_is_refused_by_the_receiver(
    store_url: str, ledger: LedgerService
) -> None:
    # The window the lease check cannot close: frozen after the check passed, before
    # the request left. The woken worker's request carries its old epoch, and the
    # ledger, having seen the successor's newer epoch for that correction, refuses it.
    first, settled = freeze_past_lease_then_succeed(store_url, ledger, "lease_checked:1")
    first.send_signal(signal.SIGCONT)
    stdout, stderr = first.communicate(timeout=30)
    assert json.loads(stdout)["error"] == "FencedError", stderr  # its failure is not recorded
    assert len(log_of(store_url)) == settled
    effects = ledger.effects()
    assert effects["corrections"] == dict.fromkeys(CORRECTIONS, 1)
    assert effects["fenced"] == 1  # the stale request did arrive, and was refused
