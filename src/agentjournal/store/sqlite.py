"""The embedded default: one SQLite file in WAL mode.

Appends run in ``BEGIN IMMEDIATE`` transactions, which take the write lock
before reading the log's last seq, so no stale read can slip past the
expected-seq check; the lease epoch is checked in the same transaction, and the
events' integer key (``run_no << 32 | seq``) enforces uniqueness underneath both.

Leases are judged by :func:`~.base.host_clock` (boot id + seconds since boot),
which every process on the host shares and no wall-clock change moves: a
worker whose wall clock runs an hour ahead must not take over a live run.
(WAL needs shared memory, so every user of the file is on this host.) A
deadline written under another boot id is over: its holder died with that
boot. Rows written before migration 4, or on a host without a boot id, carry
only the wall-clock ``expires_at``, and are judged by it.

Opened ``readonly``, the store changes nothing (see :func:`_readonly_uri` for how
SQLite's WAL files are handled), works on a read-only copy, and refuses writes.
A file is ours when its ``user_version`` is set (only our migrations set it); an
empty file, random bytes or another program's tables are ``NotAStoreError``,
never migrated into. A file with SQLite's header that SQLite cannot read is
damage (``CorruptStoreError``), not "not a store".
"""

from __future__ import annotations

import errno
import functools
import json
import logging
import os
import re
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

from ..errors import (
    ArchivedRunError,
    ConflictError,
    CorruptLogError,
    CorruptStoreError,
    DurabilityError,
    FencedError,
    JournalError,
    LeaseHeldError,
    LeaseReleasedError,
    NotArchivedError,
    NotAStoreError,
    ReadOnlyStoreError,
    ScopeSharedError,
    StoreIOError,
    StoreUnavailableError,
    StoreUrlError,
    UnsupportedVersionError,
)
from ..events import HEADS_SINCE, SCHEMA_VERSION, SEALED_SINCE, Event, now, seal, stored_digest
from ..projections import columns
from ..projections import encode as encode_outline
from ..state import RunState
from .base import (
    Durability,
    Head,
    Lease,
    RunInfo,
    Snapshot,
    Tombstone,
    UnanchoredStoreError,
    check_batch,
    check_head,
    check_records,
    decode_record,
    host_clock,
    lease_expiry,
    lease_left,
    records_digest,
    scope_started,
    validate_run_id,
)
from .group import GroupCommit, Grouper, Pending
from .outlined import (
    OUTLINE_VERSION,
    Kept,
    OutlineCache,
    Stored,
    base_outline,
    due,
    outline_after,
    project,
    served,
)


def _digest_of(body: str) -> str:
    """SQL for the digest a stored record ``body`` carries ('' if unsealed): a sealed
    record starts {"digest":"<32 hex>", so bytes 12 to 43 are its digest."""
    return (f"CASE WHEN substr({body}, 1, 11) = CAST('{{\"digest\":\"' AS BLOB)"
            f" THEN CAST(substr({body}, 12, 32) AS TEXT) ELSE '' END")


# Numbered, append-only migrations; PRAGMA user_version records how many ran.
MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE events (
        run_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        type TEXT NOT NULL,
        ts TEXT NOT NULL,
        body BLOB NOT NULL,
        PRIMARY KEY (run_id, seq)
    ) WITHOUT ROWID;
    CREATE TABLE leases (
        run_id TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        epoch INTEGER NOT NULL,
        expires_at REAL NOT NULL
    ) WITHOUT ROWID;
    """,
    """
    CREATE TABLE snapshots (
        run_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        fold_version INTEGER NOT NULL,
        schema_version INTEGER NOT NULL,
        digest TEXT NOT NULL,
        body BLOB NOT NULL,
        created_at TEXT NOT NULL,
        PRIMARY KEY (run_id, seq, fold_version)
    ) WITHOUT ROWID;
    CREATE TABLE quarantine (
        fold_version INTEGER PRIMARY KEY,
        reason TEXT NOT NULL,
        at TEXT NOT NULL
    );
    """,
    """
    CREATE TABLE scopes (
        scope TEXT NOT NULL,
        run_id TEXT NOT NULL,
        PRIMARY KEY (scope, run_id)
    ) WITHOUT ROWID;
    INSERT OR IGNORE INTO scopes SELECT coalesce(json_extract(CAST(body AS TEXT),
        '$.payload.scope'), 'run:' || run_id), run_id FROM events WHERE type = 'run_started';
    """,
    """
    ALTER TABLE leases ADD COLUMN boot_id TEXT;
    ALTER TABLE leases ADD COLUMN deadline REAL;
    """,
    # The queue of runs and the workers draining it (fleet/): see fleet/queue.py.
    """
    CREATE TABLE queue (
        run_id TEXT PRIMARY KEY,
        queue TEXT NOT NULL,
        priority INTEGER NOT NULL,
        agent TEXT NOT NULL,
        task TEXT NOT NULL,
        state TEXT NOT NULL,
        worker TEXT,
        parked_seq INTEGER NOT NULL DEFAULT 0,
        claims INTEGER NOT NULL DEFAULT 0,
        crashes INTEGER NOT NULL DEFAULT 0,
        submitted_at REAL NOT NULL,
        changed_at REAL NOT NULL
    ) WITHOUT ROWID;
    CREATE INDEX queue_open ON queue (queue, priority DESC, submitted_at) WHERE state != 'done';
    CREATE TABLE workers (
        worker_id TEXT PRIMARY KEY,
        info BLOB NOT NULL,
        heartbeat_at REAL NOT NULL
    ) WITHOUT ROWID;
    """,
    # Runs archived and deleted by gc (retention.py): see base.Tombstone.
    """
    CREATE TABLE tombstones (
        run_id TEXT PRIMARY KEY,
        last_seq INTEGER NOT NULL,
        digest TEXT NOT NULL,
        archive TEXT NOT NULL,
        deleted_at TEXT NOT NULL
    ) WITHOUT ROWID;
    """,
    # The parts snapshots refer to by digest (snapshots.py), so each is written once.
    """
    CREATE TABLE segments (
        run_id TEXT NOT NULL,
        digest TEXT NOT NULL,
        body BLOB NOT NULL,
        PRIMARY KEY (run_id, digest)
    ) WITHOUT ROWID;
    """,
    # Snapshot bodies and segments are blobs of kilobytes: in a rowid table their overflow
    # pages are full and the rest shares a leaf, where a WITHOUT ROWID table keeps under a
    # kilobyte in the leaf and leaves the last overflow page part empty (about 15% of
    # their pages at 1,000 steps; https://sqlite.org/withoutrowid.html, section 4).
    """
    CREATE TABLE snapshots_rowid (
        run_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        fold_version INTEGER NOT NULL,
        schema_version INTEGER NOT NULL,
        digest TEXT NOT NULL,
        body BLOB NOT NULL,
        created_at TEXT NOT NULL,
        UNIQUE (run_id, seq, fold_version)
    );
    INSERT INTO snapshots_rowid SELECT * FROM snapshots;
    DROP TABLE snapshots;
    ALTER TABLE snapshots_rowid RENAME TO snapshots;
    CREATE TABLE segments_rowid (
        run_id TEXT NOT NULL,
        digest TEXT NOT NULL,
        body BLOB NOT NULL,
        UNIQUE (run_id, digest)
    );
    INSERT INTO segments_rowid SELECT * FROM segments;
    DROP TABLE segments;
    ALTER TABLE segments_rowid RENAME TO segments;
    """,
    # Events keyed by one integer, run_no << 32 | seq, in a rowid table: SQLite appends to
    # a rowid tree's right edge without rebalancing its neighbours, and compares integers,
    # not text, so an append costs about a third less CPU and fewer pages than under the
    # WITHOUT ROWID (run_id, seq) key. A run's number is never reused (rows stay after gc).
    """
    CREATE TABLE run_numbers (
        run_no INTEGER PRIMARY KEY,
        run_id TEXT NOT NULL UNIQUE
    );
    INSERT INTO run_numbers (run_id) SELECT DISTINCT run_id FROM events ORDER BY run_id;
    CREATE TABLE events_by_key (
        key INTEGER PRIMARY KEY,
        ts TEXT NOT NULL,
        body BLOB NOT NULL
    );
    INSERT INTO events_by_key SELECT (n.run_no << 32) + e.seq, e.ts, e.body
        FROM events e JOIN run_numbers n USING (run_id) ORDER BY 1;
    DROP TABLE events;
    ALTER TABLE events_by_key RENAME TO events;
    """,
    # Why a worker parked a run (a refused agent ref, a poison run): see fleet/queue.py.
    """
    ALTER TABLE queue ADD COLUMN reason TEXT;
    """,
    # Each run's head (the seq and digest its log ends with), written by the statement
    # that appends (see _HEAD_TRIGGER), computed from the log here, once; and the schema
    # version the store was created at: in a store created sealed (v4 or later) an
    # unsealed record is damage. (For an older store, the oldest version it holds.)
    f"""
    CREATE TABLE heads (
        run_no INTEGER PRIMARY KEY,
        seq INTEGER NOT NULL,
        digest TEXT NOT NULL
    );
    INSERT INTO heads SELECT key >> 32, key & 4294967295, {_digest_of("body")}
        FROM events WHERE key IN (SELECT max(key) FROM events GROUP BY key >> 32);
    CREATE TABLE store_info (
        name TEXT PRIMARY KEY,
        value INTEGER NOT NULL
    ) WITHOUT ROWID;
    INSERT INTO store_info VALUES ('created_schema', coalesce((SELECT min(CASE WHEN
        json_valid(CAST(body AS TEXT)) THEN json_extract(CAST(body AS TEXT), '$.v') END)
        FROM events), {SCHEMA_VERSION}));
    """,
    # The version a run is pinned to (submit --pin-version): see fleet/queue.py.
    """
    ALTER TABLE queue ADD COLUMN pin_version TEXT;
    """,
    # Each run's outline (projections.py), written by the statement that appends when
    # due (see _head_trigger, outlined.due); filled from the logs once, when a writer
    # first opens an older store (SQLiteStore._project). No index on `attention`: a step
    # flips it (a call opens, then completes); the needs-a-person page scans the table.
    # And per-run views: caches a reader of one kind of run keeps beside its log (a
    # LangGraph thread's head).
    """
    CREATE TABLE IF NOT EXISTS outlines (
        run_no INTEGER PRIMARY KEY,
        seq INTEGER NOT NULL,
        version INTEGER NOT NULL,
        status TEXT NOT NULL,
        agent TEXT,
        attention INTEGER NOT NULL,
        body BLOB NOT NULL
    );
    CREATE TABLE IF NOT EXISTS views (
        run_no INTEGER NOT NULL,
        name TEXT NOT NULL,
        seq INTEGER NOT NULL,
        body BLOB NOT NULL,
        PRIMARY KEY (run_no, name)
    ) WITHOUT ROWID;
    """,
)
log = logging.getLogger("agentjournal")

_HEADS = 11  # the migration that added heads
_OUTLINES = 13  # the migration that added outlines
_PROJECTED = "outlines_projected"  # store_info: the OUTLINE_VERSION every run was given
_ADD_COLUMN = re.compile(r"\s*ALTER TABLE (\w+) ADD COLUMN (\w+)")


def _tables(names: set[str]) -> str:
    """"heads table" or "heads and store_info tables"."""
    return f"{' and '.join(sorted(names))} table{'s' if len(names) > 1 else ''}"

# A writer's connection moves a run's head with every row it appends to the run's log,
# in the same statement (so in the same transaction, at no extra round trip). A TEMP
# trigger: it lives only in this process's connection, so a row inserted by anyone else
# (the sqlite3 tool, say) moves no head, and the log no longer ends where its head says.
#
# Projecting, it also stores the outline of a batch that is due one (computed in Python
# and staged by the key of the batch's last row, see SQLiteStore._stage) when that row
# goes in: no statement of its own. A row inserted by anyone else stores none (the
# outline is then behind its head, and a read catches it up from the log).
def _kept_after(kept: Kept | None, state: RunState | None) -> Kept | None:
    """What the store holds of a run once a batch whose outline is ``state`` is in:
    that outline when it is due (see outlined.due), else what it held (None: a log that
    does not fold, or what it holds is not known)."""
    if state is None:
        return kept
    return (state.last_seq, state.status) if due(kept, state) else kept


def _head_trigger(projecting: bool) -> str:
    outline = f"""
        INSERT OR REPLACE INTO outlines SELECT NEW.key >> 32, NEW.key & {0xFFFFFFFF},
            {OUTLINE_VERSION}, aj_staged(NEW.key, 0), aj_staged(NEW.key, 1),
            aj_staged(NEW.key, 2), aj_staged(NEW.key, 3)
            WHERE aj_staged(NEW.key, 3) IS NOT NULL;"""
    return f"""
    CREATE TEMP TRIGGER IF NOT EXISTS move_head AFTER INSERT ON main.events BEGIN
        INSERT OR REPLACE INTO heads VALUES (NEW.key >> 32, NEW.key & {0xFFFFFFFF},
            {_digest_of("NEW.body")});
        {outline if projecting else ""}
    END
