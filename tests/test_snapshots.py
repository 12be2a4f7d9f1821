"""Snapshots are a cache: every way one can be wrong falls back to a full replay that
equals the live state, and the equivalence gate catches a snapshot that lies."""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Callable
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from agentjournal import (
    SCHEMA_VERSION,
    Agent,
    EventType,
    RunState,
    ScriptedModel,
    calls,
    fold,
    reply,
    snapshots,
    tool,
)
from agentjournal.errors import SnapshotSegmentError
from agentjournal.events import make_events
from agentjournal.journal import open_journal
from agentjournal.keyed import Keyed
from agentjournal.metrics import METRICS
from agentjournal.snapshots import (
    Segments,
    collect_segments,
    load_state,
    named_segments,
    settle,
    state_of,
    take,
    verify,
    write_snapshot,
)
from agentjournal.state import FOLD_VERSION, CompletedCall, apply, durable_fields
from agentjournal.store import Store
from agentjournal.store.base import Snapshot

from .builders import Crash
from .conftest import backend_params
from .strategies import run_logs
from .test_store_conformance import sync_failure

MakeStore = Callable[[], Store]
E = EventType


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
    live = a_run(store, steps=35, snapshot_every=100)  # a tail under a quarter: kept
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


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                 HealthCheck.too_slow])
@given(log=run_logs(), data=st.data())
def test_snapshot_plus_tail_equals_full_replay(tmp_path_factory: pytest.TempPathFactory,
                                               log: list[Any], data: st.DataObject) -> None:
    from agentjournal import open_store

    store = open_store(f"sqlite:///{tmp_path_factory.mktemp('h') / 'j.db'}")
    store.append("run-1", log, expected_seq=0, epoch=0)
    stored = list(store.read("run-1"))
    cut = data.draw(st.integers(1, len(stored)))
    try:
        snapshot = take(fold(stored[:cut]))
    except OverflowError:  # an integer msgpack cannot hold: never snapshotted (see below)
        assume(False)
    store.put_snapshot(snapshot)
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
def test_a_body_compressed_at_level_1_as_earlier_releases_did_still_loads(
    make_store: MakeStore
) -> None:
    store = make_store()
    live = a_run(store)
    newest = store.snapshots("r1")[0]
    level_1 = zlib.compress(zlib.decompress(newest.body), 1)
    assert level_1[:2] != newest.body[:2]  # zlib's header names the level
    store.delete_snapshots("r1")
    store.put_snapshot(with_digest(newest, level_1))
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


# --- segments: a snapshot writes what the store lacks; damage to one is a miss ----------


