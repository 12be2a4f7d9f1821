"""The one store conformance suite: every backend runs every test here.

Test ids read ``TestConformance::test_...[jsonl|sqlite|postgres]``.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import re
import sqlite3
import threading
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from agentjournal import (
    ArchivedRunError,
    ConflictError,
    CorruptLogError,
    DurabilityError,
    EncodingError,
    Event,
    EventType,
    FencedError,
    InvalidRunIdError,
    LeaseHeldError,
    LeaseReleasedError,
    NotArchivedError,
    ScopeSharedError,
    encode,
    make_events,
    open_store,
)
from agentjournal.events import chain_digest
from agentjournal.snapshots import verify
from agentjournal.store import Store
from agentjournal.store.base import Tombstone, records_digest
from agentjournal.store.sqlite import in_run

from .builders import T0, snapshot_at, unsealed
from .conftest import backend_params

MakeStore = Callable[[], Store]


def facts(*payloads: dict[str, Any]) -> list[tuple[EventType, dict[str, Any]]]:
    return [(EventType.USER_MESSAGE, p) for p in payloads]


def append(store: Store, run_id: str, *payloads: dict[str, Any], epoch: int = 0) -> int:
    last = store.last_seq(run_id)
    events = make_events(run_id, last, epoch, facts(*payloads))
    return store.append(run_id, events, expected_seq=last, epoch=epoch)


def files_near(tmp_path: Path) -> set[Path]:
    """Every file under the test's directory, and the entries beside it. (Not under its
    siblings: other tests' leftovers, such as an SQLite -wal file a late garbage
    collection removes, are not this test's doing.)"""
    return {*tmp_path.rglob("*"), *tmp_path.parent.iterdir()}


def race_in_process(url: str, run_id: str, name: str, barrier: Any, results: Any) -> None:
    """One racer: append at seq 1, and on conflict re-read and append after the winner."""
    store = open_store(url)
    barrier.wait()
    try:
        events = make_events(run_id, 0, 0, facts({"content": name}))
        store.append(run_id, events, expected_seq=0, epoch=0)
        results.put((name, "won"))
    except ConflictError:
        last = store.last_seq(run_id)
        events = make_events(run_id, last, 0, facts({"content": name}))
        store.append(run_id, events, expected_seq=last, epoch=0)
        results.put((name, "conflict"))
    finally:
        store.close()


# --- raw edits of stored events, around the store (tamper evidence) ------------------


def rewrite_stored(store: Store, run_id: str, event: Event, body: bytes) -> None:
    """Replace the stored bytes of ``event`` (as read back) with ``body``, in place,
    by the backend's own means: what someone with write access to the storage can do."""
    kind = type(store).__name__
    if kind == "SQLiteStore":
        db = sqlite3.connect(store.path)  # type: ignore[attr-defined]
        with db:
            db.execute(f"UPDATE events SET body = :body WHERE {in_run()} AND key & 0xFFFFFFFF"
                       " = :seq", {"body": body, "run": run_id, "seq": event.seq})
        db.close()
    elif kind == "PostgresStore":
        import psycopg

        from .conftest import POSTGRES_URL

        schema = store.schema  # type: ignore[attr-defined]
        with psycopg.connect(POSTGRES_URL) as conn:
            conn.execute(f'UPDATE "{schema}".events SET body = %s WHERE run_id = %s AND seq = %s',
                         (body, run_id, event.seq))
    else:
        _rewrite_jsonl_record(Path(store.path), encode(event), body)  # type: ignore[attr-defined]


_CRC = re.compile(rb"[0-9a-f]{8} ")


def _rewrite_jsonl_record(root: Path, old: bytes, new: bytes) -> None:
    """Swap ``old`` for ``new`` in the one line holding it, under any file of the store,
    recomputing the line's CRC (``crc32 rest-of-line``) so only the digest can tell.

    Tolerant of framing changes that keep a leading CRC over the rest of the line; any
    other framing fails here, loudly, rather than testing nothing."""
    for path in (p for p in root.rglob("*") if p.is_file()):
        data = path.read_bytes()
        at = data.find(old)
        if at == -1:
            continue
        start, end = data.rfind(b"\n", 0, at) + 1, data.find(b"\n", at)
        end = len(data) if end == -1 else end
        line = data[start:end]
        rest = line[9:]
        if not _CRC.match(line) or line[:8] != b"%08x" % zlib.crc32(rest):
            raise AssertionError(f"{path}: a record framed as {line[:20]!r}...; teach "
                                 "_rewrite_jsonl_record this framing")
        rest = rest.replace(old, new)
        path.write_bytes(data[:start] + b"%08x " % zlib.crc32(rest) + rest + data[end:])
        return
    raise AssertionError(f"no file under {root} holds the record {old[:60]!r}...")


