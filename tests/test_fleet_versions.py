"""Rollouts in a fleet (issue 43, point 5): real worker processes of two releases drain
one store side by side. A run pinned to a version is claimed only by a worker serving
it, and waits queued (never parked) while none that does is live, the reason in
`agentjournal queue`; an unpinned run moves to the newest version. Effects are counted
at the ledger, a receiver process of its own."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentjournal import RunMismatchError, open_store
from agentjournal.decisions import decide_approval
from agentjournal.demo.ledger import LedgerService
from agentjournal.fleet import Versions, WorkerInfo, queue_of, submit
from agentjournal.fleet.trust import AgentTrust
from agentjournal.fleet.versions import pick
from agentjournal.snapshots import load_state

from .conftest import fresh_url
from .test_worker import Fleet
from .versioned_agents import RELEASE_ENV, URL_ENV, release

REF = "tests.versioned_agents:ledger"
PINNED_V1, PINNED_V2, UNPINNED = ("p1", "p2"), ("q2",), ("u1", "u2")


@pytest.fixture(params=("sqlite", "postgres"))
def fleet(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Fleet]:
    if request.param != "sqlite" and not request.config.getoption("--slow"):
        pytest.skip("on sqlite by default (--slow: postgres too)")
    for url in fresh_url(request.param, tmp_path):
        f = Fleet(url, tmp_path)
        yield f
        f.close()


def _release(fleet: Fleet, release: str, agents: str = REF) -> tuple[int, Path]:
    """A worker process whose code is ``release`` ("v1", "v2", "v2+v1")."""
    fleet.env[RELEASE_ENV] = release
    proc = fleet.worker("--ttl", "1", "--concurrency", "4", agents=agents)
    return proc.pid, fleet.procs[-1][1]


def _versions(fleet: Fleet, run_id: str) -> list[str]:
    with open_store(fleet.url) as store:
        return load_state(store, run_id).state.versions


def _approve_all(fleet: Fleet, run_ids: tuple[str, ...]) -> None:
    with open_store(fleet.url) as store:
        for run_id in run_ids:
            (approval,) = load_state(store, run_id).state.approvals
            decide_approval(store, run_id, approval, approved=True, by="ana")


def _claimed_in(log: Path) -> set[str]:
    return set(re.findall(r"claimed (\S+) \(epoch", log.read_text()))


def test_pinned_runs_wait_for_a_worker_serving_their_version(fleet: Fleet,
                                                             tmp_path: Path) -> None:
    everyone = (*PINNED_V1, *PINNED_V2, *UNPINNED)
    with LedgerService(tmp_path / "ledger.db") as ledger:
        fleet.env[URL_ENV] = ledger.url
        submitted = fleet.cli("submit", "--agent", REF, "--task", "reconcile p1", "--run-id",
                              "p1", "--pin-version", "v1")
        assert submitted.returncode == 0 and "pinned to version v1" in submitted.stderr
        with open_store(fleet.url) as store:
            for run_id in everyone[1:]:
                pin = "v2" if run_id in PINNED_V2 else "v1" if run_id in PINNED_V1 else None
                submit(store, REF, f"reconcile {run_id}", run_id, pin_version=pin)
        # The old release alone: it takes every run but the one pinned to v2.
        old_pid, old_log = _release(fleet, "v1")
        fleet.until("the runs it serves waiting for their approval", lambda: all(
            fleet.runs()[r].state == "waiting" for r in (*PINNED_V1, *UNPINNED)))
        (waits,) = json.loads(fleet.cli("queue", "--json").stdout)["unserved"]
        assert (waits["run_id"], waits["state"], waits["pin_version"]) == ("q2", "queued", "v2")
        assert waits["reason"].startswith(
            f"waiting for a worker serving version v2 of {REF} (live workers serve v1)")
        # The rollout: a new worker, still serving v1 too, beside the old one.
        new_pid, new_log = _release(fleet, "v2+v1")
        fleet.until("the run pinned to v2 waiting for its approval",
                    lambda: fleet.runs()["q2"].state == "waiting")
        served = {w["pid"]: w["versions"] for w in json.loads(fleet.cli("workers",
                                                                         "--json").stdout)}
        assert served == {old_pid: {REF: ["v1"]}, new_pid: {REF: ["v2", "v1"]}}
        assert f"serving {REF} v2, v1" in new_log.read_text()
        for run_id in (*PINNED_V1, *UNPINNED):
            assert _versions(fleet, run_id) == ["v1"]
        assert _versions(fleet, "q2") == ["v2"] and fleet.runs()["q2"].claims == 1
        assert "q2" not in _claimed_in(old_log)

        # Every worker serving v1 killed; the new release alone (v2) takes over.
        for proc, _ in fleet.procs:
            proc.kill()
            proc.wait()
        _, v2_log = _release(fleet, "v2")
        _approve_all(fleet, everyone)
        fleet.until("the runs it serves done", lambda: all(
            fleet.runs()[r].state == "done" for r in (*UNPINNED, *PINNED_V2)))
        for run_id in UNPINNED:  # moved to the newest version
            assert _versions(fleet, run_id) == ["v1", "v2"]
        unserved = fleet.until("the pinned runs' reason", lambda: json.loads(
            fleet.cli("queue", "--json").stdout)["unserved"])
        assert sorted(u["run_id"] for u in unserved) == list(PINNED_V1)
        assert all(u["reason"].startswith(f"waiting for a worker serving version v1 of {REF}"
                                          " (live workers serve v2)") for u in unserved)
        assert "waiting for a worker serving version v1" in fleet.cli("queue").stdout
        assert json.loads(fleet.cli("queue", "--json").stdout)["runnable"] == 0
        for run_id in PINNED_V1:  # never claimed by the v2 worker, never parked
            row = fleet.runs()[run_id]
            assert (row.state, row.claims, row.runnable) == ("waiting", 1, True)
            shown = json.loads(fleet.cli("show", run_id, "--json").stdout)
            assert shown["queue"]["waiting_for"] == row.waiting_for, shown
            assert "waiting for a worker serving version v1" in shown["next"]["sentence"], shown
        assert not _claimed_in(v2_log) & set(PINNED_V1)

        # A v1 worker again (trusting the module: it loads the pinned runs' agent).
        _, v1_log = _release(fleet, "v1", agents="tests.versioned_agents")
        fleet.until("the pinned runs done", lambda: all(
            fleet.runs()[r].state == "done" for r in PINNED_V1))
        for run_id in PINNED_V1:
            assert _versions(fleet, run_id) == ["v1"]
        assert _claimed_in(v1_log) == set(PINNED_V1)
        assert json.loads(fleet.cli("queue", "--json").stdout)["unserved"] == []
        effects = ledger.effects()
        assert effects["corrections"] == {f"{r}-c1": 1 for r in everyone}
        assert effects["tickets"] == {f"{r}-t1": 1 for r in everyone}


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_claim_takes_a_pinned_run_only_serving_its_version(backend: str,
                                                              tmp_path: Path) -> None:
    """The queue alone (no processes): the claim statement filters, a resubmit keeps the
    pin, and the reason names what the live workers serve."""
    for url in fresh_url(backend, tmp_path):
        with open_store(url) as store:
            queue = queue_of(store)
            submit(store, REF, "old", "pinned", pin_version="v1")
            submit(store, REF, "any", "free")
            submit(store, REF, "old", "pinned", pin_version="v1")  # the same request
            with pytest.raises(RunMismatchError, match="pin_version"):
                submit(store, REF, "old", "pinned", pin_version="v2")
            with pytest.raises(RunMismatchError, match="pin_version"):
                submit(store, REF, "old", "pinned")
            new = {REF: ["v2"]}
            claims = queue.claim_many("new", 30, ["default"], 5, served=new)
            assert [(c.lease.run_id, c.pin_version) for c in claims] == [("free", None)]
            assert queue.claim("unversioned", 30, ["default"]) is None  # serves no version
            queue.beat(WorkerInfo(worker_id="new", host="h", pid=1, queues=["default"],
                                  runs=["free"], started_at=time.time(),
                                  heartbeat_at=time.time(), versions=new, ttl=30))
            (row,) = [r for r in queue.runs() if r.run_id == "pinned"]
            assert (row.state, row.runnable, row.pin_version) == ("queued", True, "v1")
            assert row.waiting_for is not None and row.waiting_for.startswith(
                f"waiting for a worker serving version v1 of {REF} (live workers serve v2)")
            old = queue.claim("old", 30, ["default"], served={REF: ["v2", "v1"]})
            assert old is not None and (old.lease.run_id, old.pin_version) == ("pinned", "v1")


def test_versions_serve_each_version_once_newest_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(URL_ENV, "http://127.0.0.1:9")  # (never called)
    v1, v2 = release("v1"), release("v2")
    both = Versions(v2, v1)
    assert (both.versions, both.get(None), both.get("v1"), both.get("v3")) == (
        ["v2", "v1"], v2, v1, None)
    assert (pick(both, "v1"), pick(v1, None), pick(v1, "v2")) == (v1, v1, None)
    with pytest.raises(ValueError, match="version 'v1' given twice"):
        Versions(v1, release("v1"))
    monkeypatch.setenv(RELEASE_ENV, "v2+v1")
    trust = AgentTrust(["tests.versioned_agents"])  # a factory annotated -> Versions
    assert trust.load_versions(REF).versions == ["v2", "v1"]  # type: ignore[union-attr]
    assert trust.load(REF).version == "v2"  # type: ignore[union-attr]
