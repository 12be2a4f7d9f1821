"""Script items, and how each provider endpoint renders them on the wire.

Items are provider-agnostic: the same ``Reply`` becomes a ChatCompletion, a Response or an
Anthropic Message depending on which endpoint consumes it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

Json: TypeAlias = dict[str, Any]
Args: TypeAlias = Mapping[str, Any] | str

STOPS = (None, "length", "refusal", "content_filter", "pause_turn")


@dataclass(frozen=True)
class Usage:
    """Provider-neutral token counts, copied as-is onto each provider's usage fields."""

    input: int = 12
    output: int = 7
    cached: int = 0
    cache_write: int = 0
    reasoning: int = 0


@dataclass(frozen=True)
class Reply:
    """One model answer. ``calls`` args: a dict, or a raw string (sent verbatim, may be bad JSON).

    ``reasoning`` (Responses) and ``thinking`` (Anthropic) may be True or the text to use.
    ``delay`` is slept before answering; in background mode it is the time until ready.
    ``call_ids``: the ids to send for the calls, in order, instead of fresh unique ones, as
    some OpenAI-compatible servers do (``["", ""]``, ``["call_0", "call_0"]``).
    """

    text: str = ""
    calls: Sequence[tuple[str, Args]] = ()
    stop: str | None = None
    reasoning: bool | str = False
    thinking: bool | str = False
    redacted_thinking: bool = False
    delay: float = 0.0
    usage: Usage | Mapping[str, int] | None = None
    call_ids: Sequence[str] = ()

    def __post_init__(self) -> None:
        if self.stop not in STOPS:
            raise ValueError(f"stop must be one of {STOPS}, not {self.stop!r}")
        if self.call_ids and len(self.call_ids) != len(self.calls):
            raise ValueError("call_ids needs one id per call")

    def call_id(self, place: int, mem: Memory, prefix: str) -> str:
        """The id of call ``place``: the scripted one, or a fresh one."""
        return self.call_ids[place] if self.call_ids else mem.new_id(prefix)

    def counts(self) -> Usage:
        if self.usage is None:
            return Usage()
        return self.usage if isinstance(self.usage, Usage) else Usage(**self.usage)


@dataclass(frozen=True)
class Fail:
    """An HTTP error in the receiving provider's error shape."""

    status: int
    retry_after: float | str | None = None
    retry_after_ms: float | None = None
    message: str = "stub failure"
    type: str | None = None  # overrides the provider error type derived from status


@dataclass(frozen=True)
class Drop:
    """Read the request, then close the connection without answering."""


@dataclass(frozen=True)
class Hang:
    """Wait ``seconds`` (shutdown interrupts it), then close without answering: a client timeout."""

    seconds: float


Outcome: TypeAlias = Reply | Fail | Drop | Hang
ScriptItem: TypeAlias = Outcome | Callable[[Json], Outcome]


SCRIPT_FORMAT = """\
script format: a JSON list; each item answers one request, in order, and once
all are used every answer is the text "done". An item is an object whose
"type" (default "reply") picks what the server does; its other keys are the
arguments of the class of the same name in agentjournal.testing.llm_stub:
  {"type": "reply", "text": "...", "calls": [[NAME, ARGS], ...], "stop": STOP,
   "reasoning": true|"text", "thinking": true|"text", "redacted_thinking": true,
   "delay": SECONDS, "usage": {"input": N, "output": N, "cached": N,
                               "cache_write": N, "reasoning": N},
   "call_ids": ["", ...]}
      the model's answer, rendered in the shape of the endpoint asked: text,
      tool calls (ARGS an object, or a string sent verbatim, even bad JSON),
      STOP one of "length", "refusal", "content_filter", "pause_turn" (a turn
      cut short), reasoning items (Responses) or thinking blocks (Anthropic)
      that must be echoed back, DELAY seconds before answering (in background
      mode: until the response is ready), token counts, the ids sent for
      the calls (default: fresh unique ones; "" or repeats, as some
      servers send); every key optional
  {"type": "fail", "status": 429, "retry_after": 1, "retry_after_ms": 1000,
   "message": "...", "type_name": "rate_limit_error"}
      an HTTP error in the provider's error shape, with retry-after headers;
      type_name overrides the error type the status implies
  {"type": "drop"}
      read the request, then close the connection without answering
  {"type": "hang", "seconds": 30}
      wait, then close without answering: a client timeout
"""


