"""Small builders shared by the tests."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

import msgspec

from agentjournal.events import Event
from agentjournal.store.base import Snapshot

T0 = datetime(2025, 1, 1, tzinfo=UTC)


def snapshot_at(run_id: str, seq: int, body: bytes = b"state",
                fold_version: int = 1) -> Snapshot:
    """A snapshot record at ``seq`` (its created_at follows its seq, so order is fixed)."""
    return Snapshot(run_id=run_id, seq=seq, schema_version=2, fold_version=fold_version,
                    digest=hashlib.sha256(body).hexdigest(), body=body,
                    created_at=T0 + timedelta(seconds=seq))


def unsealed(events: Iterable[Event]) -> list[Event]:
    """``events`` without the digests a store gave them, to compare with what was appended."""
    return [msgspec.structs.replace(e, digest="") for e in events]


class Crash(BaseException):
    """The process dies mid-call: nothing after the start is recorded."""
