"""Snapshots are a cache: every way one can be wrong falls back to a full replay that
equals the live state, and the equivalence gate catches a snapshot that lies."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentjournal import SCHEMA_VERSION, Agent, RunState, ScriptedModel, calls, fold, reply, tool
from agentjournal.metrics import METRICS
from agentjournal.snapshots import load_state, state_of, take, verify, write_snapshot
from agentjournal.state import FOLD_VERSION
from agentjournal.store import Store

from .conftest import backend_params
from .strategies import run_logs
from .test_store_conformance import sync_failure

MakeStore = Callable[[], Store]


def as_bytes(state: RunState) -> bytes:
    return msgspec.json.encode(state)


def a_run(store: Store, steps: int = 12, snapshot_every: int | None = 6) -> RunState:
    @tool(effect="idempotent")
    def step(n: int) -> dict[str, int]:
        return {"n": n}

    script = ScriptedModel([calls(("step", {"n": i})) for i in range(steps)] + [reply("done")])
    return Agent(script, [step], snapshot_every=snapshot_every).run(store, "r1", "go").state


def tampered(snapshot: Any, **changes: Any) -> Any:
    return msgspec.structs.replace(snapshot, **changes)


def with_digest(snapshot: Any, body: bytes) -> Any:
    return tampered(snapshot, body=body, digest=hashlib.sha256(body).hexdigest())


CORRUPTIONS: dict[str, Callable[[Any], Any]] = {
    "bad-digest": lambda s: tampered(s, digest="0" * 64),
    "truncated-body": lambda s: with_digest(s, s.body[: len(s.body) // 2]),
    "not-zlib-after-its-header": lambda s: with_digest(s, s.body[:2] + b"not deflate"),
    "unknown-fold-version": lambda s: tampered(s, fold_version=FOLD_VERSION + 1),
    "unknown-schema-version": lambda s: tampered(s, schema_version=99),
    "gap-after-snapshot": lambda s: tampered(s, seq=s.seq + 1000),
}


@backend_params()
@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
def test_corrupt_snapshot_falls_back_to_full_replay(make_store: MakeStore,
                                                   corruption: str) -> None:
    store = make_store()
    live = a_run(store)
    newest = store.snapshots("r1")[0]
    store.delete_snapshots("r1")
    store.put_snapshot(CORRUPTIONS[corruption](newest))
    misses = METRICS.snapshot().get("snapshot_misses", 0)
    loaded = load_state(store, "r1")
    assert loaded.snapshot_seq == 0 and loaded.replayed == live.last_seq
    assert len(loaded.misses) == 1
    assert METRICS.snapshot()["snapshot_misses"] == misses + 1
    assert as_bytes(loaded.state) == as_bytes(live) == as_bytes(fold(store.read("r1")))


@backend_params()
def test_snapshot_plus_tail_is_used_and_equals_live(make_store: MakeStore) -> None:
    store = make_store()
    live = a_run(store)
    loaded = load_state(store, "r1")
    assert 0 < loaded.snapshot_seq < live.last_seq
    assert loaded.replayed == live.last_seq - loaded.snapshot_seq
    assert as_bytes(loaded.state) == as_bytes(live)


@backend_params()
def test_all_snapshots_deleted_still_recovers(make_store: MakeStore) -> None:
    store = make_store()
    live = a_run(store)
    assert store.delete_snapshots("r1") >= 1
    loaded = load_state(store, "r1")
    assert loaded.snapshot_seq == 0 and as_bytes(loaded.state) == as_bytes(live)


@backend_params()
def test_older_snapshot_used_when_newest_is_bad(make_store: MakeStore) -> None:
    store = make_store()
    live = a_run(store, steps=20)
    newest, older = store.snapshots("r1")[:2]
    store.put_snapshot(tampered(newest, digest="f" * 64), keep=3)
    loaded = load_state(store, "r1")
    assert loaded.snapshot_seq == older.seq and as_bytes(loaded.state) == as_bytes(live)


@backend_params()
def test_crash_between_body_and_publish_leaves_previous_snapshot(
    make_store: MakeStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = make_store()
    live = a_run(store)
    before = [s.seq for s in store.snapshots("r1")]

    failure = sync_failure(store)

    def crash(*args: object) -> None:
        raise failure

    monkeypatch.setattr(store, "_sync", crash)  # the body is written, never published
    assert write_snapshot(store, live) is None  # a cache: logged, not fatal
    monkeypatch.undo()
    reopened = make_store()
    assert [s.seq for s in reopened.snapshots("r1")] == before
    assert as_bytes(load_state(reopened, "r1").state) == as_bytes(live)


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(log=run_logs(), data=st.data())
def test_snapshot_plus_tail_equals_full_replay(tmp_path_factory: pytest.TempPathFactory,
                                               log: list[Any], data: st.DataObject) -> None:
    from agentjournal import open_store

    store = open_store(f"sqlite:///{tmp_path_factory.mktemp('h') / 'j.db'}")
    store.append("run-1", log, expected_seq=0, epoch=0)
    stored = list(store.read("run-1"))
    cut = data.draw(st.integers(1, len(stored)))
    store.put_snapshot(take(fold(stored[:cut])))
    loaded = load_state(store, "run-1")
    assert loaded.snapshot_seq == cut
    assert as_bytes(loaded.state) == as_bytes(fold(stored))
    store.close()


@backend_params()
def test_verify_passes_on_a_sound_run(make_store: MakeStore) -> None:
    store = make_store()
    a_run(store)
    report = verify(store, "r1")
    assert report.ok and report.snapshots_checked == 2 and report.events > 20


@backend_params()
def test_a_plain_msgpack_body_written_before_compression_still_loads(
    make_store: MakeStore
) -> None:
    store = make_store()
    live = a_run(store)
    newest = store.snapshots("r1")[0]
    assert len(newest.body) * 2 < len(msgspec.msgpack.encode(state_of(newest.body)))
    store.delete_snapshots("r1")
    store.put_snapshot(with_digest(newest, msgspec.msgpack.encode(state_of(newest.body))))
    loaded = load_state(store, "r1")
    assert loaded.snapshot_seq == newest.seq and not loaded.misses
    assert as_bytes(loaded.state) == as_bytes(live)


@backend_params()
def test_verify_catches_a_lying_snapshot_and_quarantines_its_version(
    make_store: MakeStore
) -> None:
    store = make_store()
    live = a_run(store)
    newest = store.snapshots("r1")[0]
    lie = state_of(newest.body)
    lie.completed.clear()  # a fold bug: it forgot the completed calls
    store.put_snapshot(take(lie))
    failures = METRICS.snapshot().get("full_replay_equivalence_failures", 0)
    report = verify(store, "r1")
    assert not report.ok and report.quarantined == [FOLD_VERSION]
    (mismatch,) = report.mismatches
    assert mismatch.check == "snapshot" and mismatch.seq == newest.seq
    assert "completed" in mismatch.fields and "final.completed" in mismatch.fields
    assert METRICS.snapshot()["full_replay_equivalence_failures"] == failures + 1
    assert FOLD_VERSION in store.quarantined()
    loaded = load_state(store, "r1")  # the quarantined version is never loaded again
    assert loaded.snapshot_seq == 0 and as_bytes(loaded.state) == as_bytes(live)
    assert write_snapshot(store, live) is None  # nor written


@backend_params()
def test_recovery_metrics_are_kept_per_schema_version(make_store: MakeStore) -> None:
    store = make_store()
    a_run(store)
    label = f'{{schema_version="{SCHEMA_VERSION}"}}'
    before = METRICS.snapshot()
    loaded = load_state(store, "r1")
    after = METRICS.snapshot()
    for name in ("events_replayed", f"events_replayed{label}"):
        assert after[name] == before.get(name, 0) + loaded.replayed
    for name in ("snapshot_load_ms", "replay_duration_ms"):
        assert after[f"{name}{label}"]["count"] == before.get(
            f"{name}{label}", {"count": 0})["count"] + 1
    assert after[f"snapshot_seq_gap{label}"] == loaded.replayed
    text = METRICS.prometheus().splitlines()
    assert "# TYPE agentjournal_events_replayed_total counter" in text
    assert f"agentjournal_events_replayed_total{label} {after[f'events_replayed{label}']:g}" in text
    assert f"agentjournal_snapshot_load_ms_count{label} " in "\n".join(text)
    assert not [line for line in text  # only per label: a scraper sums them
                if line.startswith("agentjournal_events_replayed_total ")]
