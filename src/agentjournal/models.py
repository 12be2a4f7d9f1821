"""Model clients: messages with trust labels and tool schemas in; text, tool calls and usage out.

A provider adapter implements ``Model.complete``. It raises ``ModelError``
(``retryable=True`` for rate limits and transient outages) so the loop can
retry; a model call has no side effect, so retrying it is always safe.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import msgspec

from .state import Message, ToolCall, Usage


class ModelRequest(msgspec.Struct, frozen=True, kw_only=True):
    run_id: str
    turn: int  # how many model turns the run has recorded before this one
    messages: list[Message]
    tools: list[dict[str, Any]]
    memory: dict[str, Any] = msgspec.field(default_factory=dict)  # what tools remembered

    def results(self, tool: str) -> list[Any]:
        """The decoded results of every call to ``tool`` still in the context, oldest first."""
        out = []
        for m in self.messages:
            if m.role == "tool" and m.name == tool and not m.is_error:
                try:
                    out.append(msgspec.json.decode(m.content))
                except msgspec.DecodeError:
                    out.append(m.content)
        return out


class ModelResponse(msgspec.Struct, frozen=True, kw_only=True):
    text: str = ""
    tool_calls: list[ToolCall] = msgspec.field(default_factory=list)
    usage: Usage = msgspec.field(default_factory=Usage)  # tokens and cost of this turn


class ModelError(Exception):
    def __init__(self, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


class Model(Protocol):
    def complete(self, request: ModelRequest) -> ModelResponse: ...


Turn = ModelResponse | Callable[[ModelRequest], ModelResponse]


def reply(text: str) -> ModelResponse:
    """A scripted final answer."""
    return ModelResponse(text=text)


def calls(*requested: tuple[str, dict[str, Any]], text: str = "") -> ModelResponse:
    """A scripted turn asking for tools: ``calls(("read", {"path": "a"}), ...)``."""
    return ModelResponse(
        text=text, tool_calls=[ToolCall(id="", name=n, args=dict(a)) for n, a in requested]
    )


class ScriptedModel:
    """Deterministic turns for tests and the demo.

    Turn ``n`` of a run is ``turns[n]`` (a response, or a function of the
    request for turns that depend on tool results), however many times the
    process restarts: the turn number comes from the run's state, not from
    this object. Past the script's end it answers ``"done"``.
    """

    def __init__(self, turns: Sequence[Turn], *, delay: float = 0.0) -> None:
        self.turns = list(turns)
        self.delay = delay

    def complete(self, request: ModelRequest) -> ModelResponse:
        if self.delay:
            time.sleep(self.delay)
        n = request.turn
        turn = self.turns[n] if n < len(self.turns) else reply("done")
        response = turn(request) if callable(turn) else turn
        ids = [c.id or f"call_{n}_{i}" for i, c in enumerate(response.tool_calls)]
        # A stand-in for usage, from the newest messages only: summing the whole
        # context would make every turn cost more than the last.
        prompt_chars = sum(len(m.content) for m in request.messages[-4:])
        return msgspec.structs.replace(
            response,
            tool_calls=[
                msgspec.structs.replace(c, id=i)
                for c, i in zip(response.tool_calls, ids, strict=True)
            ],
            usage=Usage(input_tokens=prompt_chars // 4,
                        output_tokens=len(response.text) // 4 + 8 * len(ids),
                        cost_usd=response.usage.cost_usd),
        )
