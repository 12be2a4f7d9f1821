"""Behaviour only the SQLite backend has: its migrations and its host-clock leases."""

from __future__ import annotations

import os
import random
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from agentjournal import SCHEMA_VERSION, EventType, LeaseHeldError, make_events
from agentjournal.bench._common import workload
from agentjournal.errors import ConflictError, CorruptLogError, DurabilityError, FencedError
from agentjournal.events import Event, seal
from agentjournal.projections import differences, outline
from agentjournal.snapshots import load_state, write_snapshot
from agentjournal.state import RunState, durable_fields, fold
from agentjournal.store import sqlite as sqlite_module
from agentjournal.store.base import host_clock
from agentjournal.store.outlined import LAG
from agentjournal.store.sqlite import MAX_SEQ, SQLiteStore

from . import powercut

_v3 = msgspec.json.Encoder(order="sorted")


def v3_body(run_id: str, seq: int, kind: EventType, payload: dict[str, Any]) -> bytes:
    """An event as releases before the digest chain stored it: no ``digest`` at all."""
    return _v3.encode({"run_id": run_id, "seq": seq, "type": kind.value, "epoch": 0, "v": 3,
                       "ts": f"2026-11-30T03:23:5{seq}.000000Z", "payload": payload})


def released(run_id: str, n: int) -> list[Event]:
    """``workload(run_id, n)`` as 0.1.0 wrote it: v6 records (sealed, no heads). A file
    whose migrations predate the heads never held records of a later version."""
    return [msgspec.structs.replace(e, v=6) for e in workload(run_id, n)]


def raw(path: Path, statement: str, params: tuple[Any, ...] = ()) -> list[Any]:
    db = sqlite3.connect(path)
    try:
        with db:
            return db.execute(statement, params).fetchall()
    finally:
        db.close()


def old_store(path: Path, monkeypatch: pytest.MonkeyPatch, migrations: int) -> None:
    """A database as a release with only the first ``migrations`` migrations left it."""
    with monkeypatch.context() as m:
        m.setattr(sqlite_module, "MIGRATIONS", sqlite_module.MIGRATIONS[:migrations])
        SQLiteStore(path).close()
    assert raw(path, "PRAGMA user_version") == [(migrations,)]


# --- migrations ----------------------------------------------------------------------


def test_migration_3_backfills_scopes_from_a_v2_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "old.db"
    old_store(path, monkeypatch, 2)
    started = {"origin": {"task": "t", "scope": "op:acme:7"}, "fork": {"task": "t",
               "scope": "op:acme:7"}, "solo": {"task": "t"}}
    for run_id, payload in started.items():
        for seq, kind, p in ((1, EventType.RUN_STARTED, payload),
                             (2, EventType.USER_MESSAGE, {"content": "hi"})):
            raw(path, "INSERT INTO events VALUES (?, ?, ?, ?, ?)",
                (run_id, seq, kind.value, f"2026-11-30T03:23:5{seq}+00:00",
                 v3_body(run_id, seq, kind, p)))
    with SQLiteStore(path) as store:
        assert raw(path, "PRAGMA user_version") == [(len(sqlite_module.MIGRATIONS),)]
        assert sorted(store.scope_runs("op:acme:7")) == ["fork", "origin"]
        assert store.scope_runs("run:solo") == ["solo"]
        # The unsealed log still reads, and new events chain on from it.
        assert [e.v for e in store.read("solo")] == [SCHEMA_VERSION] * 2  # upcast on read
        more = make_events("solo", 2, 0, [(EventType.USER_MESSAGE, {"content": "again"})])
        store.append("solo", more, expected_seq=2, epoch=0)
        assert [e.payload.get("content") for e in store.read("solo")] == [None, "hi", "again"]


def test_migration_4_judges_an_older_lease_by_the_wall_clock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "old.db"
    old_store(path, monkeypatch, 3)
    raw(path, "INSERT INTO leases VALUES ('live', 'a', 1, ?), ('gone', 'a', 4, ?)",
        (time.time() + 60, time.time() - 1))
    with SQLiteStore(path) as store:
        with pytest.raises(LeaseHeldError):
            store.acquire("live", "b", ttl=60)
        assert store.acquire("gone", "b", ttl=60).epoch == 5
        wall = time.time  # the only clock such a row has: a clock an hour ahead wins
        monkeypatch.setattr(time, "time", lambda: wall() + 3600)
        assert store.acquire("live", "b", ttl=60).epoch == 2



