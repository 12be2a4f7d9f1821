"""Layer 1: the event vocabulary, the envelope and its one canonical encoding.

An event records one new fact (a decision or an occurrence), never computed
state. Its envelope says which run it belongs to, where it sits in that run's
log (``seq``, contiguous from 1), which schema version its payload follows,
when it was written (UTC) and by which lease epoch.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

import msgspec

from .errors import EncodingError, UnknownEventTypeError, UnsupportedVersionError

#: The schema version this release writes. Older versions are upcast on read.
#: v1: first release. v2: model_turn's cost moves into its usage, beside a new
#: cached_input_tokens count. v3: tool_call_completed and tool_result_served may
#: omit ``content`` when it is the rendered ``result`` (stored once, not twice).
#: v4: the envelope carries ``digest``, chained to the event before it (see seal).
#: v5: model_turn records who answered (provider, model, response and request ids,
#: finish reason, opaque items, latency) and usage by one convention with cache
#: writes and reasoning tokens; run_started records instructions; new types
#: model_call_started, model_call_failed, instructions_changed.
#: v6: sagas: new types saga_started, compensation_started, compensation_completed,
#: saga_finished; run_cancelled; workspace_checkpoint; observations_checked
#: (freshness); tool_call_completed may carry fresh_for, tool_call_started
#: key_retention (no older payload changed).
#: v7: step_recorded (a unit of a run another framework drives: agentjournal.bridge);
#: model_turn may carry that unit's ``step`` and ``value`` (no older payload changed);
#: the conversation of an OpenAI Agents SDK session (session_items_added,
#: session_item_popped, session_cleared) and a framework's trace spans (trace_recorded).
#: v8: deploys: run_started and run_resumed carry the ``agent_version`` that started or
#: continued the run; request_changed (a recorded model turn served to a request that
#: the code now makes differently: which parts changed, by digest).
SCHEMA_VERSION = 8

#: The first schema version whose events are stored sealed (with a chained digest).
SEALED_SINCE = 4

#: The first schema version written only by releases that keep each run's head (its last
#: seq and digest) apart from its log: 0.1.0 wrote v6 and kept none; heads came before
#: v7 did. A v7 record in a store without heads proves that they were removed.
HEADS_SINCE = 7


class EventType(StrEnum):
    RUN_STARTED = "run_started"
    USER_MESSAGE = "user_message"
    MODEL_TURN = "model_turn"
    MODEL_CALL_STARTED = "model_call_started"
    MODEL_CALL_FAILED = "model_call_failed"
    INSTRUCTIONS_CHANGED = "instructions_changed"
    TOOL_CALL_STARTED = "tool_call_started"
    TOOL_CALL_COMPLETED = "tool_call_completed"
    TOOL_CALL_UNCERTAIN = "tool_call_uncertain"
    TOOL_CALL_RECONCILED = "tool_call_reconciled"
    TOOL_CALL_DENIED = "tool_call_denied"
    TOOL_RESULT_SERVED = "tool_result_served"
    APPROVAL_REQUESTED = "approval_requested"
    APPROVAL_DECIDED = "approval_decided"
    GUARDRAIL_TRIGGERED = "guardrail_triggered"
    CONTEXT_COMPACTED = "context_compacted"
    MEMORY_WRITTEN = "memory_written"
    RUN_RESUMED = "run_resumed"
    RUN_PAUSED = "run_paused"
    RUN_ESCALATED = "run_escalated"
    RUN_FINISHED = "run_finished"
    BUDGET_EXCEEDED = "budget_exceeded"
    SAGA_STARTED = "saga_started"
    COMPENSATION_STARTED = "compensation_started"
    COMPENSATION_COMPLETED = "compensation_completed"
    SAGA_FINISHED = "saga_finished"
    OBSERVATIONS_CHECKED = "observations_checked"
    RUN_CANCELLED = "run_cancelled"
    WORKSPACE_CHECKPOINT = "workspace_checkpoint"
    STEP_RECORDED = "step_recorded"
    REQUEST_CHANGED = "request_changed"
    # A LangGraph thread (integrations/langgraph.py); record-only, indexed by the saver.
    GRAPH_INPUT = "graph_input"
    GRAPH_CHECKPOINT = "graph_checkpoint"
    GRAPH_WRITES = "graph_writes"
    SESSION_ITEMS_ADDED = "session_items_added"
    SESSION_ITEM_POPPED = "session_item_popped"
    SESSION_CLEARED = "session_cleared"
    TRACE_RECORDED = "trace_recorded"

    @classmethod
    def parse(cls, name: str) -> EventType:
        """The type named ``name``; an unknown name raises, naming it."""
        try:
            return cls(name)
        except ValueError:
            raise UnknownEventTypeError(name) from None


class Event(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One recorded fact. ``payload`` is plain JSON data (so an event is never in a
    reference cycle, and the cyclic GC need not track it: see state.py)."""

    run_id: str
    seq: int
    type: EventType
    ts: datetime
    epoch: int = 0
    v: int = SCHEMA_VERSION
    payload: dict[str, Any] = msgspec.field(default_factory=dict)
    #: Set by the store when it writes the event (see :func:`seal`); "" before that.
    digest: str = ""


