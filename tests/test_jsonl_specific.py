"""JsonlStore only: torn tails, mid-log damage, failed fsyncs, batching, framing."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import zlib
from pathlib import Path

import msgspec
import pytest

from agentjournal import (
    CorruptLogError,
    CorruptStoreError,
    DurabilityError,
    EventType,
    InvalidRunIdError,
    StoreUrlError,
    make_events,
)
from agentjournal.events import SEALED_SINCE, encode, seal
from agentjournal.store import Durability
from agentjournal.store.jsonl import JsonlStore, _frame_batch

from .builders import jsonl_store_with, snapshot_at


def add(store: JsonlStore, run_id: str, *contents: str) -> int:
    last = store.last_seq(run_id)
    facts = [(EventType.USER_MESSAGE, {"content": c}) for c in contents]
    events = make_events(run_id, last, 0, facts)
    return store.append(run_id, events, expected_seq=last, epoch=0)


@pytest.fixture
def three(tmp_path: Path) -> tuple[Path, list[bytes]]:
    """A run ``r1`` with three events, one append each; returns (file, its lines)."""
    with JsonlStore(tmp_path / "src") as store:
        for c in ("one", "two", "three"):
            add(store, "r1", c)
    log = tmp_path / "src" / "r1.jsonl"
    return log, log.read_bytes().splitlines(keepends=True)


def copy_with(tmp_path: Path, name: str, data: bytes) -> Path:
    return jsonl_store_with(tmp_path / name, data)


def test_record_framing(three: tuple[Path, list[bytes]]) -> None:
    _, lines = three
    assert len(lines) == 3
    for line in lines:
        crc, body = line.rstrip(b"\n").split(b" ", 1)
        assert crc == b"%08x" % zlib.crc32(body)


def test_torn_final_record_at_every_byte(
    tmp_path: Path, three: tuple[Path, list[bytes]], caplog: pytest.LogCaptureFixture
) -> None:
    _, lines = three
    good = b"".join(lines[:2])
    for cut in range(len(lines[2])):
        data = good + lines[2][:cut]
        directory = copy_with(tmp_path, f"cut{cut}", data)
        store = JsonlStore(directory)
        assert [e.payload["content"] for e in store.read("r1")] == ["one", "two"], cut
        assert (directory / "r1.jsonl").read_bytes() == data  # a reader never cuts
        with caplog.at_level(logging.WARNING, logger="agentjournal"):
            caplog.clear()
            assert add(store, "r1", "three again") == 3
        if cut:
            assert len(store.repairs) == 1
            repair = store.repairs[0]
            assert (repair.run_id, repair.offset, repair.dropped_bytes) == ("r1", len(good), cut)
            assert "incomplete final batch" in caplog.text
        else:
            assert store.repairs == []
        store.close()
        reopened = JsonlStore(directory)
        assert [e.seq for e in reopened.read("r1")] == [1, 2, 3]
        assert reopened.repairs == []


@pytest.mark.parametrize("touch", ["read", "last_seq", "list_runs", "append"])
def test_only_a_writer_repairs(
    tmp_path: Path, three: tuple[Path, list[bytes]], touch: str
) -> None:
    _, lines = three
    data = b"".join(lines[:2]) + lines[2][:-1]
    directory = copy_with(tmp_path, "torn", data)
    store = JsonlStore(directory)
    if touch == "read":
        assert len(list(store.read("r1"))) == 2
    elif touch == "last_seq":
        assert store.last_seq("r1") == 2
    elif touch == "list_runs":
        assert [r.last_seq for r in store.list_runs()] == [2]
    else:
        assert add(store, "r1", "three again") == 3
    wrote = touch == "append"
    assert len(store.repairs) == wrote
    assert ((directory / "r1.jsonl").read_bytes() == data) is not wrote


def test_garbage_final_line_with_newline_is_a_torn_tail(
    tmp_path: Path, three: tuple[Path, list[bytes]]
) -> None:
    # A power cut can leave the newline's page on disk but not an earlier one.
    _, lines = three
    torn = lines[2][:20] + b"\x00" * (len(lines[2]) - 21) + b"\n"
    store = JsonlStore(copy_with(tmp_path, "zeros", b"".join(lines[:2]) + torn))
    assert store.last_seq("r1") == 2
    assert add(store, "r1", "three again") == 3
    assert store.repairs[0].reason == f"{len(torn)} bytes that are not a whole record"


def test_flipped_byte_in_middle_record_is_corruption(
    tmp_path: Path, three: tuple[Path, list[bytes]]
) -> None:
    _, lines = three
    for i in range(len(lines[1]) - 1):  # every byte but the newline
        middle = bytearray(lines[1])
        middle[i] ^= 0x01
        data = lines[0] + bytes(middle) + lines[2]
        directory = copy_with(tmp_path, f"flip{i}", data)
        store = JsonlStore(directory)
        for touch in ("read", "read_tail", "last_seq", "append"):
            with pytest.raises(CorruptLogError) as info:
                if touch == "read":
                    list(store.read("r1"))
                elif touch == "read_tail":  # skipping decode never skips the checksum
                    list(store.read("r1", after_seq=2))
                elif touch == "last_seq":
                    store.last_seq("r1")
                else:
                    add(store, "r1", "more")
            assert info.value.seq == 2 and info.value.run_id == "r1", (i, touch)
        assert (directory / "r1.jsonl").read_bytes() == data
        assert store.repairs == []


def test_seq_gap_is_corruption_even_at_the_tail(
    tmp_path: Path, three: tuple[Path, list[bytes]]
) -> None:
    # A record with a valid checksum was written whole: never cut it off.
    _, lines = three
    for data, seq in [
        (lines[0] + lines[2], 2),
        (lines[0] + lines[2] + lines[1], 2),
        (lines[1] + lines[2], 1),
    ]:
        directory = copy_with(tmp_path, f"gap{len(list(tmp_path.iterdir()))}", data)
        with pytest.raises(CorruptLogError) as info:
            JsonlStore(directory).last_seq("r1")
        assert info.value.seq == seq
        assert (directory / "r1.jsonl").read_bytes() == data


def test_failed_fsync_breaks_the_handle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = JsonlStore(tmp_path / "runs")
    add(store, "r1", "kept")
    size = (tmp_path / "runs" / "r1.jsonl").stat().st_size

    def failing_sync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(store, "_sync", failing_sync)
    with pytest.raises(DurabilityError) as info:
        add(store, "r1", "lost")
    assert info.value.run_id == "r1" and "fsync failed" in info.value.detail
    assert (tmp_path / "runs" / "r1.jsonl").stat().st_size == size  # rolled back
    monkeypatch.undo()  # the disk recovers; the handle still refuses writes
    with pytest.raises(DurabilityError):
        add(store, "r1", "after")
    with pytest.raises(DurabilityError):
        add(store, "other", "after")
    with pytest.raises(DurabilityError):
        store.acquire("r1", "w", ttl=5)
    assert [e.payload["content"] for e in store.read("r1")] == ["kept"]  # reads still work
    reopened = JsonlStore(tmp_path / "runs")
    assert [e.payload["content"] for e in reopened.read("r1")] == ["kept"]
    assert add(reopened, "r1", "after reopen") == 2


def test_failed_lease_fsync_keeps_the_old_lease(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = JsonlStore(tmp_path / "runs")
    lease = store.acquire("r1", "a", ttl=30)
    monkeypatch.setattr(store, "_sync", lambda fd: (_ for _ in ()).throw(OSError(5, "EIO")))
    with pytest.raises(DurabilityError):
        store.release(lease)
    assert JsonlStore(tmp_path / "runs").renew(lease, ttl=30).epoch == 1


def test_batched_syncs_every_n_and_on_close(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = JsonlStore(tmp_path / "runs", durability=Durability.BATCHED, batch_every=3)
    add(store, "r1", "first")  # creating the file fsyncs the directory
    synced: list[int] = []
    monkeypatch.setattr(store, "_sync", synced.append)
    for i in range(7):
        add(store, "r1", str(i))
    assert len(synced) == 2  # after appends 3 and 6 of this run
    store.close()
    assert len(synced) == 3
    store.close()  # nothing left to sync
    assert len(synced) == 3


def test_line_separators_do_not_split_records(tmp_path: Path) -> None:
    tricky = ["a\u2028b", "c\u2029d", "e\u0085f", "g\nh", "i\rj", "\x1c\x1d\x1e"]
    with JsonlStore(tmp_path / "runs") as store:
        add(store, "r1", *tricky)
    data = (tmp_path / "runs" / "r1.jsonl").read_bytes()
    assert data.count(b"\n") == len(tricky)
    store = JsonlStore(tmp_path / "runs")
    assert [e.payload["content"] for e in store.read("r1")] == tricky


def test_cache_sees_appends_from_another_handle(tmp_path: Path) -> None:
    a, b = JsonlStore(tmp_path / "runs"), JsonlStore(tmp_path / "runs")
    add(a, "r1", "1")
    assert b.last_seq("r1") == 1
    add(a, "r1", "2", "3")
    assert b.last_seq("r1") == 3
    assert add(b, "r1", "4") == 4
    assert a.last_seq("r1") == 4
    assert [r.run_id for r in a.list_runs()] == ["r1"]


def test_list_runs_newest_first(tmp_path: Path) -> None:
    store = JsonlStore(tmp_path / "runs")
    for run_id in ("a", "b", "c"):
        add(store, run_id, "x")
    add(store, "a", "y")
    runs = store.list_runs()
    assert [r.run_id for r in runs] == ["a", "c", "b"]
    assert runs[0].last_seq == 2 and runs[0].created_at is not None
    assert runs[0].updated_at is not None and runs[0].created_at <= runs[0].updated_at
    assert [r.run_id for r in store.list_runs(limit=2)] == ["a", "c"]


def test_no_files_for_unknown_or_invalid_runs(tmp_path: Path) -> None:
    store = JsonlStore(tmp_path / "runs")
    assert list(store.read("ghost")) == []
    assert store.last_seq("ghost") == 0
    assert store.list_runs() == []
    for bad in ("../escape", ".lock", "a/b"):
        with pytest.raises(InvalidRunIdError):
            list(store.read(bad))
        with pytest.raises(InvalidRunIdError):
            store.acquire(bad, "w", ttl=1)
    assert os.listdir(tmp_path / "runs") == ["_store.json"]  # (the store's own record)
    assert sorted(os.listdir(tmp_path)) == ["runs"]


def test_path_that_is_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(StoreUrlError):
        JsonlStore(tmp_path / "f")
    store = JsonlStore(tmp_path / "deep" / "er")
    assert store.url == f"jsonl:///{tmp_path / 'deep' / 'er'}"
    shutil.rmtree(tmp_path / "deep")


# --- snapshots -------------------------------------------------------------------


def test_snapshot_file_layout(tmp_path: Path) -> None:
    store = JsonlStore(tmp_path / "runs")
    body = b"line one\nline two\n\x00\xff"  # newlines in the body are fine
    store.put_snapshot(snapshot_at("r1", 5, body, fold_version=3))
    directory = tmp_path / "runs" / "r1.snapshots"
    assert os.listdir(directory) == ["000000000005-f3.snap"]
    header, rest = (directory / "000000000005-f3.snap").read_bytes().split(b"\n", 1)
    assert rest == body and b'"seq":5' in header and b'"fold_version":3' in header
    assert store.snapshots("r1") == [snapshot_at("r1", 5, body, fold_version=3)]


def test_leftover_tmp_is_never_loaded_and_cleaned_on_put(tmp_path: Path) -> None:
    store = JsonlStore(tmp_path / "runs")
    store.put_snapshot(snapshot_at("r1", 1, b"published"))
    directory = tmp_path / "runs" / "r1.snapshots"
    # A crash after writing a newer body but before the rename into place.
    whole = (directory / "000000000001-f1.snap").read_bytes().replace(b'"seq":1', b'"seq":2')
    (directory / "000000000002-f1.snap.tmp").write_bytes(whole)
    reopened = JsonlStore(tmp_path / "runs")
    assert [s.body for s in reopened.snapshots("r1")] == [b"published"]
    reopened.put_snapshot(snapshot_at("r1", 3, b"next"))
    assert not list(directory.glob("*.tmp"))
    assert [s.seq for s in reopened.snapshots("r1")] == [3, 1]


@pytest.mark.parametrize(
    "garbage",
    [b"", b"not json\nbody", b'{"seq": 9}\nbody', b"no newline at all", b"\x00" * 64],
)
def test_garbage_snap_file_is_skipped_with_a_warning(
    tmp_path: Path, garbage: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    store = JsonlStore(tmp_path / "runs")
    store.put_snapshot(snapshot_at("r1", 1, b"good"))
    directory = tmp_path / "runs" / "r1.snapshots"
    (directory / "000000000009-f1.snap").write_bytes(garbage)
    with caplog.at_level(logging.WARNING, logger="agentjournal"):
        assert [s.body for s in store.snapshots("r1")] == [b"good"]
    assert "unreadable snapshot" in caplog.text
    store.put_snapshot(snapshot_at("r1", 2, b"newer"), keep=5)  # the next put clears it away
    assert sorted(os.listdir(directory)) == ["000000000001-f1.snap", "000000000002-f1.snap"]


def test_snapshot_under_another_runs_name_is_skipped(tmp_path: Path) -> None:
    store = JsonlStore(tmp_path / "runs")
    store.put_snapshot(snapshot_at("a", 1))
    (tmp_path / "runs" / "b.snapshots").mkdir()
    shutil.copy(
        tmp_path / "runs" / "a.snapshots" / "000000000001-f1.snap",
        tmp_path / "runs" / "b.snapshots" / "000000000001-f1.snap",
    )
    assert store.snapshots("b") == []
    assert len(store.snapshots("a")) == 1


def test_snapshots_and_quarantine_do_not_confuse_list_runs(tmp_path: Path) -> None:
    store = JsonlStore(tmp_path / "runs")
    add(store, "r1", "x")
    store.put_snapshot(snapshot_at("r1", 1))
    store.put_snapshot(snapshot_at("ghost", 4))  # snapshots but no log
    store.quarantine(7, "wrong fold")
    assert (tmp_path / "runs" / "_quarantine.json").exists()
    assert [r.run_id for r in store.list_runs()] == ["r1"]
    assert store.last_seq("ghost") == 0
    assert store.delete_snapshots("ghost") == 1
    assert not (tmp_path / "runs" / "ghost.snapshots").exists()
    assert [r.run_id for r in JsonlStore(tmp_path / "runs").list_runs()] == ["r1"]


def test_a_listing_opens_only_the_logs_changed_since_the_last_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """list_runs keeps what it read of each log in the sidecar with the file's stamp
    (inode, size, mtime): an unchanged log is not opened again; one appended to by any
    handle, replaced, or buried under a tombstone is."""
    path = tmp_path / "runs"
    writer = JsonlStore(path)
    for run_id in ("a", "b", "c"):
        add(writer, run_id, "one")
    opened: list[str] = []
    real_tail = JsonlStore._tail
    monkeypatch.setattr(JsonlStore, "_tail", lambda self, run_id: (
        opened.append(run_id), real_tail(self, run_id))[1])

    def listing(store: JsonlStore) -> dict[str, int]:
        opened.clear()
        return {r.run_id: r.last_seq for r in store.list_runs()}

    assert listing(writer) == {"a": 1, "b": 1, "c": 1}
    assert listing(writer) == {"a": 1, "b": 1, "c": 1} and opened == []
    add(JsonlStore(path), "b", "two")  # another handle appends
    reader = JsonlStore(path, readonly=True)
    assert listing(reader) == {"a": 1, "b": 2, "c": 1} and opened == ["b"]
    assert listing(writer) == {"a": 1, "b": 2, "c": 1} and opened == ["b"]
    (path / "a.tomb").write_text("{}")  # buried: a tombstone beside an unchanged log
    assert "a" not in listing(reader)
    (path / "a.tomb").unlink()
    copy = (path / "c.jsonl").read_bytes()
    (path / "c.jsonl").unlink()
    (path / "c.jsonl").write_bytes(copy)  # the same bytes in another file
    assert listing(reader) == {"a": 1, "b": 2, "c": 1} and "c" in opened
    (path / "_outlines.db").unlink()  # the sidecar is a cache: lost, nothing is
    assert listing(JsonlStore(path, readonly=True)) == {"a": 1, "b": 2, "c": 1}


def test_snapshot_reads_create_no_files(tmp_path: Path) -> None:
    store = JsonlStore(tmp_path / "runs")
    assert store.snapshots("ghost") == []
    assert store.delete_snapshots("ghost") == 0
    assert store.quarantined() == {}
    assert os.listdir(tmp_path / "runs") == ["_store.json"]  # (the store's own record)


def test_quarantine_record_is_atomic_json(tmp_path: Path) -> None:
    store = JsonlStore(tmp_path / "runs")
    store.quarantine(3, "first")
    store.quarantine(3, "again")
    store.quarantine(4, "other")
    path = tmp_path / "runs" / "_quarantine.json"
    assert json.loads(path.read_text()) == {"3": "again", "4": "other"}
    assert JsonlStore(tmp_path / "runs").quarantined() == {3: "again", 4: "other"}
    assert not list((tmp_path / "runs").glob("*.tmp"))


def test_unreadable_quarantine_disables_snapshots(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A damaged record must never read as "nothing quarantined".
    store = JsonlStore(tmp_path / "runs")
    store.put_snapshot(snapshot_at("r1", 1))
    (tmp_path / "runs" / "_quarantine.json").write_bytes(b"{torn")
    with caplog.at_level(logging.WARNING, logger="agentjournal"):
        assert store.snapshots("r1") == []
    assert "quarantine" in caplog.text
    with pytest.raises(CorruptStoreError, match="quarantine record"):  # damage, not an OSError
        store.quarantined()
    with pytest.raises(CorruptStoreError):
        store.quarantine(1, "x")
    assert (tmp_path / "runs" / "_quarantine.json").read_bytes() == b"{torn"


def test_failed_snapshot_fsync_breaks_the_handle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = JsonlStore(tmp_path / "runs")
    store.put_snapshot(snapshot_at("r1", 1, b"kept"))
    monkeypatch.setattr(store, "_sync", lambda fd: (_ for _ in ()).throw(OSError(5, "EIO")))
    with pytest.raises(DurabilityError):
        store.put_snapshot(snapshot_at("r1", 2, b"lost"))
    monkeypatch.undo()
    directory = tmp_path / "runs" / "r1.snapshots"
    assert os.listdir(directory) == ["000000000001-f1.snap"]  # nothing published, no .tmp
    for attempt in (
        lambda: store.put_snapshot(snapshot_at("r1", 3)),
        lambda: store.delete_snapshots("r1"),
        lambda: store.delete_snapshots("ghost"),
        lambda: store.quarantine(1, "x"),
        lambda: add(store, "r1", "after"),
    ):
        with pytest.raises(DurabilityError):
            attempt()
    assert [s.body for s in store.snapshots("r1")] == [b"kept"]  # reads still work


def test_snapshot_prunes_serialize_across_processes(tmp_path: Path) -> None:
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_put_many, args=(str(tmp_path / "runs"), i)) for i in range(4)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(60)
        assert proc.exitcode == 0
    store = JsonlStore(tmp_path / "runs")
    assert len(store.snapshots("r1")) == 2
    assert not list((tmp_path / "runs" / "r1.snapshots").glob("*.tmp"))


def _put_many(directory: str, worker: int) -> None:
    store = JsonlStore(directory)
    for seq in range(worker * 100 + 1, worker * 100 + 30):
        store.put_snapshot(snapshot_at("r1", seq, b"w%d" % worker), keep=2)
        assert 1 <= len(store.snapshots("r1")) <= 2


class PageCache:
    """``os`` as the JSONL store sees it, except that a power cut loses every byte
    written since the file's last fsync: what a process kill can never show. (Files
    rewritten in place, a run's head, go back to what they held at their last sync.)"""

    def __init__(self) -> None:
        self.synced: dict[str, int] = {}
        self.rewritten: dict[str, bytes] = {}

    def __getattr__(self, name: str) -> object:
        return getattr(os, name)

    def write(self, fd: int, data: bytes) -> int:
        path = os.readlink(f"/proc/self/fd/{fd}")
        self.synced.setdefault(path, os.fstat(fd).st_size)  # what was there is durable
        return os.write(fd, data)

    def pwrite(self, fd: int, data: bytes, offset: int) -> int:
        path = os.readlink(f"/proc/self/fd/{fd}")
        self.rewritten.setdefault(path, Path(path).read_bytes())  # what was there is durable
        return os.pwrite(fd, data, offset)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)
        self._synced(fd)

    def fdatasync(self, fd: int) -> None:
        os.fdatasync(fd)
        self._synced(fd)

    def _synced(self, fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        if os.path.isfile(path):
            self.synced[path] = os.fstat(fd).st_size
            if path in self.rewritten:
                self.rewritten[path] = Path(path).read_bytes()

    def power_cut(self) -> None:
        for path, size in self.synced.items():
            if os.path.exists(path) and os.path.getsize(path) > size:
                os.truncate(path, size)
        for path, data in self.rewritten.items():
            if os.path.exists(path):
                Path(path).write_bytes(data)


@pytest.mark.parametrize(
    "durability, survive", [(Durability.FSYNC, 20), (Durability.BATCHED, 16)],
    ids=["fsync-keeps-every-ack", "batched-loses-only-its-window"])
def test_power_cut_drops_only_unsynced_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, durability: Durability, survive: int
) -> None:
    from agentjournal.store import jsonl

    cache = PageCache()
    monkeypatch.setattr(jsonl, "os", cache)
    store = JsonlStore(tmp_path / "runs", durability=durability, batch_every=8)
    for i in range(20):
        add(store, "r1", f"event {i}")  # each one acknowledged
    cache.power_cut()  # the machine dies; the process never closes the store
    monkeypatch.undo()
    after = JsonlStore(tmp_path / "runs")
    assert [e.payload["content"] for e in after.read("r1")] == [
        f"event {i}" for i in range(survive)]