def copy_as_v8(current: Path, old: Path) -> None:
    """Every event, scope, snapshot and segment of the store at ``current`` into the
    database at ``old``, as migrations 1-8 laid them out (events keyed by run id, seq)."""
    db = sqlite3.connect(old)
    try:
        with db:
            db.execute("ATTACH ? AS new", (str(current),))
            db.execute(f"INSERT INTO events SELECT n.run_id, e.key & {MAX_SEQ},"
                       " json_extract(CAST(e.body AS TEXT), '$.type'), e.ts, e.body"
                       " FROM new.events e JOIN new.run_numbers n ON e.key >> 32 = n.run_no")
            db.execute("INSERT INTO scopes SELECT * FROM new.scopes")
            db.execute("INSERT INTO snapshots SELECT * FROM new.snapshots")
            db.execute("INSERT INTO segments SELECT * FROM new.segments")
        db.execute("DETACH new")
    finally:
        db.close()


def test_migration_8_moves_snapshots_and_segments_to_rowid_tables_intact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, current = tmp_path / "old.db", tmp_path / "current.db"
    old_store(path, monkeypatch, 7)
    events = released("r", 800)  # 533 messages and 266 completed calls: several segments
    with SQLiteStore(current) as store:
        store.append("r", events, expected_seq=0, epoch=0)
        assert write_snapshot(store, fold(events)) is not None
        held = store.segment_digests("r")
    assert len(held) >= 4
    copy_as_v8(current, path)
    with SQLiteStore(path) as store:
        assert raw(path, "PRAGMA user_version") == [(len(sqlite_module.MIGRATIONS),)]
        for table in ("snapshots", "segments"):
            (sql,) = raw(path, "SELECT sql FROM sqlite_schema WHERE name = ?", (table,))[0]
            assert "WITHOUT ROWID" not in sql
        assert store.segment_digests("r") == held
        loaded = load_state(store, "r")
        assert (loaded.snapshot_seq, loaded.replayed) == (800, 0)
        assert durable_fields(loaded.state) == durable_fields(fold(events))
        # A snapshot of the same seq replaces the one there, as before.
        assert write_snapshot(store, fold(events)) is not None
        assert len(store.snapshots("r")) == 1


def test_migration_9_keys_every_event_by_run_number_and_seq_intact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, current = tmp_path / "old.db", tmp_path / "current.db"
    old_store(path, monkeypatch, 8)
    logs = {run_id: released(run_id, n) for run_id, n in (("b", 30), ("a", 7), ("c", 1))}
    with SQLiteStore(current) as store:
        for run_id, events in logs.items():
            store.append(run_id, events, expected_seq=0, epoch=0)
        stored = {run_id: list(store.read(run_id)) for run_id in logs}
        runs = store.list_runs()
    copy_as_v8(current, path)
    with SQLiteStore(path) as store:
        assert raw(path, "PRAGMA user_version") == [(len(sqlite_module.MIGRATIONS),)]
        for run_id, events in stored.items():
            assert list(store.read(run_id)) == events
            assert list(store.read(run_id, after_seq=3)) == events[3:]
            assert store.last_seq(run_id) == len(events)
        assert store.list_runs() == runs
        assert store.last_seq("nobody") == 0 and list(store.read("nobody")) == []
        # Each run goes on from where it ended; a new run gets a number of its own.
        for run_id, events in stored.items():
            more = make_events(run_id, len(events), 0, [(EventType.USER_MESSAGE, {"n": 1})])
            store.append(run_id, more, expected_seq=len(events), epoch=0)
            assert list(store.read(run_id))[:-1] == events
            assert store.last_seq(run_id) == len(events) + 1
        store.append("d", workload("d", 5), expected_seq=0, epoch=0)
        assert raw(path, "SELECT run_id FROM run_numbers ORDER BY run_no") == [
            ("a",), ("b",), ("c",), ("d",)]


