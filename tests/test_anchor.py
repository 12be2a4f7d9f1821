"""A store's own record anchors its runs (issue 42, item 2.5).

Each run's head (its last seq and digest) is what the newest events are checked
against. Removing it together with the store's own record of keeping heads
(``_store.json`` and ``<run>.head`` in JSONL; the ``heads`` and ``store_info`` tables
in SQLite; the ``runs`` table, which holds the heads, in PostgreSQL) must not make a
forged run pass: records written by a release that keeps heads prove that a head
existed, and a record cannot claim a version older than what it carries.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from click.testing import CliRunner, Result

from agentjournal import (
    Agent,
    EventType,
    ScriptedModel,
    calls,
    make_events,
    open_store,
    reply,
    tool,
)
from agentjournal import events as events_module
from agentjournal.errors import CorruptLogError, CorruptStoreError
from agentjournal.events import (
    SCHEMA_VERSION,
    Event,
    chain_digest,
    decode_stored,
    encode,
    newer_than_labelled,
    seal,
)
from agentjournal.snapshots import write_snapshot
from agentjournal.state import fold
from agentjournal.store import Store
from agentjournal.store import sqlite as sqlite_module
from agentjournal.store.base import UnanchoredLogError, decode_record
from agentjournal.tools import ToolContext

from .conftest import POSTGRES_URL
from .test_store_conformance import delete_stored, rewrite_stored

RUN = "refund-a1"


@tool(effect="idempotent")
def refund(ctx: ToolContext, order: str, cents: int) -> str:
    """Refund ``cents`` on ``order``."""
    return f"refunded {cents} cents on {order}"


def a_run(store: Store) -> list[Event]:
    """A real agent's run: a refund, then the model's answer (two batches at least)."""
    agent = Agent(ScriptedModel([calls(("refund", {"order": "A1", "cents": 500})),
                                 reply("refunded 500 cents on A1")]), [refund])
    assert agent.run(store, RUN, "refund order A1").status == "finished"
    return list(store.read(RUN))


def verify(url: str, *args: str) -> Result:
    return CliRunner().invoke(cli(), ["verify", RUN, *args, "--store", url],
                              env={"COLUMNS": "200", "AGENTJOURNAL_STORE": ""})


def cli() -> Any:
    from agentjournal.cli import cli as command

    return command


# --- the forgeries (each by the backend's own means, as someone with write access) -------


def forge_newest(store: Store, log: list[Event]) -> str:
    """The newest event (the outcome) changed, its digest recomputed from the one before."""
    last = log[-1]
    forged = msgspec.structs.replace(last, payload={"outcome": "refunded 50000 cents"},
                                     digest="")
    digest = chain_digest(log[-2].digest, encode(forged))
    rewrite_stored(store, RUN, last, encode(msgspec.structs.replace(forged, digest=digest)))
    return "refunded 50000 cents"


def drop_tail(store: Store, log: list[Event]) -> str:
    """The newest event deleted: the run now ends before its outcome."""
    delete_stored(store, RUN, log[-1].seq)
    return log[-2].type.value


def relabel_as_v3(store: Store, log: list[Event]) -> str:
    """Every record relabelled as v3, which had no digests: an old log, free to edit."""
    for event in log:
        raw = msgspec.json.decode(encode(event))
        del raw["digest"]
        raw["v"] = 3
        body = msgspec.json.encode(dict(sorted(raw.items())))
        rewrite_stored(store, RUN, event, body)
    return "v3"


ATTACKS: dict[str, Callable[[Store, list[Event]], str]] = {
    "resealed_newest": forge_newest, "dropped_tail": drop_tail, "relabelled_v3": relabel_as_v3,
}


def remove_the_store_s_record(url: str, backend: str) -> None:
    """What a release before heads would have left: no heads, no record of keeping them."""
    if backend == "jsonl":
        directory = Path(url.removeprefix("jsonl:///"))
        for path in (directory / "_store.json", directory / f"{RUN}.head"):
            path.unlink()
    else:
        db = sqlite3.connect(url.removeprefix("sqlite:///"))
        db.execute("DROP TABLE heads")
        db.execute("DROP TABLE store_info")
        db.execute(f"PRAGMA user_version = {sqlite_module._HEADS - 1}")
        db.commit()
        db.close()


def store_files(url: str) -> dict[str, bytes]:
    path = Path(url.removeprefix("jsonl:///").removeprefix("sqlite:///"))
    files = path.iterdir() if path.is_dir() else [path]
    return {p.name: p.read_bytes() for p in files if p.is_file()}


@pytest.mark.parametrize("store_url", ["jsonl", "sqlite"], indirect=True)
@pytest.mark.parametrize("attack", list(ATTACKS))
def test_a_forgery_with_the_store_s_record_removed_is_damage(
    store_url: str, attack: str
) -> None:
    backend = store_url.split(":", 1)[0]
    with open_store(store_url) as store:
        log = a_run(store)
        assert {e.v for e in log} == {SCHEMA_VERSION}
        ATTACKS[attack](store, log)
    remove_the_store_s_record(store_url, backend)
    before = store_files(store_url)
    result = verify(store_url)
    assert result.exit_code == 3, (result.stdout, result.stderr)
    if attack == "relabelled_v3":  # the records themselves say they are newer than v3
        assert "labelled v3 but holds" in result.stderr
        assert "it was relabelled" in result.stderr
    else:
        assert f"is a v{SCHEMA_VERSION} record" in result.stderr
        assert "keeps each run's head" in result.stderr
    assert "Traceback" not in result.stderr
    shown = CliRunner().invoke(cli(), ["show", RUN, "--store", store_url],
                               env={"COLUMNS": "200", "AGENTJOURNAL_STORE": ""})
    assert shown.exit_code == 3 and "50000" not in shown.stdout
    assert store_files(store_url) == before  # reading wrote nothing
    # A writer does not launder the forgery by giving the run a head computed from it.
    if attack != "relabelled_v3":
        with pytest.raises(CorruptStoreError, match="removed"):
            open_store(store_url)
        assert store_files(store_url) == before
    else:
        open_store(store_url).close()  # nothing newer than v6 left: migrated, and still
        assert verify(store_url).exit_code == 3  # the records give the relabelling away


@pytest.mark.parametrize("store_url", ["jsonl", "sqlite"], indirect=True)
def test_a_run_rewritten_whole_as_v3_wrote_it_is_caught_by_the_heads_kept_elsewhere(
    store_url: str, tmp_path: Path
) -> None:
    """What no check inside a store can tell: a whole run rewritten exactly as a release
    before digests would have written it (v3 records holding only what v3 wrote), with
    the store's record removed. The heads exported before catch it."""
    heads = tmp_path / "heads.json"
    with open_store(store_url) as store:
        facts = [(EventType.RUN_STARTED, {"task": "refund A1"}),
                 *((EventType.USER_MESSAGE, {"content": c}) for c in ("refund", "500"))]
        store.append(RUN, make_events(RUN, 0, 0, facts), expected_seq=0, epoch=0)
        log = list(store.read(RUN))
        assert verify(store_url, "--heads", str(heads)).exit_code == 0
        relabel_as_v3(store, log)
    remove_the_store_s_record(store_url, store_url.split(":", 1)[0])
    assert verify(store_url).exit_code == 0  # inside the store, nothing tells
    result = verify(store_url, "--heads", str(heads))
    assert result.exit_code == 3, (result.stdout, result.stderr)
    assert f"the event at seq {log[-1].seq} has digest (none)" in result.stderr


