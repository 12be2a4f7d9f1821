"""Retention: gc archives exactly the runs it may, restore brings them back byte for byte,
and a gc killed with SIGKILL at any moment loses no run. Every backend.

The runs are written event by event with chosen timestamps (their ages); which runs
may leave the hot store is worked out here from how each was built, not asked of gc.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
import pytest

from agentjournal import EventType, RetentionPolicy, gc, make_events, open_store, restore, snapshots
from agentjournal.archive import ArchiveError
from agentjournal.errors import ArchivedRunError, NotArchivedError
from agentjournal.snapshots import load_state, named_segments, write_snapshot
from agentjournal.state import durable_fields, fold
from agentjournal.store import Store

from .conftest import backend_params

E = EventType
ROOT = Path(__file__).resolve().parent.parent
NOW = datetime.now(UTC).replace(microsecond=0)
OLD, YOUNG = timedelta(days=40), timedelta(days=3)
Facts = list[tuple[EventType, dict[str, Any]]]


def _start(key: str, **extra: Any) -> tuple[EventType, dict[str, Any]]:
    return (E.TOOL_CALL_STARTED, {"key": key, "tool": "post", "args": {"n": 1}, "call_id": key,
                                  "effect": "irreversible", "attempt": 1, **extra})


def _done(seq: int, key: str) -> tuple[EventType, dict[str, Any]]:
    return (E.TOOL_CALL_COMPLETED, {"started_seq": seq, "idempotency_key": key, "tool": "post",
                                    "call_id": key, "result": {"ok": True}})


FINISHED: tuple[EventType, dict[str, Any]] = (E.RUN_FINISHED, {"outcome": "done"})

# kind -> (the facts after run_started, whether gc may archive it when old)
KINDS: dict[str, tuple[Facts, bool]] = {
    "finished": ([_start("k"), _done(2, "k"), FINISHED], True),
    "cancelled": ([_start("k"), _done(2, "k"), (E.RUN_CANCELLED, {"by": "ops", "reason": "x"})],
                  True),
    "compensated": ([_start("k"), _done(2, "k"), FINISHED,
                     (E.SAGA_STARTED, {"by": "ops", "reason": "undo", "plan": []}),
                     (E.SAGA_FINISHED, {})], True),
    "running": ([_start("k"), _done(2, "k")], False),
    "uncertain": ([_start("k"), FINISHED], False),
    "approval": ([(E.APPROVAL_REQUESTED, {"approval_id": "a1", "key": "k", "tool": "post",
                                          "args": {}}), FINISHED], False),
    "escalated": ([_start("k"), _done(2, "k"), (E.RUN_ESCALATED, {"reason": "look"})], False),
    "saga": ([_start("k"), _done(2, "k"), FINISHED,
              (E.SAGA_STARTED, {"by": "ops", "reason": "undo", "plan": []})], False),
    # The receiver keeps keys 60 days: 40 days on, one may still be remembered.
    "retained": ([_start("k", key_retention=60 * 86400.0), _done(2, "k"), FINISHED], False),
}


def write_run(store: Store, run_id: str, facts: Facts, age: timedelta,
              scope: str | None = None) -> None:
    started = {"task": "t", **({"scope": scope} if scope else {})}
    events = make_events(run_id, 0, 0, [(E.RUN_STARTED, started), *facts])
    at = NOW - age - timedelta(seconds=len(events))
    events = [msgspec.structs.replace(e, ts=at + timedelta(seconds=i))
              for i, e in enumerate(events)]
    store.append(run_id, events, expected_seq=0, epoch=0)


def populate(store: Store, count: int, rng: random.Random) -> set[str]:
    """``count`` runs of every kind and of two ages; the ids gc may archive."""
    eligible: set[str] = set()
    kinds = sorted(KINDS)
    for i in range(count):
        kind, old = kinds[i % len(kinds)], rng.random() < 0.7
        facts, archivable = KINDS[kind]
        run_id = f"{kind}-{i:03d}"
        write_run(store, run_id, facts, OLD if old else YOUNG)
        if old and archivable:
            eligible.add(run_id)
    # A finished old run whose fork is still running: neither leaves (one scope). And one
    # whose fork finished only days ago ("a-" sorts first: gc meets the young run first).
    write_run(store, "origin", KINDS["finished"][0], OLD, scope="run:origin")
    write_run(store, "fork", KINDS["running"][0], OLD, scope="run:origin")
    write_run(store, "z-origin", KINDS["finished"][0], OLD, scope="run:z-origin")
    write_run(store, "a-fork", KINDS["finished"][0], YOUNG, scope="run:z-origin")
    store.put_snapshot(snapshot_of(store, sorted(eligible)[0]))
    return eligible


def snapshot_of(store: Store, run_id: str) -> Any:
    from agentjournal.snapshots import take

    return take(fold(store.read(run_id)))


def archived_records(archive: Path, run_id: str) -> list[bytes] | None:
    """The records in the run's archive file, read here (not by agentjournal), or None."""
    path = archive / f"{run_id}.jsonl.gz"
    if not path.exists():
        return None
    lines = gzip.decompress(path.read_bytes()).split(b"\n")
    header = json.loads(lines[0])
    assert header["run_id"] == run_id and header["events"] == len(lines) - 2
    return lines[1:-1]


