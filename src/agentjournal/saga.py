"""Compensation sagas, driven by the log.

Compensating a run undoes its completed effects, newest first. The plan is
recorded once (``saga_started``): each effect in the span that has a
``compensate``, down to the newest one that cannot be undone (no
``compensate``), where the saga stops and escalates, naming it. Read-only
calls have nothing to undo.

Each undo is a call with the discipline of any effect: ``compensation_started``
is durable before it runs, with its own idempotency key derived from the
effect's; ``compensation_completed`` records its result. An undo that raised
is uncertain (``tool_call_uncertain``): the tool's ``compensation_lookup``
settles it (Found: done; Absent: tried again; Unknown: a person), never a
blind retry. A proven failure (ToolFailed) is tried again, ``retries`` times,
then escalates with the effect, the error and what is left to undo.

The saga is resumable: run ``compensate`` again after a crash and it goes on
from the log, never undoing an effect twice. A person asking to compensate a
run that waits for one (``by`` other than "agentjournal") is a decision to go
on, recorded as ``run_resumed``; so is resolving an uncertain undo
(``agentjournal resolve``). Going on after the saga stopped at an effect it cannot
undo says that effect stands: the saga finishes, naming it.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import Any, Literal

import msgspec

from .errors import EncodingError, NotCancellableError, UnsettledError
from .events import EventType
from .faults import fault_point
from .journal import Observer, RunJournal, open_journal
from .keys import idempotency_key
from .ops import Call, call_in_thread
from .results import to_json
from .state import PendingCall, PlannedUndo, RunState
from .store import Store
from .tools import Absent, CallGuard, Conflict, Effect, Found, Tool, ToolFailed, Undo

E = EventType
PERSON_DEFAULT = "agentjournal"

Settled = Literal["done", "retry", "stop"]


class SagaResult(msgspec.Struct, frozen=True, kw_only=True):
    """Where a saga stands: which effects were undone, which wait, which failed."""

    run_id: str
    status: str  # the run's: compensating, compensated, escalated
    undone: list[str]  # effect keys, in the order they were undone
    remaining: list[str]  # effect keys still to undo, newest first
    uncertain: list[str]  # undo keys whose outcome is unknown
    failures: dict[str, str]  # undo key -> last error
    blocked: dict[str, Any] | None  # the effect the saga cannot undo
    escalation: dict[str, Any] | None

    @classmethod
    def of(cls, state: RunState) -> SagaResult:
        saga = state.saga
        plan = saga.plan if saga is not None else []
        open_keys = {p.key for p in state.pending.values() if p.effect == "compensation"}
        return cls(
            run_id=state.run_id, status=state.status,
            undone=[u.key for u in undone_in_order(state)],
            remaining=[u.key for u in plan if u.undo_key not in state.completed],
            uncertain=sorted(open_keys),
            failures=dict(saga.failures) if saga is not None else {},
            blocked=saga.blocked if saga is not None else None,
            escalation=state.escalation if state.status == "escalated" else None)


def cancel(store: Store, run_id: str, *, by: str, reason: str = "",
           compensate_with: Iterable[Tool] | Mapping[str, Tool] | None = None,
           owner: str | None = None, observer: Observer | None = None) -> SagaResult | None:
    """A person stops the run for good (``run_cancelled``): its loop never runs again.

    With ``compensate_with`` (the run's tools), its effects are then undone, as by
    :func:`compensate`; the saga's result is returned (None without). Cancelling a
    cancelled run again records nothing new."""
    with open_journal(store, run_id, owner=owner or f"decision:{by}", observer=observer,
                      must_exist=True) as j:
        if j.state.status in ("finished", "compensating", "compensated"):
            raise NotCancellableError(run_id, j.state.status)
        if j.state.status != "cancelled":
            j.record(E.RUN_CANCELLED, by=by, reason=reason)
    if compensate_with is None:
        return None
    return compensate(store, run_id, compensate_with, reason=reason or "cancelled", by=by,
                      owner=owner, observer=observer)


def undone_in_order(state: RunState) -> list[PlannedUndo]:
    """The planned undos that completed, in the order they completed."""
    if state.saga is None:
        return []
    done = [u for u in state.saga.plan if u.undo_key in state.completed]
    return sorted(done, key=lambda u: state.completed[u.undo_key].seq)


def undo_key(scope: str, tool: str, effect_key: str) -> str:
    """The compensation's idempotency key: one per effect, whatever the attempt."""
    return idempotency_key(scope, f"undo:{tool}", {"effect_key": effect_key})


def compensate(store: Store, run_id: str, tools: Iterable[Tool] | Mapping[str, Tool], *,
               through_seq: int = 0, reason: str = "", by: str = PERSON_DEFAULT,
               owner: str | None = None, retries: int = 2, ttl: float = 30.0,
               observer: Observer | None = None) -> SagaResult:
    """Undo the run's completed effects after ``through_seq``, newest first.

    ``tools`` are the run's tools (an agent's ``tools``): each effect's ``compensate``
    undoes it. The first call records the plan; later calls (after a crash, or a
    person's decision) go on with that plan, whatever ``through_seq`` they pass.
    ``observer(event, state)`` sees each event appended, with the live state.
    """
    with open_journal(store, run_id, owner=owner, ttl=ttl, observer=observer,
                      must_exist=True) as j:
        return run_saga(j, tools, through_seq=through_seq, reason=reason, by=by,
                        retries=retries)


def run_saga(j: RunJournal, tools: Iterable[Tool] | Mapping[str, Tool], *,
             through_seq: int = 0, reason: str = "", by: str = PERSON_DEFAULT,
             retries: int = 2) -> SagaResult:
    """:func:`compensate` in a journal already open (a worker's, which holds the lease)."""
    by_name = dict(tools) if isinstance(tools, Mapping) else {t.name: t for t in tools}
    if j.state.saga is None:
        # A read-only call left uncertain changed nothing: there is nothing to undo.
        if unsettled := [p.key for p in j.state.pending.values()
                         if p.effect != Effect.READ_ONLY.value]:
            raise UnsettledError(j.run_id, unsettled)
        _start(j, by_name, through_seq, reason, by)
    elif j.state.waits_for_a_person:
        if by == PERSON_DEFAULT:
            return SagaResult.of(j.state)  # nothing decided: looking again would escalate
        j.record(E.RUN_RESUMED, by=by, reason=reason or "compensate again")
    if j.state.saga is not None and not j.state.saga.finished_seq:
        _drive(j, by_name, retries)
    return SagaResult.of(j.state)


# --- the plan -----------------------------------------------------------------------


def _start(j: RunJournal, tools: dict[str, Tool], through_seq: int, reason: str,
           by: str) -> None:
    plan: list[dict[str, Any]] = []
    blocked: dict[str, Any] | None = None
    for seq, key, name in _effects(j, through_seq):
        tool = tools.get(name)
        if tool is not None and tool.effect is Effect.READ_ONLY:
            continue  # nothing to undo
        if tool is None or tool.compensate is None:
            why = ("not a tool of this agent" if tool is None
                   else f"{tool.effect} with no compensate")
            blocked = {"effect_seq": seq, "key": key, "tool": name, "why": why}
            break
        plan.append({"effect_seq": seq, "key": key, "tool": name,
                     "undo_key": undo_key(j.state.scope, name, key)})
    j.record(E.SAGA_STARTED, by=by, reason=reason, through_seq=through_seq, plan=plan,
             blocked=blocked)


def _effects(j: RunJournal, through_seq: int) -> list[tuple[int, str, str]]:
    """(completion seq, key, tool) of the run's own completed calls after ``through_seq``,
    newest first. Another run's effects (source scope) are that run's to undo."""
    own = {done.seq: key for key, done in j.state.completed.items()
           if done.seq > through_seq and done.source != "scope"}
    # The tool of each is its result's message, unless compaction dropped it: then the log.
    tools = {m.seq: m.name for m in j.state.messages if m.role == "tool" and m.seq in own}
    if len(tools) < len(own):
        tools = {e.seq: e.payload["tool"] for e in j.store.read(j.run_id, after_seq=through_seq)
                 if e.seq in own}
    return [(seq, own[seq], str(tools[seq])) for seq in sorted(own, reverse=True)]


# --- running it ---------------------------------------------------------------------


def _drive(j: RunJournal, tools: dict[str, Tool], retries: int) -> None:
    saga = j.state.saga
    assert saga is not None
    for planned in saga.plan:
        if planned.undo_key in j.state.completed:
            continue
        tool = tools.get(planned.tool)
        if tool is None or tool.compensate is None:
            _escalate(j, planned, f"tool {planned.tool!r} is not given, or has no compensate")
            return
        if not _undo(j, tool, planned, retries):
            return
    if saga.blocked is not None and not _blocked_stands(j.state):
        b = saga.blocked
        _escalate(j, None, f"effect {b['tool']} at seq {b['effect_seq']} ({b['key'][:16]}) "
                  f"cannot be compensated ({b['why']}): the saga stopped before it; undo it "
                  "by hand, or decide it stands", blocked=b)
        return
    stands = ({"blocked_stands": {**saga.blocked, "decided_seq": j.state.decided_seq}}
              if saga.blocked is not None else {})
    j.record(E.SAGA_FINISHED, undone=len(undone_in_order(j.state)), **stands)


def _blocked_stands(state: RunState) -> bool:
    """A person went on after the saga stopped at the effect it cannot undo: that
    effect stands (they undid it by hand, or decided it may stay)."""
    last = state.escalation or {}
    return bool(last.get("blocked")) and state.decided_seq > state.escalated_seq


def _undo(j: RunJournal, tool: Tool, planned: PlannedUndo, retries: int) -> bool:
    """Undo one effect; False when the saga must stop here (escalated)."""
    failures = 0
    open_undo = _open(j.state, planned.undo_key)
    while True:
        if open_undo is not None:
            settled = _settle(j, tool, planned, open_undo)
            if settled != "retry":
                return settled == "done"
        started = j.record(E.COMPENSATION_STARTED, saga_seq=j.state.saga.seq,  # type: ignore[union-attr]
                           effect_seq=planned.effect_seq, effect_key=planned.key,
                           key=planned.undo_key, tool=planned.tool,
                           args=_effect_args(j, planned),
                           attempt=j.state.attempts.get(planned.undo_key, 0) + 1)
        open_undo = j.state.pending[started.seq]
        j.check_lease(tool.name)  # a replaced worker must not undo what its successor did
        fault_point("before_undo")
        assert tool.compensate is not None  # (checked by the caller)
        call = Call(run=functools.partial(tool.compensate, _undo_of(j, planned, open_undo)),
                    timeout=tool.timeout, guard=CallGuard(), name=f"compensate {tool.name}")
        try:
            value = call_in_thread(call)
        except ToolFailed as exc:
            j.record(E.COMPENSATION_COMPLETED, started_seq=started.seq, key=planned.undo_key,
                     effect_seq=planned.effect_seq, error=str(exc))
            failures += 1
            if failures > retries:
                _escalate(j, planned, f"its compensation failed {failures} times: {exc}")
                return False
            open_undo = None
            continue
        except Exception as exc:
            j.record(E.TOOL_CALL_UNCERTAIN, started_seq=started.seq, key=planned.undo_key,
                     error=f"{type(exc).__name__}: {exc}")
            continue  # settled by its lookup above, never blindly retried
        fault_point("after_undo")
        j.record_all([_completion(planned, started.seq, value, "tool")])
        return True


def _settle(j: RunJournal, tool: Tool, planned: PlannedUndo, p: PendingCall) -> Settled:
    """An undo started and never completed: did it take effect?"""
    lookup = tool.compensation_lookup
    if lookup is None:
        _escalate(j, planned, "its compensation may or may not have taken effect, and the "
                  "tool has no compensation_lookup", uncertain=p.key)
        return "stop"
    evidence = lookup(_undo_of(j, planned, p))
    verdict = {"started_seq": p.started_seq, "key": p.key, "tool": p.tool,
               "by": PERSON_DEFAULT}
    if isinstance(evidence, Found):
        j.record_all([(E.TOOL_CALL_RECONCILED, {**verdict, "verdict": "found"}),
                      _completion(planned, p.started_seq, evidence.result, "reconciliation")])
        return "done"
    if isinstance(evidence, Absent):
        j.record(E.TOOL_CALL_RECONCILED, **verdict, verdict="absent")
        return "retry"
    name = "conflict" if isinstance(evidence, Conflict) else "unknown"
    detail = getattr(evidence, "reason", None) or repr(evidence)
    j.record_all([(E.TOOL_CALL_RECONCILED, {**verdict, "verdict": name, "reason": detail}),
                  _escalation(j, planned, f"its compensation is uncertain and the lookup "
                              f"said {name}: {detail}", uncertain=p.key)])
    return "stop"


def _completion(planned: PlannedUndo, started_seq: int, value: Any,
                source: str) -> tuple[EventType, dict[str, Any]]:
    payload: dict[str, Any] = {"started_seq": started_seq, "key": planned.undo_key,
                               "effect_seq": planned.effect_seq, "source": source}
    try:
        payload["result"] = to_json(value)
    except EncodingError as exc:  # it was undone; only its result could not be kept
        payload.update(result=None, encoding_error=str(exc))
    return E.COMPENSATION_COMPLETED, payload


def _escalate(j: RunJournal, planned: PlannedUndo | None, why: str, **detail: Any) -> None:
    j.record_all([_escalation(j, planned, why, **detail)])


def _escalation(j: RunJournal, planned: PlannedUndo | None, why: str,
                **detail: Any) -> tuple[EventType, dict[str, Any]]:
    saga = j.state.saga
    assert saga is not None
    left = [{"tool": u.tool, "effect_seq": u.effect_seq, "key": u.key}
            for u in saga.plan if u.undo_key not in j.state.completed]
    effect = (f"effect {planned.tool} at seq {planned.effect_seq} ({planned.key[:16]}): "
              if planned is not None else "")
    return E.RUN_ESCALATED, {
        "reason": f"saga: {effect}{why}; {len(left)} effect(s) left to undo", "saga": True,
        "effect": None if planned is None else {"tool": planned.tool, "key": planned.key,
                                                "effect_seq": planned.effect_seq},
        "left": left, **detail}


def _open(state: RunState, key: str) -> PendingCall | None:
    return next((p for p in state.pending.values() if p.key == key), None)


def _effect_args(j: RunJournal, planned: PlannedUndo) -> dict[str, Any]:
    done = j.state.completed.get(planned.key)
    return dict(done.args or {}) if done is not None else {}


def _undo_of(j: RunJournal, planned: PlannedUndo, p: PendingCall) -> Undo:
    done = j.state.completed.get(planned.key)
    return Undo(run_id=j.run_id, key=planned.undo_key, effect_key=planned.key,
                tool=planned.tool, args=_effect_args(j, planned),
                result=done.result if done is not None else None, attempt=p.attempt)
