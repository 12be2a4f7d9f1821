"""OpenTelemetry GenAI spans for a run (the ``[otel]`` extra).

:class:`GenAITracer` is an agent observer (``agent.run(..., observer=GenAITracer())``).
It sees only the events this process appends, never a replay, so it reports only
work done here, as the GenAI execution conventions (``gen-ai-execution.md``) require:

- ``invoke_agent {agent}`` per process segment of a run (a start, or a resume);
- ``chat {model}`` per model turn, with the provider, response id, finish reason and
  usage (``gen_ai.usage.*``), timed by the turn's recorded latency;
- ``execute_tool {tool}`` per call this process made or settled, with
  ``agentjournal.tool.effect`` and ``agentjournal.tool.outcome``: ``completed``,
  ``uncertain`` (its effect unknown), ``reconciled`` (a lookup on resume settled a call
  an earlier process left open: the lookup is what ran here, never the effect again) or
  ``denied``. A call to a tool the agent does not have is a plain ``execute_tool`` span
  with no ``gen_ai.tool.name``: that name is the model's output, not a tool's.

The segment's trace context (W3C ``traceparent``) is recorded in the run_started /
run_resumed event, so after a crash the next process's segment carries a span link to
the previous one, across processes and machines. No idempotency key or value derived
from one is exported under ``gen_ai.*``: a call is named by the model's call id only.
"""

from __future__ import annotations

import threading
from datetime import datetime, timedelta
from typing import Any

from .errors import MissingExtraError
from .events import Event, EventType
from .state import RunState

try:
    from opentelemetry import trace
    from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode, Tracer
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise MissingExtraError("otel", "opentelemetry-api") from exc

E = EventType
_PROPAGATOR = TraceContextTextMapPropagator()
#: The outcome a call's end records, by the event that ended it.
OUTCOMES = ("completed", "uncertain", "reconciled", "denied")


def _ns(ts: datetime) -> int:
    return int(ts.timestamp() * 1_000_000_000)


