"""The README's and the docs' code blocks run as written: each README Python block on its
own, as pasted into a fresh interpreter with no API key set, then each of its `agentjournal
...` commands, in one fresh directory, as a new user would; each page of docs/ and
docs/integrations/ its Python blocks in the order given, in one interpreter.

A block that cannot run here says so on its first line, where a reader sees it too:
``# needs a server: ...`` (e.g. Temporal) or ``# fragment: ...`` (a shape to fill in).
Used sparingly: every other block runs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).parents[1] / "README.md"
ROOT = README.parent
BLOCK = re.compile(r"```(\w+)\n(.*?)```", re.S)
DOCS = sorted([*ROOT.glob("docs/*.md"), *ROOT.glob("docs/integrations/*.md")])
#: The first line of a block the docs test does not run, and why (see the docstring).
NOT_RUN = re.compile(r"# (needs a server|fragment): \S")
PROVIDER_ENV = ("OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL")


def blocks(language: str) -> list[str]:
    return [code for lang, code in BLOCK.findall(README.read_text()) if lang == language]


def section(title: str) -> str:
    """The README's text from the heading ``## title`` to the next ``## `` heading."""
    text = README.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else None]


def python_blocks(page: Path) -> list[tuple[int, str]]:
    """The page's Python blocks with the line each starts on."""
    text = page.read_text()
    return [(text.count("\n", 0, m.start()) + 2, m.group(2)) for m in BLOCK.finditer(text)
            if m.group(1) == "python"]


def run_alone(code: str) -> None:
    exec(compile(code, str(README), "exec"), {"__name__": "__readme__"})


