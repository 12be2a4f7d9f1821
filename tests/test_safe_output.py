"""Output for people is safe: terminal escapes, control characters and invisible or
bidi characters from a run's content are shown, never executed; rich markup in content
is text; JSON output keeps the exact value, only spelling dangerous characters as
``\\uXXXX``."""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from agentjournal import EventType, make_events, open_store
from agentjournal.cli import cli
from agentjournal.cli._safe import json_text, visible

E = EventType

# A clipboard write (OSC 52), a screen clear, a carriage return that overwrites the line,
# BEL, a C1 CSI, a bidi override, a zero-width space, a tag character, rich markup.
EVIL = ("[bold]x[/bold][link=https://e.test]l[/link]\x1b]52;c;ZXZpbA==\x07\x1b[2J\rover"
        "\x9b31m\u202eevil\u200b\U000e0041")
ARGS = {"name": EVIL, "amount": 5}


def hazards(text: str) -> set[str]:
    """Characters a terminal acts on, or that make text display as other than it is."""
    return {c for c in text if c != "\n" and unicodedata.category(c) in
            ("Cc", "Cf", "Cs", "Zl", "Zp")}


def strings(value: Any) -> list[str]:
    """Every string in a JSON value."""
    if isinstance(value, str):
        return [value]
    items = value.values() if isinstance(value, dict) else value if isinstance(
        value, list) else []
    return [s for item in items for s in strings(item)]


def invoke(*args: Any) -> Result:
    return CliRunner().invoke(cli, [str(a) for a in args],
                              env={"COLUMNS": "200", "AGENTJOURNAL_STORE": ""})


def ok(result: Result) -> str:
    assert isinstance(result.exception, SystemExit | None), result.exception
    assert result.exit_code == 0, (result.stdout, result.stderr)
    assert not hazards(result.stdout) and not hazards(result.stderr), (
        hazards(result.stdout) | hazards(result.stderr))
    return result.stdout


@pytest.fixture
def url(tmp_path: Path) -> str:
    """A run whose task, model text, tool args, tool result, tool error, denial and
    approval request all carry EVIL; one call is left uncertain, one approval open."""
    url = f"sqlite:///{tmp_path / 'j.db'}"
    started = {"key": "k" * 64, "tool": "post", "args": ARGS, "call_id": "c1",
               "effect": "irreversible", "attempt": 1}
    facts: list[tuple[EventType, dict[str, Any]]] = [
        (E.RUN_STARTED, {"task": "task " + EVIL, "scope": "run:r1"}),
        (E.USER_MESSAGE, {"content": "task " + EVIL}),
        (E.MODEL_TURN, {"text": EVIL, "tool_calls": [
            {"id": "c1", "name": "post", "args": ARGS},
            {"id": "c2", "name": "post", "args": ARGS},
            {"id": "c3", "name": "evil\nfake line", "args": {}}]}),
        (E.TOOL_CALL_STARTED, started),
        (E.TOOL_CALL_UNCERTAIN, {"started_seq": 4, "key": "k" * 64,
                                 "error": "TimeoutError: " + EVIL}),
        (E.TOOL_CALL_STARTED, {**started, "key": "j" * 64, "call_id": "c2"}),
        (E.TOOL_CALL_COMPLETED, {"call_id": "c2", "tool": "post", "started_seq": 6,
                                 "idempotency_key": "j" * 64, "result": {"echo": EVIL}}),
        (E.TOOL_CALL_DENIED, {"call_id": "c3", "tool": "evil\nfake line", "key": None,
                              "reason": "unknown tool " + EVIL}),
        (E.APPROVAL_REQUESTED, {"approval_id": "approval-1", "key": "m" * 64,
                                "tool": "post", "args": ARGS, "call_id": "c4",
                                "reason": "ask " + EVIL}),
    ]
    store = open_store(url)
    try:
        store.append("r1", make_events("r1", 0, 0, facts), expected_seq=0, epoch=0)
    finally:
        store.close()
    return url


def test_visible_shows_escapes_and_keeps_plain_text() -> None:
    assert visible("a\x1b[2Jb\x07c\rd\x9be") == "a\\x1b[2Jb\\x07c\\x0dd\\x9be"
    assert visible("\u202eabc\u200b\U000e0041\u2028\ud800") == (
        "<U+202E>abc<U+200B><U+E0041><U+2028><U+D800>")
    assert visible("two\nlines\tand tab") == "two\\x0alines\\x09and tab"
    assert visible("two\nlines\tand tab", multiline=True) == "two\nlines\tand tab"
    plain = "plain, ünïcödé, 漢字, emoji 🙂, [bold]markup[/bold], C:\\path"
    assert visible(plain) == plain
    assert visible(visible(EVIL)) == visible(EVIL)  # applying it twice changes nothing


