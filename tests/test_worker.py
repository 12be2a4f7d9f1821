"""Worker processes (`agentjournal worker`) draining a queue on sqlite and postgres: effects
once, drain hand-offs without a TTL, poison runs parked, a person's decision resumed, and
the fleet commands. Effects are judged by the agents' own file (tests/fleet_agents.py)."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agentjournal import EventType, open_store
from agentjournal.fleet import QueuedRun, queue_of, submit
from agentjournal.snapshots import load_state

from .builders import drive_until
from .conftest import fresh_url
from .fleet_agents import ENV

ROOT = Path(__file__).resolve().parent.parent
QUEUED = ("sqlite", "postgres")
#: A stop the queue counted, as its reason lists it.
STOP_LINE = re.compile(r"^- epoch (\d+): worker (\S+) (.*)$", re.M)


@pytest.fixture(params=QUEUED)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from fresh_url(request.param, tmp_path)


class Fleet:
    """Worker processes and CLI calls against one store, with one effects file."""

    def __init__(self, url: str, tmp: Path) -> None:
        self.url, self.tmp = url, tmp
        self.effects_file = tmp / "effects.txt"
        self.env = {**os.environ, ENV: str(self.effects_file), "PYTHONUNBUFFERED": "1"}
        self.env.pop("AGENTJOURNAL_STORE", None)
        self.procs: list[tuple[subprocess.Popen[bytes], Path]] = []

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "agentjournal", *args, "--store", self.url],
                              cwd=ROOT, env=self.env, capture_output=True, text=True,
                              timeout=60)

    def worker_pids(self) -> set[int]:
        """The pids of the workers whose heartbeat is in the store (none before it exists)."""
        listed = self.cli("workers", "--json")
        return {w["pid"] for w in json.loads(listed.stdout)} if listed.returncode == 0 else set()

    def worker(self, *args: str, agents: str = "tests.fleet_agents",
               cwd: Path = ROOT) -> subprocess.Popen[bytes]:
        """A worker trusting ``agents``; it imports them from the repository root, named
        explicitly (its working directory is never on its import path)."""
        log = self.tmp / f"worker-{len(self.procs)}.log"
        with open(log, "wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "agentjournal", "worker", "--store", self.url,
                 "--agents", agents, "--import-path", str(ROOT), "--poll", "0.2", *args],
                cwd=cwd, env=self.env, stdout=subprocess.DEVNULL, stderr=err)
        self.procs.append((proc, log))
        return proc

    def logs(self) -> str:
        return "\n".join(f"--- {log.name} (pid {p.pid}, rc {p.poll()})\n{log.read_text()}"
                         for p, log in self.procs)

    def effects(self) -> Counter[tuple[str, str]]:
        if not self.effects_file.exists():
            return Counter()
        return Counter(tuple(line.split()[:2])  # type: ignore[misc]
                       for line in self.effects_file.read_text().splitlines())

    def runs(self) -> dict[str, QueuedRun]:
        with open_store(self.url) as store:
            return {r.run_id: r for r in queue_of(store).runs()}

    def until(self, what: str, check: Callable[[], Any], timeout: float = 120.0) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if found := check():
                return found
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}\n{self.logs()}")

    def stop(self, proc: subprocess.Popen[bytes], timeout: float = 120.0) -> int:
        proc.send_signal(signal.SIGTERM)
        return proc.wait(timeout=timeout)

    def close(self) -> None:
        for proc, _ in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.fixture
def fleet(url: str, tmp_path: Path) -> Iterator[Fleet]:
    f = Fleet(url, tmp_path)
    yield f
    f.close()


def _submit(url: str, agent: str, task: str, run_id: str) -> None:
    with open_store(url) as store:
        submit(store, f"tests.fleet_agents:{agent}", task, run_id)


def test_two_workers_drain_five_runs_each_effect_once(fleet: Fleet) -> None:
    done = fleet.cli("submit", "--agent", "tests.fleet_agents:counter", "--task", "run 0",
                     "--run-id", "r0", "--json")
    assert done.returncode == 0 and json.loads(done.stdout) == {"run_id": "r0", "created": True}
    for i in range(1, 5):
        _submit(fleet.url, "counter", f"run {i}", f"r{i}")
    workers = [fleet.worker("--concurrency", "2") for _ in range(2)]
    fleet.until("5 runs done", lambda: [r.state for r in fleet.runs().values()] == ["done"] * 5)
    assert fleet.effects() == {(f"r{i}", label): 1 for i in range(5) for label in "ab"}
    summary = json.loads(fleet.cli("queue", "--json").stdout)
    assert summary["total"]["done"] == 5 and summary["queues"]["default"]["done"] == 5
    assert summary["runnable"] == 0 and summary["poison"] == []
    seen = json.loads(fleet.cli("workers", "--json").stdout)
    assert sorted(w["pid"] for w in seen) == sorted(p.pid for p in workers)
    assert all(w["runs"] == [] and not w["draining"] for w in seen)
    for proc in workers:
        proc.send_signal(signal.SIGTERM)
    assert [proc.wait(timeout=120) for proc in workers] == [0, 0], fleet.logs()
    assert json.loads(fleet.cli("workers", "--json").stdout) == []


def test_a_drained_run_is_continued_by_another_worker_at_once(fleet: Fleet) -> None:
    # Both workers are up before the run exists, so the drain never races B's start-up;
    # a takeover after the TTL would take 30 s.
    workers = {p.pid: p for p in (fleet.worker("--ttl", "30"), fleet.worker("--ttl", "30"))}
    fleet.until("both heartbeats", lambda: fleet.worker_pids() == set(workers))
    _submit(fleet.url, "slow", "three slow effects", "slow")
    fleet.until("the first effect", lambda: fleet.effects()[("slow", "s0")])
    holder = fleet.until("the claim's log line", lambda: next((
        p.pid for p, log in fleet.procs if "claimed slow" in log.read_text()), None))
    a = workers.pop(holder)
    (b,) = workers.values()
    assert fleet.stop(a) == 0, fleet.logs()
    fleet.until("the run to finish", lambda: fleet.runs()["slow"].state == "done")
    assert fleet.effects() == {("slow", f"s{i}"): 1 for i in range(3)}
    with open_store(fleet.url) as store:
        events = list(store.read("slow"))
    epochs = sorted({e.epoch for e in events})
    assert len(epochs) == 2, [(e.seq, e.type, e.epoch) for e in events]
    last_a = max(e.ts for e in events if e.epoch == epochs[0])
    first_b = min(e.ts for e in events if e.epoch == epochs[1])
    gap = (first_b - last_a).total_seconds()
    assert 0 <= gap < 30, (gap, fleet.logs())  # handed back: no wait for the 30 s TTL
    assert "handed back slow" in fleet.logs()
    assert fleet.stop(b) == 0


def test_a_poison_run_is_parked_escalated_and_requeued(fleet: Fleet) -> None:
    _submit(fleet.url, "poison", "explode", "bad")
    deadline = time.monotonic() + 120  # a hang guard, for a loaded machine
    deaths, dead = 0, []
    while fleet.runs()["bad"].state != "parked":
        assert time.monotonic() < deadline, fleet.logs()
        proc = fleet.worker("--ttl", "1", "--max-crashes", "2")
        while proc.poll() is None and fleet.runs()["bad"].state != "parked":
            time.sleep(0.05)
        if proc.poll() is not None:
            assert proc.returncode == 1, fleet.logs()  # os._exit(1) in the tool
            deaths += 1
            dead.append(proc.pid)
    assert deaths == 2 and fleet.effects() == {("bad", "explode"): 2}
    assert fleet.stop(proc) == 0
    with open_store(fleet.url) as store:
        last = list(store.read("bad"))[-1]
    assert last.type is EventType.RUN_ESCALATED and last.payload["crashes"] == 2
    assert "stopped without handing it back 2 times" in last.payload["reason"]
    assert "agentjournal requeue bad" in last.payload["reason"]
    # Each stop counted, named: the two workers the tool killed (their leases lapsed).
    stops = STOP_LINE.findall(last.payload["reason"])
    assert [int(worker.split(":")[1]) for _, worker, _ in stops] == dead, stops
    assert all("its lease lapsed (killed, or hung)" in what for _, _, what in stops)
    assert [STOP_LINE.match(stop).groups() for stop in fleet.runs()["bad"].stops] == stops  # type: ignore[union-attr]
    summary = json.loads(fleet.cli("queue", "--json").stdout)
    assert [p["run_id"] for p in summary["poison"]] == ["bad"]
    assert summary["total"]["parked"] == 1 and summary["runnable"] == 0
    requeued = fleet.cli("requeue", "bad")
    assert requeued.returncode == 0, requeued.stderr
    row = fleet.runs()["bad"]
    assert (row.state, row.crashes, row.runnable) == ("queued", 0, True)
    again = fleet.cli("requeue", "bad")
    assert again.returncode == 2 and "queued" in again.stderr
    with open_store(fleet.url) as store:
        decided = list(store.read("bad"))[-1]
    assert decided.type is EventType.RUN_RESUMED and decided.payload["by"]  # a decision
    # ... so a worker drives it again (and this one dies in the same tool again).
    proc = fleet.worker("--ttl", "1", "--max-crashes", "2")
    fleet.until("the requeued run to run", lambda: proc.poll() is not None)
    assert fleet.effects() == {("bad", "explode"): 3}


def test_a_waiting_run_is_finished_after_a_person_approves(fleet: Fleet) -> None:
    _submit(fleet.url, "needs_approval", "ask first", "ask")
    proc = fleet.worker()
    fleet.until("the run to wait", lambda: fleet.runs()["ask"].state == "waiting")
    assert not fleet.runs()["ask"].runnable and fleet.effects() == {}
    with open_store(fleet.url) as store:
        (approval,) = load_state(store, "ask").state.approvals
    approved = fleet.cli("approve", "ask", approval, "--by", "ana")
    assert approved.returncode == 0, approved.stderr
    fleet.until("the run to finish", lambda: fleet.runs()["ask"].state == "done")
    assert fleet.effects() == {("ask", "approved"): 1}
    assert fleet.stop(proc) == 0


def test_a_person_resolves_a_paused_run_s_uncertain_calls_one_after_the_other(
        fleet: Fleet) -> None:
    _submit(fleet.url, "two_uncertain", "post both", "cut")
    proc = fleet.worker()
    fleet.until("the run to wait", lambda: fleet.runs()["cut"].state == "waiting")
    with open_store(fleet.url) as store:
        pending = {p.args["label"]: p.key for p in load_state(store, "cut").state.pending.values()}
    assert fleet.effects() == {("cut", "landed"): 1}
    # At once, one after the other: the first verdict leaves the run waiting for the
    # second, so no worker holds its lease when the second is recorded.
    for label, verdict in (("landed", "--happened"), ("lost", "--did-not-happen")):
        resolved = fleet.cli("resolve", "cut", pending[label], verdict, "--by", "ana")
        assert resolved.returncode == 0, resolved.stderr
    fleet.until("the run to finish", lambda: fleet.runs()["cut"].state == "done")
    assert fleet.effects() == {("cut", "landed"): 1, ("cut", "lost"): 1}
    assert fleet.runs()["cut"].claims == 2  # not taken up between the two verdicts
    assert fleet.stop(proc) == 0


def test_submit_is_idempotent_through_the_cli(fleet: Fleet) -> None:
    args = ("submit", "--agent", "tests.fleet_agents:counter", "--task", "once", "--run-id", "x")
    first, second = fleet.cli(*args), fleet.cli(*args)
    assert (first.returncode, first.stdout.strip()) == (0, "x")
    assert (second.returncode, second.stdout.strip()) == (0, "x")
    assert "already submitted" in second.stderr
    other = fleet.cli("submit", "--agent", "tests.fleet_agents:counter", "--task", "twice",
                      "--run-id", "x")
    assert other.returncode == 2 and "'once'" in other.stderr and "'twice'" in other.stderr
    bad = fleet.cli("submit", "--agent", "no-colon", "--task", "t")
    assert bad.returncode == 2
    assert list(fleet.runs()) == ["x"]


#: An agent module of a new user's own, in the directory they run `submit` from.
USER_AGENTS = """import os

