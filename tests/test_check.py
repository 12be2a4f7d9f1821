"""`agentjournal check` (and ``check_runs``): before a deploy, what a resume under the new code
would do to each unfinished run of an agent, read from a real store whose runs real child
processes made (killed with SIGKILL at fault points), the store left byte for byte as it was."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from agentjournal import open_store
from agentjournal.check import check_runs
from agentjournal.cli import cli
from agentjournal.errors import AgentRefError, RunMismatchError

from .conftest import BACKENDS, POSTGRES_URL, drop_schema, postgres_reason

ROOT = Path(__file__).resolve().parents[1]
HANG = 120  # seconds: a hang guard for a child, never a timing assertion

# The agent module as two releases write it (DEPLOY picks one at import): v2 renames
# `post` to `post_entry`, adds a read-only tool and a sentence to the instructions.
AGENTS = '''
import os

from agentjournal import Agent, ScriptedModel, calls, reply, tool

DEPLOY = os.environ.get("DEPLOY", "v1")


@tool(effect="irreversible", identity=["name"])
def post(name: str, amount: int = 0) -> dict:
    """Post an entry."""
    return {"posted": name}


@tool(effect="irreversible", identity=["name"])
def post_entry(name: str, amount: int = 0) -> dict:
    """Post an entry."""
    return {"posted": name}


@tool(effect="read_only")
def balance(name: str) -> dict:
    """Read a balance."""
    return {"balance": 0}


def script():
    return ScriptedModel([calls(("post", {"name": "a", "amount": 5})),
                          calls(("post", {"name": "b", "amount": 5})), reply("posted")])


if DEPLOY == "v1":
    agent = Agent(script(), [post], instructions="Post what you are asked.")
else:  # v2, or v2 strict: the agent refuses to resume a run of another version
    agent = Agent(script(), [post_entry, balance], strict=DEPLOY == "v2-strict",
                  instructions="Post what you are asked. Check the balance first.")
other = Agent(script(), [post])
not_an_agent = 42
'''

#: The runs the store holds: (run id, agent, fault point the child is killed at, or None).
RUNS = (("mid-call", "agent", "before_effect"),  # post a started, never completed
        ("between", "agent", "model_call:2"),  # post a done, killed asking the model again
        ("done", "agent", None),  # finished
        ("elsewhere", "other", "model_call:2"))  # another agent's, unfinished


@pytest.fixture(params=BACKENDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A store of its own directory (the agents' module and its bytecode live elsewhere),
    on sqlite; on every backend with --slow."""
    if request.param != "sqlite" and not request.config.getoption("--slow"):
        pytest.skip("on this backend with --slow (the default suite runs on sqlite)")
    (tmp_path / "store").mkdir()
    if request.param == "jsonl":
        yield f"jsonl:///{tmp_path / 'store'}"
    elif request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'store' / 'journal.db'}"
    else:
        if reason := postgres_reason():
            pytest.skip(reason)
        schema = f"t_{uuid.uuid4().hex[:16]}"
        yield f"{POSTGRES_URL}{'&' if '?' in POSTGRES_URL else '?'}schema={schema}"
        drop_schema(schema)


