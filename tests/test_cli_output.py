"""What `agentjournal` prints for people and scripts: the timeline's labels, queued runs,
tokens and cost, layouts at narrow widths, --limit, help, and one exit-code convention."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import struct
import sys
import termios
from pathlib import Path
from typing import Any

import click
import openai
import pytest

from agentjournal import (
    Agent,
    EventType,
    ModelError,
    ModelRequest,
    ModelResponse,
    Price,
    cost_of,
    fold,
    make_events,
    open_store,
)
from agentjournal.cli import cli
from agentjournal.providers import OpenAIChatModel
from agentjournal.state import Usage, durable_fields
from agentjournal.testing.llm_stub import Reply, StubServer
from agentjournal.testing.llm_stub import Usage as StubUsage

from .test_cli import agents, as_json, check, invoke

__all__ = ["agents"]  # a fixture, shared with test_cli

E = EventType


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
    assert row["queue"] == {"name": "nightly", "state": "queued", "worker": None,
                            "reason": None, "pin_version": None, "waiting_for": None}
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


# --- 15. tokens, cost (or "unknown price"), latency and duration -----------------------


def test_cost_comes_from_the_maintained_list_with_overrides_on_top() -> None:
    usage = Usage(input_tokens=1_000_000, output_tokens=1_000_000)
    # Not in the built-in table of ten: priced by genai-prices, not $0.
    listed = cost_of(usage, "gemini-2.5-flash")
    assert listed is not None and listed > 0
    assert cost_of(usage, "gemini-2.5-flash", {"gemini-2.5": Price(1.0, 2.0)}) == 3.0
    assert cost_of(usage, "my-local-llm") is None  # unknown: never a false $0
    assert cost_of(usage, "my-local-llm", {"my-local-llm": Price(0.0, 0.0)}) == 0.0
    # Counts genai-prices refuses (a provider's odd report) fall back to the table.
    odd = Usage(input_tokens=10, cached_input_tokens=20, output_tokens=1)
    assert cost_of(odd, "gpt-4o") == pytest.approx((20 * 1.25 + 1 * 10.0) / 1e6)


def test_without_genai_prices_the_built_in_table_prices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "genai_prices", None)  # as if not installed
    usage = Usage(input_tokens=1_000_000, output_tokens=1_000_000)
    assert cost_of(usage, "gpt-4o") == 12.5
    assert cost_of(usage, "gemini-2.5-flash") is None


def test_an_old_log_with_cost_0_folds_as_before() -> None:
    turn = {"text": "hi", "tool_calls": [], "usage": {"input_tokens": 3, "output_tokens": 2,
                                                     "cost_usd": 0.0}}
    state = fold(make_events("r", 0, 0, [(E.RUN_STARTED, {"task": "t"}), (E.MODEL_TURN, turn)]))
    assert state.cost_usd == 0.0 and state.unpriced_turns == 0
    assert "unpriced_turns" not in durable_fields(state)


def test_show_and_runs_print_tokens_cost_latency_and_duration(each_backend: str) -> None:
    url = each_backend
    with StubServer() as stub:
        for run_id, model in (("local", "my-local-llm"), ("listed", "gpt-4o")):
            stub.script([Reply(text="hi", usage=StubUsage(input=20, output=7, cached=5))])
            with openai.OpenAI(base_url=stub.url + "/v1", api_key="test") as client:
                run_with(url, run_id, OpenAIChatModel(client, model))
    shown = as_json(invoke("show", "local", "--json", "--store", url))
    turn = next(e for e in shown["events"] if e["type"] == "model_turn")
    assert turn["payload"]["usage"]["cost_usd"] is None  # recorded as unknown, not 0
    assert shown["usage"]["cost_usd"] is None and shown["usage"]["unpriced_turns"] == 1
    assert shown["usage"]["model_latency_s"] > 0 and shown["usage"]["duration_s"] >= 0
    assert shown["usage"]["input_tokens"] == 20

    local = check(invoke("show", "local", "--store", url), 0).stdout
    assert "20 in (5 cached) / 7 out, unknown price" in local
    assert "usage: 1 turn, 20 in (5 cached) / 7 out tokens, unknown price, model " in local
    assert "duration " in local and "$0 " not in local
    listed = check(invoke("show", "listed", "--store", url), 0).stdout
    assert "20 in (5 cached) / 7 out, $0.0001" in listed  # 15*2.5 + 5*1.25 + 7*10 per 1M

    rows = {r["run_id"]: r for r in as_json(invoke("runs", "--json", "--store", url))}
    assert rows["local"]["cost_usd"] is None and rows["local"]["unpriced_turns"] == 1
    assert rows["listed"]["cost_usd"] == pytest.approx((15 * 2.5 + 5 * 1.25 + 7 * 10) / 1e6)
    for row in rows.values():
        assert (row["turns"], row["input_tokens"], row["output_tokens"],
                row["cached_input_tokens"]) == (1, 20, 7, 5)
        assert row["duration_s"] >= 0
    table = check(invoke("runs", "--store", url), 0).stdout
    assert "unknown price" in table and "20/7" in table


# --- 16. narrow terminals, --limit, bare help, exit codes ---------------------------------


def finished_runs(url: str, n: int) -> list[str]:
    """``n`` finished runs, oldest first (hand-made logs: a turn that cost $0.25 each)."""
    store = open_store(url)
    ids = [f"run-{i:03d}" for i in range(n)]
    try:
        for run_id in ids:
            turn = {"text": "ok", "tool_calls": [], "latency_ms": 840.0,
                    "usage": {"input_tokens": 1200, "output_tokens": 30, "cost_usd": 0.25}}
            store.append(run_id, make_events(run_id, 0, 0, [
                (E.RUN_STARTED, {"task": "t"}), (E.MODEL_TURN, turn),
                (E.RUN_FINISHED, {"outcome": "ok"})]), expected_seq=0, epoch=0)
    finally:
        store.close()
    return ids


RUNS_HEADERS = ("run", "status", "events", "started", "last activity", "uncertain",
                "approvals", "tokens in/out", "cost", "duration")


def header_cells(text: str) -> list[str]:
    """The header cells of the first table in ``text`` (rich's heavy-box header row)."""
    row = next(line for line in text.splitlines() if line.startswith("┃"))
    return [cell.strip() for cell in row.strip("┃").split("┃")]


@pytest.mark.parametrize("columns", [60, 80, 120])
def test_runs_shows_fewer_whole_columns_on_a_narrow_terminal(url: str, columns: int) -> None:
    finished_runs(url, 3)
    text = check(invoke("runs", "--store", url, env={"COLUMNS": str(columns)}), 0).stdout
    lines = text.splitlines()
    assert all(len(line) <= columns for line in lines)
    headers = header_cells(text)
    assert set(headers) <= set(RUNS_HEADERS), headers  # none cut, none blank
    assert {"run", "status", "uncertain", "approvals"} <= set(headers)  # kept the longest
    assert len([line for line in lines if line.startswith("┃")]) == 1  # no wrapped header
    for row in (line for line in lines if line.startswith("│")):
        cells = [cell.strip() for cell in row.strip("│").split("│")]
        assert all(cells) and not any("…" in cell for cell in cells), row
        assert cells[0].startswith("run-") and ("$0.25" in cells) == ("cost" in headers)
    wide = header_cells(check(invoke("runs", "--store", url), 0).stdout)  # COLUMNS=200
    assert tuple(wide) == RUNS_HEADERS


def test_runs_fits_a_real_60_column_terminal(url: str) -> None:
    finished_runs(url, 2)
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    exe = Path(sys.executable).parent / "agentjournal"
    pid, fd = pty.fork()
    if pid == 0:  # the child: a terminal of 24 rows, 60 columns
        fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 60, 0, 0))
        os.execve(exe, [str(exe), "runs", "--store", url], env)
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # the child exited: EIO
            break
        if not chunk:
            break
        chunks.append(chunk)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(chunks).decode())
    lines = [line for line in text.splitlines() if line.strip()]
    assert lines and all(len(line) <= 60 for line in lines), lines
    headers = header_cells(text)
    assert {"run", "status", "uncertain", "approvals"} <= set(headers) <= set(RUNS_HEADERS)