"""


_UNSTAGED = (None, None, None, None)

# A read-only handle cannot migrate a store an older release wrote: on a file from
# before migration _KEYED_EVENTS, temporary views (which shadow the file's tables and
# are gone on close) show its events keyed as that migration keys them, so every query
# reads it. Slower (the key is computed, not indexed): for reading an old backup, or a
# store no writer has opened since an upgrade.
_KEYED_EVENTS = 9
_KEYED_VIEWS = """
    CREATE TEMP VIEW run_numbers AS SELECT row_number() OVER (ORDER BY run_id) AS run_no,
        run_id FROM (SELECT DISTINCT run_id FROM main.events);
    CREATE TEMP VIEW events AS SELECT (n.run_no << 32) + e.seq AS key, e.ts, e.body
        FROM main.events e JOIN run_numbers n USING (run_id);
"""

# A run's events are the key range run_no << 32 .. run_no << 32 | 0xFFFFFFFF; seq is the
# key's low 32 bits.
MAX_SEQ = 0xFFFFFFFF


def _keys_from(base: str, after: str = "0", upto: str = str(MAX_SEQ)) -> str:
    """The SQL condition on events.key that holds for the events of the run whose key
    base is the SQL ``base``, from seq ``after`` to seq ``upto``."""
    return f"key BETWEEN {base} + {after} AND {base} + {upto}"


def in_run(run: str = ":run", after: str = "0", upto: str = str(MAX_SEQ)) -> str:
    """The condition for run ``run``'s events from seq ``after`` to ``upto`` (all SQL: a
    parameter or a column), its base found from the run id by a scalar subquery that
    SQLite evaluates once per statement."""
    return _keys_from(f"(SELECT run_no << 32 FROM run_numbers WHERE run_id = {run})", after,
                      upto)


def last_seq_of(run: str) -> str:
    """A scalar subquery: run ``run``'s last seq, 0 if it has no events."""
    return f"(SELECT coalesce(max(key) & {MAX_SEQ}, 0) FROM events WHERE {in_run(run)})"


_HEADER = b"SQLite format 3\x00"
# SQLite's primary result codes for the OS's refusals, as the errno they stand for.
_ERRNO = {sqlite3.SQLITE_FULL: errno.ENOSPC, sqlite3.SQLITE_READONLY: errno.EROFS,
          sqlite3.SQLITE_PERM: errno.EACCES, sqlite3.SQLITE_CANTOPEN: errno.EACCES}


def _readonly_uri(path: Path, header: bytes | None) -> str:
    """How to open ``path`` for reading without creating or changing any file.

    A rollback-journal database is read with ``mode=ro``: that creates nothing. A
    WAL database whose ``-wal`` holds data or whose ``-shm`` exists (a live writer,
    or one that was killed) is read with ``mode=ro&readonly_shm=1``: SQLite then
    never writes the ``-shm`` (with no other connection it reads the WAL into its
    own memory), and a read-only connection never checkpoints on close, so the
    database, ``-wal`` and ``-shm`` stay byte-identical. (That needs the ``-shm``:
    without it the open fails, see ``_unreadable_wal``.) A WAL database with neither
    file, in a writable directory, is opened read-write with ``query_only`` (it cannot
    write): the ``-wal`` and ``-shm`` it makes hold nothing and the last connection to
    close removes them. On a read-only directory (a backup, a forensic mount) it is
    opened ``immutable``: nothing can change the file there, so no locks, no ``-shm``.
    ``header``: the file's first 100 bytes (None: a store of this process has it open).
    """
    quoted = sqlite3_path(path)
    in_wal = header is None or (len(header) >= 20 and header[18] == 2)  # 18: read version
    if not in_wal:  # (None: open here already, by a store, and writable stores use WAL)
        return f"file:{quoted}?mode=ro"
    wal, shm = Path(f"{path}-wal"), Path(f"{path}-shm")
    if shm.exists() or (wal.exists() and wal.stat().st_size):
        return f"file:{quoted}?mode=ro&readonly_shm=1"
    if os.access(path.absolute().parent, os.W_OK):
        return f"file:{quoted}?mode=rw"
    return f"file:{quoted}?mode=ro&immutable=1"


