"""What counts as a crash of a run (issue 42, item 2.10): worker processes SIGKILLed or
SIGSTOPped past their lease on sqlite and postgres. A worker only paused is no crash of its
run: woken fenced, it takes its stop back and withdraws a park that counted it; a run that
raised names each stop; a parked run is compensated only when asked, and never for a
paused worker's stop. Effects are judged at a ledger process (tests/chaos_agents.py)."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentjournal import EventType, open_store
from agentjournal.demo.ledger import LedgerService
from agentjournal.fleet import queue_of, submit
from agentjournal.snapshots import load_state

from .chaos_agents import DELAY_ENV, MAX_PARTS, URL_ENV, correction_ids, parts_of
from .conftest import fresh_url
from .test_worker import QUEUED, STOP_LINE, Fleet, _submit


@pytest.fixture(params=QUEUED)
def fleet(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Fleet]:
    for url in fresh_url(request.param, tmp_path):
        f = Fleet(url, tmp_path)
        yield f
        f.close()


def _epochs(url: str, run_id: str) -> set[int]:
    with open_store(url) as store:
        return {e.epoch for e in store.read(run_id)}


def _long_ledger_run(url: str) -> str:
    """A ledger run (tests/chaos_agents.py) that posts the most corrections: a worker
    holds it long enough to be killed, or paused, mid-run."""
    run_id = next(f"long-{i}" for i in range(100) if parts_of(f"long-{i}") == MAX_PARTS)
    with open_store(url) as store:
        submit(store, "tests.chaos_agents:ledger_agent", "post corrections", run_id)
    return run_id


def _holds_and_appends(fleet: Fleet, run_id: str, proc: subprocess.Popen[bytes],
                       seen: set[int]) -> None:
    """Wait until ``proc`` holds ``run_id`` and has appended to it under its own epoch."""
    fleet.until("the worker holding the run appending", lambda: any(
        w.pid == proc.pid and run_id in w.runs for w in _workers(fleet.url))
        and _epochs(fleet.url, run_id) - seen)
    seen |= _epochs(fleet.url, run_id)


def _workers(url: str) -> list[Any]:
    with open_store(url) as store:
        return queue_of(store).workers()


def _two_kills_then_a_pause(fleet: Fleet, run_id: str, args: tuple[str, ...]
                            ) -> tuple[list[int], subprocess.Popen[bytes],
                                       subprocess.Popen[bytes]]:
    """Two workers of the run SIGKILLed while they hold it, a third SIGSTOPped past its
    lease, a successor's claim (the fourth): (the killed pids, the paused worker, the
    successor). The paused worker is left stopped."""
    seen: set[int] = set()
    killed = []
    for _ in range(2):
        proc = fleet.worker(*args, agents="tests.chaos_agents")
        _holds_and_appends(fleet, run_id, proc, seen)
        proc.kill()
        proc.wait()
        killed.append(proc.pid)
    paused = fleet.worker(*args, agents="tests.chaos_agents")
    _holds_and_appends(fleet, run_id, paused, seen)
    paused.send_signal(signal.SIGSTOP)
    successor = fleet.worker(*args, agents="tests.chaos_agents")
    fleet.until("the successor's claim", lambda: fleet.runs()[run_id].claims == 4)
    return killed, paused, successor


def test_a_worker_paused_past_its_lease_is_no_crash_of_its_run(
        fleet: Fleet, tmp_path: Path) -> None:
    """Two workers of a run SIGKILLed, a third SIGSTOPped past its lease: the claim after
    the pause counts a third stop and parks the run (max crashes 3). The paused worker,
    resumed (SIGCONT), wakes fenced: alive, so its stop was no crash, and the park is
    withdrawn. The run finishes, each correction applied once at the ledger; the
    escalation named each stop it counted, the withdrawal the one that was no crash."""
    with LedgerService(tmp_path / "ledger.db", latency_ms=5) as ledger:
        fleet.env.update({URL_ENV: ledger.url, DELAY_ENV: "0.3"})
        run_id = _long_ledger_run(fleet.url)
        args = ("--ttl", "1", "--max-crashes", "3")
        killed, paused, successor = _two_kills_then_a_pause(fleet, run_id, args)
        paused.send_signal(signal.SIGCONT)
        # (Before the fix it stayed parked: this timed out.)
        fleet.until("the run finished", lambda: fleet.runs()[run_id].state == "done", 60)
        row = fleet.runs()[run_id]
        assert (row.state, row.reason) == ("done", None), (row, fleet.logs())
        counts = ledger.effects()["corrections"]
        assert counts == dict.fromkeys(correction_ids(run_id), 1), counts
        for proc in (paused, successor):
            assert fleet.stop(proc) == 0, fleet.logs()
    with open_store(fleet.url) as store:
        log = list(store.read(run_id))
    (escalated,) = [e for e in log if e.type is EventType.RUN_ESCALATED]
    stops = STOP_LINE.findall(escalated.payload["reason"])
    pids = [int(worker.split(":")[1]) for _, worker, _ in stops]
    assert pids == [*killed, paused.pid], escalated.payload["reason"]
    assert all("lease lapsed" in what for _, _, what in stops), stops
    (withdrawn,) = [e for e in log if e.type is EventType.RUN_RESUMED and e.seq > escalated.seq
                    and e.payload.get("by")]
    # Withdrawn by the paused worker, or by the successor that parked the run if the
    # stop was taken back before its park landed: either names the stop.
    assert withdrawn.payload["by"].startswith("agentjournal worker ")
    assert f"epoch {stops[-1][0]} (worker {stops[-1][1]})" in withdrawn.payload["reason"]
    assert "2 stop(s) still counted" in withdrawn.payload["reason"], withdrawn.payload
    assert log[-1].type is EventType.RUN_FINISHED


def test_a_worker_paused_before_two_kills_leaves_its_run_never_parked(
        fleet: Fleet, tmp_path: Path) -> None:
    """The pause first: the paused worker wakes fenced and takes its stop back before
    two workers are SIGKILLed, so the run (max crashes 3) is never parked, never
    escalated, and finishes, each correction applied once at the ledger."""
    with LedgerService(tmp_path / "ledger.db", latency_ms=5) as ledger:
        fleet.env.update({URL_ENV: ledger.url, DELAY_ENV: "0.3"})
        run_id = _long_ledger_run(fleet.url)
        args = ("--ttl", "1", "--max-crashes", "3")
        seen: set[int] = set()
        paused = fleet.worker(*args, agents="tests.chaos_agents")
        _holds_and_appends(fleet, run_id, paused, seen)
        paused.send_signal(signal.SIGSTOP)
        proc = fleet.worker(*args, agents="tests.chaos_agents")
        _holds_and_appends(fleet, run_id, proc, seen)
        paused.send_signal(signal.SIGCONT)
        fleet.until("the paused worker taking its stop back",
                    lambda: "taken back" in fleet.procs[0][1].read_text())
        assert fleet.runs()[run_id].crashes == 0
        assert fleet.stop(paused) == 0, fleet.logs()
        for _ in range(2):
            proc.kill()
            proc.wait()
            proc = fleet.worker(*args, agents="tests.chaos_agents")
            _holds_and_appends(fleet, run_id, proc, seen)
        fleet.until("the run finished", lambda: fleet.runs()[run_id].state == "done", 60)
        assert fleet.stop(proc) == 0, fleet.logs()
        counts = ledger.effects()["corrections"]
        assert counts == dict.fromkeys(correction_ids(run_id), 1), counts
    with open_store(fleet.url) as store:
        types = [e.type for e in store.read(run_id)]
    assert EventType.RUN_ESCALATED not in types and types[-1] is EventType.RUN_FINISHED


def test_a_run_parked_on_a_paused_worker_s_stop_is_not_compensated(
        fleet: Fleet, tmp_path: Path) -> None:
    """As above, with --compensate-parked: the claim after the pause counts the paused
    worker's stop as the third (max crashes 3). An undo cannot be withdrawn, so the run
    is held for one more TTL before it is compensated; the paused worker, resumed
    (SIGCONT) in that time, wakes fenced and takes its stop back. No saga starts, the
    run finishes, each correction applied once at the ledger."""
    with LedgerService(tmp_path / "ledger.db", latency_ms=5) as ledger:
        fleet.env.update({URL_ENV: ledger.url, DELAY_ENV: "0.3"})
        run_id = _long_ledger_run(fleet.url)
        args = ("--ttl", "2", "--max-crashes", "3", "--compensate-parked")
        _, paused, successor = _two_kills_then_a_pause(fleet, run_id, args)
        paused.send_signal(signal.SIGCONT)
        fleet.until("the run ended", lambda: fleet.runs()[run_id].state in ("done", "parked"),
                    60)
        with open_store(fleet.url) as store:
            types = [e.type for e in store.read(run_id)]
        assert EventType.SAGA_STARTED not in types, fleet.logs()
        assert types[-1] is EventType.RUN_FINISHED, types
        row = fleet.runs()[run_id]
        assert (row.state, row.reason) == ("done", None), (row, fleet.logs())
        counts = ledger.effects()["corrections"]
        assert counts == dict.fromkeys(correction_ids(run_id), 1), counts
        for proc in (paused, successor):
            assert fleet.stop(proc) == 0, fleet.logs()
    assert "stops taken back while it was held" in fleet.logs()


def test_a_run_parked_after_raising_names_each_stop_it_raised(fleet: Fleet) -> None:
    """A run whose agent raises in its worker (alive, it leaves the run to its lease):
    each stop the next claim counts is named with what was raised, in the queue and in
    the escalation."""
    _submit(fleet.url, "broken", "t", "broken")  # (no log: parked without escalating)
    proc = fleet.worker("--ttl", "1", "--max-crashes", "2")
    fleet.until("the broken run parked", lambda: fleet.runs()["broken"].state == "parked")
    assert proc.poll() is None and fleet.stop(proc) == 0, fleet.logs()
    row = fleet.runs()["broken"]
    stops = STOP_LINE.findall("\n".join(row.stops))
    assert row.reason is not None and all(stop in row.reason for stop in row.stops), row
    assert len(stops) == row.crashes == 2, row
    assert all(worker.split(":")[1] == str(proc.pid) for _, worker, _ in stops), stops
    assert all(what == "raised RuntimeError: the factory is broken" for _, _, what in stops)
    assert [int(epoch) for epoch, _, _ in stops] == [1, 2], stops


def test_a_failed_run_is_compensated_when_the_worker_is_asked_to(fleet: Fleet) -> None:
    _submit(fleet.url, "poison_after_holds", "hold then explode", "bad")
    deadline = time.monotonic() + 120  # a hang guard, for a loaded machine
    while fleet.runs()["bad"].state not in ("parked", "done"):
        assert time.monotonic() < deadline, fleet.logs()
        proc = fleet.worker("--ttl", "1", "--max-crashes", "2", "--compensate-parked")
        while proc.poll() is None and fleet.runs()["bad"].state not in ("parked", "done"):
            time.sleep(0.05)
    assert fleet.runs()["bad"].state == "done", fleet.logs()
    # Each hold made once and released once, newest first, by the effects file's count.
    assert fleet.effects() == {("bad", "h1"): 1, ("bad", "h2"): 1, ("bad", "explode"): 2,
                               ("bad", "undo:h1"): 1, ("bad", "undo:h2"): 1}
    lines = [ln.split()[1] for ln in fleet.effects_file.read_text().splitlines()]
    assert lines[-2:] == ["undo:h2", "undo:h1"]
    assert "compensated bad after 2 crashes" in fleet.logs()
    with open_store(fleet.url) as store:
        assert load_state(store, "bad").state.status == "compensated"
    assert fleet.stop(proc) == 0
