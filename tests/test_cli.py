"""The `agentjournal` command line, driven through its real entry point against real stores:
every command, the decisions a person makes, and every kind of bad input."""

from __future__ import annotations

import getpass
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result

from agentjournal import Agent, EventType, ScriptedModel, fold, make_events, open_store, reply
from agentjournal.cli import cli
from agentjournal.snapshots import write_snapshot

E = EventType

# Agents for `agentjournal run`, written to a module in the test's directory. ``post``
# counts what it applied; a name in FAIL_NEXT times out once (an uncertain call).
AGENTS = '''
from agentjournal import Agent, Rules, ScriptedModel, ToolContext, calls, reply, tool

APPLIED: dict[str, int] = {}
FAIL_NEXT = {"c"}


@tool(effect="irreversible", identity=["name"])
def post(ctx: ToolContext, name: str, amount: int = 0) -> dict:
    """Post an entry."""
    if name in FAIL_NEXT:
        FAIL_NEXT.discard(name)
        raise TimeoutError("read timed out")
    APPLIED[name] = APPLIED.get(name, 0) + 1
    return {"name": name, "n": APPLIED[name]}


def script(name):
    return ScriptedModel([calls(("post", {"name": name, "amount": 5})), reply("posted")])


def plain():
    return Agent(script("a"), [post])


approving = Agent(script("b"), [post], policy=Rules(require_approval=["post"]))


def flaky():
    return Agent(script("c"), [post])


def needs_args(x):
    return plain()
'''


def invoke(*args: Any, env: dict[str, str] | None = None) -> Result:
    # A wide terminal, so table cells are not cut; no store from the caller's environment.
    environment = {"COLUMNS": "200", "AGENTJOURNAL_STORE": "", **(env or {})}
    return CliRunner().invoke(cli, [str(a) for a in args], env=environment)


def check(result: Result, code: int, *needles: str) -> Result:
    """``result`` exited with ``code`` by SystemExit (never a stray exception), and its
    error line names each needle."""
    assert isinstance(result.exception, SystemExit | None), result.exception
    assert result.exit_code == code, (result.stdout, result.stderr)
    if code:
        assert result.stderr.startswith("error: ") and "Traceback" not in result.stderr
    for needle in needles:
        assert needle in (result.stderr if code else result.stdout), (needle, result.stderr)
    return result


def as_json(result: Result) -> Any:
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'journal.db'}"


