"""Stores: where a run's events live. Open one from a URL with :func:`open_store`."""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import SplitResult, parse_qs, unquote, urlsplit

from ..errors import MissingExtraError, NotAStoreError, StoreUrlError
from .base import Durability, Lease, RunInfo, Store, validate_run_id
from .group import GroupCommit

DEFAULT_URL = "sqlite:///./agentjournal.db"
ENV_VAR = "AGENTJOURNAL_STORE"

__all__ = [
    "DEFAULT_URL",
    "Durability",
    "GroupCommit",
    "Lease",
    "RunInfo",
    "Store",
    "local_path",
    "mask_secrets",
    "open_store",
    "validate_run_id",
]


# A password in a URL's user info (scheme://user:secret@host) or in a key=value
# connection string (password=secret): what mask_secrets hides.
_URL_PASSWORD = re.compile(r"(\b[a-z][a-z0-9+.-]*://[^/@\s:]*:)[^@\s]*@", re.IGNORECASE)
_KV_PASSWORD = re.compile(r"(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&]+)", re.IGNORECASE)


def mask_secrets(text: str) -> str:
    """``text`` with every password in a store URL or connection string shown as ``***``:
    what the CLI and error messages print, so a secret never reaches a terminal or a log."""
    return _KV_PASSWORD.sub(r"\1***", _URL_PASSWORD.sub(r"\1***@", text))


def _split(url: str) -> SplitResult:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (parsed lazily: a bad port raises only here)
    except ValueError as exc:  # "Invalid IPv6 URL", a port out of range
        raise StoreUrlError(mask_secrets(url), f"the URL does not parse ({exc})") from None
    return parts


def _durability(url: str, query: dict[str, list[str]]) -> Durability:
    value = query.pop("durability", ["fsync"])[-1]
    try:
        return Durability(value)
    except ValueError:
        choices = "'fsync' or 'batched'"
        raise StoreUrlError(url, f"durability must be {choices}, not {value!r}") from None


def _group_commit(url: str, query: dict[str, list[str]]) -> GroupCommit:
    value = query.pop("group_commit", ["on"])[-1]
    try:
        return GroupCommit(value)
    except ValueError:
        raise StoreUrlError(url, "group_commit must be 'on', 'off' or 'always', "
                            f"not {value!r}") from None


def _path_of(url: str, url_path: str) -> str:
    # sqlite:///rel.db names "rel.db" (relative to the working directory);
    # sqlite:////abs.db names "/abs.db".
    path = unquote(url_path[1:] if url_path.startswith("/") else url_path)
    if "\0" in path:  # the OS cannot name such a file; os.* would raise ValueError
        raise StoreUrlError(url, "the path holds a NUL byte (%00)")
    return path


def local_path(url: str) -> tuple[str, Path] | None:
    """(scheme, path) of a file-backed store URL (sqlite, jsonl), else None."""
    parts = _split(url)
    path = _path_of(url, parts.path)
    return (parts.scheme, Path(path)) if parts.scheme in ("sqlite", "jsonl") and path else None


def open_store(url: str | None = None, *, readonly: bool = False,
               pool_size: int | None = None) -> Store:
    """Open the store at ``url`` (default: ``$AGENTJOURNAL_STORE`` or ``sqlite:///./agentjournal.db``).

    - ``sqlite:///relative.db`` (relative to the working directory),
      ``sqlite:////abs/path.db``: the embedded default
    - ``jsonl:///directory``: one JSON Lines file per run
    - ``postgresql://user@host:5432/db?schema=agentjournal``: shared, multi-host

    Every URL may end in ``?durability=batched`` (see :class:`Durability`). SQLite and
    PostgreSQL URLs may say ``?group_commit=on|off|always`` (default ``on``: the appends
    of concurrent runs that meet are committed together; see store/group.py).

    ``readonly=True`` opens an existing store for inspection: nothing is created,
    migrated or changed (no file, table, pragma or lock file), it works on a
    read-only copy, and every write raises ``ReadOnlyStoreError``. Without it, the
    store is created if missing (an empty URL is refused, never the default).
    Either way, what is not an agentjournal store (another program's database, a
    file that is no SQLite database, a Postgres schema holding other tables) is
    refused with ``NotAStoreError`` and left as it was. An empty (0-byte) SQLite file
    is a store whose creation did not finish: read, it is a store with no runs (and
    ``.unfinished`` is true), left as it is; opened for writing, it is completed.

    ``pool_size``: PostgreSQL only, the most connections the handle opens at once
    (default 4; it opens them as threads need them).

    A ``postgresql://`` URL may also say ``?lock_timeout=SECONDS``: the longest any
    statement waits for a lock another session holds (default 30; 0 waits forever);
    past it the call raises ``StoreLockedError``, having committed nothing.
    """
    if url is None:
        url = os.environ.get(ENV_VAR) or DEFAULT_URL
    if not url.strip():
        raise NotAStoreError("''", "the store URL is empty; give one, e.g. "
                             "sqlite:///agentjournal.db")
    parts = _split(url)
    query = parse_qs(parts.query, keep_blank_values=True)  # "?schema=" is an error, not unset
    durability = _durability(mask_secrets(url), query)
    grouping = _group_commit(mask_secrets(url), query)
    path = _path_of(url, parts.path)
    if parts.scheme == "sqlite":
        if not path:
            raise StoreUrlError(url, "no database file named")
        from .sqlite import SQLiteStore

        return SQLiteStore(path, durability=durability, readonly=readonly,
                           group_commit=grouping)
    if parts.scheme == "jsonl":
        if not path:
            raise StoreUrlError(url, "no directory named")
        from .jsonl import JsonlStore

        return JsonlStore(path, durability=durability, readonly=readonly)
    if parts.scheme in ("postgres", "postgresql"):
        try:
            from .postgres import DEFAULT_LOCK_TIMEOUT, PostgresStore, lock_timeout_of
        except ImportError as exc:
            raise MissingExtraError("postgres", exc.name or "psycopg") from None
        schema = query.pop("schema", ["agentjournal"])[-1]
        waits = DEFAULT_LOCK_TIMEOUT  # seconds any statement waits for another session's lock
        if "lock_timeout" in query:
            waits = lock_timeout_of(mask_secrets(url), query.pop("lock_timeout")[-1])
        rest = "&".join(f"{k}={v}" for k, vs in query.items() for v in vs)
        conninfo = parts._replace(scheme="postgresql", query=rest).geturl()
        sized = {} if pool_size is None else {"pool_size": pool_size}
        return PostgresStore(conninfo, schema=schema, durability=durability, readonly=readonly,
                             lock_timeout=waits, group_commit=grouping, **sized)
    raise StoreUrlError(mask_secrets(url), f"unknown scheme {parts.scheme!r}")
