"""Every error agentjournal raises on purpose.

    JournalError                    root: catch this to catch them all
    ├── InvalidRunIdError           a run id that could name a file elsewhere, or is too long
    ├── RunNotFoundError            no events recorded for that run id
    │   └── ArchivedRunError        the run was archived and deleted; a tombstone says where
    ├── NotArchivedError            a restore of a run this store holds no tombstone of
    ├── RunMismatchError            a resume names a task, scope or agent other than the run's
    ├── NotPendingError             no such open approval or uncertain call in the run
    │   └── AlreadyDecidedError     a decision contradicting one that already stands
    ├── AmbiguousKeyError           a key prefix that names several uncertain calls
    ├── NondeterminismError         a bridged run asked a recorded step for something else
    ├── NeedsPerson                 a bridged call that only a person can settle
    │   └── NeedsApproval           a bridged call that waits for a person's approval
    ├── CallRefused                 a bridged call refused (another intent, a denial)
    ├── ResultNotKeptError          a bridged call happened, its result was not kept
    ├── ConflictError               the log moved on: expected_seq is stale
    ├── FencedError                 the writer's lease epoch was superseded
    ├── ScopeSharedError            an append made on condition its run was alone in its scope
    ├── LeaseHeldError              another owner holds a live lease
    ├── LeaseExpiredError           the lease lapsed before an effect; the worker stopped first
    ├── CorruptLogError             damage before the tail of a log
    │   └── CorruptStoreError       damage to a store's file itself (a truncated SQLite database)
    ├── DurabilityError             an fsync or commit failed; the handle is now closed for writes
    ├── StoreUnavailableError       the store's server could not be reached; nothing was committed
    │   └── StoreLockedError        a lock it needed was held by another session past the timeout
    ├── StoreIOError                the OS refused a store read or write (disk full, permissions)
    │   └── ReadOnlyStoreError      a write to a store opened read-only, or on a read-only mount
    ├── EncodingError               a payload that cannot be stored (NaN, infinity, unknown type)
    ├── UnknownEventTypeError       an event type string this release does not know
    ├── UnsupportedVersionError     an event schema version newer than this release
    ├── StoreUrlError               a store URL that names no backend we have
    │   └── NotAStoreError          the URL names a file that is not an agentjournal store
    └── MissingExtraError           an optional dependency is not installed

Errors carry their data as attributes (``run_id``, ``seq``, ...) so callers
branch on fields, never on message text.
"""

from __future__ import annotations

import errno


class JournalError(Exception):
    """Root of every error agentjournal raises on purpose."""

    retryable: bool = False

    def __init__(self, message: str, *, run_id: str | None = None) -> None:
        super().__init__(message)
        self.run_id = run_id


class InvalidRunIdError(JournalError, ValueError):
    def __init__(self, run_id: str, reason: str) -> None:
        super().__init__(
            f"invalid run id {run_id[:80]!r}: {reason}. Use 1-128 characters from "
            "letters, digits, '.', '_', '-' and ':', starting with a letter or digit.",
            run_id=run_id,
        )
        self.reason = reason


class RunNotFoundError(JournalError, LookupError):
    def __init__(self, run_id: str) -> None:
        super().__init__(
            f"run {run_id!r} has no events in this store. Check the run id "
            "(`agentjournal runs` lists them) and the store URL.",
            run_id=run_id,
        )


class ArchivedRunError(RunNotFoundError):
    """The run was archived and deleted from this store (``agentjournal gc``): its
    tombstone keeps the id from being used again and says where the log went."""

    def __init__(self, run_id: str, archive: str, last_seq: int) -> None:
        JournalError.__init__(
            self,
            f"run {run_id!r} ({last_seq} events) was archived to {archive} and deleted "
            f"from this store; its id cannot be used again. Bring it back with "
            f"`agentjournal restore {run_id} --archive {archive}`.",
            run_id=run_id,
        )
        self.archive = archive
        self.last_seq = last_seq


class NotArchivedError(JournalError, LookupError):
    """A restore of a run that this store did not archive (no tombstone stands)."""

    def __init__(self, run_id: str, reason: str) -> None:
        super().__init__(f"run {run_id!r} cannot be restored into this store: {reason}",
                         run_id=run_id)
        self.reason = reason