from agentjournal import Agent, ScriptedModel, calls, reply, tool
from agentjournal.tools import ToolContext


@tool(effect="irreversible")
def record(ctx: ToolContext, label: str) -> str:
    \"\"\"Record that `label` happened.\"\"\"
    with open(os.environ["FLEET_EFFECTS"], "a") as effects:
        effects.write(f"{ctx.run_id} {label} {ctx.key}\\n")
    return f"recorded {label}"


def counter() -> Agent:
    return Agent(ScriptedModel([calls(("record", {"label": "a"})), reply("done")]), [record])
"""


def _printed_worker_command(stderr: str) -> str:
    found = re.search(r"start workers with: (agentjournal worker .*)$", stderr, re.M)
    assert found, stderr
    return found.group(1)


def test_the_worker_command_submit_prints_runs_the_run_as_printed(fleet: Fleet) -> None:
    """A new user's agent module sits in the directory they submit from: the worker
    command `submit` prints, pasted in that directory, imports it and runs the run
    (it used to leave the directory off the import path and park every run)."""
    cwd = fleet.tmp / "project"
    cwd.mkdir()
    (cwd / "myagents.py").write_text(USER_AGENTS)
    env = {**fleet.env, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    submitted = subprocess.run(["agentjournal", "submit", "--agent", "myagents:counter",
                                "--task", "count", "--run-id", "mine", "--store", fleet.url],
                               cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    assert submitted.returncode == 0, submitted.stderr
    printed = _printed_worker_command(submitted.stderr)
    log = fleet.tmp / "printed-worker.log"
    with open(log, "wb") as err:  # the command as a shell would split it, nothing added
        proc = subprocess.Popen(shlex.split(printed), cwd=cwd, env=env,
                                stdout=subprocess.DEVNULL, stderr=err)
    fleet.procs.append((proc, log))
    fleet.until("the run handed back", lambda: fleet.runs()["mine"].state in ("done", "parked"))
    assert fleet.stop(proc) == 0, fleet.logs()  # bounded: drained once the run is back
    row = fleet.runs()["mine"]
    assert (row.state, row.reason) == ("done", None), (printed, row)
    assert fleet.effects() == {("mine", "a"): 1}


def test_submit_refuses_a_ref_no_worker_would_run_and_suggests_no_command(
        fleet: Fleet) -> None:
    """`submit --agent os:fork` suggested `worker --agents os`, which refuses it too. A ref
    that imports here and is no agent is refused at submit, nothing queued; a worker
    command is printed only for a ref it would run (run as printed, it does)."""
    for ref, why in (("os:fork", "a builtin"), ("tests.fleet_agents:explode", "not an Agent"),
                     ("tests.fleet_agents:nothing", "has no 'nothing'")):
        refused = fleet.cli("submit", "--agent", ref, "--task", "t", "--run-id", "no")
        assert refused.returncode == 2 and why in refused.stderr, (ref, refused.stderr)
        assert "agentjournal worker" not in refused.stderr, refused.stderr
    assert fleet.runs() == {}
    elsewhere = fleet.cli("submit", "--agent", "not_here.agents:x", "--task", "t",
                          "--run-id", "elsewhere")
    assert elsewhere.returncode == 0, elsewhere.stderr  # its workers may import it
    assert "start workers with" not in elsewhere.stderr
    assert "cannot import module 'not_here.agents'" in elsewhere.stderr, elsewhere.stderr
    ok = fleet.cli("submit", "--agent", "tests.fleet_agents:counter", "--task", "t",
                   "--run-id", "ok")
    assert ok.returncode == 0, ok.stderr
    printed = shlex.split(_printed_worker_command(ok.stderr))
    log = fleet.tmp / "printed-worker.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", *printed], cwd=ROOT, env=fleet.env,
                                stdout=subprocess.DEVNULL, stderr=err)
    fleet.procs.append((proc, log))
    fleet.until("the run handed back", lambda: fleet.runs()["ok"].state in ("done", "parked"))
    assert fleet.stop(proc) == 0, fleet.logs()
    assert fleet.runs()["ok"].state == "done", fleet.logs()


def test_a_jsonl_store_has_no_queue_for_workers_or_submit(tmp_path: Path) -> None:
    (url,) = fresh_url("jsonl", tmp_path)
    fleet = Fleet(url, tmp_path)
    worker = fleet.cli("worker", "--agents", "m")
    assert worker.returncode == 1 and "has no queue of runs" in worker.stderr
    submitted = fleet.cli("submit", "--agent", "m:a", "--task", "t")
    assert submitted.returncode == 1 and "has no queue of runs" in submitted.stderr
    assert not (tmp_path / "runs").exists()  # refused before anything was created


def test_a_worker_serves_its_metrics_to_a_scraper(fleet: Fleet) -> None:
    _submit(fleet.url, "counter", "run 0", "m0")
    proc = fleet.worker("--metrics-port", "0")
    found = fleet.until("the metrics address", lambda: re.search(
        rb"metrics at (http://\S+/metrics)", fleet.procs[-1][1].read_bytes()))
    fleet.until("the run done", lambda: fleet.runs()["m0"].state == "done")
    with urllib.request.urlopen(found.group(1).decode(), timeout=10) as reply:
        assert reply.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = reply.read().decode()
    assert "# TYPE agentjournal_worker_claims_total counter" in text
    assert "agentjournal_worker_claims_total 1" in text.splitlines()
    assert "agentjournal_worker_runs_done_total 1" in text.splitlines()
    # The run was new: its open read nothing, so nothing was replayed.
    assert "agentjournal_events_replayed_total" not in text
    assert fleet.stop(proc) == 0, fleet.logs()


# --- which agents a worker runs (issue 26, item 2) ------------------------------------

#: A module a hostile queue writer hopes a worker imports: it leaves a marker if it is.
SHADOW = """import pathlib
pathlib.Path({marker!r}).write_text("imported")

