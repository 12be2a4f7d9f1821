"""Every CLI command against every fault a user meets: bad store URLs, damaged files, a
read-only copy, a full disk. Whatever happens, the output holds no traceback, the error
is one ``error:`` line, and the exit code is the documented one.

The rule for the store faults: a reading command behaves exactly as on a healthy copy
(it never writes, so a read-only or full disk changes nothing for it); a writing
command either does the same or stops with exit 1 and says what to do.
"""

from __future__ import annotations

import errno
import json
import os
import resource
import shutil
import signal
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from agentjournal import StoreIOError, make_events, open_store
from agentjournal.cli import cli
from agentjournal.events import EventType
from agentjournal.store.jsonl import JsonlStore

from .test_cli import AGENTS
from .test_readonly import run_readonly

READING = {"runs", "show", "events", "state", "verify", "approvals", "uncertain"}


def commands(agents: str, approval: str, key: str) -> dict[str, list[str]]:
    """One invocation of every command that takes --store (bench and demo make their own)."""
    return {
        "runs": ["runs"], "show": ["show", "r1"], "events": ["events", "r1"],
        "state": ["state", "r1"], "verify": ["verify", "--all"], "approvals": ["approvals"],
        "uncertain": ["uncertain"],
        "approve": ["approve", "r2", approval], "deny": ["deny", "r2", approval, "--reason", "no"],
        "resolve": ["resolve", "r3", key, "--happened", "--reason", "seen"],
        "resume": ["resume", "r3"], "fork": ["fork", "r1", "--at", "2"],
        "run": ["run", f"{agents}:plain", "post it", "--run-id", "new"],
        "init": ["init"], "plan-snapshots": ["plan-snapshots"],
    }


#: By default every command meets one kind of each fault, and these the others (each is a
#: process of its own: the suite's time); --slow: every command, every kind.
SAMPLE = ("runs", "show", "verify", "approve", "resume", "run")


def sampled(cmds: dict[str, list[str]], everything: bool) -> dict[str, list[str]]:
    return cmds if everything else {name: cmds[name] for name in SAMPLE}


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), env={"COLUMNS": "200", "AGENTJOURNAL_STORE": ""})


def clean(code: int, out: str, err: str, expected: set[int], what: str) -> None:
    assert code in expected, (what, code, out, err)
    assert "Traceback" not in out + err, (what, err)
    if code not in (0, 4):  # (4: stopped for a person, not an error; a note may come
        # first: "no runs in ..." when every run is unreadable)
        assert any(line.startswith("error: ") for line in err.splitlines()), (what, err)


# --- a realistic store: a finished run, one waiting for approval, one uncertain ---------


def seeded(tmp_path: Path, kind: str) -> tuple[str, dict[str, list[str]], Path]:
    """A store under ``tmp_path/store`` with r1 finished, r2 waiting for an approval and
    r3 holding an uncertain call; the commands to try; the directory of the agents."""
    agents = f"fault_agents_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{agents}.py").write_text(AGENTS)
    (tmp_path / "store").mkdir()
    url = (f"sqlite:///{tmp_path / 'store' / 'j.db'}" if kind == "sqlite"
           else f"jsonl:///{tmp_path / 'store'}")
    for obj, run_id in (("plain", "r1"), ("approving", "r2"), ("flaky", "r3")):
        done = subprocess_cli(tmp_path, "run", f"{agents}:{obj}", "post it", "--run-id", run_id,
                              "--store", url)
        assert done.returncode == (0 if obj == "plain" else 4), done.stderr  # 4: stopped
    state2 = json.loads(subprocess_cli(tmp_path, "state", "r2", "--store", url).stdout)
    state3 = json.loads(subprocess_cli(tmp_path, "state", "r3", "--store", url).stdout)
    approval, key = next(iter(state2["approvals"])), next(iter(state3["pending"]))
    return url, commands(agents, approval, key[:16]), tmp_path


