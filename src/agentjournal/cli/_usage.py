"""Tokens, cost, model latency and duration, as `show` and `runs` print them.

A turn whose model had no known price records its cost as None; it is said
("unknown price"), never shown as $0, which would read as free.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from .. import Event, RunState
from ._base import E, human_age


def money(cost: float | None) -> str:
    if cost is None:
        return "unknown price"
    return f"${cost:,.2f}" if cost >= 1 else f"${cost:.4g}"


def count(n: int) -> str:
    """A token count, short: 950, 12.3k, 4.1M."""
    for unit, size in (("M", 1_000_000), ("k", 1_000)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)


def span(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds:.2f} s" if seconds < 60 else human_age(seconds)


def turn_usage(payload: dict[str, Any]) -> str:
    """One turn's tokens, cost and latency: ``20 in (5 cached) / 7 out, $0.0001, 0.84 s``."""
    usage = payload.get("usage") or {}
    cached = usage.get("cached_input_tokens", 0)
    parts = [f"{count(usage.get('input_tokens', 0))} in"
             + (f" ({count(cached)} cached)" if cached else "")
             + f" / {count(usage.get('output_tokens', 0))} out",
             money(usage.get("cost_usd", 0.0))]
    if (latency := payload.get("latency_ms")) is not None:
        parts.append(span(latency / 1000))
    return ", ".join(parts)


def run_cost(state: RunState) -> float | None:
    """The run's cost: None when no turn had a known price (and some turn ran)."""
    priced = state.turns - state.unpriced_turns
    return None if state.unpriced_turns and priced <= 0 else state.cost_usd


def cost_text(turns: int, cost: float | None, unpriced: int) -> str:
    """``$0.0123``, ``unknown price``, or ``$0.0123 + unknown price (2 turns)``."""
    if not turns:
        return "-"
    if cost is None or not unpriced:
        return money(cost)
    return f"{money(cost)} + unknown price ({unpriced} turn{'' if unpriced == 1 else 's'})"


def seconds_between(first: datetime | None, last: datetime | None) -> float | None:
    return None if first is None or last is None else round((last - first).total_seconds(), 3)


def totals(state: RunState, duration_s: float | None) -> dict[str, Any]:
    """A run's usage for --json: tokens, cost (None: no known price), duration."""
    u = state.usage
    return {"turns": state.turns, "input_tokens": u.input_tokens,
            "output_tokens": u.output_tokens, "cached_input_tokens": u.cached_input_tokens,
            "cost_usd": run_cost(state), "unpriced_turns": state.unpriced_turns,
            "duration_s": duration_s}


def model_seconds(events: Sequence[Event]) -> float:
    """The time the run waited on its model, summed over its turns."""
    return round(sum(e.payload.get("latency_ms") or 0.0 for e in events
                     if e.type == E.MODEL_TURN) / 1000, 3)


def duration_of(events: Sequence[Event]) -> float | None:
    """From the first event to the last (pauses included)."""
    return seconds_between(events[0].ts, events[-1].ts) if events else None


def run_usage(state: RunState, events: Sequence[Event]) -> dict[str, Any]:
    """``show --json``'s totals: those of ``runs``, and the time spent on the model."""
    return {**totals(state, duration_of(events)), "model_latency_s": model_seconds(events)}


def usage_line(state: RunState, events: Sequence[Event]) -> str:
    """``show``'s summary of a run's usage."""
    u = state.usage
    cached = f" ({count(u.cached_input_tokens)} cached)" if u.cached_input_tokens else ""
    duration = duration_of(events)
    turns = f"{state.turns} turn" + ("" if state.turns == 1 else "s")
    return (f"usage: {turns}, {count(u.input_tokens)} in{cached} / "
            f"{count(u.output_tokens)} out tokens, "
            f"{cost_text(state.turns, run_cost(state), state.unpriced_turns)}, "
            f"model {span(model_seconds(events))}, duration {span(duration)}")