def now() -> datetime:
    return datetime.now(UTC)


def make_events(
    run_id: str,
    after_seq: int,
    epoch: int,
    facts: Iterable[tuple[EventType, Mapping[str, Any]]],
) -> list[Event]:
    """Envelopes for ``facts``, numbered from ``after_seq + 1``, all stamped now.

    Payloads are put in canonical form (sorted keys, plain JSON types) here, so
    the live state folded from these events is byte for byte the state a
    replay of the stored log gives. One :func:`canonical_payload` made is already.
    """
    ts = now()
    return [
        Event(run_id=run_id, seq=after_seq + i, type=t, ts=ts, epoch=epoch,
              payload=p if type(p) is _Canonical else _Canonical(canonical_copy(p)))
        for i, (t, p) in enumerate(facts, start=1)
    ]


def canonical_payload(payload: Mapping[str, Any]) -> tuple[dict[str, Any], bytes]:
    """``payload`` in the canonical form make_events gives it (which make_events then
    takes as it is), and its canonical bytes. EncodingError as canonical_copy."""
    data = _canonical_bytes(payload, "value")
    return _Canonical(_plain(payload, data, "value")), data


def canonical_copy(value: Any, where: str = "value") -> Any:
    """``value`` decoded from its canonical bytes: plain JSON data, exactly what a replay
    decodes (tuples become lists). EncodingError for what JSON cannot hold (a NaN, an
    infinity, a non-string key, a lone surrogate), naming where. The codec checks in C;
    where the copy equals the value, the value held only JSON types and finite floats (a
    NaN is written as null), so the walk that names the culprit runs only where it does
    not."""
    return _plain(value, _canonical_bytes(value, where), where)


def _canonical_bytes(value: Any, where: str) -> bytes:
    try:
        return _encode(value)
    except EncodingError:
        check_finite(value, where)  # a non-string key, named where it is
        raise


def _plain(value: Any, data: bytes, where: str) -> Any:
    """``value`` decoded from its canonical bytes ``data``, checked (see canonical_copy)."""
    plain = _raw_decoder.decode(data)
    if plain != value:  # (also tuples, which are fine: the walk lets them pass)
        check_finite(value, where)
    return plain


class _Canonical(dict[str, Any]):
    """A payload make_events decoded from its own canonical bytes: checked once there
    (finite, JSON types only), so encoding it again need not walk it again."""

    __slots__ = ()


# --- the codec ---------------------------------------------------------------
#
# One canonical form: compact JSON, object keys sorted, UTF-8. Strings are
# escaped by msgspec, so an encoded event never contains a raw newline byte and
# a JSON Lines file may be split on b"\n" alone.

_encoder = msgspec.json.Encoder(order="sorted")
_decoder = msgspec.json.Decoder(Event)
_raw_decoder = msgspec.json.Decoder()


def check_finite(value: Any, path: str = "payload") -> None:
    # msgspec writes NaN and infinities as null; refuse them instead of
    # silently storing a different value. This runs on every append, so the
    # walk keeps no paths; only a failure walks again to name the culprit.
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                _explain(value, path)
        elif isinstance(item, dict):
            for k, v in item.items():
                if not isinstance(k, str):
                    _explain(value, path)
                if not isinstance(v, str):
                    stack.append(v)
        elif isinstance(item, list | tuple):
            stack.extend(item)


def _explain(value: Any, where: str) -> None:
    """Raise EncodingError naming the first NaN, infinity or non-string key in ``value``."""
    if isinstance(value, float) and not math.isfinite(value):
        raise EncodingError(f"{where} is {value!r}; NaN and infinities are not JSON")
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise EncodingError(f"{where} has a non-string key {k!r}")
            _explain(v, f"{where}.{k}")
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            _explain(v, f"{where}[{i}]")


def _not_utf8(exc: UnicodeEncodeError) -> str:
    bad = exc.object[exc.start : exc.end]
    return (f"a string holds {bad!r}, a lone surrogate that UTF-8 cannot encode (often "
            "bytes decoded with errors='surrogateescape'); decode the source with "
            "errors='replace' or pass bytes as base64")