def test_json_text_escapes_what_msgspec_leaves_raw_and_keeps_the_value() -> None:
    text = json_text(b'{"a": "' + "\x85\u202e\u200b\U000e0041\u2028ü🙂".encode() + b'"}')
    assert not hazards(text)
    assert json.loads(text) == {"a": "\x85\u202e\u200b\U000e0041\u2028ü🙂"}
    assert "ü🙂" in text  # printable non-ASCII is kept as it is


def test_show_timeline_makes_escapes_visible_one_line_per_event(url: str) -> None:
    timeline = ok(invoke("show", "r1", "--store", url))
    assert "\\x1b]52;c;ZXZpbA==\\x07\\x1b[2J" in timeline and "<U+202E>e" in timeline
    assert "[bold]x[/bold][link=https://e.test]l[/link]" in timeline  # markup is text
    assert len(timeline.splitlines()) == 2 + 9  # a newline in a tool name made no line


def test_show_at_prints_state_with_escapes_visible(url: str) -> None:
    state = ok(invoke("show", "r1", "--at", 9, "--store", url))
    assert "task: task [bold]x[/bold]" in state and "\\x1b]52;c;" in state
    assert "<U+202E>" in state and "ask [bold]x" in state  # the pending approval


@pytest.mark.parametrize("command", [["show", "r1", "--json"], ["state", "r1"],
                                     ["uncertain", "--json"], ["approvals", "--json"]])
def test_json_output_keeps_the_exact_content_and_no_raw_escape(url: str,
                                                               command: list[str]) -> None:
    text = ok(invoke(*command, "--store", url))
    assert any(EVIL in s for s in strings(json.loads(text)))
    assert json.loads(ok(invoke("runs", "--json", "--store", url)))[0]["run_id"] == "r1"


def test_events_lines_are_json_with_the_exact_payloads(url: str) -> None:
    lines = ok(invoke("events", "r1", "--store", url)).splitlines()
    first = json.loads(lines[0])
    assert first["payload"]["task"] == "task " + EVIL and len(lines) == 9
    assert json.loads(lines[2])["payload"]["tool_calls"][2]["name"] == "evil\nfake line"


def test_listings_make_escapes_visible(url: str) -> None:
    assert "TimeoutError: [bold]x" in ok(invoke("uncertain", "--store", url))
    listing = ok(invoke("approvals", "--store", url))
    assert "[bold]x[/bold][link=https://e.test]l[/link]\\x1b]52;c;" in listing
    assert "r1" in ok(invoke("runs", "--store", url))


def test_decisions_print_their_events_safely(url: str) -> None:
    denied = ok(invoke("deny", "r1", "approval-1", "--reason", "no " + EVIL, "--by", "ana",
                       "--store", url))
    assert "no [bold]x[/bold]" in denied and "<U+202E>" in denied
    resolved = ok(invoke("resolve", "r1", "kkkk", "--happened", "--result",
                         json.dumps({"r": EVIL}), "--by", "ana", "--json", "--store", url))
    assert json.loads(resolved)[1]["payload"]["result"] == {"r": EVIL}


# --- error lines and run results print through _base and running ------------------------


def test_error_lines_make_escapes_visible(url: str) -> None:
    store = open_store(url)
    try:
        store.append("r1", make_events("r1", 9, 0, [(E.APPROVAL_REQUESTED, {
            "approval_id": "approval-\x1b]52;c;eA==\x07", "key": "n" * 64, "tool": "post",
            "args": {}, "call_id": "c5", "reason": ""})]), expected_seq=9, epoch=0)
    finally:
        store.close()
    refused = invoke("approve", "r1", "approval-nope", "--store", url)
    assert refused.exit_code == 2 and "approval-\\x1b]52;c;" in refused.stderr
    assert not hazards(refused.stderr)


def test_run_prints_the_outcome_with_escapes_visible(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "evil_agent.py").write_text(
        "from agentjournal import Agent, ScriptedModel, reply\n"
        f"agent = Agent(ScriptedModel([reply({EVIL!r})]), [])\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    result = invoke("run", "evil_agent:agent", "t", "--run-id", "r9", "--store",
                    f"sqlite:///{tmp_path / 'run.db'}")
    assert result.exit_code == 0, result.stderr
    assert "\\x1b]52;c;" in result.stdout and not hazards(result.stdout)