class RunMismatchError(JournalError, ValueError):
    """A resume asked for another task, scope or agent than the run recorded.

    Reusing a run id for other work would resume the old run (and its recorded
    effects) under the new intent; it is refused, never guessed.
    """

    def __init__(self, run_id: str, field: str, recorded: str | None,
                 given: str | None, *, resume: str | None = None,
                 advice: str | None = None) -> None:
        # ``resume``: what continues this run (continuation.py) when it is not
        # `agentjournal resume`, e.g. an integration's own call. ``advice``: the whole
        # advice instead, where the run is not resumed by its caller (a queue's run).
        resume = resume or f"agentjournal resume {run_id}"
        if advice is None and field == "instructions":
            advice = ("To resume it with the new instructions, say so: Agent.run(..., "
                      "change_instructions=True) records the change; to keep the old ones, "
                      "give the agent the recorded instructions.")
        elif advice is None:
            advice = (f"To resume it, give no {field} or the recorded one ({resume}); for "
                      "other work, start a run under a new run id (new_run_id(), or "
                      "`agentjournal run` without --run-id).")
        super().__init__(f"run {run_id!r} exists with {field} {recorded!r}, not {given!r}. "
                         + advice, run_id=run_id)
        self.field = field
        self.recorded = recorded
        self.given = given


class NotPendingError(JournalError, LookupError):
    """The approval or uncertain call named is not open in that run."""

    def __init__(self, run_id: str, what: str, open_ids: list[str]) -> None:
        listing = ", ".join(open_ids) if open_ids else "none"
        super().__init__(
            f"run {run_id!r} has no open {what}. Open ones: {listing}.", run_id=run_id
        )


class AlreadyDecidedError(NotPendingError):
    """A decision that contradicts one already standing: approve after deny, or another
    outcome for a call already resolved. Nothing was appended. (A repeat of the same
    decision is not an error: it returns what stands.)"""

    def __init__(self, run_id: str, what: str, standing: str, seq: int) -> None:
        JournalError.__init__(
            self,
            f"run {run_id!r}: {what} is already decided: {standing} (seq {seq}). Nothing was "
            f"appended; a decision stands once recorded (agentjournal show {run_id}). To "
            f"decide otherwise, fork the run before it (agentjournal fork {run_id} --at "
            f"{seq - 1}) and decide in the fork.",
            run_id=run_id,
        )
        self.what = what
        self.standing = standing
        self.seq = seq


class AmbiguousKeyError(JournalError, ValueError):
    def __init__(self, run_id: str, prefix: str, keys: list[str]) -> None:
        super().__init__(
            f"key prefix {prefix!r} matches {len(keys)} uncertain calls in run {run_id!r} "
            f"({', '.join(k[:16] for k in keys)}); give more characters.",
            run_id=run_id,
        )
        self.keys = keys


class UnsettledError(JournalError):
    """A saga was asked for while some of the run's effects are uncertain: what to undo
    is not known until a person (or a lookup) settles them."""

    def __init__(self, run_id: str, keys: list[str]) -> None:
        shown = ", ".join(k[:16] for k in keys)
        super().__init__(
            f"run {run_id!r} has uncertain calls ({shown}): settle each first "
            f"(agentjournal resolve {run_id} KEY --happened | --did-not-happen), then "
            "compensate",
            run_id=run_id,
        )
        self.keys = keys


class NotCancellableError(JournalError, ValueError):
    """The run has ended (finished, or being compensated): there is nothing to cancel."""

    def __init__(self, run_id: str, status: str) -> None:
        hint = "; undo its effects with compensate" if status == "finished" else ""
        super().__init__(f"run {run_id!r} is {status}: there is nothing to cancel{hint}",
                         run_id=run_id)


class ConflictError(JournalError):
    """Another writer appended first. Re-read the log, re-fold, and decide again."""

    retryable = True

    def __init__(self, run_id: str, expected_seq: int, actual_seq: int) -> None:
        super().__init__(
            f"run {run_id!r}: append expected the log to end at seq {expected_seq}, "
            f"but it ends at seq {actual_seq}. Another writer appended first; "
            "re-read the log and fold before appending again.",
            run_id=run_id,
        )
        self.expected_seq = expected_seq
        self.actual_seq = actual_seq


class FencedError(JournalError):
    """A writer whose lease was taken over. It must stop: another worker owns the run."""

    def __init__(self, run_id: str, epoch: int, current_epoch: int) -> None:
        super().__init__(
            f"run {run_id!r}: writer epoch {epoch} was superseded by epoch "
            f"{current_epoch}. Another worker took over this run's lease; stop "
            "this writer and let the current owner continue.",
            run_id=run_id,
        )
        self.epoch = epoch
        self.current_epoch = current_epoch