def test_power_cut_tells_a_missing_fsync_from_a_real_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The negative control: a store that skips its fsync looks as good as a safe one
    # under kill -9, and loses acknowledged appends here.
    from agentjournal.store import jsonl

    cache = PageCache()
    monkeypatch.setattr(jsonl, "os", cache)
    store = JsonlStore(tmp_path / "runs")
    monkeypatch.setattr(store, "_sync", lambda fd: None)
    monkeypatch.setattr(store, "_datasync", lambda fd: None)
    for i in range(5):
        add(store, "r1", f"event {i}")
    cache.power_cut()
    monkeypatch.undo()
    assert len(list(JsonlStore(tmp_path / "runs").read("r1"))) < 5


# --- resuming after a snapshot: from its mark, not from byte 0 ----------------------------


def snapshotted(directory: Path) -> int:
    """A run of 4 + 2 events with a snapshot at seq 4 (its mark taken as it is written);
    returns the mark."""
    with JsonlStore(directory) as store:
        add(store, "r1", "one", "two")
        add(store, "r1", "three", "four")
        store.put_snapshot(snapshot_at("r1", 4))
        add(store, "r1", "five", "six")
    header = (directory / "r1.snapshots" / "000000000004-f1.snap").read_bytes().split(b"\n")[0]
    offset: int = json.loads(header)["log_offset"]
    return offset


