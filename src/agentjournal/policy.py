"""What the loop consults before acting: policy, guardrails, compaction and budgets.

Each is a small protocol with a ready-made implementation; every decision
they make is recorded as an event by the loop, never applied silently.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Sequence
from typing import Literal, Protocol

import msgspec

from .state import Message, RunState, ToolCall
from .tools import Tool

# --- policy --------------------------------------------------------------------


class Allow(msgspec.Struct, frozen=True):
    pass


class Deny(msgspec.Struct, frozen=True):
    reason: str


class RequireApproval(msgspec.Struct, frozen=True):
    reason: str


Decision = Allow | Deny | RequireApproval


class Policy(Protocol):
    def decide(self, call: ToolCall, tool: Tool, state: RunState) -> Decision: ...


class AllowAll:
    def decide(self, call: ToolCall, tool: Tool, state: RunState) -> Decision:
        return Allow()


class Rules:
    """Deny some tools outright; require a person's approval for others.

    ``approve_if`` tools need approval only when the predicate holds (e.g. an
    amount over a limit).
    """

    def __init__(
        self,
        *,
        deny: Collection[str] = (),
        require_approval: Collection[str] = (),
        approve_if: dict[str, Callable[[ToolCall], bool]] | None = None,
    ) -> None:
        self.deny = set(deny)
        self.require_approval = set(require_approval)
        self.approve_if = approve_if or {}

    def decide(self, call: ToolCall, tool: Tool, state: RunState) -> Decision:
        if call.name in self.deny:
            return Deny(f"policy forbids {call.name!r}")
        if call.name in self.require_approval:
            return RequireApproval(f"policy requires approval for {call.name!r}")
        check = self.approve_if.get(call.name)
        if check is not None and check(call):
            return RequireApproval(f"policy requires approval for this {call.name!r} call")
        return Allow()


# --- guardrails ------------------------------------------------------------------


class GuardrailVerdict(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    action: Literal["flag", "redact"]
    severity: Literal["info", "warn", "high", "critical"] = "warn"
    replacement: str | None = None  # the message's new content, for "redact"
    detail: str = ""


class Guardrail(Protocol):
    def inspect(self, message: Message) -> GuardrailVerdict | None: ...


class RegexGuardrail:
    """Flags, or redacts, every match of ``pattern`` in user and tool messages."""

    def __init__(
        self,
        name: str,
        pattern: str,
        *,
        action: Literal["flag", "redact"] = "redact",
        severity: Literal["info", "warn", "high", "critical"] = "warn",
        roles: Collection[str] = ("user", "tool"),
    ) -> None:
        self.name, self.pattern, self.action = name, re.compile(pattern), action
        self.severity, self.roles = severity, set(roles)

    def inspect(self, message: Message) -> GuardrailVerdict | None:
        if message.role not in self.roles:
            return None
        hits = len(self.pattern.findall(message.content))
        if not hits:
            return None
        replacement = self.pattern.sub("[redacted]", message.content)
        return GuardrailVerdict(
            name=self.name, action=self.action, severity=self.severity,
            replacement=replacement if self.action == "redact" else None,
            # The rule's name, not its pattern: a pattern may spell the secret it hunts.
            detail=f"{hits} match(es) of {self.name!r}",
        )


#: Characters a person cannot see that change what a model reads: zero-width
#: characters, the word joiner, the byte-order mark, bidi embeddings, overrides
#: and isolates, and the tag characters (which can spell hidden ASCII).
INVISIBLE = re.compile("[\u200b-\u200d\u2060\ufeff\u202a-\u202e\u2066-\u2069"
                       "\U000e0000-\U000e007f]")


class InvisibleText:
    """Strips (``mode="strip"``) or shows as ``<U+XXXX>`` (``mode="show"``) invisible and
    bidi control characters in messages of the given trust levels (default: untrusted
    content, i.e. results of tools declared ``untrusted=True``) before the model reads
    them. Each change is a guardrail verdict (``invisible_text``, action redact), so a
    replay rebuilds the same context; the stored result keeps the characters, as evidence.
    """

    name = "invisible_text"

    def __init__(self, mode: Literal["strip", "show"] = "strip", *,
                 trust: Collection[str] = ("untrusted",)) -> None:
        if mode not in ("strip", "show"):
            raise ValueError(f"mode is 'strip' or 'show', not {mode!r}")
        self.mode, self.trust = mode, set(trust)

    def clean(self, text: str) -> str:
        if self.mode == "strip":
            return INVISIBLE.sub("", text)
        return INVISIBLE.sub(lambda m: f"<U+{ord(m[0]):04X}>", text)

    def inspect(self, message: Message) -> GuardrailVerdict | None:
        if message.trust not in self.trust:
            return None
        hits = len(INVISIBLE.findall(message.content))
        if not hits:
            return None
        return GuardrailVerdict(
            name=self.name, action="redact", severity="warn",
            replacement=self.clean(message.content),
            detail=f"{hits} invisible or bidi control character(s) "
                   f"{'removed' if self.mode == 'strip' else 'made visible'}")


# --- compaction ------------------------------------------------------------------


def estimate_tokens(messages: Sequence[Message]) -> int:
    return sum(len(m.content) // 4 + 4 for m in messages)


def outline(messages: Sequence[Message]) -> str:
    """A plain summary: one line per discarded message. Swap in a model-written one."""
    lines = [f"{m.role}{f' {m.name}' if m.name else ''}: {m.content[:120]}" for m in messages]
    return "Summary of earlier context:\n" + "\n".join(lines)


class Compaction:
    """Compact when the context passes a message or token budget, keeping the newest ``keep``.

    The first message (the task) is always kept; the summary replaces the rest.
    """

    def __init__(
        self,
        *,
        max_messages: int | None = None,
        max_tokens: int | None = None,
        keep: int = 6,
        summarize: Callable[[Sequence[Message]], str] = outline,
    ) -> None:
        if max_messages is None and max_tokens is None:
            raise ValueError("give max_messages or max_tokens")
        self.max_messages, self.max_tokens, self.keep = max_messages, max_tokens, keep
        self.summarize = summarize

    def plan(self, messages: Sequence[Message]) -> tuple[str, int] | None:
        """(summary, kept) if the context should be compacted now, else None."""
        over = (self.max_messages is not None and len(messages) > self.max_messages) or (
            self.max_tokens is not None and estimate_tokens(messages) > self.max_tokens
        )
        kept = _safe_tail(messages, self.keep)
        if not over or len(messages) - 1 - kept <= 0:
            return None
        return self.summarize(messages[1 : len(messages) - kept]), kept


def _safe_tail(messages: Sequence[Message], keep: int) -> int:
    # Never split a tool result from the assistant turn that asked for it.
    kept = min(keep, len(messages) - 1)
    while kept > 0 and messages[len(messages) - kept].role == "tool":
        kept += 1
        if kept >= len(messages) - 1:
            return len(messages) - 1
    return kept


# --- budgets ---------------------------------------------------------------------


#: Default limits (``Budget()``): generous for real work, small enough that a model
#: looping on the same call stops within minutes and a bounded bill. Lift them per
#: agent (``Budget(max_turns=1000)``), or all at once with ``Budget.unlimited()``.
DEFAULT_MAX_TURNS = 100
DEFAULT_MAX_TOOL_CALLS = 500
DEFAULT_MAX_TOKENS = 2_000_000


class Budget(msgspec.Struct, frozen=True, kw_only=True):
    """Limits that stop a runaway loop. The stop is an event (budget_exceeded) and a pause.

    On by default: 100 model turns, 500 tool calls, 2,000,000 tokens (input plus
    output). Cost and elapsed time have no default limit (prices and patience vary).
    A limit of None is no limit; ``Budget.unlimited()`` has none at all.
    """

    max_turns: int | None = DEFAULT_MAX_TURNS
    max_tool_calls: int | None = DEFAULT_MAX_TOOL_CALLS
    max_tokens: int | None = DEFAULT_MAX_TOKENS
    max_cost_usd: float | None = None
    max_seconds: float | None = None

    @classmethod
    def unlimited(cls) -> Budget:
        """No limit at all: the run goes on until the model finishes or someone stops it."""
        return cls(max_turns=None, max_tool_calls=None, max_tokens=None)

    def exceeded(self, state: RunState, elapsed: float) -> tuple[str, float, float] | None:
        """(budget, limit, used) for the first limit reached, else None."""
        tokens = state.usage.input_tokens + state.usage.output_tokens
        checks: list[tuple[str, float | None, float]] = [
            ("turns", self.max_turns, state.turns),
            ("tool_calls", self.max_tool_calls, state.tool_calls),
            ("tokens", self.max_tokens, tokens),
            ("cost_usd", self.max_cost_usd, state.cost_usd),
            ("seconds", self.max_seconds, elapsed),
        ]
        for name, limit, used in checks:
            if limit is not None and used >= limit:
                return name, limit, used
        return None
