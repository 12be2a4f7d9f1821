"""5. Bytes per event and per step as a run grows."""

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
from .replay import (
    fill,
)

# --- 5. storage ---------------------------------------------------------------------------


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


def _stored_bytes(variant: str, workdir: Path, events: list[Event]) -> int:
    """Bytes a run of ``events`` adds to an empty store, appended one event per call
    (batched durability: syncing changes the time, not the bytes)."""
    path = workdir / f"storage-{variant}-{len(events)}"
    if variant == "jsonl":
        with JsonlStore(path, durability=Durability.BATCHED, batch_every=NEVER) as log:
            fill(log, events, batch=1, snapshot_at=None)
        return _jsonl_bytes(path)
    url, db = store_url("sqlite", path, "durability=batched"), Path(f"{path}.db")
    open_store(url).close()
    empty = _sqlite_bytes(db)  # schema pages: a fixed cost, not a per-step one
    store = open_store(url)
    try:
        # The journal's default: a snapshot every 1000 events, the newest 2 kept.
        fill(store, events, batch=1, snapshot_at=0 if variant == "sqlite+snapshots" else None)
    finally:
        store.close()
    return _sqlite_bytes(db) - empty


def storage_figures(workdir: Path, steps: Sequence[int], say: Say) -> list[Figure]:
    figures: list[Figure] = []
    per_step: dict[str, dict[int, float]] = {}
    for s in steps:
        say(f"storage: {s:,} steps")
        events = workload(RUN, 2 + 3 * s)
        canonical = sum(len(encode(e)) for e in events)
        for variant in ("sqlite", "jsonl", "sqlite+snapshots"):
            size = _stored_bytes(variant, workdir, events)
            per_step.setdefault(variant, {})[s] = size / s
            figures.append(figure(f"storage.{variant}.step.{s}", size / s, "B/step",
                                  canonical / s, "canonical JSON of the step's events",
                                  "model_turn + tool_call_started + tool_call_completed"))
            if variant != "sqlite+snapshots":
                figures.append(figure(f"storage.{variant}.event.{s}", size / len(events),
                                      "B/event", canonical / len(events),
                                      "canonical JSON of the event"))
    for variant, by_steps in per_step.items():
        small, large = min(by_steps), max(by_steps)
        note = f"B/step, {large:,} / {small:,} steps; target 0.9-1.1x"
        if variant == "sqlite+snapshots":
            note = (f"B/step, {large:,} / {small:,} steps; target ≤ 1.1x (2 snapshots kept, "
                    "their segments shared)")
        figures.append(figure(f"storage_growth.{variant}", by_steps[large] / by_steps[small],
                              "x", note=note))
    return figures


