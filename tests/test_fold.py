from __future__ import annotations

from datetime import UTC, datetime

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentjournal import (
    FOLD_RULES,
    RECORD_ONLY,
    SCHEMA_VERSION,
    Event,
    EventType,
    RunState,
    UnknownEventTypeError,
    apply,
    decode,
    encode,
    fold,
)

from .strategies import run_logs

T = datetime(2026, 1, 1, tzinfo=UTC)


def ev(seq: int, kind: EventType, **payload: object) -> Event:
    return Event(run_id="r", seq=seq, type=kind, ts=T, payload=dict(payload))


def as_bytes(state: RunState) -> bytes:
    return msgspec.json.encode(msgspec.to_builtins(state, str_keys=True), order="sorted")


def test_every_event_type_is_classified_exactly_once() -> None:
    rules, record_only = set(FOLD_RULES), set(RECORD_ONLY)
    assert not rules & record_only, f"in both sets: {rules & record_only}"
    missing = set(EventType) - rules - record_only
    assert not missing, f"event types with no fold rule and not record-only: {missing}"


def test_unknown_type_string_is_refused_naming_it() -> None:
    raw = b'{"run_id":"r","seq":1,"type":"teleported","ts":"2026-01-01T00:00:00Z","payload":{}}'
    with pytest.raises(UnknownEventTypeError, match="teleported"):
        decode(raw)
    with pytest.raises(UnknownEventTypeError, match="teleported"):
        EventType.parse("teleported")


@given(run_logs())
def test_fold_is_deterministic(log: list[Event]) -> None:
    assert as_bytes(fold(log)) == as_bytes(fold(log))


@settings(max_examples=300)
@given(run_logs(), st.data())
def test_fold_in_two_chunks_equals_fold_whole(log: list[Event], data: st.DataObject) -> None:
    cut = data.draw(st.integers(0, len(log)))
    head = fold(log[:cut])
    before = as_bytes(head)
    assert as_bytes(fold(log[cut:], head)) == as_bytes(fold(log))
    assert as_bytes(head) == before  # fold never modifies the state it starts from


@settings(max_examples=300)
@given(run_logs())
def test_live_apply_equals_replay_of_every_prefix(log: list[Event]) -> None:
    live = RunState()
    for i, event in enumerate(log, start=1):
        apply(live, event)
        assert as_bytes(live) == as_bytes(fold(log[:i]))


@given(run_logs())
def test_fold_survives_the_codec(log: list[Event]) -> None:
    assert as_bytes(fold(decode(encode(e)) for e in log)) == as_bytes(fold(log))


def test_completions_dedupe_only_with_a_key() -> None:
    state = fold([
        ev(1, EventType.RUN_STARTED, task="t"),
        ev(2, EventType.TOOL_CALL_STARTED, key="k1", tool="pay", args={"a": 1}, call_id="c1"),
        ev(3, EventType.TOOL_CALL_COMPLETED, started_seq=2, idempotency_key=None,
           is_error=True, content="card declined", tool="pay", call_id="c1"),
        ev(4, EventType.TOOL_CALL_STARTED, key="k1", tool="pay", args={"a": 1}, call_id="c2",
           attempt=2),
        ev(5, EventType.TOOL_CALL_COMPLETED, started_seq=4, idempotency_key="k1",
           content="paid", result={"id": "p1"}, tool="pay", call_id="c2"),
        ev(6, EventType.TOOL_CALL_STARTED, key="k2", tool="email", args={}, call_id="c3"),
    ])
    assert set(state.completed) == {"k1"}
    assert state.completed["k1"].result == {"id": "p1"}
    assert set(state.uncertain) == {"k2"}
    assert [(m.role, m.is_error) for m in state.messages] == [("tool", True), ("tool", False)]
    assert state.tool_calls == 3


def test_compaction_replaces_the_discarded_span_exactly() -> None:
    log = [ev(1, EventType.RUN_STARTED, task="t")]
    log += [ev(i, EventType.USER_MESSAGE, content=f"m{i}") for i in range(2, 8)]
    log.append(ev(8, EventType.CONTEXT_COMPACTED, summary="so far: m2..m5", kept=2))
    state = fold(log)
    assert [(m.content, m.trust) for m in state.messages] == [
        ("m2", "user"), ("so far: m2..m5", "untrusted"), ("m6", "user"), ("m7", "user"),
    ]
    assert state.compactions == 1


