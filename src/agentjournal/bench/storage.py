"""5. Bytes per event and per step as a run grows, on every backend, with and without the
journal's snapshots."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path

from ..events import Event, encode
from ..store import Durability, open_store
from ..store.jsonl import JsonlStore
from ._common import (
    NEVER,
    RUN,
    Figure,
    Say,
    figure,
    store_url,
    workload,
)
from .postgres import postgres_problem, throwaway_schema
from .replay import (
    fill,
)

# --- 5. storage ---------------------------------------------------------------------------

BACKENDS = ("sqlite", "jsonl", "postgres")
SNAPSHOTS = "+snapshots"  # a variant's suffix: the journal's default snapshots written too


def _sqlite_bytes(path: Path) -> int:
    """The file's pages in use, after a checkpoint has moved the WAL into the file. (Free
    pages are not counted: a new store's migrations free a few, which its first writes
    take back.)"""
    db = sqlite3.connect(path)
    try:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        (pages,), (free,), (size,) = (db.execute(f"PRAGMA {p}").fetchone() for p in
                                      ("page_count", "freelist_count", "page_size"))
    finally:
        db.close()
    wal = path.with_name(path.name + "-wal")
    return int((pages - free) * size) + (wal.stat().st_size if wal.exists() else 0)


def _jsonl_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


# A table's data, indexes and TOAST, without the free-space and visibility maps: VACUUM
# makes those for a table with rows (32 kB at least), a fixed cost, not a per-step one.
_PG_BYTES = """
SELECT coalesce(sum(pg_total_relation_size(c.oid) - pg_relation_size(c.oid, 'fsm')
                    - pg_relation_size(c.oid, 'vm')), 0)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %s AND c.relkind = 'r'
"""


def _postgres_bytes(url: str, schema: str) -> int:
    """The bytes of the schema's tables (see _PG_BYTES), after a VACUUM, which makes the
    space of pruned snapshots reusable (the files keep their size)."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(url, autocommit=True) as conn:
        tables = [name for (name,) in conn.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = %s AND c.relkind = 'r'", (schema,))]
        for table in tables:
            conn.execute(sql.SQL("VACUUM {}.{}").format(sql.Identifier(schema),
                                                        sql.Identifier(table)))
        ((size,),) = conn.execute(_PG_BYTES, (schema,)).fetchall()
    return int(size)


def _fill(url: str, events: list[Event], snapshots: bool) -> None:
    store = open_store(url)
    try:
        # The journal's default: a snapshot every 1000 events, the newest 2 kept.
        fill(store, events, batch=1, snapshot_at=0 if snapshots else None)
    finally:
        store.close()


def _stored_bytes(variant: str, workdir: Path, events: list[Event],
                  postgres_url: str | None) -> int:
    """Bytes a run of ``events`` adds to an empty store, appended one event per call
    (batched durability where the store has it: syncing changes the time, not the
    bytes)."""
    backend, snapshots = variant.removesuffix(SNAPSHOTS), variant.endswith(SNAPSHOTS)
    path = workdir / f"storage-{variant}-{len(events)}"
    if backend == "jsonl":
        with JsonlStore(path, durability=Durability.BATCHED, batch_every=NEVER) as log:
            fill(log, events, batch=1, snapshot_at=0 if snapshots else None)
        return _jsonl_bytes(path)
    if backend == "sqlite":
        url, db = store_url("sqlite", path, "durability=batched"), Path(f"{path}.db")
        open_store(url).close()
        empty = _sqlite_bytes(db)  # schema pages: a fixed cost, not a per-step one
        _fill(url, events, snapshots)
        return _sqlite_bytes(db) - empty
    assert postgres_url is not None
    with throwaway_schema(postgres_url) as url:
        schema = url.rsplit("schema=", 1)[1]
        open_store(url).close()
        empty = _postgres_bytes(postgres_url, schema)
        _fill(f"{url}&durability=batched", events, snapshots)
        return _postgres_bytes(postgres_url, schema) - empty


def _variants(postgres_url: str | None) -> tuple[list[str], str | None]:
    """The variants this run measures, and why Postgres is left out (or None)."""
    problem = postgres_problem(postgres_url)
    backends = [b for b in BACKENDS if b != "postgres" or problem is None]
    return [v for b in backends for v in (b, b + SNAPSHOTS)], problem


def storage_figures(workdir: Path, steps: Sequence[int], postgres_url: str | None,
                    say: Say) -> list[Figure]:
    figures: list[Figure] = []
    per_step: dict[str, dict[int, float]] = {}
    variants, problem = _variants(postgres_url)
    for s in steps:
        say(f"storage: {s:,} steps, {', '.join(variants)}")
        events = workload(RUN, 2 + 3 * s)
        canonical = sum(len(encode(e)) for e in events)
        for variant in variants:
            size = _stored_bytes(variant, workdir, events, postgres_url)
            per_step.setdefault(variant, {})[s] = size / s
            figures.append(figure(f"storage.{variant}.step.{s}", size / s, "B/step",
                                  canonical / s, "canonical JSON of the step's events",
                                  "model_turn + tool_call_started + tool_call_completed"))
            if not variant.endswith(SNAPSHOTS):
                figures.append(figure(f"storage.{variant}.event.{s}", size / len(events),
                                      "B/event", canonical / len(events),
                                      "canonical JSON of the event"))
        if problem is not None:
            figures += [figure(f"storage.postgres{suffix}.step.{s}", None, "B/step",
                               note=f"skipped: {problem}") for suffix in ("", SNAPSHOTS)]
    for variant, by_steps in per_step.items():
        small, large = min(by_steps), max(by_steps)
        note = f"B/step, {large:,} / {small:,} steps; target 0.9-1.1x"
        if variant.endswith(SNAPSHOTS):
            note = (f"B/step, {large:,} / {small:,} steps; target ≤ 1.1x (2 snapshots kept, "
                    "their segments shared)")
        figures.append(figure(f"storage_growth.{variant}", by_steps[large] / by_steps[small],
                              "x", note=note))
    return figures