def edited(event: Event, prev: str | None = None) -> bytes:
    """``event`` with a changed payload value, still valid JSON that decodes; its digest
    is kept (``prev`` None) or recomputed correctly from the digest ``prev`` before it."""
    changed = msgspec.structs.replace(event, payload={**event.payload, "content": "EDITED"})
    if prev is None:
        return encode(changed)
    digest = chain_digest(prev, encode(msgspec.structs.replace(changed, digest="")))
    return encode(msgspec.structs.replace(changed, digest=digest))



def delete_stored(store: Store, run_id: str, from_seq: int) -> None:
    """Delete the run's stored records from ``from_seq`` on, by the backend's own means,
    touching nothing else (the run's head stays): what an edit of the log alone does."""
    kind = type(store).__name__
    if kind == "SQLiteStore":
        db = sqlite3.connect(store.path)  # type: ignore[attr-defined]
        with db:
            db.execute(f"DELETE FROM events WHERE {in_run()} AND key & 0xFFFFFFFF >= :seq",
                       {"run": run_id, "seq": from_seq})
        db.close()
    elif kind == "PostgresStore":
        import psycopg

        from .conftest import POSTGRES_URL

        schema = store.schema  # type: ignore[attr-defined]
        with psycopg.connect(POSTGRES_URL) as conn:
            conn.execute(f'DELETE FROM "{schema}".events WHERE run_id = %s AND seq >= %s',
                         (run_id, from_seq))
    else:
        log = Path(store.path) / f"{run_id}.jsonl"  # type: ignore[attr-defined]
        lines = log.read_bytes().split(b"\n")
        log.write_bytes(b"\n".join(lines[: from_seq - 1]) + b"\n")


def resealed_from(log: list[Event], seq: int, change: Callable[[Event], Event]) -> list[bytes]:
    """The stored bytes of ``log`` from ``seq`` on, each changed by ``change`` and sealed
    again, every later digest recomputed: a forgery of the log's newest events."""
    prev, bodies = log[seq - 2].digest if seq > 1 else "", []
    for event in log[seq - 1:]:
        raw = encode(msgspec.structs.replace(change(event), digest=""))
        prev = chain_digest(prev, raw)
        bodies.append(encode(msgspec.structs.replace(change(event), digest=prev)))
    return bodies


def edit_content(event: Event) -> Event:
    return msgspec.structs.replace(event, payload={**event.payload, "content": "EDITED"})


