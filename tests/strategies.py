"""Hypothesis strategies that generate coherent run logs (every completion pairs a start)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import strategies as st

from agentjournal import Event, EventType

T0 = datetime(2026, 1, 1, tzinfo=UTC)
text = st.text(max_size=12)
OPS = (
    "user", "turn", "start", "complete", "fail", "uncertain", "reconcile", "deny", "served",
    "ask", "decide", "flag", "redact", "compact", "memory", "resumed", "paused", "escalated",
    "finished", "budget", "fresh", "saga", "undo", "undone", "saga_done", "cancel", "workspace",
    "session_add", "session_pop", "session_clear", "trace",
)


@st.composite
def run_logs(draw: st.DrawFn, max_events: int = 40, run_id: str = "run-1") -> list[Event]:
    events: list[Event] = []
    pending: dict[int, str] = {}  # started seq -> key
    approvals: list[str] = []
    messages = 0

    def emit(kind: EventType, **payload: Any) -> None:
        seq = len(events) + 1
        events.append(Event(run_id=run_id, seq=seq, type=kind, ts=T0 + timedelta(seconds=seq),
                            payload=payload))

    emit(EventType.RUN_STARTED, task=draw(text))
    for op in draw(st.lists(st.sampled_from(OPS), max_size=max_events)):
        key = f"k{draw(st.integers(0, 5))}"
        if op == "user":
            emit(EventType.USER_MESSAGE, content=draw(text),
                 trust=draw(st.sampled_from(["user", "untrusted"])))
            messages += 1
        elif op == "turn":
            calls = [{"id": f"c{i}", "name": "t", "args": {"x": i}}
                     for i in range(draw(st.integers(0, 2)))]
            emit(EventType.MODEL_TURN, text=draw(text), tool_calls=calls,
                 usage={"input_tokens": draw(st.integers(0, 99)), "output_tokens": 3,
                        "cost_usd": draw(st.sampled_from([0.0, 0.25, 0.001]))})
            messages += 1
        elif op == "start":
            emit(EventType.TOOL_CALL_STARTED, key=key, tool="t", args={"k": key}, call_id="c",
                 effect="irreversible", attempt=1)
            pending[len(events)] = key
        elif op in ("complete", "fail") and pending:
            seq = draw(st.sampled_from(sorted(pending)))
            ok = op == "complete"
            call_id = f"c{draw(st.integers(0, 2))}"
            fresh = {"fresh_for": 1.5} if draw(st.booleans()) else {}
            emit(EventType.TOOL_CALL_COMPLETED, started_seq=seq, call_id=call_id, tool="t",
                 idempotency_key=pending.pop(seq) if ok else None, is_error=not ok,
                 content=draw(text), result={"v": draw(st.integers())}, **fresh)
            messages += 1
        elif op == "saga":
            emit(EventType.SAGA_STARTED, by="ops", reason="r", through_seq=0, blocked=None,
                 plan=[{"effect_seq": 1, "key": key, "undo_key": f"u-{key}", "tool": "t"}])
        elif op == "undo":
            emit(EventType.COMPENSATION_STARTED, saga_seq=1, effect_seq=1, effect_key=key,
                 key=f"u-{key}", tool="t", args={}, attempt=1)
            pending[len(events)] = f"u-{key}"
        elif op == "undone" and pending:
            seq = draw(st.sampled_from(sorted(pending)))
            failed = {"error": "frozen"} if draw(st.booleans()) else {"result": {"v": 1}}
            emit(EventType.COMPENSATION_COMPLETED, started_seq=seq, key=pending.pop(seq),
                 effect_seq=1, **failed)
        elif op == "workspace":
            cause = draw(st.sampled_from(["start", "turn", "drift", "restore"]))
            emit(EventType.WORKSPACE_CHECKPOINT, cause=cause, directory="/w", shadow="/s",
                 commit=draw(st.sampled_from(["c1", "c2", None])), changed=["a"], count=1,
                 restored_seq=1)
            messages += 1 if cause in ("drift", "restore") else 0
        elif op == "session_add":
            emit(EventType.SESSION_ITEMS_ADDED, items=[
                {"role": "user", "content": draw(text)}
                for _ in range(draw(st.integers(1, 3)))])
        elif op == "session_pop":
            emit(EventType.SESSION_ITEM_POPPED, index=draw(st.integers(-1, 4)))
        elif op == "session_clear":
            emit(EventType.SESSION_CLEARED, count=1)
        elif op == "trace":
            emit(EventType.TRACE_RECORDED, trace_id="trace_1", dropped=0, spans=[
                {"kind": "agent", "name": "a", "span_id": "s1", "parent_id": None, "ms": 1.5}])
        elif op == "cancel":
            emit(EventType.RUN_CANCELLED, by="ops", reason=draw(text))
        elif op == "saga_done":
            emit(EventType.SAGA_FINISHED, undone=1)
        elif op == "fresh":
            items = [{"call_id": f"c{i}", "tool": "t", "args": {"x": i}, "observed_seq": 1,
                      "age_s": 2.0, "verdict": draw(st.sampled_from(
                          ["changed", "unchanged", "stale"])), "result": {"v": i}}
                     for i in range(draw(st.integers(0, 2)))]
            emit(EventType.OBSERVATIONS_CHECKED, items=items)
            messages += 1 if items else 0
        elif op == "uncertain" and pending:
            seq = draw(st.sampled_from(sorted(pending)))
            emit(EventType.TOOL_CALL_UNCERTAIN, started_seq=seq, key=pending[seq], error="timeout")
        elif op == "reconcile" and pending:
            seq = draw(st.sampled_from(sorted(pending)))
            verdict = draw(st.sampled_from(["found", "absent", "retry", "conflict", "unknown"]))
            emit(EventType.TOOL_CALL_RECONCILED, started_seq=seq, key=pending[seq], verdict=verdict)
            if verdict in ("found", "absent", "retry"):
                pending.pop(seq)
        elif op == "deny":
            emit(EventType.TOOL_CALL_DENIED, call_id="c", tool="t", reason=draw(text))
            messages += 1
        elif op == "served":
            emit(EventType.TOOL_RESULT_SERVED, key=key, call_id=f"c{draw(st.integers(0, 2))}",
                 tool="t", content=draw(text))
            messages += 1
        elif op == "budget":
            emit(EventType.BUDGET_EXCEEDED, budget="turns", limit=3, used=3)
        elif op == "ask":
            approval_id = f"a{len(events)}"
            emit(EventType.APPROVAL_REQUESTED, approval_id=approval_id, key=key, tool="t",
                 args={}, reason="policy")
            approvals.append(approval_id)
        elif op == "decide" and approvals:
            emit(EventType.APPROVAL_DECIDED, approval_id=approvals.pop(0),
                 approved=draw(st.booleans()), by="ops", reason="ok")
        elif op in ("flag", "redact"):
            emit(EventType.GUARDRAIL_TRIGGERED, name="pii", action=op, severity="warn",
                 message_index=draw(st.integers(0, max(messages, 1))), replacement="[x]")
        elif op == "compact":
            kept = draw(st.integers(0, messages))
            emit(EventType.CONTEXT_COMPACTED, summary=draw(text), kept=kept)
            messages = 1 + min(messages, 1) + kept
        elif op == "memory":
            emit(EventType.MEMORY_WRITTEN, key=key, value=draw(text))
        elif op == "resumed":
            emit(EventType.RUN_RESUMED)
        elif op == "paused":
            emit(EventType.RUN_PAUSED, reason="uncertain call")
        elif op == "escalated":
            emit(EventType.RUN_ESCALATED, reason="conflict", details={"a": 1})
        elif op == "finished":
            emit(EventType.RUN_FINISHED, outcome=draw(text))
    return events
