"""Stores: where a run's events live. Open one from a URL with :func:`open_store`."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from ..errors import MissingExtraError, StoreUrlError
from .base import Durability, Lease, RunInfo, Store, validate_run_id

DEFAULT_URL = "sqlite:///./agentjournal.db"
ENV_VAR = "AGENTJOURNAL_STORE"

__all__ = [
    "DEFAULT_URL",
    "Durability",
    "Lease",
    "RunInfo",
    "Store",
    "local_path",
    "open_store",
    "validate_run_id",
]


def _durability(url: str, query: dict[str, list[str]]) -> Durability:
    value = query.pop("durability", ["fsync"])[-1]
    try:
        return Durability(value)
    except ValueError:
        choices = "'fsync' or 'batched'"
        raise StoreUrlError(url, f"durability must be {choices}, not {value!r}") from None


def _path_of(url_path: str) -> str:
    # sqlite:///rel.db names "rel.db"; sqlite:////abs.db names "/abs.db".
    return unquote(url_path[1:] if url_path.startswith("/") else url_path)


def local_path(url: str) -> tuple[str, Path] | None:
    """(scheme, path) of a file-backed store URL (sqlite, jsonl), else None."""
    parts = urlsplit(url)
    path = _path_of(parts.path)
    return (parts.scheme, Path(path)) if parts.scheme in ("sqlite", "jsonl") and path else None


def open_store(url: str | None = None) -> Store:
    """Open the store at ``url`` (default: ``$AGENTJOURNAL_STORE`` or ``sqlite:///./agentjournal.db``).

    - ``sqlite:///relative.db``, ``sqlite:////abs/path.db``: the embedded default
    - ``jsonl:///directory``: one JSON Lines file per run
    - ``postgresql://user@host:5432/db?schema=agentjournal``: shared, multi-host

    Every URL may end in ``?durability=batched`` (see :class:`Durability`).
    """
    url = url or os.environ.get(ENV_VAR) or DEFAULT_URL
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    durability = _durability(url, query)
    path = _path_of(parts.path)
    if parts.scheme == "sqlite":
        if not path:
            raise StoreUrlError(url, "no database file named")
        from .sqlite import SQLiteStore

        return SQLiteStore(path, durability=durability)
    if parts.scheme == "jsonl":
        if not path:
            raise StoreUrlError(url, "no directory named")
        from .jsonl import JsonlStore

        return JsonlStore(path, durability=durability)
    if parts.scheme in ("postgres", "postgresql"):
        try:
            from .postgres import PostgresStore
        except ImportError as exc:
            raise MissingExtraError("postgres", exc.name or "psycopg") from None
        schema = query.pop("schema", ["agentjournal"])[-1]
        rest = "&".join(f"{k}={v}" for k, vs in query.items() for v in vs)
        conninfo = parts._replace(scheme="postgresql", query=rest).geturl()
        return PostgresStore(conninfo, schema=schema, durability=durability)
    raise StoreUrlError(url, f"unknown scheme {parts.scheme!r}")