def test_a_store_before_migration_9_reads_through_a_read_only_handle_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read-only handle cannot migrate (the CLI reads through one, and a backup may be
    on a read-only mount): it reads the older layout as it is, and changes no byte."""
    path, current = tmp_path / "old.db", tmp_path / "current.db"
    old_store(path, monkeypatch, 8)
    with SQLiteStore(current) as store:
        for run_id, n in (("b", 12), ("a", 4)):
            store.append(run_id, released(run_id, n), expected_seq=0, epoch=0)
        stored = {run_id: list(store.read(run_id)) for run_id in ("a", "b")}
        runs, scoped = store.list_runs(), store.scope_runs("run:a")
    copy_as_v8(current, path)
    before = path.read_bytes()
    with SQLiteStore(path, readonly=True) as old:
        for run_id, events in stored.items():
            assert list(old.read(run_id)) == events
            assert list(old.read(run_id, after_seq=2)) == events[2:]
            assert old.last_seq(run_id) == len(events)
            assert len(old.records(run_id)) == len(events)
        assert old.list_runs() == runs and old.scope_runs("run:a") == scoped
    assert path.read_bytes() == before
    assert raw(path, "PRAGMA user_version") == [(8,)]


# --- leases on the host's clock ------------------------------------------------------


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SQLiteStore]:
    with SQLiteStore(tmp_path / "journal.db") as s:
        yield s


def test_a_lease_from_another_boot_is_taken_over(
    store: SQLiteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    with monkeypatch.context() as m:  # written before a reboot, by a holder that died with it
        m.setattr(sqlite_module, "host_clock", lambda: ("boot-before", 50.0))
        before = store.acquire("r1", "worker-a", ttl=3600)
    if not host_clock()[0]:
        pytest.skip("this host has no boot id: leases fall back to the wall clock")
    assert store.acquire("r1", "worker-b", ttl=60).epoch == before.epoch + 1


def test_a_clock_behind_still_takes_over_an_expired_lease(
    store: SQLiteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = store.acquire("r1", "worker-a", ttl=0.05)
    time.sleep(0.15)
    wall = time.time
    monkeypatch.setattr(time, "time", lambda: wall() - 3600)
    assert store.acquire("r1", "worker-b", ttl=60).epoch == first.epoch + 1


def test_renew_moves_the_host_clock_deadline(store: SQLiteStore) -> None:
    lease = store.renew(store.acquire("r1", "worker-a", ttl=0.05), ttl=60)
    time.sleep(0.15)
    with pytest.raises(LeaseHeldError) as info:
        store.acquire("r1", "worker-b", ttl=60)
    assert 50 < info.value.expires_in <= 60
    assert lease.expires_at > time.time() + 50  # the wall-clock expiry, for display


# --- SQLite's operational failures are ours too ----------------------------------------


class _DiskFull:
    """The store's connection, except that inserting finds the disk full (SQLITE_FULL)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)

    def executemany(self, *args: Any) -> None:
        exc = sqlite3.OperationalError("database or disk is full")
        exc.sqlite_errorcode = sqlite3.SQLITE_FULL
        raise exc


def test_a_full_disk_mid_transaction_is_a_store_io_error(tmp_path: Path) -> None:
    from agentjournal import StoreIOError

    store = SQLiteStore(tmp_path / "j.db")
    real = store._db
    store._db = _DiskFull(real)  # type: ignore[assignment]
    facts = [(EventType.USER_MESSAGE, {"content": "x"})]
    with pytest.raises(StoreIOError, match=r"disk is full.*Free space and retry"):
        store.append("r1", make_events("r1", 0, 0, facts), expected_seq=0, epoch=0)
    store._db = real
    assert store.append("r1", make_events("r1", 0, 0, facts), expected_seq=0, epoch=0) == 1
    store.close()


def test_a_lock_held_past_the_busy_timeout_is_retryable_unavailability(tmp_path: Path) -> None:
    from agentjournal import StoreUnavailableError

    store = SQLiteStore(tmp_path / "j.db", busy_timeout=0.1)
    other = sqlite3.connect(tmp_path / "j.db", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another writer holds the lock
    try:
        with pytest.raises(StoreUnavailableError, match="locked") as info:
            store.acquire("r1", "me", 5.0)
        assert info.value.retryable
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert store.acquire("r1", "me", 5.0).epoch == 1
    store.close()


# --- several handles in one process ---------------------------------------------------

_SWITCH_JOURNAL = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], timeout=0, isolation_level=None)
try:
    print(db.execute("PRAGMA journal_mode=DELETE").fetchone()[0])
except sqlite3.OperationalError as exc:
    print(exc)
