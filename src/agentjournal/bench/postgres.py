"""The bench's PostgreSQL: whether it can be measured here, and throwaway schemas that
every section measuring it works in (dropped afterwards)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator


def postgres_problem(url: str | None) -> str | None:
    """Why Postgres cannot be measured here, or None."""
    if not url:
        return "no Postgres URL given"
    try:
        import psycopg
    except ImportError:
        return "psycopg is not installed: pip install 'agentjournal[postgres]'"
    try:
        with psycopg.connect(url, connect_timeout=3):
            return None
    except psycopg.Error as exc:
        return f"no PostgreSQL server reachable at {url}: {' '.join(str(exc).split())}"


def in_schema(url: str, schema: str) -> str:
    """``url`` with the store's ``schema`` parameter set to ``schema``."""
    return f"{url}{'&' if '?' in url else '?'}schema={schema}"


@contextlib.contextmanager
def throwaway_schema(url: str) -> Iterator[str]:
    """A store URL in a fresh ``bench_<random>`` schema, dropped afterwards."""
    schema = f"bench_{uuid.uuid4().hex[:12]}"
    try:
        yield in_schema(url, schema)
    finally:
        drop_schema(url, schema)


def drop_schema(url: str, schema: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
