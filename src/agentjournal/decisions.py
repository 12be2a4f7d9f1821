"""A person's decisions about a run: approvals, and the outcome of uncertain calls.

Each decision is appended as an event naming who decided and why; the run
acts on it the next time it is opened. A decision takes the run's lease for
the moment it writes, so it never races a live worker. A decision that leaves
the run waiting for the person still (another approval open, or another
uncertain call a resume would hand back to them) keeps a queued run waiting
(``fleet.keep_waiting``): a worker takes it up once the person decided them
all, so the person's next decision never meets a worker's lease.

Decisions are idempotent, because a person (or a script) retries a command
whose answer was lost. Repeating a decision that already stands the same way
appends nothing and returns the events that recorded it (``Decision.appended``
is False); a decision contradicting one that stands is refused with
``AlreadyDecidedError``, naming what stands. What stands: for an approval, its
``approval_decided``; for an uncertain call, the last verdict a person gave on
it (a ``tool_call_reconciled`` not by agentjournal), else a completion of its
key. A person's "conflict" leaves the call open for a person, so settling it
afterwards (happened / did not happen) is the next decision, not a contradiction.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal, NamedTuple

from .errors import AlreadyDecidedError, AmbiguousKeyError, NotPendingError
from .events import Event, EventType
from .fleet import keep_waiting
from .journal import open_journal
from .snapshots import load_state
from .state import PendingCall, RunState
from .store import Store
from .tools import Effect

Outcome = Literal["happened", "did_not_happen", "conflict"]

#: A person's outcome as the verdict it records, and back.
VERDICTS: dict[Outcome, str] = {
    "happened": "found", "did_not_happen": "absent", "conflict": "conflict"}
OUTCOMES: dict[str, Outcome] = {v: k for k, v in VERDICTS.items()}

#: What the model reads as the result of a call a person said happened without giving
#: its result (``resolve --happened`` with no ``--result``). The completion records it
#: as its ``content`` (its ``result`` stays None), so every shell reads the same words
#: from the log: the native loop's fold, and the bridge (Pydantic AI, LangGraph, the
#: Agents SDK) as the tool's return value.
NO_RESULT_GIVEN = ("the call was made: a person confirmed it happened, without giving "
                   "its result")


class Decision(NamedTuple):
    """The events that record a decision, and whether they were appended by this call
    (False: the same decision already stood, and nothing was written)."""

    events: list[Event]
    appended: bool


# --- approvals -------------------------------------------------------------------------


def decide_approval(
    store: Store, run_id: str, approval_id: str, *, approved: bool, by: str, reason: str = ""
) -> Event:
    """Approve or deny a pending approval request; the ``approval_decided`` event (the
    standing one, when the same decision was already made)."""
    return record_approval(store, run_id, approval_id, approved=approved, by=by,
                           reason=reason).events[0]


def record_approval(
    store: Store, run_id: str, approval_id: str, *, approved: bool, by: str, reason: str = ""
) -> Decision:
    """Like :func:`decide_approval`, saying whether the decision was appended now."""
    # A repeat is answered from the log without the lease, so a worker already running
    # the run on the first decision does not make the retry fail.
    if (stood := _approval_stands(store, run_id, load_state(store, run_id).state,
                                  approval_id, approved)) is not None:
        return stood
    with open_journal(store, run_id, owner=f"decision:{by}", must_exist=True) as j:
        if (stood := _approval_stands(store, run_id, j.state, approval_id, approved)) is not None:
            return stood  # decided meanwhile
        if approval_id not in j.state.approvals:
            raise NotPendingError(run_id, f"approval {approval_id!r}", list(j.state.approvals))
        decided = j.record(EventType.APPROVAL_DECIDED, approval_id=approval_id,
                           approved=approved, by=by, reason=reason)
        if j.state.approvals:  # others still open: the run waits for this person still
            keep_waiting(store, run_id, decided.seq)
        return Decision([decided], appended=True)


def _approval_stands(store: Store, run_id: str, state: RunState, approval_id: str,
                     approved: bool) -> Decision | None:
    """The standing decision on ``approval_id`` if ``approved`` repeats it; None while it
    is open or unknown. Raises AlreadyDecidedError if ``approved`` contradicts it."""
    decided = state.decisions.get(approval_id)
    if decided is None or approval_id in state.approvals:
        return None
    if decided.approved != approved:
        verdict = "approved" if decided.approved else "denied"
        raise AlreadyDecidedError(
            run_id, f"approval {approval_id!r}",
            f"{verdict} by {decided.by!r} (reason {decided.reason!r})", decided.seq)
    return Decision(_events_at(store, run_id, decided.seq, 1), appended=False)


# --- uncertain calls -------------------------------------------------------------------


def find_uncertain(run_id: str, calls: list[PendingCall], key: str) -> PendingCall:
    """The uncertain call whose key is ``key`` or starts with it (an unambiguous prefix)."""
    hits = _named(key, [p.key for p in calls])
    if not hits:
        raise NotPendingError(run_id, f"uncertain call {key!r}", [p.key for p in calls])
    if len(hits) > 1:
        raise AmbiguousKeyError(run_id, key, hits)
    return next(p for p in calls if p.key == hits[0])


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
    run is escalated. Returns the events that record it (the standing ones, when
    the same outcome was already recorded).
    """
    return record_resolution(store, run_id, key, outcome=outcome, by=by, reason=reason,
                             result=result).events


