"""Secrets never reach disk: a redaction policy is applied to every fact before it is
encoded, so no log, database, WAL, snapshot or CLI output holds the raw value."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from click.testing import CliRunner
from hypothesis import example, given, settings
from hypothesis import strategies as st

from agentjournal import Agent, EventType, ScriptedModel, calls, fold, open_store, reply
from agentjournal.cli import cli
from agentjournal.decisions import resolve_uncertain
from agentjournal.errors import EncodingError
from agentjournal.events import canonical_copy, encode_value
from agentjournal.models import ModelRequest, ModelResponse
from agentjournal.policy import RegexGuardrail
from agentjournal.redaction import DEFAULT_RULES, Redaction
from agentjournal.store import Store
from agentjournal.tools import Absent, ToolContext, tool

from .conftest import BACKENDS, POSTGRES_URL

E = EventType
CANARY = "sk-live-CANARY1234567890abcdefXYZ"


def canary_agent(seen: dict[str, Any]) -> Agent:
    @tool(effect="read_only")
    def login(token: str) -> str:
        seen["token"] = token  # the live tool gets the real value
        return "ok"

    @tool(effect="read_only")
    def fetch_config() -> dict[str, Any]:
        return {"api_key": CANARY, "region": "eu"}

    @tool(effect="read_only")
    def explode() -> str:
        raise RuntimeError(f"auth failed for key {CANARY}")

    @tool(effect="read_only")
    def keep(ctx: ToolContext) -> str:
        ctx.remember("key", CANARY)
        ctx.remember("nested", {"keys": [CANARY]})
        return "kept"

    def look(req: ModelRequest) -> ModelResponse:
        seen["context"] = [m.content for m in req.messages] + [str(req.memory)]
        return reply(f"finished; the key was {CANARY}")

    model = ScriptedModel([
        calls(("login", {"token": CANARY}), ("fetch_config", {}), ("explode", {}),
              ("keep", {}), text=f"I will use {CANARY} now"),
        look,
    ])
    return Agent(model, [login, fetch_config, explode, keep], snapshot_every=1)


def postgres_rows(url: str) -> list[bytes]:
    import psycopg

    schema = re.search(r"schema=([A-Za-z0-9_]+)", url)
    assert schema is not None
    out: list[bytes] = []
    with psycopg.connect(POSTGRES_URL) as conn:
        tables = conn.execute("SELECT table_name FROM information_schema.tables "
                              "WHERE table_schema = %s", (schema[1],)).fetchall()
        assert tables
        for (table,) in tables:
            for row in conn.execute(f'SELECT * FROM "{schema[1]}"."{table}"').fetchall():
                for value in row:
                    out.append(bytes(value) if isinstance(value, bytes | memoryview)
                               else str(value).encode())
            for (text,) in conn.execute(f'SELECT t::text FROM "{schema[1]}"."{table}" t'):
                out.append(text.encode())
    return out


def written_bytes(tmp_path: Path) -> list[bytes]:
    blobs = []
    for root, _dirs, files in os.walk(tmp_path):
        for name in files:
            blobs.append(Path(root, name).read_bytes())
    return blobs


@pytest.mark.parametrize("store_url", BACKENDS, indirect=True)
def test_a_secret_canary_reaches_no_byte_the_store_wrote(store_url: str, tmp_path: Path) -> None:
    seen: dict[str, Any] = {}
    store = open_store(store_url)
    try:
        result = canary_agent(seen).run(store, "r1", f"deploy with {CANARY}")
        assert result.status == "finished"
        log = list(store.read("r1"))
        assert store.snapshots("r1")
    finally:
        store.close()
    assert seen["token"] == CANARY  # the tool itself was given the value
    assert not any(CANARY in text for text in seen["context"])  # the model never sees it
    blobs = written_bytes(tmp_path)
    if store_url.startswith("postgresql"):
        blobs += postgres_rows(store_url)
    assert blobs
    assert sum(blob.count(CANARY.encode()) for blob in blobs) == 0
    # The events say that a redaction happened, and by which rule, never the value.
    redacted = [e for e in log if e.payload.get("redactions")]
    kinds = {e.type for e in redacted}
    assert {E.RUN_STARTED, E.USER_MESSAGE, E.MODEL_TURN, E.TOOL_CALL_STARTED,
            E.TOOL_CALL_COMPLETED, E.MEMORY_WRITTEN, E.RUN_FINISHED} <= kinds
    assert all(r == {"rule": "api_key", "count": r["count"]} for e in redacted
               for r in e.payload["redactions"])
    runner = CliRunner()
    for command in (["show", "r1"], ["show", "r1", "--json"], ["events", "r1"],
                    ["state", "r1", "--json"]):
        out = runner.invoke(cli, [*command, "--store", store_url],
                            env={"COLUMNS": "200", "AGENTJOURNAL_STORE": ""})
        assert out.exit_code == 0, out.output
        assert out.output and CANARY not in out.output


def test_live_and_replay_see_the_same_redacted_content(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'j.db'}")
    live: list[bytes] = []
    seen: dict[str, Any] = {}
    canary_agent(seen).run(store, "r1", "t", observer=lambda e, st: live.append(
        __import__("msgspec").json.encode(st)))
    log = list(store.read("r1"))
    import msgspec

    for seq, state in enumerate(live, start=1):
        assert msgspec.json.encode(fold(log[:seq])) == state
    assert "[redacted:api_key]" in fold(log).messages[-1].content


def test_literal_values_and_custom_rules(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'j.db'}")

    @tool(effect="read_only")
    def whoami() -> str:
        return "user hunter2-password, id EMP-0042"

    model = ScriptedModel([calls(("whoami", {})), reply("ok")])
    policy = Redaction(rules={"employee": r"EMP-\d{4}"}, values={"db_password": "hunter2-password"})
    Agent(model, [whoami], redaction=policy).run(store, "r1", "t")
    done = next(e for e in store.read("r1") if e.type is E.TOOL_CALL_COMPLETED)
    assert done.payload["result"] == "user [redacted:db_password], id [redacted:employee]"
    assert done.payload["redactions"] == [{"count": 1, "rule": "db_password"},
                                          {"count": 1, "rule": "employee"}]


def test_redaction_can_be_turned_off(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'j.db'}")
    Agent(ScriptedModel([reply(CANARY)]), [], redaction=Redaction.none()).run(store, "r1", "t")
    assert fold(store.read("r1")).outcome == CANARY


def test_a_redacting_guardrail_keeps_its_matches_off_disk(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    store = open_store(f"sqlite:///{path}")

    @tool(effect="read_only")
    def lookup(customer: str) -> dict[str, str]:
        return {"customer": customer, "card": "4242-4242-4242-4242"}

    model = ScriptedModel([calls(("lookup", {"customer": "ann"})), reply("ok")])
    card = RegexGuardrail("card", r"\d{4}(?:-\d{4}){3}")
    Agent(model, [lookup], guardrails=[card]).run(store, "r1", "my card 1111-2222-3333-4444")
    store.close()
    blobs = written_bytes(tmp_path)
    assert not any(b"4242-4242" in b or b"1111-2222" in b for b in blobs)
    store = open_store(f"sqlite:///{path}")
    log = list(store.read("r1"))
    assert [e.payload["name"] for e in log if e.type is E.GUARDRAIL_TRIGGERED] == ["card", "card"]
    state = fold(log)
    assert state.completed[next(iter(state.completed))].result == {
        "customer": "ann", "card": "[redacted]"}


def test_a_call_whose_arguments_were_redacted_is_never_retried_from_the_log(
    tmp_path: Path,
) -> None:
    store: Store = open_store(f"sqlite:///{tmp_path / 'j.db'}")
    sent: list[str] = []
    crash = [True]

    @tool(effect="idempotent")
    def charge(token: str) -> str:
        sent.append(token)
        if crash and crash.pop():
            raise TimeoutError("lost")  # uncertain; in this process the original is known
        return "charged"

    model = ScriptedModel([calls(("charge", {"token": CANARY})), reply("ok")])
    assert Agent(model, [charge]).run(store, "r1", "t").status == "finished"
    assert sent == [CANARY, CANARY]  # the live retry sends the original

    # After a crash (a fresh process: the original is gone) the call goes to a person.
    @tool(effect="idempotent", reconcile=lambda p: Absent())
    def charge2(token: str) -> str:
        sent.append(token)
        return "charged"

    started = [(E.RUN_STARTED, {"task": "t", "scope": "run:r2"}),
               (E.USER_MESSAGE, {"content": "t"})]
    agent = Agent(ScriptedModel([calls(("charge2", {"token": CANARY})), reply("ok")]),
                  [charge2])
    from agentjournal.journal import open_journal

    with open_journal(store, "r2") as j:
        j.record_all(started)
        j.record(E.MODEL_TURN, text="", tool_calls=[
            {"id": "c1", "name": "charge2", "args": {"token": CANARY}}], usage={})
        j.record(E.TOOL_CALL_STARTED, key=charge2.key("run:r2", {"token": CANARY}),
                 tool="charge2", args={"token": CANARY}, call_id="c1", effect="idempotent",
                 attempt=1)
    sent.clear()
    result = agent.run(store, "r2")
    assert result.status == "paused" and sent == []
    assert "redacted" in (result.pause_reason or "") or any(
        "redacted" in str(e.payload) for e in store.read("r2")
        if e.type is E.TOOL_CALL_RECONCILED)
    # A person says it did not happen: the model's call is not made with "[redacted]".
    resolve_uncertain(store, "r2", result.uncertain[0].key, outcome="did_not_happen", by="ana")
    again = agent.run(store, "r2")
    assert sent == []
    denied = [e.payload for e in store.read("r2") if e.type is E.TOOL_CALL_DENIED]
    assert denied and "redacted" in denied[0]["reason"]
    assert again.status == "finished"


@pytest.mark.parametrize(("rule", "sample"), [
    ("api_key", "sk-proj-abcdefghijklmnop1234"), ("api_key", "rk_live_abcdefghijklmnop1234"),
    ("aws_access_key", "AKIAIOSFODNN7EXAMPLE"),
    ("github_token", "ghp_" + "a1" * 18), ("github_token", "github_pat_" + "b2" * 11),
    ("slack_token", "xoxb-1234567890-abcdef"),
    ("bearer_token", "Authorization: Bearer abcdefghijklmnopqrstuvwxyz0123"),
    ("jwt", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9P"),
    ("private_key", "-----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY-----"),
    ("url_password", "postgresql://app:s3cr3t-pw@db.internal/prod"),
])
def test_every_default_rule_redacts_its_kind_of_secret(rule: str, sample: str) -> None:
    payload = Redaction().payload({"text": f"see {sample} here", "nested": [{sample: 1}]})
    secret = sample.split("Bearer ")[-1].split("://")[-1].split("@")[0]
    assert secret not in str(payload)
    assert payload["redactions"] == [{"rule": rule, "count": 2}]


def test_a_reused_call_id_never_borrows_an_earlier_calls_secret(tmp_path: Path) -> None:
    from agentjournal import ToolCall

    store = open_store(f"sqlite:///{tmp_path / 'j.db'}")
    sent: list[str] = []

    @tool(effect="read_only")
    def login(token: str) -> str:
        sent.append(token)
        return "ok"

    def turn(token: str) -> ModelResponse:
        return ModelResponse(tool_calls=[ToolCall(id="c1", name="login", args={"token": token})])

    model = ScriptedModel([turn(CANARY), turn("plain-token"), reply("ok")])
    assert Agent(model, [login]).run(store, "r1", "t").status == "finished"
    assert sent == [CANARY, "plain-token"]


def test_resuming_with_the_same_secret_bearing_task_is_a_plain_resume(tmp_path: Path) -> None:
    from agentjournal import RunMismatchError

    store = open_store(f"sqlite:///{tmp_path / 'j.db'}")
    agent = Agent(ScriptedModel([reply("ok")]), [])
    agent.run(store, "r1", f"deploy with {CANARY}")
    assert agent.run(store, "r1", f"deploy with {CANARY}").status == "finished"
    with pytest.raises(RunMismatchError) as info:  # the error shows no secret either
        agent.run(store, "r1", f"deploy now with {CANARY}")
    assert CANARY not in str(info.value) and "[redacted:api_key]" in str(info.value)


_PIECES = ["sk-", "sk_live_", "AKIA", "ghp_", "xoxb-", "Bearer", "Bearer ", "Bearer\n",
           "eyJ", "-----BEGIN", "://", "user:pw@", '"', "\\", "\n", "\t", "é", "a" * 20,
           "0123456789ABCDEFGHIJ", ".", " ", "abcdEFGH1234", "hunter2!"]
_texts = st.lists(st.sampled_from(_PIECES), max_size=8).map("".join)
_values = st.recursive(
    st.none() | st.integers() | st.floats(allow_nan=False) | _texts,
    lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner)
    | st.dictionaries(_texts, inner, max_size=4), max_leaves=12)


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(_texts, _values, max_size=5))
@example({"auth": "Bearer\n" + "a" * 24})  # the text holds "\\n", not a newline
@example({"note": 'say "hunter2!" twice'})
def test_the_one_search_shortcut_redacts_what_the_walk_redacts(payload: dict[str, Any]) -> None:
    """A payload's JSON text searched once stands in for the walk of its strings only
    where it decides the same: the default rules, a literal value, escapes and keys; an
    anchored custom rule is never taken the short way."""
    for redaction in (Redaction(), Redaction(values={"pw": "hunter2!"}),
                      Redaction(values={"quoted": '"hunter2!"'}),
                      Redaction(rules={"whole": r"^hunter2!$", **DEFAULT_RULES})):
        walked = Redaction()
        walked.rules, walked._hints = redaction.rules, redaction._hints
        walked._needles = None  # no shortcut: every string searched on its own
        assert canonical(redaction.payload(payload)) == canonical(walked.payload(payload))
        # What the journal records, searched in its canonical bytes: the same, or the
        # same refusal (an infinity) when make_events puts it in canonical form.
        assert (stored(lambda: redaction.recorded(payload))  # noqa: B023
                == stored(lambda: walked.payload(payload)))  # noqa: B023


def stored(recorded: Callable[[], dict[str, Any]]) -> bytes | str:
    """The canonical bytes of what ``recorded`` gives, or why they cannot be stored."""
    try:
        return encode_value(canonical_copy(recorded()))
    except EncodingError as exc:
        return str(exc)


def canonical(value: Any) -> Any:
    return msgspec.json.decode(msgspec.json.encode(value))


@pytest.mark.parametrize("text, redacted", [
    (f"tool_{CANARY}", "tool_[redacted:api_key]"),  # a key after an underscore
    ("TOKEN_ghp_" + "a" * 36, "TOKEN_[redacted:github_token]"),
    ("KEY_AKIAABCDEFGHIJKLMNOP", "KEY_[redacted:aws_access_key]"),
    ("SLACK_xoxb-1234567890-abc", "SLACK_[redacted:slack_token]"),
    ("risk-assessment-for-the-quarter", "risk-assessment-for-the-quarter"),  # in a word
    (f"é{CANARY}", f"é{CANARY}"),  # a letter before it: part of a word, as \\b had it
])
def test_a_key_is_found_after_an_underscore_but_not_inside_a_word(
        text: str, redacted: str) -> None:
    assert Redaction().scrub(text) == redacted
