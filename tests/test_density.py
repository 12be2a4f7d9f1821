"""Many runs on one event loop: appends never block it, and concurrent runs' appends are
committed together, each checked on its own (issue 31)."""

from __future__ import annotations

import asyncio
import functools
import random
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from agentjournal import Agent, open_store
from agentjournal.bench.density import density_agent, run_many
from agentjournal.errors import ConflictError, FencedError, ScopeSharedError
from agentjournal.events import Event, EventType, make_events
from agentjournal.models import ScriptedModel, calls
from agentjournal.tools import tool

from .builders import Crash, in_one_group
from .conftest import backend_params

RUNS = 300
#: The store's calls that wait on the disk, the server or a lock.
STORE_IO = ("append", "read", "last_seq", "acquire", "renew", "renew_all", "release",
            "holder", "put_snapshot", "snapshots", "segments", "put_segments",
            "prune_segments", "segment_digests", "scope_runs", "tombstone", "outlines",
            "prefetch")


def record_threads(store: Any) -> list[tuple[str, str]]:
    """Record (method, thread name) of every call of STORE_IO on ``store`` from now on,
    each still made on the store itself."""
    seen: list[tuple[str, str]] = []
    for name in STORE_IO:
        real = getattr(store, name, None)
        if real is None:
            continue

        def recorded(*args: Any, _real: Any = real, _name: str = name, **kwargs: Any) -> Any:
            seen.append((_name, threading.current_thread().name))
            return _real(*args, **kwargs)

        setattr(store, name, recorded)
    return seen


@backend_params()
def test_arun_never_blocks_the_loop_while_300_runs_append(
        store_url: str, request: pytest.FixtureRequest) -> None:
    """No store call that waits (on a sync, the server, a lock) is made on the event
    loop's thread while 300 runs append at once: each goes to a worker thread, so the
    loop serves every run meanwhile. (How late the loop wakes is a timing, measured by
    the bench's density section, never asserted here.)"""
    # JSONL has a file per run, each synced on its own (no group to join): 100 runs in
    # CI, 300 with --slow, to keep the suite's time.
    runs = 100 if store_url.startswith("jsonl") and not request.config.getoption("--slow") \
        else RUNS
    store = open_store(store_url)
    seen = record_threads(store)
    loop_thread: list[str] = []

    async def note_the_loop() -> None:
        loop_thread.append(threading.current_thread().name)

    try:
        # A short model wait, so the runs' answers come together and their appends meet.
        statuses = asyncio.run(run_many(density_agent(0.02, 2), store, runs, "probe",
                                        note_the_loop))
        made = list(seen)  # (the checks below read on this thread, the loop gone)
        assert statuses == ["finished"] * runs
        logs = store.list_runs(limit=None)
        assert len(logs) == runs
        # Every run: started + task, (turn, start, completion), final turn + finished.
        assert {len(list(store.read(r.run_id))) for r in logs[:20]} == {7}
    finally:
        store.close()
    appends = [call for call in made if call[0] == "append"]
    assert len(appends) >= runs * 3  # (each run appends at its start, turns and end)
    on_the_loop = sorted({name for name, thread in made if thread == loop_thread[0]})
    assert on_the_loop == [], f"called on the event loop's thread: {on_the_loop}"


def test_a_worker_taking_runs_over_records_each_resumed_before_any_goes_on(
        tmp_path: Path) -> None:
    """300 runs each left a read-only call uncertain (the process died in it); resumed
    at once on one loop, each records its resume (the successor's first event) before
    runs go on to settle their calls: a resumed run goes to the back once open."""
    store = open_store(f"sqlite:///{tmp_path / 'runs.db'}")
    runs = [f"r{i:03d}" for i in range(300)]

    @tool(effect="read_only")
    def lookup(order: str) -> dict[str, str]:
        """Look an order up."""
        raise Crash

    model = ScriptedModel([calls(("lookup", {"order": "ord-1"}))])
    for run_id in runs:
        with pytest.raises(Crash):
            Agent(model, [lookup]).run(store, run_id, "reconcile")

    async def resume_all() -> list[str]:
        agent = density_agent(0.0, 2)
        results = await asyncio.gather(*(agent.arun(store, r) for r in runs))
        return [r.status for r in results]

    assert asyncio.run(resume_all()) == ["finished"] * len(runs)
    logs = {r: list(store.read(r)) for r in runs}
    store.close()
    resumed = {r: next(e for e in log if e.type is EventType.RUN_RESUMED)
               for r, log in logs.items()}
    last_resumed = max(e.ts for e in resumed.values())
    went_on_early = [r for r, log in logs.items() if log[resumed[r].seq].ts < last_resumed]
    assert logs[runs[0]][resumed[runs[0]].seq].type is EventType.TOOL_CALL_RECONCILED
    # Without it, all but the first stepper threads' worth go on before the last opens.
    assert len(went_on_early) < len(runs) // 2, len(went_on_early)