def record_resolution(
    store: Store,
    run_id: str,
    key: str,
    *,
    outcome: Outcome,
    by: str,
    reason: str = "",
    result: Any = None,
) -> Decision:
    """Like :func:`resolve_uncertain`, saying whether the decision was appended now."""
    # As for approvals: a repeat is answered without the lease.
    if (stood := _resolution_stands(store, run_id, load_state(store, run_id).state,
                                    key, outcome)) is not None:
        return stood
    with open_journal(store, run_id, owner=f"decision:{by}", must_exist=True) as j:
        if (stood := _resolution_stands(store, run_id, j.state, key, outcome)) is not None:
            return stood  # decided meanwhile
        pending = find_uncertain(run_id, list(j.state.pending.values()), key)
        facts = resolution_facts(pending, outcome, by=by, reason=reason, result=result)
        recorded = j.record_all(facts)
        if _awaits_a_person(store, run_id, j.state):  # the run waits for this person still
            keep_waiting(store, run_id, recorded[-1].seq)
        return Decision(recorded, appended=True)


def resolution_facts(pending: PendingCall, outcome: Outcome, *, by: str, reason: str = "",
                     result: Any = None) -> list[tuple[EventType, dict[str, Any]]]:
    """The facts that record a person's ``outcome`` for the uncertain call ``pending``,
    to be appended together (by whoever holds the run's lease)."""
    common = {"started_seq": pending.started_seq, "key": pending.key, "tool": pending.tool}
    facts: list[tuple[EventType, dict[str, Any]]] = [(EventType.TOOL_CALL_RECONCILED, {
        "verdict": VERDICTS[outcome], "by": by, "reason": reason, **common})]
    # What follows a verdict is appended with it, atomically: "happened" settles
    # the call, so its completion must never be lost in between.
    if outcome == "happened" and pending.effect == "compensation":  # an undo (saga.py)
        facts.append((EventType.COMPENSATION_COMPLETED, {
            "started_seq": pending.started_seq, "key": pending.key, "result": result,
            "effect_seq": int(pending.call_id.removeprefix("undo-")), "source": "person"}))
    elif outcome == "happened":
        facts.append((EventType.TOOL_CALL_COMPLETED, {
            "call_id": pending.call_id, "tool": pending.tool,
            "started_seq": pending.started_seq, "idempotency_key": pending.key,
            # the verdict closes the start first: the completion keeps its arguments
            "args": pending.args, "result": result, "source": "person",
            **({"content": NO_RESULT_GIVEN} if result is None else {})}))
    elif outcome == "conflict":
        facts.append((EventType.RUN_ESCALATED, {
            "reason": reason or "conflict", "by": by, "key": pending.key,
            "tool": pending.tool, "ours": pending.args}))
    return facts


