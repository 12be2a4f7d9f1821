"""Anthropic adapter: the Messages API (``client.messages.create``)."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from ..errors import MissingExtraError
from ..models import ModelRequest, ModelResponse, Price
from ..state import Message, ToolCall, Usage
from ._common import Adapter, close_orphans, with_call_ids, without_retries

try:
    import anthropic
except ImportError as exc:  # the extra is not installed
    raise MissingExtraError("anthropic", "anthropic") from exc

#: Sent when a context would otherwise open with an assistant turn (the API wants a user's).
CONTINUED = "(continued)"


class AnthropicModel(Adapter):
    """Claude over the user's ``anthropic.Anthropic`` or ``AsyncAnthropic`` client."""

    provider = "anthropic"
    vendor = "anthropic"
    errors = (anthropic.APIError,)
    connection_errors = (anthropic.APIConnectionError,)

    def __init__(self, client: Any, model: str, *, max_tokens: int = 4096,
                 prices: Mapping[str, Price] | None = None, **params: Any) -> None:
        super().__init__(client, model, prices, params)
        self.max_tokens = max_tokens

    def _method(self) -> Callable[..., Any]:
        return without_retries(self.client).messages.create  # type: ignore[no-any-return]

    def _build(self, request: ModelRequest) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"max_tokens": self.max_tokens, **self.params,
                                  "model": self.model, "messages": self._messages(request)}
        if request.instructions:
            kwargs["system"] = request.instructions
        if request.tools:
            kwargs["tools"] = [
                {"name": t["name"], "description": t.get("description", ""),
                 "input_schema": t.get("parameters") or {"type": "object", "properties": {}}}
                for t in request.tools
            ]
        return kwargs

    def _messages(self, request: ModelRequest) -> list[dict[str, Any]]:
        # Roles alternate: consecutive same-role messages merge into one. Tool results
        # come right after their call (close_orphans), so they open the user message.
        turns: list[dict[str, Any]] = []
        for m in close_orphans(request.messages):
            role = "assistant" if m.role == "assistant" else "user"
            blocks = self._blocks(m)
            if not blocks:
                continue
            if turns and turns[-1]["role"] == role:
                turns[-1]["content"].extend(blocks)
            else:
                turns.append({"role": role, "content": blocks})
        if turns and turns[0]["role"] != "user":
            turns.insert(0, {"role": "user", "content": [{"type": "text", "text": CONTINUED}]})
        return turns

    def _blocks(self, m: Message) -> list[dict[str, Any]]:
        if m.role == "tool":
            return [{"type": "tool_result", "tool_use_id": tool_use_id(m.tool_call_id),
                     "content": m.content, "is_error": m.is_error}]
        if m.role == "assistant" and m.provider == self.provider and m.items:
            # Thinking signatures unchanged; tool_use ids as the loop recorded them.
            ids = [tool_use_id(c.id) for c in m.tool_calls]
            return with_call_ids(m.items, ids, "tool_use", "id")
        blocks: list[dict[str, Any]] = []
        if m.content:  # the API rejects empty text blocks
            blocks.append({"type": "text", "text": m.content})
        blocks.extend({"type": "tool_use", "id": tool_use_id(c.id), "name": c.name,
                       "input": c.args} for c in m.tool_calls)
        return blocks

    def _convert(self, raw: Any) -> ModelResponse:
        texts: list[str] = []
        calls: list[ToolCall] = []
        for block in raw.content:
            if block.type == "text":
                texts.append(block.text)
            elif block.type == "tool_use":
                calls.append(_call(block.id, block.name, block.input))
        return ModelResponse(
            text="".join(texts), tool_calls=calls, usage=self._usage(raw),
            finish_reason=raw.stop_reason, provider=self.provider, model=raw.model,
            response_id=raw.id, request_id=getattr(raw, "_request_id", None),
            items=[block.model_dump(mode="json", exclude_none=True) for block in raw.content],
        )

    def _usage(self, raw: Any) -> Usage:
        # Anthropic's input_tokens excludes the cache; ours includes reads and writes.
        u = raw.usage
        read = u.cache_read_input_tokens or 0
        written = u.cache_creation_input_tokens or 0
        details = getattr(u, "output_tokens_details", None)
        return self.usage(raw.model, input_tokens=u.input_tokens + read + written,
                          output_tokens=u.output_tokens, cached=read, written=written,
                          reasoning=(details and details.thinking_tokens) or 0)


_USE_ID = re.compile(r"[a-zA-Z0-9_-]+")


def tool_use_id(call_id: str | None) -> str:
    """The id to send for a call: its own when the API takes it (``^[a-zA-Z0-9_-]+$``),
    else one derived from it, the same for the call and its result (a run recorded on
    another provider may hold ``functions.add:0``)."""
    if call_id and _USE_ID.fullmatch(call_id):
        return call_id
    return "toolu_" + hashlib.sha256((call_id or "").encode()).hexdigest()[:24]


def _call(call_id: str, name: str, args: Any) -> ToolCall:
    if isinstance(args, dict):
        return ToolCall(id=call_id, name=name, args=args)
    return ToolCall(id=call_id, name=name, args={}, raw_arguments=json.dumps(args))
