"""OpenAI adapters: Chat Completions and Responses (with background mode)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from ..errors import MissingExtraError
from ..models import ModelError, ModelRequest, ModelResponse, Price
from ..state import Message
from ._common import (
    Adapter,
    arguments_of,
    close_orphans,
    parse_call,
    with_call_ids,
    without_retries,
)

try:
    import openai
except ImportError as exc:  # the extra is not installed
    raise MissingExtraError("openai", "openai") from exc


class _OpenAI(Adapter):
    vendor = "openai"
    errors = (openai.APIError,)
    connection_errors = (openai.APIConnectionError,)


def untransformed(create: Callable[..., Any], context: str) -> Callable[..., Any]:
    """``create`` with the context (``messages`` / ``input``) sent as it is.

    The SDK walks every parameter through its type-driven transform on every call:
    measured, 88% of a step's CPU at 100 turns, growing with the context. Ours is
    plain JSON already, so it goes in ``extra_body``, which the SDK sends untouched
    and which takes precedence over the (empty) typed argument."""
    def call(**body: Any) -> Any:
        given = body.pop(context)
        extra = {**(body.pop("extra_body", None) or {}), context: given}
        return create(**body, **{context: []}, extra_body=extra)
    return call


def _function_tool(tool: dict[str, Any]) -> dict[str, Any]:
    return {"name": tool["name"], "description": tool.get("description", ""),
            "parameters": tool.get("parameters") or {"type": "object", "properties": {}}}


class OpenAIChatModel(_OpenAI):
    """Chat Completions (``client.chat.completions.create``) over the user's client."""

    provider = "openai.chat"

    def __init__(self, client: Any, model: str, *, prices: Mapping[str, Price] | None = None,
                 instructions_role: str = "system", **params: Any) -> None:
        super().__init__(client, model, prices, params)
        self.instructions_role = instructions_role

    def _method(self) -> Callable[..., Any]:
        return untransformed(without_retries(self.client).chat.completions.create, "messages")

    def _build(self, request: ModelRequest) -> dict[str, Any]:
        messages: list[dict[str, Any]] = []
        if request.instructions:
            messages.append({"role": self.instructions_role, "content": request.instructions})
        messages.extend(self._message(m) for m in close_orphans(request.messages))
        kwargs: dict[str, Any] = {**self.params, "model": self.model, "messages": messages}
        if request.tools:
            kwargs["tools"] = [{"type": "function", "function": _function_tool(t)}
                               for t in request.tools]
        return kwargs

    @staticmethod
    def _message(m: Message) -> dict[str, Any]:
        if m.role == "tool":
            return {"role": "tool", "tool_call_id": m.tool_call_id, "content": m.content}
        if m.role == "user" or not m.tool_calls:
            return {"role": m.role, "content": m.content}
        calls = [{"id": c.id, "type": "function",
                  "function": {"name": c.name, "arguments": arguments_of(c)}}
                 for c in m.tool_calls]
        return {"role": "assistant", "content": m.content or None, "tool_calls": calls}

    def _convert(self, raw: Any) -> ModelResponse:
        if not raw.choices:
            raise ModelError(f"openai.chat response {raw.id} has no choices")
        choice = raw.choices[0]
        message = choice.message
        calls = [parse_call(c.id, c.function.name, c.function.arguments)
                 for c in message.tool_calls or () if c.type == "function"]
        return ModelResponse(
            text=message.content or message.refusal or "", tool_calls=calls,
            usage=self._usage(raw), provider=self.provider, model=raw.model,
            finish_reason="refusal" if message.refusal else choice.finish_reason,
            response_id=raw.id, request_id=getattr(raw, "_request_id", None),
        )

    def _usage(self, raw: Any) -> Any:
        u = raw.usage
        if u is None:
            return self.usage(raw.model, input_tokens=0, output_tokens=0)
        prompt, completion = u.prompt_tokens_details, u.completion_tokens_details
        return self.usage(
            raw.model, input_tokens=u.prompt_tokens, output_tokens=u.completion_tokens,
            cached=(prompt and prompt.cached_tokens) or 0,
            written=(prompt and prompt.cache_write_tokens) or 0,
            reasoning=(completion and completion.reasoning_tokens) or 0,
        )