def _resolution_stands(store: Store, run_id: str, state: RunState, key: str,
                       outcome: Outcome) -> Decision | None:
    """The standing decision on the call ``key`` names if ``outcome`` repeats it; None
    when the call awaits a decision (or is unknown: the caller reports that). Raises
    AlreadyDecidedError if ``outcome`` contradicts what stands."""
    open_calls = _named(key, [p.key for p in state.pending.values()])
    if open_calls:
        if len(open_calls) > 1:
            return None  # find_uncertain names the ambiguity
        # Open: only a person's "conflict" can stand on it, and repeating it must not
        # escalate again. Verdicts on this call come after its start.
        call = find_uncertain(run_id, list(state.pending.values()), open_calls[0])
        verdict = _last_person_verdict(store.read(run_id, after_seq=call.started_seq),
                                       call.key)
        if verdict is None or outcome != "conflict" or verdict.payload["verdict"] != "conflict":
            return None
        return Decision(_events_at(store, run_id, verdict.seq, 2), appended=False)
    # Settled: find the key among the calls a person resolved and those completed.
    # Reading the whole log is the price of a repeat, paid only when nothing is open.
    verdicts = [e for e in store.read(run_id) if _by_a_person(e)]
    keys = _named(key, sorted({e.payload["key"] for e in verdicts} | set(state.completed)))
    if not keys:
        return None
    if len(keys) > 1:
        raise AmbiguousKeyError(run_id, key, keys)
    full = keys[0]
    if (verdict := _last_person_verdict(verdicts, full)) is not None:
        stood = OUTCOMES[verdict.payload["verdict"]]
        count = 1 if stood == "did_not_happen" else 2  # with its completion or escalation
        events = _events_at(store, run_id, verdict.seq, count)
        standing = (f"{stood} by {verdict.payload.get('by')!r} "
                    f"(reason {verdict.payload.get('reason', '')!r})")
    else:
        done = state.completed[full]
        stood, events = "happened", _events_at(store, run_id, done.seq, 1)
        standing = f"happened: completed (source {done.source!r})"
    if stood != outcome:
        raise AlreadyDecidedError(run_id, f"uncertain call {full[:16]!r}", standing,
                                  events[0].seq)
    return Decision(events, appended=False)


def _awaits_a_person(store: Store, run_id: str, state: RunState) -> bool:
    """Whether a call still uncertain is one a resume would hand back to a person: it
    may have made an effect, and its last settling recorded no verdict on it (its tool
    has no lookup; one with a lookup gets a verdict, and a resume asks again)."""
    held = [p for p in state.pending.values() if p.effect in _PERSONS_EFFECTS]
    if not held:
        return False
    first = min(p.started_seq for p in held)
    looked_up = {e.payload["key"] for e in store.read(run_id, after_seq=first)
                 if e.type is EventType.TOOL_CALL_RECONCILED
                 and e.payload.get("by", "agentjournal") == "agentjournal"}
    return any(p.key not in looked_up for p in held)


# An uncertain call of these, with no lookup, goes to a person (settle.py): a retry
# could make its effect twice.
_PERSONS_EFFECTS = frozenset({Effect.REVERSIBLE, Effect.IRREVERSIBLE})


def _named(key: str, keys: list[str]) -> list[str]:
    """The keys ``key`` names: itself, else those it is a prefix of (as find_uncertain)."""
    return [k for k in keys if k == key] or [k for k in keys if k.startswith(key)]


def _by_a_person(event: Event) -> bool:
    return (event.type is EventType.TOOL_CALL_RECONCILED
            and event.payload.get("by", "agentjournal") != "agentjournal"
            and event.payload.get("verdict") in OUTCOMES)


def _last_person_verdict(events: Iterable[Event], key: str) -> Event | None:
    return next((e for e in reversed(list(events))
                 if _by_a_person(e) and e.payload["key"] == key), None)


def _events_at(store: Store, run_id: str, seq: int, count: int) -> list[Event]:
    """The ``count`` events from ``seq`` on: the ones that recorded a decision."""
    events = []
    for event in store.read(run_id, after_seq=seq - 1):
        events.append(event)
        if len(events) == count:
            break
    return events
