"""Shared fixtures: a store factory per backend, Postgres included when a server is up."""

from __future__ import annotations

import fcntl
import os
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from agentjournal import open_store
from agentjournal.store import Store

POSTGRES_URL = os.environ.get(
    "AGENTJOURNAL_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test"
)
BACKENDS = ("jsonl", "sqlite", "postgres")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--slow", action="store_true", help="run long soak tests at full size")


# The suite runs in two processes, and one test restarts the PostgreSQL server
# (test_fleet_chaos, marked ``restarts_postgres``): it holds the server alone. Every other
# test holds it shared, and none starts while the restart waits for its turn.
_SERVER = Path(tempfile.gettempdir()) / f"agentjournal-tests-{os.getuid()}.server.lock"
_WANTED = _SERVER.with_suffix(".wanted")


@contextmanager
def _holding_the_server(alone: bool) -> Iterator[None]:
    fd = os.open(_SERVER, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if alone:
            _WANTED.touch()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                _WANTED.unlink(missing_ok=True)
        else:
            while _WANTED.exists():
                time.sleep(0.05)
            fcntl.flock(fd, fcntl.LOCK_SH)
            yield
    finally:
        os.close(fd)  # (closing releases the flock)


@pytest.fixture(autouse=True)
def _server_turns(request: pytest.FixtureRequest) -> Iterator[None]:
    with _holding_the_server(request.node.get_closest_marker("restarts_postgres") is not None):
        yield


def postgres_reason() -> str | None:
    """Why Postgres tests cannot run here, or None. In CI they must run."""
    try:
        import psycopg

        with psycopg.connect(POSTGRES_URL, connect_timeout=3):
            return None
    except Exception as exc:  # any failure to reach the server
        reason = f"no PostgreSQL server reachable at {POSTGRES_URL}: {exc}"
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true but {reason}")
    return reason


def drop_schema(schema: str) -> None:
    import psycopg

    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh store URL for the backend named by ``request.param``."""
    yield from fresh_url(request.param, tmp_path)


@pytest.fixture(params=BACKENDS)
def each_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh store URL, once per backend: for tests whose fixtures open the store."""
    yield from fresh_url(request.param, tmp_path)


def fresh_url(backend: str, tmp_path: Path) -> Iterator[str]:
    if backend == "jsonl":
        yield f"jsonl:///{tmp_path / 'runs'}"
    elif backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'journal.db'}"
    else:
        if reason := postgres_reason():
            pytest.skip(reason)
        schema = f"t_{uuid.uuid4().hex[:16]}"
        sep = "&" if "?" in POSTGRES_URL else "?"
        yield f"{POSTGRES_URL}{sep}schema={schema}"
        drop_schema(schema)


@pytest.fixture
def make_store(store_url: str) -> Iterator[Callable[[], Store]]:
    """Opens the same store again each call (a reopen); closes them all afterwards."""
    opened: list[Store] = []

    def make() -> Store:
        store = open_store(store_url)
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()


@pytest.fixture
def receiver() -> Iterator[Any]:
    """A receiver process counting the effects it is sent (tests/crash_agent.py)."""
    from .test_crash_models import Receiver

    r = Receiver()
    try:
        yield r
    finally:
        r.close()


def backend_params() -> pytest.MarkDecorator:
    return pytest.mark.parametrize("store_url", BACKENDS, indirect=True)
