"""`agentjournal compensate` end to end: the agent (tests/saga_ledger_agent.py) and the
saga each in their own process, against the demo's ledger service in its own; the
ledger's own state and counts are the evidence, never the library's view."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentjournal.demo.ledger import LedgerService, http_json

from .conftest import backend_params
from .test_crash_models import ROOT

AGENT = "tests.saga_ledger_agent:agent"


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[LedgerService]:
    service = LedgerService(tmp_path / "ledger.db").start()
    try:
        yield service
    finally:
        service.stop()


def cli(ledger: LedgerService, store_url: str, *args: str,
        **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agentjournal", *args, "--store", store_url], cwd=ROOT,
        env={**os.environ, "COLUMNS": "200", "SAGA_LEDGER": ledger.url, **env},
        capture_output=True, text=True, timeout=60)


def discrepancies(ledger: LedgerService) -> dict[str, int]:
    out = {}
    for name in ("ledger-a", "ledger-b"):
        status, body = http_json("GET", f"{ledger.url}/ledgers/{name}")
        assert status == 200, body
        out[name] = body["discrepancy"]
    return out


def applied(ledger: LedgerService) -> dict[str, Any]:
    return dict(ledger.effects()["corrections"])


@backend_params()
def test_compensate_puts_the_ledger_back_each_reversal_once(ledger: LedgerService,
                                                            store_url: str) -> None:
    start = discrepancies(ledger)
    ran = cli(ledger, store_url, "run", AGENT, "post three corrections", "--run-id", "q3")
    assert ran.returncode == 0, ran.stderr
    assert discrepancies(ledger) != start
    undone = cli(ledger, store_url, "compensate", "q3", "--reason", "wrong quarter",
                 "--by", "ana", "--json")
    assert undone.returncode == 0, undone.stderr
    result = json.loads(undone.stdout)
    assert result["status"] == "compensated" and len(result["undone"]) == 3
    assert result["remaining"] == [] and result["uncertain"] == []
    # The ledger's own word: back where it started, each correction and reversal once.
    assert discrepancies(ledger) == start
    assert applied(ledger) == {**{c: 1 for c in ("c1", "c2", "c3")},
                               **{f"rev-{c}": 1 for c in ("c1", "c2", "c3")}}
    # Again: nothing more is sent.
    again = cli(ledger, store_url, "compensate", "q3", "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["undone"] == result["undone"]
    assert applied(ledger)["rev-c1"] == 1
    shown = cli(ledger, store_url, "show", "q3")
    assert "saga: compensated, undone 3, left 0" in shown.stdout
    assert "saga_started" in shown.stdout and "saga_finished" in shown.stdout
    shown_json = json.loads(cli(ledger, store_url, "show", "q3", "--json").stdout)
    assert shown_json["saga"]["undone"] == result["undone"]
    state = json.loads(cli(ledger, store_url, "state", "q3").stdout)
    assert state["status"] == "compensated"
    assert state["saga_status"]["undone"] == result["undone"]
    assert state["saga_status"]["remaining"] == [] and state["saga_status"]["failures"] == {}


def test_an_uncertain_undo_is_listed_resolved_by_a_person_and_the_saga_goes_on(
        ledger: LedgerService, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'j.db'}"
    start = discrepancies(ledger)
    assert cli(ledger, url, "run", AGENT, "post three corrections", "--run-id", "q3",
               ).returncode == 0
    stopped = cli(ledger, url, "compensate", "q3", SAGA_LOSE_UNDO="1", SAGA_LOOKUP="unknown")
    assert stopped.returncode == 4, stopped.stderr
    assert "uncertain undo:" in stopped.stdout and "escalated: saga:" in stopped.stdout
    assert "agentjournal resolve q3" in stopped.stderr
    listed = json.loads(cli(ledger, url, "uncertain", "--json").stdout)
    assert [(r["kind"], r["run_id"], r["tool"]) for r in listed] == [
        ("compensation", "q3", "post_correction")]
    assert "compensation" in cli(ledger, url, "uncertain").stdout
    # Asked again with nothing decided: still stopped, the reversal not sent again.
    assert cli(ledger, url, "compensate", "q3", "--by", "agentjournal").returncode == 4
    assert applied(ledger)["rev-c3"] == 1
    # A person finds the reversal in the ledger and says so; the saga goes on.
    key = listed[0]["key"]
    resolved = cli(ledger, url, "resolve", "q3", key[:12], "--happened", "--by", "ana")
    assert resolved.returncode == 0, resolved.stderr
    done = cli(ledger, url, "compensate", "q3", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "compensated"
    assert discrepancies(ledger) == start
    assert all(n == 1 for n in applied(ledger).values()) and len(applied(ledger)) == 6
    assert json.loads(cli(ledger, url, "uncertain", "--json").stdout) == []


def test_compensate_names_what_it_needs(ledger: LedgerService, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'j.db'}"
    missing = cli(ledger, url, "compensate", "nope")
    assert missing.returncode == 2 and missing.stderr.startswith("error: ")


def test_cancel_with_compensate_undoes_what_a_waiting_run_did(ledger: LedgerService,
                                                             tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'j.db'}"
    start = discrepancies(ledger)
    ran = cli(ledger, url, "run", AGENT, "post three corrections", "--run-id", "q3",
              "--json", SAGA_APPROVE_LAST="1")
    assert json.loads(ran.stdout)["status"] == "waiting_approval"
    assert applied(ledger) == {"c1": 1, "c2": 1}
    cancelled = cli(ledger, url, "cancel", "q3", "--compensate", "--reason", "withdrawn",
                    "--json", SAGA_APPROVE_LAST="1")
    assert cancelled.returncode == 0, cancelled.stderr
    assert json.loads(cancelled.stdout)["status"] == "compensated"
    assert discrepancies(ledger) == start
    assert applied(ledger) == {"c1": 1, "c2": 1, "rev-c1": 1, "rev-c2": 1}
    # Nothing drives it again: no resume, no approval makes c3.
    resumed = cli(ledger, url, "resume", "q3", "--json", SAGA_APPROVE_LAST="1")
    assert json.loads(resumed.stdout)["status"] == "compensated"
    assert "c3" not in applied(ledger)
    timeline = cli(ledger, url, "show", "q3").stdout
    assert "run_cancelled" in timeline and "withdrawn" in timeline
    again = cli(ledger, url, "cancel", "q3")
    assert again.returncode == 2 and "nothing to cancel" in again.stderr
