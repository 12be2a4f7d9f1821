"""`agentjournal demo`, end to end in a subprocess: the agent is killed in each window and
resumed in a new process, and the ledger service's own counts prove exactly-once."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from agentjournal import open_store
from agentjournal.cli import cli
from agentjournal.demo.reconcile import LEDGERS
from agentjournal.demo.run_demo import kill_at_random

CORRECTIONS = {f"q3-{name}" for name in LEDGERS}
EXE = Path(sys.executable).parent / "agentjournal"


def demo(tmp_path: Path, *args: str) -> tuple[int, dict[str, Any]]:
    done = subprocess.run([EXE, "demo", "--json", "--dir", tmp_path / "demo", *args],
                          capture_output=True, text=True, timeout=60, check=False)
    return done.returncode, json.loads(done.stdout)  # stdout is the one JSON object


def kinds(out: dict[str, Any]) -> list[str]:
    return [step["kind"] for step in out["timeline"]]


def assert_resumed_exactly_once(code: int, out: dict[str, Any], tmp_path: Path) -> None:
    assert code == 0 and out["ok"] is True
    assert out["status"] == "finished" and out["kills"] == 1
    assert out["effects"] == dict.fromkeys(CORRECTIONS, 1)
    assert out["store"] == f"sqlite:///{tmp_path / 'demo' / 'journal.db'}"
    assert out["run_id"] and out["killed_after_seq"] > 0
    # The kill sits where it happened: after the start, before the resume.
    assert kinds(out)[:3] == ["started", "killed", "resumed"] and kinds(out)[-1] == "finished"


# Killed while the model thinks, the reads whose results were to be stored with its
# turn are made again; no correction is.
@pytest.mark.parametrize("kill_at, verdicts", [("model", ["retry"] * 3), ("tool", ["absent"])])
def test_kill_in_window_then_resume_applies_each_correction_once(
    tmp_path: Path, kill_at: str, verdicts: list[str]
) -> None:
    code, out = demo(tmp_path, "--kill-at", kill_at)
    assert_resumed_exactly_once(code, out, tmp_path)
    assert [u["verdict"] for u in out["uncertain"]] == verdicts


def test_kill_after_effect_is_reconciled_by_lookup_not_retried_blindly(tmp_path: Path) -> None:
    code, out = demo(tmp_path)  # after-effect is the default window
    assert_resumed_exactly_once(code, out, tmp_path)
    assert out["kill_at"] == "after-effect"
    (call,) = out["uncertain"]
    assert call["tool"] == "post_correction" and call["verdict"] == "found"
    assert call["args"]["correction_id"] == "q3-ledger-a" and len(call["key"]) == 64
    posted = [s["detail"] for s in out["timeline"] if s["kind"] == "correction"]
    assert "already applied (found by the lookup)" in posted[0]


def test_random_kill_is_seeded_and_still_exactly_once(tmp_path: Path) -> None:
    code, out = demo(tmp_path, "--kill-at", "random", "--seed", "7")
    assert code == 0 and out["status"] == "finished" and out["seed"] == 7
    assert out["kills"] in (0, 1) and (out["kills"] == 0) == (out["killed_after_seq"] is None)
    assert out["effects"] == dict.fromkeys(CORRECTIONS, 1)
    assert all(u["verdict"] in ("found", "absent", "retry") for u in out["uncertain"])


def test_random_kill_counts_no_kill_when_the_agent_finished_first(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'journal.db'}")
    try:  # an "agent" that exits at once, before the log grows at all
        assert kill_at_random([sys.executable, "-c", "pass"], store, random.Random(1)) == 0
    finally:
        store.close()


def test_human_output_tells_the_story(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["demo", "--dir", str(tmp_path)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.stderr
    for needle in ("SIGKILL after seq", "resumed", "found at the ledger", "q3-ledger-a",
                   "verdict: exactly once"):
        assert needle in result.stdout
    assert "agentjournal show" in result.stderr
    # The directory now holds a demo: a second one there would post the corrections again.
    again = CliRunner().invoke(cli, ["demo", "--dir", str(tmp_path)])
    assert again.exit_code == 1 and "already holds a demo" in again.stderr