"""


@pytest.mark.parametrize("readonly", [True, False], ids=["reader", "writer"])
def test_opening_another_handle_keeps_this_process_s_locks(tmp_path: Path,
                                                          readonly: bool) -> None:
    # Regression: opening a store read the file's header with open()/close(); closing
    # any descriptor of a file drops every POSIX lock the process holds on it, so a
    # live reader of another handle here lost its lock, and another process could
    # switch the database out of WAL under it.
    path = tmp_path / "j.db"
    SQLiteStore(path).close()
    with SQLiteStore(path) as first:
        first._db.execute("BEGIN")
        first._db.execute("SELECT count(*) FROM events").fetchone()  # a live read
        SQLiteStore(path, readonly=readonly).close()
        other = subprocess.run([sys.executable, "-c", _SWITCH_JOURNAL, str(path)],
                               capture_output=True, text=True, check=True)
        first._db.execute("COMMIT")
    assert "locked" in other.stdout, other.stdout


# --- group commit --------------------------------------------------------------------


def _one(run_id: str, after: int, epoch: int = 0) -> list[Any]:
    kind = EventType.RUN_STARTED if after == 0 else EventType.USER_MESSAGE
    payload = {"task": "t"} if after == 0 else {"content": f"m{after}"}
    return make_events(run_id, after, epoch, [(kind, payload)])


def test_concurrent_appends_share_commits_and_each_stands_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """40 threads, each its own run, 25 appends each, every tenth one stale: the stale
    ones are refused, every other one is stored once, and groups are large: each commit
    serves about as many appends as threads wait (~65 commits for 920 appends here). An
    append that had to queue for the commit lock just to learn that it was done made
    groups of ~2 (~500 commits)."""
    store = SQLiteStore(tmp_path / "j.db")
    commits = 0
    real_sync = store._sync

    def counted(*statement: Any) -> int:
        nonlocal commits
        commits += 1
        return real_sync(*statement)

    monkeypatch.setattr(store, "_sync", counted)
    refused: list[str] = []

    def writer(n: int) -> None:
        run_id, last = f"r{n}", 0
        for i in range(25):
            stale = i % 10 == 9
            try:
                last = store.append(run_id, _one(run_id, last - 1 if stale else last),
                                    expected_seq=last - 1 if stale else last, epoch=0)
            except ConflictError:
                refused.append(run_id)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(refused) == 40 * 2
    for n in range(40):
        assert [e.seq for e in store.read(f"r{n}")] == list(range(1, 24))
    assert commits < 40 * 23 / 4, commits
    store.close()


def test_a_failed_commit_fails_every_append_it_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SQLiteStore(tmp_path / "j.db")
    gate, entered = threading.Event(), threading.Event()
    real_sync = store._sync
    calls = 0

    def slow_then_broken(*statement: Any) -> int:
        nonlocal calls
        calls += 1
        if calls == 1:  # hold the first commit while the others queue behind it
            entered.set()
            gate.wait(60)
            return real_sync(*statement)
        raise OSError("disk I/O error")

    monkeypatch.setattr(store, "_sync", slow_then_broken)
    errors: dict[str, BaseException | None] = {}

    def writer(run_id: str) -> None:
        try:
            store.append(run_id, _one(run_id, 0), expected_seq=0, epoch=0)
            errors[run_id] = None
        except Exception as exc:
            errors[run_id] = exc

    first = threading.Thread(target=writer, args=("first",))
    first.start()
    assert entered.wait(60)
    rest = [threading.Thread(target=writer, args=(f"r{n}",)) for n in range(5)]
    for t in rest:
        t.start()
    deadline = time.monotonic() + 60  # a hang guard
    while len(store._grouper._waiting) < 5:  # all five queued behind the held commit
        assert time.monotonic() < deadline, store._grouper._waiting
        time.sleep(0.01)
    gate.set()
    for t in [first, *rest]:
        t.join()
    assert errors["first"] is None and calls == 2  # the five went in one commit
    assert all(isinstance(errors[f"r{n}"], DurabilityError) for n in range(5))
    store.close()
    reopened = SQLiteStore(tmp_path / "j.db")
    assert [r.run_id for r in reopened.list_runs()] == ["first"]
    reopened.close()


_ACKING_WRITERS = """
import sys, threading
from agentjournal import EventType, make_events
from agentjournal.bench._common import workload
from agentjournal.snapshots import load_state, write_snapshot
from agentjournal.state import durable_fields, fold
from agentjournal.store.sqlite import MAX_SEQ, SQLiteStore