def subprocess_cli(cwd: Path, *args: str, limit: Callable[[], None] | None = None,
                   ) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "AGENTJOURNAL_STORE": "", "COLUMNS": "200", "PYTHONPATH": os.pathsep.join(
        filter(None, [str(cwd), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "agentjournal", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, check=False, preexec_fn=limit)


def copy_of(tmp_path: Path, name: str) -> Path:
    target = tmp_path / name
    shutil.copytree(tmp_path / "store", target)
    return target


def retarget(url: str, store: Path, copy: Path) -> str:
    return url.replace(str(store), str(copy))


# --- faults of the store's disk ----------------------------------------------------------


def _full_disk() -> None:
    """In the child: every file may grow to 1 byte, and a write past it fails with EFBIG
    (SIGXFSZ ignored) — what a full disk looks like to the writer, for root too."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1, 1))


@pytest.mark.parametrize("kind", ["sqlite", "jsonl"])
def test_every_command_on_a_readonly_or_full_disk(tmp_path: Path, kind: str,
                                                  request: pytest.FixtureRequest) -> None:
    url, cmds, cwd = seeded(tmp_path, kind)
    every = kind == "sqlite" or request.config.getoption("--slow")
    for name, args in sampled(cmds, every).items():
        healthy = copy_of(tmp_path, f"healthy-{name}")
        base = subprocess_cli(cwd, *args, "--store", retarget(url, tmp_path / "store", healthy))
        clean(base.returncode, base.stdout, base.stderr, {0, 2, 4}, f"{name} healthy")
        for fault in ("readonly-dir", "full-disk"):
            faulty = copy_of(tmp_path, f"{fault}-{name}")
            target = retarget(url, tmp_path / "store", faulty)
            if fault == "readonly-dir":
                got = run_readonly(faulty, *args, "--store", target, cwd=cwd)
            else:
                got = subprocess_cli(cwd, *args, "--store", target, limit=_full_disk)
            allowed = {base.returncode}
            if name not in READING or (kind == "sqlite" and fault == "full-disk"):
                allowed.add(1)  # (SQLite's readers of a WAL database need its -shm file)
            clean(got.returncode, got.stdout, got.stderr, allowed, f"{name} on {fault}")
            if got.returncode != base.returncode:
                assert any(w in got.stderr for w in ("read-only", "not writable", "full",
                                                     "durable write failed", "disk I/O")), (
                    name, fault, got.stderr)


# --- damaged stores ---------------------------------------------------------------------


def _truncate_sqlite(store: Path) -> str:
    db = store / "j.db"
    with sqlite3.connect(db) as conn:  # everything in the main file, then half of it cut
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = db.read_bytes()
    db.write_bytes(data[: len(data) // 2])
    return f"sqlite:///{db}"


def _random_sqlite(store: Path) -> str:
    (store / "j.db").write_bytes(os.urandom(16384))
    for extra in store.glob("j.db-*"):
        extra.unlink()
    return f"sqlite:///{store / 'j.db'}"


def _zero_sqlite(store: Path) -> str:
    (store / "j.db").write_bytes(b"")
    for extra in store.glob("j.db-*"):
        extra.unlink()
    return f"sqlite:///{store / 'j.db'}"


def _corrupt_jsonl(store: Path) -> str:
    for log in store.glob("*.jsonl"):
        lines = log.read_bytes().split(b"\n")
        lines[1] = lines[1][:20] + b"X" + lines[1][21:]  # a flipped byte mid-log
        log.write_bytes(b"\n".join(lines))
    return f"jsonl:///{store}"


def _bad_lease_jsonl(store: Path) -> str:
    for lease in store.glob("*.lease"):
        lease.write_bytes(b"{not json")
    return f"jsonl:///{store}"


DAMAGE: dict[str, tuple[str, Callable[[Path], str]]] = {
    "sqlite-half-truncated": ("sqlite", _truncate_sqlite),
    "sqlite-random-bytes": ("sqlite", _random_sqlite),
    "sqlite-zero-bytes": ("sqlite", _zero_sqlite),
    "jsonl-corrupt-records": ("jsonl", _corrupt_jsonl),
    "jsonl-unreadable-leases": ("jsonl", _bad_lease_jsonl),
}


EVERY_COMMAND_MEETS = {"sqlite-random-bytes", "jsonl-corrupt-records"}  # (see SAMPLE)


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_every_command_on_a_damaged_store(tmp_path: Path, damage: str,
                                          request: pytest.FixtureRequest) -> None:
    kind, spoil = DAMAGE[damage]
    _, cmds, cwd = seeded(tmp_path, kind)
    every = damage in EVERY_COMMAND_MEETS or request.config.getoption("--slow")
    for name, args in sampled(cmds, every).items():
        target = spoil(copy_of(tmp_path, f"{damage}-{name}"))
        got = subprocess_cli(cwd, *args, "--store", target)
        # 3: the store's data cannot be read. A command that never reads the damaged part
        # (a lease file, say) may succeed or refuse for its own reason (0, 1, 2); the zero
        # byte file is "not a store" to a reader but may be made one by a writer.
        allowed = {3} if kind == "sqlite" and "zero" not in damage else {0, 1, 2, 3}
        clean(got.returncode, got.stdout, got.stderr, allowed, f"{name} on {damage}")


# --- bad store URLs ---------------------------------------------------------------------

BAD_URLS = [
    ("sqlite:///x%00y.db", 1, "NUL byte"),
    ("jsonl:///runs%00", 1, "NUL byte"),
    ("postgresql://[::1/db", 1, "does not parse"),
    ("postgresql://me:hunter2@db.example:99999/x", 1, "does not parse"),
    ("postgresql://me:hunter2@127.0.0.1/x?schema=", 1, "schema ''"),
    ("postgresql://me:hunter2@127.0.0.1/x?schema=Bad-Name", 1, "plain lowercase identifier"),
    ("ftp://example.org/x", 1, "unknown scheme 'ftp'"),
    ("sqlite:///x.db?durability=sometimes", 1, "durability must be"),
    ("", 3, "the store URL is empty"),
]


@pytest.mark.parametrize("url, code, message", BAD_URLS, ids=[u[0] or "empty" for u in BAD_URLS])
def test_every_command_refuses_a_bad_url_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, url: str, code: int, message: str
) -> None:
    monkeypatch.chdir(tmp_path)
    for name, args in commands("mod", "approval-x", "abc").items():
        result = invoke(*args, "--store", url)
        assert isinstance(result.exception, SystemExit | None), (name, result.exception)
        if result.exit_code == 2 and "no store at" in result.stderr:
            continue  # a command that needs an existing store finds no file there first
        clean(result.exit_code, result.stdout, result.stderr, {code}, f"{name} {url!r}")
        assert message in result.stderr, (name, result.stderr)
        assert "hunter2" not in result.output, (name, result.output)
    assert list(tmp_path.iterdir()) == []  # and nothing was created


# --- raw exceptions, each now a JournalError ---------------------------------------------


def test_jsonl_on_a_full_disk_is_a_store_io_error_and_keeps_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = JsonlStore(tmp_path / "runs")
    facts = [(EventType.USER_MESSAGE, {"content": "x"})]
    store.append("r1", make_events("r1", 0, 0, facts), expected_seq=0, epoch=0)
    size = (tmp_path / "runs" / "r1.jsonl").stat().st_size

    def full(fd: int, data: Any) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(StoreIOError, match=r"No space left on device.*Free space and retry"):
        store.append("r1", make_events("r1", 1, 0, facts), expected_seq=1, epoch=0)
    with pytest.raises(StoreIOError, match="take a lease"):
        store.acquire("r1", "me", 5.0)
    monkeypatch.undo()
    assert (tmp_path / "runs" / "r1.jsonl").stat().st_size == size
    store.append("r1", make_events("r1", 1, 0, facts), expected_seq=1, epoch=0)  # not broken
    store.close()


def test_a_lone_surrogate_is_an_encoding_error(tmp_path: Path) -> None:
    from agentjournal import EncodingError

    store = open_store(f"sqlite:///{tmp_path / 'j.db'}")
    try:
        with pytest.raises(EncodingError, match="lone surrogate"):
            store.append("r1", make_events("r1", 0, 0, [
                (EventType.USER_MESSAGE, {"content": "bad \udc80 bytes"})]),
                expected_seq=0, epoch=0)
    finally:
        store.close()


# --- a Postgres password never reaches the terminal ---------------------------------------


def test_a_postgres_password_is_never_printed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from .conftest import POSTGRES_URL, drop_schema, postgres_reason

    if reason := postgres_reason():
        pytest.skip(reason)
    agents = f"mask_agents_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{agents}.py").write_text(AGENTS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    schema = f"t_{uuid.uuid4().hex[:12]}"
    user, rest = POSTGRES_URL.split("://", 1)[1].split("@", 1)
    url = f"postgresql://{user.split(':')[0]}:hunter2@{rest}"  # trust auth ignores it
    url += ("&" if "?" in url else "?") + f"schema={schema}"
    outputs = []
    try:
        for args in (["init"], ["run", f"{agents}:approving", "post it", "--run-id", "r2"],
                     ["runs"], ["approvals"], ["show", "r2"], ["state", "r2"],
                     ["verify", "--all"], ["fork", "r2", "--at", "1", "--new-id", "f"],
                     ["show", "nope"]):
            result = invoke(*args, "--store", url)
            assert "Traceback" not in result.output
            outputs.append(result.output)
        gone = url.replace(rest.split("/")[0], "127.0.0.1:1")  # nobody listens on port 1
        outputs.append(invoke("runs", "--store", gone).output)
    finally:
        drop_schema(schema)
        sys.modules.pop(agents, None)
    assert "agentjournal approve r2" in "".join(outputs)  # a hint naming the store...
    assert "postgres:***@" in "".join(outputs)
    assert not [o for o in outputs if "hunter2" in o]  # ...without its password


# --- a 0-byte file: a store whose creation did not finish ---------------------------------


def test_a_zero_byte_store_is_an_unfinished_store_to_every_command(tmp_path: Path) -> None:
    """A process killed while creating a store leaves a 0-byte file (SQLite writes nothing
    before its first write). One rule for every command: a store with nothing in it yet.
    A reader says so and changes nothing; a writer completes it; none calls it damage."""
    agents = f"fault_agents_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{agents}.py").write_text(AGENTS)
    for name, args in commands(agents, "approval-x", "abc").items():
        (tmp_path / name).mkdir()
        db = tmp_path / name / "j.db"
        db.write_bytes(b"")
        got = subprocess_cli(tmp_path, *args, "--store", f"sqlite:///{db}")
        clean(got.returncode, got.stdout, got.stderr, {0, 2}, name)
        if name in READING:
            assert "creation did not finish" in got.stderr, (name, got.stderr)
            assert sorted(p.name for p in db.parent.iterdir()) == ["j.db"], name
            assert db.stat().st_size == 0, name
        if name in ("run", "init"):
            assert got.returncode == 0 and db.stat().st_size > 0, (name, got.stderr)
    runs = subprocess_cli(tmp_path, "runs", "--store", f"sqlite:///{tmp_path / 'run' / 'j.db'}")
    assert runs.returncode == 0 and "new" in runs.stdout, runs.stderr
