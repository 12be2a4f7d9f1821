"""One JSON Lines file per run, in a directory.

The log is a sequence of batches, one per ``append``, each written with one
``os.write``. A record is one line::

    <crc32 as 8 lowercase hex> <mark><canonical JSON>\\n

where ``mark`` is ``+`` if more records of the same batch follow and ``.`` if
this record ends its batch, and the checksum covers the mark and the JSON.
msgspec escapes every newline (and every NUL) inside strings, so records split
on ``b"\\n"`` alone. A line written before batch marks, ``<crc32> <JSON>\\n``
(the JSON right after the space), is read as a batch of its own.

A reader returns whole batches only. Whatever follows the last complete batch
is an *incomplete final batch*: whole records of a batch that lacks its ``.``
record, then bytes that form no whole record: no newline yet, neither a
record's ``<8 hex> `` head nor its ``<mark>{...}`` body (one flipped bit never
spoils both), or a run of NULs, which is how a block that never reached the
disk reads after a power cut. An append returns only once its whole batch is
written and, under ``FSYNC``, synced, so that batch was never acknowledged
(under ``BATCHED`` a power cut may tear one that was: the loss that mode
allows). Readers skip it and never change the file; a writer cuts it right
before appending and reports it in ``JsonlStore.repairs``. A whole record whose
checksum fails is damage wherever it is, the last record included:
``CorruptLogError`` naming its seq, the file left alone. So are bytes that form
no record when a whole record follows them: only the last write can be torn.

Writers (and readers, so they never see an unacknowledged batch) hold an
exclusive ``flock`` on ``<run_id>.lock``; under it the store learns the true
last seq, checks the lease epoch in ``<run_id>.lease`` and writes the whole
batch with one ``os.write`` to a file opened ``O_APPEND``.

The lease file holds the holder's deadline on the host's boot-time clock
(``boot_id``, ``boot_deadline``; see ``base.host_clock``), which every process
on the host shares and no wall-clock change moves, beside ``expires_at`` on
the wall clock, for people. Expiry is judged by the boot-time deadline; a lease
written under another boot is over; only a lease file without those fields, or
a host without a boot id, falls back to the wall clock.

Snapshots (a cache beside the log) live in ``<run_id>.snapshots/``, one file
per snapshot, ``<seq:012d>-f<fold_version>.snap``: a one-line JSON header (the
metadata) then the raw body. Each is written to a ``.tmp`` file, fsynced and
renamed into place, so a reader sees a whole snapshot or none; ``.tmp`` files
are never read. The store-wide quarantine record is ``_quarantine.json``.

Each run's head (its last seq and digest) is ``<run_id>.head``, one fixed-size line
rewritten in place right after each batch (and synced with it under ``FSYNC``), under
the run's lock: the batch commits when its head is written. A complete batch past the
head, starting where the head is, was cut off by a crash before its head: readers skip
it and a writer cuts it, as an incomplete one; any other disagreement is
``CorruptLogError``. ``_store.json`` records the schema version the store was created
at (in a store created sealed, an unsealed record is damage); a writer opening an older
store computes every run's head from its log first, once.

A run gc archived and deleted (retention.py) leaves ``<run_id>.tomb``, its
``Tombstone`` as JSON. The tombstone is the truth: it is published (fsync, rename)
before the log and snapshots are removed, so a crash between the two leaves a log
that is already deleted, which the next handle to take the run's lock removes. A
restore writes the log back beside the tombstone, then removes the tombstone.

Opened ``readonly`` (inspection), the store creates nothing: not the directory,
not a ``.lock`` file. It takes a run's flock only when the lock file exists, and
then through a read-only descriptor (flock needs no write access, so this works on
a read-only mount too). Without a lock file no writer has used the run since the
file was made (every writer creates it first), so there is no one to wait for; a
writer that arrives mid-read is safe too: its unfinished batch reads as an
incomplete final batch, which readers skip. Every write raises ``ReadOnlyStoreError``.

The operating system's refusals (a full disk, a read-only file system, missing
permissions) are ``StoreIOError``; an append that fails is cut back first, so
nothing of it is kept.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import heapq
import logging
import os
import re
import sqlite3
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple, TypeVar, cast

import msgspec

from ..errors import (
    ArchivedRunError,
    ConflictError,
    CorruptLogError,
    CorruptStoreError,
    DurabilityError,
    FencedError,
    InvalidRunIdError,
    JournalError,
    LeaseHeldError,
    LeaseReleasedError,
    NotArchivedError,
    NotAStoreError,
    ReadOnlyStoreError,
    ScopeSharedError,
    StoreIOError,
    StoreUrlError,
)
from ..events import SCHEMA_VERSION, SEALED_SINCE, Event, decode_stored, seal, stored_digest
from ..state import RunState
from .base import (
    Durability,
    Head,
    Lease,
    RunInfo,
    Snapshot,
    Tombstone,
    UnanchoredLogError,
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
from .outlined import Stored, served
from .sidecar import Listed, Sidecar, Stamp, listed, run_info

log = logging.getLogger("agentjournal")
_F = TypeVar("_F", bound=Callable[..., Any])


def _os_errors(action: str, *, write: bool) -> Callable[[_F], _F]:
    """Make the operating system's refusals inside a store method ``StoreIOError`` (and a
    write on a read-only handle ``ReadOnlyStoreError``), saying what to do about them."""

    def wrap(method: _F) -> _F:
        @functools.wraps(method)
        def translated(self: JsonlStore, *args: Any, **kwargs: Any) -> Any:
            if write and self.readonly:
                raise ReadOnlyStoreError(self.url, action)
            try:
                return method(self, *args, **kwargs)
            except OSError as exc:
                raise StoreIOError(self.url, action, exc) from exc

        return cast(_F, translated)

    return wrap

_CHUNK = 1 << 24
_OPEN_RUNS = 64  # runs whose files stay open between calls


class TailRepair(msgspec.Struct, frozen=True):
    """An incomplete final batch a writer cut off a run's file: ``dropped_bytes`` from
    ``offset`` on; ``reason`` says what they held."""

    run_id: str
    offset: int
    dropped_bytes: int
    reason: str


class _Torn(NamedTuple):
    """An incomplete final batch: ``size`` bytes from ``offset`` on, and what they hold."""

    offset: int
    size: int
    reason: str


class _LeaseRecord(msgspec.Struct):
    owner: str
    epoch: int
    expires_at: float  # the wall clock: for people, and for lease files without the below
    boot_id: str = ""  # the boot whose clock ``boot_deadline`` is on ("": unknown)
    boot_deadline: float = 0.0  # seconds since that boot

    def remaining(self) -> float:
        """Seconds the lease has left, by a clock every process on this host shares."""
        return lease_left(self.expires_at, self.boot_id, self.boot_deadline, time.time(),
                          *host_clock())


def _new_lease(owner: str, epoch: int, ttl: float) -> _LeaseRecord:
    return _LeaseRecord(owner, epoch, *lease_expiry(ttl, time.time(), *host_clock()))


class _Tail(NamedTuple):
    """What a scan learned about a run's file, up to ``size`` bytes."""

    size: int
    last_seq: int
    created_at: datetime | None
    updated_at: datetime | None
    digest: str = ""  # of the last record: the next one chains from it
    before: tuple[int, str, int] | None = None  # (seq, digest, size) before the last batch


_EMPTY = _Tail(0, 0, None, None)