# A database file is never opened here by anything but SQLite while this process has it
# open: closing any descriptor of a file drops every POSIX lock the process holds on it,
# SQLite's included, so another process could then change the database under a live
# transaction (https://www.sqlite.org/howtocorrupt.html, 2.2). Files with an open store,
# by (device, inode); the lock also orders a header read before a connection's locks.
_OPEN: Counter[tuple[int, int]] = Counter()
_OPEN_LOCK = threading.Lock()
# Files a read-only handle of this process reads with ``readonly_shm``. SQLite maps a
# file's -shm once per process, for all its connections, read-only when the first
# connection to map it asked so: a writer opened beside such a reader would get that
# read-only mapping and could write nothing. A reader opened while a writer of this
# process holds the file shares the writer's mapping, and is not counted.
_SHM_READERS: Counter[tuple[int, int]] = Counter()
_WRITERS: Counter[tuple[int, int]] = Counter()


def _file_id(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)  # stat opens nothing
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def _peek(path: Path, size: int) -> bytes | None:
    """The file's first ``size`` bytes; None when a store of this process has it open
    (it is a store then, and reading it outside SQLite could drop SQLite's locks)."""
    with _OPEN_LOCK:
        ident = _file_id(path)
        if ident is not None and _OPEN[ident]:
            return None
        with path.open("rb") as f:
            return f.read(size)


def sqlite3_path(path: Path) -> str:
    """``path`` quoted for a ``file:`` URI (?, # and % are special there)."""
    return quote(str(path.absolute()), safe="/")


_DIGESTS = 4096  # runs whose last digest a handle remembers (for _append_alone)
_ALONE_MAX = 16  # events in a warm append made one statement (more: a transaction)
_ROW_NAMES = [(f"k{i}", f"t{i}", f"b{i}") for i in range(_ALONE_MAX)]  # see _alone


# Another run of scope :scope than :run (an append ``alone_in`` it is refused).
_SHARED = "SELECT 1 FROM scopes WHERE scope = :scope AND run_id <> :run"


@functools.cache
def _alone(n: int, only_run_of_scope: bool = False) -> str:
    """A warm append of ``n`` events, its own transaction (see
    SQLiteStore._append_alone): row i is (:k<i>, :t<i>, :b<i>), the first key :key.
    A sealed record starts {"digest":"<32 hex>": bytes 12 to 43 are its digest."""
    rows = ", ".join(f"(:k{i}, :t{i}, :b{i})" for i in range(n))
    return (
        f"INSERT INTO events SELECT * FROM (VALUES {rows})"
        f" WHERE (SELECT max(key) FROM events WHERE {_keys_from(':base')})"
        " = :key - 1 AND (SELECT substr(body, 12, 32) FROM events WHERE key = :key - 1)"
        " = :prev AND (SELECT coalesce(max(epoch), 0) FROM leases WHERE run_id = :run) = :epoch"
        + (f" AND NOT EXISTS ({_SHARED})" if only_run_of_scope else "")
    )


class _AllRefused(Exception):
    """Every append of a group was refused: its transaction rolls back."""


_ENDS = ("SELECT n.run_id, n.run_no << 32, e.key, e.body,"
         " (SELECT coalesce(max(epoch), 0) FROM leases WHERE run_id = n.run_id)"
         " FROM run_numbers n LEFT JOIN events e ON e.key = (SELECT max(key) FROM events"
         f" WHERE {_keys_from('(n.run_no << 32)')})"
         " WHERE n.run_id IN ({runs})")
_END_OF_ONE = _ENDS.format(runs="?")
_END_OF_MANY = _ENDS.format(runs="SELECT value FROM json_each(?)")  # a JSON array of ids


@dataclass(slots=True)
class _End:
    """Where a run's log ends: its key base (run_no << 32), last seq and digest, and its
    lease's epoch."""

    base: int
    last: int
    digest: str
    epoch: int


def _ends(db: sqlite3.Connection, run_ids: list[str]) -> dict[str, _End]:
    """Each run's end, in one statement however many runs a group holds (every run
    has its number already)."""
    rows = (db.execute(_END_OF_ONE, run_ids) if len(run_ids) == 1
            else db.execute(_END_OF_MANY, (json.dumps(run_ids),)))
    return {run_id: _End(base, key - base if key is not None else 0,
                         stored_digest(body) if body is not None else "", epoch)
            for run_id, base, key, body, epoch in rows}


def _number(db: sqlite3.Connection, run_ids: list[str]) -> None:
    """Give each of ``run_ids`` that has none a run number (kept for good)."""
    if run_ids:
        db.executemany("INSERT OR IGNORE INTO run_numbers (run_id) VALUES (?)",
                       [(run_id,) for run_id in run_ids])


def _stamps(events: Sequence[Event]) -> list[str]:
    """Each event's time as stored; a batch mostly shares one, formatted once."""
    last, text, out = None, "", []
    for event in events:
        if event.ts != last:
            last, text = event.ts, event.ts.isoformat()
        out.append(text)
    return out


def _refuse_archived(db: sqlite3.Connection, run_id: str) -> None:
    """ArchivedRunError if gc deleted the run (asked only of a run with no events)."""
    stone = db.execute("SELECT archive, last_seq FROM tombstones WHERE run_id = ?",
                       (run_id,)).fetchone()
    if stone is not None:
        raise ArchivedRunError(run_id, *stone)


@dataclass(slots=True)
class _Append:
    """One append waiting for its group's commit."""

    run_id: str
    events: Sequence[Event]
    expected_seq: int
    epoch: int
    alone_in: str | None = None