def policy(archive: Path) -> RetentionPolicy:
    return RetentionPolicy(finished_older_than=timedelta(days=30),
                           archive=f"file://{archive}")


@backend_params()
def test_gc_archives_only_what_may_leave_and_restore_gives_the_same_bytes(
        store_url: str, tmp_path: Path) -> None:
    archive = tmp_path / "archive"
    with open_store(store_url) as store:
        eligible = populate(store, 200, random.Random(7))
        before = {r.run_id: store.records(r.run_id) for r in store.list_runs()}
        folds = {r: durable_fields(fold(store.read(r))) for r in before}

        dry = gc(store, policy(archive), dry_run=True, at=NOW)
        assert {v.run_id for v in dry.verdicts if v.action == "archive"} == eligible
        assert not archive.exists() and store.tombstones() == []

        report = gc(store, policy(archive), at=NOW)
        archived = {v.run_id for v in report.verdicts if v.action == "archive"}
        assert archived == eligible and report.archived == len(eligible)
        assert report.kept == len(before) - len(eligible)
        assert report.events_archived == sum(len(before[r]) for r in eligible)
        assert report.bytes_freed >= sum(len(b) for r in eligible for b in before[r])
        kept = {v.run_id: v.reason for v in report.verdicts if v.action == "keep"}
        assert "fork" in kept["origin"] and "not finished" in kept["fork"]
        assert "a-fork" in kept["z-origin"] and "3.0d ago" in kept["a-fork"]
        assert len(report.verdicts) == len(before)  # each run once
        why = {"uncertain": "uncertain call", "approval": "approval(s) pending",
               "escalated": "status escalated", "saga": "status compensating",
               "retained": "keeps its keys", "running": "status running"}
        for kind, phrase in why.items():  # each old run of a kind, for its own reason
            assert any(phrase in kept[r] for r in kept if r.startswith(kind)), kind

        assert {r.run_id for r in store.list_runs()} == set(before) - eligible
        for run_id in before:
            if run_id in eligible:
                assert archived_records(archive, run_id) == before[run_id]
                assert store.tombstone(run_id) is not None and store.records(run_id) == []
            else:
                assert store.records(run_id) == before[run_id]
                assert archived_records(archive, run_id) is None
        assert gc(store, policy(archive), at=NOW).archived == 0  # nothing more to do

        for run_id in sorted(eligible):
            assert restore(store, run_id, f"file://{archive}").events == len(before[run_id])
            assert store.records(run_id) == before[run_id]
            assert durable_fields(fold(store.read(run_id))) == folds[run_id]
        assert store.tombstones() == []


