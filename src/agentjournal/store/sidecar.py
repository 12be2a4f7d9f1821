"""A JSONL store's outlines and run listing: one SQLite file beside the logs, ``_outlines.db``.

JSONL appends write the log and its head, nothing more (a line and a fsync). Each run's
outline is caught up from its log when it is read: the sidecar records the seq each
outline is folded to (the cursor), a read folds the events after it, and a writable
handle keeps what it folded. It also keeps what listing a run reads from its log (last
seq, first and last timestamps) with the log file's identity, size and mtime when read:
a listing opens only the logs that changed since. The sidecar is only a cache: deleting
it loses nothing; a read-only handle reads it if it is there and writes nothing.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable
from contextlib import suppress
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

from ..projections import OUTLINE_VERSION, columns, encode
from ..state import RunState
from .base import RunInfo

NAME = "_outlines.db"  # "_" never starts a run id, so no run can collide

_SCHEMA = """
    CREATE TABLE IF NOT EXISTS outlines (
        run_id TEXT PRIMARY KEY,
        seq INTEGER NOT NULL,
        version INTEGER NOT NULL,
        attention INTEGER NOT NULL,
        body BLOB NOT NULL
    );
    CREATE TABLE IF NOT EXISTS tails (
        run_id TEXT PRIMARY KEY,
        inode INTEGER NOT NULL,
        size INTEGER NOT NULL,
        mtime_ns INTEGER NOT NULL,
        last_seq INTEGER NOT NULL,
        created_us INTEGER,
        updated_us INTEGER NOT NULL
    );
"""

#: A log file as stat() found it: (inode, size, mtime in ns). Any append changes it.
Stamp = tuple[int, int, int]
#: What listing reads from a log: (updated_us, run_id, last_seq, created_us), times in
#: µs since the epoch (a listing sorts thousands and builds RunInfos for the few shown).
Listed = tuple[int, str, int, int | None]

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)


def listed(info: RunInfo) -> Listed:
    created = None if info.created_at is None else (info.created_at - EPOCH) // _US
    assert info.updated_at is not None
    return (info.updated_at - EPOCH) // _US, info.run_id, info.last_seq, created


def run_info(row: Listed) -> RunInfo:
    updated, run_id, last_seq, created = row
    return RunInfo(run_id, last_seq, None if created is None else EPOCH + created * _US,
                   EPOCH + updated * _US)


class Sidecar:
    def __init__(self, directory: Path, *, readonly: bool) -> None:
        self.path = directory / NAME
        self.readonly = readonly
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        # A read-only handle's catches-up, kept for its next read (it writes nothing).
        self._held: dict[str, tuple[int, bytes, bool]] = {}
        self._held_tails: dict[str, tuple[Stamp, Listed]] = {}

    def _connect(self, *, create: bool = False) -> sqlite3.Connection | None:
        """The sidecar's connection; None while there is none to read (a writer makes
        it only to write in it: reading never creates it)."""
        if self._db is None:
            if not self.path.exists() and (self.readonly or not create):
                return None
            if self.readonly:
                uri = f"file:{quote(str(self.path.absolute()))}?mode=ro"
                self._db = sqlite3.connect(uri, uri=True, check_same_thread=False)
            else:
                self._db = sqlite3.connect(self.path, timeout=30, check_same_thread=False)
                # A rollback journal, not WAL: a read-only handle (mode=ro) then creates
                # and changes no file, where a WAL's readers write its -shm.
                with suppress(sqlite3.OperationalError):  # (busy: converted next time)
                    self._db.execute("PRAGMA journal_mode=DELETE")
                self._db.execute("PRAGMA synchronous=OFF")  # a cache: rebuilt if lost
                self._db.executescript(_SCHEMA)
        return self._db

    def _select(self, sql: str, params: tuple[object, ...] = ()) -> list[tuple[Any, ...]]:
        """The rows ``sql`` finds; none while there is no sidecar, or it is damaged,
        foreign or of an older release (a cache lost, never an error)."""
        with self._lock:
            db = self._connect()
            if db is None:
                return []
            with suppress(sqlite3.DatabaseError):
                return db.execute(sql, params).fetchall()
            return []

    def _write(self, sql: str, rows: list[tuple[Any, ...]]) -> None:
        if not rows:
            return
        with self._lock:
            db = self._connect(create=True)
            assert db is not None
            with db:
                db.executemany(sql, rows)

    def rows(self) -> dict[str, tuple[int, bytes, bool]]:
        """Each run's outline as stored: (seq, bytes, whether a person may be asked)."""
        found = self._select("SELECT run_id, seq, body, attention FROM outlines"
                             " WHERE version = ?", (OUTLINE_VERSION,))
        rows = {r[0]: (int(r[1]), bytes(r[2]), bool(r[3])) for r in found}
        with self._lock:
            return rows | self._held

    def put(self, outlines: Iterable[tuple[str, RunState]]) -> None:
        rows = [(run_id, st.last_seq, OUTLINE_VERSION, columns(st)["attention"], encode(st))
                for run_id, st in outlines]
        if self.readonly:
            with self._lock:
                self._held.update({r[0]: (r[1], r[4], r[3]) for r in rows})
            return
        self._write("INSERT OR REPLACE INTO outlines VALUES (?, ?, ?, ?, ?)", rows)

    def tails(self) -> dict[str, tuple[Stamp, Listed]]:
        """What listing each run read from its log, and the stamp its file had then."""
        found = self._select("SELECT * FROM tails")
        tails = {r[0]: ((r[1], r[2], r[3]), (r[6], r[0], r[4], r[5])) for r in found}
        with self._lock:
            return tails | self._held_tails

    def put_tails(self, tails: Iterable[tuple[Stamp, Listed]]) -> None:
        found = list(tails)
        if self.readonly:
            with self._lock:
                self._held_tails.update({row[1]: (stamp, row) for stamp, row in found})
            return
        self._write("INSERT OR REPLACE INTO tails VALUES (?, ?, ?, ?, ?, ?, ?)", [
            (run_id, *stamp, last_seq, created, updated)
            for stamp, (updated, run_id, last_seq, created) in found])

    def drop(self, run_id: str) -> None:
        if self.readonly or not self.path.exists():
            return
        with self._lock:
            db = self._connect()
            assert db is not None
            with db:
                for table in ("outlines", "tails"):
                    db.execute(f"DELETE FROM {table} WHERE run_id = ?", (run_id,))

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None