class SQLiteStore:
    #: A log folded at open without looking for a snapshot, at most (journal.SHORT_LOG):
    #: the look is a local query, and from 16 events a snapshot is the cheaper load.
    short_log = 16

    def __init__(
        self,
        path: str | Path,
        *,
        durability: Durability = Durability.FSYNC,
        busy_timeout: float = 30.0,
        readonly: bool = False,
        group_commit: GroupCommit = GroupCommit.ON,
    ) -> None:
        self.path = Path(path)
        self.group_commit = GroupCommit(group_commit)  # see store/group.py
        self.url = f"sqlite:///{self.path}"
        self.durability = Durability(durability)
        self.readonly = readonly
        self._lock = threading.RLock()
        self._broken: str | None = None
        # Appends that meet commit together (see append): one sync serves them all.
        self._grouper = Grouper(self._commit_group, alone=self.group_commit is GroupCommit.OFF)
        # Each run's key base and last digest, as this handle saw them (see _append_alone).
        self._known: dict[str, tuple[int, str]] = {}
        # Each run's outline after this handle's last append to it.
        self._outlines = OutlineCache()
        self._projecting = False  # whether appends store outlines (a writer's handle)
        self._armed = False  # whether the head's trigger is created (see _arm)
        # The outlines of the batches about to go in, by their last row's key: (status,
        # agent, attention, bytes), read by the head's trigger (see _head_trigger).
        self._staged: dict[int, tuple[str, str | None, int, bytes]] = {}
        where = str(self.path.absolute())
        if self.path.is_dir():
            raise StoreUrlError(where, "the path is a directory, not a database file")
        if readonly and not self.path.is_file():
            raise StoreUrlError(where, "no database file there; a store is created by its "
                                "first run or by `agentjournal init`")
        #: A 0-byte file: a store whose creation did not finish (see _refuse_foreign_file).
        self.unfinished = False
        self._header: bytes | None = None  # the file's first bytes, read before it opens
        try:
            self.unfinished = self._refuse_foreign_file()
            if readonly and self.unfinished:
                self._connect_unfinished()
                return
            if readonly:
                self._connect(self._readonly_target(), busy_timeout, uri=True)
                version = self._check_version(writing=False)
                if version < _KEYED_EVENTS:
                    self._db.executescript(_KEYED_VIEWS)
                self._db.execute("PRAGMA query_only=ON")
                self._learn_heads(version)
                return
            self._refuse_beside_a_reader()
            self._connect(self.path, busy_timeout)
            version = self._check_version(writing=True)
            self._enable_wal(busy_timeout)
            sync = "FULL" if self.durability is Durability.FSYNC else "NORMAL"
            self._db.execute(f"PRAGMA synchronous={sync}")
            if version < len(MIGRATIONS):  # (checked again under the write lock)
                self._migrate()
            self._learn_heads(len(MIGRATIONS))
            self._projecting = self._outlined  # (not in a test's older store)
            staged = self._staged
            self._db.create_function("aj_staged", 2, lambda key, i: staged.get(
                key, _UNSTAGED)[i], deterministic=True)
            if self._projecting and self._store_info.get(_PROJECTED) != OUTLINE_VERSION:
                self._project()
        except sqlite3.OperationalError as exc:  # the OS's or a lock's doing
            self._close_quietly()
            if not readonly and not self._can_write():
                raise ReadOnlyStoreError(where, "open it for writing", reason=(
                    f"the file or its directory is not writable ({exc})")) from None
            if readonly and self._unreadable_wal():
                raise StoreUrlError(where, f"its write-ahead log {self.path}-wal holds data "
                                    "that SQLite reads only through a -shm file, which is "
                                    "missing (and reading never creates one): copy the store "
                                    "with its -wal and -shm files, or open it once for writing "
                                    "(e.g. `agentjournal init`), which merges the -wal into "
                                    "the database") from None
            raise StoreUrlError(where, f"cannot open the database ({exc})") from None
        except sqlite3.DatabaseError as exc:  # SQLite's header, unreadable content: damage
            self._close_quietly()
            raise CorruptStoreError(where, f"SQLite cannot read it ({exc})") from None
        except BaseException:
            self._close_quietly()
            raise

    def _can_write(self) -> bool:
        """Whether SQLite could write here: the file (if any) and its directory, where
        the WAL and shared-memory files live. access() also sees a read-only mount."""
        directory = self.path.absolute().parent
        exists = self.path.exists()
        return os.access(directory, os.W_OK) and (not exists or os.access(self.path, os.W_OK))

    def _unreadable_wal(self) -> bool:
        wal, shm = Path(f"{self.path}-wal"), Path(f"{self.path}-shm")
        return wal.exists() and wal.stat().st_size > 0 and not shm.exists()

    def _readonly_target(self) -> str:
        try:
            return _readonly_uri(self.path, self._header)
        except OSError as exc:
            raise StoreUrlError(self.url, f"cannot read the file ({exc.strerror})") from None

    def _connect(self, target: str | Path, busy_timeout: float, *, uri: bool = False) -> None:
        """Connect, and count the file as open in this process before any statement
        can take a lock on it (see ``_peek``)."""
        self._db = sqlite3.connect(target, uri=uri, timeout=busy_timeout,
                                   isolation_level=None, check_same_thread=False)
        self._writer = not uri
        with _OPEN_LOCK:
            self._ident = _file_id(self.path)
            self._shm_reader = ("readonly_shm=1" in str(target) and self._ident is not None
                                and not _WRITERS[self._ident])
            if self._ident is not None:
                _OPEN[self._ident] += 1
                _SHM_READERS[self._ident] += self._shm_reader
                _WRITERS[self._ident] += self._writer

    def _disconnect(self) -> None:
        self._db.close()
        with _OPEN_LOCK:
            ident, self._ident = getattr(self, "_ident", None), None
            if ident is not None:
                _OPEN[ident] -= 1
                if not _OPEN[ident]:
                    del _OPEN[ident]
                for counted, held in ((_SHM_READERS, self._shm_reader),
                                      (_WRITERS, self._writer)):
                    if held:
                        counted[ident] -= 1
                        if not counted[ident]:
                            del counted[ident]

    def _refuse_beside_a_reader(self) -> None:
        """A writer cannot share this process's read-only mapping of the -shm (see
        _SHM_READERS): say so, rather than fail at the first write."""
        ident = _file_id(self.path)
        with _OPEN_LOCK:
            if ident is not None and _SHM_READERS[ident]:
                raise StoreUrlError(str(self.path.absolute()), "a read-only handle of this "
                                    "process reads it (with its WAL's shared memory read-only, "
                                    "which SQLite shares between the connections of a "
                                    "process): close that handle before opening one to write")

    def _close_quietly(self) -> None:
        if getattr(self, "_db", None) is not None:
            self._disconnect()

    def _refuse_foreign_file(self) -> bool:
        """A file that exists but is no SQLite database (random bytes, text) is not ours.
        True for an empty file without a WAL holding data: a store whose creation did not
        finish (SQLite writes nothing before its first write, so a process killed in
        between leaves 0 bytes). Every handle takes it as a store with nothing in it yet:
        a writer completes it, a reader reads it as empty and changes nothing."""
        try:  # (the first 100 bytes: _readonly_uri reads the journal mode there)
            self._header = _peek(self.path, 100)
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise StoreUrlError(self.url, f"cannot read the file ({exc.strerror})") from None
        if self._header is None:
            return False  # open in this process already: a store
        if not self._header:
            wal = Path(f"{self.path}-wal")
            return not (wal.exists() and wal.stat().st_size)
        if self._header[:len(_HEADER)] != _HEADER:
            raise NotAStoreError(str(self.path.absolute()),
                                 "it is not an SQLite database")
        return False

    def _learn_heads(self, version: int) -> None:
        """Whether the file keeps heads (a read-only handle on an older file reads without
        them, refusing any record only a release keeping heads writes), and whether it was
        created sealed. The tables holding them must be there exactly when the migration
        count says: one dropped (or the count turned back) unanchors every run's newest
        events, so the store is refused as damaged."""
        self._heads = version >= _HEADS
        self._heads_missing = None if self._heads else (
            f"no heads table, which migration {_HEADS} makes")
        tables = {name for (name,) in self._db.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'"
            " AND name IN ('heads', 'store_info')")}
        if self._heads and (missing := {"heads", "store_info"} - tables):
            raise UnanchoredStoreError(str(self.path.absolute()), (
                f"its {_tables(missing)} {'are' if len(missing) > 1 else 'is'} missing, though its "
                f"migrations ({version}) include the one that keeps each run's head "
                f"(migration {_HEADS}): it was dropped, and with it what every run's newest "
                "events are checked against"))
        if not self._heads and tables:
            raise UnanchoredStoreError(str(self.path.absolute()), (
                f"its migration count ({version}) is older than the heads (migration "
                f"{_HEADS}), yet it holds the {_tables(tables)} that "
                "migration makes: the count was turned back"))
        self._store_info = dict(self._db.execute("SELECT name, value FROM store_info")
                                ) if self._heads else {}
        self._sealed = self._heads and self._store_info["created_schema"] >= SEALED_SINCE
        # Whether it keeps outlines and views (a read-only handle on an older file folds
        # every run).
        self._outlined = version >= _OUTLINES

    def _connect_unfinished(self) -> None:
        """Read an unfinished store as what its creation would have made: an empty store
        of the current schema, in memory, so the file is not even opened by SQLite."""
        self._db = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        self._ident = None
        for script in MIGRATIONS:
            self._db.executescript(script)
        self._db.execute("PRAGMA query_only=ON")
        self._learn_heads(len(MIGRATIONS))

    def _check_version(self, *, writing: bool) -> int:
        """Refuse another program's database, and one from a newer release; the
        number of migrations that ran."""
        version, tables = self._count_and_tables()
        if version == 0:
            where = str(self.path.absolute())
            if tables:
                raise NotAStoreError(where, f"an SQLite database of another program, with "
                                     f"tables {tables}; agentjournal adds none to it")
            if not writing:
                raise NotAStoreError(where, "an SQLite database with no agentjournal tables")
        elif version > len(MIGRATIONS):
            raise UnsupportedVersionError(f"store {self.url}", version, len(MIGRATIONS))
        return int(version)

    def _count_and_tables(self) -> tuple[int, str | None]:
        """The migration count and the first few tables, in one snapshot: a concurrent
        first migration is all or none. (The count read alone first, outside it, let a
        process racing another's first migration see the tables and no count.)"""
        self._db.execute("BEGIN")
        try:
            (version,) = self._db.execute("PRAGMA user_version").fetchone()
            tables = self._db.execute(
                "SELECT group_concat(name, ', ') FROM (SELECT name FROM sqlite_master"
                " WHERE type = 'table' ORDER BY name LIMIT 5)").fetchone()[0]
        finally:
            if self._db.in_transaction:  # (an error may have rolled it back: keep that one)
                self._db.execute("COMMIT")
        return int(version), tables

    def _translated(self, exc: sqlite3.OperationalError, action: str) -> JournalError:
        """SQLite's operational failure as one of ours: a lock held past the busy timeout
        is retryable; the rest are the OS refusing (a full disk, a read-only file)."""
        code = (getattr(exc, "sqlite_errorcode", 0) or 0) & 0xFF
        if code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
            return StoreUnavailableError(self.url, f"another connection held the database "
                                         f"locked past the busy timeout ({exc})")
        return StoreIOError(self.url, action, OSError(_ERRNO.get(code, errno.EIO), str(exc)))

    def _writable(self, action: str, run_id: str | None = None) -> None:
        if self.readonly:
            raise ReadOnlyStoreError(self.url, action, run_id=run_id)

    def _enable_wal(self, timeout: float) -> None:
        """Switch to WAL mode. Processes opening a new file together can get SQLITE_BUSY
        here without SQLite's busy handler waiting, so wait for the lock ourselves."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._db.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as exc:
                busy = exc.sqlite_errorcode & 0xFF == sqlite3.SQLITE_BUSY
                if not busy or time.monotonic() > deadline:
                    raise
                time.sleep(0.005)

    def _migrate(self) -> None:
        with self._tx():
            (version,) = self._db.execute("PRAGMA user_version").fetchone()
            for number, script in enumerate(MIGRATIONS[version:], start=version + 1):
                if number == _HEADS:
                    self._refuse_unanchored(version)
                for statement in filter(str.strip, script.split(";")):
                    if not self._column_there(statement):
                        self._db.execute(statement)
                self._db.execute(f"PRAGMA user_version={number}")

    def _column_there(self, statement: str) -> bool:
        """An ADD COLUMN whose column is there already (a file whose migration count was
        turned back): skipped, as PostgreSQL's ADD COLUMN IF NOT EXISTS is."""
        added = _ADD_COLUMN.match(statement)
        return added is not None and any(
            row[1] == added[2] for row in self._db.execute(f"PRAGMA table_info({added[1]})"))

    def _refuse_unanchored(self, version: int) -> None:
        """Before the heads migration computes heads from the logs: a file holding a record
        only a release keeping heads writes had them, and its heads were removed (with the
        migration count turned back). No head computed from its logs may anchor them."""
        found = self._db.execute(
            "SELECT key >> 32, key & 4294967295 FROM events WHERE json_valid(CAST(body AS"
            " TEXT)) AND json_extract(CAST(body AS TEXT), '$.v') >= ? LIMIT 1",
            (HEADS_SINCE,)).fetchone()
        if found is not None:
            (run_id,) = self._db.execute("SELECT run_id FROM run_numbers WHERE run_no = ?",
                                         (found[0],)).fetchone()
            raise UnanchoredStoreError(str(self.path.absolute()), (
                f"its migration count ({version}) is older than the heads (migration "
                f"{_HEADS}), yet run {run_id!r} holds records that only releases keeping "
                f"heads write (seq {found[1]} is one): its heads were removed"))

    @contextmanager
    def _tx(self, *, light: bool = False) -> Iterator[sqlite3.Connection]:
        """A write transaction holding the database's write lock from its first read.

        ``light``: its COMMIT does not sync (synchronous=NORMAL for it alone), for lease
        writes. The WAL is written in order and the next synced commit syncs it whole, so
        the lease is durable before any append made under it is acknowledged; and if a
        power cut takes it, every process that could hold it on this host died too."""
        self._writable("write")
        with self._lock:
            if self._broken:
                raise DurabilityError(self._broken)
            if light and self.durability is Durability.FSYNC:
                self._db.execute("PRAGMA synchronous=NORMAL")
                try:
                    with self._tx() as db:
                        yield db
                finally:
                    self._db.execute("PRAGMA synchronous=FULL")
                return
            try:
                self._db.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                raise self._translated(exc, "write") from exc
            try:
                yield self._db
            except BaseException as exc:
                if self._db.in_transaction:  # (SQLite may have rolled back already)
                    self._db.execute("ROLLBACK")
                if isinstance(exc, sqlite3.OperationalError):
                    raise self._translated(exc, "write") from exc
                raise
            self._commit()

    def _commit(self, statement: str = "COMMIT", params: Mapping[str, Any] | None = None,
                *, alone: bool = False) -> int:
        """Run the durability point; its row count. Whatever fails there leaves
        durability unknown: never retried into success, the handle is closed for writes.
        Except a statement ``alone`` (its own transaction) that found the database busy
        or locked: that one never started."""
        try:
            return self._sync(statement, params)
        except sqlite3.OperationalError as exc:
            code = (getattr(exc, "sqlite_errorcode", 0) or 0) & 0xFF
            if alone and code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
                raise self._translated(exc, "write") from exc
            raise self._broke(exc) from exc
        except Exception as exc:
            raise self._broke(exc) from exc

    def _broke(self, exc: Exception) -> DurabilityError:
        self._broken = f"commit failed: {exc}"
        if self._db.in_transaction:
            self._db.execute("ROLLBACK")
        return DurabilityError(self._broken)

    def _sync(self, statement: str = "COMMIT", params: Mapping[str, Any] | None = None) -> int:
        """The durability point (a fault-injection seam for tests): a transaction's
        COMMIT, or a statement that is its own transaction. Its row count."""
        return self._db.execute(statement, params or {}).rowcount

    # --- the log ---------------------------------------------------------------

    def append(
        self, run_id: str, events: Sequence[Event], *, expected_seq: int, epoch: int,
        alone_in: str | None = None,
    ) -> int:
        """Append ``events`` atomically. Group commit: appends that arrive while another
        group commits wait, then go together in the next transaction, one sync for all;
        each is checked on its own, so one refused batch never takes others down.
        Nothing returns before the COMMIT that holds it."""
        validate_run_id(run_id)
        check_batch(run_id, events, expected_seq, epoch)
        if events[-1].seq > MAX_SEQ:
            raise ValueError(f"run {run_id!r}: an SQLite store keeps at most {MAX_SEQ:,} "
                             "events per run")
        self._grouper.submit(_Append(run_id, events, expected_seq, epoch, alone_in))
        return events[-1].seq

    def _commit_group(self, group: list[Pending]) -> None:
        """Commit ``group`` (each a :class:`_Append`) in one transaction; an append
        refused on its own gets its error, and the commit's error is every one's (then
        nothing of the group was committed). A lone warm append tries one statement
        first (see _append_alone)."""
        self._arm()
        try:
            if (len(group) == 1 and self.group_commit is not GroupCommit.ALWAYS
                    and self._append_alone(group[0].item)):
                return
            with self._tx() as db:
                ends, outlines = self._insert(db, group)
                if not ends:
                    raise _AllRefused  # nothing to commit: roll back, no sync
            if len(self._known) > _DIGESTS:  # a hint, not a record: start again
                self._known.clear()
            self._known.update(ends)
            for run_id, (seq, _, body, kept) in outlines.items():
                self._outlines.put(run_id, seq, body, kept)
        except _AllRefused:
            pass
        except BaseException:
            for pending in group:
                self._known.pop(pending.item.run_id, None)
                self._outlines.drop(pending.item.run_id)
            raise

    def _arm(self) -> None:
        """Create the head's trigger (see _head_trigger) before this handle's first
        insert: a handle that only reads (a LangGraph thread's fresh handle, most CLI
        commands) never compiles it."""
        if not self._armed and not self.readonly:  # (a reader's append is refused later)
            with self._lock:
                self._db.execute(_head_trigger(self._projecting))
                self._armed = True

    def _append_alone(self, one: _Append) -> bool:
        """A warm append as one statement that is its own transaction: it inserts only
        if the run still ends at the expected seq, with the digest this handle saw it
        end with, under the same lease epoch. False if it could not be tried or
        inserted nothing (which changed nothing): the transaction's way then appends or
        says why not. An error other than a busy database leaves the outcome unknown, as
        a failed COMMIT does, and breaks the handle."""
        known, events = self._known.get(one.run_id), one.events
        if (known is None or one.expected_seq == 0 or len(events) > _ALONE_MAX
                or scope_started(events) is not None):
            return False
        base, prev = known
        bodies, digest = seal(events, prev)
        params: dict[str, Any] = {"run": one.run_id, "key": base + events[0].seq,
                                  "base": base, "prev": prev.encode("ascii"),
                                  "epoch": one.epoch, "scope": one.alone_in}
        names = _ROW_NAMES[:len(events)]
        for (k, t, b), event, stamp, body in zip(names, events, _stamps(events), bodies,
                                                 strict=True):
            params[k], params[t], params[b] = base + event.seq, stamp, body
        self._writable("write")
        with self._lock:
            if self._broken:
                raise DurabilityError(self._broken)
            kept = self._outlines.kept(one.run_id, one.expected_seq)
            state, body = outline_after(
                lambda: self._outline_at(one.run_id, base, one.expected_seq), events)
            kept = _kept_after(kept, state)
            self._stage({base >> 32: (state, body)} if kept is not None
                        and kept[0] == events[-1].seq else {})
            inserted = self._commit(_alone(len(events), one.alone_in is not None), params,
                                    alone=True)
        if inserted:
            self._known[one.run_id] = (base, digest)
        if inserted == len(events):
            self._outlines.put(one.run_id, events[-1].seq, body, kept)
        return inserted == len(events)

    def _base_in_group(self, outlines: Mapping[str, tuple[int, RunState | None, bytes,
                                                          Kept | None]],
                       run_id: str, base: int, expected_seq: int) -> RunState | None:
        """The run's outline at ``expected_seq``: after the group's earlier append to it,
        if any (None there: the log does not fold), else as _outline_at finds it."""
        if (prior := outlines.get(run_id)) is None:
            return self._outline_at(run_id, base, expected_seq)
        if prior[1] is None:
            raise ValueError(f"run {run_id!r} does not fold")
        return prior[1]

    def _outline_at(self, run_id: str, base: int, expected_seq: int) -> RunState | None:
        """The run's outline at ``expected_seq`` (see outlined.base_outline); the caller
        holds the lock."""
        def stored() -> tuple[int, bytes] | None:
            row = self._db.execute("SELECT seq, body FROM outlines WHERE run_no = ?"
                                   " AND version = ?", (base >> 32, OUTLINE_VERSION)).fetchone()
            return (int(row[0]), bytes(row[1])) if row else None

        return base_outline(run_id, expected_seq, self._outlines.get(run_id, expected_seq),
                            stored, self.read)

    def _stage(self, outlines: Mapping[int, tuple[RunState | None, bytes]]) -> None:
        """Stage the outline each run (by number) has once its batch is in: the insert
        of the batch's last row stores it (see _head_trigger). A run whose log does
        not fold (None) gets none."""
        self._staged.clear()
        if not self._projecting:
            return
        for run_no, (state, body) in outlines.items():
            if state is not None:
                cols = columns(state)
                self._staged[(run_no << 32) + state.last_seq] = (
                    cols["status"], cols["agent"], int(cols["attention"]), body)

    def _insert(self, db: sqlite3.Connection, group: list[Pending]
                ) -> tuple[dict[str, tuple[int, str]],
                           dict[str, tuple[int, RunState | None, bytes, Kept | None]]]:
        """Check each append against its run's end (under the write lock, so nothing
        moves it but this group), then insert every accepted row in one statement, with
        each run's outline when due. A refused append gets its error and takes no other
        down. Returns each run's key base and last digest (empty: all refused, nothing
        written), and each run's new outline: (seq, outline, bytes, what the store then
        holds of it)."""
        run_ids = list({pending.item.run_id: None for pending in group})
        _number(db, [run_id for run_id in run_ids if run_id not in self._known])
        ends = _ends(db, run_ids)
        outlines: dict[str, tuple[int, RunState | None, bytes, Kept | None]] = {}
        rows = []
        for pending in group:
            one: _Append = pending.item
            run_id, events, end = one.run_id, one.events, ends[one.run_id]
            try:
                if not end.last:
                    _refuse_archived(db, run_id)
                if one.epoch != end.epoch:  # fencing first: a stale writer must stop
                    raise FencedError(run_id, one.epoch, end.epoch)
                if end.last != one.expected_seq:
                    raise ConflictError(run_id, one.expected_seq, end.last)
                if one.alone_in is not None and db.execute(
                        _SHARED, {"scope": one.alone_in, "run": run_id}).fetchone():
                    raise ScopeSharedError(run_id, one.alone_in)
                kept = (outlines[run_id][3] if run_id in outlines
                        else self._outlines.kept(run_id, one.expected_seq))
                state, outline_body = outline_after(functools.partial(
                    self._base_in_group, outlines, run_id, end.base, one.expected_seq), events)
                bodies, end.digest = seal(events, end.digest)
            except JournalError as exc:
                pending.error = exc
                continue
            end.last = events[-1].seq
            outlines[run_id] = (end.last, state, outline_body, _kept_after(kept, state))
            rows += [(end.base + e.seq, stamp, body)
                     for e, stamp, body in zip(events, _stamps(events), bodies, strict=True)]
            if (scope := scope_started(events)) is not None:
                db.execute("INSERT OR IGNORE INTO scopes VALUES (?, ?)", (scope, run_id))
        if not rows:
            return {}, {}
        self._stage({ends[run_id].base >> 32: (state, body)
                     for run_id, (seq, state, body, kept) in outlines.items()
                     if kept is not None and kept[0] == seq})
        db.executemany("INSERT INTO events VALUES (?, ?, ?)", rows)
        return {run_id: (end.base, end.digest) for run_id, end in ends.items()}, outlines

    def read(self, run_id: str, after_seq: int = 0, upto: int | None = None
             ) -> Iterator[Event]:
        validate_run_id(run_id)
        # Without the store's record of heads, every record is decoded wherever the read
        # starts: one that proves heads were kept may sit before the start.
        scan_from = after_seq if self._heads_missing is None else 0
        with self._reading(), self._snapshot():  # the log and its head, as of one instant
            rows = self._db.execute(  # from after_seq itself: its digest starts the chain
                f"SELECT key & {MAX_SEQ}, body FROM events"
                f" WHERE {in_run(after=':after', upto=':upto')} ORDER BY key",
                {"run": run_id, "after": scan_from, "upto": MAX_SEQ if upto is None else upto},
            ).fetchall()
            head = self._head(run_id)
        if upto is not None and head is not None and upto < head[0]:
            head = None  # a range short of the head: its chain is checked, not its end
        prev, end = "", None
        if rows and rows[0][0] == after_seq:
            prev = stored_digest(rows.pop(0)[1])
            end = (after_seq, prev)
        events = []
        for seq, body in rows:
            event, prev = decode_record(run_id, seq, body, prev, sealed_store=self._sealed,
                                        heads_missing=self._heads_missing)
            events.append(event)
            end = (seq, prev)
        if self._heads and (upto is None or head is not None):
            check_head(run_id, after_seq, end, head)
        yield from events if scan_from == after_seq else [e for e in events if e.seq > after_seq]

    @contextmanager
    def _snapshot(self) -> Iterator[None]:
        """One read transaction (a consistent snapshot of the file) around what it holds."""
        if self._db.in_transaction:
            yield
            return
        self._db.execute("BEGIN")
        try:
            yield
        finally:
            if self._db.in_transaction:
                self._db.execute("COMMIT")

    def _head(self, run_id: str) -> Head | None:
        if not self._heads:
            return None
        row = self._db.execute("SELECT seq, digest FROM heads WHERE run_no ="
                               " (SELECT run_no FROM run_numbers WHERE run_id = ?)",
                               (run_id,)).fetchone()
        return (int(row[0]), str(row[1])) if row else None

    def heads(self) -> dict[str, Head]:
        if not self._heads:
            return {}
        with self._reading():
            rows = self._db.execute("SELECT n.run_id, h.seq, h.digest FROM heads h"
                                    " JOIN run_numbers n USING (run_no) ORDER BY n.run_id")
            return {run_id: (int(seq), str(digest)) for run_id, seq, digest in rows}

    def last_seq(self, run_id: str) -> int:
        validate_run_id(run_id)
        with self._reading():
            return self._last_seq(self._db, run_id)

    @staticmethod
    def _last_seq(db: sqlite3.Connection, run_id: str) -> int:
        return int(db.execute(f"SELECT {last_seq_of(':run')}", {"run": run_id}).fetchone()[0])

    def list_runs(self, *, limit: int | None = None) -> list[RunInfo]:
        if self._heads:
            # Each run's head names its last event: two lookups by key a run instead of a
            # scan of every event (10,000 runs of 150,000 events: 30 ms, not 380).
            sql = ("SELECT n.run_id, h.seq, f.ts, l.ts FROM heads h"
                   " JOIN run_numbers n ON n.run_no = h.run_no"
                   " JOIN events l ON l.key = (h.run_no << 32) + h.seq"
                   " JOIN events f ON f.key = (h.run_no << 32) + 1 ORDER BY l.ts DESC")
        else:
            sql = (f"SELECT n.run_id, max(e.key) & {MAX_SEQ}, min(e.ts), max(e.ts)"
                   f" FROM run_numbers n JOIN events e ON {in_run('n.run_id')}"
                   " GROUP BY n.run_no ORDER BY max(e.ts) DESC")
        with self._reading():
            rows = self._db.execute(sql + (f" LIMIT {int(limit)}" if limit else "")).fetchall()
        return [
            RunInfo(r[0], r[1], datetime.fromisoformat(r[2]), datetime.fromisoformat(r[3]))
            for r in rows
        ]

    def outlines(self, run_ids: Collection[str] | None = None, *,
                 attention: bool = False) -> dict[str, RunState | JournalError]:
        """Each run's outline as of its head (projections.py), for ``run_ids`` or every
        run; ``attention``: only the runs a person may be asked about. A run whose log
        cannot be read maps to the error."""
        return served(self._outline_rows(run_ids, attention), self.read,
                      attention=attention)

    def _outline_rows(self, run_ids: Collection[str] | None, attention: bool,
                      stale: bool = False) -> list[Stored]:
        if not self._heads:  # an old file read without migrating it: every run is folded
            return [Stored(i.run_id, i.last_seq, None, None) for i in self.list_runs()
                    if run_ids is None or i.run_id in run_ids]
        projected = self._outlined
        sql = ("SELECT n.run_id, h.seq, " + ("o.seq, o.body" if projected else "NULL, NULL")
               + " FROM heads h JOIN run_numbers n USING (run_no)"
               + (f" LEFT JOIN outlines o ON o.run_no = h.run_no AND o.version = "
                  f"{OUTLINE_VERSION}" if projected else "")
               + " WHERE 1")
        params: list[Any] = []
        if run_ids is not None:
            sql += " AND n.run_id IN (SELECT value FROM json_each(?))"
            params.append(json.dumps(list(run_ids)))
        if attention and projected:  # (a stale one must be caught up to be judged)
            sql += " AND (o.attention OR o.seq IS NULL OR o.seq != h.seq)"
        if stale and projected:
            sql += " AND (o.seq IS NULL OR o.seq != h.seq)"
        with self._reading(), self._snapshot():
            found = self._db.execute(sql, params).fetchall()
        return [Stored(r[0], int(r[1]), r[2], None if r[3] is None else bytes(r[3]))
                for r in found]

    @property
    def projected(self) -> bool:
        """Whether the file keeps outlines (a read-only handle on an older one folds)."""
        return self._outlined

    def _project(self) -> None:
        """Project the runs whose outline is missing, of another version or behind its
        head (a store an older release wrote), then record that it was done for this
        OUTLINE_VERSION, so a writer's open scans the heads for it once, not each time (a
        run another program appends to later is caught up by each read)."""
        project(self.url, self._outline_rows(None, attention=False, stale=True), self.read,
                self.put_outline)
        with self._tx(light=True) as db:
            db.execute("INSERT OR REPLACE INTO store_info VALUES (?, ?)",
                       (_PROJECTED, OUTLINE_VERSION))

    def put_outline(self, run_id: str, state: RunState) -> None:
        """Store ``state`` as the run's outline if its log still ends at the outline's
        seq (reindex, and a writer projecting an older store)."""
        body = encode_outline(state)
        cols = columns(state)
        with self._tx(light=True) as db:  # (a cache: the log says it again)
            db.execute(
                "INSERT OR REPLACE INTO outlines SELECT h.run_no, ?, ?, ?, ?, ?, ? FROM heads h"
                " JOIN run_numbers n USING (run_no) WHERE n.run_id = ? AND h.seq = ?",
                (state.last_seq, OUTLINE_VERSION, cols["status"], cols["agent"],
                 int(cols["attention"]), body, run_id, state.last_seq))
        self._outlines.drop(run_id)

    # --- views: caches a reader keeps beside a run's log -----------------------------

    def put_view(self, run_id: str, name: str, seq: int, body: bytes) -> None:
        validate_run_id(run_id)
        with self._tx(light=True) as db:
            _number(db, [run_id])
            db.execute("INSERT OR REPLACE INTO views SELECT run_no, ?, ?, ? FROM run_numbers"
                       " WHERE run_id = ?", (name, seq, body, run_id))

    def view(self, run_id: str, name: str) -> tuple[int, bytes] | None:
        validate_run_id(run_id)
        if not self._outlined:  # (an old file read without migrating it)
            return None
        with self._reading():
            row = self._db.execute(
                "SELECT v.seq, v.body FROM views v JOIN run_numbers n USING (run_no)"
                " WHERE n.run_id = ? AND v.name = ?", (run_id, name)).fetchone()
        return (int(row[0]), bytes(row[1])) if row else None

    def scope_runs(self, scope: str) -> list[str]:
        with self._reading():
            rows = self._db.execute(
                "SELECT s.run_id FROM scopes s JOIN run_numbers n USING (run_id)"
                " JOIN events e ON e.key = (n.run_no << 32) + 1"
                " WHERE s.scope = ? ORDER BY e.ts, s.run_id", (scope,)).fetchall()
        return [r[0] for r in rows]

    # --- leases ----------------------------------------------------------------

    @staticmethod
    def _epoch(db: sqlite3.Connection, run_id: str) -> int:
        row = db.execute("SELECT epoch FROM leases WHERE run_id = ?", (run_id,)).fetchone()
        return int(row[0]) if row else 0

    def acquire(self, run_id: str, owner: str, ttl: float) -> Lease:
        validate_run_id(run_id)
        with self._tx(light=True) as db:
            wall, (boot, now) = time.time(), host_clock()
            row = db.execute(
                "SELECT owner, epoch, expires_at, boot_id, deadline FROM leases"
                " WHERE run_id = ?", (run_id,)
            ).fetchone()
            left = lease_left(row[2], row[3], row[4], wall, boot, now) if row else 0.0
            if row is None:
                epoch = 1
            elif row[0] == owner and left > 0:
                epoch = row[1]  # the holder re-acquiring: a renewal
            elif left > 0:
                raise LeaseHeldError(run_id, row[0], row[1], left)
            else:
                epoch = row[1] + 1  # takeover of an expired or released lease
            db.execute(
                "INSERT OR REPLACE INTO leases (run_id, owner, epoch, expires_at, boot_id,"
                " deadline) VALUES (?, ?, ?, ?, ?, ?)",
                (run_id, owner, epoch, *self._expiry(ttl, wall, boot, now)),
            )
            last = self._last_seq(db, run_id)  # a new run's opener then reads nothing
        return Lease(run_id, owner, epoch, wall + ttl, last_seq=last)

    @staticmethod
    def _expiry(ttl: float, wall: float, boot: str, now: float) -> tuple[Any, ...]:
        """(expires_at, boot_id, deadline) of a lease granted now for ``ttl`` seconds, the
        last two NULL where the host has no boot id."""
        expires_at, boot_id, deadline = lease_expiry(ttl, wall, boot, now)
        return expires_at, boot_id or None, deadline if boot_id else None

    def holder(self, run_id: str) -> Lease | None:
        validate_run_id(run_id)
        with self._reading():
            row = self._db.execute("SELECT owner, epoch, expires_at, boot_id, deadline"
                                   " FROM leases WHERE run_id = ?", (run_id,)).fetchone()
        if row is None:
            return None
        wall = time.time()
        left = lease_left(row[2], row[3], row[4], wall, *host_clock())
        return Lease(run_id, row[0], row[1], wall + left if row[2] > 0 else 0.0)

    def renew(self, lease: Lease, ttl: float) -> Lease:
        with self._tx(light=True) as db:
            row = db.execute("SELECT epoch, expires_at FROM leases WHERE run_id = ?",
                             (lease.run_id,)).fetchone()
            current = int(row[0]) if row else 0
            if current != lease.epoch:
                raise FencedError(lease.run_id, lease.epoch, current)
            if row is not None and row[1] <= 0:  # released: see release
                raise LeaseReleasedError(lease.run_id, lease.epoch)
            wall, (boot, now) = time.time(), host_clock()
            db.execute(
                "UPDATE leases SET expires_at = ?, boot_id = ?, deadline = ? WHERE run_id = ?",
                (*self._expiry(ttl, wall, boot, now), lease.run_id),
            )
        return Lease(lease.run_id, lease.owner, lease.epoch, wall + ttl)

    def renew_all(self, leases: Sequence[Lease], ttl: float) -> dict[str, Lease]:
        """Renew many leases in one transaction (a worker's heartbeat for every run it
        holds); the ones renewed, by run id. A lease whose epoch moved on is not."""
        if not leases:
            return {}
        renewed: dict[str, Lease] = {}
        with self._tx(light=True) as db:
            wall, (boot, now) = time.time(), host_clock()
            expiry = self._expiry(ttl, wall, boot, now)
            for lease in leases:
                moved = db.execute(
                    "UPDATE leases SET expires_at = ?, boot_id = ?, deadline = ?"
                    " WHERE run_id = ? AND epoch = ? AND expires_at > 0",  # not released
                    (*expiry, lease.run_id, lease.epoch))
                if moved.rowcount:
                    renewed[lease.run_id] = Lease(lease.run_id, lease.owner, lease.epoch,
                                                  wall + ttl)
        return renewed

    def release(self, lease: Lease) -> None:
        with self._tx(light=True) as db:
            db.execute(  # over on both clocks
                "UPDATE leases SET expires_at = 0, deadline = 0 WHERE run_id = ? AND epoch = ?",
                (lease.run_id, lease.epoch),
            )

    # --- snapshots ---------------------------------------------------------------

    def put_snapshot(self, snapshot: Snapshot, *, keep: int = 2) -> None:
        run_id = validate_run_id(snapshot.run_id)
        with self._tx() as db:  # body and pointer are one row: one transaction
            db.execute(
                "INSERT OR REPLACE INTO snapshots VALUES (?, ?, ?, ?, ?, ?, ?)",
                (run_id, snapshot.seq, snapshot.fold_version, snapshot.schema_version,
                 snapshot.digest, snapshot.body, snapshot.created_at.isoformat()),
            )
            db.execute(self._PRUNE, (run_id, run_id, max(keep, 1)))

    _PRUNE = ("DELETE FROM snapshots WHERE run_id = ? AND (seq, fold_version) NOT IN "
              "(SELECT seq, fold_version FROM snapshots WHERE run_id = ? "
              " ORDER BY seq DESC, created_at DESC LIMIT ?)")

    def prune_snapshots(self, run_id: str, *, keep: int) -> int:
        validate_run_id(run_id)
        with self._tx() as db:
            return db.execute(self._PRUNE, (run_id, run_id, max(keep, 0))).rowcount

    def snapshots(self, run_id: str, *, limit: int | None = None) -> list[Snapshot]:
        validate_run_id(run_id)
        with self._reading():
            rows = self._db.execute(
                "SELECT seq, schema_version, fold_version, digest, body, created_at "
                "FROM snapshots WHERE run_id = ? ORDER BY seq DESC, created_at DESC LIMIT ?",
                (run_id, -1 if limit is None else limit),
            ).fetchall()
        return [
            Snapshot(run_id=run_id, seq=r[0], schema_version=r[1], fold_version=r[2],
                     digest=r[3], body=bytes(r[4]), created_at=datetime.fromisoformat(r[5]))
            for r in rows
        ]

    def delete_snapshots(self, run_id: str) -> int:
        validate_run_id(run_id)
        with self._tx() as db:
            db.execute("DELETE FROM segments WHERE run_id = ?", (run_id,))
            return db.execute("DELETE FROM snapshots WHERE run_id = ?", (run_id,)).rowcount

    def put_segments(self, run_id: str, segments: Mapping[str, bytes]) -> None:
        validate_run_id(run_id)
        with self._tx() as db:
            db.executemany("INSERT OR REPLACE INTO segments VALUES (?, ?, ?)",
                           [(run_id, digest, body) for digest, body in segments.items()])

    def segments(self, run_id: str, digests: Collection[str]) -> dict[str, bytes]:
        validate_run_id(run_id)
        with self._reading():
            rows = self._db.execute(
                "SELECT digest, body FROM segments WHERE run_id = ? AND digest IN"
                " (SELECT value FROM json_each(?))", (run_id, json.dumps(list(digests))))
            return {digest: bytes(body) for digest, body in rows}

    def segment_digests(self, run_id: str) -> set[str]:
        validate_run_id(run_id)
        with self._reading():
            return {digest for (digest,) in self._db.execute(
                "SELECT digest FROM segments WHERE run_id = ?", (run_id,))}

    def prune_segments(self, run_id: str, keep: Collection[str]) -> int:
        validate_run_id(run_id)
        with self._tx() as db:
            return db.execute(
                "DELETE FROM segments WHERE run_id = ? AND digest NOT IN"
                " (SELECT value FROM json_each(?))", (run_id, json.dumps(list(keep)))).rowcount

    def quarantine(self, fold_version: int, reason: str) -> None:
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO quarantine VALUES (?, ?, ?)",
                       (fold_version, reason, now().isoformat()))

    def quarantined(self) -> dict[int, str]:
        with self._reading():
            return dict(self._db.execute("SELECT fold_version, reason FROM quarantine"))

    # --- retention ---------------------------------------------------------------

    def records(self, run_id: str) -> list[bytes]:
        validate_run_id(run_id)
        with self._reading(), self._snapshot():
            rows = self._db.execute(f"SELECT body FROM events WHERE {in_run()} ORDER BY key",
                                    {"run": run_id}).fetchall()
            head = self._head(run_id)
        records = [bytes(r[0]) for r in rows]
        check_records(run_id, records, sealed_store=self._sealed)
        if self._heads:
            end = (len(records), stored_digest(records[-1])) if records else None
            check_head(run_id, 0, end, head)
        return records

    def delete_run(self, tombstone: Tombstone, *, epoch: int) -> None:
        run_id = validate_run_id(tombstone.run_id)
        with self._tx() as db:
            current = self._epoch(db, run_id)
            if epoch != current:
                raise FencedError(run_id, epoch, current)
            last = self._last_seq(db, run_id)
            if last != tombstone.last_seq:
                raise ConflictError(run_id, tombstone.last_seq, last)
            db.execute(f"DELETE FROM events WHERE {in_run()}", {"run": run_id})
            db.execute("DELETE FROM heads WHERE run_no = (SELECT run_no FROM run_numbers"
                       " WHERE run_id = ?)", (run_id,))
            for table in ("snapshots", "segments", "scopes", "queue"):
                db.execute(f"DELETE FROM {table} WHERE run_id = ?", (run_id,))
            for table in ("outlines", "views"):
                db.execute(f"DELETE FROM {table} WHERE run_no = (SELECT run_no FROM"
                           " run_numbers WHERE run_id = ?)", (run_id,))
            db.execute("INSERT INTO tombstones VALUES (?, ?, ?, ?, ?)",
                       (run_id, tombstone.last_seq, tombstone.digest, tombstone.archive,
                        tombstone.deleted_at.isoformat()))
        self._outlines.drop(run_id)

    _TOMBSTONE = "SELECT run_id, last_seq, digest, archive, deleted_at FROM tombstones"

    @staticmethod
    def _stone(row: tuple[Any, ...]) -> Tombstone:
        return Tombstone(run_id=row[0], last_seq=row[1], digest=row[2], archive=row[3],
                         deleted_at=datetime.fromisoformat(row[4]))

    def tombstone(self, run_id: str) -> Tombstone | None:
        validate_run_id(run_id)
        with self._reading():
            row = self._db.execute(self._TOMBSTONE + " WHERE run_id = ?", (run_id,)).fetchone()
        return self._stone(row) if row else None

    def tombstones(self) -> list[Tombstone]:
        with self._reading():
            rows = self._db.execute(self._TOMBSTONE + " ORDER BY deleted_at, run_id").fetchall()
        return [self._stone(r) for r in rows]

    def restore_run(self, run_id: str, records: Sequence[bytes]) -> None:
        validate_run_id(run_id)
        if not records:
            raise ValueError("restore_run needs the records of a whole log")
        events = check_records(run_id, records)
        self._arm()
        with self._tx() as db:
            row = db.execute("SELECT digest FROM tombstones WHERE run_id = ?",
                             (run_id,)).fetchone()
            if row is None:
                raise NotArchivedError(run_id, "it has no tombstone here")
            if records_digest(records) != row[0]:
                raise CorruptLogError(run_id, len(records), "these records are not the log "
                                      "its tombstone names (their digest differs)")
            _number(db, [run_id])
            (base,) = db.execute("SELECT run_no << 32 FROM run_numbers WHERE run_id = ?",
                                 (run_id,)).fetchone()
            self._stage({base >> 32: outline_after(lambda: None, events)})
            db.executemany("INSERT INTO events VALUES (?, ?, ?)", [
                (base + e.seq, e.ts.isoformat(), body)
                for e, body in zip(events, records, strict=True)])
            if (scope := scope_started(events)) is not None:
                db.execute("INSERT OR IGNORE INTO scopes VALUES (?, ?)", (scope, run_id))
            db.execute("DELETE FROM tombstones WHERE run_id = ?", (run_id,))

    def close(self) -> None:
        with self._lock:
            self._disconnect()

    # SQLite reports damage it finds mid-query as DatabaseError; the read paths call
    # this so it is CorruptStoreError, not a raw sqlite3 error.
    @contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            try:
                yield self._db
            except sqlite3.OperationalError as exc:
                raise self._translated(exc, "read") from exc
            except sqlite3.DatabaseError as exc:
                where = str(self.path.absolute())
                raise CorruptStoreError(where, f"SQLite cannot read it ({exc})") from None

    def __enter__(self) -> SQLiteStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
