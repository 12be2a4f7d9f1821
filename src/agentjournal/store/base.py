"""Layer 3: the store contract every backend implements and the conformance suite checks.

- ``append(run_id, events, expected_seq=, epoch=) -> last_seq``: atomic for the
  batch; seqs contiguous from 1; ``ConflictError`` if the log does not end at
  ``expected_seq``; ``FencedError`` if ``epoch`` is not the run's lease epoch.
  Acknowledged means durable under the store's ``Durability``. ``alone_in=scope``:
  ``ScopeSharedError`` (nothing written) if another run of ``scope`` has events, checked
  in the append's own transaction: a start that needs no peer asked, in one round trip.
- ``read(run_id, after_seq=0)`` yields events in order.
- Leases: ``acquire`` takes over only an expired or released lease (or none)
  and then increments the epoch, the fencing token; ``renew``; ``release``.
  Epoch 0 means "no lease": it may append only while nobody ever took one.
"""

from __future__ import annotations

import functools
import hashlib
import re
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from datetime import datetime
from enum import StrEnum
from typing import Protocol, runtime_checkable

import msgspec

from ..errors import (
    ArchivedRunError,
    CorruptLogError,
    CorruptStoreError,
    EncodingError,
    InvalidRunIdError,
    JournalError,
    RunNotFoundError,
)
from ..events import (
    GENESIS,
    HEADS_SINCE,
    SCHEMA_VERSION,
    SEALED_SINCE,
    Event,
    EventType,
    decode_stored,
    newer_than_labelled,
    unseal,
    upcast,
)
from ..state import RunState

MAX_RUN_ID = 128
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]*")


def validate_run_id(run_id: object) -> str:
    """``run_id`` if it is safe as a file name and a key; else ``InvalidRunIdError``."""
    if not isinstance(run_id, str):
        raise InvalidRunIdError(repr(run_id), "it is not a string")
    if not run_id:
        raise InvalidRunIdError(run_id, "it is empty")
    if len(run_id) > MAX_RUN_ID:
        raise InvalidRunIdError(run_id, f"it is {len(run_id)} characters, over {MAX_RUN_ID}")
    if not _RUN_ID.fullmatch(run_id):
        raise InvalidRunIdError(run_id, "it contains a character outside the allowed set")
    return run_id


@functools.cache
def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


_BOOTTIME: int | None = getattr(time, "CLOCK_BOOTTIME", None)


def boot_seconds() -> float:
    """A monotonic clock that keeps counting while the machine is suspended (as a lease's
    TTL does), and that no change of the wall clock moves."""
    return time.clock_gettime(_BOOTTIME) if _BOOTTIME is not None else time.monotonic()


def host_clock() -> tuple[str, float]:
    """(this boot's id, seconds since boot): a clock every process on this host shares
    and that no change of the wall clock moves, for judging leases of same-host stores.

    A deadline read under another boot id is over: its holder died with that boot.
    Where the boot id is unknown ("") callers fall back to the wall clock.
    """
    boot = _boot_id()
    return boot, boot_seconds() if boot else time.time()


# The one rule for same-host leases (sqlite, jsonl), given the clocks read now: the
# wall clock (``wall``) and the host clock (``boot``, ``now``; see host_clock).


def lease_expiry(ttl: float, wall: float, boot: str, now: float) -> tuple[float, str, float]:
    """(wall-clock expiry, boot id, deadline on the host clock) of a lease granted now
    for ``ttl`` seconds; the wall clock is for people and for readers before boot ids."""
    return wall + ttl, boot, now + ttl


def lease_left(expires_at: float, boot_id: str | None, deadline: float | None,
               wall: float, boot: str, now: float) -> float:
    """Seconds a lease has left: by the host clock when it was written with one (a lease
    from another boot is over: its holder died with it), else by the wall clock."""
    if boot_id and boot and deadline is not None:
        return deadline - now if boot_id == boot else 0.0
    return expires_at - wall