class _SnapHeader(msgspec.Struct, frozen=True):
    """The first line of a ``.snap`` file: a ``Snapshot`` minus its body."""

    run_id: str
    seq: int
    schema_version: int
    fold_version: int
    digest: str
    created_at: datetime
    #: Where the log's record after ``seq`` starts, when known at write time: a read
    #: that resumes from this snapshot starts there instead of scanning the whole file.
    log_offset: int = 0


def _valid_run_id(name: str) -> bool:
    try:
        validate_run_id(name)
    except InvalidRunIdError:
        return False
    return True


_SNAP_SUFFIX = ".snapshots"
_DIGEST = re.compile(r"[0-9a-f]{64}")
_TOMB = ".tomb"
_SCOPES = "_scopes"
_QUARANTINE = "_quarantine.json"  # "_" never starts a run id, so no run can collide
_STORE = "_store.json"  # the store's own record: the schema version it was created at
_HEAD_FILE = ".head"
_HEAD_SIZE = 54  # "<seq: 20 digits> <digest: 32, padded>\n", rewritten in place
_MAX_HEADER = 1 << 16


def _segment_name(digest: str) -> str:
    if not _DIGEST.fullmatch(digest):  # it names a file: nothing but hex
        raise ValueError(f"not a segment digest: {digest!r}")
    return f"{digest}.seg"


def _view_name(name: str) -> str:
    if not _VIEW.fullmatch(name):  # it names a file
        raise ValueError(f"not a view name: {name!r}")
    return f"{name}.view"


_VIEW = re.compile(r"[a-z][a-z0-9_-]{0,63}")


def _snap_name(seq: int, fold_version: int) -> str:
    return f"{seq:012d}-f{fold_version}.snap"


# Record marks (see the module docstring); the checksum covers the mark.
_MORE, _END, _OLD = b"+.{"  # _OLD: a line from before marks (ints: bytes indexed)
_CRC_MORE, _CRC_END = zlib.crc32(b"+"), zlib.crc32(b".")
_HEAD = re.compile(rb"[0-9a-f]{8} ")  # a record's framing before byte 9...
_BODY = re.compile(rb"[+.]?\{")  # ...and from it (ending in "}")
_HOLE = b"\0" * 8  # one flipped bit makes at most one NUL; a block never written, many


class _RunLock:
    """A store's thread lock plus one run's flock, as a context manager (a class, not a
    generator: it is taken on every append)."""

    __slots__ = ("fd", "run_id", "store", "write")

    def __init__(self, store: JsonlStore, run_id: str, write: bool) -> None:
        self.store, self.run_id, self.write = store, run_id, write
        self.fd: int | None = None

    def __enter__(self) -> None:
        store, run_id = self.store, self.run_id
        store._lock.acquire()
        try:
            if self.write and store._broken:
                raise DurabilityError(store._broken, run_id=run_id)
            if store.readonly:  # see the module docstring: no lock file, no writer to wait for
                if not os.path.exists(f"{store._dir}/{run_id}.lock"):
                    return
                fd = store._cached_fd(store._lock_fds, run_id, ".lock", os.O_RDONLY)
            else:
                fd = store._cached_fd(store._lock_fds, run_id, ".lock",
                                      os.O_RDWR | os.O_CREAT)
            fcntl.flock(fd, fcntl.LOCK_EX)
            self.fd = fd
        except BaseException:
            store._lock.release()
            raise

    def __exit__(self, *exc: object) -> None:
        try:
            if self.fd is not None:
                fcntl.flock(self.fd, fcntl.LOCK_UN)
        finally:
            self.store._lock.release()


def _head_line(seq: int, digest: str) -> bytes:
    return b"%020d %-32s\n" % (seq, digest.encode("ascii"))


