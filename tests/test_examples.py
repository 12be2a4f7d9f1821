"""examples/real_model.py runs as a user would run it, in its own process with the provider's
real SDK, against a local stub of each provider's API (the crash windows are
tests/test_crash_models.py's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentjournal.testing.llm_stub import Reply, StubServer

EXAMPLE = Path(__file__).parents[1] / "examples" / "real_model.py"
SCRIPT = [
    Reply(calls=[("read_ledger", {"name": "ledger-a"}), ("read_ledger", {"name": "ledger-b"})]),
    Reply(calls=[("post_correction", {"correction_id": "ledger-a", "cents": -1250}),
                 ("post_correction", {"correction_id": "ledger-b", "cents": 300})]),
    Reply(text="Posted 2 corrections."),
]


def env_for(provider: str, stub: StubServer) -> dict[str, str]:
    if provider == "anthropic":
        return {"ANTHROPIC_API_KEY": "test", "ANTHROPIC_BASE_URL": stub.url}
    return {"OPENAI_API_KEY": "test", "OPENAI_BASE_URL": stub.url + "/v1"}


@pytest.mark.parametrize("provider", ["openai", "openai-responses", "anthropic"])
def test_example_runs_on_each_provider(provider: str, tmp_path: Path) -> None:
    with StubServer(SCRIPT) as stub:
        done = subprocess.run(
            [sys.executable, str(EXAMPLE), "--provider", provider, "--run-id", "q3",
             "--store", f"sqlite:///{tmp_path / 'runs.db'}", "--ledger",
             str(tmp_path / "ledger.json")],
            env={**os.environ, **env_for(provider, stub)}, capture_output=True, text=True,
            timeout=60)
        assert done.returncode == 0, done.stderr
        assert not stub.rejections
    result = json.loads(done.stdout)
    assert result["status"] == "finished" and result["outcome"] == "Posted 2 corrections."
    ledger = json.loads((tmp_path / "ledger.json").read_text())
    assert sorted(ledger) == ["ledger-a", "ledger-b"]


def test_example_runs_in_background_mode_on_a_server_without_retrieve(tmp_path: Path) -> None:
    # Several OpenAI-compatible servers answer a background call in its create call and
    # have no retrieve endpoint.
    with StubServer(SCRIPT, retrieve=False) as stub:
        done = subprocess.run(
            [sys.executable, str(EXAMPLE), "--provider", "openai-responses", "--run-id", "q3",
             "--store", f"sqlite:///{tmp_path / 'runs.db'}", "--ledger",
             str(tmp_path / "ledger.json")],
            env={**os.environ, **env_for("openai-responses", stub)}, capture_output=True,
            text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        assert stub.counts["created"] == len(SCRIPT)  # one response per turn
    assert json.loads(done.stdout)["outcome"] == "Posted 2 corrections."
