"""Child process for tests/test_otel.py: the demo's reconciliation agent, traced.

    python -m tests.otel_agent --store URL --ledger URL --run-id ID --spans FILE

Runs (or resumes) the run once with a GenAITracer whose spans are written to FILE as
they end, one JSON object a line (a SIGKILL loses only the spans still open). Arm
AGENTJOURNAL_FAULT to kill it at a chosen point. Run from the repository root.
"""

from __future__ import annotations

import argparse
import json
from typing import IO, Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from agentjournal import open_store
from agentjournal.demo.reconcile import TASK, reconciliation_agent
from agentjournal.otel import GenAITracer


class LineExporter(SpanExporter):
    """Each span as one JSON line, flushed and synced at once (the process may be killed)."""

    def __init__(self, out: IO[str]) -> None:
        self.out = out

    def export(self, spans: Any) -> SpanExportResult:
        for span in spans:
            self.out.write(json.dumps(as_dict(span)) + "\n")
        self.out.flush()
        return SpanExportResult.SUCCESS


def as_dict(span: ReadableSpan) -> dict[str, Any]:
    ctx, parent = span.get_span_context(), span.parent
    return {"name": span.name, "trace_id": f"{ctx.trace_id:032x}",
            "span_id": f"{ctx.span_id:016x}",
            "parent_id": f"{parent.span_id:016x}" if parent else None,
            "attributes": dict(span.attributes or {}),
            "links": [{"trace_id": f"{link.context.trace_id:032x}",
                       "span_id": f"{link.context.span_id:016x}"} for link in span.links]}


def main() -> None:
    parser = argparse.ArgumentParser()
    for flag in ("--store", "--ledger", "--run-id", "--spans"):
        parser.add_argument(flag, required=True)
    args = parser.parse_args()
    with open(args.spans, "a") as out:
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(LineExporter(out)))
        store = open_store(args.store)
        try:
            result = reconciliation_agent(args.ledger).run(
                store, args.run_id, TASK, observer=GenAITracer(provider))
        finally:
            store.close()
        print(json.dumps({"status": result.status, "last_seq": result.last_seq}))


if __name__ == "__main__":
    main()