@pytest.fixture
def small_segments(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(snapshots, "SEGMENT", 4)  # many segments from a short run
    monkeypatch.setattr(snapshots, "BLOCK", 3)  # and blocks of them, and segments after


def names(snapshot: Snapshot) -> set[str]:
    return set(named_segments(snapshot.body))


@backend_params()
def test_a_snapshot_writes_only_the_segments_the_store_lacks(
    make_store: MakeStore, monkeypatch: pytest.MonkeyPatch, small_segments: None
) -> None:
    store = make_store()
    written: list[str] = []
    put = store.put_segments
    monkeypatch.setattr(store, "put_segments",
                        lambda run_id, parts: (written.extend(parts), put(run_id, parts)))
    live = a_run(store, steps=30, snapshot_every=12)
    newest, older = store.snapshots("r1")
    assert len(written) == len(set(written))  # none written twice
    assert len(names(newest)) >= 10 and names(older) < names(newest)
    # Every stored segment is named by a kept snapshot: those of pruned ones are gone.
    assert set(store.segments("r1", written)) == names(newest) | names(older)
    assert len(newest.body) < 2000  # the body holds digests and a few items, not the run
    loaded = load_state(make_store(), "r1")
    assert loaded.snapshot_seq == newest.seq and loaded.segments.digests() == names(newest)
    assert as_bytes(loaded.state) == as_bytes(live)


@backend_params()
@pytest.mark.parametrize("damage", ["missing", "another-body"])
def test_a_damaged_segment_is_a_miss_and_the_run_resumes_as_a_full_replay_does(
    make_store: MakeStore, damage: str, small_segments: None
) -> None:
    store = make_store()
    live = a_run(store, steps=30, snapshot_every=12)
    newest, older = store.snapshots("r1")
    for victim, falls_to in ((min(names(newest) - names(older)), older.seq),
                             (min(names(older)), 0)):  # one only the newest names, then one both do
        store.prune_segments("r1", names(newest) - {victim})
        if damage == "another-body":
            store.put_segments("r1", {victim: zlib.compress(msgspec.msgpack.encode([]))})
        loaded = load_state(make_store(), "r1")
        assert loaded.snapshot_seq == falls_to
        assert victim[:12] in loaded.misses[-1]  # the last snapshot tried, because of it
        assert as_bytes(loaded.state) == as_bytes(live)
    # The next snapshot writes the damaged segments again (the last load named none of
    # them as sound), and the run loads from it.
    assert write_snapshot(store, live, segments=loaded.segments) is not None
    again = load_state(make_store(), "r1")
    assert again.snapshot_seq == live.last_seq and not again.misses
    assert as_bytes(again.state) == as_bytes(live)


@backend_params()
def test_a_crash_between_the_segments_and_the_snapshot_leaves_the_previous_one(
    make_store: MakeStore, small_segments: None
) -> None:
    store = make_store()
    live = a_run(store, steps=30, snapshot_every=None)
    log = list(store.read("r1"))
    first = write_snapshot(store, fold(log[:40]))
    assert first is not None

    def crash(*args: object, **kwargs: object) -> None:
        raise OSError(5, "the machine died here")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(store, "put_snapshot", crash)  # segments written, never named
        assert write_snapshot(store, live) is None
    loaded = load_state(make_store(), "r1")
    assert loaded.snapshot_seq == 40 and as_bytes(loaded.state) == as_bytes(live)
    orphans = set(store.segments("r1", names(take_segmented(live)))) - names(first)
    assert orphans and collect_segments(store, "r1") == len(orphans)
    assert load_state(make_store(), "r1").snapshot_seq == 40


def take_segmented(state: RunState) -> Snapshot:
    return snapshots._take(state, snapshots.SEGMENT)[0]


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                 HealthCheck.too_slow])
@given(log=run_logs(max_events=60), data=st.data())
def test_a_chain_of_segmented_snapshots_plus_tail_equals_full_replay(
    tmp_path_factory: pytest.TempPathFactory, log: list[Any], data: st.DataObject
) -> None:
    """Random logs, folded into one state as a journal folds them, with snapshots at
    random points written as it writes them (what its segments held, by identity, is
    neither encoded nor written again), segments of 2, and after some of them the run
    resumed from the snapshot just written, lazily, as a journal resumes it: the live
    state, the newest snapshot plus its tail, and each older one plus its tail, equal
    the full replay on every durable field, and in every byte once settled."""
    from agentjournal import open_store

    store = open_store(f"sqlite:///{tmp_path_factory.mktemp('h') / 'j.db'}")
    store.append("run-1", log, expected_seq=0, epoch=0)
    stored = list(store.read("run-1"))
    cuts = set(data.draw(st.lists(st.integers(1, len(stored)), min_size=1, max_size=4)))
    state, segments, written = RunState(), Segments(), []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(snapshots, "SEGMENT", 2)
        patch.setattr(snapshots, "BLOCK", 2)
        for event in stored:
            apply(state, event)
            # (A state holding an integer msgpack cannot hold is not snapshotted.)
            if event.seq in cuts and (snapshot := write_snapshot(
                    store, state, keep=len(cuts), segments=segments)):
                written.append(event.seq)
                if data.draw(st.booleans(), label="resume here"):
                    segments = Segments()
                    resumed, _ = snapshots.decode_snapshot(store, snapshot, segments, lazy=True)
                    assert resumed is not None
                    state = resumed
    full = durable_fields(fold(stored))
    assert durable_fields(state) == full
    settle(state)
    assert as_bytes(state) == as_bytes(fold(stored))
    newest_first = store.snapshots("run-1")
    assert [s.seq for s in newest_first] == written[::-1]
    for older, snapshot in enumerate(newest_first):
        lazily = load_state(store, "run-1", lazy=True)  # its tail folded into lazy maps
        assert lazily.snapshot_seq == snapshot.seq and durable_fields(lazily.state) == full
        settle(lazily.state)
        assert as_bytes(lazily.state) == as_bytes(fold(stored))
        loaded = load_state(store, "run-1")
        assert loaded.snapshot_seq == snapshot.seq and len(loaded.misses) == older
        assert durable_fields(loaded.state) == full
        assert as_bytes(loaded.state) == as_bytes(fold(stored))
        store.put_snapshot(tampered(snapshot, digest="0" * 64), keep=len(cuts))  # a miss now
    store.close()


