"""The SDK's trace spans, summarised into a run's journal for ``agentjournal show``.

An observer, never the durability path: the journal's own events (model turns, tool
calls and their outcomes) are what a resumed run relies on. The spans add what the SDK
saw around them: agents, turns, guardrails, handoffs, how long each took, and errors.

:class:`JournalTraceProcessor` is registered once with the SDK (``install()``); it keeps
the spans of the traces a ``JournalRunner`` bound (by trace id) and nothing of any other
trace. The runner takes them when the SDK's run returns and records them as one
``trace_recorded`` event (record-only: no state depends on it). A span summary holds
its kind, name, parent, start, duration and error, and a few small fields per kind (a
generation's model and usage, a response's id, a handoff's agents, a guardrail's
verdict); never a prompt, a tool's arguments or a result: those are in the journal once.
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime
from typing import Any

from agents.tracing import Span, Trace, TracingProcessor, add_trace_processor

__all__ = ["MAX_SPANS", "JournalTraceProcessor", "install", "span_summary"]

log = logging.getLogger("agentjournal.openai_agents")

#: Spans kept per trace; later ones are counted as dropped (a trace of a runaway loop
#: must not grow without bound in memory or in one event).
MAX_SPANS = 500

#: Small fields worth keeping, by the span data's ``export()`` type.
_KEEP = {
    "agent": ("name", "handoffs", "output_type"),
    "function": ("name",),
    "generation": ("model", "usage"),
    "response": ("response_id", "usage"),
    "handoff": ("from_agent", "to_agent"),
    "guardrail": ("name", "triggered"),
    "custom": ("name",),
    "mcp_tools": ("server",),
}


def span_summary(span: Span[Any]) -> dict[str, Any]:
    """What a span says, small enough for the log: kind, name, timing, error."""
    data = span.span_data.export()
    kind = span.span_data.type  # "task" and "turn" export as "custom"
    summary: dict[str, Any] = {"kind": kind, "span_id": span.span_id,
                               "parent_id": span.parent_id, "started_at": span.started_at}
    for field in _KEEP.get(data.get("type", ""), ()):
        if data.get(field) is not None:
            summary[field] = data[field]
    if kind == "turn":
        summary["name"] = f"turn {data.get('data', {}).get('turn')}"
    elif kind == "task":
        summary["name"] = data.get("data", {}).get("name")
    if span.started_at and span.ended_at:
        took = datetime.fromisoformat(span.ended_at) - datetime.fromisoformat(span.started_at)
        summary["ms"] = round(took.total_seconds() * 1000, 3)
    if span.error:
        summary["error"] = span.error.get("message", "")
    return summary


class JournalTraceProcessor(TracingProcessor):
    """Keeps the span summaries of bound traces until their run takes them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._traces: dict[str, list[dict[str, Any]]] = {}
        self._dropped: dict[str, int] = {}

    def bind(self, trace_id: str) -> None:
        """Keep the spans of trace ``trace_id`` (a JournalRunner's run) from now on."""
        with self._lock:
            self._traces.setdefault(trace_id, [])
            self._dropped.setdefault(trace_id, 0)

    def take(self, trace_id: str) -> tuple[list[dict[str, Any]], int]:
        """The spans ended so far in ``trace_id``, and how many were dropped; the trace
        stays bound (a run interrupted for a person goes on later in the same trace)."""
        with self._lock:
            spans, self._traces[trace_id] = self._traces.get(trace_id, []), []
            dropped, self._dropped[trace_id] = self._dropped.get(trace_id, 0), 0
        return spans, dropped

    def unbind(self, trace_id: str) -> None:
        with self._lock:
            self._traces.pop(trace_id, None)
            self._dropped.pop(trace_id, None)

    def on_span_end(self, span: Span[Any]) -> None:
        with self._lock:
            spans = self._traces.get(span.trace_id)
            if spans is None:
                return
            if len(spans) >= MAX_SPANS:
                self._dropped[span.trace_id] += 1
                return
        try:
            summary = span_summary(span)
        except Exception:  # an observer never breaks the run it observes
            log.warning("could not summarise a span of trace %s", span.trace_id,
                        exc_info=True)
            return
        with self._lock:
            if (kept := self._traces.get(span.trace_id)) is not None:
                kept.append(summary)

    def on_trace_start(self, trace: Trace) -> None:
        pass

    def on_trace_end(self, trace: Trace) -> None:
        pass

    def on_span_start(self, span: Span[Any]) -> None:
        pass

    def shutdown(self) -> None:
        pass

    def force_flush(self) -> None:
        pass


_installed: JournalTraceProcessor | None = None
_installing = threading.Lock()


def install() -> JournalTraceProcessor:
    """The process's one processor, registered with the SDK on first use (beside the
    SDK's own processors, which it leaves as they are)."""
    global _installed
    with _installing:
        if _installed is None:
            _installed = JournalTraceProcessor()
            add_trace_processor(_installed)
        return _installed
