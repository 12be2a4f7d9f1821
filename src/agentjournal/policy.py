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
            detail=f"{hits} match(es) of {self.pattern.pattern!r}",
        )


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


class Budget(msgspec.Struct, frozen=True, kw_only=True):
    """Limits that stop a runaway loop. The stop is an event (budget_exceeded)."""

    max_turns: int | None = None
    max_tool_calls: int | None = None
    max_cost_usd: float | None = None
    max_seconds: float | None = None

    def exceeded(self, state: RunState, elapsed: float) -> tuple[str, float, float] | None:
        """(budget, limit, used) for the first limit reached, else None."""
        checks: list[tuple[str, float | None, float]] = [
            ("turns", self.max_turns, state.turns),
            ("tool_calls", self.max_tool_calls, state.tool_calls),
            ("cost_usd", self.max_cost_usd, state.cost_usd),
            ("seconds", self.max_seconds, elapsed),
        ]
        for name, limit, used in checks:
            if limit is not None and used >= limit:
                return name, limit, used
        return None