def item_from_json(obj: Json) -> Outcome:
    """A script file's item (SCRIPT_FORMAT); ValueError naming the item if it is not one."""
    if not isinstance(obj, dict):
        raise ValueError(f"a script item is a JSON object, not {obj!r}")
    kwargs = {k: v for k, v in obj.items() if k not in ("type", "type_name")}
    kind = obj.get("type", "reply")
    factories: dict[str, type[Outcome]] = {"reply": Reply, "fail": Fail, "drop": Drop,
                                           "hang": Hang}
    if kind not in factories:
        raise ValueError(f"script item {obj!r}: type must be one of {', '.join(factories)}")
    if kind == "reply":
        kwargs["calls"] = [(name, args) for name, args in kwargs.get("calls", [])]
    if kind == "fail" and "type_name" in obj:  # "type" already names the item's kind
        kwargs["type"] = obj["type_name"]
    try:
        return factories[kind](**kwargs)
    except TypeError as exc:
        raise ValueError(f"script item {obj!r}: {exc}") from None


@dataclass
class Chain:
    """A stored Response's tool calls, which a follow-up by ``previous_response_id`` answers."""

    open: tuple[str, ...]


@dataclass
class Memory:
    """What this server handed out, so echoed items can be checked like the real APIs do."""

    key: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    reasoning: dict[str, str] = field(default_factory=dict)  # rs id -> encrypted_content
    reasoning_for_call: dict[str, str] = field(default_factory=dict)  # call_id -> rs id
    redacted: set[str] = field(default_factory=set)
    chains: dict[str, Chain] = field(default_factory=dict)  # stored response id -> chain

    @staticmethod
    def new_id(prefix: str) -> str:
        return prefix + secrets.token_hex(12)

    def sign(self, text: str) -> str:
        # An HMAC of the text: a tampered text or signature no longer verifies.
        mac = hmac.new(self.key, text.encode(), hashlib.sha256).digest()
        return base64.b64encode(mac).decode()

    def opaque(self) -> str:
        return "gAAAAB" + base64.urlsafe_b64encode(secrets.token_bytes(48)).decode()


def json_text(args: Args) -> str:
    return args if isinstance(args, str) else json.dumps(dict(args))


def json_object(args: Args) -> Json:
    """Anthropic ``input`` is an object: a raw string that is not one becomes ``{}``."""
    if not isinstance(args, str):
        return dict(args)
    try:
        value = json.loads(args)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


# --- OpenAI Chat Completions -------------------------------------------------------------