class GenAITracer:
    """An observer that emits GenAI spans for the work of this process (see module doc).

    ``tracer_provider``: where spans go (default: the global one). ``agent_name``: the
    ``gen_ai.agent.name`` (default: the run's recorded agent ref, else "agentjournal").
    One tracer may observe one run at a time per thread of control; use one per run."""

    def __init__(self, tracer_provider: Any = None, *, agent_name: str | None = None) -> None:
        self.tracer: Tracer = trace.get_tracer("agentjournal", tracer_provider=tracer_provider)
        self.agent_name = agent_name
        self._lock = threading.Lock()
        self._segment: Span | None = None
        self._calls: dict[int, Span] = {}  # open execute_tool spans by started seq

    # --- the segment hooks (agent.segment_hook) ------------------------------------------

    def segment_started(self, state: RunState) -> dict[str, str]:
        """Open this process's ``invoke_agent`` span, linked to the previous segment's
        (``state.trace``, recorded by the process before); its context, to record."""
        links = []
        if state.trace:
            previous = trace.get_current_span(_PROPAGATOR.extract(state.trace))
            if previous.get_span_context().is_valid:
                links.append(Link(previous.get_span_context(),
                                  {"agentjournal.link": "previous_segment"}))
        name = self.agent_name or state.agent or "agentjournal"
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": name,
            "gen_ai.conversation.id": state.run_id or "",
            "agentjournal.run.resumed": state.last_seq > 0,
            "agentjournal.run.from_seq": state.last_seq}
        if state.agent:
            attributes["gen_ai.agent.id"] = state.agent
        span = self.tracer.start_span(f"invoke_agent {name}", kind=SpanKind.INTERNAL,
                                      links=links, attributes=attributes)
        with self._lock:
            self._segment = span
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, trace.set_span_in_context(span))
        return carrier

    def segment_ended(self, state: RunState) -> None:
        """Close what this process opened: calls still open (the run stopped mid-call)
        and the segment, with the run's status."""
        with self._lock:
            segment, self._segment = self._segment, None
            calls, self._calls = self._calls, {}
        for span in calls.values():
            span.set_attribute("agentjournal.tool.outcome", "uncertain")
            span.end()
        if segment is not None:
            segment.set_attribute("agentjournal.run.status", state.status)
            segment.set_attribute("agentjournal.run.to_seq", state.last_seq)
            segment.end()

    # --- the observer ----------------------------------------------------------------------

    def __call__(self, event: Event, state: RunState) -> None:
        handler = _HANDLERS.get(event.type)
        if handler is not None and self._segment is not None:
            handler(self, event)

    def _child(self, name: str, kind: SpanKind, start: datetime,
               attributes: dict[str, Any]) -> Span:
        context = trace.set_span_in_context(self._segment) if self._segment else None
        return self.tracer.start_span(name, context=context, kind=kind,
                                      start_time=_ns(start), attributes=attributes)

    def _turn(self, event: Event) -> None:
        p = event.payload
        usage = p.get("usage") or {}
        model = p.get("model") or "unknown"
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat", "gen_ai.request.model": model,
            "gen_ai.response.model": model,
            "gen_ai.usage.input_tokens": int(usage.get("input_tokens", 0)),
            "gen_ai.usage.output_tokens": int(usage.get("output_tokens", 0)),
            "gen_ai.usage.cache_read.input_tokens": int(usage.get("cached_input_tokens", 0)),
            "gen_ai.usage.cache_creation.input_tokens":
                int(usage.get("cache_write_tokens", 0)),
            "gen_ai.usage.reasoning.output_tokens": int(usage.get("reasoning_tokens", 0)),
            "agentjournal.seq": event.seq}
        for name, field in (("gen_ai.provider.name", "provider"),
                            ("gen_ai.response.id", "response_id")):
            if p.get(field):
                attributes[name] = p[field]
        if p.get("finish_reason"):
            attributes["gen_ai.response.finish_reasons"] = [p["finish_reason"]]
        started = event.ts - timedelta(milliseconds=float(p.get("latency_ms") or 0))
        span = self._child(f"chat {model}", SpanKind.CLIENT, started, attributes)
        span.end(end_time=_ns(event.ts))

    def _started(self, event: Event) -> None:
        p = event.payload
        span = self._child(f"execute_tool {p['tool']}", SpanKind.INTERNAL, event.ts, {
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": p["tool"],
            "gen_ai.tool.call.id": p.get("call_id") or "", "gen_ai.tool.type": "function",
            "agentjournal.tool.effect": p.get("effect") or "",
            "agentjournal.tool.attempt": int(p.get("attempt", 1)),
            "agentjournal.seq": event.seq})
        with self._lock:
            self._calls[event.seq] = span

    def _ended(self, event: Event, outcome: str, error: str | None = None) -> None:
        with self._lock:
            span = self._calls.pop(event.payload.get("started_seq") or -1, None)
        if span is None:
            return  # started by an earlier process: this one did not execute it
        span.set_attribute("agentjournal.tool.outcome", outcome)
        if error is not None:
            span.set_attribute("error.type", error)
            span.set_status(Status(StatusCode.ERROR))
        span.end(end_time=_ns(event.ts))

    def _completed(self, event: Event) -> None:
        p = event.payload
        self._ended(event, "completed", "tool_error" if p.get("is_error") else None)

    def _uncertain(self, event: Event) -> None:
        self._ended(event, "uncertain", str(event.payload.get("error", "")).split(":")[0]
                    or "uncertain")

    def _reconciled(self, event: Event) -> None:
        """A verdict this process reached on a call left open: the lookup ran here."""
        p = event.payload
        if p.get("by", "agentjournal") != "agentjournal":
            return  # a person's decision, recorded by a CLI or the viewer: no execution
        span = self._child(f"execute_tool {p.get('tool')}", SpanKind.INTERNAL, event.ts, {
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": p.get("tool") or "",
            "gen_ai.tool.type": "function", "agentjournal.tool.outcome": "reconciled",
            "agentjournal.tool.verdict": p.get("verdict") or "",
            "agentjournal.seq": event.seq})
        span.end(end_time=_ns(event.ts))

    def _denied(self, event: Event) -> None:
        p = event.payload
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.call.id": p.get("call_id") or "", "gen_ai.tool.type": "function",
            "agentjournal.tool.outcome": "denied", "agentjournal.seq": event.seq}
        name = "execute_tool"
        if not p.get("unknown_tool"):  # a name the model made up is not a tool's: never
            attributes["gen_ai.tool.name"] = p.get("tool") or ""  # a span name or label
            name = f"execute_tool {p.get('tool')}"
        span = self._child(name, SpanKind.INTERNAL, event.ts, attributes)
        span.end(end_time=_ns(event.ts))


_HANDLERS = {
    E.MODEL_TURN: GenAITracer._turn,
    E.TOOL_CALL_STARTED: GenAITracer._started,
    E.TOOL_CALL_COMPLETED: GenAITracer._completed,
    E.TOOL_CALL_UNCERTAIN: GenAITracer._uncertain,
    E.TOOL_CALL_RECONCILED: GenAITracer._reconciled,
    E.TOOL_CALL_DENIED: GenAITracer._denied,
}