def test_sqlite_a_missing_heads_table_is_damage_not_a_disk_problem(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'j.db'}"
    with open_store(url) as store:
        a_run(store)
    db = sqlite3.connect(tmp_path / "j.db")
    db.execute("DROP TABLE heads")
    db.commit()
    db.close()
    result = verify(url)
    assert result.exit_code == 3, (result.stdout, result.stderr)
    assert "its heads table is missing" in result.stderr
    with pytest.raises(CorruptStoreError, match="heads table is missing"):
        open_store(url)


def test_sqlite_heads_tables_in_a_file_whose_migrations_predate_them_are_damage(
    tmp_path: Path,
) -> None:
    """The migration count turned back alone, so the file reads as one without heads."""
    url = f"sqlite:///{tmp_path / 'j.db'}"
    with open_store(url) as store:
        log = a_run(store)
        forge_newest(store, log)
    db = sqlite3.connect(tmp_path / "j.db")
    db.execute(f"PRAGMA user_version = {sqlite_module._HEADS - 1}")
    db.commit()
    db.close()
    result = verify(url)
    assert result.exit_code == 3, (result.stdout, result.stderr)
    assert "holds the heads and store_info tables that migration makes" in result.stderr
    assert "the count was turned back" in result.stderr


# --- PostgreSQL: the heads are the runs table's last_seq and last_digest ----------------


def pg(url: str, statement: str, *params: Any) -> None:
    import psycopg

    schema = url.rsplit("schema=", 1)[1]
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(statement.replace("{s}", f'"{schema}"'), params)


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
@pytest.mark.parametrize(("removed", "statement"), [
    ("runs", "DROP TABLE {s}.runs CASCADE"),
    ("last_digest", "ALTER TABLE {s}.runs DROP COLUMN last_digest"),
])
@pytest.mark.parametrize("attack", list(ATTACKS))
def test_postgres_a_forgery_with_the_heads_dropped_is_damage(
    store_url: str, attack: str, removed: str, statement: str
) -> None:
    with open_store(store_url) as store:
        log = a_run(store)
        ATTACKS[attack](store, log)
    pg(store_url, statement)
    result = verify(store_url)
    assert result.exit_code == 3, (result.stdout, result.stderr)
    assert removed in result.stderr and "is missing" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