class Durability(StrEnum):
    """When an append is acknowledged.

    ``FSYNC`` (default): after the bytes are on stable storage (fsync /
    synchronous=FULL / a committed Postgres transaction with synchronous_commit
    on). Nothing acknowledged is lost by a process crash or a power cut.

    ``BATCHED``: after the bytes reach the operating system (jsonl: written,
    fsynced every ``batch_every`` appends and on close; sqlite:
    synchronous=NORMAL in WAL; postgres: synchronous_commit=off). A process
    crash loses nothing; an OS crash or power cut may lose the last appends
    acknowledged since the previous sync. Use it only with tools whose
    receivers dedupe on the idempotency key or offer a reconcile lookup.
    """

    FSYNC = "fsync"
    BATCHED = "batched"


class Lease(msgspec.Struct, frozen=True):
    run_id: str
    owner: str
    epoch: int
    expires_at: float  # seconds since the epoch, by the store's clock
    #: Where the run's log ended when the lease was granted, if the store read it then
    #: (None: it did not say). A holder that sees 0 knows the log is empty: nobody else
    #: may append while it holds the lease.
    last_seq: int | None = None


class RunInfo(msgspec.Struct, frozen=True):
    run_id: str
    last_seq: int
    created_at: datetime | None
    updated_at: datetime | None


class Snapshot(msgspec.Struct, frozen=True, kw_only=True):
    """A cached partial fold of one run: only a cache, never the source of truth."""

    run_id: str
    seq: int  # the last event it includes
    schema_version: int
    fold_version: int
    digest: str  # sha256 of body, hex
    body: bytes
    created_at: datetime


class Tombstone(msgspec.Struct, frozen=True, kw_only=True):
    """What stays of a run deleted from the hot store once its log was archived
    (retention.py): the id cannot be used again, and it says where the log went."""

    run_id: str
    last_seq: int
    digest: str  # records_digest of the archived log: a restore must bring back exactly it
    archive: str  # the URL of the archive holding it
    deleted_at: datetime


def records_digest(records: Sequence[bytes]) -> str:
    """sha256 (hex) of a log's stored records as JSON Lines: what a tombstone and an
    archive name, so a restore can bring back only the very bytes that were deleted."""
    h = hashlib.sha256()
    for record in records:
        h.update(record)
        h.update(b"\n")
    return h.hexdigest()


def check_records(run_id: str, records: Sequence[bytes], *,
                  sealed_store: bool = False) -> list[Event]:
    """The events of a whole log given as stored records, each checked as ``read`` checks
    it (decodes, seq in place, digest chain): what a restore writes back."""
    events, prev = [], GENESIS
    for seq, body in enumerate(records, start=1):
        event, prev = decode_record(run_id, seq, body, prev, sealed_store=sealed_store)
        events.append(event)
    return events


def missing_run(store: Store, run_id: str) -> RunNotFoundError:
    """The error for a run with no events: ``ArchivedRunError`` when gc archived it."""
    stone = store.tombstone(run_id)
    if stone is None:
        return RunNotFoundError(run_id)
    return ArchivedRunError(run_id, stone.archive, stone.last_seq)


class UnanchoredStoreError(CorruptStoreError):
    """The store lacks what each run's head is kept in (its record of keeping heads, a
    table), though what it holds proves it kept them: removed, not an older store."""

    def __init__(self, url: str, detail: str) -> None:
        super().__init__(url, detail)
        self.args = (f"store {url} is damaged: {detail}. It was not changed. Restore it "
                     "from a backup, and check its runs against heads kept elsewhere "
                     "(`agentjournal verify --all --heads FILE`).",)


class UnanchoredLogError(CorruptLogError):
    """A record that only a release keeping heads writes, in a store that keeps none: the
    store's record of its heads was removed, so the run's newest events cannot be checked."""