def test_restore_refuses_what_gc_did_not_delete(tmp_path: Path) -> None:
    archive, url = tmp_path / "archive", f"sqlite:///{tmp_path / 'j.db'}"
    with open_store(url) as store:
        write_run(store, "a", KINDS["finished"][0], OLD)
        write_run(store, "b", KINDS["finished"][0], OLD)
        gc(store, policy(archive), at=NOW)
        with pytest.raises(ArchivedRunError, match="agentjournal restore a"):
            write_run(store, "a", KINDS["finished"][0], OLD)  # the id is not reused
        with pytest.raises(NotArchivedError, match="not archived from this store"):
            restore(open_store(f"sqlite:///{tmp_path / 'other.db'}"), "a", f"file://{archive}")
        with pytest.raises(ArchiveError, match="holds no"):
            restore(store, "zzz", f"file://{archive}")
        # An archive file that was changed is refused, and the tombstone stays.
        path = archive / "a.jsonl.gz"
        lines = gzip.decompress(path.read_bytes()).split(b"\n")
        lines[-2] = lines[-2].replace(b'"done"', b'"DONE"')
        path.write_bytes(gzip.compress(b"\n".join(lines)))
        with pytest.raises(ArchiveError, match="digest"):
            restore(store, "a", f"file://{archive}")
        assert store.tombstone("a") is not None and store.records("a") == []
        # An archive of another version of the run (same id, other bytes) is refused too.
        (archive / "b.jsonl.gz").rename(path)
        with pytest.raises(ArchiveError, match="holds run 'b'"):
            restore(store, "a", f"file://{archive}")


def test_keep_snapshots_prunes_runs_left_in_the_store(tmp_path: Path) -> None:
    with open_store(f"jsonl:///{tmp_path / 'runs'}") as store:
        write_run(store, "live", KINDS["running"][0], YOUNG)
        for _ in range(2):
            append_note(store, "live")
            store.put_snapshot(snapshot_of(store, "live"), keep=2)
        assert len(store.snapshots("live")) == 2
        report = gc(store, RetentionPolicy(keep_snapshots=1), at=NOW)
        assert report.snapshots_pruned == 1 and report.bytes_freed > 0
        assert [s.seq for s in store.snapshots("live")] == [store.last_seq("live")]
        store.quarantine(store.snapshots("live")[0].fold_version, "verify found it wrong")
        report = gc(store, RetentionPolicy(keep_snapshots=1), at=NOW)
        assert report.snapshots_pruned == 1 and store.snapshots("live") == []


def append_note(store: Store, run_id: str) -> None:
    last = store.last_seq(run_id)
    store.append(run_id, make_events(run_id, last, 0, [(E.USER_MESSAGE, {"content": "more"})]),
                 expected_seq=last, epoch=0)


