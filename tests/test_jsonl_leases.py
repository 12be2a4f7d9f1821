"""JsonlStore leases are judged by the host's boot-time clock, never a worker's wall clock."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from agentjournal import LeaseHeldError
from agentjournal.store.base import host_clock
from agentjournal.store.jsonl import JsonlStore

needs_boot_id = pytest.mark.skipif(not host_clock()[0], reason="no boot id on this host")


def lease_file(tmp_path: Path) -> Path:
    return tmp_path / "runs" / "r1.lease"


def edit_lease(tmp_path: Path, **fields: object) -> None:
    record = json.loads(lease_file(tmp_path).read_bytes())
    record.update(fields)
    for name in [k for k, v in fields.items() if v is None]:
        del record[name]
    lease_file(tmp_path).write_text(json.dumps(record))


@needs_boot_id
def test_a_fast_wall_clock_cannot_take_a_live_lease(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    JsonlStore(tmp_path / "runs").acquire("r1", "a", ttl=30)
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 3600)  # this worker's clock is an hour on
    other = JsonlStore(tmp_path / "runs")
    with pytest.raises(LeaseHeldError) as info:
        other.acquire("r1", "b", ttl=30)
    assert 0 < info.value.expires_in <= 30


@needs_boot_id
def test_a_slow_wall_clock_does_not_keep_an_expired_lease(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = JsonlStore(tmp_path / "runs")
    store.acquire("r1", "a", ttl=0.05)
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() - 3600)
    time.sleep(0.1)
    assert store.acquire("r1", "b", ttl=30).epoch == 2


@needs_boot_id
def test_the_lease_file_records_the_host_clock_deadline(tmp_path: Path) -> None:
    store = JsonlStore(tmp_path / "runs")
    lease = store.acquire("r1", "a", ttl=30)
    record = json.loads(lease_file(tmp_path).read_bytes())
    boot, now = host_clock()
    assert record["boot_id"] == boot and now < record["boot_deadline"] <= now + 30
    assert record["expires_at"] == lease.expires_at  # the wall clock, for people to read
    renewed = store.renew(lease, ttl=60)
    assert json.loads(lease_file(tmp_path).read_bytes())["boot_deadline"] > now + 30
    store.release(renewed)
    assert store.acquire("r1", "b", ttl=30).epoch == 2  # released: taken over at once


@needs_boot_id
def test_a_lease_from_another_boot_is_over(tmp_path: Path) -> None:
    store = JsonlStore(tmp_path / "runs")
    store.acquire("r1", "a", ttl=3600)
    edit_lease(tmp_path, boot_id="0d6f3c1e-another-boot")
    assert store.acquire("r1", "b", ttl=30).epoch == 2


@needs_boot_id
def test_the_host_clock_decides_not_expires_at(tmp_path: Path) -> None:
    store = JsonlStore(tmp_path / "runs")
    store.acquire("r1", "a", ttl=3600)
    edit_lease(tmp_path, expires_at=time.time() - 60)  # by the wall clock long over
    with pytest.raises(LeaseHeldError):
        store.acquire("r1", "b", ttl=30)
    edit_lease(tmp_path, expires_at=time.time() + 3600, boot_deadline=host_clock()[1] - 1)
    assert store.acquire("r1", "b", ttl=30).epoch == 2


def test_an_old_lease_file_is_judged_by_the_wall_clock(tmp_path: Path) -> None:
    store = JsonlStore(tmp_path / "runs")
    store.acquire("r1", "a", ttl=30)
    edit_lease(tmp_path, boot_id=None, boot_deadline=None, expires_at=time.time() + 30)
    with pytest.raises(LeaseHeldError):
        store.acquire("r1", "b", ttl=30)
    edit_lease(tmp_path, expires_at=time.time() - 1)
    assert store.acquire("r1", "b", ttl=30).epoch == 2
    assert store.renew(store.acquire("r1", "b", ttl=30), ttl=30).epoch == 2