def test_approvals_status_usage_and_outcome() -> None:
    state = fold([
        ev(1, EventType.RUN_STARTED, task="reconcile"),
        ev(2, EventType.MODEL_TURN, text="", tool_calls=[{"id": "c", "name": "pay", "args": {}}],
           usage={"input_tokens": 10, "output_tokens": 5, "cost_usd": 0.5}),
        ev(3, EventType.APPROVAL_REQUESTED, approval_id="a1", key="k", tool="pay", args={},
           reason="over limit"),
    ])
    assert state.status == "waiting_approval" and set(state.pending_approvals) == {"a1"}
    assert (state.usage.input_tokens, state.usage.output_tokens, state.cost_usd) == (10, 5, 0.5)
    state = fold([
        ev(4, EventType.APPROVAL_DECIDED, approval_id="a1", approved=True, by="ana", reason="ok"),
        ev(5, EventType.RUN_FINISHED, outcome="done"),
    ], state)
    assert state.decisions["a1"].approved and not state.pending_approvals
    assert (state.status, state.outcome, state.last_seq) == ("finished", "done", 5)


def test_redaction_rewrites_the_message_the_model_will_see() -> None:
    state = fold([
        ev(1, EventType.USER_MESSAGE, content="my card is 4242"),
        ev(2, EventType.GUARDRAIL_TRIGGERED, name="pii", action="redact", severity="high",
           message_index=0, replacement="my card is [redacted]"),
    ])
    assert state.messages[0].content == "my card is [redacted]"
    assert state.guardrails[0].severity == "high"


def test_compaction_keeping_everything_never_shares_messages() -> None:
    # Regression: keeping more than the tail aliased the head message, so a
    # later redaction changed two messages live but one in a replay.
    log = [ev(1, EventType.USER_MESSAGE, content="task"),
           ev(2, EventType.USER_MESSAGE, content="b"),
           ev(3, EventType.CONTEXT_COMPACTED, summary="s", kept=2),
           ev(4, EventType.GUARDRAIL_TRIGGERED, name="pii", action="redact", message_index=0,
              replacement="[x]")]
    live = RunState()
    for event in log:
        apply(live, event)
    assert as_bytes(live) == as_bytes(fold(log))
    assert [m.content for m in live.messages] == ["[x]", "s", "b"]


def test_v1_model_turn_is_upcast_to_the_current_version() -> None:
    v1 = (b'{"epoch":0,"payload":{"cost_usd":0.5,"text":"hi","tool_calls":[],'
          b'"usage":{"input_tokens":3,"output_tokens":2}},"run_id":"r","seq":1,'
          b'"ts":"2026-01-01T00:00:00Z","type":"model_turn","v":1}')
    event = decode(v1)
    assert event.v == SCHEMA_VERSION
    assert event.payload == {
        "text": "hi", "tool_calls": [], "provider": None, "model": None, "finish_reason": None,
        "usage": {"input_tokens": 3, "output_tokens": 2, "cached_input_tokens": 0,
                  "cost_usd": 0.5, "cache_write_tokens": 0, "reasoning_tokens": 0}}
    assert fold([event]).cost_usd == 0.5


def test_v4_turn_and_start_are_upcast_to_v5() -> None:
    start = (b'{"epoch":1,"payload":{"task":"t","scope":"run:r"},"run_id":"r","seq":1,'
             b'"ts":"2026-01-01T00:00:00Z","type":"run_started","v":4}')
    turn = (b'{"epoch":1,"payload":{"text":"hi","tool_calls":[],"usage":{"input_tokens":3,'
            b'"output_tokens":2,"cached_input_tokens":1,"cost_usd":0.5}},"run_id":"r",'
            b'"seq":2,"ts":"2026-01-01T00:00:00Z","type":"model_turn","v":4}')
    started, answered = decode(start), decode(turn)
    assert started.payload == {"task": "t", "scope": "run:r", "instructions": None}
    assert answered.payload["usage"] == {
        "input_tokens": 3, "output_tokens": 2, "cached_input_tokens": 1, "cost_usd": 0.5,
        "cache_write_tokens": 0, "reasoning_tokens": 0}
    assert answered.payload["provider"] is None and answered.v == SCHEMA_VERSION
    state = fold([started, answered])
    assert state.instructions is None and state.usage.cached_input_tokens == 1


def test_a_result_that_was_not_kept_is_done_and_says_why() -> None:
    log = [
        ev(1, EventType.RUN_STARTED, task="t"),
        ev(2, EventType.TOOL_CALL_STARTED, key="k1", tool="pay", args={"a": 1}, call_id="c1"),
        ev(3, EventType.TOOL_CALL_COMPLETED, started_seq=2, idempotency_key="k1", tool="pay",
           call_id="c1", result=None, is_error=True, encoding_error="result is NaN",
           content="error: the call was made, but its result was not kept: result is NaN",
           redactions=[{"rule": "api_key", "count": 1}]),
    ]
    state = fold(log)
    assert state.completed["k1"].error == "result is NaN" and not state.pending
    assert state.messages[-1].is_error and "not kept" in state.messages[-1].content
    live = RunState()
    for event in log:
        apply(live, event)
    assert as_bytes(live) == as_bytes(state)
