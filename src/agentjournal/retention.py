"""Retention: archive finished runs to cold storage, delete them from the hot store
behind a tombstone, prune snapshots; and restore an archived run byte for byte.

The second seed: "Garbage collection is not optional". What gc may never do is
lose evidence, so a run is archived only when all of these hold, judged on the
very records it archives, under the run's lease:

- it is finished (``finished``, ``cancelled`` or ``compensated``) and its last event
  is older than the policy's age;
- it holds no unsettled evidence: no uncertain call, no pending approval, no
  escalation waiting for a person, no unfinished saga;
- no receiver may still remember one of its keys (a start's ``key_retention``);
- every run of its idempotency scope (its forks, the runs of one tenant operation)
  is archivable too: a live run finds the effects its scope made in their logs, so
  a scope leaves the hot store whole: every run's archive file is written and checked
  before the first is deleted. (A gc killed between two deletes leaves the rest of
  the scope in the hot store, still archivable, and the next gc takes it; until then
  a fork of one of those runs would not find the effects of the runs archived.)

Each run then goes: records → archive file (durable) → read back and checked →
``Store.delete_run`` (events and snapshots out, tombstone in, atomically). A crash
anywhere leaves the run in the hot store, or deleted with its archive verified.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

import msgspec

from .archive import Archive, ArchiveError, open_archive, pack, unpack
from .errors import ConflictError, CorruptLogError, LeaseHeldError, NotArchivedError
from .events import Event, EventType, now
from .faults import fault_point
from .journal import default_owner, take_lease
from .snapshots import collect_segments, named_segments_of, refusal
from .state import RunState, fold
from .store import Lease, Store
from .store.base import Tombstone, check_records, records_digest

#: The statuses of a run that will not go on by itself.
FINISHED = ("finished", "cancelled", "compensated")
LEASE_TTL = 300.0  # seconds gc holds a run it is archiving


@dataclass(frozen=True)
class RetentionPolicy:
    """What gc does. ``finished_older_than`` (with ``archive``, a URL such as
    ``file:///var/lib/agentjournal/archive``) archives finished runs whose last event is
    older; ``keep_snapshots`` prunes each remaining run's snapshots to the newest N."""

    finished_older_than: timedelta | None = None
    archive: str | None = None
    keep_snapshots: int | None = None

    def __post_init__(self) -> None:
        if self.finished_older_than is not None:
            if self.archive is None:
                raise ValueError("archiving finished runs needs an archive URL")
            if self.finished_older_than < timedelta(0):
                raise ValueError("finished_older_than must not be negative")
        if self.keep_snapshots is not None and self.keep_snapshots < 0:
            raise ValueError("keep_snapshots must be 0 or more")
        if self.finished_older_than is None and self.keep_snapshots is None:
            raise ValueError("give finished_older_than (with archive), keep_snapshots, "
                             "or both")


class Verdict(msgspec.Struct, frozen=True):
    """What gc did (or, in a dry run, would do) with one run, and why."""

    run_id: str
    action: str  # "archive" or "keep"
    reason: str
    events: int
    bytes: int | None  # the run's records in the hot store (None: not read, kept for age)


class GcReport(msgspec.Struct):
    dry_run: bool
    archive: str | None
    examined: int = 0
    archived: int = 0
    kept: int = 0
    events_archived: int = 0
    bytes_freed: int = 0  # records and snapshots deleted from the hot store
    archive_bytes: int = 0  # the compressed files written
    snapshots_pruned: int = 0
    segments_pruned: int = 0  # snapshot segments no kept snapshot names (not in a dry run)
    seconds: float = 0.0
    verdicts: list[Verdict] = msgspec.field(default_factory=list)


class Restored(msgspec.Struct, frozen=True):
    run_id: str
    events: int
    digest: str
    archive: str
    already: bool  # the store held this very log already: nothing was written


Progress = Callable[[str], None]


def _age(delta: timedelta) -> str:
    seconds = delta.total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"


def hold_reason(state: RunState, events: list[Event], *, older_than: timedelta,
                at: datetime) -> str | None:
    """Why the run must stay in the hot store at ``at``; None if it may be archived."""
    if state.status not in FINISHED:
        return f"not finished (status {state.status})"
    if state.uncertain:
        return f"{len(state.uncertain)} uncertain call(s) not settled"
    if state.pending_approvals:
        return f"{len(state.pending_approvals)} approval(s) pending"
    if state.waits_for_a_person:
        return "an escalation waits for a person"
    if state.saga is not None and not state.saga.finished_seq:
        return "its saga has not finished"
    idle = at - events[-1].ts
    if idle < older_than:
        return f"last event {_age(idle)} ago, under {_age(older_than)}"
    for ev in events:
        kept = ev.payload.get("key_retention") if ev.type is EventType.TOOL_CALL_STARTED else None
        if kept is not None and ev.ts + timedelta(seconds=kept) > at:
            left = ev.ts + timedelta(seconds=kept) - at
            return (f"the receiver of {ev.payload.get('tool')!r} keeps its keys "
                    f"{_age(left)} longer")
    return None


@dataclass
class _Judged:
    run_id: str
    scope: str
    last_seq: int
    size: int | None  # None: not read (young by the store's own record)
    hold: str | None


def gc(store: Store, policy: RetentionPolicy, *, dry_run: bool = False,
       at: datetime | None = None, progress: Progress | None = None) -> GcReport:
    """Apply ``policy`` to ``store``: see the module docstring. ``at`` is "now" (for
    judging ages); ``progress`` is told about each run as it goes."""
    started = time.perf_counter()
    at = at or now()
    say = progress or (lambda _: None)
    report = GcReport(dry_run=dry_run, archive=None)
    if policy.finished_older_than is not None:
        assert policy.archive is not None
        archive = open_archive(policy.archive)
        report.archive = archive.url
        _archive_finished(store, archive, policy.finished_older_than, at, dry_run, report, say)
    if policy.keep_snapshots is not None:
        _prune_snapshots(store, policy.keep_snapshots, dry_run, report, say)
    report.seconds = time.perf_counter() - started
    return report


def _judge(store: Store, run_id: str, older_than: timedelta, at: datetime) -> _Judged:
    records = store.records(run_id)
    events = check_records(run_id, records)
    state = fold(events)
    hold = hold_reason(state, events, older_than=older_than, at=at) if events else "no events"
    return _Judged(run_id, state.scope or f"run:{run_id}", state.last_seq,
                   sum(map(len, records)), hold)


def _archive_finished(store: Store, archive: Archive, older_than: timedelta, at: datetime,
                      dry_run: bool, report: GcReport, say: Progress) -> None:
    cutoff = at - older_than
    judged: dict[str, _Judged] = {}
    for info in store.list_runs():
        report.examined += 1
        if info.updated_at is not None and info.updated_at > cutoff:
            idle = _age(at - info.updated_at)
            judged[info.run_id] = _Judged(info.run_id, "", info.last_seq, None,
                                          f"last event {idle} ago, under {_age(older_than)}")
        else:
            judged[info.run_id] = _judge(store, info.run_id, older_than, at)
    told: set[str] = set()  # runs with a verdict (a young run may meet its scope late)
    for group in _scopes(store, judged):
        blocker = next((j for j in group if j.hold), None)
        for j in group:
            hold = j.hold or (blocker and f"shares its scope with run {blocker.run_id!r}, "
                              f"which stays ({blocker.hold})")
            if (hold or dry_run) and j.run_id not in told:
                _record(report, j, "keep" if hold else "archive", hold or "would archive", say)
        if blocker is None and not dry_run:
            _archive_group(store, archive, group, older_than, at, report, say)
        told.update(j.run_id for j in group)


def _scopes(store: Store, judged: dict[str, _Judged]) -> Iterable[list[_Judged]]:
    """The runs by idempotency scope: each group every hot run of one scope."""
    seen: set[str] = set()
    for j in judged.values():
        if j.run_id in seen:
            continue
        members = store.scope_runs(j.scope) if j.scope else [j.run_id]
        group = [judged.get(r) or _Judged(r, j.scope, 0, None, "not examined") for r in members]
        if j.run_id not in members:
            group.append(j)
        seen.update(g.run_id for g in group)
        yield group


def _record(report: GcReport, j: _Judged, action: str, reason: str, say: Progress) -> None:
    report.verdicts.append(Verdict(j.run_id, action, reason, j.last_seq, j.size))
    if action == "keep":
        report.kept += 1
    else:
        report.archived += 1
        report.events_archived += j.last_seq
        report.bytes_freed += j.size or 0
    say(f"{action} {j.run_id}: {reason}")


class _Changed(Exception):
    """A run of the group is no longer what was judged (or is in use): keep the group."""


def _archive_group(store: Store, archive: Archive, group: list[_Judged], older_than: timedelta,
                   at: datetime, report: GcReport, say: Progress) -> None:
    """Archive a scope's runs: leases first, every run judged again on its records,
    then each archived, verified and deleted; any doubt keeps the whole group."""
    owner = default_owner()
    leases: list[Lease] = []
    try:
        logs: list[tuple[_Judged, list[bytes], Lease]] = []
        for j in group:
            lease = take_lease(store, j.run_id, owner, LEASE_TTL)
            leases.append(lease)
            records = store.records(j.run_id)
            events = check_records(j.run_id, records)
            hold = hold_reason(fold(events), events, older_than=older_than, at=at) \
                if events else "no events"
            if hold or len(records) != j.last_seq:
                raise _Changed(f"run {j.run_id!r} changed during gc ({hold or 'new events'})")
            logs.append((j, records, lease))
        # Every archive file written and checked before any run is deleted: the window
        # in which a scope is split (a kill between two deletes) is as short as it gets.
        digests = [_archive_one(archive, j, records) for j, records, _ in logs]
        for (j, records, lease), (digest, size) in zip(logs, digests, strict=True):
            _delete_one(store, archive, j, len(records), digest, size, lease, report, say)
    except (LeaseHeldError, ConflictError, _Changed) as exc:
        done = {v.run_id for v in report.verdicts}
        for j in group:
            if j.run_id not in done:
                _record(report, j, "keep", f"in use or changed during gc: {exc}", say)
    finally:
        for lease in leases:
            store.release(lease)


def _archive_one(archive: Archive, j: _Judged, records: list[bytes]) -> tuple[str, int]:
    """Write the run's archive file and read it back: its digest and size."""
    data = pack(j.run_id, records)
    archive.put(j.run_id, data)
    back, digest = unpack(j.run_id, archive.get(j.run_id), archive.url)
    if back != records:  # the archive must hold the very bytes before any is deleted
        raise ArchiveError(archive.url, f"{j.run_id}: read back, it differs from the log",
                           run_id=j.run_id)
    fault_point("gc_archived")
    return digest, len(data)


def _delete_one(store: Store, archive: Archive, j: _Judged, last_seq: int, digest: str,
                size: int, lease: Lease, report: GcReport, say: Progress) -> None:
    snapshot_bytes = sum(len(s.body) for s in store.snapshots(j.run_id))
    store.delete_run(Tombstone(run_id=j.run_id, last_seq=last_seq, digest=digest,
                               archive=archive.url, deleted_at=now()), epoch=lease.epoch)
    fault_point("gc_deleted")
    report.bytes_freed += snapshot_bytes
    report.archive_bytes += size
    _record(report, j, "archive", f"archived to {archive.url}", say)


def _prune_snapshots(store: Store, keep: int, dry_run: bool, report: GcReport,
                     say: Progress) -> None:
    """Each run's snapshots beyond the newest ``keep``; all of them when none can be loaded
    (another fold version, or a quarantined one): those are dead weight. Then the
    segments no kept snapshot names (a crash between a snapshot's segments and its
    publishing leaves some)."""
    quarantined = store.quarantined()
    runs = store.list_runs()
    report.examined = report.examined or len(runs)  # (the archiving pass counted them)
    for info in runs:
        snapshots = store.snapshots(info.run_id)
        dead = all(refusal(s, quarantined) for s in snapshots)
        doomed = snapshots if dead else snapshots[keep:]
        if not dry_run:
            if doomed:
                store.prune_snapshots(info.run_id, keep=0 if dead else keep)
            report.segments_pruned += _collect(store, info.run_id)
        if not doomed:
            continue
        report.snapshots_pruned += len(doomed)
        report.bytes_freed += sum(len(s.body) for s in doomed)
        why = "none can be loaded" if dead else f"beyond the newest {keep}"
        say(f"prune {info.run_id}: {len(doomed)} snapshot(s), {why}")


def _collect(store: Store, run_id: str) -> int:
    """The run's segments no snapshot names, collected under its lease: a live run's
    writer may have stored segments for a snapshot it has not published yet. A run
    whose stored segments are all named is left alone, without a write."""
    named = named_segments_of(store, run_id)  # (None: a body cannot be read; keep all)
    if named is None or store.segment_digests(run_id) <= named:
        return 0
    try:
        lease = take_lease(store, run_id, default_owner(), LEASE_TTL)
    except LeaseHeldError:
        return 0
    try:
        return collect_segments(store, run_id)
    finally:
        store.release(lease)


def restore(store: Store, run_id: str, archive_url: str) -> Restored:
    """Bring an archived run back into ``store`` byte for byte, lifting its tombstone.

    The archive's log must be the one gc deleted (the tombstone's digest). Restoring
    a run the store already holds, identical, changes nothing (``already``)."""
    archive = open_archive(archive_url)
    records, digest = unpack(run_id, archive.get(run_id), archive.url)
    stone = store.tombstone(run_id)
    if stone is None:
        if not store.last_seq(run_id):
            raise NotArchivedError(run_id, "no tombstone here: it was not archived from this "
                                   "store (check the store URL)")
        if store.records(run_id) != records:
            raise NotArchivedError(run_id, "this store holds a run by that id whose log "
                                   "differs from the archive's")
        return Restored(run_id, len(records), digest, archive.url, already=True)
    if stone.digest != digest:
        raise ArchiveError(archive.url, f"{run_id}: holds another log of the run than the one "
                           f"gc deleted (digest {digest[:12]}, the tombstone names "
                           f"{stone.digest[:12]})", run_id=run_id)
    store.restore_run(run_id, records)
    if records_digest(store.records(run_id)) != digest:
        raise CorruptLogError(run_id, len(records), "read back after the restore, the log "
                              "differs from the archive")
    return Restored(run_id, len(records), digest, archive.url, already=False)