store = SQLiteStore(sys.argv[1], durability=sys.argv[2] if len(sys.argv) > 2 else "fsync")
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


def test_every_acknowledged_append_survives_a_kill_mid_group(tmp_path: Path) -> None:
    """SIGKILL a process whose 16 threads append as fast as they can, each printing an
    append only once acknowledged: every printed append is in the file afterwards."""
    path = tmp_path / "j.db"
    SQLiteStore(path).close()
    child = subprocess.Popen([sys.executable, "-c", _ACKING_WRITERS, str(path)],
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    acked: dict[str, int] = {}
    for line in child.stdout:
        run_id, seq = line.split()
        acked[run_id] = int(seq)
        if sum(acked.values()) >= 1500:
            break
    child.kill()  # mid-group: some appends are in a commit that has not returned
    child.wait()
    store = SQLiteStore(path)
    for run_id, seq in acked.items():
        assert store.last_seq(run_id) >= seq, run_id
        assert [e.seq for e in store.read(run_id)] == list(range(1, store.last_seq(run_id) + 1))
    store.close()


@pytest.mark.parametrize("durability", ["fsync", "batched"])
def test_a_power_cut_keeps_every_acknowledged_append(tmp_path: Path, durability: str) -> None:
    """16 threads append to one store as fast as group commit lets them, each printing
    an append once acknowledged; the process is killed at a random moment and the disk
    is rebuilt as of each file's last sync (tests/powercut). Every acknowledged append
    is in it. The control, syncing off (batched: WAL with synchronous=NORMAL), loses
    acknowledged appends the same way: the simulation sees a missing sync. (A cut just
    after a WAL checkpoint loses nothing even then, so the control has three tries.)"""
    if durability == "fsync":
        lost = _power_cut(tmp_path, durability)
        assert not lost, lost
    else:
        assert any(_power_cut(tmp_path / f"try-{n}", durability) for n in range(3)), \
            "syncing off lost nothing: the simulation would not see a missing sync"


def _power_cut(tmp_path: Path, durability: str) -> dict[str, tuple[int, int]]:
    """One cut (see above): the acknowledged appends it lost, by run: (kept, acked)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    shim = powercut.build(tmp_path)
    data, log = tmp_path / "data", tmp_path / "writes.log"
    data.mkdir(parents=True)
    SQLiteStore(data / "j.db").close()
    before = {f.name: f.read_bytes() for f in data.iterdir()}
    child = subprocess.Popen(
        [sys.executable, "-c", _ACKING_WRITERS, str(data / "j.db"), durability],
        stdout=subprocess.PIPE, text=True,
        env={**os.environ, **powercut.environment(shim, data, log)})
    assert child.stdout is not None
    acked: dict[str, int] = {}
    cut_after = random.randint(800, 2000)
    for line in child.stdout:
        run_id, seq = line.split()
        acked[run_id] = int(seq)
        if sum(acked.values()) >= cut_after:
            break
    child.kill()
    child.wait()
    powercut.image(data, log, tmp_path / "after", before)
    store = SQLiteStore(tmp_path / "after" / "j.db")
    kept = {run_id: store.last_seq(run_id) for run_id in acked}
    for run_id in acked:  # what survived is whole: contiguous, its digest chain intact
        assert [e.seq for e in store.read(run_id)] == list(range(1, kept[run_id] + 1))
    store.close()
    return {r: (kept[r], seq) for r, seq in acked.items() if kept[r] < seq}


def _some(run_id: str, after: int, n: int, epoch: int = 0) -> list[Any]:
    return make_events(run_id, after, epoch, [
        (EventType.USER_MESSAGE, {"content": f"m{after + i}"}) for i in range(n)])


def test_a_warm_append_is_one_statement_and_a_stale_one_is_refused_as_ever(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An append to a run this handle last saw the end of is one statement, its own
    transaction, for one event or several. When the run moved on elsewhere (another
    handle appended, or took the lease), that statement inserts nothing and the append
    is refused as before, none of its events written."""
    store, other = SQLiteStore(tmp_path / "j.db"), SQLiteStore(tmp_path / "j.db")
    statements: list[str] = []
    real_sync = store._sync

    def seen(statement: str = "COMMIT", params: Any = None) -> int:
        statements.append(statement.split()[0])
        return real_sync(statement, params)

    monkeypatch.setattr(store, "_sync", seen)
    store.append("r", _one("r", 0), expected_seq=0, epoch=0)
    assert store.append("r", _one("r", 1), expected_seq=1, epoch=0) == 2
    assert store.append("r", _some("r", 2, 3), expected_seq=2, epoch=0) == 5
    assert statements == ["COMMIT", "INSERT", "INSERT"]  # the first in a transaction
    other.append("r", _one("r", 5), expected_seq=5, epoch=0)
    with pytest.raises(ConflictError):
        store.append("r", _one("r", 5), expected_seq=5, epoch=0)
    with pytest.raises(ConflictError):
        store.append("r", _some("r", 5, 2), expected_seq=5, epoch=0)
    lease = other.acquire("r", "w2", 60)
    with pytest.raises(FencedError):
        store.append("r", _some("r", 6, 2), expected_seq=6, epoch=0)
    assert store.append("r", _some("r", 6, 2, lease.epoch), expected_seq=6,
                        epoch=lease.epoch) == 8
    assert store.append("r", _some("r", 8, 20, lease.epoch), expected_seq=8,
                        epoch=lease.epoch) == 28  # more than one statement holds: a transaction
    assert statements[-1] == "COMMIT"
    assert [e.seq for e in SQLiteStore(tmp_path / "j.db").read("r")] == list(range(1, 29))
    store.close()
    other.close()


def test_a_zero_byte_file_is_an_empty_store_to_a_reader_and_is_completed_by_a_writer(
    tmp_path: Path,
) -> None:
    path = tmp_path / "z.db"
    path.write_bytes(b"")  # what a process killed while creating the store leaves
    reader = SQLiteStore(path, readonly=True)
    try:
        assert reader.unfinished
        assert reader.list_runs() == [] and reader.last_seq("r1") == 0
        assert list(reader.read("r1")) == [] and reader.tombstones() == []
    finally:
        reader.close()
    assert [p.name for p in tmp_path.iterdir()] == ["z.db"] and path.stat().st_size == 0
    writer = SQLiteStore(path)
    try:
        writer.append("r1", make_events("r1", 0, 0, [(EventType.RUN_STARTED, {})]),
                      expected_seq=0, epoch=0)
    finally:
        writer.close()
    reader = SQLiteStore(path, readonly=True)
    try:
        assert not reader.unfinished
        assert reader.last_seq("r1") == 1
    finally:
        reader.close()


def test_the_heads_migration_computes_each_run_s_head_from_its_log_once(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with SQLiteStore(path) as store:
        store.append("new", released("new", 5), expected_seq=0, epoch=0)
        sealed = list(store.read("new"))
    raw(path, "DROP TABLE heads")  # as the migration before heads left it...
    raw(path, "DROP TABLE store_info")
    raw(path, f"PRAGMA user_version = {sqlite_module._HEADS - 1}")
    raw(path, "INSERT INTO run_numbers (run_id) VALUES ('old')")  # ...with a v3 run in it
    for seq in (1, 2):
        body = v3_body("old", seq, EventType.USER_MESSAGE, {"content": f"m{seq}"})
        raw(path, "INSERT INTO events SELECT (run_no << 32) + ?, 'ts', ? FROM run_numbers"
            " WHERE run_id = 'old'", (seq, body))
    with SQLiteStore(path, readonly=True) as reader:  # an older file reads without heads
        assert reader.heads() == {} and len(list(reader.read("old"))) == 2
    with SQLiteStore(path) as store:
        assert raw(path, "PRAGMA user_version") == [(len(sqlite_module.MIGRATIONS),)]
        assert store.heads() == {"new": (5, sealed[-1].digest), "old": (2, "")}
        # created before sealing (it holds v3 records): unsealed records are no damage
        assert raw(path, "SELECT value FROM store_info WHERE name = 'created_schema'") == [(3,)]
        assert [e.seq for e in store.read("old")] == [1, 2]
        assert list(store.read("new")) == sealed
    raw(path, "DELETE FROM events WHERE key = (SELECT (run_no << 32) + 5 FROM run_numbers"
        " WHERE run_id = 'new')")
    with SQLiteStore(path) as store, pytest.raises(CorruptLogError, match="deleted"):
        list(store.read("new"))


def test_an_outline_is_stored_when_due_and_read_exact_in_between(tmp_path: Path) -> None:
    """A run in flight stores its outline with its first append, when its status
    changes, and every LAG events: not a page per commit. Every read in between is the
    outline of a fresh fold (the events after the stored one folded in)."""
    path = tmp_path / "j.db"
    events = workload("a", 2 + 3 * 20)  # opening, then 20 steps: the status stays running
    stored = []
    with SQLiteStore(path) as store:
        for e in events:
            store.append("a", [e], expected_seq=e.seq - 1, epoch=0)
            stored.append(raw(path, "SELECT seq FROM outlines")[0][0])
            served = store.outlines()["a"]
            assert isinstance(served, RunState)
            assert differences(served, outline(fold(events[:e.seq]))) == []
        assert sorted(set(stored)) == list(range(1, len(events) + 1, LAG))
        finished = make_events("a", len(events), 0, [(EventType.RUN_FINISHED, {"outcome": "ok"})])
        store.append("a", finished, expected_seq=len(events), epoch=0)
        assert raw(path, "SELECT seq, status FROM outlines") == [(len(events) + 1, "finished")]


def test_a_writer_s_open_projects_the_runs_once_not_at_every_open(tmp_path: Path) -> None:
    """A writer's open scans the heads for runs to project only until it has done so for
    this outline version (store_info): an outline lost later (another program's rows) is
    caught up by each read, not by every open."""
    path = tmp_path / "j.db"
    with SQLiteStore(path) as store:
        store.append("a", workload("a", 7), expected_seq=0, epoch=0)
        before = store.outlines()
    raw(path, "DELETE FROM outlines")
    with SQLiteStore(path) as store:
        assert raw(path, "SELECT count(*) FROM outlines") == [(0,)]  # not projected again
        assert store.outlines() == before  # a read folds it
    raw(path, "DELETE FROM store_info WHERE name = 'outlines_projected'")
    with SQLiteStore(path) as store:  # (as after a migration that changes outlines)
        assert raw(path, "SELECT count(*) FROM outlines") == [(1,)]


def test_a_row_inserted_by_another_program_moves_no_head(tmp_path: Path) -> None:
    """The head moves with our appends only (a trigger of our connections alone): a
    forged last event, inserted after the real one was deleted, is refused."""
    path = tmp_path / "j.db"
    with SQLiteStore(path) as store:
        store.append("r1", workload("r1", 3), expected_seq=0, epoch=0)
        log = list(store.read("r1"))
    forged = msgspec.structs.replace(log[2], payload={"content": "forged"}, digest="")
    (body,), _ = seal([forged], log[1].digest)
    raw(path, "DELETE FROM events WHERE key = (SELECT max(key) FROM events)")
    raw(path, "INSERT INTO events SELECT (run_no << 32) + 3, 'ts', ? FROM run_numbers", (body,))
    with SQLiteStore(path) as store, pytest.raises(CorruptLogError, match="newest event"):
        list(store.read("r1"))


def test_a_short_log_with_a_snapshot_opens_from_the_snapshot(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On SQLite looking for a snapshot is a local query: a log longer than the store's
    short_log (16 events, against 64 on PostgreSQL) looks for one and loads from it,
    where a log of at most 16 is folded from its events."""
    from agentjournal.journal import SHORT_LOG, open_journal

    store = SQLiteStore(tmp_path / "runs.db")
    looked: list[str] = []
    real = store.snapshots
    monkeypatch.setattr(store, "snapshots", lambda run_id, **kw: (looked.append(run_id),
                                                                  real(run_id, **kw))[1])
    for run_id, events in (("short", store.short_log), ("longer", store.short_log + 1)):
        with open_journal(store, run_id) as j:
            j.record(EventType.RUN_STARTED, task="t")
            j.record_all([(EventType.USER_MESSAGE, {"content": f"m{i}"})
                          for i in range(events - 1)])
            write_snapshot(store, j.state)
        looked.clear()
        with open_journal(store, run_id) as j:
            assert j.state.last_seq == events
            assert looked == ([] if events <= store.short_log else [run_id])
    assert store.short_log < SHORT_LOG
    store.close()
