"""Reading never writes: every inspecting command leaves what it looked at byte for byte as
it was (no file, lock, table, schema or pragma made), refuses what is not a store with the
documented exit code, and works on a read-only copy."""

from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from agentjournal import (
    EventType,
    NotAStoreError,
    ReadOnlyStoreError,
    StoreUrlError,
    UnsupportedVersionError,
    make_events,
    open_store,
)
from agentjournal.cli import cli
from agentjournal.store import Lease

from .conftest import POSTGRES_URL, backend_params, drop_schema, postgres_reason

READS = [["runs"], ["show", "r1"], ["events", "r1"], ["state", "r1"], ["verify", "r1"],
         ["verify", "--all"], ["approvals"], ["uncertain"], ["show", "r1", "--at", "1"]]


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), env={"COLUMNS": "200", "AGENTJOURNAL_STORE": ""})


def no_traceback(result: Result, code: int, needle: str = "") -> None:
    assert isinstance(result.exception, SystemExit | None), result.exception
    assert result.exit_code == code, (result.stdout, result.stderr)
    assert "Traceback" not in result.output
    assert needle in (result.stderr if code else result.stdout), result.stderr


def fingerprint(directory: Path) -> dict[str, str]:
    """Every file under ``directory`` (names included) and its sha256."""
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()} | {
        str(p.relative_to(directory)) + "/": "dir" for p in directory.rglob("*") if p.is_dir()}


def seed(url: str, run_id: str = "r1") -> None:
    store = open_store(url)
    try:
        facts = [(EventType.RUN_STARTED, {"task": "t"}),
                 *[(EventType.USER_MESSAGE, {"content": f"m{i}"}) for i in range(2)]]
        store.append(run_id, make_events(run_id, 0, 0, facts), expected_seq=0, epoch=0)
    finally:
        store.close()


# --- things that are not stores: refused, unchanged ---------------------------------


def foreign_db(path: Path, *, wal: bool) -> None:
    db = sqlite3.connect(path)
    if wal:
        db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL)")
    db.execute("INSERT INTO invoices VALUES (1, 9.5)")
    db.commit()
    db.close()


def truncated_store(path: Path) -> None:
    seed(f"sqlite:///{path}")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


TARGETS = {
    # name: (make it, expected exit code, expected message)
    "foreign-sqlite": (lambda p: foreign_db(p, wal=False), 3, "program, with tables invoices"),
    "foreign-wal-sqlite": (lambda p: foreign_db(p, wal=True), 3, "tables invoices"),
    "random-bytes": (lambda p: p.write_bytes(os.urandom(8192)), 3, "not an SQLite database"),
    "text-file": (lambda p: p.write_text("milk, eggs\n" * 40), 3, "not an SQLite database"),
    "half-truncated-store": (truncated_store, 3, "is damaged"),
}


@pytest.mark.parametrize("target", sorted(TARGETS))
@pytest.mark.parametrize("command", READS, ids=lambda c: "-".join(c))
def test_read_commands_leave_what_is_not_a_store_unchanged(
    tmp_path: Path, target: str, command: list[str]
) -> None:
    make, code, message = TARGETS[target]
    path = tmp_path / "x.db"
    make(path)
    before = fingerprint(tmp_path)
    no_traceback(invoke(*command, "--store", f"sqlite:///{path}"), code, message)
    assert fingerprint(tmp_path) == before


