"""OpenTelemetry GenAI spans: a run killed by SIGKILL and resumed in another process
reports only the work each process did, the resumed segment links to the killed one
through the trace context recorded in the journal, and no key is exported under gen_ai.*.
The ledger service (its own process) counts the effects."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)

from agentjournal import EventType, open_store
from agentjournal.demo.ledger import LedgerService
from agentjournal.demo.reconcile import TASK, reconciliation_agent
from agentjournal.faults import ENV_VAR
from agentjournal.otel import GenAITracer

from .otel_agent import as_dict

ROOT = Path(__file__).resolve().parents[1]
RUN = "q3-traced"


def killed_child(store_url: str, ledger_url: str, spans: Path) -> subprocess.CompletedProcess[str]:
    """The first segment, SIGKILLed after the first correction reached the ledger and
    before its completion was recorded (the 4th tool call)."""
    env = {**os.environ, ENV_VAR: "after_effect:4",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), str(ROOT),
                                                       os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "tests.otel_agent", "--store", store_url,
                           "--ledger", ledger_url, "--run-id", RUN, "--spans", str(spans)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def keys_in(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef"
                                                               for c in value)


@pytest.mark.parametrize("store_url", ["sqlite", "postgres"], indirect=True)
def test_a_killed_and_resumed_run_reports_each_process_work_once_linked(
        store_url: str, tmp_path: Path) -> None:
    spans_file = tmp_path / "first.jsonl"
    with LedgerService(tmp_path / "ledger.db") as ledger:
        done = killed_child(store_url, ledger.url, spans_file)
        assert done.returncode == -signal.SIGKILL, done.stderr
        first = [json.loads(line) for line in spans_file.read_text().splitlines()]

        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        store = open_store(store_url)
        try:
            killed_at = store.last_seq(RUN)
            result = reconciliation_agent(ledger.url).run(store, RUN, TASK,
                                                          observer=GenAITracer(provider))
            log = list(store.read(RUN))
        finally:
            store.close()
        effects = ledger.effects()
    assert result.status == "finished"
    assert effects["corrections"] == {"q3-ledger-a": 1, "q3-ledger-b": 1, "q3-ledger-c": 1}
    assert effects["tickets"] == {"q3-exception-ledger-c": 1}  # the ledger's own count
    second = [as_dict(s) for s in exporter.get_finished_spans()]

    # The killed process: three reads and the first correction's start; its segment span
    # never ended (killed), but its children name it as their parent.
    assert [s["name"] for s in first if s["name"].startswith("execute_tool")] == [
        "execute_tool read_ledger"] * 3
    assert {s["parent_id"] for s in first} == {first[0]["parent_id"]}
    recorded = log[0].payload["trace"]["traceparent"]  # run_started holds its context
    assert recorded.split("-")[1:3] == [first[0]["trace_id"], first[0]["parent_id"]]

    # The resumed process: one segment, linked to the killed one.
    (segment,) = [s for s in second if s["name"].startswith("invoke_agent")]
    assert segment["links"] == [{"trace_id": first[0]["trace_id"],
                                 "span_id": first[0]["parent_id"]}]
    assert segment["attributes"]["gen_ai.conversation.id"] == RUN
    assert segment["attributes"]["agentjournal.run.resumed"] is True
    resumed = next(e for e in log if e.type is EventType.RUN_RESUMED)
    assert resumed.payload["trace"]["traceparent"].split("-")[2] == segment["span_id"]

    # No replayed execution: the reads and the first correction done before the kill
    # are not reported again; the correction left uncertain is reported as reconciled
    # (the lookup ran here), and only the calls this process started as completed.
    tools = [s for s in second if s["name"].startswith("execute_tool")]
    outcomes = [(s["name"], s["attributes"]["agentjournal.tool.outcome"]) for s in tools]
    started_here = [e for e in log[killed_at:] if e.type is EventType.TOOL_CALL_STARTED]
    assert outcomes == [("execute_tool post_correction", "reconciled")] + [
        (f"execute_tool {e.payload['tool']}", "completed") for e in started_here]
    assert [e.payload["tool"] for e in started_here] == [
        "post_correction", "post_correction", "file_ticket"]
    assert tools[0]["attributes"]["agentjournal.tool.verdict"] == "found"
    assert [s["attributes"]["agentjournal.tool.effect"] for s in tools[1:]] == [
        e.payload["effect"] for e in started_here]
    chats = [s for s in second if s["name"].startswith("chat")]
    turns_here = [e for e in log[killed_at:] if e.type is EventType.MODEL_TURN]
    assert len(chats) == len(turns_here) > 0
    assert all(s["parent_id"] == segment["span_id"] for s in second if s is not segment)

    # No idempotency key, nor anything shaped like one, under gen_ai.*.
    keys = {e.payload.get("key") for e in log} - {None}
    for span in first + second:
        for name, value in span["attributes"].items():
            if name.startswith("gen_ai."):
                assert value not in keys and not keys_in(value), (name, value)
