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