@pytest.mark.parametrize("command", READS, ids=lambda c: "-".join(c))
def test_an_empty_store_url_is_not_a_store_and_creates_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: list[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    no_traceback(invoke(*command, "--store", ""), 3, "the store URL is empty")
    assert list(tmp_path.iterdir()) == []


def test_a_damaged_store_is_damage_and_an_empty_one_says_what_it_is(tmp_path: Path) -> None:
    truncated_store(tmp_path / "t.db")
    no_traceback(invoke("verify", "--all", "--store", f"sqlite:///{tmp_path / 't.db'}"), 3,
                 "is damaged")
    (tmp_path / "z.db").write_bytes(b"")
    for command in (["runs"], ["verify", "--all"]):
        result = invoke(*command, "--store", f"sqlite:///{tmp_path / 'z.db'}")
        no_traceback(result, 0)
        assert "a store whose creation did not finish" in result.stderr
        assert "if it held runs, it was truncated" in result.stderr.lower()


# --- real stores: reading changes nothing -------------------------------------------


@pytest.mark.parametrize("kind", ["sqlite", "jsonl"])
@pytest.mark.parametrize("command", READS, ids=lambda c: "-".join(c))
def test_reading_a_store_changes_no_file(tmp_path: Path, kind: str, command: list[str]) -> None:
    store = tmp_path / "s"
    url = f"sqlite:///{store / 'j.db'}" if kind == "sqlite" else f"jsonl:///{store}"
    store.mkdir()
    seed(url)
    for lock in (tmp_path / "s").glob("*.lock"):  # a copy without lock files: none is made
        lock.unlink()
    before = fingerprint(tmp_path)
    no_traceback(invoke(*command, "--store", url), 0)
    assert fingerprint(tmp_path) == before


def test_a_rollback_journal_database_keeps_its_mode_and_a_wal_one_leaves_no_wal_files(
    tmp_path: Path,
) -> None:
    path = tmp_path / "j.db"
    seed(f"sqlite:///{path}")
    with sqlite3.connect(path) as db:  # switched to a rollback journal by someone
        db.execute("PRAGMA journal_mode=DELETE")
    before = fingerprint(tmp_path)
    no_traceback(invoke("runs", "--store", f"sqlite:///{path}"), 0, "r1")
    assert fingerprint(tmp_path) == before  # byte 18/19 of the header say: not WAL


@backend_params()
def test_a_readonly_handle_refuses_every_write(store_url: str) -> None:
    seed(store_url)
    store = open_store(store_url, readonly=True)
    try:
        assert [e.seq for e in store.read("r1")] == [1, 2, 3]
        facts = [(EventType.USER_MESSAGE, {"content": "more"})]
        writes = [
            lambda: store.append("r1", make_events("r1", 3, 0, facts), expected_seq=3, epoch=0),
            lambda: store.acquire("r1", "me", 5.0),
            lambda: store.release(Lease("r1", "me", 1, 0.0)),
            lambda: store.quarantine(1, "x"),
            lambda: store.delete_snapshots("r1"),
        ]
        for write in writes:
            with pytest.raises(ReadOnlyStoreError, match="open read-only"):
                write()
        assert store.last_seq("r1") == 3
    finally:
        store.close()


@pytest.mark.parametrize("kind", ["sqlite", "jsonl"])
def test_readonly_open_of_nothing_creates_nothing(tmp_path: Path, kind: str) -> None:
    target = tmp_path / "nothing"
    with pytest.raises(StoreUrlError, match="agentjournal init"):
        open_store(f"{kind}:///{target}", readonly=True)
    assert list(tmp_path.iterdir()) == []


def test_a_foreign_database_is_not_migrated_into_even_for_writing(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    foreign_db(path, wal=False)
    before = fingerprint(tmp_path)
    with pytest.raises(NotAStoreError, match="tables invoices"):
        open_store(f"sqlite:///{path}")
    no_traceback(invoke("init", "--store", f"sqlite:///{path}"), 3, "not an agentjournal store")
    assert fingerprint(tmp_path) == before


# --- agentjournal init: creating a store is explicit --------------------------------


@pytest.mark.parametrize("kind", ["sqlite", "jsonl"])
def test_init_creates_a_store_that_reads_then_find(tmp_path: Path, kind: str) -> None:
    target = tmp_path / ("new.db" if kind == "sqlite" else "new")
    url = f"{kind}:///{target}"
    no_traceback(invoke("runs", "--store", url), 2, f"no store at {target}")
    assert not target.exists()
    no_traceback(invoke("init", "--store", url), 0)
    assert target.exists()
    no_traceback(invoke("runs", "--store", url), 0)
    assert "store ready" in invoke("init", "--store", url).stderr


def test_a_relative_url_is_reported_with_its_absolute_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = invoke("runs", "--store", "sqlite:///rel.db")
    no_traceback(result, 2, f"no store at {tmp_path / 'rel.db'}")
    assert "sqlite:////abs.db absolute" in result.stderr
    (tmp_path / "rel.db").write_bytes(b"")
    no_traceback(invoke("runs", "--store", "sqlite:///rel.db"), 0)
    assert str(tmp_path / "rel.db") in invoke("runs", "--store", "sqlite:///rel.db").stderr


# --- Postgres: a schema that is not ours is refused, nothing is created ---------------


@pytest.fixture
def pg() -> str:
    if reason := postgres_reason():
        pytest.skip(reason)
    return POSTGRES_URL + ("&" if "?" in POSTGRES_URL else "?")


def pg_tables(schema: str) -> list[str]:
    import psycopg

    with psycopg.connect(POSTGRES_URL) as conn:
        rows = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = %s ORDER BY 1",
                            (schema,)).fetchall()
        return [r[0] for r in rows]


def pg_schemas() -> list[str]:
    import psycopg

    with psycopg.connect(POSTGRES_URL) as conn:
        return [r[0] for r in conn.execute("SELECT nspname FROM pg_namespace ORDER BY 1")]


@pytest.mark.parametrize("command", READS, ids=lambda c: "-".join(c))
def test_read_commands_create_nothing_in_postgres(pg: str, command: list[str]) -> None:
    public = pg_tables("public")
    if "schema_version" not in public:  # (unless something made public a store before)
        no_traceback(invoke(*command, "--store", pg + "schema=public"), 3,
                     "schema 'public' has no agentjournal tables")
    missing = f"nosuch_{uuid.uuid4().hex[:8]}"
    no_traceback(invoke(*command, "--store", pg + f"schema={missing}"), 3, "does not exist")
    no_traceback(invoke(*command, "--store", pg + "schema="), 1, "schema ''")
    # (Only what these commands named: tests running beside this one make schemas.)
    assert pg_tables("public") == public and missing not in pg_schemas()


def test_a_foreign_postgres_schema_is_never_migrated_into(pg: str) -> None:
    import psycopg

    schema = f"app_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(f"CREATE TABLE {schema}.orders (id int)")
    try:
        for readonly in (True, False):
            with pytest.raises(NotAStoreError, match="holds other tables"):
                open_store(pg + f"schema={schema}", readonly=readonly)
        assert pg_tables(schema) == ["orders"]
    finally:
        drop_schema(schema)


def test_init_creates_a_postgres_schema_that_reads_then_find(pg: str) -> None:
    schema = f"t_{uuid.uuid4().hex[:12]}"
    try:
        no_traceback(invoke("runs", "--store", pg + f"schema={schema}"), 3, "does not exist")
        no_traceback(invoke("init", "--store", pg + f"schema={schema}"), 0)
        no_traceback(invoke("runs", "--store", pg + f"schema={schema}"), 0)
    finally:
        drop_schema(schema)


# --- a read-only copy (a backup, a forensic mount) ----------------------------------
#
# Tests run as root here, where chmod stops no write. A private mount namespace
# (`unshare -m`) with a read-only bind mount over the copy is a real read-only file
# system (EROFS) even for root, seen only by the one subprocess. Not root: chmod.


def _readonly_runner() -> str | None:
    if os.geteuid() != 0:
        return "chmod"
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount --bind / /mnt 2>/dev/null"],
                           capture_output=True, check=False) if shutil.which("unshare") else None
    return "unshare" if probe is not None and probe.returncode == 0 else None