def decode_record(
    run_id: str, seq: int, body: bytes | memoryview, prev: str = GENESIS,
    *, sealed_store: bool = False, heads_missing: str | None = None,
) -> tuple[Event, str]:
    """A stored record as an event, checked against the digest ``prev`` of the record
    before it; returns the event and its own digest (the next record's ``prev``).

    Bytes that do not decode, or do not match their digest, are corruption named
    by seq; so is an unsealed record in a ``sealed_store`` (one created at schema v4
    or later, whose every record was written sealed), a record holding what its version
    could not have written (relabelled as older), and, where the store keeps no heads
    (``heads_missing`` says what is missing), a record of a version written only with
    heads (``UnanchoredLogError``). (An unknown event type or a newer schema version
    raises its own error: that is a newer release's log, not damage.)
    """
    sealed = unseal(body, prev)
    if sealed is not None:
        digest, computed = sealed
        if computed != digest:
            raise CorruptLogError(
                run_id, seq,
                "its digest does not match its content and the digest before it: this "
                "event (or the one before it) was changed after it was written",
            )
    elif prev != GENESIS:
        raise CorruptLogError(run_id, seq, "an unsealed record after sealed ones")
    elif sealed_store:
        raise CorruptLogError(run_id, seq, "an unsealed record in a store created at schema "
                              f"v{SEALED_SINCE} or later, where every record is sealed")
    try:
        event = decode_stored(body)
    except (msgspec.DecodeError, EncodingError) as exc:
        raise CorruptLogError(run_id, seq, f"undecodable record: {exc}") from None
    if sealed is None and event.v >= SEALED_SINCE:
        raise CorruptLogError(run_id, seq, f"a v{event.v} record without its digest")
    if event.seq != seq or event.run_id != run_id:
        raise CorruptLogError(run_id, seq, f"found {event.run_id!r}#{event.seq} where it belongs")
    if heads_missing is not None and event.v >= HEADS_SINCE:
        raise UnanchoredLogError(
            run_id, seq, f"it is a v{event.v} record, and every release that writes "
            f"v{HEADS_SINCE} or later keeps each run's head, yet this store has none "
            f"({heads_missing}): they were removed, so the run's newest events can no longer "
            "be checked. Check the run against heads kept elsewhere (`agentjournal verify "
            "--heads FILE`)")
    if event.v != SCHEMA_VERSION:
        _check_label(event, sealed is not None)
        event = upcast(event)
    return event, sealed[0] if sealed is not None else GENESIS


def _check_label(event: Event, sealed: bool) -> None:
    """Refuse a record (as stored, older than this release) that holds what its version
    could not have written: relabelled as older, where fewer checks hold."""
    if sealed and event.v < SEALED_SINCE:
        found: tuple[str, int] | None = ("a digest", SEALED_SINCE)
    else:
        found = newer_than_labelled(event)
    if found is not None:
        what, since = found
        raise CorruptLogError(event.run_id, event.seq, f"it is labelled v{event.v} but holds "
                              f"{what}, which only v{since} and later write: it was "
                              "relabelled")


#: A run's head: the seq and digest its log ends with, kept apart from the log.
Head = tuple[int, str]


def check_head(run_id: str, after_seq: int, end: Head | None, head: Head | None,
               *, behind: Head | None = None) -> None:
    """Refuse a log that does not end where its head says, read after ``after_seq``:
    ``end`` is the seq and digest of the last record read (the one at ``after_seq``
    included; None if none was), ``head`` what the store recorded (None: no head).
    An edit of the newest events, or a deletion of the last batches, is caught here
    however its digests were recomputed. ``behind``: where the log ended before its
    last batch, for a store whose head is written after the log (JSONL): a head there
    is an append whose head write a crash cut off, not damage."""
    if end is None:
        if head is not None and head[0] >= max(after_seq, 1):
            raise CorruptLogError(run_id, max(after_seq, 1), f"its head records seq {head[0]}, "
                                  "but the log holds no events there: its events were deleted")
        return
    if head is None:
        raise CorruptLogError(run_id, end[0], "the log has no head record (the seq and digest "
                              "it ends with, kept apart from it): the head was deleted")
    if end == head or (behind is not None and behind == head):
        return
    if end[0] < head[0]:
        raise CorruptLogError(run_id, end[0] + 1, f"the log ends at seq {end[0]} but its head "
                              f"records seq {head[0]}: its last events were deleted")
    if end[0] > head[0]:
        raise CorruptLogError(run_id, head[0] + 1, f"the log goes on past its head (seq "
                              f"{head[0]}) to seq {end[0]}: events were added around the store")
    raise CorruptLogError(run_id, end[0], f"its digest {end[1] or '(none)'} is not the one its "
                          f"head records ({head[1] or 'none'}): the newest event was changed")


