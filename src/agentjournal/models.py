"""Model clients: messages with trust labels and tool schemas in; text, tool calls and usage out.

A provider adapter implements ``Model.complete`` (and ``acomplete`` for the
async loop). It raises ``ModelError`` (``retryable=True`` for rate limits,
overload, 5xx and lost connections, with ``retry_after`` when the provider said
how long to wait) so the loop, the one retry layer, can retry and record each
failed attempt; a model call has no side effect, so retrying it is safe, though
it is billed again. A model that can leave a call running at the provider
(``BackgroundModel``) lets the loop record the call's id before waiting, so a
crash resumes the same call instead of paying for a second one.

Adapters for real providers live in ``agentjournal.providers`` (extras).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import msgspec

from .state import Message, ToolCall, Usage

#: Provider stop reasons that must never become a run's final answer: the turn was
#: cut short (length), refused or filtered. The run pauses, saying which.
STOPS_THAT_PAUSE: frozenset[str] = frozenset({
    "length", "max_tokens", "max_output_tokens", "content_filter", "refusal",
    "model_context_window_exceeded", "incomplete", "failed", "cancelled",
})

#: Stop reasons that mean "ask again with this turn in the context": the provider
#: paused a long turn (Anthropic ``pause_turn``) and continues it when asked.
STOPS_THAT_CONTINUE: frozenset[str] = frozenset({"pause_turn"})


class ModelRequest(msgspec.Struct, frozen=True, kw_only=True):
    run_id: str
    turn: int  # how many model turns the run has recorded before this one
    messages: list[Message]
    tools: list[dict[str, Any]]
    memory: dict[str, Any] = msgspec.field(default_factory=dict)  # what tools remembered
    instructions: str | None = None  # the system prompt, as the run recorded it

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
    #: A call whose arguments were not a JSON object has ``args={}`` and keeps what the
    #: model sent in ``raw_arguments``: the loop denies it with the parse error.
    tool_calls: list[ToolCall] = msgspec.field(default_factory=list)
    usage: Usage = msgspec.field(default_factory=Usage)  # tokens and cost of this turn
    finish_reason: str | None = None  # the provider's own word ("stop", "max_tokens", ...)
    provider: str | None = None  # "openai.chat", "openai.responses", "anthropic", ...
    model: str | None = None  # the model that answered (not only the one asked)
    response_id: str | None = None
    request_id: str | None = None
    #: Provider-native output the adapter needs echoed back on the next turn, in its
    #: own form (reasoning items with encrypted_content; thinking blocks with their
    #: signature). Recorded in the turn and returned untouched; opaque to the loop.
    items: list[dict[str, Any]] = msgspec.field(default_factory=list)


def stop_kind(response: ModelResponse) -> str:
    """What the loop does with a turn: "pause" (cut short, refused, filtered),
    "continue" (the provider paused it) or "done" (an answer or tool calls)."""
    reason = response.finish_reason
    if reason in STOPS_THAT_CONTINUE:
        return "continue"
    if reason in STOPS_THAT_PAUSE:
        return "pause"
    return "done"


class ModelError(Exception):
    """A model call failed. ``retryable``: the loop may ask again (after ``retry_after``
    seconds, when the provider said). ``status``: the HTTP status, if any."""

    def __init__(self, message: str, *, retryable: bool = False,
                 retry_after: float | None = None, status: int | None = None,
                 request_id: str | None = None, lost: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.retry_after = retry_after
        self.status = status
        self.request_id = request_id
        #: A background call the provider no longer has (expired, failed, cancelled):
        #: asking again is the only way on.
        self.lost = lost


class Model(Protocol):
    def complete(self, request: ModelRequest) -> ModelResponse: ...


@runtime_checkable
class AsyncModel(Protocol):
    """A model the async loop awaits. A model with only ``complete`` runs in a thread there."""

    async def acomplete(self, request: ModelRequest) -> ModelResponse: ...


@runtime_checkable
class BackgroundModel(Protocol):
    """A model whose call can outlive the process that made it (OpenAI Responses with
    ``background=True``). ``begin`` starts the call and returns its id at once; the
    loop records the id durably, then ``collect`` returns the answer. After a crash
    the loop calls ``collect`` with the recorded id: the call is not made, nor paid,
    twice. ``collect`` raises ``ModelError(lost=True)`` when the provider no longer has it."""

    background: bool  # False: the adapter can, but was asked not to

    def begin(self, request: ModelRequest) -> str: ...

    def collect(self, handle: str, request: ModelRequest) -> ModelResponse: ...

    async def abegin(self, request: ModelRequest) -> str: ...

    async def acollect(self, handle: str, request: ModelRequest) -> ModelResponse: ...


def in_background(model: object) -> bool:
    """Whether ``model`` makes its calls in background mode (``begin`` / ``collect``);
    the async forms are optional: without them the async loop runs these in a thread."""
    return getattr(model, "background", False) is True and callable(getattr(model, "begin", None))


class Price(msgspec.Struct, frozen=True):
    """US dollars per million tokens. ``cached_input``: cache reads; ``cache_write``:
    tokens written to the cache (None: billed as input)."""

    input: float
    output: float
    cached_input: float | None = None
    cache_write: float | None = None


#: List prices (USD per million tokens) used when the ``genai-prices`` package (the
#: ``prices`` extra, a price list kept up to date by its maintainers) is not installed.
#: They change: pass ``prices=`` to an adapter to override or extend either source.
PRICES: dict[str, Price] = {
    "gpt-4o": Price(2.50, 10.00, cached_input=1.25),
    "gpt-4o-mini": Price(0.15, 0.60, cached_input=0.075),
    "gpt-4.1": Price(2.00, 8.00, cached_input=0.50),
    "gpt-4.1-mini": Price(0.40, 1.60, cached_input=0.10),
    "gpt-5": Price(1.25, 10.00, cached_input=0.125),
    "gpt-5-mini": Price(0.25, 2.00, cached_input=0.025),
    "o4-mini": Price(1.10, 4.40, cached_input=0.275),
    "claude-sonnet-4-5": Price(3.00, 15.00, cached_input=0.30, cache_write=3.75),
    "claude-opus-4-1": Price(15.00, 75.00, cached_input=1.50, cache_write=18.75),
    "claude-haiku-4-5": Price(1.00, 5.00, cached_input=0.10, cache_write=1.25),
}


def price_of(model: str | None, prices: Mapping[str, Price] | None = None) -> Price | None:
    """The price of ``model`` in :data:`PRICES` with ``prices`` on top."""
    return _match(model, PRICES if prices is None else {**PRICES, **prices})


def _match(model: str | None, table: Mapping[str, Price]) -> Price | None:
    """An exact entry, else the longest entry ``model`` starts with (dated snapshots
    such as ``gpt-4o-2024-08-06`` price as their family)."""
    if not model:
        return None
    if model in table:
        return table[model]
    family = max((name for name in table if model.startswith(name)), key=len, default=None)
    return None if family is None else table[family]


def cost_of(usage: Usage, model: str | None,
            prices: Mapping[str, Price] | None = None) -> float | None:
    """What ``usage`` cost, in USD; None when the price of ``model`` is unknown (never
    0, which would read as free). Looked up in ``prices`` (the caller's overrides), then
    in genai-prices' list when it is installed (the ``prices`` extra), then in
    :data:`PRICES`. Usage follows one convention: ``input_tokens`` includes cache reads
    and writes."""
    own = _match(model, prices or {})
    if own is not None:
        return _dollars(usage, own)
    listed = _listed_cost(usage, model)
    if listed is not None:
        return listed
    price = _match(model, PRICES)
    return None if price is None else _dollars(usage, price)


def _dollars(usage: Usage, price: Price) -> float:
    cached = usage.cached_input_tokens
    written = usage.cache_write_tokens
    plain = max(usage.input_tokens - cached - written, 0)
    dollars = (plain * price.input
               + cached * (price.input if price.cached_input is None else price.cached_input)
               + written * (price.input if price.cache_write is None else price.cache_write)
               + usage.output_tokens * price.output)
    return dollars / 1_000_000


def _listed_cost(usage: Usage, model: str | None) -> float | None:
    """The cost by genai-prices' list, or None: not installed, or the model not in it."""
    if not model:
        return None
    try:
        import genai_prices
    except ImportError:
        return None
    listed = genai_prices.Usage(
        input_tokens=usage.input_tokens, output_tokens=usage.output_tokens,
        cache_read_tokens=usage.cached_input_tokens,
        cache_write_tokens=usage.cache_write_tokens)
    try:
        return float(genai_prices.calc_price(listed, model).total_price)
    except LookupError:  # a model it does not list (a local one, a new one)
        return None
    except ValueError:  # counts it refuses (more cache reads than input): not for a turn
        return None  # to fail over; the built-in table prices them if it can


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
