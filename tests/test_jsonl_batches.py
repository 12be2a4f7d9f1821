"""JsonlStore batches on disk: a batch is read whole or not at all, only a writer cuts an
incomplete final batch, and damage to a complete record is refused wherever it is."""

from __future__ import annotations

import logging
import re
import zlib
from pathlib import Path
from typing import NamedTuple

import pytest
from click.testing import CliRunner

from agentjournal import CorruptLogError, EventType, make_events
from agentjournal.cli import cli
from agentjournal.events import seal
from agentjournal.store.jsonl import JsonlStore

from .builders import jsonl_store_with

SIZES = (1, 2, 3)  # events per batch; the last batch is the one torn


class Log(NamedTuple):
    directory: Path
    data: bytes
    ends: list[int]  # the byte offset where each batch ends

    @property
    def file(self) -> Path:
        return self.directory / "r1.jsonl"


def add(store: JsonlStore, run_id: str, *contents: str) -> int:
    last = store.last_seq(run_id)
    facts = [(EventType.USER_MESSAGE, {"content": c}) for c in contents]
    return store.append(run_id, make_events(run_id, last, 0, facts), expected_seq=last, epoch=0)


def contents(store: JsonlStore, after_seq: int = 0) -> list[str]:
    return [e.payload["content"] for e in store.read("r1", after_seq)]


def names(upto: int) -> list[str]:
    """The contents of the first ``upto`` batches of ``SIZES``."""
    return [f"b{b}.{i}" for b, size in enumerate(SIZES[:upto], 1) for i in range(1, size + 1)]


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> Log:
    directory = tmp_path_factory.mktemp("batches")
    ends = []
    with JsonlStore(directory) as store:
        for b, size in enumerate(SIZES, 1):
            add(store, "r1", *(f"b{b}.{i}" for i in range(1, size + 1)))
            ends.append((directory / "r1.jsonl").stat().st_size)
    return Log(directory, (directory / "r1.jsonl").read_bytes(), ends)


def copy(tmp_path: Path, name: str, data: bytes) -> Path:
    return jsonl_store_with(tmp_path / name, data)


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args), env={"COLUMNS": "200", "AGENTJOURNAL_STORE": ""})
    return result.exit_code, result.stdout + result.stderr


# --- the format ------------------------------------------------------------------------


def test_every_record_says_whether_its_batch_goes_on(log: Log) -> None:
    lines = log.data.splitlines(keepends=True)
    assert len(lines) == sum(SIZES)
    marks = []
    for line in lines:
        crc, rest = line.rstrip(b"\n").split(b" ", 1)
        assert crc == b"%08x" % zlib.crc32(rest)  # the checksum covers the mark
        marks.append(rest[:1])
        assert rest[1:2] == b"{"
    assert marks == [b".", b"+", b".", b"+", b"+", b"."]


def test_old_lines_are_one_record_batches(tmp_path: Path) -> None:
    # A file written before batch marks: ``<crc> <json>\n``, each line a batch of its own.
    events = make_events("r1", 0, 0, [(EventType.USER_MESSAGE, {"content": c}) for c in "ab"])
    bodies, _ = seal(events, "")
    old = b"".join(b"%08x %s\n" % (zlib.crc32(body), body) for body in bodies)
    directory = copy(tmp_path, "old", old)
    store = JsonlStore(directory)
    assert contents(store) == ["a", "b"] and store.last_seq("r1") == 2
    assert add(store, "r1", "c", "d") == 4  # new batches after old lines, one chain
    store.close()
    assert (directory / "r1.jsonl").read_bytes().startswith(old)
    assert contents(JsonlStore(directory)) == ["a", "b", "c", "d"]
    assert contents(JsonlStore(directory), after_seq=2) == ["c", "d"]
    torn = copy(tmp_path, "old-torn", old[:-5])
    assert contents(JsonlStore(torn)) == ["a"]


# --- 1. a torn batch is never half read ---------------------------------------------------


def test_a_torn_batch_is_not_read_in_part(tmp_path: Path, log: Log) -> None:
    # The first two records of the final batch are whole; its third never made it.
    lines = log.data.splitlines(keepends=True)
    data = b"".join(lines[:5])
    store = JsonlStore(copy(tmp_path, "torn", data))
    assert contents(store) == names(2)
    assert store.last_seq("r1") == 3


