"""Tokens, cost, model latency and duration, as `show` and `runs` print them.

A turn whose model had no known price records its cost as None; it is said
("unknown price"), never shown as $0, which would read as free.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from .. import Event, RunState
from ..summaries import count, money, span
from ._base import E


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