def run_readonly(directory: Path, *args: str,
                 cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``agentjournal ARGS`` in a subprocess (in ``cwd``, which is also its import path)
    that sees ``directory`` read-only."""
    how = _readonly_runner()
    if how is None:
        pytest.skip("no way to make a read-only directory here (root without unshare)")
    argv = [sys.executable, "-m", "agentjournal", *args]
    env = {**os.environ, "AGENTJOURNAL_STORE": "", "COLUMNS": "200"}
    if cwd is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(cwd), env.get("PYTHONPATH")]))
    if how == "unshare":
        d = str(directory)
        script = f'mount --bind "{d}" "{d}" && mount -o remount,ro,bind "{d}" && exec "$@"'
        argv = ["unshare", "-m", "sh", "-c", script, "sh", *argv]
        return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd,
                              check=False)
    modes = {p: p.stat().st_mode for p in [directory, *directory.rglob("*")]}
    try:
        for p in modes:
            p.chmod(modes[p] & ~0o222)
        return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd,
                              check=False)
    finally:
        for p, mode in modes.items():
            p.chmod(mode)


@pytest.mark.parametrize("kind", ["sqlite", "jsonl"])
@pytest.mark.parametrize("command", READS, ids=lambda c: "-".join(c))
def test_read_commands_work_on_a_readonly_copy(
    tmp_path: Path, kind: str, command: list[str]
) -> None:
    copy = tmp_path / "copy"
    copy.mkdir()
    url = f"sqlite:///{copy / 'j.db'}" if kind == "sqlite" else f"jsonl:///{copy}"
    seed(url)
    if kind == "jsonl":
        (copy / "r1.lock").unlink()  # a backup of the logs alone
    before = fingerprint(tmp_path)
    result = run_readonly(copy, *command, "--store", url)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert fingerprint(tmp_path) == before


@pytest.mark.parametrize("kind", ["sqlite", "jsonl"])
def test_a_write_to_a_readonly_copy_says_so(tmp_path: Path, kind: str) -> None:
    copy = tmp_path / "copy"
    copy.mkdir()
    url = f"sqlite:///{copy / 'j.db'}" if kind == "sqlite" else f"jsonl:///{copy}"
    seed(url)
    result = run_readonly(copy, "fork", "r1", "--at", "2", "--store", url)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr and result.stderr.startswith("error: ")
    assert "read-only" in result.stderr.lower() or "not writable" in result.stderr


def test_a_readonly_copy_with_an_unreadable_wal_says_what_to_copy(tmp_path: Path) -> None:
    store = tmp_path / "live"
    store.mkdir()
    seed(f"sqlite:///{store / 'j.db'}")
    writer = sqlite3.connect(store / "j.db")  # holds the WAL open: not checkpointed
    writer.execute("PRAGMA wal_autocheckpoint=0")
    writer.execute("INSERT INTO quarantine VALUES (9, 'x', 'now')")
    writer.commit()
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in ("j.db", "j.db-wal"):  # a backup that missed the -shm file
        shutil.copy(store / name, copy / name)
    writer.close()
    result = run_readonly(copy, "runs", "--store", f"sqlite:///{copy / 'j.db'}")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "j.db-wal holds data" in result.stderr and "-shm" in result.stderr


def test_a_store_from_a_newer_release_is_refused_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    seed(f"sqlite:///{path}")
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version = 99")
    db.close()
    before = fingerprint(tmp_path)
    for readonly in (True, False):
        with pytest.raises(UnsupportedVersionError, match="version 99"):
            open_store(f"sqlite:///{path}", readonly=readonly)
    no_traceback(invoke("runs", "--store", f"sqlite:///{path}"), 3, "Upgrade agentjournal")
    assert fingerprint(tmp_path) == before


def test_a_postgres_schema_from_a_newer_release_is_refused(pg: str) -> None:
    import psycopg

    schema = f"t_{uuid.uuid4().hex[:12]}"
    open_store(pg + f"schema={schema}").close()
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(f"INSERT INTO {schema}.schema_version (version) VALUES (99)")
    try:
        for readonly in (True, False):
            with pytest.raises(UnsupportedVersionError, match="version 99"):
                open_store(pg + f"schema={schema}", readonly=readonly)
    finally:
        drop_schema(schema)


# --- a writer killed with data in its -wal: reading leaves all three files as they are ---

_KILLED_WRITER = """
import sys, time
from agentjournal import EventType, make_events, open_store
store = open_store(sys.argv[1])
facts = [(EventType.RUN_STARTED, {"task": "t"})]
store.append("r1", make_events("r1", 0, 0, facts), expected_seq=0, epoch=0)
for seq in range(1, 20):
    facts = [(EventType.USER_MESSAGE, {"content": f"m{seq}"})]
    store.append("r1", make_events("r1", seq, 0, facts), expected_seq=seq, epoch=0)
print("appended", flush=True)
time.sleep(600)
"""


def killed_writer(path: Path) -> None:
    """A real writer that appended 20 events and was killed with SIGKILL, its WAL holding
    them (never checkpointed: nobody closed the last connection)."""
    writer = subprocess.Popen([sys.executable, "-c", _KILLED_WRITER, f"sqlite:///{path}"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout is not None and writer.stdout.readline() == "appended\n"
    finally:
        writer.kill()
        writer.wait(timeout=60)
    assert Path(f"{path}-wal").stat().st_size > 0 and Path(f"{path}-shm").exists()


@pytest.mark.parametrize("command", READS, ids=lambda c: "-".join(c))
def test_reading_after_a_killed_writer_leaves_the_db_wal_and_shm_byte_identical(
    tmp_path: Path, command: list[str]
) -> None:
    path = tmp_path / "j.db"
    killed_writer(path)
    before = fingerprint(tmp_path)
    assert {"j.db", "j.db-wal", "j.db-shm"} <= set(before)
    result = invoke(*command, "--store", f"sqlite:///{path}")
    no_traceback(result, 0)
    assert fingerprint(tmp_path) == before
    store = open_store(f"sqlite:///{path}", readonly=True)
    try:  # and it read what the WAL holds
        assert store.last_seq("r1") == 20
    finally:
        store.close()
    assert fingerprint(tmp_path) == before


def test_a_copy_of_the_wal_without_its_shm_is_refused_unchanged_not_merged(
    tmp_path: Path,
) -> None:
    path = tmp_path / "j.db"
    killed_writer(path)
    Path(f"{path}-shm").unlink()  # a copy that missed the -shm file, in a writable directory
    before = fingerprint(tmp_path)
    result = invoke("runs", "--store", f"sqlite:///{path}")
    no_traceback(result, 1, "j.db-wal holds data")
    assert "agentjournal init" in result.stderr
    assert fingerprint(tmp_path) == before


def test_a_command_that_writes_after_a_killed_writer_writes(tmp_path: Path) -> None:
    """It reads first (read-only, the -shm untouched), then writes: SQLite shares one -shm
    mapping per process, so the reader is closed before the writer opens."""
    path = tmp_path / "j.db"
    killed_writer(path)
    no_traceback(invoke("fork", "r1", "--at", "2", "--store", f"sqlite:///{path}"), 0)
    with open_store(f"sqlite:///{path}", readonly=True) as forked:
        assert len(forked.list_runs()) == 2
    path = tmp_path / "again.db"
    killed_writer(path)
    store = open_store(f"sqlite:///{path}", readonly=True)
    try:
        with pytest.raises(StoreUrlError, match="close that handle before opening one to write"):
            open_store(f"sqlite:///{path}")  # a writer beside it, in this process
    finally:
        store.close()
    open_store(f"sqlite:///{path}").close()  # once it is closed