@pytest.fixture
def new_user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh directory and no provider key or base URL: what a new user starts with."""
    monkeypatch.chdir(tmp_path)
    for name in PROVIDER_ENV:
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def test_readme_python_blocks_each_run_alone(new_user: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    python = blocks("python")
    assert python, "the README lost its quickstart"
    for code in python:  # each block alone: a pasted block must not need an earlier one
        run_alone(code)
    printed = capsys.readouterr().out.splitlines()
    assert printed[:2] == ["finished Invoice sent.", "finished 1"]  # as its comments say
    assert "compensated 1 {}" in printed  # the saga block


def test_the_people_tour_approves_a_call_and_settles_an_uncertain_one(
    new_user: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = section("A person decides: approvals and uncertain calls")
    (code,) = [c for lang, c in BLOCK.findall(text) if lang == "python"]
    assert "policy=Rules(require_approval=[" in code
    run_alone(code)
    assert capsys.readouterr().out.splitlines() == [  # as its comments say
        "waiting_approval ['wire']", "finished 1", "paused ['wire']", "finished 2"]
    from agentjournal.decisions import NO_RESULT_GIVEN

    assert NO_RESULT_GIVEN in " ".join(text.split())  # the form it documents is the one used


def test_the_real_model_block_runs_against_the_bundled_stub(
    new_user: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (code,) = [c for lang, c in BLOCK.findall(section("Use a real model")) if lang == "python"]
    run_alone(code)
    assert capsys.readouterr().out.splitlines() == ["finished Invoiced acme for 500 cents."]


def test_the_stub_served_from_the_shell_runs_the_example(tmp_path: Path) -> None:
    """The README's turns.json, served by the stub's CLI, drives examples/real_model.py."""
    (shell,) = [c for lang, c in BLOCK.findall(section("Use a real model")) if lang == "sh"]
    turns = re.search(r"<<'EOF'\n(.*?)\nEOF\n", shell, re.S)
    assert turns is not None, shell
    (tmp_path / "turns.json").write_text(turns.group(1))
    stub = subprocess.Popen([sys.executable, "-m", "agentjournal.testing.llm_stub", "--script",
                             "turns.json"], cwd=tmp_path, stderr=subprocess.PIPE, text=True)
    try:
        assert stub.stderr is not None
        serving = re.match(r"serving (http://\S+) ", stub.stderr.readline())  # once listening
        assert serving is not None
        env = {**os.environ, "OPENAI_BASE_URL": serving.group(1) + "/v1", "OPENAI_API_KEY": "stub"}
        done = subprocess.run([sys.executable, str(ROOT / "examples" / "real_model.py")],
                              cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=120)
    finally:
        stub.terminate()
        stub.wait(timeout=60)
    assert done.returncode == 0, done.stderr
    assert '"outcome": "Posted 1 correction."' in done.stdout


def test_the_langgraph_block_runs_and_show_reads_its_thread(
    new_user: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("langgraph.graph")
    text = section("Run a LangGraph graph on it")
    (code,) = [c for lang, c in BLOCK.findall(text) if lang == "python"]
    run_alone(code)
    assert capsys.readouterr().out.splitlines() == ["4 You said: again"]
    (command,) = re.findall(r"`(agentjournal show [^`]+)`", text)
    done = subprocess.run([sys.executable, "-m", *command.split()], cwd=new_user,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "LangGraph thread customer-7: 6 checkpoint(s)" in done.stdout


def test_readme_commands_run(tmp_path: Path) -> None:
    quickstart = blocks("python")[0]
    subprocess.run([sys.executable, "-c", quickstart], cwd=tmp_path, check=True,
                   capture_output=True)
    commands = [line for code in blocks("bash") for line in code.splitlines()
                if line.startswith("agentjournal ")]
    assert "agentjournal demo" in commands
    for command in commands:
        args = command.split("#")[0].split()[1:]
        done = subprocess.run([sys.executable, "-m", "agentjournal", *args], cwd=tmp_path,
                              capture_output=True, text=True, timeout=120,
                              env={**os.environ, "TMPDIR": str(tmp_path)})  # demo's dir
        assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"


def test_the_pydantic_ai_block_runs_and_resumes(new_user: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    (code,) = [c for lang, c in BLOCK.findall(section("Make a Pydantic AI agent durable"))
               if lang == "python"]
    run_alone(code)
    assert capsys.readouterr().out.splitlines() == ["Refunded 500 cents on order 7."] * 2
    from agentjournal import fold, open_store

    with open_store("sqlite:///refunds.db") as store:
        log = list(store.read("order-7"))
    assert fold(log).status == "finished"
    assert sum(e.type == "tool_call_started" for e in log) == 1  # made once, replayed once


def test_the_openai_agents_block_runs_and_replays(new_user: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    (code,) = [c for lang, c in BLOCK.findall(section("Use the OpenAI Agents SDK"))
               if lang == "python"]
    run_alone(code)
    # One invoice and two model calls, then the same: the second run was served the log.
    assert capsys.readouterr().out.splitlines() == ["Invoiced acme. 1 2"] * 2


@pytest.mark.parametrize("page", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_each_docs_pages_python_blocks_run_in_order(page: Path, new_user: Path) -> None:
    """Each page's blocks, in the order given, in one namespace: a block may use what an
    earlier one on its page defined, as a reader pasting them in order would."""
    namespace: dict[str, object] = {"__name__": "__docs__"}
    name = page.relative_to(ROOT)
    for line, code in python_blocks(page):
        if NOT_RUN.match(code):
            continue
        try:
            exec(compile(code, f"{name}:{line}", "exec"), namespace)
        except Exception as exc:  # any failure names its block
            pytest.fail(f"{name}, the Python block at line {line} fails: "
                        f"{type(exc).__name__}: {exc}\n{code}", pytrace=False)


def test_blocks_not_run_are_few_and_say_why() -> None:
    """The markers are for blocks that truly cannot run here, each with its reason."""
    skipped = [f"{page.relative_to(ROOT)}:{line}" for page in DOCS
               for line, code in python_blocks(page) if NOT_RUN.match(code)]
    total = sum(len(python_blocks(page)) for page in DOCS)
    assert len(skipped) <= 4 and total >= 12, (skipped, total)