class ScopeSharedError(JournalError):
    """An append made on condition that its run was the only run of its idempotency
    scope found another run there, and wrote nothing. Ask the scope's other runs
    whether they made the effect (peers.py), then append without the condition."""

    retryable = True

    def __init__(self, run_id: str, scope: str) -> None:
        super().__init__(
            f"run {run_id!r} is not the only run of its idempotency scope {scope!r}: "
            "nothing was appended. Ask the scope's other runs before making the effect, "
            "then append again.",
            run_id=run_id,
        )
        self.scope = scope


class LeaseHeldError(JournalError):
    retryable = True

    def __init__(self, run_id: str, owner: str, epoch: int, expires_in: float) -> None:
        super().__init__(
            f"run {run_id!r} is leased by {owner!r} for another {expires_in:.1f}s. "
            "Another worker is running it: wait for the lease to expire or be "
            "released, then acquire again.",
            run_id=run_id,
        )
        self.owner = owner
        self.epoch = epoch
        self.expires_in = expires_in


class LeaseReleasedError(JournalError):
    """A renewal of a lease its holder had released: refused, so that the run stays
    free for whoever acquires it next (a person deciding on a run handed back)."""

    def __init__(self, run_id: str, epoch: int) -> None:
        super().__init__(
            f"run {run_id!r}: the lease (epoch {epoch}) was released and is not renewed. "
            "Its holder let the run go; acquire it again to hold it.",
            run_id=run_id,
        )
        self.epoch = epoch


class LeaseExpiredError(JournalError):
    """A worker's lease lapsed by its own clock and could not be renewed, right before a
    tool with an effect: another worker may own the run, so the effect was not made."""

    def __init__(self, run_id: str, epoch: int, tool: str, detail: str) -> None:
        super().__init__(
            f"run {run_id!r}: the lease (epoch {epoch}) lapsed before {tool!r} was called and "
            f"could not be renewed ({detail}). The call was not made and nothing was appended; "
            "another worker may own the run now. Resume it: its started call is settled first.",
            run_id=run_id,
        )
        self.epoch = epoch
        self.tool = tool
        self.detail = detail


class CorruptLogError(JournalError):
    """Damage before the tail. The run is refused, never silently shortened."""

    def __init__(self, run_id: str, seq: int, detail: str) -> None:
        super().__init__(
            f"run {run_id!r} is corrupt at seq {seq}: {detail}. The log was not "
            "changed. Restore it from a backup or inspect it by hand; agentjournal "
            "will not resume a run from a damaged log.",
            run_id=run_id,
        )
        self.seq = seq
        self.detail = detail


class CorruptStoreError(CorruptLogError):
    """The store's file is damaged as a whole (not one run's record): a truncated or
    overwritten SQLite database. Refused, never repaired or re-created in place."""

    def __init__(self, url: str, detail: str) -> None:
        JournalError.__init__(
            self,
            f"store {url} is damaged: {detail}. It was not changed. Restore it from a "
            "backup; a copy may still be read with the sqlite3 tool's .recover command.",
        )
        self.seq = 0
        self.detail = detail
        self.url = url


class SnapshotSegmentError(JournalError):
    """A snapshot segment a resumed run decodes when first needed is missing or damaged.
    The run's snapshots are set aside; opening the run again folds it from its log."""

    retryable = True

    def __init__(self, run_id: str, digest: str, detail: str) -> None:
        super().__init__(
            f"run {run_id!r}: snapshot segment {digest[:12]}, which its state was loaded "
            f"from, {detail}. Its snapshots were set aside and the log was not changed: "
            "open the run again and it is folded from its log.",
            run_id=run_id,
        )
        self.digest = digest
        self.detail = detail


class DurabilityError(JournalError):
    """An fsync or commit failed. The data may be lost; the handle refuses writes."""

    def __init__(self, detail: str, *, run_id: str | None = None) -> None:
        super().__init__(
            f"durable write failed ({detail}). This store handle refuses further "
            "appends: the operating system may have dropped unsynced data. Reopen "
            "the store and re-read the log to learn what was kept.",
            run_id=run_id,
        )
        self.detail = detail