@pytest.fixture
def agents(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The name of a fresh module holding AGENTS, importable from the current directory."""
    name = f"cli_agents_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(AGENTS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield name
    sys.modules.pop(name, None)


def applied(agents: str) -> dict[str, int]:
    return dict(sys.modules[agents].APPLIED)


def run(url: str, agents: str, obj: str, run_id: str) -> Result:
    result = invoke("run", f"{agents}:{obj}", "post it", "--run-id", run_id, "--store", url)
    # Only `plain` finishes: the others stop for a person (an approval, an uncertain call).
    assert result.exit_code == (0 if obj == "plain" else 4), (result.stdout, result.stderr)
    return result


def append_raw(url: str, run_id: str, *facts: tuple[EventType, dict[str, Any]]) -> None:
    """A hand-made log, for states a scripted agent does not reach easily."""
    store = open_store(url)
    try:
        store.append(run_id, make_events(run_id, 0, 0, facts), expected_seq=0, epoch=0)
    finally:
        store.close()


# --- run and inspection ----------------------------------------------------------------


def test_run_then_inspect_with_runs_show_events_and_state(url: str, agents: str) -> None:
    result = run(url, agents, "plain", "r1")
    assert "run r1: finished" in result.stdout and applied(agents) == {"a": 1}
    (row,) = as_json(invoke("runs", "--json", "--store", url))
    last = row["events"]
    assert row["run_id"] == "r1" and row["status"] == "finished" and last >= 6
    assert row["uncertain"] == 0 and row["approvals"] == 0 and row["agent"].endswith(":plain")
    assert as_json(invoke("runs", "--status", "paused", "--json", "--store", url)) == []
    check(invoke("runs", "--store", url), 0, "r1", "finished")

    timeline = check(invoke("show", "r1", "--store", url), 0).stdout.splitlines()
    assert len(timeline) == 2 + last  # a title, usage, then one line per event
    assert "run_started" in timeline[2] and "run_finished" in timeline[-1]
    at = check(invoke("show", "r1", "--at", 2, "--store", url), 0, "as of seq 2", "post it")
    assert "user" in at.stdout and "pending approvals: none" in at.stdout
    shown = as_json(invoke("show", "r1", "--at", 3, "--json", "--store", url))
    assert [e["seq"] for e in shown["events"]] == [1, 2, 3]
    assert shown["state"]["last_seq"] == 3 and ": post(" in shown["events"][2]["summary"]
    check(invoke("show", "r1", "--at", last + 1, "--store", url), 1, f"1..{last}")

    lines = check(invoke("events", "r1", "--store", url), 0).stdout.splitlines()
    assert [json.loads(line)["seq"] for line in lines] == list(range(1, last + 1))
    after = check(invoke("events", "r1", "--after", 3, "--store", url), 0).stdout.splitlines()
    assert json.loads(after[0])["seq"] == 4 and len(after) == last - 3

    assert as_json(invoke("state", "r1", "--at", 3, "--json", "--store", url))["last_seq"] == 3
    final = as_json(invoke("state", "r1", "--store", url))
    assert final["status"] == "finished" and final["outcome"] == "posted"

    # The same command again resumes the finished run: nothing is applied twice.
    run(url, agents, "plain", "r1")
    assert applied(agents) == {"a": 1}


def test_store_comes_from_the_environment(url: str, agents: str) -> None:
    run(url, agents, "plain", "r1")
    rows = as_json(invoke("runs", "--json", env={"AGENTJOURNAL_STORE": url}))
    assert [r["run_id"] for r in rows] == ["r1"]


def test_run_json_and_generated_run_id(url: str, agents: str) -> None:
    out = as_json(invoke("run", f"{agents}:plain", "post it", "--json", "--store", url))
    assert out["status"] == "finished" and out["run_id"].startswith("run-")
    assert out["uncertain"] == [] and out["approvals"] == []


@pytest.mark.parametrize("run_id", ["", "   "])
def test_an_empty_run_id_is_refused_not_replaced(url: str, agents: str, run_id: str) -> None:
    # RUN_ID="" from a supervisor that lost its id must not start a second run.
    run(url, agents, "plain", "r1")
    check(invoke("run", f"{agents}:plain", "post it", "--run-id", run_id, "--store", url), 2,
          "invalid run id", "empty", "new_run_id()")
    assert [r["run_id"] for r in as_json(invoke("runs", "--json", "--store", url))] == ["r1"]
    assert applied(agents) == {"a": 1}


def test_run_with_another_task_under_an_existing_id_is_refused(url: str, agents: str) -> None:
    run(url, agents, "plain", "r1")
    last = as_json(invoke("state", "r1", "--store", url))["last_seq"]
    check(invoke("run", f"{agents}:plain", "post something else", "--run-id", "r1",
                 "--store", url), 2, "'post it'", "'post something else'",
          "agentjournal resume r1", "new run id")
    check(invoke("run", f"{agents}:flaky", "post it", "--run-id", "r1", "--store", url), 2,
          f"'{agents}:plain'", f"'{agents}:flaky'")
    assert as_json(invoke("state", "r1", "--store", url))["last_seq"] == last


def test_verify_checks_snapshots_against_a_full_replay(url: str, agents: str) -> None:
    run(url, agents, "plain", "r1")
    run(url, agents, "plain", "r2")
    check(invoke("verify", "r1", "--store", url), 0, "r1: ok")
    reports = as_json(invoke("verify", "--all", "--json", "--store", url))
    assert sorted(r["run_id"] for r in reports) == ["r1", "r2"] and all(r["ok"] for r in reports)
    check(invoke("verify", "--store", url), 1, "either a RUN or --all")
    check(invoke("verify", "nope", "--store", url), 2, "run 'nope' has no events")

    store = open_store(url)  # a snapshot that lies about seq 3
    try:
        lying = fold(list(store.read("r1"))[:3])
        lying.turns = 99
        assert write_snapshot(store, lying) is not None
    finally:
        store.close()
    check(invoke("verify", "r1", "--store", url), 3, "r1: a snapshot plus its tail differs")
    assert "snapshot at seq 3: turns" in invoke("verify", "r1", "--store", url).stdout


# --- approvals -------------------------------------------------------------------------


def test_approve_then_resume_makes_the_call_once(url: str, agents: str) -> None:
    result = run(url, agents, "approving", "r2")
    assert "waiting_approval" in result.stdout and "agentjournal approve r2 approval-" in (
        result.stderr)
    (pending,) = as_json(invoke("approvals", "--json", "--store", url))
    assert pending["run_id"] == "r2" and pending["tool"] == "post" and pending["age_s"] >= 0
    assert pending["args"] == {"name": "b", "amount": 5}
    check(invoke("approvals", "--store", url), 0, pending["approval_id"])

    check(invoke("approve", "r2", "approval-nope", "--store", url), 2, "no open approval")
    decided = check(invoke("approve", "r2", pending["approval_id"], "--by", "ana", "--reason",
                           "ok", "--store", url), 0, "approval_decided",
                    "agentjournal resume r2")
    assert "appended seq " in decided.stdout
    assert as_json(invoke("approvals", "--json", "--store", url)) == []
    assert applied(agents) == {}
    check(invoke("resume", "r2", "--store", url), 0, "run r2: finished")
    assert applied(agents) == {"b": 1}
    state = as_json(invoke("state", "r2", "--store", url))
    assert state["decisions"][pending["approval_id"]]["by"] == "ana"


def test_deny_reaches_the_model_and_defaults_to_the_os_user(url: str, agents: str) -> None:
    run(url, agents, "approving", "r3")
    (pending,) = as_json(invoke("approvals", "--json", "--store", url))
    check(invoke("deny", "r3", pending["approval_id"], "--store", url), 1, "--reason")
    appended = as_json(invoke("deny", "r3", pending["approval_id"], "--reason", "too big",
                              "--json", "--store", url))
    assert appended[0]["type"] == "approval_decided"
    assert appended[0]["payload"]["by"] == getpass.getuser()
    check(invoke("resume", "r3", "--store", url), 0, "finished")
    assert applied(agents) == {}
    state = as_json(invoke("state", "r3", "--store", url))
    assert any("too big" in m["content"] for m in state["messages"])


# --- uncertain calls -------------------------------------------------------------------


def test_uncertain_then_resolve_happened_is_not_called_again(url: str, agents: str) -> None:
    result = run(url, agents, "flaky", "r4")
    assert "run r4: paused" in result.stdout and "agentjournal resolve r4" in result.stderr
    (call,) = as_json(invoke("uncertain", "--json", "--store", url))
    assert call["run_id"] == "r4" and call["tool"] == "post" and call["risk"] == "irreversible"
    assert "TimeoutError" in call["last_error"] and call["age_s"] >= 0
    check(invoke("uncertain", "--store", url), 0, call["key"][:16], "irreversible")

    resolved = check(invoke("resolve", "r4", call["key"][:8], "--happened", "--result",
                            '{"name": "c", "n": 1}', "--by", "ana", "--store", url), 0,
                     "tool_call_reconciled", "tool_call_completed", "agentjournal resume r4")
    assert "found" in resolved.stdout
    assert as_json(invoke("uncertain", "--json", "--store", url)) == []
    check(invoke("resume", "r4", "--store", url), 0, "finished")
    assert applied(agents) == {}  # a person said it happened: the tool is not called again


def test_resolve_did_not_happen_retries_and_conflict_escalates(url: str, agents: str) -> None:
    run(url, agents, "flaky", "r5")
    (call,) = as_json(invoke("uncertain", "--json", "--store", url))
    check(invoke("resolve", "r5", call["key"], "--did-not-happen", "--store", url), 0, "absent")
    check(invoke("resume", "r5", "--store", url), 0, "finished")
    assert applied(agents) == {"c": 1}

    sys.modules[agents].FAIL_NEXT.add("c")
    run(url, agents, "flaky", "r6")
    (call,) = as_json(invoke("uncertain", "--json", "--store", url))
    check(invoke("resolve", "r6", call["key"], "--conflict", "--reason", "another entry",
                 "--store", url), 0, "run_escalated")
    assert as_json(invoke("state", "r6", "--store", url))["status"] == "escalated"


@pytest.mark.parametrize("flags, message", [
    (["--happened", "--conflict"], "exactly one of"),
    ([], "exactly one of"),
    (["--happened", "--result", "{not json"], "--result is not valid JSON"),
    (["--happened", "--result", "NaN"], "--result is not valid JSON"),
    (["--did-not-happen", "--result", "1"], "--result goes with --happened only"),
])
def test_resolve_refuses_bad_flags(url: str, agents: str, flags: list[str], message: str) -> None:
    run(url, agents, "flaky", "r7")
    (call,) = as_json(invoke("uncertain", "--json", "--store", url))
    check(invoke("resolve", "r7", call["key"], *flags, "--store", url), 1, message)
    still = as_json(invoke("uncertain", "--json", "--store", url))
    assert [c["key"] for c in still] == [call["key"]]


def test_resolve_names_an_unknown_or_ambiguous_key(url: str) -> None:
    started = {"tool": "post", "args": {}, "call_id": "c", "effect": "irreversible"}
    append_raw(url, "r8", (E.RUN_STARTED, {"task": "t"}),
               (E.TOOL_CALL_STARTED, {**started, "key": "abc1" + "0" * 60}),
               (E.TOOL_CALL_STARTED, {**started, "key": "abc2" + "0" * 60}))
    check(invoke("resolve", "r8", "abc", "--happened", "--store", url), 1, "matches 2")
    check(invoke("resolve", "r8", "", "--happened", "--store", url), 1, "must not be empty")
    check(invoke("resolve", "r8", "fff", "--happened", "--store", url), 2,
          "no open uncertain call 'fff'")
    check(invoke("resolve", "r8", "abc2", "--did-not-happen", "--store", url), 0, "absent")


# --- fork and resume -------------------------------------------------------------------


def test_fork_prints_the_new_id_and_the_fork_resumes(url: str, agents: str) -> None:
    run(url, agents, "plain", "r1")
    forked = check(invoke("fork", "r1", "--at", 3, "--new-id", "r1b", "--store", url), 0)
    assert forked.stdout == "r1b\n" and "agentjournal resume r1b" in forked.stderr
    origin = as_json(invoke("state", "r1b", "--store", url))["origin"]
    assert origin == {"run_id": "r1", "at_seq": 3}
    check(invoke("resume", "r1b", "--store", url), 0, "run r1b: finished")
    check(invoke("fork", "r1", "--at", 2, "--new-id", "r1b", "--store", url), 1,
          "already exists")
    check(invoke("fork", "r1", "--at", 999, "--store", url), 1, "fork at one of them")
    check(invoke("fork", "r1", "--at", 2, "--new-id", "../x", "--store", url), 2,
          "invalid run id")
    generated = check(invoke("fork", "r1", "--at", 2, "--store", url), 0).stdout.strip()
    assert generated.startswith("r1.fork-")


def test_resume_needs_a_recorded_agent(url: str) -> None:
    store = open_store(url)
    try:
        Agent(ScriptedModel([reply("done")]), []).run(store, "anon", "t")
    finally:
        store.close()
    check(invoke("resume", "anon", "--store", url), 1, "recorded no agent",
          "agentjournal run MODULE:OBJECT t --run-id anon")


def test_a_run_leased_by_a_live_worker_is_refused(url: str, agents: str) -> None:
    run(url, agents, "approving", "busy")
    store = open_store(url)
    try:
        store.acquire("busy", "another-host:1:abc", ttl=60)
    finally:
        store.close()
    check(invoke("resume", "busy", "--store", url), 2, "leased by 'another-host:1:abc'")
    check(invoke("run", f"{agents}:approving", "t", "--run-id", "busy", "--store", url), 2,
          "leased by")


@pytest.mark.parametrize("ref, message", [
    ("no_such_module_xyz:agent", "cannot import module 'no_such_module_xyz'"),
    ("justaname", "is not MODULE:OBJECT"),
    ("{agents}:missing", "has no 'missing'"),
    ("{agents}:APPLIED", "not an Agent"),
    ("{agents}:needs_args", "not an Agent or a zero-argument callable"),
])
def test_run_names_a_bad_agent_ref(url: str, agents: str, ref: str, message: str) -> None:
    check(invoke("run", ref.format(agents=agents), "t", "--store", url), 1, message)


# --- bad input -------------------------------------------------------------------------


@pytest.mark.parametrize("command", [
    ["show", "nope"], ["show", "nope", "--at", "1"], ["events", "nope"], ["state", "nope"],
    ["resume", "nope"], ["approve", "nope", "approval-x"], ["fork", "nope", "--at", "1"],
    ["resolve", "nope", "abc", "--happened"],
])
def test_unknown_run_is_not_found(url: str, agents: str, command: list[str]) -> None:
    run(url, agents, "plain", "r1")  # the store exists; the run does not
    check(invoke(*command, "--store", url), 2, "run 'nope' has no events")


@pytest.mark.parametrize("command", [["runs"], ["show", "r1"], ["events", "r1"],
                                     ["state", "r1"], ["approvals"], ["uncertain"],
                                     ["resume", "r1"], ["approve", "r1", "approval-x"]])
@pytest.mark.parametrize("kind", ["sqlite", "jsonl"])
def test_missing_store_is_reported_and_not_created(
    tmp_path: Path, command: list[str], kind: str
) -> None:
    target = tmp_path / ("missing.db" if kind == "sqlite" else "missing-dir")
    check(invoke(*command, "--store", f"{kind}:///{target}"), 2, f"no store at {target}")
    assert not target.exists()


@pytest.mark.parametrize("kind", ["sqlite", "jsonl"])
def test_a_file_that_is_not_a_store_is_refused_untouched(tmp_path: Path, kind: str) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("shopping: milk, eggs\n" * 50)
    for command in (["runs"], ["show", "r1"], ["run", "x:y", "t"]):
        check(invoke(*command, "--store", f"{kind}:///{notes}"), 3,
              f"{notes} is not an agentjournal store")
    assert notes.read_text() == "shopping: milk, eggs\n" * 50


def test_a_damaged_sqlite_file_exits_3_and_a_missing_directory_1(
    tmp_path: Path, url: str, agents: str
) -> None:
    run(url, agents, "plain", "r1")
    damaged = tmp_path / "damaged.db"
    damaged.write_bytes((tmp_path / "journal.db").read_bytes()[:4096])  # a valid header only
    check(invoke("runs", "--store", f"sqlite:///{damaged}"), 3, "database disk image is malformed")
    check(invoke("run", f"{agents}:plain", "t", "--store", f"sqlite:///{tmp_path}/no/j.db"), 1,
          f"the directory {tmp_path / 'no'} does not exist")


def test_corrupt_log_exits_3_and_other_runs_still_show(tmp_path: Path, agents: str) -> None:
    url = f"jsonl:///{tmp_path / 'runs'}"
    run(url, agents, "plain", "good")
    run(url, agents, "plain", "bad")
    log = tmp_path / "runs" / "bad.jsonl"
    lines = log.read_bytes().split(b"\n")
    lines[2] = lines[2].replace(b'"seq":3', b'"seq":4')  # breaks the checksum mid-log
    log.write_bytes(b"\n".join(lines))
    check(invoke("show", "bad", "--store", url), 3, "run 'bad' is corrupt at seq 3")
    check(invoke("runs", "--store", url), 3, "run 'bad' is corrupt")
    check(invoke("show", "good", "--store", url), 0, "run_finished")


@pytest.mark.parametrize("store, code, message", [
    ("ftp://example.org/x", 1, "unknown scheme 'ftp'"),
    ("sqlite://", 1, "no database file named"),
    ("sqlite:///db.sqlite?durability=sometimes", 1, "durability must be"),
])
def test_bad_store_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, store: str, code: int,
                       message: str) -> None:
    monkeypatch.chdir(tmp_path)
    check(invoke("run", "x:y", "t", "--store", store), code, message)
    if "durability" not in store:  # a reading command finds no file there first
        check(invoke("runs", "--store", store), code, message)


@pytest.mark.parametrize("command, message", [
    (["show", "../x"], "invalid run id '../x'"),
    (["events", "a/b"], "invalid run id 'a/b'"),
    (["run", "x:y", "t", "--run-id", "../x"], "invalid run id"),
])
def test_invalid_run_id(url: str, agents: str, command: list[str], message: str) -> None:
    run(url, agents, "plain", "r1")
    command = [c.replace("x:y", f"{agents}:plain") for c in command]
    check(invoke(*command, "--store", url), 2, message)


@pytest.mark.parametrize("command, message", [
    (["runs", "--bogus"], "No such option '--bogus' (see 'agentjournal runs --help')"),
    (["show"], "Missing argument 'RUN'"),
    (["runs", "--status", "sleeping"], "'sleeping' is not one of"),
    (["show", "r1", "--at", "0"], "0 is not in the range x>=1"),
    (["nosuchcommand"], "No such command 'nosuchcommand'"),
])
def test_usage_errors_exit_1(url: str, command: list[str], message: str) -> None:
    check(invoke(*command, "--store", url), 1, message, "--help")


def test_every_command_has_help_with_an_example() -> None:
    check(invoke("--help"), 0, "Example")
    names = cli.list_commands(click.Context(cli))
    assert {"bench", "compensate", "cancel"} <= set(names)  # lazily loaded ones too
    for name in names:
        check(invoke(name, "--help"), 0, "Example", "Usage: ")


def test_real_entry_point_pipes_json_lines_and_maps_errors(url: str, agents: str) -> None:
    run(url, agents, "plain", "r1")
    exe = Path(sys.executable).parent / "agentjournal"
    done = subprocess.run([exe, "events", "r1", "--store", url], capture_output=True,
                          text=True, timeout=30, check=False)
    assert done.returncode == 0 and done.stderr == ""
    assert all(json.loads(line)["run_id"] == "r1" for line in done.stdout.splitlines())
    done = subprocess.run([exe, "show", "nope", "--store", url], capture_output=True,
                          text=True, timeout=30, check=False)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("error: run 'nope' has no events")
    assert "Traceback" not in done.stderr