def _pwrite_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` at offset 0 (a file rewritten in place)."""
    done = 0
    while done < len(data):
        done += os.pwrite(fd, data[done:], done)


def _write_all(fd: int, data: bytes) -> None:
    """Write all of ``data``: a short write (a full disk, a file size limit) is followed by
    one that fails with the OS's reason, so nothing half-written is taken as done."""
    written = os.write(fd, data)
    if written < len(data):  # (rare: no view is made for the whole write)
        view = memoryview(data)[written:]
        while view:
            view = view[os.write(fd, view) :]


def _frame_batch(bodies: list[bytes]) -> bytes:
    """The bytes of one batch: every record marked ``+`` but the last, marked ``.``."""
    last = bodies[-1]
    end = b"%08x .%s\n" % (zlib.crc32(last, _CRC_END), last)
    if len(bodies) == 1:  # the common case
        return end
    more = [b"%08x +%s\n" % (zlib.crc32(body, _CRC_MORE), body) for body in bodies[:-1]]
    return b"".join([*more, end])


def _whole(line: bytes) -> bool:
    """Whether a line (its newline found) is a record as written, give or take damage: so
    a failed checksum is damage, not a torn write. One flipped bit spoils its head or its
    body, never both; a write torn by a power cut leaves a run of NULs."""
    framed = _HEAD.match(line) or (_BODY.match(line, 9) and line.endswith(b"}"))
    return bool(framed) and _HOLE not in line


def _line_ending_at(fd: int, end: int) -> bytes:
    """The line whose newline is the byte before ``end`` (b"" if there is none)."""
    if end <= 0:
        return b""
    pieces: list[bytes] = []
    start = end
    while start > 0:
        size = min(start, 1 << 16)
        piece = os.pread(fd, size, start - size)
        start -= size
        cut = piece.rfind(b"\n", 0, len(piece) - 1 if not pieces else len(piece))
        if cut != -1:
            pieces.append(piece[cut + 1 :])
            break
        pieces.append(piece)
    return b"".join(reversed(pieces))


def _first_line_end(fd: int) -> int:
    offset = 0
    while chunk := os.pread(fd, 1 << 16, offset):
        if (nl := chunk.find(b"\n")) != -1:
            return offset + nl + 1
        offset += len(chunk)
    return 0


def _record(line: bytes) -> tuple[int, bytes] | None:
    """(mark, body) of a whole line whose checksum holds; None otherwise."""
    if len(line) < 11 or not line.endswith(b"\n"):
        return None
    at = 9
    if line[:at] != b"%08x " % zlib.crc32(line[at:-1]):
        return None
    mark = line[at]
    return (mark, line[at:-1]) if mark == _OLD else (mark, line[at + 1 : -1])


def _torn(data: bytes, end: int, pos: int, records: int, base: int) -> _Torn | None:
    """What follows the last complete batch (at ``end`` in ``data``, read from file offset
    ``base``): ``records`` whole records of a batch without its last, then, from ``pos``,
    bytes that are no whole record."""
    if end == len(data):
        return None
    parts = [f"{records} whole record(s) of a batch without its last"] if records else []
    if pos < len(data):
        parts.append(f"{len(data) - pos} bytes that are not a whole record")
    return _Torn(base + end, len(data) - end, ", then ".join(parts))


class JsonlStore:
    """A directory holding ``<run_id>.jsonl`` (the log), ``.lock`` and ``.lease`` per run.

    ``Durability.FSYNC`` fsyncs the file after every append. ``BATCHED`` fsyncs
    a run's file every ``batch_every`` appends to that run and on ``close()``:
    a process crash loses nothing (the bytes are in the OS), but an OS crash or
    power cut may lose the appends to a run since its last fsync. Lease changes
    are always fsynced. A failed fsync is never retried: the append is rolled
    back (best effort) and this handle refuses every later write.
    """

    def __init__(
        self,
        directory: str | Path,
        *,
        durability: Durability = Durability.FSYNC,
        batch_every: int = 64,
        readonly: bool = False,
    ) -> None:
        self.path = Path(directory)
        self.url = f"jsonl:///{self.path}"
        self.durability = Durability(durability)
        self.readonly = readonly
        if batch_every < 1:
            raise ValueError("batch_every must be at least 1")
        self.batch_every = batch_every
        self.repairs: list[TailRepair] = []
        self._lock = threading.Lock()
        self._sidecar = Sidecar(self.path, readonly=readonly)  # the runs' outlines
        self._broken: str | None = None
        self._tails: dict[str, _Tail] = {}
        # Byte offsets where the record after a snapshot's seq starts, by run and seq:
        # learned from snapshot headers, checked before use (see _resume_point).
        self._marks: dict[str, dict[int, int]] = {}
        # Open descriptors of recently used runs (least recent first), so an append
        # costs a flock and a write rather than a round of opens, stats and closes.
        self._dir = os.fspath(self.path)
        self._lock_fds: OrderedDict[str, int] = OrderedDict()
        self._log_fds: OrderedDict[str, int] = OrderedDict()
        self._epochs: dict[str, tuple[tuple[int, int, int], int]] = {}
        self._unsynced: dict[str, int] = {}  # BATCHED: appends since the run's last fsync
        self._head_fds: OrderedDict[str, int] = OrderedDict()
        # Heads are kept (and checked) once the store's record says so: a store made by
        # this release, or migrated to it by its first writer (_migrate_heads). Until then
        # a record only a release that keeps heads writes is damage (see _learn_heads).
        self._heads = self._sealed = False
        self._heads_missing: str | None = None
        where = str(self.path.absolute())
        if self.path.exists() and not self.path.is_dir():
            raise NotAStoreError(where, "it is a file; a jsonl store is a directory")
        if readonly:
            if not self.path.is_dir():
                raise StoreUrlError(where, "no directory there; a store is created by its "
                                    "first run or by `agentjournal init`")
            self._learn_heads()
            return
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreUrlError(self.url, f"cannot create the directory ({exc})") from None
        if not os.access(self.path, os.W_OK):  # say so now, not at the first append
            raise ReadOnlyStoreError(where, "open it for writing", reason="its directory is "
                                     "not writable (a read-only mount, or permissions)")
        if not self._learn_heads():
            dir_fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            try:  # one writer migrates; another opening meanwhile waits, then finds it done
                fcntl.flock(dir_fd, fcntl.LOCK_EX)
                if not self._learn_heads():
                    self._migrate_heads()
            finally:
                os.close(dir_fd)  # (closing releases the flock)
        # The sidecar's cursor moves on at every writer's open: the outlines of what was
        # appended since are folded once, not by every later read.
        with suppress(JournalError, OSError, sqlite3.Error):
            self.outlines()

    # --- heads: each run's last seq and digest, in <run_id>.head beside its log ------
    #
    # Written (and, under FSYNC, synced) right after the batch it ends, under the run's
    # lock: a crash between the two leaves the log one whole batch ahead of a head that
    # names where that batch starts. Read under the same lock, so a reader accepts that
    # (an append whose head write was cut off) and nothing else.

    def _learn_heads(self) -> bool:
        """Read the store's record: whether heads are kept, and whether the store was
        created sealed. False when it has none (an older release's store)."""
        try:
            raw = (self.path / _STORE).read_bytes()
        except FileNotFoundError:
            self._heads_missing = f"no {_STORE}, its record of keeping them"
            return False
        try:
            created = int(msgspec.json.decode(raw)["created_schema"])
        except (msgspec.DecodeError, KeyError, TypeError, ValueError) as exc:
            raise CorruptStoreError(str(self.path / _STORE), f"the store's record does "
                                    f"not decode ({exc})") from None
        self._heads, self._sealed = True, created >= SEALED_SINCE
        self._heads_missing = None
        return True

    def _migrate_heads(self) -> None:
        """Give every run of an older store its head, computed from its log (once), then
        write the store's record: from then on every read checks them. The store was
        created at the oldest schema version its logs hold (this one's, if none). A store
        holding a record that only a release keeping heads writes lost its record and
        heads: refused whole (UnanchoredStoreError), nothing written, for no head computed
        from a forged log may anchor it."""
        oldest, found = SCHEMA_VERSION, []
        for path in self.path.glob("*.jsonl"):
            run_id = path.name[: -len(".jsonl")]
            if not _valid_run_id(run_id):
                continue
            with self._locked(run_id, write=True):
                fd = None if self._buried(run_id) else self._log_fd(run_id)
                if fd is None:
                    continue
                try:
                    tail, events, _ = self._scan(run_id, fd, _EMPTY)
                except UnanchoredLogError as exc:
                    raise UnanchoredStoreError(str(self.path.absolute()), (
                        f"it has no {_STORE} (its record of keeping each run's head), yet "
                        f"run {run_id!r} holds records that only releases keeping heads "
                        f"write (seq {exc.seq} is one): the record and the heads were "
                        "removed")) from None
                except CorruptLogError:
                    continue  # refused by every read anyway; it gets no head
                if events:  # (the oldest record is the first: decoded, it is upcast)
                    first = _record(_line_ending_at(fd, _first_line_end(fd)))
                    oldest = min(oldest, decode_stored(first[1]).v if first else oldest)
                found.append((run_id, tail))
        for run_id, tail in found:
            with self._locked(run_id, write=True):
                self._write_head(run_id, tail.last_seq, tail.digest, sync=True)
        self._publish(self.path / _STORE, msgspec.json.encode(
            {"created_schema": oldest}), None)
        self._learn_heads()

    def _head_fd(self, run_id: str) -> int:
        return self._cached_fd(self._head_fds, run_id, _HEAD_FILE, os.O_RDWR | os.O_CREAT)

    def _write_head(self, run_id: str, seq: int, digest: str, *, sync: bool) -> None:
        """Rewrite the run's head in place (one small write inside one disk sector)."""
        fd = self._head_fd(run_id)
        _pwrite_all(fd, _head_line(seq, digest))
        if sync:
            self._durable(fd, run_id, datasync=True)

    def _read_head(self, run_id: str) -> Head | None:
        """The run's head; (0, "") when it has none yet (a new run cut off before it: its
        head file is created, empty, before its first batch is written); None when it has
        no head file, which only a log written before heads, or damage, lacks."""
        try:
            fd = os.open(f"{self._dir}/{run_id}{_HEAD_FILE}", os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            raw = os.pread(fd, _HEAD_SIZE + 1, 0)
        finally:
            os.close(fd)
        if not raw:
            return (0, "")
        seq, _, digest = raw.partition(b" ")
        if len(raw) != _HEAD_SIZE or not seq.isdigit() or not raw.endswith(b"\n"):
            raise CorruptLogError(run_id, 0, f"its head file {run_id}{_HEAD_FILE} is not one "
                                  "(it was changed outside this store)")
        return int(seq), digest.decode("ascii", "replace").strip()

    def _check_head(self, run_id: str, after_seq: int, tail: _Tail,
                    head: Head | None = None) -> int | None:
        """Refuse a log that disagrees with its head (see base.check_head); the head's seq
        when the log's last batch is past it, an append a crash cut off before its head:
        never acknowledged, so readers skip it and the next writer cuts it. (``head``: read
        before the log was, by a reader without the run's lock, which a writer may pass.)"""
        if not self._heads:
            return None
        end = (tail.last_seq, tail.digest) if tail.last_seq else None
        head, before = head or self._read_head(run_id), tail.before
        check_head(run_id, after_seq, end, head, behind=before[:2] if before else None)
        return head[0] if end is not None and head is not None and end != head else None

    def _acknowledged(self, run_id: str, tail: _Tail,
                      torn: _Torn | None) -> tuple[_Tail, _Torn | None]:
        """``tail`` up to the run's head, and what a writer cuts after it: an incomplete
        final batch, or a complete one past the head (see _check_head)."""
        if self._check_head(run_id, 0, tail) is None or tail.before is None:
            return tail, torn
        seq, digest, size = tail.before
        end = torn.offset + torn.size if torn is not None else tail.size
        return (_Tail(size, seq, tail.created_at if seq else None, tail.updated_at, digest),
                _Torn(size, end - size, "a complete batch past the run's head: a crash came "
                      "between its write and its head's"))

    @_os_errors("read the heads", write=False)
    def heads(self) -> dict[str, Head]:
        if not self._heads:
            return {}
        found = {}
        for path in self.path.glob("*" + _HEAD_FILE):
            run_id = path.name[: -len(_HEAD_FILE)]
            with self._reading(run_id) as fd:  # (None: archived, its head is gone)
                head = self._read_head(run_id) if fd is not None else None
            if head is not None and head[0]:
                found[run_id] = head
        return dict(sorted(found.items()))

    def _file(self, run_id: str, suffix: str) -> Path:
        return self.path / f"{run_id}{suffix}"

    def _locked(self, run_id: str, *, write: bool) -> _RunLock:
        """This instance's thread lock plus the run's cross-process flock."""
        return _RunLock(self, run_id, write)

    def _cached_fd(self, cache: OrderedDict[str, int], run_id: str, suffix: str,
                   flags: int) -> int:
        """The run's open descriptor for ``suffix``; opened (and the oldest closed) if need be."""
        fd = cache.pop(run_id, None)
        if fd is None:
            fd = os.open(f"{self._dir}/{run_id}{suffix}", flags | os.O_CLOEXEC, 0o644)
            if len(cache) >= _OPEN_RUNS:
                os.close(cache.popitem(last=False)[1])
        cache[run_id] = fd
        return fd

    def _log_fd(self, run_id: str) -> int | None:
        """The run's log, open for appending; None while the run has no file."""
        if run_id not in self._log_fds and not os.path.exists(f"{self._dir}/{run_id}.jsonl"):
            return None
        return self._cached_fd(self._log_fds, run_id, ".jsonl", os.O_RDWR | os.O_APPEND)

    @contextmanager
    def _flocked(self, lock: Path, *, write: bool, run_id: str | None) -> Iterator[None]:
        with self._lock:
            if write and self._broken:
                raise DurabilityError(self._broken, run_id=run_id)
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)  # closing releases the flock

    # --- durability ------------------------------------------------------------

    def _sync(self, fd: int) -> None:
        """The durability point (a fault-injection seam for tests)."""
        os.fsync(fd)

    def _datasync(self, fd: int) -> None:
        """The durability point of a file rewritten in place, whose size never changes
        (a head): its data only, not its times (a seam for tests, as _sync)."""
        os.fdatasync(fd)

    def _durable(self, fd: int, run_id: str | None, rollback_to: int | None = None,
                 *, datasync: bool = False) -> None:
        try:
            (self._datasync if datasync else self._sync)(fd)
        except OSError as exc:
            # Never retried: after a failed fsync the OS may have dropped the
            # dirty pages while still showing them, so this handle stops writing.
            if rollback_to is not None:
                with suppress(OSError):
                    os.ftruncate(fd, rollback_to)
            self._broken = f"fsync failed: {exc}"
            raise DurabilityError(self._broken, run_id=run_id) from exc

    def _sync_dir(self, run_id: str | None, directory: Path | None = None) -> None:
        fd = os.open(directory or self.path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            self._durable(fd, run_id)
        finally:
            os.close(fd)

    def _publish(self, path: Path, data: bytes, run_id: str | None) -> None:
        """Write-fsync-rename-fsync(dir): readers see the old file or the new, never half."""
        self._publish_all({path: data}, run_id)

    def _publish_all(self, files: Mapping[Path, bytes], run_id: str | None) -> None:
        """``_publish`` for files of one directory, its sync shared by all of them."""
        for path, data in files.items():
            tmp = path.with_name(path.name + ".tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            try:
                _write_all(fd, data)
                self._durable(fd, run_id)
            except BaseException:
                with suppress(OSError):
                    os.unlink(tmp)
                raise
            finally:
                os.close(fd)
            os.replace(tmp, path)
        if files:
            self._sync_dir(run_id, next(iter(files)).parent)

    # --- scanning --------------------------------------------------------------

    def _scan(self, run_id: str, fd: int, start: _Tail,
              after_seq: int = 0) -> tuple[_Tail, list[Event], _Torn | None]:
        """Verify the batches from ``start.size`` on and decode the events after
        ``after_seq``; also return the incomplete final batch after them, if any.

        Never changes the file. Records up to ``after_seq`` are checked by their CRC
        alone: it proves the bytes are as written, and their seqs follow from their
        position; the next record chains from the digest the one at ``after_seq`` stores.
        (So with ``after_seq`` the tail's digest is not known: keep only the events.)
        Call with the run's flock held, so no writer is mid-append.
        """
        chunks, offset = [], start.size
        while chunk := os.pread(fd, _CHUNK, offset):
            chunks.append(chunk)
            offset += len(chunk)
        data = b"".join(chunks)
        view = memoryview(data)
        events: list[Event] = []
        seq, prev, pos = start.last_seq, start.digest, 0
        done = (seq, prev, 0, 0)  # (seq, digest, events, bytes) up to the last complete batch
        before = start.before  # (seq, digest, size) where the last complete batch starts
        while (nl := data.find(b"\n", pos)) != -1:
            at = pos + 9  # the mark (or, on an old line, the JSON)
            if data[pos:at] != b"%08x " % zlib.crc32(view[at:nl]):
                where = f"byte {start.size + pos}"
                if _whole(data[pos:nl]):
                    raise CorruptLogError(run_id, seq + 1, f"bad checksum at {where}")
                if any(map(_whole, data[nl + 1 :].split(b"\n")[:-1])):
                    raise CorruptLogError(run_id, seq + 1, f"the bytes at {where} are no "
                                          "record, yet whole records follow them")
                break  # leftovers of an incomplete final batch start here
            seq += 1
            mark = data[at]  # (the newline itself on a line with nothing after the CRC)
            if mark == _OLD:
                body = data[at:nl]
            elif mark in (_MORE, _END):
                body = data[at + 1 : nl]
            else:
                raise CorruptLogError(run_id, seq, f"unknown record mark {chr(mark)!r}")
            if seq > after_seq:
                event, prev = decode_record(run_id, seq, body, prev, sealed_store=self._sealed,
                                            heads_missing=self._heads_missing)
                events.append(event)
            elif seq == after_seq or mark != _MORE:  # (a batch's end: see _Tail.before)
                prev = stored_digest(body)
            pos = nl + 1
            if mark != _MORE:
                before = (done[0], done[1], start.size + done[3])
                done = (seq, prev, len(events), pos)
        last_seq, prev, kept, end = done
        torn = _torn(data, end, pos, seq - last_seq, start.size)
        del events[kept:]  # those of an incomplete final batch
        tail = _Tail(start.size + end, last_seq, start.created_at, start.updated_at, prev,
                     before)
        if events:
            first_ts = events[0].ts if events[0].seq == 1 else start.created_at
            tail = tail._replace(created_at=first_ts, updated_at=events[-1].ts)
        return tail, events, torn

    def _cut(self, run_id: str, fd: int, torn: _Torn) -> None:
        """Cut an incomplete final batch, before a writer appends after it."""
        os.ftruncate(fd, torn.offset)
        self._durable(fd, run_id)  # first, so no leftover of it can outlive the append
        self.repairs.append(TailRepair(run_id, torn.offset, torn.size, torn.reason))
        log.warning(
            "run %r: cut an incomplete final batch, %d bytes at offset %d (%s). An append "
            "returns only once its whole batch is written and synced, so under FSYNC "
            "durability this batch was never acknowledged; under BATCHED a power cut can "
            "tear an acknowledged one",
            run_id, torn.size, torn.offset, torn.reason,
        )

    def _refresh(self, run_id: str, fd: int) -> tuple[_Tail, _Torn | None]:
        """The run's tail (and any incomplete final batch after it), rescanning only what
        changed since this instance last looked."""
        known = self._tails.get(run_id)
        size = os.fstat(fd).st_size
        if known is not None and size == known.size:
            return known, None
        if known is None or size < known.size:  # first touch, or shrunk under us
            known = _EMPTY
        tail, _, torn = self._scan(run_id, fd, known)
        tail, torn = self._acknowledged(run_id, tail, torn)
        self._tails[run_id] = tail
        return tail, torn

    @contextmanager
    def _reading(self, run_id: str) -> Iterator[int | None]:
        """The run's log open for reading, under the run's lock; None when it has none
        (never written, or deleted by gc)."""
        path = f"{self._dir}/{run_id}.jsonl"
        if not os.path.exists(path):
            yield None
            return
        with self._locked(run_id, write=False):
            if self._buried(run_id):
                yield None
                return
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                yield fd
            finally:
                os.close(fd)

    def _tail(self, run_id: str) -> _Tail:
        with self._reading(run_id) as fd:
            return _EMPTY if fd is None else self._refresh(run_id, fd)[0]

    # --- the log ---------------------------------------------------------------

    @_os_errors("append to a run", write=True)
    def append(self, run_id: str, events: Sequence[Event], *, expected_seq: int, epoch: int,
               alone_in: str | None = None) -> int:
        validate_run_id(run_id)
        check_batch(run_id, events, expected_seq, epoch)
        with self._locked(run_id, write=True):
            if (expected_seq == 0 or run_id not in self._tails) and self._buried(run_id):
                raise ArchivedRunError(run_id, *self._stone_at(run_id))
            fd = self._log_fd(run_id)
            tail, torn = (_EMPTY, None) if fd is None else self._refresh(run_id, fd)
            current = self._epoch(run_id)
            if epoch != current:  # fencing first: a stale writer must stop, not retry
                raise FencedError(run_id, epoch, current)
            if tail.last_seq != expected_seq:
                raise ConflictError(run_id, expected_seq, tail.last_seq)
            if alone_in is not None and any(r != run_id for r in self.scope_runs(alone_in)):
                raise ScopeSharedError(run_id, alone_in)
            if (scope := scope_started(events)) is not None:
                self._register_scope(scope, run_id)  # before the log: never missing
            bodies, digest = seal(events, tail.digest)
            data = _frame_batch(bodies)
            if fd is None:  # a new run: create its files, their directory entries durable
                fd = self._cached_fd(self._log_fds, run_id, ".jsonl",
                                     os.O_RDWR | os.O_APPEND | os.O_CREAT)
                self._head_fd(run_id)
                self._sync_dir(run_id)
            elif torn is not None:  # only a writer cuts, and only right before it writes
                self._cut(run_id, fd, torn)
            try:
                # Under the flock no reader sees a part; a short write (a full disk, a
                # file size limit) is followed by one that fails with the OS's reason.
                _write_all(fd, data)
            except OSError:
                try:
                    os.ftruncate(fd, tail.size)
                except OSError as exc:  # a torn record may now sit at the end
                    self._broken = f"write failed and could not be undone: {exc}"
                raise
            synced = self._after_write(fd, run_id, tail.size)
            self._tails[run_id] = _Tail(
                tail.size + len(data),
                events[-1].seq,
                tail.created_at or events[0].ts,
                events[-1].ts,
                digest,
                (tail.last_seq, tail.digest, tail.size),
            )
            self._write_head(run_id, events[-1].seq, digest, sync=synced)
        return events[-1].seq

    def _after_write(self, fd: int, run_id: str, size_before: int) -> bool:
        """Sync the log as the durability says; whether it did (the head then is too)."""
        if self.durability is Durability.BATCHED:
            pending = self._unsynced.get(run_id, 0) + 1
            if pending < self.batch_every:
                self._unsynced[run_id] = pending
                return False
            self._unsynced.pop(run_id, None)
        self._durable(fd, run_id, rollback_to=size_before)
        return True

    def read(self, run_id: str, after_seq: int = 0, upto: int | None = None
             ) -> Iterator[Event]:
        validate_run_id(run_id)
        events = self._read(run_id, after_seq)  # (a generator: the work is in _read)
        yield from events if upto is None else (e for e in events if e.seq <= upto)

    @_os_errors("read a run", write=False)
    def _read(self, run_id: str, after_seq: int) -> list[Event]:
        with self._reading(run_id) as fd:
            if fd is None:
                if not os.path.exists(f"{self._dir}/{run_id}{_TOMB}"):  # (archived: no head)
                    self._check_head(run_id, after_seq, _EMPTY)  # was its log deleted?
                return []
            head = self._read_head(run_id) if self._heads else None
            # Without the store's record of heads, every record is decoded wherever the
            # read starts: one that proves heads were kept may sit before the start.
            scan_from = after_seq if self._heads_missing is None else 0
            start = self._resume_point(run_id, fd, scan_from) if scan_from else None
            tail, events, _ = self._scan(run_id, fd, start or _EMPTY, scan_from)
            if scan_from != after_seq:
                events = [e for e in events if e.seq > after_seq]
            if (head_seq := self._check_head(run_id, after_seq, tail, head)) is not None:
                return [e for e in events if e.seq <= head_seq]  # (see _check_head)
            # A partial scan from an unchecked start learns neither the start time nor
            # the digest; one from a resume point knows both.
            if not scan_from or start is not None:
                self._tails[run_id] = tail
        return events

    def _resume_point(self, run_id: str, fd: int, seq: int) -> _Tail | None:
        """The file up to the record at ``seq``, from a snapshot's mark, if the record
        just before the mark checks out, ends a batch and is ``seq``; else None."""
        offset = self._marks.get(run_id, {}).get(seq)
        if offset is None or offset > os.fstat(fd).st_size:
            return None
        last = _record(_line_ending_at(fd, offset))
        first = _record(_line_ending_at(fd, _first_line_end(fd)))
        if last is None or first is None or last[0] not in (_END, _OLD):
            return None
        try:
            event, created = decode_stored(last[1]), decode_stored(first[1]).ts
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError):
            return None
        if event.seq != seq or event.run_id != run_id:
            return None
        return _Tail(offset, seq, created, event.ts, stored_digest(last[1]))

    @_os_errors("read a run", write=False)
    def last_seq(self, run_id: str) -> int:
        validate_run_id(run_id)
        return self._tail(run_id).last_seq

    @_os_errors("list runs", write=False)
    def list_runs(self, *, limit: int | None = None) -> list[RunInfo]:
        """Every run, newest first. A log unchanged since a listing read it (same file,
        size and mtime, see sidecar.py) is not opened again."""
        known = self._sidecar.tails()
        runs: list[Listed] = []
        fresh: list[tuple[Stamp, Listed]] = []
        with os.scandir(self.path) as found:
            entries = {entry.name: entry for entry in found}
        for name, entry in entries.items():
            run_id = name[: -len(".jsonl")]
            if not name.endswith(".jsonl") or not _valid_run_id(run_id):
                continue  # not a file this store wrote
            try:
                st = entry.stat()
            except FileNotFoundError:
                continue  # (deleted since the directory was read)
            stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
            cached = known.get(run_id)
            if cached is not None and cached[0] == stamp and run_id + _TOMB not in entries:
                runs.append(cached[1])
                continue
            try:
                tail = self._tail(run_id)
            except CorruptLogError as exc:
                # Listed all the same (with at least ``exc.seq`` events), so one damaged
                # run hides no other; reading it raises, for its caller to report.
                changed = datetime.fromtimestamp(st.st_mtime, UTC)
                runs.append(listed(RunInfo(run_id, exc.seq, None, changed)))
                continue
            if tail.last_seq:  # a run exists once it has events, as in SQLiteStore
                row = listed(RunInfo(run_id, tail.last_seq, tail.created_at,
                                     tail.updated_at))
                runs.append(row)
                fresh.append((stamp, row))  # (stat before the read: never ahead of it)
        with suppress(OSError, sqlite3.Error):  # a cache: a listing that could not keep it
            self._sidecar.put_tails(fresh)
        newest = heapq.nlargest(limit, runs) if limit else sorted(runs, reverse=True)
        return [run_info(row) for row in newest]

    def outlines(self, run_ids: Collection[str] | None = None, *,
                 attention: bool = False) -> dict[str, RunState | JournalError]:
        """Each run's outline as of its head (see SQLiteStore.outlines): the sidecar's,
        caught up from the log first where it is behind (a writable handle keeps what
        it folded)."""
        stored = self._sidecar.rows()
        rows = []
        for info in self.list_runs():
            if run_ids is not None and info.run_id not in run_ids:
                continue
            seq, body, flagged = stored.get(info.run_id, (None, None, True))
            if attention and seq == info.last_seq and not flagged:
                continue
            rows.append(Stored(info.run_id, info.last_seq, seq, body))
        out = served(rows, self.read, attention=attention)
        self._sidecar.put((run_id, st) for run_id, st in out.items()
                          if isinstance(st, RunState)
                          and stored.get(run_id, (None,))[0] != st.last_seq)
        return out

    def put_outline(self, run_id: str, state: RunState) -> None:
        self._sidecar.put([(validate_run_id(run_id), state)])

    #: Outlines are caught up from the logs when read (a writer keeps them in the
    #: sidecar, a read-only handle in memory): there is no older format to project.
    projected = True

    # --- scopes: which runs share an idempotency scope ---------------------------
    #
    # ``_scopes/<sha256(scope)>.runs`` lists the runs started in a scope, a line
    # each, written (and synced) before the run's first batch. A run id whose log
    # never got written is harmless: it has no events, so no effects.

    def _scope_file(self, scope: str) -> str:
        name = hashlib.sha256(scope.encode()).hexdigest()[:32]
        return f"{self._dir}/{_SCOPES}/{name}.runs"

    def _register_scope(self, scope: str, run_id: str) -> None:
        directory = self.path / _SCOPES
        if not directory.is_dir():
            directory.mkdir(exist_ok=True)
            self._sync_dir(run_id)
        path = self._scope_file(scope)
        created = not os.path.exists(path)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            _write_all(fd, f"{run_id}\n".encode())
            self._durable(fd, run_id)
        finally:
            os.close(fd)
        if created:
            self._sync_dir(run_id, directory)

    @_os_errors("read a scope", write=False)
    def scope_runs(self, scope: str) -> list[str]:
        try:
            with open(self._scope_file(scope), "rb") as f:
                lines = f.read().split(b"\n")[:-1]  # a torn last line has no newline
        except FileNotFoundError:
            return []
        runs = dict.fromkeys(line.decode("utf-8", "replace") for line in lines)
        return [r for r in runs
                if self._file(r, ".jsonl").exists() and not self._file(r, _TOMB).exists()]

    # --- leases ----------------------------------------------------------------

    def _read_lease(self, run_id: str) -> _LeaseRecord | None:
        try:
            raw = self._file(run_id, ".lease").read_bytes()
        except FileNotFoundError:
            return None
        try:
            return msgspec.json.decode(raw, type=_LeaseRecord)
        except msgspec.DecodeError as exc:
            raise CorruptLogError(run_id, 0, f"unreadable lease file: {exc}") from None

    def _epoch(self, run_id: str) -> int:
        # The lease file is replaced whole on every change, so (inode, mtime, size)
        # tells whether the epoch read last time still holds.
        try:
            st = os.stat(f"{self._dir}/{run_id}.lease")
        except FileNotFoundError:
            return 0
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        cached = self._epochs.get(run_id)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        lease = self._read_lease(run_id)
        epoch = lease.epoch if lease else 0
        self._epochs[run_id] = (stamp, epoch)
        return epoch

    def _write_lease(self, run_id: str, record: _LeaseRecord) -> None:
        # Write-fsync-rename-fsync(dir): readers see the old lease or the new, never half.
        tmp = self._file(run_id, ".lease.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            _write_all(fd, msgspec.json.encode(record))  # a short write must not be published
            self._durable(fd, run_id)
        finally:
            os.close(fd)
        os.replace(tmp, self._file(run_id, ".lease"))
        self._sync_dir(run_id)

    @_os_errors("take a lease", write=True)
    def acquire(self, run_id: str, owner: str, ttl: float) -> Lease:
        validate_run_id(run_id)
        with self._locked(run_id, write=True):
            row = self._read_lease(run_id)
            left = row.remaining() if row else 0.0
            if row is None:
                epoch = 1
            elif left > 0 and row.owner == owner:
                epoch = row.epoch  # the holder re-acquiring: a renewal
            elif left > 0:
                raise LeaseHeldError(run_id, row.owner, row.epoch, left)
            else:
                epoch = row.epoch + 1  # takeover of an expired or released lease
            record = _new_lease(owner, epoch, ttl)
            self._write_lease(run_id, record)
        return Lease(run_id, owner, epoch, record.expires_at)

    @_os_errors("read a lease", write=False)
    def holder(self, run_id: str) -> Lease | None:
        validate_run_id(run_id)
        row = self._read_lease(run_id)
        if row is None:
            return None
        expires_at = time.time() + row.remaining() if row.expires_at > 0 else 0.0
        return Lease(run_id, row.owner, row.epoch, expires_at)

    @_os_errors("renew a lease", write=True)
    def renew(self, lease: Lease, ttl: float) -> Lease:
        validate_run_id(lease.run_id)
        with self._locked(lease.run_id, write=True):
            row = self._read_lease(lease.run_id)
            current = row.epoch if row else 0
            if row is None or current != lease.epoch:
                raise FencedError(lease.run_id, lease.epoch, current)
            if row.expires_at <= 0:  # released: see release
                raise LeaseReleasedError(lease.run_id, lease.epoch)
            record = _new_lease(row.owner, row.epoch, ttl)
            self._write_lease(lease.run_id, record)
        return Lease(lease.run_id, lease.owner, lease.epoch, record.expires_at)

    @_os_errors("release a lease", write=True)
    def release(self, lease: Lease) -> None:
        validate_run_id(lease.run_id)
        with self._locked(lease.run_id, write=True):
            row = self._read_lease(lease.run_id)
            if row is not None and row.epoch == lease.epoch:
                released = msgspec.structs.replace(row, expires_at=0.0, boot_deadline=0.0)
                self._write_lease(lease.run_id, released)

    # --- snapshots ---------------------------------------------------------------

    def _snap_dir(self, run_id: str) -> Path:
        return self._file(run_id, _SNAP_SUFFIX)

    def _load_snap(
        self, path: Path, run_id: str, *, body: bool
    ) -> tuple[_SnapHeader, bytes] | None:
        """A snapshot file's header (and body); None, with a warning, if it is damaged."""
        try:
            with open(path, "rb") as f:
                data = f.read() if body else f.readline(_MAX_HEADER)
        except FileNotFoundError:
            return None  # pruned by another handle since the listing
        nl = data.find(b"\n")
        try:
            if nl == -1:
                raise ValueError("no header line")
            header = msgspec.json.decode(data[:nl], type=_SnapHeader)
            if header.run_id != run_id or path.name != _snap_name(header.seq, header.fold_version):
                raise ValueError(f"header names {header.run_id!r}#{header.seq}")
        except (msgspec.DecodeError, ValueError) as exc:
            log.warning("run %r: skipped unreadable snapshot %s: %s", run_id, path.name, exc)
            return None
        return header, data[nl + 1 :]

    def _scan_snaps(
        self, run_id: str, *, body: bool
    ) -> tuple[list[tuple[Path, _SnapHeader, bytes]], list[Path]]:
        """The run's readable snapshots, newest first, and its unreadable ``.snap`` files."""
        good: list[tuple[Path, _SnapHeader, bytes]] = []
        bad: list[Path] = []
        try:
            paths = sorted(self._snap_dir(run_id).glob("*.snap"))  # never *.tmp
        except FileNotFoundError:
            return good, bad
        for path in paths:
            loaded = self._load_snap(path, run_id, body=body)
            if loaded is None:
                if path.exists():
                    bad.append(path)
            else:
                good.append((path, *loaded))
        good.sort(key=lambda g: (g[1].seq, g[1].created_at.timestamp(), g[0].name), reverse=True)
        return good, bad

    @_os_errors("write a snapshot", write=True)
    def put_snapshot(self, snapshot: Snapshot, *, keep: int = 2) -> None:
        run_id = validate_run_id(snapshot.run_id)
        header = _SnapHeader(
            run_id,
            snapshot.seq,
            snapshot.schema_version,
            snapshot.fold_version,
            snapshot.digest,
            snapshot.created_at,
        )
        known = self._tails.get(run_id)
        if known is not None and known.last_seq == snapshot.seq:
            header = msgspec.structs.replace(header, log_offset=known.size)
        data = msgspec.json.encode(header) + b"\n" + snapshot.body
        with self._locked(run_id, write=True):  # one writer at a time: prunes never interleave
            directory = self._snap_dir(run_id)
            if not directory.is_dir():
                directory.mkdir()
                self._sync_dir(run_id)
            for stale in directory.glob("*.tmp"):  # left by a crash before a publish
                with suppress(OSError):
                    stale.unlink()
            self._publish(directory / _snap_name(snapshot.seq, snapshot.fold_version), data, run_id)
            # Only once the new one is durable: prune, keeping the newest ``keep``.
            self._prune(run_id, max(keep, 1))

    def _prune(self, run_id: str, keep: int) -> int:
        """Delete all but the newest ``keep`` readable snapshots (and unreadable ones)."""
        good, bad = self._scan_snaps(run_id, body=False)
        doomed = [path for path, _, _ in good[keep:]] + bad
        for path in doomed:
            with suppress(FileNotFoundError):
                path.unlink()
        if doomed:
            self._sync_dir(run_id, self._snap_dir(run_id))
        return len(doomed)

    @_os_errors("prune snapshots", write=True)
    def prune_snapshots(self, run_id: str, *, keep: int) -> int:
        validate_run_id(run_id)
        if not self._snap_dir(run_id).is_dir():
            return 0
        with self._locked(run_id, write=True):
            return self._prune(run_id, max(keep, 0))

    @_os_errors("read snapshots", write=False)
    def snapshots(self, run_id: str, *, limit: int | None = None) -> list[Snapshot]:
        validate_run_id(run_id)
        if not self._snap_dir(run_id).is_dir():
            return []  # and no lock file created for a run that has none
        try:
            self._read_quarantine()
        except (OSError, CorruptStoreError) as exc:
            # Which fold versions are unsafe is unknown: load none until it is fixed.
            log.warning("run %r: not using snapshots: %s", run_id, exc)
            return []
        with self._locked(run_id, write=False):
            # Headers first, so only the bodies asked for are read.
            heads, _ = self._scan_snaps(run_id, body=False)
            loaded = [self._load_snap(path, run_id, body=True) for path, _, _ in heads[:limit]]
        self._marks[run_id] = {h.seq: h.log_offset for _, h, _ in heads[:4] if h.log_offset}
        return [
            Snapshot(
                run_id=run_id,
                seq=h.seq,
                schema_version=h.schema_version,
                fold_version=h.fold_version,
                digest=h.digest,
                body=body,
                created_at=h.created_at,
            )
            for h, body in filter(None, loaded)
        ]

    @_os_errors("delete snapshots", write=True)
    def delete_snapshots(self, run_id: str) -> int:
        validate_run_id(run_id)
        directory = self._snap_dir(run_id)
        if not directory.is_dir():
            if self._broken:  # a write like any other: refused on a broken handle
                raise DurabilityError(self._broken, run_id=run_id)
            return 0
        with self._locked(run_id, write=True):
            good, _ = self._scan_snaps(run_id, body=False)
            self._remove_snapshots(run_id)
        return len(good)

    # Views: ``<name>.view`` in the run's snapshot directory (gone with it), the seq
    # on the first line; replaced by rename, not synced (a cache: the log says it again).

    @_os_errors("write a view", write=True)
    def put_view(self, run_id: str, name: str, seq: int, body: bytes) -> None:
        validate_run_id(run_id)
        path = self._snap_dir(run_id) / _view_name(name)
        with self._locked(run_id, write=True):
            path.parent.mkdir(exist_ok=True)
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_bytes(b"%d\n" % seq + body)
            os.replace(tmp, path)

    @_os_errors("read a view", write=False)
    def view(self, run_id: str, name: str) -> tuple[int, bytes] | None:
        validate_run_id(run_id)
        try:
            data = (self._snap_dir(run_id) / _view_name(name)).read_bytes()
        except FileNotFoundError:
            return None
        seq, _, body = data.partition(b"\n")
        return (int(seq), body) if seq.isdigit() else None

    # Segments: ``<digest>.seg`` in the run's snapshot directory, each published as a
    # snapshot is (write, fsync, rename), before the snapshot that names them.

    @_os_errors("write snapshot segments", write=True)
    def put_segments(self, run_id: str, segments: Mapping[str, bytes]) -> None:
        validate_run_id(run_id)
        with self._locked(run_id, write=True):
            directory = self._snap_dir(run_id)
            if not directory.is_dir():
                directory.mkdir()
                self._sync_dir(run_id)
            self._publish_all({directory / _segment_name(digest): body
                               for digest, body in segments.items()}, run_id)

    @_os_errors("read snapshot segments", write=False)
    def segments(self, run_id: str, digests: Collection[str]) -> dict[str, bytes]:
        validate_run_id(run_id)
        directory, found = self._snap_dir(run_id), dict[str, bytes]()
        if not directory.is_dir():
            return found
        with self._locked(run_id, write=False):
            for digest in filter(_DIGEST.fullmatch, digests):  # (no other name is a file)
                with suppress(FileNotFoundError):
                    found[digest] = (directory / _segment_name(digest)).read_bytes()
        return found

    def segment_digests(self, run_id: str) -> set[str]:
        validate_run_id(run_id)
        # Every .seg file, digest or not: what prune_segments would weigh.
        return {p.name.removesuffix(".seg") for p in self._snap_dir(run_id).glob("*.seg")}

    @_os_errors("prune snapshot segments", write=True)
    def prune_segments(self, run_id: str, keep: Collection[str]) -> int:
        validate_run_id(run_id)
        directory = self._snap_dir(run_id)
        if not directory.is_dir():
            return 0
        wanted = {_segment_name(digest) for digest in filter(_DIGEST.fullmatch, keep)}
        with self._locked(run_id, write=True):
            doomed = [p for p in directory.glob("*.seg") if p.name not in wanted]
            for path in doomed:
                with suppress(FileNotFoundError):
                    path.unlink()
            if doomed:
                self._sync_dir(run_id, directory)
        return len(doomed)

    def _remove_snapshots(self, run_id: str) -> None:
        directory = self._snap_dir(run_id)
        try:
            entries = list(directory.iterdir())
        except FileNotFoundError:
            return  # none, or deleted by another handle meanwhile
        for path in entries:
            with suppress(FileNotFoundError):
                path.unlink()
        self._sync_dir(run_id, directory)
        directory.rmdir()
        self._sync_dir(run_id)

    # --- retention: tombstones (see the module docstring) -------------------------

    def _buried(self, run_id: str) -> bool:
        """Whether gc deleted the run (its tombstone stands). Under the run's lock; a
        writable handle removes a log a crash left beside the tombstone."""
        if not os.path.exists(f"{self._dir}/{run_id}{_TOMB}"):
            return False
        if not self.readonly and os.path.exists(f"{self._dir}/{run_id}.jsonl"):
            self._drop_log(run_id)
        return True

    def _drop_log(self, run_id: str) -> None:
        """Remove the run's log and snapshots, and forget what this handle knew of them."""
        for cache in (self._log_fds, self._head_fds):
            fd = cache.pop(run_id, None)
            if fd is not None:
                os.close(fd)
        for known in (self._tails, self._marks, self._unsynced):
            known.pop(run_id, None)
        for suffix in (".jsonl", _HEAD_FILE):
            with suppress(FileNotFoundError):
                os.unlink(f"{self._dir}/{run_id}{suffix}")
        self._remove_snapshots(run_id)
        self._sync_dir(run_id)
        self._sidecar.drop(run_id)

    def _stone_at(self, run_id: str) -> tuple[str, int]:
        stone = self._read_stone(run_id)
        return (stone.archive, stone.last_seq) if stone else ("an archive", 0)

    def _read_stone(self, run_id: str) -> Tombstone | None:
        try:
            raw = self._file(run_id, _TOMB).read_bytes()
        except FileNotFoundError:
            return None
        try:
            return msgspec.json.decode(raw, type=Tombstone)
        except msgspec.DecodeError as exc:
            raise CorruptLogError(run_id, 0, f"unreadable tombstone: {exc}") from None

    @_os_errors("read a run", write=False)
    def records(self, run_id: str) -> list[bytes]:
        validate_run_id(run_id)
        with self._reading(run_id) as fd:
            if fd is None:
                return []
            tail, _, _ = self._scan(run_id, fd, _EMPTY)  # checks each record, as read does
            past = self._check_head(run_id, 0, tail) is not None and tail.before is not None
            data = os.pread(fd, tail.before[2] if past and tail.before else tail.size, 0)
        # Every line up to the tail is a whole, checked record of a complete batch.
        return [line[10:] if line[9] != _OLD else line[9:] for line in data.split(b"\n")[:-1]]

    @_os_errors("delete a run", write=True)
    def delete_run(self, tombstone: Tombstone, *, epoch: int) -> None:
        run_id = validate_run_id(tombstone.run_id)
        with self._locked(run_id, write=True):
            current = self._epoch(run_id)
            if epoch != current:
                raise FencedError(run_id, epoch, current)
            fd = None if self._buried(run_id) else self._log_fd(run_id)
            last = 0 if fd is None else self._refresh(run_id, fd)[0].last_seq
            if last != tombstone.last_seq:
                raise ConflictError(run_id, tombstone.last_seq, last)
            self._publish(self._file(run_id, _TOMB), msgspec.json.encode(tombstone), run_id)
            self._drop_log(run_id)

    @_os_errors("read a tombstone", write=False)
    def tombstone(self, run_id: str) -> Tombstone | None:
        return self._read_stone(validate_run_id(run_id))

    @_os_errors("list tombstones", write=False)
    def tombstones(self) -> list[Tombstone]:
        stones = [self._read_stone(p.name[: -len(_TOMB)]) for p in self.path.glob("*" + _TOMB)]
        return sorted(filter(None, stones), key=lambda t: (t.deleted_at, t.run_id))

    @_os_errors("restore a run", write=True)
    def restore_run(self, run_id: str, records: Sequence[bytes]) -> None:
        validate_run_id(run_id)
        if not records:
            raise ValueError("restore_run needs the records of a whole log")
        events = check_records(run_id, records)
        with self._locked(run_id, write=True):
            stone = self._read_stone(run_id)
            if stone is None:
                raise NotArchivedError(run_id, "it has no tombstone here")
            if records_digest(records) != stone.digest:
                raise CorruptLogError(run_id, len(records), "these records are not the log "
                                      "its tombstone names (their digest differs)")
            if (scope := scope_started(events)) is not None:
                self._register_scope(scope, run_id)
            self._drop_log(run_id)
            # The log goes back beside the tombstone; lifting the tombstone is the commit.
            self._publish(self._file(run_id, ".jsonl"), _frame_batch(list(records)), run_id)
            self._publish(self._file(run_id, _HEAD_FILE),
                          _head_line(len(records), stored_digest(records[-1])), run_id)
            os.unlink(self._file(run_id, _TOMB))
            self._sync_dir(run_id)

    def _read_quarantine(self) -> dict[int, str]:
        path = self.path / _QUARANTINE
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return {}
        try:
            return msgspec.json.decode(raw, type=dict[int, str])
        except msgspec.DecodeError as exc:
            # Never read as "nothing quarantined": that could load a known-bad fold.
            raise CorruptStoreError(str(path), f"its quarantine record does not decode "
                                    f"({exc})") from None

    @_os_errors("record a quarantine", write=True)
    def quarantine(self, fold_version: int, reason: str) -> None:
        with self._flocked(self.path / "_quarantine.lock", write=True, run_id=None):
            record = self._read_quarantine()
            record[fold_version] = reason
            self._publish(self.path / _QUARANTINE, msgspec.json.encode(record), None)

    @_os_errors("read the quarantine record", write=False)
    def quarantined(self) -> dict[int, str]:
        return self._read_quarantine()  # replaced whole, so no lock is needed to read it

    @_os_errors("close the store", write=False)
    def close(self) -> None:
        """Fsync what BATCHED left unsynced, close open files; ``DurabilityError`` if a sync
        fails."""
        self._sidecar.close()
        with self._lock:
            pending, self._unsynced = list(self._unsynced), {}
            failure: DurabilityError | None = None
            for run_id in pending:
                for suffix in (".jsonl", _HEAD_FILE):  # the log first: never a head ahead
                    fd = os.open(self._file(run_id, suffix), os.O_RDONLY | os.O_CLOEXEC)
                    try:
                        self._durable(fd, run_id, datasync=suffix == _HEAD_FILE)
                    except DurabilityError as exc:
                        failure = failure or exc
                    finally:
                        os.close(fd)
            for cache in (self._lock_fds, self._log_fds, self._head_fds):
                while cache:
                    os.close(cache.popitem()[1])
            if failure:
                raise failure

    def __enter__(self) -> JsonlStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