_PENDING = frozenset({"queued", "in_progress"})
_LOST = frozenset({"failed", "cancelled", "expired"})


class OpenAIResponsesModel(_OpenAI):
    """The Responses API (``client.responses.create``) over the user's client.

    ``store=False`` (default): nothing is kept at OpenAI; reasoning items come back
    with ``encrypted_content`` and are echoed next turn. ``background=True``: the call
    runs at OpenAI and is collected by id (``BackgroundModel``), so a crash while it
    runs resumes the same call instead of paying for a second one."""

    provider = "openai.responses"

    def __init__(self, client: Any, model: str, *, background: bool = False,
                 store: bool = False, poll_interval: float = 0.5,
                 prices: Mapping[str, Price] | None = None, **params: Any) -> None:
        super().__init__(client, model, prices, params)
        self.background = background
        self.store = store
        self.poll_interval = poll_interval
        # Responses the create call returned finished, by id, until collected: some
        # OpenAI-compatible servers answer in the create call and cannot retrieve it.
        self._answered: dict[str, Any] = {}

    def _method(self) -> Callable[..., Any]:
        return untransformed(without_retries(self.client).responses.create, "input")

    def _build(self, request: ModelRequest, *, background: bool = False) -> dict[str, Any]:
        kwargs: dict[str, Any] = {**self.params, "model": self.model,
                                  "input": self._input(request.messages)}
        if request.instructions:
            kwargs["instructions"] = request.instructions
        if request.tools:
            kwargs["tools"] = [{"type": "function", **_function_tool(t), "strict": False}
                               for t in request.tools]
        kwargs["store"] = background or self.store
        if background:
            kwargs["background"] = True
        else:  # without a stored response, reasoning survives only encrypted, in the items
            include = list(kwargs.get("include") or [])
            if not self.store and "reasoning.encrypted_content" not in include:
                kwargs["include"] = [*include, "reasoning.encrypted_content"]
        return kwargs

    def _input(self, messages: list[Message]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for m in close_orphans(messages):
            if m.role == "user":
                out.append({"role": "user", "content": m.content})
            elif m.role == "tool":
                out.append({"type": "function_call_output", "call_id": m.tool_call_id,
                            "output": m.content})
            elif m.provider == self.provider and m.items:  # reasoning in its place
                out.extend(with_call_ids(m.items, [c.id for c in m.tool_calls],
                                         "function_call", "call_id"))
            else:
                if m.content:
                    out.append({"role": "assistant", "content": m.content})
                out.extend({"type": "function_call", "call_id": c.id, "name": c.name,
                            "arguments": arguments_of(c)} for c in m.tool_calls)
        return out

    def _convert(self, raw: Any) -> ModelResponse:
        texts: list[str] = []
        refusal = None
        calls = []
        for item in raw.output:
            if item.type == "function_call":
                calls.append(parse_call(item.call_id, item.name, item.arguments))
            elif item.type == "message":
                for part in item.content:
                    if part.type == "output_text":
                        texts.append(part.text)
                    elif part.type == "refusal":
                        refusal = part.refusal
        return ModelResponse(
            text="".join(texts) or refusal or "", tool_calls=calls,
            usage=self._usage(raw), finish_reason=self._finish(raw, refusal, bool(calls)),
            provider=self.provider, model=raw.model, response_id=raw.id,
            request_id=getattr(raw, "_request_id", None),
            items=[item.model_dump(mode="json", exclude_none=True) for item in raw.output],
        )

    @staticmethod
    def _finish(raw: Any, refusal: str | None, has_calls: bool) -> str:
        if raw.status == "incomplete":
            details = raw.incomplete_details
            return (details and details.reason) or "incomplete"
        if raw.status in ("failed", "cancelled"):
            return str(raw.status)
        if refusal is not None:
            return "refusal"
        return "tool_calls" if has_calls else "stop"

    def _usage(self, raw: Any) -> Any:
        u = raw.usage
        if u is None:
            return self.usage(raw.model, input_tokens=0, output_tokens=0)
        given, made = u.input_tokens_details, u.output_tokens_details
        return self.usage(
            raw.model, input_tokens=u.input_tokens, output_tokens=u.output_tokens,
            cached=(given and given.cached_tokens) or 0,
            written=(given and given.cache_write_tokens) or 0,
            reasoning=(made and made.reasoning_tokens) or 0,
        )

    # --- background mode ---------------------------------------------------------------

    def complete(self, request: ModelRequest) -> ModelResponse:
        if self.background:
            return self.collect(self.begin(request), request)
        return super().complete(request)

    async def acomplete(self, request: ModelRequest) -> ModelResponse:
        if self.background and self.is_async:
            return await self.acollect(await self.abegin(request), request)
        return await super().acomplete(request)

    def begin(self, request: ModelRequest) -> str:
        """Start the call at OpenAI and return its id at once."""
        self._require_background()
        self._require_sync()
        return self._begun(self._call(self._method(), self._build(request, background=True)))

    def collect(self, handle: str, request: ModelRequest) -> ModelResponse:
        """Wait for the call ``handle`` (polling) and return its answer."""
        self._require_background()
        self._require_sync()
        if (raw := self._answered.pop(handle, None)) is not None:
            return self._finished(raw)
        retrieve = without_retries(self.client).responses.retrieve
        while (raw := self._retrieve(retrieve, handle)).status in _PENDING:
            time.sleep(self.poll_interval)
        return self._finished(raw)

    async def abegin(self, request: ModelRequest) -> str:
        self._require_background()
        if not self.is_async:
            return await asyncio.to_thread(self.begin, request)
        return self._begun(await self._acall(self._method(), self._build(request, background=True)))

    async def acollect(self, handle: str, request: ModelRequest) -> ModelResponse:
        self._require_background()
        if not self.is_async:
            return await asyncio.to_thread(self.collect, handle, request)
        if (raw := self._answered.pop(handle, None)) is not None:
            return self._finished(raw)
        retrieve = without_retries(self.client).responses.retrieve
        while (raw := await self._aretrieve(retrieve, handle)).status in _PENDING:
            await asyncio.sleep(self.poll_interval)
        return self._finished(raw)

    def _begun(self, raw: Any) -> str:
        """The call's id. An answer the create call already holds is kept for ``collect``:
        asking the server for it again could only fail where it has no retrieve."""
        if raw.status not in _PENDING:
            self._answered[str(raw.id)] = raw
        return str(raw.id)

    def _require_background(self) -> None:
        if not self.background:
            raise TypeError("begin/collect need OpenAIResponsesModel(background=True)")

    def _retrieve(self, retrieve: Callable[[str], Any], handle: str) -> Any:
        try:
            return retrieve(handle)
        except self.errors as exc:
            raise self._lost_if_gone(exc) from exc

    async def _aretrieve(self, retrieve: Callable[[str], Awaitable[Any]], handle: str) -> Any:
        try:
            return await retrieve(handle)
        except self.errors as exc:
            raise self._lost_if_gone(exc) from exc

    def _lost_if_gone(self, exc: BaseException) -> ModelError:
        error = self.error(exc)
        if error.status == 404:  # the provider no longer has it: only asking again helps
            error.lost = True
            error.retryable = True
        return error

    def _finished(self, raw: Any) -> ModelResponse:
        if raw.status in _LOST:
            detail = f": {raw.error.message}" if getattr(raw, "error", None) else ""
            raise ModelError(f"openai background response {raw.id} {raw.status}{detail}",
                             retryable=True, lost=True,
                             request_id=getattr(raw, "_request_id", None))
        return self._convert(raw)