@backend_params()
def test_verify_reads_a_segmented_snapshot_whole_and_catches_it_lying(
    make_store: MakeStore, small_segments: None
) -> None:
    store = make_store()
    live = a_run(store, steps=30, snapshot_every=12)
    assert verify(store, "r1").ok
    lie = fold(list(store.read("r1")))
    lie.messages[5] = msgspec.structs.replace(lie.messages[5], content="not what was said")
    assert write_snapshot(store, lie) is not None  # a fold bug, in a sealed segment
    report = verify(store, "r1")
    assert not report.ok and report.quarantined == [FOLD_VERSION]
    assert "messages" in report.mismatches[0].fields
    assert as_bytes(load_state(store, "r1").state) == as_bytes(live)


@backend_params()
def test_a_state_msgpack_cannot_hold_is_not_snapshotted_and_the_run_goes_on(
    make_store: MakeStore, caplog: pytest.LogCaptureFixture
) -> None:
    """JSON holds any integer, msgpack none past 64 bits: a run whose state holds one
    is not snapshotted (logged: a snapshot is a cache), and it finishes and loads."""

    @tool(effect="idempotent")
    def big(n: int) -> dict[str, int]:
        """Return a number msgpack cannot hold."""
        return {"n": 2**70 + n}

    script = ScriptedModel([calls(("big", {"n": i})) for i in range(3)] + [reply("done")])
    store = make_store()
    result = Agent(script, [big], snapshot_every=2).run(store, "r1", "go")
    assert result.status == "finished" and "not written" in caplog.text
    first_big = next(e.seq for e in store.read("r1") if e.type is E.TOOL_CALL_COMPLETED)
    assert all(s.seq < first_big for s in store.snapshots("r1"))
    loaded = load_state(make_store(), "r1")
    assert loaded.snapshot_seq < first_big
    assert as_bytes(loaded.state) == as_bytes(result.state)


@backend_params()
def test_a_re_read_result_in_a_written_segment_is_written_again(
    make_store: MakeStore, small_segments: None
) -> None:
    """A writer knows its segments by the objects they held: a fact that changes one
    already written (a re-read result supersedes the old one in the context and in the
    completed calls) must give a new segment, not the old one named again."""
    store = make_store()
    facts: list[tuple[EventType, dict[str, Any]]] = [(E.RUN_STARTED, {"task": "t"})]
    for n in range(4):  # four completed calls: a full segment of them, c0's among them
        args = {"account": f"a{n}"}
        facts += [
            (E.MODEL_TURN, {"text": "", "tool_calls": [{"id": f"c{n}", "name": "balance",
                                                        "args": args}]}),
            (E.TOOL_CALL_STARTED, {"key": f"k{n}", "tool": "balance", "args": args,
                                   "call_id": f"c{n}", "effect": "read_only", "attempt": 1}),
            (E.TOOL_CALL_COMPLETED, {"started_seq": 3 + 3 * n, "call_id": f"c{n}",
                                     "tool": "balance", "idempotency_key": f"k{n}",
                                     "result": {"b": 100}, "fresh_for": 0.3})]
    facts += [(E.USER_MESSAGE, {"content": f"m{i}"}) for i in range(4)]
    facts.append((E.OBSERVATIONS_CHECKED, {"items": [{
        "call_id": "c0", "tool": "balance", "args": {"account": "a0"}, "observed_seq": 4,
        "age_s": 1.0, "verdict": "changed", "result": {"b": 80}}]}))
    events = make_events("r1", 0, 0, facts)
    store.append("r1", events, expected_seq=0, epoch=0)
    state, segments = RunState(), Segments()
    for event in events:
        apply(state, event)
        if event.seq in (len(events) - 1, len(events)):  # before the re-read, and after
            assert write_snapshot(store, state, segments=segments) is not None
    loaded = load_state(make_store(), "r1")
    assert loaded.snapshot_seq == len(events)
    assert as_bytes(loaded.state) == as_bytes(fold(events))
    assert loaded.state.completed["k0"].result == {"b": 80}


