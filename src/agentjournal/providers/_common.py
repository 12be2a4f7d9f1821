"""What the provider adapters share: client handling, error mapping, argument
parsing, and the context repair every provider needs (no orphan tool calls)."""

from __future__ import annotations

import asyncio
import email.utils
import time
from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from ..models import ModelError, ModelRequest, ModelResponse, Price, cost_of
from ..state import Message, ToolCall, Usage

NO_RESULT = "error: no result was recorded for this call"


# --- clients -----------------------------------------------------------------------


def is_async_client(client: Any) -> bool:
    # The SDKs' async clients are async context managers and their sync ones are not;
    # their create methods are wrapped, so inspect.iscoroutinefunction cannot tell.
    return hasattr(client, "__aenter__")


def without_retries(client: Any) -> Any:
    """The client with the SDK's own retries off: the agentjournal loop is the one
    retry layer, and records each failed attempt."""
    with_options = getattr(client, "with_options", None)
    return client if with_options is None else with_options(max_retries=0)


class Adapter:
    """``complete``/``acomplete`` over one SDK call, for sync and async clients."""

    provider = ""  # "openai.chat", ...
    vendor = ""  # the name in error messages: "openai", "anthropic"
    errors: tuple[type[BaseException], ...] = ()  # the SDK's error base classes
    connection_errors: tuple[type[BaseException], ...] = ()

    def __init__(self, client: Any, model: str, prices: Mapping[str, Price] | None,
                 params: dict[str, Any]) -> None:
        self.client = client
        self.model = model
        self.prices = prices
        self.params = params
        self.is_async = is_async_client(client)

    def complete(self, request: ModelRequest) -> ModelResponse:
        self._require_sync()
        return self._convert(self._call(self._method(), self._build(request)))

    async def acomplete(self, request: ModelRequest) -> ModelResponse:
        if not self.is_async:
            return await asyncio.to_thread(self.complete, request)
        return self._convert(await self._acall(self._method(), self._build(request)))

    # --- what each adapter defines --------------------------------------------------

    def _method(self) -> Callable[..., Any]:
        raise NotImplementedError

    def _build(self, request: ModelRequest) -> dict[str, Any]:
        raise NotImplementedError

    def _convert(self, raw: Any) -> ModelResponse:
        raise NotImplementedError

    # --- calling --------------------------------------------------------------------

    def _require_sync(self) -> None:
        if self.is_async:
            raise TypeError(f"{type(self).__name__} was given an async client: "
                            "run the agent with agent.arun (or pass a sync client)")

    def _call(self, method: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
        try:
            return method(**kwargs)
        except self.errors as exc:
            raise self.error(exc) from exc

    async def _acall(self, method: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
        try:
            return await method(**kwargs)
        except self.errors as exc:
            raise self.error(exc) from exc

    def error(self, exc: BaseException) -> ModelError:
        return model_error(self.vendor, exc, self.connection_errors)

    def usage(self, model: str | None, *, input_tokens: int, output_tokens: int,
              cached: int = 0, written: int = 0, reasoning: int = 0) -> Usage:
        usage = Usage(input_tokens=input_tokens, output_tokens=output_tokens,
                      cached_input_tokens=cached, cache_write_tokens=written,
                      reasoning_tokens=reasoning)
        usage.cost_usd = cost_of(usage, model or self.model, self.prices)
        return usage


# --- errors ------------------------------------------------------------------------

_RETRYABLE_STATUS = frozenset({408, 409, 429})


def model_error(vendor: str, exc: BaseException,
                connection_errors: tuple[type[BaseException], ...]) -> ModelError:
    """``exc`` from an SDK as a ModelError the loop can act on."""
    if isinstance(exc, connection_errors):
        return ModelError(f"{vendor} connection error: {exc}", retryable=True)
    status = getattr(exc, "status_code", None)
    response = getattr(exc, "response", None)
    headers: Mapping[str, str] = getattr(response, "headers", None) or {}
    if not isinstance(status, int):
        return ModelError(f"{vendor} error: {exc}")
    request_id = getattr(exc, "request_id", None)
    kind, text = _error_body(exc)
    message = f"{vendor} {status}{' ' + kind if kind else ''}: {text}"
    if request_id:
        message += f" (request {request_id})"
    return ModelError(message, retryable=_retryable(status, headers),
                      retry_after=retry_after(headers), status=status, request_id=request_id)


def _retryable(status: int, headers: Mapping[str, str]) -> bool:
    forced = str(headers.get("x-should-retry", "")).lower()
    if forced in ("true", "false"):  # the server's word beats the status
        return forced == "true"
    return status in _RETRYABLE_STATUS or status >= 500


def _error_body(exc: BaseException) -> tuple[str, str]:
    """The provider's error type and message; openai passes ``{"message", "type",
    "code"}``, anthropic ``{"type": "error", "error": {"type", "message"}}``."""
    body = getattr(exc, "body", None)
    error = body.get("error", body) if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return "", str(getattr(exc, "message", exc))
    kind = error.get("type") or error.get("code") or ""
    text = error.get("message") or getattr(exc, "message", str(exc))
    return str(kind), str(text)


def retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds to wait, from ``retry-after-ms`` or ``retry-after`` (seconds or a date)."""
    millis = headers.get("retry-after-ms")
    if millis is not None:
        try:
            return max(float(millis) / 1000, 0.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - time.time(), 0.0)


# --- tool calls ----------------------------------------------------------------------


def parse_call(call_id: str, name: str, arguments: str | None) -> ToolCall:
    """A tool call from the model's argument string: not a JSON object -> ``args={}``
    and the string kept in ``raw_arguments``, for the loop to deny with the reason.
    Nested too deep to decode: recorded by its size only (``too_large``) and denied for
    its depth, as the loop denies arguments nested past results.MAX_DEPTH (limits.py)."""
    raw = arguments or ""
    try:  # strict JSON: no NaN or Infinity, which the log could not record
        args = msgspec.json.decode(raw) if raw.strip() else {}
    except msgspec.DecodeError:
        args = None
    except RecursionError:
        return ToolCall(id=call_id, name=name, args={}, too_large=len(raw.encode()))
    if isinstance(args, dict):
        return ToolCall(id=call_id, name=name, args=args)
    return ToolCall(id=call_id, name=name, args={}, raw_arguments=raw)


def arguments_of(call: ToolCall) -> str:
    """The argument string to send back: what the model sent, when it was not an object."""
    if call.raw_arguments is not None:
        return call.raw_arguments
    return msgspec.json.encode(call.args).decode()


def with_call_ids(items: tuple[dict[str, Any], ...], ids: list[str], kind: str,
                  field: str) -> list[dict[str, Any]]:
    """A turn's provider items as they came, except that each call item (type ``kind``)
    carries the id the loop recorded for its call in ``field``: the loop gives a call
    whose id the provider repeated or left empty one of its own (steps.distinct_ids).
    The n-th call item is the n-th call, as the adapter read them."""
    given = iter(ids)
    return [{**item, field: next(given, item.get(field))} if item.get("type") == kind
            else dict(item) for item in items]


# --- context repair ------------------------------------------------------------------


def close_orphans(messages: list[Message]) -> list[Message]:
    """The context with every tool call answered right after the assistant turn that
    made it, as all providers require (HTTP 400 otherwise).

    Results are moved up to their call (in call order); a call with no result gets a
    synthetic error result; a result whose call is not in the context (compacted away)
    becomes a user message saying which call it answered."""
    out: list[Message] = []
    i = 0
    while i < len(messages):
        m = messages[i]
        i += 1
        if m.role == "tool":
            out.append(_as_user_text(m))
            continue
        out.append(m)
        if m.role != "assistant" or not m.tool_calls:
            continue
        end = next((j for j in range(i, len(messages)) if messages[j].role == "assistant"),
                   len(messages))
        results, rest = _answers(m, messages[i:end])
        out.extend(results)
        out.extend(rest)
        i = end
    return out


def _answers(turn: Message, window: list[Message]) -> tuple[list[Message], list[Message]]:
    found: dict[str, Message] = {}
    rest: list[Message] = []
    ids = {c.id for c in turn.tool_calls}
    for m in window:
        if m.role == "tool" and m.tool_call_id in ids and m.tool_call_id not in found:
            found[m.tool_call_id] = m
        else:
            rest.append(_as_user_text(m) if m.role == "tool" else m)
    results = [found.get(c.id) or Message(role="tool", content=NO_RESULT, trust="tool",
                                          seq=turn.seq, tool_call_id=c.id, name=c.name,
                                          is_error=True)
               for c in turn.tool_calls]
    return results, rest


def _as_user_text(m: Message) -> Message:
    return Message(role="user", content=f"[result of {m.name} call {m.tool_call_id}]: {m.content}",
                   trust=m.trust, seq=m.seq)