def test_a_read_after_a_snapshot_starts_at_its_mark(tmp_path: Path) -> None:
    mark = snapshotted(tmp_path)
    log = tmp_path / "r1.jsonl"
    assert log.read_bytes()[mark - 1 : mark] == b"\n" and b"five" in log.read_bytes()[mark:]
    data = bytearray(log.read_bytes())
    data[data.index(b"two")] = ord("0")  # damage before the mark: its bytes are not read
    log.write_bytes(bytes(data))
    store = JsonlStore(tmp_path)
    with pytest.raises(CorruptLogError):
        list(store.read("r1"))
    (snapshot,) = store.snapshots("r1")
    tail = list(store.read("r1", after_seq=snapshot.seq))
    assert [e.payload["content"] for e in tail] == ["five", "six"]
    assert store.last_seq("r1") == 6  # known from the resumed read, no rescan from byte 0
    assert add(store, "r1", "seven") == 7
    store.close()


@pytest.mark.parametrize("bad", [-1, 3, 10**6], ids=["mid-record", "first-line", "past-end"])
def test_a_mark_that_does_not_check_out_is_not_used(tmp_path: Path, bad: int) -> None:
    mark = snapshotted(tmp_path)
    snap = tmp_path / "r1.snapshots" / "000000000004-f1.snap"
    header, body = snap.read_bytes().split(b"\n", 1)
    wrong = mark + bad if bad == -1 else bad
    snap.write_bytes(header.replace(b'"log_offset":%d' % mark, b'"log_offset":%d' % wrong)
                     + b"\n" + body)
    with JsonlStore(tmp_path) as store:
        (snapshot,) = store.snapshots("r1")
        tail = list(store.read("r1", after_seq=snapshot.seq))
        assert [e.payload["content"] for e in tail] == ["five", "six"]
        assert add(store, "r1", "seven") == 7
        assert [e.seq for e in store.read("r1")] == list(range(1, 8))