class Fetches:
    """Counts the segments a store is asked for."""

    def __init__(self, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
        self.digests: list[str] = []
        fetch = store.segments

        def counted(run_id: str, digests: Any) -> dict[str, bytes]:
            self.digests += digests
            return fetch(run_id, digests)

        monkeypatch.setattr(store, "segments", counted)


def completion_keys(store: Store, run_id: str) -> list[str]:
    return [e.payload["idempotency_key"] for e in store.read(run_id)
            if e.type is E.TOOL_CALL_COMPLETED]


@backend_params()
def test_a_resumed_journal_decodes_only_the_segments_a_lookup_needs(
    make_store: MakeStore, monkeypatch: pytest.MonkeyPatch, small_segments: None
) -> None:
    store = make_store()
    a_run(store, steps=40, snapshot_every=12)
    log = list(store.read("r1"))
    reader = make_store()
    fetches = Fetches(reader, monkeypatch)
    with open_journal(reader, "r1") as j:
        completed = j.state.completed
        attempts = j.state.attempts
        assert isinstance(completed, Keyed) and len(completed.heads) >= 8
        assert isinstance(attempts, Keyed) and len(attempts.heads) >= 8
        keyed = {h.digest for h in [*completed.heads, *attempts.heads]}
        assert not keyed & set(fetches.digests)  # only checked to be there
        fetches.digests.clear()
        assert "0" * 64 not in completed and attempts.get("0" * 64) is None
        assert fetches.digests == []  # the filters said no
        first = completion_keys(store, "r1")[0]
        assert completed[first].result == {"n": 0}
        assert fetches.digests == [completed.heads[0].digest]  # one segment, the one it is in
        assert durable_fields(j.state) == durable_fields(fold(log))  # walks it all
        settle(j.state)
        assert type(j.state.completed) is dict and type(j.state.attempts) is dict


@backend_params()
def test_a_run_resumed_lazily_is_served_a_result_from_an_undecoded_segment(
    make_store: MakeStore, small_segments: None
) -> None:
    """Calls made before the snapshot are in segments the resumed run has not decoded:
    asked again after the resume, one is served from the log, never made again."""
    made: list[int] = []

    @tool(effect="idempotent")
    def step(n: int) -> dict[str, int]:
        if n == 30 and 30 not in made:
            made.append(30)
            raise Crash
        made.append(n)
        return {"n": n}

    turns = [calls(("step", {"n": i})) for i in range(31)]
    store = make_store()
    with pytest.raises(Crash):
        Agent(ScriptedModel(turns), [step], snapshot_every=12).run(store, "r1", "go")
    assert store.snapshots("r1")
    again = ScriptedModel([*turns, calls(("step", {"n": 3})), reply("done")])
    result = Agent(again, [step], snapshot_every=12).run(make_store(), "r1")
    assert result.status == "finished" and type(result.state.completed) is dict  # settled
    assert sorted(made) == [*range(30), 30, 30]  # 30: crashed, then retried by its key
    served = [e for e in store.read("r1") if e.type is E.TOOL_RESULT_SERVED]
    assert [e.payload["result"] for e in served] == [{"n": 3}]
    assert as_bytes(result.state) == as_bytes(fold(list(store.read("r1"))))
    # A caller that reads the status only (a worker) may leave the maps lazy.
    reader = make_store()
    unsettled = Agent(again, [step], snapshot_every=12).run(reader, "r1", settle=False)
    assert isinstance(unsettled.state.completed, Keyed)
    assert durable_fields(unsettled.state) == durable_fields(result.state)


@backend_params()
@pytest.mark.parametrize("damage", ["missing", "another-body"])
def test_a_segment_found_damaged_after_a_lazy_load_sets_the_snapshots_aside(
    make_store: MakeStore, damage: str, small_segments: None
) -> None:
    store = make_store()
    live = a_run(store, steps=30, snapshot_every=12)
    first = completion_keys(store, "r1")[0]
    with open_journal(make_store(), "r1") as j:
        completed = j.state.completed
        assert isinstance(completed, Keyed)
        victim = completed.heads[0].digest
        store.prune_segments("r1", set(store.segment_digests("r1")) - {victim})
        if damage == "another-body":
            store.put_segments("r1", {victim: zlib.compress(msgspec.msgpack.encode([]))})
        with pytest.raises(SnapshotSegmentError, match=victim[:12]) as caught:
            completed.get(first)
        assert caught.value.retryable
    assert store.snapshots("r1") == []  # set aside: the next open folds the log
    loaded = load_state(make_store(), "r1", lazy=True)
    assert loaded.snapshot_seq == 0 and as_bytes(loaded.state) == as_bytes(live)


@backend_params()
@pytest.mark.parametrize("damage", ["missing", "another-body"])
def test_a_lazy_load_reads_and_checks_the_filters_it_relies_on(
    make_store: MakeStore, damage: str, small_segments: None
) -> None:
    """The block objects (the filters of full blocks of segments) are read at load: one
    missing or damaged makes the snapshot a miss, as a segment does for a plain load."""
    store = make_store()
    live = a_run(store, steps=30, snapshot_every=12)
    newest, older = store.snapshots("r1")
    form = snapshots._form_of(newest.body)
    assert form is not None and form.completed_blocks
    victim = form.completed_blocks[-1]
    falls_to = older.seq if victim not in names(older) else 0  # (0: both name it)
    store.prune_segments("r1", (names(newest) | names(older)) - {victim})
    if damage == "another-body":
        store.put_segments("r1", {victim: zlib.compress(msgspec.msgpack.encode([]))})
    loaded = load_state(make_store(), "r1", lazy=True)
    assert loaded.snapshot_seq == falls_to and victim[:12] in loaded.misses[-1]
    settle(loaded.state)
    assert as_bytes(loaded.state) == as_bytes(live)


def test_a_segment_is_named_by_its_stored_bytes_and_one_named_by_its_msgpack_still_loads(
) -> None:
    raw = msgspec.msgpack.encode([["k", 1]])
    stored = zlib.compress(raw, 1)
    by_stored, by_msgpack = (hashlib.sha256(b).hexdigest() for b in (stored, raw))
    assert snapshots._segment({by_stored: stored}, by_stored) == raw
    assert snapshots._segment({by_msgpack: stored}, by_msgpack) == raw  # earlier releases'
    for damaged in (zlib.compress(b"\x90", 1), b"not zlib"):
        with pytest.raises(snapshots.SegmentError, match="does not match"):
            snapshots._segment({by_stored: damaged}, by_stored)


def test_a_key_set_again_after_a_lazy_resume_keeps_its_place_and_its_new_value(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key set again in a resumed run stays in the segment that held it, written anew:
    were it written again after the others, two segments would hold it, and decoding
    the older one last would bring its old value back."""
    from agentjournal import open_store

    monkeypatch.setattr(snapshots, "SEGMENT", 2)
    monkeypatch.setattr(snapshots, "BLOCK", 2)
    store = open_store(f"sqlite:///{tmp_path / 'j.db'}")

    def resumed(state: RunState, segments: Segments) -> tuple[RunState, Segments]:
        snapshot = write_snapshot(store, state, segments=segments)
        assert snapshot is not None
        again = Segments()
        loaded, why = snapshots.decode_snapshot(store, snapshot, again, lazy=True)
        assert loaded is not None, why
        return loaded, again

    state = RunState(run_id="r1", last_seq=1, attempts=dict.fromkeys("abcd", 1))
    state, segments = resumed(state, Segments())
    state.last_seq = 2
    state.attempts["a"] = 2
    state.attempts["e"] = state.attempts["f"] = 1
    state, _ = resumed(state, segments)
    assert state.attempts["e"] == 1 and state.attempts["b"] == 1  # decoding one, then another
    assert state.attempts["a"] == 2
    settle(state)
    assert list(state.attempts.items()) == [("a", 2), *((k, 1) for k in "bcdef")]


KEYS = ["ab" * 32, "AB" * 32, "a" * 63, "g" * 64, "k", "", "ab" * 32 + "0", "0" * 64, "é" * 64]


@backend_params()
@pytest.mark.parametrize("packed", [True, False], ids=["as-written", "text-keys-as-before"])
def test_keys_of_every_form_come_back_from_segments_as_they_went_in(
    make_store: MakeStore, monkeypatch: pytest.MonkeyPatch, small_segments: None,
    packed: bool
) -> None:
    """An idempotency key (64 lowercase hex digits) is stored as its 32 bytes; every other
    key as text. Segments written before, all keys text, still load."""
    state = RunState(run_id="r1", last_seq=1, attempts={k: i for i, k in enumerate(KEYS)})
    state.completed = {k: CompletedCall(result={"i": i}, seq=i) for i, k in enumerate(KEYS)}
    store = make_store()
    with monkeypatch.context() as m:
        if not packed:  # as releases before packed keys wrote them
            m.setattr(snapshots, "_packed", lambda pairs: list(pairs))
        snapshot = write_snapshot(store, state)
    assert snapshot is not None
    for lazy in (False, True):
        loaded, why = snapshots.decode_snapshot(store, snapshot, Segments(), lazy=lazy)
        assert loaded is not None, why
        assert [loaded.attempts[k] for k in KEYS] == list(range(len(KEYS)))  # lookups
        settle(loaded)
        assert list(loaded.attempts) == KEYS and list(loaded.completed) == KEYS
        assert as_bytes(loaded) == as_bytes(state)
    stored = [snapshot.body, *store.segments("r1", named_segments(snapshot.body)).values()]
    raw = b"".join(zlib.decompress(body) for body in stored)
    assert (bytes.fromhex("ab" * 32) in raw) == packed  # an idempotency key: 32 bytes
    assert (b"0" * 64 in raw) != packed
    assert all(k.encode() in raw for k in KEYS if not snapshots._HEX_KEY.fullmatch(k))


@backend_params()
def test_a_run_that_stops_cleanly_is_snapshotted_so_its_next_open_replays_little(
    make_store: MakeStore,
) -> None:
    store = make_store()
    live = a_run(store, steps=30, snapshot_every=40)
    newest = store.snapshots("r1")[0]
    assert live.last_seq % 40 >= 10 and newest.seq == live.last_seq  # a quarter or more
    assert load_state(make_store(), "r1").replayed == 0
    assert as_bytes(load_state(make_store(), "r1").state) == as_bytes(live)


@backend_params()
def test_a_run_that_fails_is_not_snapshotted_at_its_end(make_store: MakeStore) -> None:
    @tool(effect="idempotent")
    def step(n: int) -> dict[str, int]:
        if n == 25:
            raise Crash
        return {"n": n}

    store = make_store()
    script = ScriptedModel([calls(("step", {"n": i})) for i in range(30)])
    with pytest.raises(Crash):
        Agent(script, [step], snapshot_every=40).run(store, "r1", "go")
    assert store.snapshots("r1")[0].seq < store.last_seq("r1")


@backend_params()
def test_a_run_at_rest_with_facts_staged_is_not_snapshotted(make_store: MakeStore) -> None:
    """A staged fact is folded, not stored: a snapshot then would be ahead of the log."""
    store = make_store()
    a_run(store, steps=3, snapshot_every=None)
    with open_journal(store, "r1", snapshot_every=4) as j:
        j.stage([(E.USER_MESSAGE, {"content": "not stored yet"})])
        j.at_rest()
        assert store.snapshots("r1") == []
        j.flush()
        j.at_rest()
        assert [s.seq for s in store.snapshots("r1")] == [store.last_seq("r1")]
