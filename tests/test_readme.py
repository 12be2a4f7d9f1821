"""The README's code blocks run as written: its Python blocks, then each of its
`agentjournal ...` commands, in one fresh directory, as a new user would."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from agentjournal.testing.llm_stub import StubServer

README = Path(__file__).parents[1] / "README.md"
BLOCK = re.compile(r"```(\w+)\n(.*?)```", re.S)


def blocks(language: str) -> list[str]:
    return [code for lang, code in BLOCK.findall(README.read_text()) if lang == language]


def test_readme_python_blocks_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    python = blocks("python")
    assert python, "the README lost its quickstart"
    with StubServer() as stub:  # the real-model block talks to a local stub of the API
        monkeypatch.setenv("OPENAI_API_KEY", "test")
        monkeypatch.setenv("OPENAI_BASE_URL", stub.url + "/v1")
        namespace: dict[str, object] = {"__name__": "__readme__"}
        for code in python:  # one namespace: later blocks use the quickstart's tools
            exec(compile(code, str(README), "exec"), namespace)
        assert stub.counts["chat"] >= 1 and not stub.rejections
    printed = capsys.readouterr().out.splitlines()
    assert printed[:2] == ["finished Invoice sent.", "finished 1"]  # as its comments say
    assert "compensated 1 {}" in printed  # the saga block


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