def test_postgres_records_relabelled_as_v3_with_their_head_are_damage(store_url: str) -> None:
    """Relabelled, the head rewritten to match and the store made to look created before
    sealing: the records still carry what only later versions write."""
    with open_store(store_url) as store:
        log = a_run(store)
        relabel_as_v3(store, log)
    pg(store_url, "UPDATE {s}.runs SET last_digest = ''")
    pg(store_url, "UPDATE {s}.schema_version SET applied_at = applied_at + interval '1 s'"
       " WHERE version = 4")
    result = verify(store_url)
    assert result.exit_code == 3, (result.stdout, result.stderr)
    assert "labelled v3 but holds" in result.stderr


# --- what a version could not have written ------------------------------------------


def test_each_type_is_known_from_the_version_whose_fixtures_first_hold_it() -> None:
    """The table a relabelled record is judged by agrees with every released version's
    logs: a type is first written by the version its table entry names, never before."""
    fixtures = Path(__file__).parent / "fixtures"
    first: dict[EventType, int] = {}
    for log in sorted(fixtures.glob("v*/*.events.jsonl"), key=lambda p: int(p.parent.name[1:])):
        for line in log.read_bytes().splitlines():
            event = decode_stored(line)
            first.setdefault(event.type, event.v)
            assert newer_than_labelled(event) is None, (log.name, event.seq)
    assert first == {t: events_module._TYPES_SINCE.get(t, 1) for t in EventType}


def test_a_sealed_record_relabelled_as_older_than_sealing_is_damage() -> None:
    (event,) = make_events(RUN, 0, 0, [(EventType.USER_MESSAGE, {"content": "hi"})])
    (body,), _ = seal([msgspec.structs.replace(event, v=3)], "")
    with pytest.raises(CorruptLogError, match="labelled v3 but holds a digest, which only "
                       "v4 and later write: it was relabelled"):
        decode_record(RUN, 1, body)
    turn = encode(msgspec.structs.replace(event, type=EventType.MODEL_TURN, v=4, payload={
        "text": "", "tool_calls": [], "usage": {"reasoning_tokens": 0}}))
    with pytest.raises(CorruptLogError, match=re.escape(
            "model_turn's 'usage.reasoning_tokens', which only v5")):
        decode_record(RUN, 1, turn.replace(b'"digest":"",', b"", 1).replace(b'"v":4', b'"v":3'))


@pytest.mark.parametrize("store_url", ["jsonl", "sqlite"], indirect=True)
def test_a_tail_dropped_to_a_snapshot_is_found_by_a_read_from_it(store_url: str) -> None:
    """A read that starts after a snapshot's seq decodes nothing before it: where the
    store's record of heads is gone, it still finds the records that prove them."""
    with open_store(store_url) as store:
        log = a_run(store)
        assert write_snapshot(store, fold(log[:-1])) is not None
        drop_tail(store, log)
    remove_the_store_s_record(store_url, store_url.split(":", 1)[0])
    with open_store(store_url, readonly=True) as reader, pytest.raises(
            UnanchoredLogError, match=f"it is a v{SCHEMA_VERSION} record"):
        list(reader.read(RUN, after_seq=log[-2].seq))
    shown = CliRunner().invoke(cli(), ["show", RUN, "--store", store_url],
                               env={"COLUMNS": "200", "AGENTJOURNAL_STORE": ""})
    assert shown.exit_code == 3, (shown.stdout, shown.stderr)


def test_jsonl_a_run_of_one_batch_whose_head_file_was_deleted_is_damage_not_empty(
    tmp_path: Path,
) -> None:
    """The head file is created (empty) before a run's first batch is written: a log
    with events and no head file lost it, where an empty one is an append cut off."""
    directory = tmp_path / "runs"
    with open_store(f"jsonl:///{directory}") as store:
        facts = [(EventType.RUN_STARTED, {"task": "t"}), (EventType.USER_MESSAGE, {"content": "a"})]
        store.append(RUN, make_events(RUN, 0, 0, facts), expected_seq=0, epoch=0)
    (directory / f"{RUN}.head").unlink()
    with open_store(f"jsonl:///{directory}", readonly=True) as reader, pytest.raises(
            CorruptLogError, match="the head was deleted"):
        list(reader.read(RUN))


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
def test_postgres_a_store_whose_record_of_migrations_was_emptied_is_damage(
    store_url: str,
) -> None:
    """Not "no agentjournal tables" to a reader, nor "relation already exists" to a
    writer: migrations commit with their schema_version rows, so the rows were removed."""
    with open_store(store_url) as store:
        a_run(store)
    pg(store_url, "DELETE FROM {s}.schema_version")
    result = verify(store_url)
    assert result.exit_code == 3, (result.stdout, result.stderr)
    assert "its schema_version table records no migration" in result.stderr
    with pytest.raises(CorruptStoreError, match="record of its migrations was removed"):
        open_store(store_url)