def render_chat(reply: Reply, body: Json, mem: Memory) -> Json:
    calls = [
        {
            "id": reply.call_id(place, mem, "call_"),
            "type": "function",
            "function": {"name": name, "arguments": json_text(args)},
        }
        for place, (name, args) in enumerate(reply.calls)
    ]
    refused = reply.stop == "refusal"
    content = None if refused or (calls and not reply.text) else reply.text
    message: Json = {
        "role": "assistant",
        "content": content,
        "refusal": reply.text if refused else None,
        "annotations": [],
    }
    if calls:
        message["tool_calls"] = calls
    finish = {"length": "length", "content_filter": "content_filter"}.get(
        reply.stop or "", "tool_calls" if calls and reply.stop is None else "stop"
    )
    u = reply.counts()
    return {
        "id": mem.new_id("chatcmpl-"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model", "stub"),
        "choices": [{"index": 0, "finish_reason": finish, "logprobs": None, "message": message}],
        "usage": {
            "prompt_tokens": u.input,
            "completion_tokens": u.output,
            "total_tokens": u.input + u.output,
            "prompt_tokens_details": {"cached_tokens": u.cached, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": u.reasoning, "audio_tokens": 0},
        },
        "service_tier": "default",
        "system_fingerprint": None,
    }


# --- OpenAI Responses ---------------------------------------------------------------------

INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}


def render_response(reply: Reply, body: Json, mem: Memory) -> Json:
    output: list[Json] = []
    rs_id = _reasoning_item(reply, mem, output)
    reason = INCOMPLETE.get(reply.stop or "")
    if reply.text or not reply.calls:
        output.append(_message_item(reply, reason is not None, mem))
    for place, (name, args) in enumerate(reply.calls):
        call_id = reply.call_id(place, mem, "call_")
        output.append(
            {
                "type": "function_call",
                "id": mem.new_id("fc_"),
                "call_id": call_id,
                "name": name,
                "arguments": json_text(args),
                "status": "completed",
            }
        )
        if rs_id:
            mem.reasoning_for_call[call_id] = rs_id
    response = _response_envelope(body, mem, output, reply.counts())
    response["status"] = "incomplete" if reason else "completed"
    response["incomplete_details"] = {"reason": reason} if reason else None
    _remember_chain(response, body, mem)
    return response


def response_events(response: Json) -> list[Json]:
    """A rendered response as the Responses API streams it (``stream: true``): created
    and in progress, each output item added, its text or arguments in one delta, done;
    then completed (or incomplete), holding the whole response."""
    events: list[Json] = []

    def add(kind: str, **fields: Any) -> None:
        events.append({"type": kind, "sequence_number": len(events), **fields})

    begun = {**response, "status": "in_progress", "output": [], "usage": None}
    add("response.created", response=begun)
    add("response.in_progress", response=begun)
    for index, item in enumerate(response["output"]):
        at = {"item_id": item["id"], "output_index": index}
        add("response.output_item.added", output_index=index, item=_begun(item))
        if item["type"] == "function_call":
            add("response.function_call_arguments.delta", **at, delta=item["arguments"])
            add("response.function_call_arguments.done", **at, name=item["name"],
                arguments=item["arguments"])
        for part_index, part in enumerate(item.get("content") or ()):
            text = part["type"] == "output_text"
            part_at = {**at, "content_index": part_index}
            add("response.content_part.added", **part_at,
                part={**part, "text": ""} if text else part)
            if text:
                add("response.output_text.delta", **part_at, delta=part["text"], logprobs=[])
                add("response.output_text.done", **part_at, text=part["text"], logprobs=[])
            add("response.content_part.done", **part_at, part=part)
        add("response.output_item.done", output_index=index, item=item)
    add(f"response.{response['status']}", response=response)
    return events


def _begun(item: Json) -> Json:
    """An output item as it is added to a stream, before its content."""
    if item["type"] == "message":
        return {**item, "status": "in_progress", "content": []}
    if item["type"] == "function_call":
        return {**item, "status": "in_progress", "arguments": ""}
    return item


def _reasoning_item(reply: Reply, mem: Memory, output: list[Json]) -> str | None:
    if not reply.reasoning:
        return None
    rs_id, encrypted = mem.new_id("rs_"), mem.opaque()
    mem.reasoning[rs_id] = encrypted
    text = reply.reasoning if isinstance(reply.reasoning, str) else None
    summary = [{"type": "summary_text", "text": text}] if text else []
    output.append(
        {"type": "reasoning", "id": rs_id, "summary": summary, "encrypted_content": encrypted}
    )
    return rs_id


def _message_item(reply: Reply, incomplete: bool, mem: Memory) -> Json:
    if reply.stop == "refusal":
        content: Json = {"type": "refusal", "refusal": reply.text}
    else:
        content = {"type": "output_text", "text": reply.text, "annotations": [], "logprobs": []}
    return {
        "type": "message",
        "id": mem.new_id("msg_"),
        "role": "assistant",
        "status": "incomplete" if incomplete else "completed",
        "content": [content],
    }


def _response_envelope(body: Json, mem: Memory, output: list[Json], u: Usage) -> Json:
    return {
        "id": mem.new_id("resp_"),
        "object": "response",
        "created_at": int(time.time()),
        "status": "completed",
        "background": bool(body.get("background")),
        "error": None,
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "metadata": body.get("metadata") or {},
        "model": body.get("model", "stub"),
        "output": output,
        "parallel_tool_calls": True,
        "previous_response_id": body.get("previous_response_id"),
        "reasoning": {"effort": None, "summary": None},
        "service_tier": "default",
        "store": body.get("store", True),
        "temperature": 1.0,
        "text": {"format": {"type": "text"}},
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": {
            "input_tokens": u.input,
            "input_tokens_details": {"cached_tokens": u.cached},
            "output_tokens": u.output,
            "output_tokens_details": {"reasoning_tokens": u.reasoning},
            "total_tokens": u.input + u.output,
        },
        "user": None,
    }


