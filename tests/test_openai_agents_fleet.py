"""A worker process drives JournalRunner runs submitted with `agentjournal submit`: the
receiver process counts each effect once; a run stopped for approvals waits, and the
worker finishes it once a person approved (`agentjournal approve`)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from agentjournal import EventType, open_store
from agentjournal.cli import cli
from agentjournal.fleet import queue_of
from tests.conftest import fresh_url
from tests.openai_agents_child import TASK
from tests.openai_fleet_agents import RECEIVER

ROOT = Path(__file__).resolve().parents[1]
E = EventType
HANG = 120.0  # a hang guard (a worker imports the SDK: seconds on a loaded machine)


@pytest.fixture(params=("sqlite", "postgres"))
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from fresh_url(request.param, tmp_path)


@pytest.fixture
def worker(url: str, receiver: Any, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    log = tmp_path / "worker.log"
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "agentjournal", "worker", "--store", url, "--agents",
             "tests.openai_fleet_agents", "--import-path", str(ROOT), "--poll", "0.2"],
            cwd=tmp_path, env={**os.environ, RECEIVER: receiver.url},
            stdout=subprocess.DEVNULL, stderr=err)
    yield proc
    proc.kill()
    proc.wait()


def cli_ok(*args: str) -> str:
    done = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert done.exit_code == 0, done.output
    return done.output


def until(what: str, check: Callable[[], Any]) -> Any:
    deadline = time.monotonic() + HANG
    while time.monotonic() < deadline:
        if found := check():
            return found
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def state_of(url: str, run_id: str) -> str | None:
    with open_store(url) as store:
        return next((r.state for r in queue_of(store).runs() if r.run_id == run_id), None)


def counted(receiver: Any, prefix: str) -> dict[str, int]:
    return {label.removeprefix(prefix): n for label, n in receiver.by_label().items()
            if label.startswith(prefix)}


def test_a_worker_drives_a_submitted_journal_runner_run(
        url: str, receiver: Any, worker: subprocess.Popen[bytes]) -> None:
    cli_ok("submit", "--agent", "tests.openai_fleet_agents:poster", "--task", TASK,
           "--run-id", "sdk-1", "--store", url)
    until("the run to be done", lambda: state_of(url, "sdk-1") == "done")
    assert counted(receiver, "fleet-") == {"a": 1, "b": 1}
    with open_store(url) as store:
        log = list(store.read("sdk-1"))
    assert log[0].payload["agent"] == "tests.openai_fleet_agents:poster"
    assert log[-1].type is E.RUN_FINISHED and log[-1].payload["outcome"] == "posted 2"


def test_a_run_stopped_for_approval_waits_then_the_worker_finishes_it(
        url: str, receiver: Any, worker: subprocess.Popen[bytes]) -> None:
    cli_ok("submit", "--agent", "tests.openai_fleet_agents:approved_poster", "--task", TASK,
           "--run-id", "sdk-2", "--store", url)
    until("the run to wait for a person", lambda: state_of(url, "sdk-2") == "waiting")
    assert counted(receiver, "fleet-approved-") == {}
    with open_store(url) as store:
        asked = [e.payload["approval_id"] for e in store.read("sdk-2")
                 if e.type is E.APPROVAL_REQUESTED]
    for approval_id in asked:
        cli_ok("approve", "sdk-2", approval_id, "--store", url)
    until("the run to be done", lambda: state_of(url, "sdk-2") == "done")
    assert counted(receiver, "fleet-approved-") == {"a": 1, "b": 1}