@backend_params(grouped=True)
class TestConformance:
    def test_conformance_a_lease_says_where_the_log_ends_or_nothing(
            self, make_store: MakeStore) -> None:
        """A new run's opener skips reading a log its lease says is empty: the hint is
        never wrong, even for a log written without a lease (a fork's copy)."""
        store = make_store()
        first = store.acquire("r1", "w", ttl=60)
        assert first.last_seq in (0, None)
        append(store, "r1", {"content": "a"}, epoch=first.epoch)
        store.release(first)
        assert store.acquire("r1", "w", ttl=60).last_seq in (1, None)
        append(store, "r2", {"content": "a"}, {"content": "b"})  # no lease ever taken
        assert store.acquire("r2", "w", ttl=60).last_seq in (2, None)

    def test_conformance_round_trip(self, make_store: MakeStore) -> None:
        store = make_store()
        assert store.last_seq("r1") == 0
        assert list(store.read("r1")) == []
        events = make_events("r1", 0, 0, facts({"content": "a"}, {"content": "b"}))
        assert store.append("r1", events, expected_seq=0, epoch=0) == 2
        more = make_events("r1", 2, 0, facts({"content": "c"}))
        assert store.append("r1", more, expected_seq=2, epoch=0) == 3
        got = unsealed(store.read("r1"))
        assert got == events + more
        assert [e.seq for e in store.read("r1", after_seq=1)] == [2, 3]
        assert store.last_seq("r1") == 3

    # --- the head of the chain: the seq and digest a run ends with, kept apart --------

    def two_batches(self, store: Store) -> list[Event]:
        append(store, "r1", {"content": "a"}, {"content": "b"})
        append(store, "r1", {"content": "c"}, {"content": "d"})
        return list(store.read("r1"))

    def readers(self, make_store: MakeStore, url: str) -> list[Store]:
        """A writer's handle and a read-only one, both opened afresh."""
        reader = open_store(url, readonly=True)
        self.opened.append(reader)
        return [make_store(), reader]

    @pytest.fixture(autouse=True)
    def _close_readers(self) -> Any:
        self.opened: list[Store] = []
        yield
        for store in self.opened:
            store.close()

    def test_conformance_the_newest_event_edited_with_its_digest_recomputed_is_refused(
        self, make_store: MakeStore, store_url: str
    ) -> None:
        store = make_store()
        log = self.two_batches(store)
        (forged,) = resealed_from(log, 4, edit_content)
        rewrite_stored(store, "r1", log[3], forged)
        for reader in self.readers(make_store, store_url):
            with pytest.raises(CorruptLogError, match="newest event was changed") as caught:
                list(reader.read("r1"))
            assert caught.value.seq == 4
            with pytest.raises(CorruptLogError):
                list(reader.read("r1", after_seq=2))
        assert verify(make_store(), "r1").corrupt_seq == 4

    def test_conformance_the_last_batch_deleted_is_refused(
        self, make_store: MakeStore, store_url: str
    ) -> None:
        store = make_store()
        self.two_batches(store)
        delete_stored(store, "r1", 3)
        for reader in self.readers(make_store, store_url):
            with pytest.raises(CorruptLogError, match="last events were deleted") as caught:
                list(reader.read("r1"))
            assert caught.value.seq == 3
        delete_stored(store, "r1", 1)  # every event: the head still says there were four
        with pytest.raises(CorruptLogError, match="were deleted"):
            list(make_store().read("r1"))

    def test_conformance_every_record_relabelled_v3_without_digests_is_refused(
        self, make_store: MakeStore
    ) -> None:
        store = make_store()
        log = self.two_batches(store)
        for event in log:  # no hashing needed: what v3 wrote carried no digest
            relabelled = msgspec.structs.replace(event, v=3, digest="")
            rewrite_stored(store, "r1", event, encode(relabelled))
        with pytest.raises(CorruptLogError, match="unsealed record in a store created") as caught:
            list(make_store().read("r1"))
        assert caught.value.seq == 1

    def test_conformance_heads_follow_forks_archives_and_restores(
        self, make_store: MakeStore
    ) -> None:
        store = make_store()
        log = self.two_batches(store)
        assert store.heads() == {"r1": (4, log[-1].digest)}
        records = store.records("r1")
        stone = Tombstone(run_id="r1", last_seq=4, digest=records_digest(records),
                          archive="file:///a", deleted_at=T0)
        store.delete_run(stone, epoch=0)
        assert make_store().heads() == {}
        store.restore_run("r1", records)
        assert [e.seq for e in make_store().read("r1")] == [1, 2, 3, 4]
        assert make_store().heads() == {"r1": (4, log[-1].digest)}

    def test_conformance_scope_runs_lists_the_runs_started_in_a_scope(
        self, make_store: MakeStore
    ) -> None:
        store = make_store()
        started = [(EventType.RUN_STARTED, {"task": "t", "scope": "op:acme:7"})]
        for run_id in ("origin", "fork"):
            store.append(run_id, make_events(run_id, 0, 0, started), expected_seq=0, epoch=0)
        alone = [(EventType.RUN_STARTED, {"task": "t"})]
        store.append("solo", make_events("solo", 0, 0, alone), expected_seq=0, epoch=0)
        append(store, "origin", {"content": "later"})  # only run_started registers
        assert make_store().scope_runs("op:acme:7") == ["origin", "fork"]
        assert store.scope_runs("run:solo") == ["solo"]
        assert store.scope_runs("op:acme:8") == []

    def test_conformance_an_append_alone_in_a_scope_is_refused_once_another_run_shares_it(
        self, make_store: MakeStore
    ) -> None:
        """``alone_in``: the start of an effect that needs no peer asked, appended only
        while no other run of the scope has events; refused, it writes nothing."""
        store = make_store()
        started = [(EventType.RUN_STARTED, {"task": "t", "scope": "op:acme:7"})]
        store.append("origin", make_events("origin", 0, 0, started), expected_seq=0, epoch=0)

        def alone(handle: Store, content: str, last: int) -> int:
            return handle.append("origin", make_events("origin", last, 0, facts(
                {"content": content})), expected_seq=last, epoch=0, alone_in="op:acme:7")

        assert alone(store, "a", 1) == 2 and alone(store, "b", 2) == 3  # cold, then warm
        store.append("fork", make_events("fork", 0, 0, started), expected_seq=0, epoch=0)
        for handle in (store, make_store()):  # one that saw the log end, one that did not
            with pytest.raises(ScopeSharedError) as refused:
                alone(handle, "c", 3)
            assert (refused.value.run_id, refused.value.scope) == ("origin", "op:acme:7")
        with pytest.raises(ConflictError):  # a conflict is still said first
            alone(store, "c", 2)
        assert [e.payload.get("content") for e in make_store().read("origin")] == [
            None, "a", "b"]
        assert append(store, "origin", {"content": "c"}) == 4  # without the condition
        with pytest.raises(ScopeSharedError):  # nor does a warm handle forget it
            alone(store, "d", 4)

    def test_conformance_conflict_on_wrong_expected_seq(self, make_store: MakeStore) -> None:
        store = make_store()
        append(store, "r1", {"content": "a"}, {"content": "b"})
        stale = make_events("r1", 1, 0, facts({"content": "late"}))
        with pytest.raises(ConflictError) as info:
            store.append("r1", stale, expected_seq=1, epoch=0)
        assert (info.value.expected_seq, info.value.actual_seq) == (1, 2)
        ahead = make_events("r1", 5, 0, facts({"content": "ahead"}))
        with pytest.raises(ConflictError):
            store.append("r1", ahead, expected_seq=5, epoch=0)
        assert [e.payload["content"] for e in store.read("r1")] == ["a", "b"]

    def test_conformance_lease_takeover_increments_epoch(self, make_store: MakeStore) -> None:
        store = make_store()
        first = store.acquire("r1", "worker-a", ttl=30)
        assert first.epoch == 1
        assert store.acquire("r1", "worker-a", ttl=30).epoch == 1  # holder re-acquiring
        with pytest.raises(LeaseHeldError):
            store.acquire("r1", "worker-b", ttl=30)
        store.release(first)
        second = store.acquire("r1", "worker-b", ttl=0.05)
        assert second.epoch == 2
        time.sleep(0.15)
        third = store.acquire("r1", "worker-c", ttl=30)
        assert third.epoch == 3
        renewed = store.renew(third, ttl=60)
        assert renewed.epoch == 3 and renewed.expires_at >= third.expires_at
        with pytest.raises(FencedError):
            store.renew(second, ttl=30)

    def test_conformance_holder_reads_the_lease_as_it_stands(self, make_store: MakeStore) -> None:
        """Who holds a run, until when: held, released (0) and lapsed (in the past)."""
        store = make_store()
        assert store.holder("r1") is None
        lease = store.acquire("r1", "worker-a", ttl=30)
        held = store.holder("r1")
        assert held is not None and (held.owner, held.epoch) == ("worker-a", 1)
        assert time.time() + 20 < held.expires_at <= time.time() + 31
        store.release(lease)
        released = store.holder("r1")
        assert released is not None and (released.owner, released.expires_at) == ("worker-a", 0)
        store.acquire("r1", "worker-b", ttl=0.05)
        time.sleep(0.15)
        lapsed = store.holder("r1")
        assert lapsed is not None and (lapsed.owner, lapsed.epoch) == ("worker-b", 2)
        assert 0 < lapsed.expires_at <= time.time()

    def test_conformance_a_released_lease_is_not_renewed(self, make_store: MakeStore) -> None:
        """Renewing a lease its holder released would take the run back from whoever
        is about to acquire it (a person deciding on a run a worker handed back): the
        store refuses it, alone or in a heartbeat's renew_all, and the run stays free."""
        store = make_store()
        lease = store.acquire("r1", "worker-a", ttl=30)
        kept = store.acquire("r2", "worker-a", ttl=30)
        store.release(lease)
        with pytest.raises(LeaseReleasedError) as info:
            store.renew(lease, ttl=30)
        assert info.value.epoch == lease.epoch
        renew_all = getattr(store, "renew_all", None)
        if renew_all is not None:
            assert set(renew_all([lease, kept], 30)) == {"r2"}
        assert store.acquire("r1", "a-person", ttl=30).epoch == lease.epoch + 1

    def test_conformance_renew_all_renews_only_the_leases_still_held(
            self, make_store: MakeStore) -> None:
        """A heartbeat's renew_all leaves out a lease another worker took over (its epoch
        moved on): renewing it would take the run back from its new holder."""
        store = make_store()
        renew_all = getattr(store, "renew_all", None)
        if renew_all is None:
            pytest.skip("this store renews lease by lease")
        held = store.acquire("r1", "worker-a", ttl=30)
        lapsed = store.acquire("r2", "worker-a", ttl=0.05)
        time.sleep(0.15)
        taken = store.acquire("r2", "worker-b", ttl=30)
        renewed = renew_all([lapsed, held], 60)
        assert set(renewed) == {"r1"} and renewed["r1"].expires_at >= held.expires_at
        with pytest.raises(FencedError):  # still worker-b's, at its epoch
            store.renew(lapsed, ttl=30)
        assert store.renew(taken, ttl=30).epoch == taken.epoch == lapsed.epoch + 1

    def test_conformance_lease_expiry_is_not_judged_by_the_acquirers_wall_clock(
        self, make_store: MakeStore, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        holder, other = make_store(), make_store()
        lease = holder.acquire("r1", "worker-a", ttl=60)
        wall = time.time
        monkeypatch.setattr(time, "time", lambda: wall() + 3600)  # B's clock is an hour ahead
        with pytest.raises(LeaseHeldError):
            other.acquire("r1", "worker-b", ttl=60)
        holder.release(lease)
        assert other.acquire("r1", "worker-b", ttl=60).epoch == lease.epoch + 1

    @pytest.mark.parametrize("digest", ["kept", "recomputed"])
    def test_conformance_an_edited_event_is_corruption_named_by_seq(
        self, make_store: MakeStore, digest: str
    ) -> None:
        store = make_store()
        append(store, "r1", *({"content": c} for c in "abcd"))
        log = list(store.read("r1"))
        prev = log[0].digest if digest == "recomputed" else None
        rewrite_stored(store, "r1", log[1], edited(log[1], prev))
        # Kept: seq 2 no longer matches its digest. Recomputed: seq 2 matches, but seq 3
        # was chained from the digest seq 2 had when it was written.
        damaged = 2 if digest == "kept" else 3
        for after in (0, 1, damaged - 1):
            with pytest.raises(CorruptLogError) as info:
                list(make_store().read("r1", after_seq=after))
            assert info.value.seq == damaged, after

    def test_conformance_paused_worker_is_fenced(self, make_store: MakeStore) -> None:
        # Worker A holds the lease, pauses past its expiry, B takes over; when
        # A wakes it may append nothing.
        a_store, b_store = make_store(), make_store()
        lease_a = a_store.acquire("r1", "worker-a", ttl=0.1)
        append(a_store, "r1", {"content": "from a"}, epoch=lease_a.epoch)
        time.sleep(0.25)
        lease_b = b_store.acquire("r1", "worker-b", ttl=30)
        assert lease_b.epoch == lease_a.epoch + 1
        late = make_events("r1", 1, lease_a.epoch, facts({"content": "a woke up"}))
        with pytest.raises(FencedError) as info:
            a_store.append("r1", late, expected_seq=1, epoch=lease_a.epoch)
        assert info.value.current_epoch == lease_b.epoch
        append(b_store, "r1", {"content": "b moves on"}, epoch=lease_b.epoch)
        with pytest.raises(FencedError):  # stale seq too: still told it is fenced
            a_store.append("r1", late, expected_seq=1, epoch=lease_a.epoch)
        with pytest.raises(FencedError):  # epoch 0, "no lease", is fenced too now
            a_store.append("r1", make_events("r1", 1, 0, facts({})), expected_seq=1, epoch=0)
        assert [e.payload["content"] for e in b_store.read("r1")] == ["from a", "b moves on"]

    @pytest.mark.parametrize("shared", [False, True], ids=["own-handles", "shared-handle"])
    def test_conformance_thread_race_one_winner(
        self, make_store: MakeStore, shared: bool
    ) -> None:
        stores = [make_store()] * 2 if shared else [make_store(), make_store()]
        barrier = threading.Barrier(2)
        outcomes: dict[str, str] = {}

        def racer(name: str, store: Store) -> None:
            barrier.wait()
            try:
                store.append("r1", make_events("r1", 0, 0, facts({"content": name})),
                             expected_seq=0, epoch=0)
                outcomes[name] = "won"
            except ConflictError:
                outcomes[name] = "conflict"
                append(store, "r1", {"content": name})

        threads = [threading.Thread(target=racer, args=(f"t{i}", s)) for i, s in enumerate(stores)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(outcomes.values()) == ["conflict", "won"]
        log = list(make_store().read("r1"))
        assert [e.seq for e in log] == [1, 2]
        assert {e.payload["content"] for e in log} == {"t0", "t1"}

    def test_conformance_process_race_one_winner(self, store_url: str) -> None:
        ctx = multiprocessing.get_context("spawn")
        barrier, results = ctx.Barrier(2), ctx.Queue()
        procs = [
            ctx.Process(target=race_in_process, args=(store_url, "r1", f"p{i}", barrier, results))
            for i in range(2)
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
            assert p.exitcode == 0
        outcomes = dict(results.get(timeout=60) for _ in procs)
        assert sorted(outcomes.values()) == ["conflict", "won"]
        store = open_store(store_url)
        log = list(store.read("r1"))
        store.close()
        assert [e.seq for e in log] == [1, 2]
        assert {e.payload["content"] for e in log} == {"p0", "p1"}

    def test_conformance_reopen_reads_identical_bytes(self, make_store: MakeStore) -> None:
        store = make_store()
        payloads = [{"content": "x", "n": 1.5, "nested": {"b": [1, None, True], "a": "é"}}]
        events = make_events("r1", 0, 0, facts(*payloads))
        store.append("r1", events, expected_seq=0, epoch=0)
        store.close()
        again = list(make_store().read("r1"))
        assert [encode(e) for e in unsealed(again)] == [encode(e) for e in events]

    def test_conformance_framing_round_trips(self, make_store: MakeStore) -> None:
        tricky = ["line\nbreak", "ls\u2028", "ps\u2029", "nel\u0085", "nul\x00byte", "\r\n\r"]
        big = "y" * (10 * 1024 * 1024)
        payloads = [{"content": s} for s in [*tricky, big]]
        store = make_store()
        for p in payloads:
            append(store, "r1", p)
        store.close()
        log = list(make_store().read("r1"))
        assert len(log) == len(payloads)
        assert [e.payload for e in log] == payloads

    @pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
    def test_conformance_non_finite_numbers_refused(
        self, make_store: MakeStore, bad: float
    ) -> None:
        store = make_store()
        payload = {"content": "x", "amount": {"v": [bad]}}
        with pytest.raises(EncodingError, match="NaN and infinities"):
            make_events("r1", 0, 0, facts(payload))
        (event,) = make_events("r1", 0, 0, facts({}))
        event = msgspec.structs.replace(event, payload=payload)  # built by hand, bypassing checks
        with pytest.raises(EncodingError, match="NaN and infinities"):
            store.append("r1", [event], expected_seq=0, epoch=0)
        assert store.last_seq("r1") == 0

    @pytest.mark.parametrize(
        "run_id", ["../x", "a/b", "", "r" * 300, "a\x00b", "/abs", "a\\b", ".hidden"]
    )
    def test_conformance_bad_run_ids_refused(
        self, make_store: MakeStore, tmp_path: Path, run_id: str
    ) -> None:
        store = make_store()
        before = files_near(tmp_path)
        events = make_events(run_id, 0, 0, facts({"content": "x"}))
        attempts: list[Callable[[], object]] = [
            lambda: store.append(run_id, events, expected_seq=0, epoch=0),
            lambda: list(store.read(run_id)),
            lambda: store.last_seq(run_id),
            lambda: store.acquire(run_id, "w", ttl=5),
        ]
        for attempt in attempts:
            with pytest.raises(InvalidRunIdError):
                attempt()
        assert files_near(tmp_path) == before
        assert store.list_runs() == []

    def test_conformance_failed_sync_is_never_retried(
        self, make_store: MakeStore, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        store = make_store()
        append(store, "r1", {"content": "kept"})
        failure = sync_failure(store)

        def failing_sync(*args: object) -> None:
            raise failure

        monkeypatch.setattr(store, "_sync", failing_sync)
        with pytest.raises(DurabilityError):
            append(store, "r1", {"content": "lost"})
        monkeypatch.undo()  # the disk is healthy again; the handle must still refuse
        with pytest.raises(DurabilityError):
            append(store, "r1", {"content": "after"})
        with pytest.raises(DurabilityError):
            store.acquire("r1", "w", ttl=5)
        reopened = make_store()
        assert [e.payload["content"] for e in reopened.read("r1")] == ["kept"]
        append(reopened, "r1", {"content": "after reopen"})
        assert reopened.last_seq("r1") == 2

    def test_conformance_list_runs(self, make_store: MakeStore) -> None:
        store = make_store()
        append(store, "alpha", {"content": "1"})
        append(store, "beta", {"content": "1"}, {"content": "2"})
        runs = {r.run_id: r for r in store.list_runs()}
        assert set(runs) == {"alpha", "beta"}
        assert runs["beta"].last_seq == 2
        assert runs["beta"].created_at is not None
        assert len(store.list_runs(limit=1)) == 1

    def test_conformance_list_runs_newest_activity_first(self, make_store: MakeStore) -> None:
        store = make_store()
        append(store, "alpha", {"content": "1"})
        time.sleep(0.01)  # distinct timestamps, so the order is the activity's
        append(store, "beta", {"content": "1"}, {"content": "2"})
        assert [r.run_id for r in store.list_runs()] == ["beta", "alpha"]
        time.sleep(0.01)
        append(store, "alpha", {"content": "2"}, {"content": "3"})
        listed = store.list_runs()
        assert [(r.run_id, r.last_seq) for r in listed] == [("alpha", 3), ("beta", 2)]
        assert [r.run_id for r in make_store().list_runs(limit=1)] == ["alpha"]
        alpha = listed[0]
        assert alpha.created_at is not None and alpha.updated_at is not None
        assert alpha.created_at < alpha.updated_at  # its first activity, then its last


def sync_failure(store: Store) -> Exception:
    """The error each backend's durability point raises when the disk fails."""
    kind = type(store).__name__
    if kind == "JsonlStore":
        return OSError(5, os.strerror(5))
    if kind == "SQLiteStore":
        return sqlite3.OperationalError("disk I/O error")
    import psycopg

    return psycopg.OperationalError("server closed the connection unexpectedly")


@backend_params()
class TestSnapshotConformance:
    def test_conformance_snapshot_round_trip_and_prune(self, make_store: MakeStore) -> None:
        store = make_store()
        assert store.snapshots("r1") == []
        body = bytes(range(256)) * 40  # every byte value, NUL included
        store.put_snapshot(snapshot_at("r1", 10, body), keep=2)
        store.put_snapshot(snapshot_at("r1", 20), keep=2)
        store.put_snapshot(snapshot_at("other", 5), keep=2)
        assert [s.seq for s in store.snapshots("r1")] == [20, 10]
        assert [s.seq for s in store.snapshots("r1", limit=1)] == [20]
        store.put_snapshot(snapshot_at("r1", 30), keep=2)
        got = make_store().snapshots("r1")  # a reopened handle sees the same
        assert [s.seq for s in got] == [30, 20]
        assert [s.seq for s in store.snapshots("other")] == [5]
        store.put_snapshot(snapshot_at("r1", 40, body), keep=1)
        (only,) = store.snapshots("r1")
        assert (only.seq, only.body, only.digest) == (40, body, hashlib.sha256(body).hexdigest())
        assert store.delete_snapshots("r1") == 1 and store.snapshots("r1") == []
        assert store.list_runs() == []  # snapshots are not runs

    def test_conformance_snapshot_same_seq_replaces(self, make_store: MakeStore) -> None:
        store = make_store()
        store.put_snapshot(snapshot_at("r1", 10, b"old"))
        store.put_snapshot(snapshot_at("r1", 10, b"new"))
        assert [s.body for s in store.snapshots("r1")] == [b"new"]

    def test_conformance_snapshot_quarantine(self, make_store: MakeStore) -> None:
        store = make_store()
        assert store.quarantined() == {}
        store.quarantine(7, "verify: completed keys differ")
        store.quarantine(7, "again")
        assert make_store().quarantined() == {7: "again"}

    def test_conformance_segments(self, make_store: MakeStore) -> None:
        """Parts snapshots refer to by digest: stored (a digest stored again gets the body
        given: a damaged one is mended), read by digest (a missing one is absent),
        pruned to those kept, and gone with the run's snapshots."""
        store = make_store()
        body = bytes(range(256)) * 40
        assert store.segments("r1", [SEG_A]) == {}
        store.put_segments("r1", {SEG_A: b"damaged", SEG_B: b"b"})
        store.put_segments("r1", {SEG_A: body, SEG_C: b"c"})
        store.put_segments("other", {SEG_A: b"other's"})
        assert make_store().segments("r1", [SEG_A, SEG_B, SEG_C, SEG_D]) == {
            SEG_A: body, SEG_B: b"b", SEG_C: b"c"}
        assert store.segment_digests("r1") == {SEG_A, SEG_B, SEG_C}
        assert store.segment_digests("nothing") == set()
        assert store.prune_segments("r1", [SEG_A, SEG_D]) == 2
        assert make_store().segment_digests("r1") == {SEG_A}
        assert store.segments("r1", [SEG_A, SEG_B, SEG_C]) == {SEG_A: body}
        store.put_snapshot(snapshot_at("r1", 10))
        assert store.delete_snapshots("r1") == 1
        assert store.segments("r1", [SEG_A]) == {} and store.segment_digests("r1") == set()
        assert store.segments("other", [SEG_A]) == {SEG_A: b"other's"}
        assert store.prune_segments("r1", []) == 0
        # A name that is no digest (a damaged snapshot's) is simply not there.
        assert store.segments("other", ["../x", "not hex"]) == {}
        assert store.prune_segments("other", ["../x"]) == 1

    def test_conformance_snapshot_bad_run_ids(self, make_store: MakeStore,
                                              tmp_path: Path) -> None:
        store = make_store()
        before = files_near(tmp_path)
        for run_id in ["../x", "a/b", ""]:
            with pytest.raises(InvalidRunIdError):
                store.put_snapshot(snapshot_at(run_id, 1))
            with pytest.raises(InvalidRunIdError):
                store.snapshots(run_id)
        assert files_near(tmp_path) == before


SEG_A, SEG_B, SEG_C, SEG_D = (hashlib.sha256(c.encode()).hexdigest() for c in "abcd")


def _stone(store: Store, run_id: str, records: list[bytes]) -> Tombstone:
    return Tombstone(run_id=run_id, last_seq=len(records), digest=records_digest(records),
                     archive="file:///cold", deleted_at=T0)


@backend_params()
class TestTombstoneConformance:
    """Retention's part of the contract: records, delete_run, tombstones, restore_run."""

    def test_conformance_delete_and_restore_round_trip(self, make_store: MakeStore) -> None:
        store = make_store()
        lease = store.acquire("r1", "gc", 60)
        for text in ("a", "b", "c"):
            append(store, "r1", {"text": text}, epoch=lease.epoch)
        append(store, "r2", {"text": "other"})
        store.put_snapshot(snapshot_at("r1", 3))
        store.put_segments("r1", {SEG_A: b"a part"})
        records = store.records("r1")
        assert len(records) == 3 and make_store().records("r1") == records
        stone = _stone(store, "r1", records)

        with pytest.raises(FencedError):
            store.delete_run(stone, epoch=lease.epoch - 1)
        with pytest.raises(ConflictError):
            store.delete_run(msgspec.structs.replace(stone, last_seq=2), epoch=lease.epoch)
        assert store.records("r1") == records and store.tombstone("r1") is None

        store.delete_run(stone, epoch=lease.epoch)
        for handle in (store, make_store()):
            assert handle.tombstone("r1") == stone and handle.tombstones() == [stone]
            assert list(handle.read("r1")) == [] and handle.last_seq("r1") == 0
            assert handle.records("r1") == [] and handle.snapshots("r1") == []
            assert handle.segments("r1", [SEG_A]) == {}
            assert [r.run_id for r in handle.list_runs()] == ["r2"]
            with pytest.raises(ArchivedRunError, match="file:///cold"):
                append(handle, "r1", {"text": "the id again"})
        store.release(lease)
        assert [e.payload["text"] for e in store.read("r2")] == ["other"]

        with pytest.raises(CorruptLogError, match="tombstone"):
            store.restore_run("r1", records[:2])
        with pytest.raises(NotArchivedError):
            store.restore_run("r2", store.records("r2"))
        assert store.tombstone("r1") == stone

        make_store().restore_run("r1", records)
        assert store.records("r1") == records and store.tombstone("r1") is None
        assert store.tombstones() == []
        assert [e.payload["text"] for e in store.read("r1")] == ["a", "b", "c"]
        later = store.acquire("r1", "next", 60)
        assert later.epoch > lease.epoch  # epochs never go back: old writers stay fenced
        append(store, "r1", {"text": "d"}, epoch=later.epoch)
        assert store.last_seq("r1") == 4

    def test_conformance_prune_snapshots(self, make_store: MakeStore) -> None:
        store = make_store()
        for seq in (10, 20):
            store.put_snapshot(snapshot_at("r1", seq), keep=3)
        assert store.prune_snapshots("r1", keep=1) == 1
        assert [s.seq for s in store.snapshots("r1")] == [20]
        assert store.prune_snapshots("r1", keep=0) == 1 and store.snapshots("r1") == []
        assert store.prune_snapshots("none", keep=0) == 0
