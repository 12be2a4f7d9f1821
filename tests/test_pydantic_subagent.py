"""A Pydantic AI agent whose tool runs another agent, both durable by ``JournalDurability``:
killed right after the worker's effect (SIGKILL, a real child process), then the
orchestrator's call that ran the worker settled by its lookup, by a person, or by the
caller's ``DeferredToolResults``. The worker's run is closed with its parent's outcome:
nothing is left open that no one will ever resume (``agentjournal uncertain`` lists
nothing), and the receiver process counts the effect once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from pydantic_ai import DeferredToolRequests, DeferredToolResults

from agentjournal import EventType, JournalError, fold, open_store
from agentjournal.cli import cli
from agentjournal.demo.ledger import LedgerService

from .conftest import BACKENDS
from .pydantic_subagent import DELEGATE, drive, make_delegator, make_orchestrator, worker_run

E = EventType
ROOT = Path(__file__).resolve().parents[1]


def killed_after_the_workers_post(store_url: str, run_id: str, url: str, label: str,
                                  *extra: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tests.pydantic_subagent", "--store", store_url,
         "--run-id", run_id, "--receiver", url, "--label", label, *extra],
        cwd=ROOT, capture_output=True, text=True, timeout=180,
        env={**os.environ, "KILL_AFTER_POST": "1"})
    assert done.returncode == -signal.SIGKILL, done.stdout + done.stderr


def uncertain(store_url: str) -> list[dict[str, Any]]:
    shown = CliRunner().invoke(cli, ["uncertain", "--json", "--store", store_url])
    assert shown.exit_code == 0, shown.output
    rows: list[dict[str, Any]] = json.loads(shown.output)
    return rows


def log_of(store_url: str, run_id: str) -> list[Any]:
    store = open_store(store_url)
    try:
        return list(store.read(run_id))
    finally:
        store.close()


def assert_closed_by_its_parent(store_url: str, run_id: str, label: str) -> None:
    """The worker's run: its open call settled with its parent's outcome, then closed."""
    worker = log_of(store_url, worker_run(run_id))
    state = fold(worker)
    assert state.status == "cancelled" and not state.pending
    verdicts = [e.payload for e in worker if e.type is E.TOOL_CALL_RECONCILED]
    assert [(v["tool"], v["verdict"]) for v in verdicts] == [("post_effect", "found")]
    assert verdicts[0]["parent"]["run_id"] == run_id
    (done,) = [e.payload for e in worker if e.type is E.TOOL_CALL_COMPLETED]
    assert (done["source"], done["args"]) == ("parent", {"label": label})
    assert run_id in state.outcome and "delegate" in state.outcome


@pytest.mark.parametrize("store_url", BACKENDS, indirect=True)
def test_settled_by_a_person_the_workers_open_call_is_closed_with_it(
        request: pytest.FixtureRequest, store_url: str, module_receiver: Any) -> None:
    run_id, label = "orch", f"person-{request.node.callspec.id}"
    killed_after_the_workers_post(store_url, run_id, module_receiver.url, label)
    waiting = drive(store_url, run_id, module_receiver.url, label)
    assert waiting["status"] == "paused" and waiting["deferred"] == [DELEGATE]
    assert {r["run_id"] for r in uncertain(store_url)} == {run_id, worker_run(run_id)}
    resolved = CliRunner().invoke(cli, [
        "resolve", run_id, waiting["keys"][0][:16], "--happened", "--by", "ana",
        "--result", json.dumps(f"posted {label} (applied)"), "--store", store_url])
    assert resolved.exit_code == 0, resolved.output
    done = drive(store_url, run_id, module_receiver.url, label)
    assert (done["status"], done["output"]) == ("finished",
                                                f"delegated: posted {label} (applied)")
    assert module_receiver.by_label().get(label) == 1
    assert uncertain(store_url) == []
    assert_closed_by_its_parent(store_url, run_id, label)
    closed = len(log_of(store_url, worker_run(run_id)))
    again = drive(store_url, run_id, module_receiver.url, label)  # a replay changes nothing
    assert again["output"] == done["output"]
    assert len(log_of(store_url, worker_run(run_id))) == closed


@pytest.mark.parametrize("store_url", BACKENDS, indirect=True)
def test_settled_by_the_parents_lookup_the_workers_open_call_is_closed_with_it(
        request: pytest.FixtureRequest, store_url: str, module_receiver: Any) -> None:
    run_id, label = "orch", f"lookup-{request.node.callspec.id}"
    killed_after_the_workers_post(store_url, run_id, module_receiver.url, label,
                                  "--parent-lookup")
    done = drive(store_url, run_id, module_receiver.url, label, parent_lookup=True)
    assert (done["status"], done["output"]) == ("finished",
                                                f"delegated: posted {label} (applied)")
    assert module_receiver.by_label().get(label) == 1
    verdicts = [e.payload["verdict"] for e in log_of(store_url, run_id)
                if e.type is E.TOOL_CALL_RECONCILED]
    assert verdicts == ["found"]  # the parent's call: settled by its lookup
    assert uncertain(store_url) == []
    assert_closed_by_its_parent(store_url, run_id, label)


@pytest.mark.parametrize("store_url", BACKENDS, indirect=True)
def test_settled_by_the_callers_deferred_result_the_workers_open_call_is_closed_with_it(
        request: pytest.FixtureRequest, store_url: str, module_receiver: Any) -> None:
    run_id, label = "orch", f"caller-{request.node.callspec.id}"
    killed_after_the_workers_post(store_url, run_id, module_receiver.url, label)
    agent, _ = make_orchestrator(store_url, run_id, module_receiver.url, label)
    first = agent.run_sync(f"delegate {label}")
    assert isinstance(first.output, DeferredToolRequests)
    results = DeferredToolResults(calls={DELEGATE: f"posted {label} (applied)"})
    done = agent.run_sync(message_history=first.all_messages(), deferred_tool_results=results)
    assert done.output == f"delegated: posted {label} (applied)"
    assert module_receiver.by_label().get(label) == 1
    assert uncertain(store_url) == []
    assert_closed_by_its_parent(store_url, run_id, label)


def test_retried_after_did_not_happen_the_worker_is_resumed_not_closed(
        tmp_path: Path, module_receiver: Any) -> None:
    """A person says the delegation did not happen: the orchestrator makes the call again,
    which resumes the worker's own run; its lookup finds its effect, so the worker
    finishes (its effect made once) and nothing is closed for it."""
    store_url, run_id, label = f"sqlite:///{tmp_path / 'j.db'}", "orch", "retried"
    killed_after_the_workers_post(store_url, run_id, module_receiver.url, label,
                                  "--worker-lookup")
    waiting = drive(store_url, run_id, module_receiver.url, label, worker_lookup=True)
    assert waiting["deferred"] == [DELEGATE]
    resolved = CliRunner().invoke(cli, [
        "resolve", run_id, waiting["keys"][0][:16], "--did-not-happen", "--by", "ana",
        "--store", store_url])
    assert resolved.exit_code == 0, resolved.output
    done = drive(store_url, run_id, module_receiver.url, label, worker_lookup=True)
    assert done["output"] == f"delegated: posted {label} (applied)"
    assert module_receiver.by_label().get(label) == 1
    assert uncertain(store_url) == []
    worker = fold(log_of(store_url, worker_run(run_id)))
    assert worker.status == "finished" and worker.outcome == f"posted {label} (applied)"


# --- an agent run inside a call: each of its calls has a key of its own --------------------


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[LedgerService]:
    """The demo ledger, a process of its own that honours idempotency keys."""
    with LedgerService(tmp_path / "ledger.db") as service:
        yield service


@pytest.mark.parametrize("store_url", BACKENDS, indirect=True)
@pytest.mark.parametrize("how", ["run", "stream", "iter", "caught"])
def test_an_agent_without_its_own_durability_is_refused_the_calls_key(
        store_url: str, ledger: LedgerService, how: str) -> None:
    # Its tools are not journaled, and each read the outer call's key: the ledger answered
    # C-2 from C-1 (422) and the run finished with C-2 never applied. Refused now, before
    # either correction is sent, saying what to do; the call is left to the usual rules.
    agent = make_delegator(store_url, "delegator", ledger.url, child_durable=False, how=how)
    with pytest.raises(JournalError) as refused:
        agent.run_sync("close ledger-a")
    message = str(refused.value)
    assert "tool of agent 'corrector'" in message and "(delegate-1)" in message
    assert "Give 'corrector' a JournalDurability of its own" in message
    effects = ledger.effects()
    assert effects["corrections"] == {} and effects["replays"] == 0
    log = log_of(store_url, "delegator")
    errors = [e.payload["error"] for e in log if e.type is E.TOOL_CALL_UNCERTAIN]
    assert len(errors) == 3 and all("JournalDurability of its own" in e for e in errors)
    state = fold(log)  # idempotent: retried with its key, then left to a person
    assert state.status == "paused" and [p.tool for p in state.pending.values()] == ["corrector"]

    # Given one, the call made again (nothing was sent: it did not happen) applies both.
    (key,) = [p.key for p in state.pending.values()]
    resolved = CliRunner().invoke(cli, [
        "resolve", "delegator", key[:16], "--did-not-happen", "--by", "ana",
        "--store", store_url])
    assert resolved.exit_code == 0, resolved.output
    fixed = make_delegator(store_url, "delegator", ledger.url, child_durable=True, how=how)
    assert fixed.run_sync("close ledger-a").output == "delegated: corrected"
    effects = ledger.effects()
    assert effects["corrections"] == {"C-1": 1, "C-2": 1} and effects["replays"] == 0


@pytest.mark.parametrize("store_url", BACKENDS, indirect=True)
@pytest.mark.parametrize("how", ["run", "stream", "iter"])
def test_an_agent_with_its_own_durability_applies_each_of_its_calls_once(
        store_url: str, ledger: LedgerService, how: str) -> None:
    agent = make_delegator(store_url, "delegator", ledger.url, child_durable=True, how=how)
    output = agent.run_sync("close ledger-a").output
    assert output == "delegated: corrected"
    effects = ledger.effects()
    assert effects["corrections"] == {"C-1": 1, "C-2": 1} and effects["replays"] == 0
    child = fold(log_of(store_url, worker_run("delegator")))
    assert child.status == "finished" and len(child.completed) == 2