def _remember_chain(response: Json, body: Json, mem: Memory) -> None:
    # Like the real API, an unstored response cannot be continued by id.
    if body.get("store") is not False:
        made = tuple(i["call_id"] for i in response["output"] if i["type"] == "function_call")
        mem.chains[response["id"]] = Chain(made)


# --- Anthropic Messages -------------------------------------------------------------------

ANTHROPIC_STOPS = {
    "length": "max_tokens",
    "refusal": "refusal",
    "content_filter": "refusal",
    "pause_turn": "pause_turn",
}


def render_message(reply: Reply, body: Json, mem: Memory) -> Json:
    blocks: list[Json] = []
    if reply.thinking:
        text = reply.thinking if isinstance(reply.thinking, str) else "Let me think this over."
        blocks.append({"type": "thinking", "thinking": text, "signature": mem.sign(text)})
    if reply.redacted_thinking:
        data = mem.opaque()
        mem.redacted.add(data)
        blocks.append({"type": "redacted_thinking", "data": data})
    if reply.text:
        blocks.append({"type": "text", "text": reply.text, "citations": None})
    for place, (name, args) in enumerate(reply.calls):
        use_id = reply.call_id(place, mem, "toolu_")
        blocks.append({"type": "tool_use", "id": use_id, "name": name, "input": json_object(args)})
    natural = "tool_use" if reply.calls else "end_turn"
    u = reply.counts()
    return {
        "id": mem.new_id("msg_"),
        "type": "message",
        "role": "assistant",
        "model": body.get("model", "stub"),
        "content": blocks,
        "stop_reason": ANTHROPIC_STOPS.get(reply.stop or "", natural),
        "stop_sequence": None,
        "usage": {
            "input_tokens": u.input,
            "output_tokens": u.output,
            "cache_creation_input_tokens": u.cache_write,
            "cache_read_input_tokens": u.cached,
        },
    }


# --- Error bodies -------------------------------------------------------------------------

ANTHROPIC_ERRORS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


def anthropic_error(status: int, message: str, kind: str | None = None) -> Json:
    default = "api_error" if status >= 500 else "invalid_request_error"
    kind = kind or ANTHROPIC_ERRORS.get(status, default)
    return {"type": "error", "error": {"type": kind, "message": message}}


def openai_error(
    status: int, message: str, kind: str | None = None, param: str | None = None
) -> Json:
    code = {401: "invalid_api_key", 429: "rate_limit_exceeded"}.get(status)
    default = "server_error" if status >= 500 else "invalid_request_error"
    kind = kind or ("requests" if status == 429 else default)
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
