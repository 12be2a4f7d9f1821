"""What `agentjournal` prints for people and scripts: the timeline's labels, queued runs,
tokens and cost, layouts at narrow widths, --limit, help, and one exit-code convention."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agentjournal import Agent, ModelError, ModelRequest, ModelResponse, open_store

from .test_cli import as_json, check, invoke


class Overloaded:
    """A model that is always overloaded: every attempt fails, retryably."""

    def complete(self, request: ModelRequest) -> ModelResponse:
        raise ModelError("overloaded", retryable=True, status=529)


def run_with(url: str, run_id: str, model: Any, **options: Any) -> None:
    store = open_store(url)
    try:
        Agent(model, [], **options).run(store, run_id, "say hi")
    finally:
        store.close()


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'journal.db'}"


# --- 12. the last failed model attempt before a pause is not "retrying" -----------------


def test_the_attempt_the_run_gave_up_on_is_not_labelled_retrying(url: str) -> None:
    run_with(url, "r1", Overloaded(), model_retries=2, model_backoff=0.0)
    lines = check(invoke("show", "r1", "--store", url), 0).stdout.splitlines()
    failed = [line for line in lines if "model_call_failed" in line]
    assert len(failed) == 3
    assert all("(retrying" in line for line in failed[:2])
    assert "retrying" not in failed[2] and "gave up: the run paused" in failed[2]
    events = as_json(invoke("show", "r1", "--json", "--store", url))["events"]
    last = [e for e in events if e["type"] == "model_call_failed"][-1]
    assert "gave up" in last["summary"]


# --- 14. a submitted run is listed and shown before a worker claims it -----------------


@pytest.mark.parametrize("store_url", ["sqlite", "postgres"], indirect=True)
def test_a_submitted_run_is_listed_and_shown_as_queued(store_url: str) -> None:
    check(invoke("submit", "--agent", "mod:agent", "--task", "Reconcile Q3", "--run-id", "q3",
                 "--queue", "nightly", "--store", store_url), 0)
    (row,) = as_json(invoke("runs", "--json", "--store", store_url))
    assert row["run_id"] == "q3" and row["status"] == "queued" and row["events"] == 0
    assert row["queue"] == {"name": "nightly", "state": "queued", "worker": None}
    assert row["agent"] == "mod:agent"
    check(invoke("runs", "--store", store_url), 0, "q3", "queued")
    assert [r["run_id"] for r in as_json(
        invoke("runs", "--status", "queued", "--json", "--store", store_url))] == ["q3"]
    assert as_json(invoke("runs", "--status", "finished", "--json", "--store", store_url)) == []

    check(invoke("show", "q3", "--store", store_url), 0, "q3", "queued", "'nightly'",
          "mod:agent", "no events yet")
    data = as_json(invoke("show", "q3", "--json", "--store", store_url))
    assert data["events"] == [] and data["queue"]["state"] == "queued"
    assert data["queue"]["name"] == "nightly"
    check(invoke("show", "nope", "--store", store_url), 2, "run 'nope' has no events")


def test_a_store_without_a_queue_lists_runs_as_before(tmp_path: Path) -> None:
    url = f"jsonl:///{tmp_path / 'runs'}"
    run_with(url, "r1", Overloaded(), model_retries=0)
    (row,) = as_json(invoke("runs", "--json", "--store", url))
    assert row["run_id"] == "r1" and row["queue"] is None