@pytest.fixture
def code(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A directory holding a fresh agents module, and the module's name."""
    directory, name = tmp_path / "code", f"deploy_agents_{uuid.uuid4().hex[:8]}"
    directory.mkdir()
    (directory / f"{name}.py").write_text(AGENTS)
    yield directory, name
    sys.modules.pop(name, None)


def run_child(url: str, code: tuple[Path, str], run_id: str, obj: str,
              fault: str | None) -> int:
    """`agentjournal run` under release v1 in a real child process; with ``fault``, it
    sends itself SIGKILL there."""
    directory, module = code
    env = {**os.environ, "DEPLOY": "v1", "AGENTJOURNAL_STORE": "",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    env.pop("AGENTJOURNAL_FAULT", None)
    if fault:
        env["AGENTJOURNAL_FAULT"] = fault
    child = subprocess.run([sys.executable, "-m", "agentjournal", "run", f"{module}:{obj}",
                            "Post a and b.", "--run-id", run_id, "--store", url],
                           cwd=directory, env=env, capture_output=True, text=True,
                           timeout=HANG)
    return child.returncode


def resume_child(url: str, code: tuple[Path, str], run_id: str, deploy: str) -> int:
    """`agentjournal resume` under release ``deploy`` in a real child process."""
    directory, _ = code
    env = {**os.environ, "DEPLOY": deploy, "AGENTJOURNAL_STORE": ""}
    env.pop("AGENTJOURNAL_FAULT", None)
    child = subprocess.run([sys.executable, "-m", "agentjournal", "resume", run_id, "--store",
                            url], cwd=directory, env=env, capture_output=True, text=True,
                           timeout=HANG)
    return child.returncode


def make_runs(url: str, code: tuple[Path, str]) -> None:
    for run_id, obj, fault in RUNS:
        returned = run_child(url, code, run_id, obj, fault)
        assert returned == (-9 if fault else 0), (run_id, returned)


def check(url: str, code: tuple[Path, str], *args: str, deploy: str = "v2",
          agent: str = "agent") -> Result:
    """`agentjournal check` in this process, the agents' module imported afresh as
    release ``deploy`` writes it."""
    directory, module = code
    sys.modules.pop(module, None)
    path = sys.path[:]
    result = CliRunner().invoke(cli, ["check", "--agent", f"{module}:{agent}", "--import-path",
                                      str(directory), "--store", url, *args],
                                env={"DEPLOY": deploy, "AGENTJOURNAL_STORE": "",
                                     "COLUMNS": "200"})
    assert sys.path == path  # the import path a worker has, only while loading the agent
    assert isinstance(result.exception, SystemExit | None), result.exception
    return result


def by_run(result: Result) -> dict[str, dict[str, Any]]:
    return {r["run_id"]: r for r in json.loads(result.stdout)["runs"]}


# --- what the store is: every byte, or every row ----------------------------------------


def fingerprint(url: str) -> dict[str, str]:
    """Every file under a local store's directory and its sha256; for PostgreSQL every
    row of every table of its schema (the runs' heads among them)."""
    if url.startswith("postgresql"):
        return _pg_rows(url.rpartition("schema=")[2])
    directory = Path(url.partition(":///")[2])
    directory = directory if directory.is_dir() else directory.parent
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def _pg_rows(schema: str) -> dict[str, str]:
    import psycopg

    with psycopg.connect(POSTGRES_URL) as conn:
        tables = [r[0] for r in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = %s ORDER BY 1", (schema,))]
        return {t: hashlib.sha256(repr(sorted(map(repr, conn.execute(
            f'SELECT * FROM "{schema}"."{t}"').fetchall()))).encode()).hexdigest()
            for t in tables}


# --- the runs, each reported as a resume would go ----------------------------------------


def test_check_says_what_a_deploy_does_to_each_open_run_and_changes_nothing(
        url: str, code: tuple[Path, str]) -> None:
    make_runs(url, code)
    before = fingerprint(url)
    assert before

    # Under the code that made them: nothing changed, every open run goes on.
    same = check(url, code, "--json", deploy="v1")
    assert same.exit_code == 0, same.stderr
    assert {r: v["action"] for r, v in by_run(same).items()} == {
        "mid-call": "continue", "between": "continue"}

    # Under v2: the run whose call to `post` is open pauses (its tool is gone); the one
    # between turns continues, and says what changed.
    new = check(url, code, "--json")
    assert new.exit_code == 4, new.stderr
    doc = json.loads(new.stdout)
    runs = by_run(new)
    assert set(runs) == {"mid-call", "between"}
    assert (doc["finished"], doc["other_agents"], doc["unreadable"]) == (1, 1, [])
    assert doc["counts"] == {"continue": 1, "pause": 1, "refuse": 0}
    paused, going = runs["mid-call"], runs["between"]
    assert paused["action"] == "pause" and [c["tool"] for c in paused["calls"]] == ["post"]
    assert "no longer in the agent" in paused["calls"][0]["why"]
    assert "agentjournal resolve mid-call" in paused["sentence"]
    assert going["action"] == "continue" and going["calls"] == []
    assert "instructions" in going["changes"] and "tools removed: post" in going["changes"]
    assert len(going["versions"]) == 1 and going["versions"][0] != doc["version"]

    # Strict (the agent's own, or asked for): every run whose version changed would be
    # refused; exit 5 wins over 4.
    for strict in (check(url, code, "--json", "--strict"),
                   check(url, code, "--json", deploy="v2-strict")):
        assert strict.exit_code == 5, strict.stderr
        assert {r: v["action"] for r, v in by_run(strict).items()} == {
            "mid-call": "refuse", "between": "refuse"}

    # For people: a table and a summary; named runs, a finished one among them.
    shown = check(url, code, "mid-call", "done")
    assert shown.exit_code == 4, shown.stderr
    assert "pause for a person" in shown.stdout and "post" in shown.stdout
    assert "done" in shown.stdout
    assert "2 run(s) of" in shown.stderr

    # The Python API says the same.
    with closing(open_store(url, readonly=True)) as store:
        directory, module = code
        sys.path.insert(0, str(directory))
        try:
            os.environ["DEPLOY"] = "v2"
            sys.modules.pop(module, None)
            forecasts = check_runs(store, f"{module}:agent")
        finally:
            os.environ.pop("DEPLOY", None)
            sys.path.remove(str(directory))
        assert {f.run_id: f.action for f in forecasts} == {"mid-call": "pause",
                                                          "between": "continue"}
        with pytest.raises(RunMismatchError, match="elsewhere"):
            check_runs(store, f"{module}:agent", sys.modules[module].agent,
                       run_ids=["elsewhere"])
    assert fingerprint(url) == before  # nothing appended, no lease, no lock, no file

    # And a resume under v2 does what check said: it pauses the one, continues the other.
    assert resume_child(url, code, "mid-call", "v2") == 4
    assert resume_child(url, code, "between", "v2") == 0


# --- bad input: one line, the documented code ---------------------------------------------


def test_bad_input_gets_one_line_and_its_exit_code(tmp_path: Path,
                                                   code: tuple[Path, str]) -> None:
    url = f"sqlite:///{tmp_path / 'store' / 'journal.db'}"
    (tmp_path / "store").mkdir()
    make_runs(url, code)
    before = fingerprint(url)
    _, module = code
    cases = [
        (["--agent", "not a ref"], 2, "not MODULE:OBJECT"),
        (["--agent", f"{module}:_private"], 2, "private"),
        (["--agent", f"{module}:not_an_agent"], 2, "not an Agent"),
        (["--agent", f"{module}:agent", "--trust", "elsewhere"], 2, "not among the agents"),
        (["--agent", "os:getcwd"], 2, "agent 'os:getcwd'"),  # a builtin: never called
        (["--agent", f"{module}:agent", "elsewhere"], 2, "agent"),  # another agent's run
        (["--agent", f"{module}:agent", "nosuch"], 2, "nosuch"),
    ]
    for args, exit_code, needle in cases:
        result = _invoke(code, ["check", *args, "--store", url])
        assert result.exit_code == exit_code, (args, result.stdout, result.stderr)
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], (
            args, result.stderr)
        assert result.stdout == ""
    # A store it cannot read: none there, or not a store.
    missing = _invoke(code, ["check", "--agent", f"{module}:agent", "--store",
                             f"sqlite:///{tmp_path / 'nosuch.db'}"])
    assert missing.exit_code == 2 and "no store at" in missing.stderr
    (tmp_path / "junk.db").write_bytes(b"not a database at all" * 100)
    junk = _invoke(code, ["check", "--agent", f"{module}:agent", "--store",
                          f"sqlite:///{tmp_path / 'junk.db'}"])
    assert junk.exit_code == 3 and len(junk.stderr.splitlines()) == 1, junk.stderr
    assert not (tmp_path / "nosuch.db").exists()
    assert fingerprint(url) == before
    with pytest.raises(AgentRefError):
        check_runs(open_store(url, readonly=True), f"{module}:not_an_agent")


def _invoke(code: tuple[Path, str], args: list[str]) -> Result:
    directory, module = code
    sys.modules.pop(module, None)
    return CliRunner().invoke(cli, [*args, "--import-path", str(directory)],
                              env={"DEPLOY": "v2", "AGENTJOURNAL_STORE": ""})


def test_check_help_says_its_exit_codes() -> None:
    result = CliRunner().invoke(cli, ["check", "--help"])
    assert result.exit_code == 0
    assert "--agent MODULE:OBJECT" in result.stdout
    assert "5  some run would be refused" in result.stdout
    assert "4  some run would pause for a person" in result.stdout


# --- show, runs and the viewer: which version started a run, which continued it -----------


def test_show_runs_and_the_viewer_say_which_versions_ran_it_and_what_request_changed(
        tmp_path: Path, code: tuple[Path, str]) -> None:
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from agentjournal import EventType
    from agentjournal.journal import open_journal
    from agentjournal.ui import Viewer

    (tmp_path / "store").mkdir()
    url = f"sqlite:///{tmp_path / 'store' / 'journal.db'}"
    assert run_child(url, code, "between", "agent", "model_call:2") == -9
    assert resume_child(url, code, "between", "v2") == 0
    # What an integration records when a framework asks a recorded turn again, changed.
    with closing(open_store(url)) as store, open_journal(store, "between") as journal:
        journal.record(EventType.REQUEST_CHANGED, step="poster__model.request", n=0,
                       recorded="sha256:aaaaaaaaaaaa", asked="sha256:bbbbbbbbbbbb",
                       changed=["instructions", "tools"], seq=3)
        first, *later = journal.state.versions
    assert later and later[0] != first  # run_resumed recorded v2

    shown = CliRunner().invoke(cli, ["show", "between", "--store", url],
                               env={"COLUMNS": "250"})
    assert shown.exit_code in (0, 4), shown.stderr
    assert f"started by version {first}, continued by {later[0]}" in shown.stdout
    assert "instructions, tools changed since it was asked" in shown.stdout
    doc = json.loads(CliRunner().invoke(cli, ["show", "between", "--json", "--store", url]
                                        ).stdout)
    assert doc["versions"] == {"started_by": first, "continued_by": later}
    assert [c["changed"] for c in doc["request_changes"]] == [["instructions", "tools"]]
    listed = json.loads(CliRunner().invoke(cli, ["runs", "--json", "--store", url]).stdout)
    assert [r["versions"] for r in listed] == [[first, *later]]

    viewer = Viewer(url)
    try:
        client = TestClient(viewer.app, base_url="http://127.0.0.1")
        run = client.get("/runs/between.json").json()["run"]
        assert run["versions"] == [first, *later]
        assert [c["changed"] for c in run["request_changes"]] == [["instructions", "tools"]]
        page = client.get("/runs/between").text
        assert f"continued by {later[0]}" in page and 'id="request-changes"' in page
    finally:
        viewer.close()


def test_the_bench_measures_check_beside_reading_each_run(tmp_path: Path) -> None:
    from agentjournal.bench import run_bench
    from agentjournal.bench._common import SMOKE

    # (the Postgres URL only because CI=true demands one reachable; check runs on sqlite)
    judged, resumed = run_bench(quick=True, postgres_url=POSTGRES_URL, workdir=tmp_path,
                                plan=SMOKE, only=["check"], progress=lambda _: None)
    assert judged.name == f"check.{SMOKE.check_runs}" and judged.unit == "µs/run"
    assert resumed.name == f"check.resume_changed.{SMOKE.agent_steps[0]}"
    assert resumed.unit == "µs/step"
    for figure in (judged, resumed):  # (how fast is not a test)
        assert figure.value and figure.floor and figure.ratio


# --- a framework's agent: described by its integration, its runs by the name they record --

PYDANTIC_AGENTS = '''
from pydantic_ai import Agent
from pydantic_ai.models.test import TestModel

poster = Agent(TestModel(), name="poster", instructions="Post what you are asked.")


@poster.tool_plain
def post_entry(label: str) -> str:
    """Post the entry named label (post_effect, renamed)."""
    return label
'''


def test_a_pydantic_ai_agent_is_checked_against_the_runs_it_recorded(tmp_path: Path) -> None:
    pytest.importorskip("pydantic_ai")
    from agentjournal import EventType
    from agentjournal.journal import open_journal
    from agentjournal.keys import run_scope

    directory, module = tmp_path / "code", f"pyd_agents_{uuid.uuid4().hex[:8]}"
    directory.mkdir()
    (directory / f"{module}.py").write_text(PYDANTIC_AGENTS)
    (tmp_path / "store").mkdir()
    url = f"sqlite:///{tmp_path / 'store' / 'journal.db'}"
    # What the integration recorded before the release renamed post_effect: a call
    # started, never completed (its process was killed).
    args = {"label": "a"}
    with closing(open_store(url)) as store, open_journal(store, "pyd-1") as journal:
        journal.record_all([
            (EventType.RUN_STARTED, {"task": "Post a.", "agent": "pydantic_ai:poster",
                                     "scope": run_scope("pyd-1"), "agent_version": "old"}),
            (EventType.USER_MESSAGE, {"content": "Post a."}),
            (EventType.MODEL_TURN, {"text": "", "tool_calls": [
                {"id": "call-a", "name": "post_effect", "args": args}]}),
            (EventType.TOOL_CALL_STARTED, {"key": "k-" + "0" * 30, "tool": "post_effect",
                                           "args": args, "call_id": "call-a",
                                           "effect": "irreversible", "attempt": 1})])
    before = fingerprint(url)
    try:
        base = ["check", "--agent", f"{module}:poster", "--import-path", str(directory),
                "--store", url, "--json"]
        unnamed = CliRunner().invoke(cli, base)
        assert unnamed.exit_code == 0, unnamed.stderr
        assert json.loads(unnamed.stdout)["other_agents"] == 1  # recorded under its name
        named = CliRunner().invoke(cli, [*base, "--recorded-as", "pydantic_ai:poster"])
        assert named.exit_code == 4, named.stderr
        (run,) = json.loads(named.stdout)["runs"]
        assert (run["run_id"], run["action"]) == ("pyd-1", "pause")
        assert [c["tool"] for c in run["calls"]] == ["post_effect"]
    finally:
        sys.modules.pop(module, None)
    assert fingerprint(url) == before


def test_a_run_it_cannot_read_is_reported_beside_the_others_with_exit_3(
        tmp_path: Path, code: tuple[Path, str]) -> None:
    (tmp_path / "store").mkdir()
    url = f"jsonl:///{tmp_path / 'store'}"
    assert run_child(url, code, "between", "agent", "model_call:2") == -9
    assert run_child(url, code, "damaged", "agent", "model_call:2") == -9
    log = tmp_path / "store" / "damaged.jsonl"
    log.write_bytes(log.read_bytes().replace(b"Post a and b.", b"Post a and c.", 1))
    before = fingerprint(url)
    result = check(url, code, "--json")
    assert result.exit_code == 3, result.stderr
    doc = json.loads(result.stdout)
    assert [r["run_id"] for r in doc["runs"]] == ["between"]  # the others still judged
    assert len(doc["unreadable"]) == 1 and "damaged" in doc["unreadable"][0]
    errors = result.stderr.splitlines()
    assert len(errors) == 1 and errors[0].startswith("error: ") and "damaged" in errors[0]
    assert fingerprint(url) == before
