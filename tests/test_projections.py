"""Projections against the log, on every backend: writers SIGKILLed mid-append leave every
run's outline equal to the outline of a fresh fold of its log; an outline edited by hand
is damage that `verify` reports (exit 3) and replaces, and `reindex` rebuilds."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentjournal import fold, open_store
from agentjournal.cli import cli
from agentjournal.projections import differences, encode, outline
from agentjournal.store import Store
from agentjournal.store import postgres as pg_module
from agentjournal.store import sqlite as sqlite_module
from agentjournal.store.outlined import LAG, projecting

from .conftest import BACKENDS
from .projection_writer import logs

ROOT = Path(__file__).parent.parent


def _writer(url: str, seed: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "tests.projection_writer", url, str(seed)],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _assert_outlines_tell_the_truth(store: Store) -> None:
    served = store.outlines()
    assert set(served) == {i.run_id for i in store.list_runs()}
    for run_id, st in served.items():
        assert not isinstance(st, Exception), st
        assert differences(st, outline(fold(store.read(run_id)))) == [], run_id


def _stale(store: Store) -> list[str]:
    """Runs whose stored outline is behind their head: PostgreSQL keeps none so (each is
    written in its append's transaction); SQLite lets one lag by fewer than LAG events
    (written when due: outlined.due)."""
    rows = store._outline_rows(None, False, stale=True)  # type: ignore[attr-defined]
    if store.url.startswith("sqlite"):
        return [row.run_id for row in rows if row.head - (row.seq or 0) >= LAG]
    return [row.run_id for row in rows]


@pytest.mark.parametrize("store_url", BACKENDS, indirect=True)
def test_outlines_equal_a_fresh_fold_after_writers_are_killed_mid_append(
        store_url: str, request: pytest.FixtureRequest) -> None:
    kills = 24 if request.config.getoption("--slow") else 5
    rng = random.Random(44)
    open_store(store_url).close()  # created once, before writers race to create it
    for kill in range(kills):
        child = _writer(store_url, kill)
        time.sleep(rng.uniform(0.3, 1.2))  # (startup takes most of it)
        child.send_signal(signal.SIGKILL)
        child.wait()
    finished = _writer(store_url, kills)
    _, err = finished.communicate(timeout=300)
    assert finished.returncode == 0, err.decode()[-2000:]
    with open_store(store_url) as store:
        assert {i.run_id: i.last_seq for i in store.list_runs()} == {
            run_id: len(facts) for run_id, facts in logs().items()}
        if not store_url.startswith("jsonl"):
            assert _stale(store) == []
        _assert_outlines_tell_the_truth(store)


def _edit_outline(store_url: str, run_id: str) -> None:
    """Change the stored outline's status, as someone editing the database would."""
    with open_store(store_url) as store:
        st = store.outlines([run_id])[run_id]
        assert not isinstance(st, Exception)
        st.status = "finished" if st.status != "finished" else "paused"
        body = encode(st)
    if store_url.startswith("sqlite"):
        import sqlite3
        with sqlite3.connect(store_url.removeprefix("sqlite:///")) as db:
            db.execute("UPDATE outlines SET body = ? WHERE run_no = (SELECT run_no FROM"
                       " run_numbers WHERE run_id = ?)", (body, run_id))
    elif store_url.startswith("jsonl"):
        import sqlite3
        with sqlite3.connect(Path(store_url.removeprefix("jsonl://")) / "_outlines.db") as db:
            db.execute("UPDATE outlines SET body = ? WHERE run_id = ?", (body, run_id))
    else:
        import psycopg
        base, _, schema = store_url.partition("?schema=")
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'UPDATE "{schema}".runs SET outline = %s WHERE run_id = %s',
                         (body, run_id))


def _cli(*args: str) -> tuple[int, str, str]:
    from click.testing import CliRunner
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize("store_url", BACKENDS, indirect=True)
def test_an_outline_edited_by_hand_is_damage_verify_replaces_and_reindex_rebuilds(
        store_url: str) -> None:
    subprocess.run([sys.executable, "-m", "tests.projection_writer", store_url, "1"],
                   cwd=ROOT, check=True)
    run_id = "saga-1"
    with open_store(store_url) as store:
        _assert_outlines_tell_the_truth(store)  # (JSONL: the sidecar is written here)
    _edit_outline(store_url, run_id)
    with open_store(store_url) as store:  # served as stored: nothing checks it per read
        assert differences(store.outlines([run_id])[run_id],  # type: ignore[arg-type]
                           outline(fold(store.read(run_id)))) == ["status"]

    code, out, err = _cli("verify", "--all", "--json", "--store", store_url)
    assert code == 3, err
    bad = [r for r in json.loads(out) if not r["ok"]]
    assert [(r["run_id"], r["mismatches"][0]["check"], r["mismatches"][0]["fields"])
            for r in bad] == [(run_id, "outline", ["status"])]
    assert "outline" in err and run_id in err
    with open_store(store_url) as store:  # replaced once found: never served again
        _assert_outlines_tell_the_truth(store)

    _edit_outline(store_url, run_id)
    code, out, err = _cli("reindex", "--json", "--store", store_url)
    assert code == 0, err
    report = json.loads(out)
    assert report["runs"] == len(logs()) and report["damaged"] == []
    with open_store(store_url) as store:
        _assert_outlines_tell_the_truth(store)
    code, _, err = _cli("verify", "--all", "--store", store_url)
    assert code == 0, err