def test_runs_lists_the_newest_first_up_to_a_limit(each_backend: str) -> None:
    url = each_backend
    ids = finished_runs(url, 60)
    listed = check(invoke("runs", "--store", url), 0)
    rows = [line for line in listed.stdout.splitlines() if line.startswith("│")]
    assert len(rows) == 50  # the default
    assert "the newest 50 of 60 runs" in listed.stderr and "--all" in listed.stderr
    newest = [r["run_id"] for r in as_json(invoke("runs", "--limit", 5, "--json",
                                                  "--store", url))]
    assert newest == ids[::-1][:5]
    assert len(as_json(invoke("runs", "--all", "--json", "--store", url))) == 60
    every = check(invoke("runs", "--all", "--store", url), 0)
    assert every.stderr == ""
    check(invoke("runs", "--limit", 0, "--store", url), 1, "--limit")


def test_bare_agentjournal_prints_its_help_and_exits_0() -> None:
    result = invoke()
    assert result.exit_code == 0 and result.stderr == ""
    assert "Usage: agentjournal" in result.stdout and "Exit codes" in result.stdout


def test_every_commands_help_lists_the_exit_codes() -> None:
    names = cli.list_commands(click.Context(cli))
    for name in names:
        text = check(invoke(name, "--help"), 0).stdout
        assert "Exit codes" in text, name
        assert "4 stopped: a person must decide" in " ".join(text.split()), name