# --- group commit across runs: each batch checked on its own ------------------------------

grouping_backends = pytest.mark.parametrize("store_url", ["sqlite", "postgres"], indirect=True)


def _message(run_id: str, after: int, epoch: int = 0) -> list[Event]:
    kind = EventType.RUN_STARTED if after == 0 else EventType.USER_MESSAGE
    payload = {"task": "t"} if after == 0 else {"content": f"m{after}"}
    return make_events(run_id, after, epoch, [(kind, payload)])


@grouping_backends
def test_a_conflicting_fenced_or_shared_batch_in_a_group_fails_alone(
        store_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A commit is held while eight appends queue behind it, so they form one group: five
    good ones (each on condition that its run is alone in its scope, as it is), one
    whose run moved on (another handle appended: a conflict), one whose run another
    worker took over (fenced) and one made alone in a scope another run shares. The
    five commit, in one transaction; the three fail with their own errors and leave
    their logs as they were."""
    store, other = open_store(store_url), open_store(store_url)
    runs = [f"g{i}" for i in range(8)]
    for run_id in ["first", *runs]:  # one event each: every append after is a warm one
        store.append(run_id, _message(run_id, 0), expected_seq=0, epoch=0)
    other.append("g5", _message("g5", 1), expected_seq=1, epoch=0)  # g5 moves on elsewhere
    other.acquire("g6", "another-worker", ttl=60)  # g6 is fenced: its epoch is now 1
    other.append("g7-peer", _message("g7-peer", 0), expected_seq=0, epoch=0)
    shared = {"g7": "run:g7-peer"}  # g7 appends alone in g7-peer's scope

    def append(run_id: str) -> Any:
        return store.append(run_id, _message(run_id, 1), expected_seq=1, epoch=0,
                            alone_in=shared.get(run_id, f"run:{run_id}"))

    outcome, commits = in_one_group(
        store, store._grouper,  # type: ignore[attr-defined]
        [(run_id, functools.partial(append, run_id)) for run_id in ["first", *runs]],
        monkeypatch)
    assert commits == 2, commits  # the held one, then the group's one transaction
    assert all(outcome[f"g{i}"] == 2 for i in range(5)) and outcome["first"] == 2
    assert isinstance(outcome["g5"], ConflictError)
    assert isinstance(outcome["g6"], FencedError)
    assert isinstance(outcome["g7"], ScopeSharedError)
    reader = open_store(store_url)
    for i in range(5):
        assert [e.payload.get("content") for e in reader.read(f"g{i}")] == [None, "m1"]
    assert [e.seq for e in reader.read("g5")] == [1, 2]  # only the other handle's event
    assert [e.payload.get("content") for e in reader.read("g5")] == [None, "m1"]
    assert [e.seq for e in reader.read("g6")] == [1] == [e.seq for e in reader.read("g7")]
    for s in (store, other, reader):
        s.close()


@grouping_backends
def test_two_batches_of_one_run_in_a_group_one_is_claimed(
        store_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two appends of one run at one expected seq meet in a group (two journals of it in
    one process, one of them stale): one is claimed, with its events alone; the other
    is refused as a conflict; their neighbour commits."""
    store = open_store(store_url)
    for run_id in ("first", "twice", "beside"):
        store.append(run_id, _message(run_id, 0), expected_seq=0, epoch=0)

    def append(run_id: str, content: str) -> Any:
        events = make_events(run_id, 1, 0, [(EventType.USER_MESSAGE, {"content": content})])
        return store.append(run_id, events, expected_seq=1, epoch=0)

    outcome, _ = in_one_group(store, store._grouper, [  # type: ignore[attr-defined]
        ("first", functools.partial(append, "first", "f")),
        ("a", functools.partial(append, "twice", "a")),
        ("beside", functools.partial(append, "beside", "n")),
        ("b", functools.partial(append, "twice", "b"))], monkeypatch)
    assert outcome["first"] == 2 == outcome["beside"]
    (won,) = [label for label in "ab" if outcome[label] == 2]
    (lost,) = set("ab") - {won}
    assert isinstance(outcome[lost], ConflictError), outcome
    assert [e.payload.get("content") for e in store.read("twice")] == [None, won]
    assert [e.payload.get("content") for e in store.read("beside")] == [None, "n"]
    store.close()


_ACKING_WRITERS = """
import sys, threading
from agentjournal import EventType, make_events, open_store

store = open_store(sys.argv[1])
out = threading.Lock()

def writer(n):
    run_id, last = f"r{n}", 0
    while True:
        kind, payload = ((EventType.RUN_STARTED, {"task": "t"}) if last == 0
                         else (EventType.USER_MESSAGE, {"content": f"m{last}"}))
        last = store.append(run_id, make_events(run_id, last, 0, [(kind, payload)]),
                            expected_seq=last, epoch=0)
        with out:  # acknowledged: say so only now
            sys.stdout.write(f"{run_id} {last}\\n")
            sys.stdout.flush()

for n in range(16):
    threading.Thread(target=writer, args=(n,), daemon=True).start()
threading.Event().wait()
"""


@pytest.mark.parametrize("store_url", ["postgres", "postgres+grouped"], indirect=True)
def test_every_acknowledged_append_survives_a_kill_mid_group_on_postgres(
        store_url: str) -> None:
    """SIGKILL a process whose 16 threads append to PostgreSQL as fast as group commit
    lets them, each printing an append only once acknowledged: every printed append is
    in the store afterwards, each log whole. (SQLite's: tests/test_sqlite_specific.py,
    with the simulated power cut.)"""
    open_store(store_url).close()
    child = subprocess.Popen([sys.executable, "-c", _ACKING_WRITERS, store_url],
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    acked: dict[str, int] = {}
    for line in child.stdout:
        run_id, seq = line.split()
        acked[run_id] = int(seq)
        if sum(acked.values()) >= random.randint(600, 1200):
            break
    child.kill()  # mid-group: some appends are in a commit that has not returned
    child.wait()
    store = open_store(store_url)
    for run_id, seq in acked.items():
        assert store.last_seq(run_id) >= seq, run_id
        assert [e.seq for e in store.read(run_id)] == list(range(1, store.last_seq(run_id) + 1))
    store.close()


def test_the_density_bench_measures_ours_beside_langgraph(tmp_path: Path) -> None:
    """`agentjournal bench --density` at its smallest: each backend's wall over the ideal,
    events/s and memory per run; on PostgreSQL the commits per step the server counted;
    LangGraph's async savers beside (what each measured, never how fast)."""
    from agentjournal.bench._common import SMOKE
    from agentjournal.bench.command import run_bench

    from .conftest import POSTGRES_URL, postgres_reason

    postgres = None if postgres_reason() else POSTGRES_URL
    figures = {f.name: f for f in run_bench(quick=True, postgres_url=postgres,
                                             workdir=tmp_path, plan=SMOKE, density=True,
                                             only=["density"], progress=lambda _: None)}
    backends = ["sqlite", *(["postgres"] if postgres else [])]
    for backend in backends:
        name = f"density.{backend}.20"
        assert figures[f"{name}.wall"].value >= 1.0  # never faster than its model waits
        assert figures[f"{name}.events_per_s"].value > 0
        assert figures[f"{name}.rss_per_run"].value is not None
        assert figures[f"{name}.cpu_per_step"].value > 0
        theirs = figures[f"{name}.langgraph.wall"]
        assert theirs.value >= 1.0 and theirs.floor == figures[f"{name}.wall"].value
        cpu = figures[f"{name}.langgraph.cpu_per_step"]
        assert cpu.value > 0 and cpu.floor == figures[f"{name}.cpu_per_step"].value
    if postgres:
        ours = figures["density.postgres.20.commits_per_step"].value
        # At least the steps' own appends grouped: a step is two appends, made durable
        # by no more than a handful of commits; and every commit was counted.
        assert 0 < ours < 10
        assert figures["density.postgres.20.langgraph.commits_per_step"].value > 0


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
def test_claim_many_takes_several_runs_in_one_statement_most_urgent_first(
        store_url: str) -> None:
    from agentjournal.fleet import queue_of, submit

    with open_store(store_url) as store:
        for i in range(5):
            submit(store, "m:agent", f"t{i}", f"q{i}", priority=1 if i == 3 else 0)
        queue = queue_of(store)
        claims = queue.claim_many("w", 30, ["default"], 3)  # type: ignore[attr-defined]
        assert [c.lease.run_id for c in claims] == ["q3", "q0", "q1"]
        assert all(c.lease.epoch == 1 and c.lease.owner == "w" for c in claims)
        rest = queue.claim_many("w2", 30, ["default"], 10)  # type: ignore[attr-defined]
        assert [c.lease.run_id for c in rest] == ["q2", "q4"]
        assert {r.run_id: r.state for r in queue.runs()} == dict.fromkeys(
            ["q0", "q1", "q2", "q3", "q4"], "running")