def test_an_appended_log_read_from_a_mark_chains_as_a_full_read_does(tmp_path: Path) -> None:
    snapshotted(tmp_path)
    with JsonlStore(tmp_path) as store:
        store.snapshots("r1")
        resumed = list(store.read("r1", after_seq=4))
        add(store, "r1", "seven")
    with JsonlStore(tmp_path) as fresh:
        full = list(fresh.read("r1"))
    assert full[4:6] == resumed and [e.seq for e in full] == list(range(1, 8))


# --- heads: <run>.head, written right after the batch it ends --------------------------


def test_a_log_one_batch_ahead_of_its_head_is_an_append_cut_off_before_its_head(
    tmp_path: Path,
) -> None:
    """A crash between a batch and its head leaves the log one whole batch ahead of a head
    that names where the batch starts: an append never acknowledged, which readers skip
    and the next writer cuts (as an incomplete one). Anything else ahead is refused."""
    directory = tmp_path / "runs"
    store = JsonlStore(directory)
    add(store, "r1", "a", "b")
    head_before = (directory / "r1.head").read_bytes()
    add(store, "r1", "c", "d")
    store.close()
    (directory / "r1.head").write_bytes(head_before)  # what a SIGKILL between the two leaves
    data = (directory / "r1.jsonl").read_bytes()
    reader = JsonlStore(directory, readonly=True)
    assert [e.seq for e in reader.read("r1")] == [1, 2] and reader.last_seq("r1") == 2
    assert list(reader.read("r1", after_seq=2)) == [] and len(reader.records("r1")) == 2
    assert (directory / "r1.jsonl").read_bytes() == data  # a reader never cuts
    writer = JsonlStore(directory)
    assert add(writer, "r1", "e") == 3  # the writer cuts the batch, then appends
    assert [r.reason for r in writer.repairs] == [
        "a complete batch past the run's head: a crash came between its write and its head's"]
    writer.close()
    assert [e.payload["content"] for e in JsonlStore(directory).read("r1")] == ["a", "b", "e"]
    add(JsonlStore(directory), "r1", "f")
    (directory / "r1.head").write_bytes(head_before)  # now two batches behind: damage
    with pytest.raises(CorruptLogError, match="goes on past its head"):
        list(JsonlStore(directory).read("r1"))
    (directory / "r1.head").unlink()  # a head deleted: damage too, named as such
    with pytest.raises(CorruptLogError, match="the head was deleted"):
        list(JsonlStore(directory).read("r1"))