def encode(event: Event) -> bytes:
    """The canonical bytes of ``event``. Refuses NaN, infinities and non-JSON values."""
    if type(event.payload) is not _Canonical:
        check_finite(event.payload)
    try:
        return _encoder.encode(event)
    except (TypeError, msgspec.EncodeError) as exc:
        raise EncodingError(str(exc)) from None
    except UnicodeEncodeError as exc:  # a lone surrogate: no UTF-8 can hold it
        raise EncodingError(_not_utf8(exc)) from None


def encode_value(value: Any) -> bytes:
    """Canonical JSON for any payload value (sorted keys, refusing NaN)."""
    check_finite(value, "value")
    return _encode(value)


def _encode(value: Any) -> bytes:
    """Canonical JSON for ``value``, unchecked: a NaN would be written as null."""
    try:
        return _encoder.encode(value)
    except (TypeError, msgspec.EncodeError) as exc:
        raise EncodingError(str(exc)) from None
    except UnicodeEncodeError as exc:
        raise EncodingError(_not_utf8(exc)) from None


def render(result: Any) -> str:
    """A tool result as the model reads it: the text itself, or canonical JSON.

    Only called on results that are already stored (so already checked finite).
    """
    return result if isinstance(result, str) else _encoder.encode(result).decode()


def decode(data: bytes | memoryview | str) -> Event:
    """The event encoded in ``data``, upcast to the current schema version.

    An unknown event type or a version newer than this release raises.
    """
    event = decode_stored(data)
    if event.v != SCHEMA_VERSION:
        return upcast(event)
    return event


def decode_stored(data: bytes | memoryview | str) -> Event:
    """The event encoded in ``data`` at the schema version it was written with."""
    try:
        event = _decoder.decode(data)
    except msgspec.ValidationError as exc:
        raw = _raw_decoder.decode(data)
        if isinstance(raw, dict) and "type" in raw:
            EventType.parse(str(raw["type"]))  # raises naming an unknown type
        raise EncodingError(f"not a valid event: {exc}") from None
    return event


# --- the digest chain ----------------------------------------------------------
#
# Every event is stored *sealed*: its canonical bytes with ``digest`` filled in,
# where digest = sha256(digest of the event before it + the event's canonical
# bytes with digest ""), cut to 128 bits (hex). The first event of a run, and the
# first after records written before v4, chain from "". An event edited after it
# was written no longer matches its digest; one edited with a recomputed digest
# breaks the next event's. That is tamper evidence for audit, not a signature:
# someone who rewrites every later digest too is caught only by an outside copy.
#
# Sorted keys put "digest" first, so sealing is a splice at a fixed offset and
# checking needs no re-encoding: what is hashed is exactly what is stored.

GENESIS = ""
_DIGEST_LEN = 32
_HEAD = b'{"digest":"'
_AT = len(_HEAD)


def chain_digest(prev: str, unsealed: bytes | memoryview) -> str:
    """The digest of an event whose unsealed bytes are ``unsealed``, after ``prev``."""
    h = hashlib.sha256(prev.encode("ascii"))
    h.update(unsealed)
    return h.hexdigest()[:_DIGEST_LEN]


def seal(events: Iterable[Event], prev: str) -> tuple[list[bytes], str]:
    """The stored bytes of ``events`` chained from ``prev``, and the last digest.

    Any digest the events already carry (a copy of another run's event) is
    replaced: a digest covers run id and seq, so a copy gets its own.
    """
    bodies = []
    for event in events:
        raw = encode(event if not event.digest else msgspec.structs.replace(event, digest=""))
        prev = chain_digest(prev, raw)
        bodies.append(b"".join((_HEAD, prev.encode("ascii"), raw[_AT:])))
    return bodies, prev


def unseal(body: bytes | memoryview, prev: str) -> tuple[str, str] | None:
    """(stored digest, the digest its bytes and ``prev`` give) of a sealed record;
    None if the record is unsealed (written before v4). Hashes the stored bytes in
    place, around the digest, without copying them."""
    digest = stored_digest(body)
    if not digest:
        return None
    view = memoryview(body)
    h = hashlib.sha256(prev.encode("ascii"))
    h.update(view[:_AT])
    h.update(view[_AT + _DIGEST_LEN :])
    return digest, h.hexdigest()[:_DIGEST_LEN]


def stored_digest(body: bytes | memoryview) -> str:
    """The digest a stored record carries ("" for a record written before v4)."""
    head = bytes(memoryview(body)[: _AT + _DIGEST_LEN + 1])
    if head[:_AT] != _HEAD or head[-1:] != b'"' or len(head) <= _AT + _DIGEST_LEN:
        return GENESIS
    return head[_AT:-1].decode("ascii", "replace")


# --- what a version could not have written -------------------------------------------
#
# A stored record's version says which writer made it. A record that holds a type or a
# field only a later version writes was relabelled (as an older, unsealed record, free to
# edit): damage. Only what the version notes above say a version introduced is listed.