def test_jsonl_a_crash_mid_delete_or_mid_restore_leaves_one_place(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tombstone is the commit point on JSONL: a log left beside it is already
    deleted (and removed by the next handle to touch the run)."""
    from agentjournal.store.jsonl import JsonlStore

    directory, archive = tmp_path / "runs", tmp_path / "archive"
    with open_store(f"jsonl:///{directory}") as store:
        write_run(store, "a", KINDS["finished"][0], OLD)
        records = store.records("a")
    with monkeypatch.context() as m:  # die right after publishing the tombstone
        m.setattr(JsonlStore, "_drop_log", lambda self, run_id: (_ for _ in ()).throw(
            KeyboardInterrupt()))
        with open_store(f"jsonl:///{directory}") as store, pytest.raises(KeyboardInterrupt):
            gc(store, policy(archive), at=NOW)
    assert (directory / "a.tomb").exists() and (directory / "a.jsonl").exists()
    with open_store(f"jsonl:///{directory}") as store:
        assert store.records("a") == [] and store.list_runs() == []
        assert not (directory / "a.jsonl").exists()  # finished by the next touch
        with monkeypatch.context() as m:  # die after writing the log, before the lift
            real_publish = JsonlStore._publish

            def publish_then_die(self: JsonlStore, path: Path, data: bytes,
                                 run_id: str | None) -> None:
                real_publish(self, path, data, run_id)
                if path.suffix == ".jsonl":
                    raise KeyboardInterrupt
            m.setattr(JsonlStore, "_publish", publish_then_die)
            with pytest.raises(KeyboardInterrupt):
                restore(store, "a", f"file://{archive}")
    with open_store(f"jsonl:///{directory}") as store:
        assert store.tombstone("a") is not None and store.records("a") == []
        restore(store, "a", f"file://{archive}")
        assert store.records("a") == records


# --- SIGKILL at random points of a gc -------------------------------------------------


def gc_process(store_url: str, archive: Path, fault: str = "") -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "agentjournal", "gc", "--finished-older-than", "30d",
         "--archive", f"file://{archive}", "--store", store_url, "--json"],
        cwd=ROOT, env={**os.environ, "AGENTJOURNAL_FAULT": fault},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def kill_when(proc: subprocess.Popen[bytes], ready: Callable[[], bool], rng: random.Random
              ) -> bool:
    """SIGKILL ``proc`` a random moment after ``ready()``; False if it finished first."""
    deadline = time.monotonic() + 60
    while not ready() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    time.sleep(rng.uniform(0, 0.01))
    if proc.poll() is not None:
        return False
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    return True


def every_run_in_one_place(store_url: str, archive: Path,
                           before: dict[str, list[bytes]]) -> None:
    """Each run is in the hot store, whole and untombstoned; or tombstoned, gone from the
    hot store, with an archive file holding its very bytes."""
    with open_store(store_url) as store:
        stones = {t.run_id: t for t in store.tombstones()}  # one query, not one per run
        for run_id, records in before.items():
            stone = stones.get(run_id)
            if stone is None:
                assert store.records(run_id) == records, run_id
            else:
                assert store.records(run_id) == [] and stone.last_seq == len(records)
                assert archived_records(archive, run_id) == records, run_id


@backend_params()
def test_gc_killed_at_random_moments_loses_no_run(store_url: str, tmp_path: Path,
                                                  request: pytest.FixtureRequest) -> None:
    # Random kills that land, per backend (besides the two chosen windows): 20 with --slow.
    slow = request.config.getoption("--slow")
    kills = int(os.environ.get("GC_KILLS", "20" if slow else "8"))
    seed = int(os.environ.get("GC_SEED", str(time.time_ns())))
    rng = random.Random(seed)
    archive = tmp_path / "archive"
    with open_store(store_url) as store:
        eligible = populate(store, 40 * kills, rng)
        before = {r.run_id: store.records(r.run_id) for r in store.list_runs()}
    for point in ("gc_archived", "gc_deleted"):  # the chosen windows first
        proc = gc_process(store_url, archive, f"{point}:2")
        proc.wait(timeout=60)
        assert proc.returncode == -signal.SIGKILL, proc.stderr.read() if proc.stderr else ""
        every_run_in_one_place(store_url, archive, before)
    killed = tries = 0
    while killed < kills and tries < 2 * kills:  # a gc may finish before its kill lands
        tries += 1
        files = len(list(archive.glob("*.gz")))
        target = files + rng.randint(0, 3)
        proc = gc_process(store_url, archive)
        if kill_when(proc, lambda n=target: len(list(archive.glob("*.gz"))) >= n, rng):
            killed += 1
        every_run_in_one_place(store_url, archive, before)
    proc = gc_process(store_url, archive)
    assert proc.wait(timeout=120) == 0, proc.stderr.read() if proc.stderr else ""
    every_run_in_one_place(store_url, archive, before)
    with open_store(store_url) as store:
        assert {t.run_id for t in store.tombstones()} == eligible, f"seed {seed}"
    assert killed >= kills, f"only {killed} random kills landed in {tries} (seed {seed})"


def test_cli_gc_and_restore(tmp_path: Path) -> None:
    from .test_cli import check, invoke

    url, archive = f"sqlite:///{tmp_path / 'j.db'}", tmp_path / "archive"
    with open_store(url) as store:
        write_run(store, "old", KINDS["finished"][0], OLD)
        write_run(store, "new", KINDS["finished"][0], timedelta(0))
        records = store.records("old")
    gc_args = ("gc", "--finished-older-than", "30d", "--archive", f"file://{archive}",
               "--store", url)
    dry = check(invoke(*gc_args, "--dry-run"), 0)
    assert "would archive old (4 events" in dry.stdout and "keep new" in dry.stdout
    report = json.loads(check(invoke(*gc_args, "--json"), 0).stdout)
    assert (report["archived"], report["kept"], report["dry_run"]) == (1, 1, False)
    assert {v["run_id"]: v["action"] for v in report["verdicts"]} == {
        "old": "archive", "new": "keep"}
    check(invoke("show", "old", "--store", url), 2, "archived to", "agentjournal restore old")
    check(invoke("restore", "old", "--store", url, "--archive", f"file://{tmp_path}"), 2,
          "holds no old.jsonl.gz")
    check(invoke("gc", "--finished-older-than", "30d", "--store", url), 1, "needs --archive")
    check(invoke("gc", "--finished-older-than", "soon", "--archive", "file:///x"), 1,
          "no duration")
    check(invoke("gc", "--keep-snapshots", "1", "--archive", f"file://{archive}"), 1,
          "needs --finished-older-than")
    check(invoke(*gc_args[:4], "s3://bucket", "--store", url), 1, "unknown scheme 's3'")
    restored = json.loads(check(invoke("restore", "old", "--store", url, "--archive",
                                       f"file://{archive}", "--json"), 0).stdout)
    assert (restored["events"], restored["already"]) == (4, False)
    with open_store(url) as store:
        assert store.records("old") == records
    again = check(invoke("restore", "old", "--store", url, "--archive", f"file://{archive}"), 0)
    assert "nothing to do" in again.stdout


def test_keep_snapshots_collects_segments_no_snapshot_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crash between a snapshot's segments and its publishing leaves segments no
    snapshot names: gc collects them, not those a kept snapshot names, and not while
    a writer holds the run's lease."""
    monkeypatch.setattr(snapshots, "SEGMENT", 2)
    with open_store(f"sqlite:///{tmp_path / 'runs.db'}") as store:
        write_run(store, "live", KINDS["running"][0], YOUNG)
        for _ in range(6):
            append_note(store, "live")
        assert write_snapshot(store, fold(store.read("live")))
        named = set(named_segments(store.snapshots("live")[0].body))
        assert len(named) >= 3
        orphan = hashlib.sha256(b"never named").hexdigest()
        store.put_segments("live", {orphan: b"left by a crash"})
        lease = store.acquire("live", "a-live-writer", 60)
        report = gc(store, RetentionPolicy(keep_snapshots=1), at=NOW)
        assert report.segments_pruned == 0 and orphan in store.segments("live", [orphan])
        store.release(lease)
        report = gc(store, RetentionPolicy(keep_snapshots=1), at=NOW)
        assert report.segments_pruned == 1 and report.snapshots_pruned == 0
        assert set(store.segments("live", [*named, orphan])) == named
        assert load_state(store, "live").snapshot_seq == store.last_seq("live")
        # Nothing left to collect: gc reads, and neither takes the lease nor writes.
        store.release(before := store.acquire("live", "w", 60))
        report = gc(store, RetentionPolicy(keep_snapshots=1), at=NOW)
        assert report.segments_pruned == 0
        assert store.acquire("live", "w", 60).epoch == before.epoch + 1  # gc took none