def agent():
    return None
"""

#: Refs a hostile queue writer submits, and what the reason a worker parks each with says.
REFUSED = {
    "os:abort": "not among the agents this worker trusts",
    "os:fork": "not among the agents this worker trusts",
    "evil:agent": "not among the agents this worker trusts",  # a module in the worker's cwd
    "local:agent": "cannot import module 'local'",  # trusted, but only in the worker's cwd
    "tests.fleet_agents:os.abort": "not an Agent",  # a trusted module's attribute
    "tests.fleet_agents:os.fork": "not an Agent",
    "tests.fleet_agents:explode": "not an Agent",  # a Tool
    "tests.fleet_agents:_write_line": "private",
    "tests.fleet_agents:counter()": "not MODULE:OBJECT",
}


def _queue_raw(url: str, run_id: str, agent: str, task: str = "t") -> None:
    """Submit as anyone who can write to the queue can: straight into the table."""
    with open_store(url) as store:
        queue_of(store).submit(run_id, agent, task)


def test_a_worker_runs_only_the_agents_it_trusts_and_parks_the_rest_at_once(
        fleet: Fleet) -> None:
    cwd = fleet.tmp / "cwd"
    cwd.mkdir()
    marker = fleet.tmp / "imported"
    for name in ("evil", "local"):
        (cwd / f"{name}.py").write_text(SHADOW.format(marker=str(marker)))
    refused = {f"bad{i}": ref for i, ref in enumerate(REFUSED)}
    for run_id, ref in refused.items():
        _queue_raw(fleet.url, run_id, ref)
    proc = fleet.worker("--ttl", "300", agents="tests.fleet_agents,local", cwd=cwd)
    fleet.until("every refused run parked", lambda: all(
        fleet.runs()[r].state == "parked" for r in refused))
    assert proc.poll() is None, fleet.logs()  # not killed, not forked away
    _submit(fleet.url, "counter", "after them", "good")
    fleet.until("a trusted run done", lambda: fleet.runs()["good"].state == "done")
    assert fleet.effects() == {("good", "a"): 1, ("good", "b"): 1}
    assert fleet.stop(proc) == 0, fleet.logs()
    assert not marker.exists()  # nothing from the worker's cwd was imported
    runs = fleet.runs()
    for run_id, ref in refused.items():
        row = runs[run_id]
        # Parked on its first claim, with no crash counted (a TTL of 300 s: a crash
        # would have left it running).
        assert (row.claims, row.crashes, row.runnable) == (1, 0, False), (ref, row)
        assert row.reason is not None and REFUSED[ref] in row.reason, (ref, row.reason)
        with open_store(fleet.url) as store:
            assert store.last_seq(run_id) == 0  # nothing was run
    summary = json.loads(fleet.cli("queue", "--json").stdout)
    assert {p["run_id"]: p["reason"] for p in summary["poison"]} == {
        r: runs[r].reason for r in refused}
    shown = fleet.cli("queue")
    assert shown.returncode == 0 and "not among the agents this worker trusts" in shown.stdout
    # `show` of a refused run (it has no log to escalate in) says why it was parked.
    run_id, ref = next(iter(refused.items()))
    shown = fleet.cli("show", run_id)
    assert shown.returncode == 0 and "parked" in shown.stdout, shown
    assert REFUSED[ref] in shown.stdout, shown.stdout
    place = json.loads(fleet.cli("show", run_id, "--json").stdout)["queue"]
    assert REFUSED[ref] in place["reason"]


def test_a_worker_must_be_told_which_agents_it_trusts(fleet: Fleet) -> None:
    untold = subprocess.run([sys.executable, "-m", "agentjournal", "worker", "--store",
                             fleet.url], cwd=ROOT, env=fleet.env, capture_output=True,
                            text=True, timeout=60)
    assert untold.returncode == 1 and "Missing option '--agents'" in untold.stderr
    for bad in ("", "os:", "a..b", "tests.fleet_agents:", "a,,b"):
        told = fleet.cli("worker", "--agents", bad)
        assert told.returncode == 1 and "--agents" in told.stderr, (bad, told.stderr)
    submitted = fleet.cli("submit", "--agent", "m:a()", "--task", "t")
    assert submitted.returncode == 2 and "MODULE:OBJECT" in submitted.stderr


def test_a_parked_run_with_a_log_is_escalated_with_the_reason(fleet: Fleet) -> None:
    """A run started by a trusted agent whose ref stops being trusted (a worker of a
    narrower fleet claims it) is escalated in its log too, where `show` finds it."""
    _submit(fleet.url, "needs_approval", "ask first", "ask")
    first = fleet.worker()
    fleet.until("the run to wait", lambda: fleet.runs()["ask"].state == "waiting")
    assert fleet.stop(first) == 0
    assert fleet.cli("requeue", "ask").returncode == 0
    narrow = fleet.worker(agents="tests.other_agents")
    fleet.until("the run parked", lambda: fleet.runs()["ask"].state == "parked")
    assert fleet.stop(narrow) == 0
    with open_store(fleet.url) as store:
        last = list(store.read("ask"))[-1]
    assert last.type is EventType.RUN_ESCALATED
    assert "not among the agents this worker trusts" in last.payload["reason"]
    shown = fleet.cli("show", "ask")
    assert "run_escalated       refused by a worker" in shown.stdout, shown.stdout


# --- the worker's log (issue 26, item 7) ----------------------------------------------

LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR) ")


def test_the_worker_logs_timestamped_levelled_lines_escapes_visible_one_per_error(
        fleet: Fleet) -> None:
    _queue_raw(fleet.url, "red", "tests.fleet_agents:\x1b[31mred")
    _queue_raw(fleet.url, "broken", "tests.fleet_agents:broken")
    proc = fleet.worker("--ttl", "1")
    fleet.until("the crash logged", lambda: "crashed" in fleet.procs[-1][1].read_text())
    fleet.until("the bad ref parked", lambda: fleet.runs()["red"].state == "parked")
    assert fleet.stop(proc) == 0
    raw = fleet.procs[-1][1].read_bytes()
    assert b"\x1b" not in raw  # no terminal escape reaches the log ...
    text = raw.decode()
    assert "\\x1b[31mred" in text  # ... it is shown
    lines = text.splitlines()
    assert lines and all(LINE.match(line) for line in lines), text
    assert "Traceback" not in text
    (crash,) = [line for line in lines if "crashed" in line]
    assert " ERROR " in crash and "RuntimeError: the factory is broken" in crash
    (parked,) = [line for line in lines if "parked red" in line]
    assert "not MODULE:OBJECT" in parked
    # --verbose adds the traceback, at debug level (the lease lapsed: it crashes again).
    verbose = fleet.worker("--ttl", "1", "--verbose")
    fleet.until("the traceback", lambda: "Traceback" in fleet.procs[-1][1].read_text())
    assert fleet.stop(verbose) == 0
    assert re.search(r" DEBUG .*\nTraceback", fleet.procs[-1][1].read_text())


def test_a_claimed_run_s_lease_is_kept_until_its_journal_opens_and_never_after_hand_back(
        url: str) -> None:
    """A worker claims many runs at once and renews the leases of those whose journal is
    not open yet; a run it let go (opened, or handed back) it renews no more, so a lease
    released by a hand-back stays free for a person's decision."""
    from agentjournal.errors import LeaseHeldError
    from agentjournal.fleet.worker import Worker

    worker = Worker(url, agents=["tests.fleet_agents"], ttl=30.0)
    store = worker._run_store()
    for run_id in ("a", "b"):
        submit(store, "tests.fleet_agents:counter", "count", run_id)
    claims = queue_of(store).claim_many(worker.worker_id, 0.5, ["default"], 5)
    assert [c.lease.run_id for c in claims] == ["a", "b"]  # one claim for both
    worker._unopened.update((c.lease.run_id, c.lease) for c in claims)
    worker._renew_unopened()  # renewed for the worker's TTL, not the claim's 0.5 s
    for claim in claims:
        with pytest.raises(LeaseHeldError) as held:
            store.acquire(claim.lease.run_id, "decision:ana", 30.0)
        assert held.value.expires_in > 1.0
    first = claims[0].lease
    worker._stop_renewing(first.run_id)
    assert queue_of(store).hand_back(first, "waiting", 0)
    worker._renew_unopened()  # renews "b" only
    store.release(store.acquire(first.run_id, "decision:ana", 30.0))  # free at once
    with pytest.raises(LeaseHeldError):
        store.acquire("b", "decision:ana", 30.0)
    worker._reopen_control()  # closes the handle