_TYPES_SINCE: dict[EventType, int] = {
    **dict.fromkeys((EventType.MODEL_CALL_STARTED, EventType.MODEL_CALL_FAILED,
                     EventType.INSTRUCTIONS_CHANGED), 5),
    **dict.fromkeys((EventType.SAGA_STARTED, EventType.COMPENSATION_STARTED,
                     EventType.COMPENSATION_COMPLETED, EventType.SAGA_FINISHED,
                     EventType.RUN_CANCELLED, EventType.WORKSPACE_CHECKPOINT,
                     EventType.OBSERVATIONS_CHECKED), 6),
    **dict.fromkeys((EventType.STEP_RECORDED, EventType.GRAPH_INPUT,
                     EventType.GRAPH_CHECKPOINT, EventType.GRAPH_WRITES,
                     EventType.SESSION_ITEMS_ADDED, EventType.SESSION_ITEM_POPPED,
                     EventType.SESSION_CLEARED, EventType.TRACE_RECORDED), 7),
    EventType.REQUEST_CHANGED: 8,
}

# (type, payload field) -> the version that introduced it; "usage." names a usage field.
_FIELDS_SINCE: dict[tuple[EventType, str], int] = {
    (EventType.MODEL_TURN, "usage.cached_input_tokens"): 2,
    **{(EventType.MODEL_TURN, f): 5 for f in (
        "provider", "model", "response_id", "request_id", "finish_reason", "items",
        "latency_ms", "usage.cache_write_tokens", "usage.reasoning_tokens")},
    (EventType.RUN_STARTED, "instructions"): 5,
    (EventType.TOOL_CALL_COMPLETED, "fresh_for"): 6,
    (EventType.TOOL_CALL_STARTED, "key_retention"): 6,
    (EventType.MODEL_TURN, "step"): 7,
    (EventType.MODEL_TURN, "value"): 7,
    (EventType.RUN_STARTED, "agent_version"): 8,
    (EventType.RUN_RESUMED, "agent_version"): 8,
}


def newer_than_labelled(event: Event) -> tuple[str, int] | None:
    """What a stored ``event`` (not upcast) holds that its version ``v`` could not have
    written, and the version that introduced it; None if nothing."""
    since = _TYPES_SINCE.get(event.type, 1)
    if since > event.v:
        return f"a {event.type.value} event", since
    usage = event.payload.get("usage")
    for (kind, field), since in _FIELDS_SINCE.items():
        if kind is not event.type or since <= event.v:
            continue
        name = field.removeprefix("usage.")
        if name in (event.payload if name == field else usage if isinstance(usage, dict)
                    else ()):
            return f"{event.type.value}'s {field!r}", since
    return None


# --- upcasters: (type, from version) -> payload of version + 1 --------------------
#
# A type whose payload did not change between two versions needs no entry.
# Upcasters are pure functions of one payload; a change of meaning that needs
# more context than that is a migration, not an upcast.

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]


def _model_turn_v1_to_v2(p: dict[str, Any]) -> dict[str, Any]:
    usage = {"input_tokens": 0, "output_tokens": 0, **(p.get("usage") or {})}
    usage["cached_input_tokens"] = 0  # v1 did not count cache hits
    usage["cost_usd"] = p.get("cost_usd", 0.0)
    return {**{k: v for k, v in p.items() if k != "cost_usd"}, "usage": usage}


def _model_turn_v4_to_v5(p: dict[str, Any]) -> dict[str, Any]:
    # v5 usage counts cache writes and reasoning tokens; no v4 writer knew them, and
    # no v4 turn knew who answered.
    usage = {**(p.get("usage") or {}), "cache_write_tokens": 0, "reasoning_tokens": 0}
    return {"provider": None, "model": None, "finish_reason": None, **p, "usage": usage}


def _run_started_v4_to_v5(p: dict[str, Any]) -> dict[str, Any]:
    return {"instructions": None, **p}  # no instructions were recorded before v5


UPCASTERS: dict[tuple[EventType, int], Upcaster] = {
    (EventType.MODEL_TURN, 1): _model_turn_v1_to_v2,
    (EventType.MODEL_TURN, 4): _model_turn_v4_to_v5,
    (EventType.RUN_STARTED, 4): _run_started_v4_to_v5,
}


def upcast(event: Event) -> Event:
    """Bring ``event`` to :data:`SCHEMA_VERSION`, one version at a time; refuse a newer one."""
    if event.v > SCHEMA_VERSION:
        raise UnsupportedVersionError(f"event {event.run_id}#{event.seq}", event.v, SCHEMA_VERSION)
    payload = event.payload
    for version in range(event.v, SCHEMA_VERSION):
        step = UPCASTERS.get((event.type, version))
        if step is not None:
            payload = step(payload)
    return msgspec.structs.replace(event, v=SCHEMA_VERSION, payload=payload)