def test_run_resume_and_compensate_exit_4_when_a_person_must_decide(
        url: str, agents: str) -> None:
    stopped = invoke("run", f"{agents}:approving", "post it", "--run-id", "r1", "--store", url)
    assert stopped.exit_code == 4 and "waiting_approval" in stopped.stdout, stopped.stderr
    assert invoke("resume", "r1", "--store", url).exit_code == 4
    (pending,) = as_json(invoke("approvals", "--json", "--store", url))
    check(invoke("approve", "r1", pending["approval_id"], "--store", url), 0)
    check(invoke("resume", "r1", "--store", url), 0, "run r1: finished")
    flaky = invoke("run", f"{agents}:flaky", "post it", "--run-id", "r2", "--json",
                   "--store", url)
    assert flaky.exit_code == 4 and json.loads(flaky.stdout)["status"] == "paused"


# --- what needs a person is the last thing a narrow terminal drops ------------------------

WIRE = {"account": "DE89370400440532013000", "cents": 990000, "memo": "supplier invoice 2026-11"}
WIRE_AGENTS = f"""
from agentjournal import Agent, Rules, ScriptedModel, calls, reply, tool


@tool(effect="irreversible")
def wire(account: str, cents: int, memo: str) -> str:
    \"\"\"Wire money.\"\"\"
    raise TimeoutError("no answer from the bank")


def script():
    return ScriptedModel([calls(("wire", {WIRE!r})), reply("done")])


approving = Agent(script(), [wire], policy=Rules(require_approval=["wire"]))
unsure = Agent(script(), [wire])
"""


@pytest.mark.parametrize("columns", [60, 80])
def test_what_needs_a_person_is_the_last_thing_a_narrow_terminal_drops(
        url: str, columns: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = f"wire_agents_{columns}"
    (tmp_path / f"{module}.py").write_text(WIRE_AGENTS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    env = {"COLUMNS": str(columns)}
    args = json.dumps(WIRE, sort_keys=True)
    # The arguments a person approves are shown whole at any width, on a line that ends
    # with them (the terminal wraps it; nothing is cut).
    said = invoke("run", f"{module}:approving", "pay", "--run-id", "pay-approve",
                  "--store", url, env=env)
    assert said.exit_code == 4 and any(line.endswith(args) for line in
                                       said.stdout.splitlines()), said.stdout
    assert invoke("run", f"{module}:unsure", "pay", "--run-id", "pay-unsure", "--store", url,
                  env=env).exit_code == 4
    finished_runs(url, 2)
    listed = check(invoke("runs", "--store", url, env=env), 0).stdout
    headers = header_cells(listed)
    assert {"run", "status", "uncertain", "approvals"} <= set(headers), headers
    assert all(len(line) <= columns for line in listed.splitlines())
    shown = {cells[0]: cells for cells in (
        [c.strip() for c in row.strip("│").split("│")] for row in listed.splitlines()
        if row.startswith("│"))}
    at = {h: i for i, h in enumerate(headers)}
    assert shown["pay-approve"][at["approvals"]] == "1"
    assert shown["pay-unsure"][at["uncertain"]] == "1"
    approvals = check(invoke("approvals", "--store", url, env=env), 0).stdout
    assert any(line.endswith(args) for line in approvals.splitlines()), approvals
    assert "…" not in approvals, approvals
    unsure = check(invoke("uncertain", "--store", url, env=env), 0).stdout
    assert {"run", "tool", "key", "risk"} <= set(header_cells(unsure)), unsure
    assert "…" not in unsure, unsure
    sys.modules.pop(module, None)