def check_batch(run_id: str, events: Sequence[Event], expected_seq: int, epoch: int) -> None:
    """Refuse a batch whose envelopes do not match where it is being appended."""
    if not events:
        raise ValueError("append needs at least one event")
    for i, ev in enumerate(events, start=expected_seq + 1):
        if ev.run_id != run_id or ev.seq != i or ev.epoch != epoch:
            raise ValueError(
                f"event {ev.run_id!r}#{ev.seq} (epoch {ev.epoch}) does not belong at "
                f"{run_id!r}#{i} (epoch {epoch}); build envelopes with make_events()"
            )


def scope_started(events: Sequence[Event]) -> str | None:
    """The idempotency scope a batch starts its run in, if it holds ``run_started``."""
    for event in events:
        if event.type is EventType.RUN_STARTED:
            return str(event.payload.get("scope") or f"run:{event.run_id}")
    return None


@runtime_checkable
class Store(Protocol):
    """What every backend offers. See the module docstring for the contract."""

    url: str
    durability: Durability

    def append(
        self, run_id: str, events: Sequence[Event], *, expected_seq: int, epoch: int,
        alone_in: str | None = None,
    ) -> int: ...

    def read(self, run_id: str, after_seq: int = 0, upto: int | None = None
             ) -> Iterator[Event]:
        """The run's events after ``after_seq`` (up to ``upto``), each checked."""
        ...

    def last_seq(self, run_id: str) -> int: ...

    def list_runs(self, *, limit: int | None = None) -> list[RunInfo]: ...

    def scope_runs(self, scope: str) -> list[str]:
        """The runs started in idempotency ``scope`` (a run and its forks; the runs of one
        tenant operation), oldest first. Recorded with the batch holding ``run_started``:
        effects belong to the scope, so a run must find the others that may have made them.
        """
        ...

    # --- projections: derived from the log, rebuildable, never the only copy ----------

    def outlines(self, run_ids: Collection[str] | None = None, *,
                 attention: bool = False) -> dict[str, RunState | JournalError]:
        """Each run's outline (projections.py) as of its head, by run id: of ``run_ids``,
        or of every run; ``attention``: only the runs a person may be asked about. Kept
        with every append (JSONL: caught up from the log when read), never served behind
        the log. A run whose log cannot be read or folded maps to the error."""
        ...

    @property
    def projected(self) -> bool:
        """Whether the store keeps outlines: False for a read-only handle on a store an
        older release wrote (its reads fold every run: a writer's first open, or
        ``agentjournal reindex``, projects it)."""
        ...

    def put_outline(self, run_id: str, state: RunState) -> None:
        """Store ``state`` as the run's outline if its log ends at ``state.last_seq``
        (reindex). A no-op where outlines are caught up when read (JSONL: the sidecar is
        rewritten from what a read folds)."""
        ...

    def put_view(self, run_id: str, name: str, seq: int, body: bytes) -> None:
        """Keep ``body`` as the run's view ``name``, folded to ``seq``: a cache a reader
        of one kind of run keeps beside its log (a LangGraph thread's index), replaced
        whole, gone with the run's log."""
        ...

    def view(self, run_id: str, name: str) -> tuple[int, bytes] | None:
        """The run's view ``name``: (seq, body), or None."""
        ...

    def acquire(self, run_id: str, owner: str, ttl: float) -> Lease: ...

    def renew(self, lease: Lease, ttl: float) -> Lease: ...

    def release(self, lease: Lease) -> None: ...

    def holder(self, run_id: str) -> Lease | None:
        """The run's lease as it stands (a read: who holds it, at which epoch, until
        when), for a person asking whether anyone drives the run. ``expires_at`` is on
        this machine's wall clock: in the past once it lapsed, 0 once its holder released
        it. None: nobody ever took it."""
        ...

    def close(self) -> None: ...

    # --- snapshots: a cache beside the log ---------------------------------------------

    def put_snapshot(self, snapshot: Snapshot, *, keep: int = 2) -> None:
        """Publish ``snapshot`` atomically (body and pointer together), then keep only the
        newest ``keep`` of the run. Never overwrites the only previous one in place."""
        ...

    def snapshots(self, run_id: str, *, limit: int | None = None) -> list[Snapshot]:
        """The run's published snapshots, newest (highest seq) first; at most ``limit``."""
        ...

    def delete_snapshots(self, run_id: str) -> int:
        """Delete the run's snapshots and their segments; how many snapshots went."""
        ...

    def put_segments(self, run_id: str, segments: Mapping[str, bytes]) -> None:
        """Store parts a snapshot refers to by digest (``digest -> body``), durably,
        before the snapshot that names them is published. A digest already stored gets
        the body given (so a damaged one is mended by the next snapshot that needs it)."""
        ...

    def segments(self, run_id: str, digests: Collection[str]) -> dict[str, bytes]:
        """The run's stored segments among ``digests``; a missing one is absent."""
        ...

    def segment_digests(self, run_id: str) -> set[str]:
        """The digests of the run's stored segments (a read: no lease, no write)."""
        ...

    def prune_segments(self, run_id: str, keep: Collection[str]) -> int:
        """Delete the run's segments whose digest is not in ``keep``; how many went."""
        ...

    def prune_snapshots(self, run_id: str, *, keep: int) -> int:
        """Delete all but the run's newest ``keep`` snapshots; how many were deleted."""
        ...

    def quarantine(self, fold_version: int, reason: str) -> None:
        """Never load snapshots written with ``fold_version`` again (verify found them wrong)."""
        ...

    def quarantined(self) -> dict[int, str]: ...

    # --- retention: archived runs leave a tombstone (retention.py) -------------------

    def records(self, run_id: str) -> list[bytes]:
        """The run's stored records, byte for byte, in seq order; each checked as ``read``
        checks it. What an archive holds."""
        ...

    def delete_run(self, tombstone: Tombstone, *, epoch: int) -> None:
        """Replace the run's log by ``tombstone``, atomically: its events, snapshots and
        scope entry go, the tombstone stays, the lease row stays (epochs never go back).
        ``ConflictError`` unless the log ends at ``tombstone.last_seq``; ``FencedError``
        unless ``epoch`` is the run's lease epoch. An append to the run is then refused
        with ``ArchivedRunError``."""
        ...

    def tombstone(self, run_id: str) -> Tombstone | None: ...

    def heads(self) -> dict[str, Head]:
        """Each run's head, by run id: the seq and digest its log ends with, recorded
        apart from the log with every append (an archived run has none). What
        ``agentjournal verify --heads`` exports, to check the store against later."""
        ...

    def tombstones(self) -> list[Tombstone]: ...

    def restore_run(self, run_id: str, records: Sequence[bytes]) -> None:
        """Write an archived log back byte for byte and lift its tombstone, atomically.
        ``records`` must be the log the tombstone names (``records_digest``) and check out
        (``check_records``); else ``CorruptLogError``, and nothing changes. A run without
        a tombstone is ``RunNotFoundError``."""
        ...