class StoreUnavailableError(JournalError):
    """The database server could not be reached or dropped the connection mid-call."""

    retryable = True

    def __init__(self, url: str, detail: str) -> None:
        super().__init__(
            f"store {url} is unavailable ({detail}). Nothing was committed by this call; "
            "check the server and try again."
        )
        self.url = url
        self.detail = detail


class StoreLockedError(StoreUnavailableError):
    """A lock the call needed (a table, a row, the migration lock) was held by another
    session for longer than the store's lock timeout: a long transaction, ``LOCK
    TABLE``, an advisory lock. The call waited no longer, and committed nothing."""

    def __init__(self, url: str, what: str, timeout: float, *,
                 run_id: str | None = None) -> None:
        JournalError.__init__(
            self,
            f"store {url}: {what} was held by another session for longer than the lock "
            f"timeout ({timeout:g} s). Nothing was committed by this call; try again. If it "
            "persists, the database's admin can find the session holding it in pg_locks "
            "and pg_stat_activity and end it (pg_terminate_backend); ?lock_timeout=SECONDS "
            "in the store URL sets how long a call waits for a lock.",
            run_id=run_id,
        )
        self.url = url
        self.detail = what
        self.timeout = timeout


class StoreIOError(JournalError):
    """The operating system refused to read or write the store's files. Nothing of the
    failed write was kept (a partial append is cut back before this is raised)."""

    def __init__(self, url: str, action: str, exc: OSError, *, run_id: str | None = None,
                 advice: str | None = None) -> None:
        reason = exc.strerror or str(exc)
        super().__init__(
            f"could not {action} in store {url}: {reason}"
            + (f" ({exc.filename})" if exc.filename else "")
            + f". {advice or _io_advice(exc.errno)}",
            run_id=run_id,
        )
        self.url = url
        self.errno = exc.errno


def _io_advice(code: int | None) -> str:
    if code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return ("The disk (or a quota or file size limit) is full: nothing of this write "
                "was kept. Free space and retry")
    if code in (errno.EROFS, errno.EACCES, errno.EPERM):
        return ("The store is not writable by this user. Fix its permissions, or copy it "
                "somewhere writable; reading commands work on a read-only store")
    return "Check the disk and the store's files, then retry"


class ReadOnlyStoreError(StoreIOError):
    """A write to a store opened read-only (for inspection) or on a read-only file system."""

    def __init__(self, url: str, action: str, *, run_id: str | None = None,
                 reason: str = "it is open read-only (inspection never writes)") -> None:
        JournalError.__init__(
            self,
            f"cannot {action}: store {url} is read-only: {reason}. Open it for writing "
            "(open_store(url), or a command that runs or decides) to change it; a store on "
            "a read-only mount or directory must be copied somewhere writable first.",
            run_id=run_id,
        )
        self.url = url
        self.errno = None


class EncodingError(JournalError, ValueError):
    def __init__(self, detail: str) -> None:
        super().__init__(
            f"cannot encode event payload: {detail}. Payloads must be JSON: "
            "finite numbers, strings, booleans, null, lists and string-keyed objects."
        )
        self.detail = detail


class UnknownEventTypeError(JournalError, ValueError):
    def __init__(self, type_name: str) -> None:
        super().__init__(
            f"unknown event type {type_name!r}. The log was written by a release "
            "that knows this type; upgrade agentjournal to read it."
        )
        self.type_name = type_name


class UnsupportedVersionError(JournalError, ValueError):
    def __init__(self, what: str, version: int, supported: int) -> None:
        super().__init__(
            f"{what} has schema version {version}, but this release reads up to "
            f"version {supported}. Upgrade agentjournal; a newer version is never guessed."
        )
        self.version = version
        self.supported = supported


class StoreUrlError(JournalError, ValueError):
    def __init__(self, url: str, detail: str) -> None:
        super().__init__(
            f"cannot open store {url!r}: {detail}. Use sqlite:///path.db, "
            "jsonl:///directory or postgresql://user@host/dbname."
        )
        self.url = url


class NotAStoreError(StoreUrlError):
    """The file exists but is not a store (a text file, another program's database)."""

    def __init__(self, url: str, detail: str) -> None:
        JournalError.__init__(
            self,
            f"{url} is not an agentjournal store ({detail}). It was not changed; "
            "check the store URL.",
        )
        self.url = url