def test_a_new_run_cut_off_before_its_first_head_has_no_events_yet(tmp_path: Path) -> None:
    directory = tmp_path / "runs"
    store = JsonlStore(directory)
    add(store, "r1", "a", "b")
    store.close()
    (directory / "r1.head").write_bytes(b"")  # created with the log, never written
    assert list(JsonlStore(directory).read("r1")) == []
    store = JsonlStore(directory)
    assert add(store, "r1", "c") == 1 and len(store.repairs) == 1


def old_batch(run_id: str, after: int, version: int, prev: str, *contents: str,
              ) -> tuple[bytes, str]:
    """A batch of user messages as a release writing ``version`` stored it (sealed from
    v4, without a digest before), framed; and the digest it ends with."""
    events = [msgspec.structs.replace(e, v=version) for e in make_events(
        run_id, after, 0, [(EventType.USER_MESSAGE, {"content": c}) for c in contents])]
    if version >= SEALED_SINCE:
        bodies, prev = seal(events, prev)
    else:
        bodies = [encode(e).replace(b'"digest":"",', b"", 1) for e in events]
    return _frame_batch(bodies), prev


def test_an_older_store_gets_its_heads_from_its_logs_at_its_first_writer(
    tmp_path: Path,
) -> None:
    """As 0.1.0 (v6, sealed, no heads) left a store, with a run from before sealing."""
    directory = tmp_path / "runs"
    directory.mkdir()
    first, digest = old_batch("r1", 0, 6, "", "a", "b")
    second, r1_digest = old_batch("r1", 2, 6, digest, "c")
    (directory / "r1.jsonl").write_bytes(first + second)
    r2, r2_digest = old_batch("r2", 0, 6, "", "x")
    (directory / "r2.jsonl").write_bytes(r2)
    (directory / "old.jsonl").write_bytes(old_batch("old", 0, 3, "", "o")[0])
    reader = JsonlStore(directory, readonly=True)  # reads it as it is, writes nothing
    assert reader.heads() == {} and len(list(reader.read("r1"))) == 3
    assert not (directory / "_store.json").exists()
    store = JsonlStore(directory)  # the first writer computes them, once
    assert store.heads() == {"r1": (3, r1_digest), "r2": (1, r2_digest), "old": (1, "")}
    # the oldest schema its events were written in: unsealed records are no damage
    info = json.loads((directory / "_store.json").read_bytes())
    assert info == {"created_schema": 3}
    assert [e.payload["content"] for e in store.read("old")] == ["o"]
    store.close()
    (directory / "r1.head").unlink()
    with pytest.raises(CorruptLogError, match="the head was deleted"):
        list(JsonlStore(directory, readonly=True).read("r1"))


