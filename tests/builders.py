"""Small builders shared by the tests."""

from __future__ import annotations

import hashlib
import json
import threading
import time
import zlib
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
import pytest

from agentjournal.events import SCHEMA_VERSION, Event
from agentjournal.store.base import Snapshot

T0 = datetime(2025, 1, 1, tzinfo=UTC)


def snapshot_at(run_id: str, seq: int, body: bytes = b"state",
                fold_version: int = 1) -> Snapshot:
    """A snapshot record at ``seq`` (its created_at follows its seq, so order is fixed)."""
    return Snapshot(run_id=run_id, seq=seq, schema_version=2, fold_version=fold_version,
                    digest=hashlib.sha256(body).hexdigest(), body=body,
                    created_at=T0 + timedelta(seconds=seq))


def jsonl_store_with(directory: Path, log: bytes, run_id: str = "r1") -> Path:
    """A JSONL store (``directory``, created) whose run ``run_id`` has the file ``log``:
    the store's record, and the run's head at the last whole record that ends a batch,
    where this release's store leaves it when a later write is torn or damaged."""
    directory.mkdir()
    (directory / "_store.json").write_bytes(b'{"created_schema":%d}' % SCHEMA_VERSION)
    (directory / f"{run_id}.jsonl").write_bytes(log)
    head = (0, "")
    for line in log.split(b"\n")[:-1]:
        mark = line[9:10]
        if line[:8] == b"%08x" % zlib.crc32(line[9:]) and mark in (b".", b"{"):
            record = json.loads(line[10:] if mark == b"." else line[9:])
            head = (record["seq"], record.get("digest", ""))
    (directory / f"{run_id}.head").write_bytes(b"%020d %-32s\n" % (head[0], head[1].encode()))
    return directory


def unsealed(events: Iterable[Event]) -> list[Event]:
    """``events`` without the digests a store gave them, to compare with what was appended."""
    return [msgspec.structs.replace(e, digest="") for e in events]


class Crash(BaseException):
    """The process dies mid-call: nothing after the start is recorded."""


def in_one_group(store: Any, grouper: Any, calls: list[tuple[str, Any]],
                 monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, Any], int]:
    """Each call (a label, a function) made in a thread of its own while the first one's
    commit (``store._sync``) is held, so that all the others queue in ``grouper`` (a
    store's group.Grouper) and go in one group: (each label's result or error, the
    commits made)."""
    real_sync, held, entered, commits = store._sync, threading.Event(), threading.Event(), []

    def hold_first(*args: Any) -> Any:
        commits.append(1)
        if len(commits) == 1:
            entered.set()
            held.wait(60)
        return real_sync(*args)

    monkeypatch.setattr(store, "_sync", hold_first)
    outcome: dict[str, Any] = {}

    def call(label: str, fn: Any) -> None:
        try:
            outcome[label] = fn()
        except Exception as exc:
            outcome[label] = exc

    (label, fn), *rest = calls
    threads = [threading.Thread(target=call, args=(label, fn))]
    threads[0].start()
    assert entered.wait(60)
    threads += [threading.Thread(target=call, args=one) for one in rest]
    for t in threads[1:]:
        t.start()
    deadline = time.monotonic() + 60  # a hang guard
    while len(grouper._waiting) < len(rest):
        assert time.monotonic() < deadline, "the calls never queued"
        time.sleep(0.01)
    held.set()
    for t in threads:
        t.join(60)
    monkeypatch.setattr(store, "_sync", real_sync)
    return outcome, len(commits)


def drive_until(worker: Any, url: str, settled: Callable[[Any], bool]) -> None:
    """Run ``worker`` in a thread until ``settled(queue)``, then drain it (a hang guard
    of 60 s)."""
    from agentjournal import open_store
    from agentjournal.fleet import queue_of

    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        with open_store(url) as store:
            queue = queue_of(store)
            deadline = time.monotonic() + 60
            while not settled(queue):
                assert thread.is_alive() and time.monotonic() < deadline
                time.sleep(0.05)
    finally:
        worker.drain()
        thread.join(timeout=60)