class MissingExtraError(JournalError, ImportError):
    def __init__(self, extra: str, module: str) -> None:
        super().__init__(
            f"this feature needs the {module!r} package. Install it with: "
            f"pip install 'agentjournal[{extra}]'"
        )
        self.extra = extra


class NoQueueError(JournalError, ValueError):
    """The store has no queue of runs (JSONL): workers need SQLite or PostgreSQL."""

    def __init__(self, url: str) -> None:
        super().__init__(
            f"{url} has no queue of runs: a JSONL store keeps logs, not a queue. Use a "
            "SQLite store (sqlite:///runs.db: workers on one host) or PostgreSQL "
            "(postgresql://...: workers on many hosts)."
        )
        self.url = url


class AgentRefError(JournalError, ValueError):
    """An agent reference ("module:object") that names no Agent."""

    def __init__(self, ref: str, detail: str) -> None:
        super().__init__(f"agent {ref!r}: {detail}")
        self.ref = ref


class NondeterminismError(JournalError):
    """A run driven by another framework (agentjournal.bridge) asked for step ``name``
    at ``position`` with a fingerprint other than the one recorded there: the framework
    did not repeat what it did before the crash. Replaying the recorded value would
    silently diverge, so nothing is served; fix the code (or the inputs) that changed,
    or start a new run."""

    def __init__(self, run_id: str, name: str, position: int, recorded: str, given: str,
                 seq: int) -> None:
        super().__init__(
            f"run {run_id!r}: step {name!r} #{position} was recorded at seq {seq} with "
            f"fingerprint {recorded!r}, and is now asked with {given!r}: the code or its "
            "inputs changed since the run recorded it. Resume with the code that started "
            "the run, or start a new run", run_id=run_id)
        self.name, self.position, self.recorded, self.given, self.seq = (
            name, position, recorded, given, seq)


class NeedsPerson(JournalError):
    """A bridged call that cannot go on without a person: its effect is uncertain and no
    lookup settled it (``pending`` is the evidence: arguments, key, start time, last
    error), or it met another run's uncertain call, or the run was escalated. The run is
    paused; ``agentjournal resolve RUN KEY --happened | --did-not-happen`` decides it."""

    def __init__(self, run_id: str, call_id: str, tool: str, reason: str, *,
                 key: str | None = None, pending: object | None = None) -> None:
        hint = (f"; decide it with `agentjournal resolve {run_id} {key[:16]} --happened "
                "| --did-not-happen`, then run again" if key else "")
        super().__init__(f"run {run_id!r}: call {call_id!r} ({tool}) needs a person: "
                         f"{reason}{hint}", run_id=run_id)
        self.call_id, self.tool, self.reason, self.key, self.pending = (
            call_id, tool, reason, key, pending)


class NeedsApproval(NeedsPerson):
    """A bridged call that needs a person's approval of its exact arguments first
    (``agentjournal approve RUN APPROVAL_ID`` or ``agentjournal deny RUN APPROVAL_ID``)."""

    def __init__(self, run_id: str, call_id: str, tool: str, approval_id: str,
                 key: str) -> None:
        JournalError.__init__(
            self, f"run {run_id!r}: call {call_id!r} ({tool}) waits for approval "
            f"{approval_id!r}: `agentjournal approve {run_id} {approval_id}` (or `deny`), "
            "then run again", run_id=run_id)
        self.call_id, self.tool, self.key, self.pending = call_id, tool, key, None
        self.reason = f"it waits for approval {approval_id!r}"
        self.approval_id = approval_id


class CallRefused(JournalError):
    """A bridged call that was not made, and never will be with these arguments: the
    same identity was done with other arguments, or a person denied it. ``reason`` is
    what to tell the model."""

    def __init__(self, run_id: str, call_id: str, tool: str, reason: str) -> None:
        super().__init__(f"run {run_id!r}: call {call_id!r} ({tool}) refused: {reason}",
                         run_id=run_id)
        self.call_id, self.tool, self.reason = call_id, tool, reason


class ResultNotKeptError(JournalError):
    """A bridged call that happened (it is never made again) whose result was not kept
    (no JSON form, or over the size limit): a replay has no value to give. ``reason``
    is what to tell the model."""

    def __init__(self, run_id: str, call_id: str, tool: str, reason: str) -> None:
        super().__init__(f"run {run_id!r}: call {call_id!r} ({tool}): {reason}",
                         run_id=run_id)
        self.call_id, self.tool, self.reason = call_id, tool, reason