# --- 2. what is cut and what is refused ----------------------------------------------------


@pytest.mark.parametrize("garbage", [
    b"junk\nmore junk",
    b"\x00" * 300 + b"\n" + b"\x00" * 40,
    b"\xde\xad\xbe\xef\n\n\n",
    b"12345678\n",
])
def test_garbage_after_the_last_batch_is_cut_by_a_writer(
    tmp_path: Path, log: Log, garbage: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    directory = copy(tmp_path, "garbage", log.data + garbage)
    store = JsonlStore(directory)
    assert contents(store) == names(3)
    assert (directory / "r1.jsonl").read_bytes() == log.data + garbage
    with caplog.at_level(logging.WARNING, logger="agentjournal"):
        assert add(store, "r1", "next") == 7
    (repair,) = store.repairs
    assert (repair.offset, repair.dropped_bytes) == (len(log.data), len(garbage))
    assert "not a whole record" in repair.reason
    assert "incomplete final batch" in caplog.text
    assert contents(JsonlStore(directory)) == [*names(3), "next"]


def test_zeroed_block_inside_the_final_record_is_a_torn_write(tmp_path: Path, log: Log) -> None:
    # A power cut can leave the page with the newline on disk but not an earlier one,
    # which then reads as zeros: never a record as written (JSON escapes NUL).
    last = log.data[log.ends[1]:].splitlines(keepends=True)[-1]
    holed = last[:20] + b"\x00" * (len(last) - 21) + b"\n"
    data = log.data[: -len(last)] + holed
    directory = copy(tmp_path, "holed", data)
    store = JsonlStore(directory)
    assert contents(store) == names(2)
    assert add(store, "r1", "again") == 4
    (repair,) = store.repairs
    assert repair.offset == log.ends[1]


def test_a_record_after_bytes_that_are_not_one_is_corruption(tmp_path: Path, log: Log) -> None:
    # Junk is a torn tail only where nothing whole follows it.
    lines = log.data.splitlines(keepends=True)
    data = b"".join(lines[:3]) + b"junk\n" + b"".join(lines[3:])
    directory = copy(tmp_path, "junk", data)
    with pytest.raises(CorruptLogError) as info:
        JsonlStore(directory).last_seq("r1")
    assert info.value.seq == 4
    assert (directory / "r1.jsonl").read_bytes() == data


# --- 3. readers never write -----------------------------------------------------------------


def test_readers_leave_a_torn_log_byte_identical(tmp_path: Path, log: Log) -> None:
    data = log.data[:-7]  # the final batch torn inside its last record
    directory = copy(tmp_path, "torn", data)
    url = f"jsonl:///{directory}"
    store = JsonlStore(directory)
    assert contents(store) == names(2)
    assert contents(store, after_seq=1) == names(2)[1:]
    assert store.last_seq("r1") == 3
    assert [(r.run_id, r.last_seq) for r in store.list_runs()] == [("r1", 3)]
    assert store.snapshots("r1") == []
    assert invoke("show", "r1", "--store", url)[0] == 0
    code, out = invoke("verify", "r1", "--store", url)
    assert code == 0 and "3 events" in out
    assert invoke("runs", "--store", url)[0] == 0
    assert (directory / "r1.jsonl").read_bytes() == data
    assert store.repairs == []
    assert add(store, "r1", "next") == 4  # the writer cuts, then appends
    (repair,) = store.repairs
    assert (repair.offset, repair.dropped_bytes) == (log.ends[1], len(data) - log.ends[1])


def test_a_reader_and_a_writer_on_other_handles(tmp_path: Path, log: Log) -> None:
    directory = copy(tmp_path, "torn", log.data[:-1])
    reader, writer = JsonlStore(directory), JsonlStore(directory)
    assert reader.last_seq("r1") == 3
    assert add(writer, "r1", "w1", "w2") == 5
    assert reader.last_seq("r1") == 5  # its cached tail ended at the complete batches
    assert contents(reader) == [*names(2), "w1", "w2"]
    assert add(reader, "r1", "r") == 6 and reader.repairs == []


# --- 4. acceptance --------------------------------------------------------------------------


def test_final_batch_cut_at_every_byte(tmp_path: Path, log: Log) -> None:
    start = log.ends[1]
    assert SIZES[-1] >= 3
    for cut in range(start, len(log.data)):
        data = log.data[:cut]
        directory = copy(tmp_path, f"cut{cut}", data)
        store = JsonlStore(directory)
        assert contents(store) == names(2), cut
        assert store.last_seq("r1") == 3, cut
        assert (directory / "r1.jsonl").read_bytes() == data, cut
        assert store.repairs == []
        assert add(store, "r1", "x", "y", "z") == 6, cut
        assert [(r.offset, r.dropped_bytes) for r in store.repairs] == (
            [(start, cut - start)] if cut > start else [])
        store.close()
        reopened = JsonlStore(directory)
        assert contents(reopened) == [*names(2), "x", "y", "z"], cut
        assert add(reopened, "r1", "more") == 7 and reopened.repairs == []


def _flips(log: Log) -> list[tuple[int, int]]:
    """(byte offset, seq) of bit flips inside complete records: in the checksum, the mark,
    the JSON, the closing brace; in a middle record and in the last record of the file."""
    lines = log.data.splitlines(keepends=True)
    flips = []
    offset = 0
    for seq, line in enumerate(lines, 1):
        if seq in (2, 4, len(lines)):
            digit = next(i for i, c in enumerate(line[:8]) if chr(c) in "0123456789bcde")
            content = re.search(rb'"content":"', line)
            assert content is not None
            for at in (digit, 9, 10, content.end(), len(line) - 2):
                flips.append((offset + at, seq))
        offset += len(line)
    return flips


@pytest.mark.parametrize("touch", ["read", "read_tail", "last_seq", "append"])
def test_flipped_bit_in_a_complete_record_is_corruption(
    tmp_path: Path, log: Log, touch: str
) -> None:
    for at, seq in _flips(log):
        damaged = bytearray(log.data)
        damaged[at] ^= 0x01
        data = bytes(damaged)
        directory = copy(tmp_path, f"flip{at}", data)
        store = JsonlStore(directory)
        with pytest.raises(CorruptLogError) as info:
            if touch == "read":
                contents(store)
            elif touch == "read_tail":  # skipping decode never skips the checksum
                contents(store, after_seq=5)
            elif touch == "last_seq":
                store.last_seq("r1")
            else:
                add(store, "r1", "more")
        assert (info.value.run_id, info.value.seq) == ("r1", seq), (at, touch)
        assert (directory / "r1.jsonl").read_bytes() == data
        assert store.repairs == []


def test_any_flipped_bit_in_the_last_record_is_corruption(tmp_path: Path, log: Log) -> None:
    # Its checksum, the space, its mark, its JSON: only its newline is framing a flip
    # can take away (and then the record is indeed unfinished).
    start = log.data.rfind(b"\n", 0, len(log.data) - 1) + 1
    directory = jsonl_store_with(tmp_path / "flips", log.data)
    for at in range(start, len(log.data) - 1):
        for bit in range(8):
            damaged = bytearray(log.data)
            damaged[at] ^= 1 << bit
            (directory / "r1.jsonl").write_bytes(damaged)
            with pytest.raises(CorruptLogError) as info:
                JsonlStore(directory).last_seq("r1")
            assert info.value.seq == sum(SIZES), (at - start, bit)
            assert (directory / "r1.jsonl").read_bytes() == damaged


def test_a_damaged_run_is_listed_and_hides_no_other(tmp_path: Path, log: Log) -> None:
    damaged = bytearray(log.data)
    damaged[-5] ^= 0x01
    directory = copy(tmp_path, "damaged", bytes(damaged))
    add(JsonlStore(directory), "other", "fine")
    store = JsonlStore(directory)
    assert sorted((r.run_id, r.last_seq) for r in store.list_runs()) == [("other", 1), ("r1", 6)]
    with pytest.raises(CorruptLogError):
        contents(store)
    assert (directory / "r1.jsonl").read_bytes() == damaged