_KILLED_BEFORE_ITS_HEAD = """
import sys, time
from agentjournal import EventType, make_events
from agentjournal.store.jsonl import JsonlStore
store = JsonlStore(sys.argv[1])
for seq in (0, 2):  # two batches of two, then the third's head never gets written
    facts = [(EventType.USER_MESSAGE, {"content": f"m{seq + i}"}) for i in (1, 2)]
    store.append("r1", make_events("r1", seq, 0, facts), expected_seq=seq, epoch=0)
def stop(*args, **kwargs):
    print("logged", flush=True)  # the batch is written and synced: die here
    time.sleep(600)
JsonlStore._write_head = stop
facts = [(EventType.USER_MESSAGE, {"content": "never acknowledged"})]
store.append("r1", make_events("r1", 4, 0, facts), expected_seq=4, epoch=0)
"""


def test_a_writer_killed_between_a_batch_and_its_head_loses_only_that_batch(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "runs"
    writer = subprocess.Popen([sys.executable, "-c", _KILLED_BEFORE_ITS_HEAD, str(directory)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout is not None and writer.stdout.readline() == "logged\n"
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=60)
    assert b"never acknowledged" in (directory / "r1.jsonl").read_bytes()
    assert [e.seq for e in JsonlStore(directory, readonly=True).read("r1")] == [1, 2, 3, 4]
    store = JsonlStore(directory)
    assert add(store, "r1", "next") == 5 and len(store.repairs) == 1
    assert [e.payload["content"] for e in store.read("r1")][-2:] == ["m4", "next"]