@pytest.mark.parametrize("store_url", ["sqlite", "jsonl"], indirect=True)
def test_reindex_names_a_damaged_log_and_rebuilds_every_other_run(store_url: str) -> None:
    subprocess.run([sys.executable, "-m", "tests.projection_writer", store_url, "2"],
                   cwd=ROOT, check=True)
    if store_url.startswith("sqlite"):
        import sqlite3
        with sqlite3.connect(store_url.removeprefix("sqlite:///")) as db:
            db.execute("UPDATE events SET body = CAST(replace(CAST(body AS TEXT), 'pay', 'PAY')"
                       " AS BLOB) WHERE key = (SELECT (run_no << 32) + 3 FROM run_numbers"
                       " WHERE run_id = 'saga-1')")
    else:
        path = Path(store_url.removeprefix("jsonl://")) / "saga-1.jsonl"
        lines = path.read_bytes().split(b"\n")
        lines[2] = lines[2].replace(b'"seq":3', b'"seq":3 ')
        path.write_bytes(b"\n".join(lines))
    code, out, err = _cli("reindex", "--json", "--store", store_url)
    assert code == 3
    report = json.loads(out)
    assert [d["run_id"] for d in report["damaged"]] == ["saga-1"]
    assert report["runs"] == len(logs()) - 1
    assert "saga-1" in err


def test_a_crash_mid_reindex_leaves_the_store_usable_and_the_next_finishes(
        tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'r.db'}"
    subprocess.run([sys.executable, "-m", "tests.projection_writer", url, "3"],
                   cwd=ROOT, check=True)
    script = ("import os, signal, sys\n"
              "from agentjournal import open_store\n"
              "from agentjournal.reindex import reindex\n"
              "store = open_store(sys.argv[1])\n"
              "def stop(done, total):\n"
              "    if done == total // 2:\n"
              "        os.kill(os.getpid(), signal.SIGKILL)\n"
              "reindex(store, progress=stop)\n")
    killed = subprocess.run([sys.executable, "-c", script, url], cwd=ROOT)
    assert killed.returncode == -signal.SIGKILL
    with open_store(url) as store:
        _assert_outlines_tell_the_truth(store)
    code, out, _ = _cli("reindex", "--json", "--store", url)
    assert code == 0 and json.loads(out)["runs"] == len(logs())
    with open_store(url) as store:
        _assert_outlines_tell_the_truth(store)


@pytest.mark.parametrize("store_url", ["sqlite", "postgres"], indirect=True)
def test_a_store_written_before_outlines_is_projected_by_a_writer_s_first_open(
        store_url: str) -> None:
    subprocess.run([sys.executable, "-m", "tests.projection_writer", store_url, "5"],
                   cwd=ROOT, check=True)
    _as_before_outlines(store_url)
    with open_store(store_url, readonly=True) as reader:  # read-only: folds every run
        assert not reader.projected
        runs = len(reader.list_runs())
        _assert_outlines_tell_the_truth(reader)
    told: list[tuple[int, int]] = []
    token = projecting.set(lambda done, total: told.append((done, total)))
    try:
        with open_store(store_url) as writer:  # a writer's first open projects every run
            assert writer.projected and _stale(writer) == []
            _assert_outlines_tell_the_truth(writer)
    finally:
        projecting.reset(token)
    assert told == [(done, runs) for done in range(1, runs + 1)]  # its progress, run by run


def _as_before_outlines(store_url: str) -> None:
    """The store as the release before outlines left it: their migration undone."""
    if store_url.startswith("sqlite"):
        import sqlite3
        with sqlite3.connect(store_url.removeprefix("sqlite:///")) as db:
            db.executescript(f"DROP TABLE outlines; DROP TABLE views; DELETE FROM store_info"
                             f" WHERE name = '{sqlite_module._PROJECTED}';"
                             f" PRAGMA user_version = {sqlite_module._OUTLINES - 1};")
        return
    import psycopg
    base, _, schema = store_url.partition("?schema=")
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'DROP TABLE "{schema}".views')
        for column in ("outline", "outline_seq", "outline_version", "status", "agent",
                       "attention"):
            conn.execute(f'ALTER TABLE "{schema}".runs DROP COLUMN {column}')
        conn.execute(f'DELETE FROM "{schema}".schema_version WHERE version = %s',
                     (pg_module._OUTLINES,))
