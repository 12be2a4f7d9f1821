"""Shared fixtures: a store factory per backend, Postgres included when a server is up."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from agentjournal import open_store
from agentjournal.store import Store

from .pg_cluster import ThrowawayCluster, missing_tools

POSTGRES_URL = os.environ.get(
    "AGENTJOURNAL_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test"
)
BACKENDS = ("jsonl", "sqlite", "postgres")

# Property tests check what a fold or a codec gives, never how fast: on a machine loaded by
# others a slow example is not a failure (no deadline, no "too slow" health check).
settings.register_profile("agentjournal", deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("agentjournal")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--slow", action="store_true", help="run long soak tests at full size")


@pytest.fixture
def own_postgres() -> Iterator[ThrowawayCluster]:
    """A PostgreSQL cluster of the test's own, for a test that restarts or stops the
    server: the machine's server (POSTGRES_URL) is never restarted, as others use it."""
    if reason := missing_tools():
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but {reason}")
        pytest.skip(reason)
    with ThrowawayCluster() as cluster:
        yield cluster


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
    backend, grouped, _ = backend.partition("+grouped")
    if grouped:  # every append through the group commit's transaction, even alone
        for url in fresh_url(backend, tmp_path):
            yield f"{url}{'&' if '?' in url else '?'}group_commit=always"
        return
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


def backend_params(*, grouped: bool = False) -> pytest.MarkDecorator:
    """Every backend; ``grouped``: and SQLite and PostgreSQL with every append made in
    the group commit's transaction (``?group_commit=always``)."""
    extra = ("sqlite+grouped", "postgres+grouped") if grouped else ()
    return pytest.mark.parametrize("store_url", (*BACKENDS, *extra), indirect=True)