def test_runs_claimed_and_let_go_between_beats_renew_no_lease(
        url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker renews every lease it holds once a third of a TTL (here 10 s); a run it
    claims or lets go in between only has its row written again, keeping the time of
    the last renewal (a takeover is timed from it). Six runs claimed and finished: one
    beat, and a row that lists none of them once they are done."""

    from agentjournal import journal as journal_module
    from agentjournal.fleet.worker import Worker

    monkeypatch.setenv(ENV, str(tmp_path / "effects.txt"))
    beats: list[float] = []
    real = journal_module.Heartbeat.beat_now

    def counted(self: Any) -> None:
        beats.append(time.time())
        real(self)

    monkeypatch.setattr(journal_module.Heartbeat, "beat_now", counted)
    worker = Worker(url, agents=["tests.fleet_agents"], ttl=30.0, poll=0.05)
    with open_store(url) as store:
        for i in range(6):
            submit(store, "tests.fleet_agents:counter", "count", f"r{i}")

    rows: list[Any] = []

    def settled(queue: Any) -> bool:
        rows[:] = queue.workers()
        return ({r.state for r in queue.runs()} == {"done"} and len(rows) == 1
                and rows[0].runs == [])

    drive_until(worker, url, settled)
    (row,) = rows
    assert len(beats) == 1, beats
    assert beats[0] <= row.heartbeat_at == worker._renewed_at


def test_a_takeover_of_many_runs_wakes_the_runs_loop_once_to_start_them(
        url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs claimed together become tasks on the worker's loop in one call there (a
    takeover of hundreds made one wake-up of the loop each)."""
    from agentjournal.fleet.worker import Worker

    monkeypatch.setenv(ENV, str(tmp_path / "effects.txt"))
    spawned: list[int] = []
    real = Worker._spawn

    def counted(self: Any, claims: Any, held: Any) -> None:
        spawned.append(len(claims))
        real(self, claims, held)

    monkeypatch.setattr(Worker, "_spawn", counted)
    with open_store(url) as store:
        for i in range(6):
            submit(store, "tests.fleet_agents:counter", "count", f"r{i}")
    worker = Worker(url, agents=["tests.fleet_agents"], concurrency=10, poll=0.05,
                    on_loop=True)
    drive_until(worker, url, lambda q: [r.state for r in q.runs()] == ["done"] * 6)
    assert spawned == [6]


#: The release before this one, as far as reading goes: it knows event schema v7 only.
OLDER_RELEASE = """
import agentjournal.events, agentjournal.store.base, agentjournal.snapshots
for module in (agentjournal.events, agentjournal.store.base, agentjournal.snapshots):
    module.SCHEMA_VERSION = 7
"""


def test_a_worker_of_an_older_release_hands_back_a_run_it_cannot_read_and_drains(
        fleet: Fleet, tmp_path: Path) -> None:
    """A rollout: the run holds records of this release (schema v8) and a worker of the
    release before claims it. Counting that as a crash would park a sound run as poison
    after three such claims: the worker hands it back queued, uncounted, and drains,
    saying to upgrade it. A worker of this release finishes the run, its effect once."""
    _submit(fleet.url, "needs_approval", "ask first", "ask")
    current = fleet.worker()
    fleet.until("the run to wait", lambda: fleet.runs()["ask"].state == "waiting")
    assert fleet.stop(current) == 0
    with open_store(fleet.url) as store:
        (approval,) = load_state(store, "ask").state.approvals
    assert fleet.cli("approve", "ask", approval, "--by", "ana").returncode == 0
    older = tmp_path / "older"
    older.mkdir()
    (older / "sitecustomize.py").write_text(OLDER_RELEASE)
    path = fleet.env.get("PYTHONPATH")
    fleet.env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(older), path]))
    old = fleet.worker()
    assert old.wait(timeout=120) == 0, fleet.logs()  # drained: it ends by itself
    fleet.env.pop("PYTHONPATH") if path is None else fleet.env.update(PYTHONPATH=path)
    run = fleet.runs()["ask"]
    assert (run.state, run.crashes, fleet.effects()) == ("queued", 0, {}), fleet.logs()
    assert "records of a later agentjournal release" in fleet.logs()
    current = fleet.worker()
    fleet.until("the run to finish", lambda: fleet.runs()["ask"].state == "done")
    assert fleet.effects() == {("ask", "approved"): 1}
    assert fleet.stop(current) == 0
