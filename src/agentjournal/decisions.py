"""A person's decisions about a run: approvals, and the outcome of uncertain calls.

Each decision is appended as an event naming who decided and why; the run
acts on it the next time it is opened. A decision takes the run's lease for
the moment it writes, so it never races a live worker.
"""

from __future__ import annotations

from typing import Any, Literal

from .errors import AmbiguousKeyError, NotPendingError
from .events import Event, EventType
from .journal import open_journal
from .state import PendingCall
from .store import Store

Outcome = Literal["happened", "did_not_happen", "conflict"]


def decide_approval(
    store: Store, run_id: str, approval_id: str, *, approved: bool, by: str, reason: str = ""
) -> Event:
    """Approve or deny a pending approval request."""
    with open_journal(store, run_id, owner=f"decision:{by}", must_exist=True) as j:
        if approval_id not in j.state.approvals:
            raise NotPendingError(run_id, f"approval {approval_id!r}", list(j.state.approvals))
        return j.record(EventType.APPROVAL_DECIDED, approval_id=approval_id,
                        approved=approved, by=by, reason=reason)


def find_uncertain(run_id: str, calls: list[PendingCall], key: str) -> PendingCall:
    """The uncertain call whose key is ``key`` or starts with it (an unambiguous prefix)."""
    hits = [p for p in calls if p.key == key] or [p for p in calls if p.key.startswith(key)]
    if not hits:
        raise NotPendingError(run_id, f"uncertain call {key!r}", [p.key for p in calls])
    if len(hits) > 1:
        raise AmbiguousKeyError(run_id, key, [p.key for p in hits])
    return hits[0]


def resolve_uncertain(
    store: Store,
    run_id: str,
    key: str,
    *,
    outcome: Outcome,
    by: str,
    reason: str = "",
    result: Any = None,
) -> list[Event]:
    """Record what a person established about an uncertain call.

    ``happened``: the effect took place (``result`` is what it returned); the
    run continues as if the call had completed. ``did_not_happen``: the run
    retries it with the same key. ``conflict``: something else happened; the
    run is escalated.
    """
    with open_journal(store, run_id, owner=f"decision:{by}", must_exist=True) as j:
        pending = find_uncertain(run_id, list(j.state.pending.values()), key)
        verdict = {"happened": "found", "did_not_happen": "absent", "conflict": "conflict"}
        common = {"started_seq": pending.started_seq, "key": pending.key, "tool": pending.tool}
        facts: list[tuple[EventType, dict[str, Any]]] = [(EventType.TOOL_CALL_RECONCILED, {
            "verdict": verdict[outcome], "by": by, "reason": reason, **common})]
        # What follows a verdict is appended with it, atomically: "happened" settles
        # the call, so its completion must never be lost in between.
        if outcome == "happened":
            facts.append((EventType.TOOL_CALL_COMPLETED, {
                "call_id": pending.call_id, "tool": pending.tool,
                "started_seq": pending.started_seq, "idempotency_key": pending.key,
                # the verdict closes the start first: the completion keeps its arguments
                "args": pending.args, "result": result, "source": "person"}))
        elif outcome == "conflict":
            facts.append((EventType.RUN_ESCALATED, {
                "reason": reason or "conflict", "by": by, "key": pending.key,
                "tool": pending.tool, "ours": pending.args}))
        events = j.record_all(facts)
        return events
