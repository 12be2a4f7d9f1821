"""Behaviour only the Postgres backend has: migrations, bytea bodies, commit failure.

Needs a server: $AGENTJOURNAL_TEST_POSTGRES (default postgresql://postgres@127.0.0.1:5432/test).
Skipped when it is unreachable, except under CI=true, where that is a failure.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest

psycopg = pytest.importorskip("psycopg")

from agentjournal.errors import (  # noqa: E402
    ConflictError,
    CorruptLogError,
    DurabilityError,
    FencedError,
    StoreUnavailableError,
    StoreUrlError,
)
from agentjournal.events import EventType, make_events, seal, stored_digest  # noqa: E402
from agentjournal.store import postgres as pg_module  # noqa: E402
from agentjournal.store.base import Durability  # noqa: E402
from agentjournal.store.postgres import PostgresStore  # noqa: E402

from .builders import in_one_group, snapshot_at, unsealed  # noqa: E402

PG_URL = os.environ.get("AGENTJOURNAL_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")


def _unreachable() -> str | None:
    try:
        psycopg.connect(PG_URL, connect_timeout=3).close()
    except psycopg.Error as exc:
        return f"PostgreSQL at {PG_URL} is unreachable ({' '.join(str(exc).split())})"
    return None


_why = _unreachable()
if _why:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{_why}; CI=true requires it", pytrace=False)
    pytest.skip(f"{_why}; set AGENTJOURNAL_TEST_POSTGRES", allow_module_level=True)


def _sql(query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        cur = conn.execute(query, params)
        return cur.fetchall() if cur.description else []


@pytest.fixture
def schema() -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex}"
    yield name
    _sql(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


@pytest.fixture
def store(schema: str) -> Iterator[PostgresStore]:
    with PostgresStore(PG_URL, schema=schema) as s:
        yield s


def _facts(n: int) -> list[tuple[EventType, dict[str, Any]]]:
    return [(EventType.USER_MESSAGE, {"content": f"m{i}"}) for i in range(n)]


def test_concurrent_open_migrates_once(schema: str) -> None:
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def open_one() -> None:
        try:
            barrier.wait()
            PostgresStore(PG_URL, schema=schema).close()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    PostgresStore(PG_URL, schema=schema).close()  # reopening is a no-op
    assert _versions(schema) == ALL_VERSIONS


def test_round_trip_is_byte_identical(store: PostgresStore, schema: str) -> None:
    # Unsorted keys, NUL, non-ASCII, nesting and big ints: what jsonb would mangle.
    payload = {"z": 1, "a": "nul\u0000here", "m": {"y": [1.5, None], "b": "é🙂"}, "n": 2**62}
    events = make_events("run-1", 0, 0, [(EventType.RUN_STARTED, payload), *_facts(2)])
    assert store.append("run-1", events, expected_seq=0, epoch=0) == 3
    assert unsealed(store.read("run-1")) == events
    assert unsealed(store.read("run-1", after_seq=2)) == events[2:]
    rows = _sql(f'SELECT body FROM "{schema}".events WHERE run_id = %s ORDER BY seq', ("run-1",))
    assert [bytes(r[0]) for r in rows] == seal(events, "")[0]
    assert store.last_seq("run-1") == 3
    assert store.last_seq("unknown") == 0


def test_read_spans_pages(store: PostgresStore) -> None:
    n = 2500  # crosses two page boundaries
    for start in range(0, n, 500):
        batch = make_events("long", start, 0, _facts(500))
        store.append("long", batch, expected_seq=start, epoch=0)
    assert [e.seq for e in store.read("long")] == list(range(1, n + 1))
    assert [e.seq for e in store.read("long", after_seq=1000)] == list(range(1001, n + 1))


def test_unique_violation_is_a_conflict(store: PostgresStore, schema: str) -> None:
    # A row the runs table does not account for: only the primary key catches it.
    stray = make_events("r", 0, 0, _facts(1))[0]
    _sql(
        f'INSERT INTO "{schema}".events VALUES (%s, 1, %s, now(), %s)',
        ("r", stray.type.value, seal([stray], "")[0][0]),
    )
    with pytest.raises(ConflictError) as info:
        store.append("r", make_events("r", 0, 0, _facts(2)), expected_seq=0, epoch=0)
    assert (info.value.expected_seq, info.value.actual_seq) == (0, 1)
    # Nothing half-written, and the handle still works. (The stray row moved no head, so
    # a read refuses it: events written around the store.)
    with pytest.raises(CorruptLogError, match="no head record"):
        list(store.read("r"))
    other = make_events("other", 0, 0, _facts(1))
    assert store.append("other", other, expected_seq=0, epoch=0) == 1


def test_failed_commit_breaks_the_handle(
    store: PostgresStore, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    acked = make_events("r", 0, 0, _facts(2))
    store.append("r", acked, expected_seq=0, epoch=0)

    def failing_sync(conn: Any) -> None:
        raise psycopg.OperationalError("simulated: server closed the connection")

    monkeypatch.setattr(store, "_sync", failing_sync)
    more = make_events("r", 2, 0, _facts(1))
    with pytest.raises(DurabilityError) as info:
        store.append("r", more, expected_seq=2, epoch=0)
    assert info.value.run_id == "r"
    assert "commit failed" in info.value.detail
    monkeypatch.undo()  # the commit works again, but the handle stays closed for writes
    with pytest.raises(DurabilityError):
        store.append("r", more, expected_seq=2, epoch=0)
    with pytest.raises(DurabilityError):
        store.acquire("r", "w", 10)
    with PostgresStore(PG_URL, schema=schema) as fresh:
        assert unsealed(fresh.read("r")) == acked
        assert fresh.append("r", more, expected_seq=2, epoch=0) == 3


@pytest.mark.parametrize("durability", list(Durability))
def test_batched_turns_off_synchronous_commit_for_appends_only(
    schema: str, durability: Durability, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[str] = []
    with PostgresStore(PG_URL, schema=schema, durability=durability) as s:
        real = s._sync

        def spy(conn: Any) -> None:
            seen.append(conn.execute("SHOW synchronous_commit").fetchone()[0])
            real(conn)

        monkeypatch.setattr(s, "_sync", spy)
        s.append("r", make_events("r", 0, 0, _facts(1)), expected_seq=0, epoch=0)
        s.acquire("r", "w", 10)
    default = _sql("SHOW synchronous_commit")[0][0]
    appended = "off" if durability is Durability.BATCHED else default
    assert seen == [appended, default]


def test_unreachable_server_is_a_store_url_error() -> None:
    with pytest.raises(StoreUrlError) as info:  # at once: pytest's timeout is the hang guard
        PostgresStore("postgresql://postgres:hunter2@127.0.0.1:1/test", schema="x_y")
    assert "cannot connect" in str(info.value)
    assert "hunter2" not in str(info.value)
    assert info.value.url == "postgresql://postgres@127.0.0.1:1/test?schema=x_y"


def test_url_and_schema_validation(store: PostgresStore, schema: str) -> None:
    assert store.url.endswith(f"?schema={schema}")
    with pytest.raises(StoreUrlError):
        PostgresStore(PG_URL, schema='x"; DROP TABLE y; --')


ALL_VERSIONS = list(range(1, len(pg_module.MIGRATIONS) + 1))


def _versions(schema: str) -> list[int]:
    return [r[0] for r in _sql(f'SELECT version FROM "{schema}".schema_version ORDER BY version')]


def test_fresh_schema_runs_every_migration(store: PostgresStore, schema: str) -> None:
    assert _versions(schema) == ALL_VERSIONS
    assert store.snapshots("r") == [] and store.quarantined() == {}


def test_migration_2_upgrades_a_v1_schema(schema: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as m:  # a store written by the release before snapshots
        m.setattr(pg_module, "MIGRATIONS", pg_module.MIGRATIONS[:1])
        PostgresStore(PG_URL, schema=schema).close()
    for seq, body in enumerate(seal(make_events("r", 0, 0, _facts(2)), "")[0], start=1):
        _sql(f'INSERT INTO "{schema}".events VALUES (%s, %s, %s, now(), %s)',
             ("r", seq, "user_message", body))
    _sql(f'INSERT INTO "{schema}".runs (run_id, last_seq) VALUES (%s, 2)', ("r",))
    assert _versions(schema) == [1]
    with PostgresStore(PG_URL, schema=schema) as new:
        assert _versions(schema) == ALL_VERSIONS
        assert [e.seq for e in new.read("r")] == [1, 2]  # the log is untouched
        new.put_snapshot(snapshot_at("r", 2, b"state"))
        assert [s.body for s in new.snapshots("r")] == [b"state"]
    PostgresStore(PG_URL, schema=schema).close()  # reopening migrates nothing more
    assert _versions(schema) == ALL_VERSIONS


def test_snapshot_put_and_prune_are_one_transaction(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    for seq in (1, 2):
        store.put_snapshot(snapshot_at("r", seq, b"s%d" % seq))
    monkeypatch.setattr(
        store, "_sync", lambda conn: (_ for _ in ()).throw(psycopg.OperationalError("gone"))
    )
    with pytest.raises(DurabilityError):
        store.put_snapshot(snapshot_at("r", 3, b"s3"))
    # Neither the insert nor the prune happened; the handle now refuses writes.
    assert [s.seq for s in store.snapshots("r")] == [2, 1]
    monkeypatch.undo()
    with pytest.raises(DurabilityError):
        store.put_snapshot(snapshot_at("r", 4, b"s4"))
    with pytest.raises(DurabilityError):
        store.quarantine(1, "x")
    with pytest.raises(DurabilityError):
        store.delete_snapshots("r")


def test_snapshot_body_is_bytea_and_byte_identical(store: PostgresStore, schema: str) -> None:
    body = bytes(range(256)) * 3 + b"\x00"
    store.put_snapshot(snapshot_at("r", 7, body))
    rows = _sql(f'SELECT body, created_at FROM "{schema}".snapshots')
    assert bytes(rows[0][0]) == body
    (got,) = store.snapshots("r")
    assert got == snapshot_at("r", 7, body)


def test_concurrent_snapshot_writers_keep_exactly_keep(schema: str) -> None:
    # Unserialized, each transaction's prune misses the others' uncommitted rows and
    # more than ``keep`` survive; the per-run advisory lock orders them.
    n = 8
    stores = [PostgresStore(PG_URL, schema=schema) for _ in range(n)]
    for _ in range(20):
        barrier = threading.Barrier(n)
        errors: list[BaseException] = []

        def writer(
            s: PostgresStore, seq: int, barrier: threading.Barrier, errors: list[BaseException]
        ) -> None:
            try:
                barrier.wait()
                s.put_snapshot(snapshot_at("r", seq, b"x"), keep=2)
            except BaseException as exc:
                errors.append(exc)

        base = max([x.seq for x in stores[0].snapshots("r")], default=0)
        threads = [
            threading.Thread(target=writer, args=(s, base + i + 1, barrier, errors))
            for i, s in enumerate(stores)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert [x.seq for x in stores[0].snapshots("r")] == [base + n, base + n - 1]
    for s in stores:
        s.close()


def test_lost_server_is_store_unavailable_not_a_driver_error(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    def gone(*args: object, **kwargs: object) -> Any:
        raise psycopg.OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(store._pool, "connection", gone)
    with pytest.raises(StoreUnavailableError, match="server closed") as info:
        store.last_seq("r1")
    assert info.value.retryable
    with pytest.raises(StoreUnavailableError):
        list(store.read("r1"))
    events = make_events("r1", 0, 0, _facts(1))
    with pytest.raises(StoreUnavailableError):
        store.append("r1", events, expected_seq=0, epoch=0)
    monkeypatch.undo()
    assert store.append("r1", events, expected_seq=0, epoch=0) == 1  # nothing was broken


def test_many_writers_contending_lose_nothing(store: PostgresStore, schema: str) -> None:
    # The conditional UPDATE is the only check: under contention every append is
    # either claimed once or refused, never both, never neither.
    def writer(name: str) -> None:
        for i in range(25):
            while True:
                last = store.last_seq("r1")
                (event,) = make_events("r1", last, 0, [(EventType.USER_MESSAGE,
                                                        {"content": f"{name}-{i}"})])
                try:
                    store.append("r1", [event], expected_seq=last, epoch=0)
                    break
                except ConflictError:
                    continue

    threads = [threading.Thread(target=writer, args=(f"w{n}",)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    log = list(store.read("r1"))
    assert [e.seq for e in log] == list(range(1, 201))
    assert sorted(e.payload["content"] for e in log) == sorted(
        f"w{n}-{i}" for n in range(8) for i in range(25))
    assert _sql(f'SELECT last_seq FROM "{schema}".runs WHERE run_id = %s', ("r1",)) == [(200,)]


# --- the chain without an extra round trip ---------------------------------------------


def _v3_body(run_id: str, seq: int) -> bytes:
    """An event as releases before the digest chain stored it: no ``digest`` at all."""
    (event,) = make_events(run_id, seq - 1, 0, _facts(1))
    raw = msgspec.to_builtins(event)
    del raw["digest"]
    return msgspec.json.Encoder(order="sorted").encode({**raw, "v": 3})


def test_migration_4_backfills_each_runs_last_digest(
    schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with monkeypatch.context() as m:  # a schema as the release before migration 4 left it
        m.setattr(pg_module, "MIGRATIONS", pg_module.MIGRATIONS[:3])
        PostgresStore(PG_URL, schema=schema).close()
    sealed, _ = seal(make_events("sealed", 0, 0, _facts(3)), "")
    mixed = [_v3_body("mixed", 1), *seal(make_events("mixed", 1, 0, _facts(1)), "")[0]]
    logs = {"sealed": sealed, "legacy": [_v3_body("legacy", 1), _v3_body("legacy", 2)],
            "mixed": mixed}
    for run_id, bodies in logs.items():
        for seq, body in enumerate(bodies, start=1):
            _sql(f'INSERT INTO "{schema}".events VALUES (%s, %s, %s, now(), %s)',
                 (run_id, seq, "user_message", body))
        _sql(f'INSERT INTO "{schema}".runs (run_id, last_seq) VALUES (%s, %s)',
             (run_id, len(bodies)))
    with PostgresStore(PG_URL, schema=schema) as store:
        got = dict(_sql(f'SELECT run_id, last_digest FROM "{schema}".runs'))
        assert got == {"sealed": stored_digest(sealed[-1]), "legacy": "",
                       "mixed": stored_digest(mixed[-1])}
        assert got["sealed"] and got["mixed"]
        for run_id, bodies in logs.items():  # every run goes on, its chain intact
            more = make_events(run_id, len(bodies), 0, _facts(1))
            store.append(run_id, more, expected_seq=len(bodies), epoch=0)
        with PostgresStore(PG_URL, schema=schema) as fresh:
            for run_id, bodies in logs.items():
                assert [e.seq for e in fresh.read(run_id)] == list(range(1, len(bodies) + 2))


@pytest.fixture
def statements(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every statement any psycopg cursor sends from now on (its SQL, as text)."""
    sent: list[str] = []
    real = psycopg.Cursor.execute

    def spy(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(query, bytes):
            query = query.decode()
        sent.append(query if isinstance(query, str) else query.as_string(self.connection))
        return real(self, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.Cursor, "execute", spy)
    return sent


def _appended(store: PostgresStore, run_id: str, statements: list[str]) -> list[str]:
    """The statements one more append of ``run_id`` sends."""
    statements.clear()
    last = store.last_seq(run_id)
    statements.clear()
    store.append(run_id, make_events(run_id, last, 0, _facts(1)), expected_seq=last, epoch=0)
    return list(statements)


def test_a_warm_append_is_one_statement_and_a_commit(
    store: PostgresStore, schema: str, statements: list[str]
) -> None:
    store.append("r", make_events("r", 0, 0, _facts(2)), expected_seq=0, epoch=0)
    (claim,) = _appended(store, "r", statements)  # warmed by its own append
    assert "UPDATE" in claim and "INSERT" in claim
    with PostgresStore(PG_URL, schema=schema) as other:
        list(other.read("r"))  # warmed by reading the log to its end
        # Its first append reads the run's outline once (the base of the next one).
        assert len(_appended(other, "r", statements)) == 2
        assert len(_appended(other, "r", statements)) == 1
        # Its caches are now stale: the first handle reads the outline, checks the row
        # and chains on.
        assert len(_appended(store, "r", statements)) == 3
    assert [e.seq for e in store.read("r")] == [1, 2, 3, 4, 5, 6]


def test_prefetched_logs_are_read_without_a_round_trip_apiece(
    store: PostgresStore, statements: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The short logs of the runs a worker claimed, read in one statement (their outlines
    in one more): each run's next read from its start is served from it, once, checked
    as any read is. An append through the handle drops the run's copy; a log longer
    than a page is left out."""
    monkeypatch.setattr(pg_module, "_PAGE", 4)
    for run_id, n in (("a", 3), ("b", 2), ("long", 5)):
        store.append(run_id, make_events(run_id, 0, 0, _facts(n)), expected_seq=0, epoch=0)
    fresh = {r: list(store.read(r)) for r in ("a", "b")}
    store._outlines.clear()  # as a worker's handle that never appended to them
    statements.clear()
    store.prefetch(["a", "b", "long", "missing"])
    assert len(statements) == 2
    statements.clear()
    assert {r: list(store.read(r)) for r in ("a", "b")} == fresh
    assert statements == []
    assert [e.seq for e in store.read("a")] == [1, 2, 3] and len(statements) == 1  # once
    assert [e.seq for e in store.read("long")] == [1, 2, 3, 4, 5] and len(statements) == 3
    store.prefetch(["b"])
    statements.clear()
    store.append("b", make_events("b", 2, 0, _facts(1)), expected_seq=2, epoch=0)
    assert len(statements) == 1  # the claim: the outline it builds on was prefetched
    assert [e.seq for e in store.read("b")] == [1, 2, 3]


def test_a_stale_cached_digest_cannot_break_the_chain(store: PostgresStore, schema: str) -> None:
    store.append("r", make_events("r", 0, 0, _facts(2)), expected_seq=0, epoch=0)
    store._ends["r"] = (2, "0" * 32)  # right seq, wrong digest: the claim must refuse it
    store.append("r", make_events("r", 2, 0, _facts(1)), expected_seq=2, epoch=0)
    with PostgresStore(PG_URL, schema=schema) as fresh:
        log = list(fresh.read("r"))
    assert [e.seq for e in log] == [1, 2, 3]
    assert _sql(f'SELECT last_digest FROM "{schema}".runs') == [(log[-1].digest,)]


def test_a_refused_claim_still_reports_conflict_and_fencing(store: PostgresStore) -> None:
    store.append("r", make_events("r", 0, 0, _facts(2)), expected_seq=0, epoch=0)
    with pytest.raises(ConflictError):
        store.append("r", make_events("r", 1, 0, _facts(1)), expected_seq=1, epoch=0)
    lease = store.acquire("r", "w", 30)
    with pytest.raises(FencedError):
        store.append("r", make_events("r", 2, 0, _facts(1)), expected_seq=2, epoch=0)
    store.append("r", make_events("r", 2, lease.epoch, _facts(1)), expected_seq=2,
                 epoch=lease.epoch)
    assert [e.seq for e in store.read("r")] == [1, 2, 3]


# --- outages are quiet and short ----------------------------------------------------------


def _drop_connections(application_name: str) -> None:
    """What a server restart or a network cut does to the handle's pooled connections."""
    _sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
         (application_name,))


def test_a_release_lost_to_a_dropped_connection_is_retried(schema: str) -> None:
    app = f"t_{uuid.uuid4().hex[:12]}"
    holder = PostgresStore(f"{PG_URL}?application_name={app}", schema=schema)
    successor = PostgresStore(PG_URL, schema=schema)
    try:
        lease = holder.acquire("r1", "w1", ttl=300.0)
        _drop_connections(app)
        holder.release(lease)  # its connection is dead: retried at once on a fresh one
        assert successor.acquire("r1", "w2", ttl=5.0).epoch == lease.epoch + 1  # no TTL wait
    finally:
        holder.close()
        successor.close()


def test_a_release_that_still_fails_is_retried_on_next_use_and_close(
    schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    holder = PostgresStore(PG_URL, schema=schema)
    successor = PostgresStore(PG_URL, schema=schema)
    try:
        lease = holder.acquire("r1", "w1", ttl=300.0)

        def gone(*args: object, **kwargs: object) -> Any:
            raise psycopg.OperationalError("server closed the connection unexpectedly")

        monkeypatch.setattr(holder._pool, "connection", gone)
        with pytest.raises(StoreUnavailableError):
            holder.release(lease)
        monkeypatch.undo()  # the server is back
        holder.close()  # the kept release goes out before the pool closes
        assert successor.acquire("r1", "w2", ttl=5.0).epoch == lease.epoch + 1
    finally:
        successor.close()


def test_pool_warnings_during_an_outage_stay_off_stderr(schema: str) -> None:
    """psycopg_pool logs each failed reconnection as a warning; with no logging configured
    Python prints those to stderr. A CLI user during an outage sees our one error line."""
    import subprocess
    import sys

    app = f"t_{uuid.uuid4().hex[:12]}"
    script = f"""
import time
from agentjournal import StoreUnavailableError, open_store
from agentjournal.store.postgres import PostgresStore
store = open_store({PG_URL + f"?schema={schema}&application_name={app}&connect_timeout=2"!r})
assert isinstance(store, PostgresStore)
store._pool.conninfo = "host=127.0.0.1 port=1 connect_timeout=1"  # the server is gone
print("ready", flush=True)
input()  # the test drops our connections now
for _ in range(2):  # a dead pooled connection, then no connection at all
    started = time.monotonic()
    try:
        store.list_runs()
    except StoreUnavailableError:
        print("unavailable after", round(time.monotonic() - started), flush=True)
time.sleep(1)  # the pool keeps trying to reconnect meanwhile
"""
    child = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline() == "ready\n"
    _drop_connections(app)
    out, err = child.communicate("\n", timeout=60)
    waits = [int(line.split()[-1]) for line in out.splitlines() if line.startswith("unav")]
    assert len(waits) == 2 and max(waits) < 30, out  # connect_timeout, not the pool's 30 s
    assert "error connecting" not in err and "discarding closed connection" not in err, err


def test_a_read_only_server_opens_and_refuses_writes_as_read_only(schema: str) -> None:
    """A standby (or a role whose transactions are read-only) serves reads; a write is
    ReadOnlyStoreError, not a raw driver error. An up-to-date schema needs no DDL to open."""
    from agentjournal.errors import ReadOnlyStoreError

    PostgresStore(PG_URL, schema=schema).close()  # created and migrated
    readonly = "options=-c%20default_transaction_read_only%3Don"
    sep = "&" if "?" in PG_URL else "?"
    with PostgresStore(f"{PG_URL}{sep}{readonly}", schema=schema) as store:
        assert store.list_runs() == []
        with pytest.raises(ReadOnlyStoreError, match="accepts no writes"):
            store.acquire("r1", "me", 5.0)


def test_a_warm_append_whose_answer_is_lost_breaks_the_handle(
    store: PostgresStore, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A warm append is one autocommit statement: if the connection drops before its
    answer, it may have committed. That is a DurabilityError, never 'unavailable, nothing
    was committed', and the handle refuses writes until reopened."""
    store.append("r", make_events("r", 0, 0, _facts(1)), expected_seq=0, epoch=0)
    real = PostgresStore._claim_and_insert

    def claim_then_drop(self: PostgresStore, *args: Any) -> bool:
        real(self, *args)  # the statement commits...
        raise psycopg.OperationalError("simulated: server closed the connection")  # ...unheard

    monkeypatch.setattr(PostgresStore, "_claim_and_insert", claim_then_drop)
    with pytest.raises(DurabilityError, match="commit failed"):
        store.append("r", make_events("r", 1, 0, _facts(1)), expected_seq=1, epoch=0)
    monkeypatch.undo()
    with pytest.raises(DurabilityError):
        store.append("r", make_events("r", 1, 0, _facts(1)), expected_seq=1, epoch=0)
    with PostgresStore(PG_URL, schema=schema) as fresh:
        assert fresh.last_seq("r") == 2  # it had committed: the reader learns the truth


def test_lock_timeout_comes_from_the_url_and_bounds_every_connection(schema: str) -> None:
    from agentjournal import open_store

    url = f"{PG_URL}{'&' if '?' in PG_URL else '?'}schema={schema}"
    with open_store(url) as store:
        assert isinstance(store, PostgresStore) and store.lock_timeout == 30.0
    with open_store(url + "&lock_timeout=2.5") as store, store._conn() as conn:
        assert conn.execute("SHOW lock_timeout").fetchone() == ("2500ms",)
    for bad in ("soon", "-1", "nan", ""):
        with pytest.raises(StoreUrlError, match="lock_timeout"):
            open_store(url + f"&lock_timeout={bad}")


def _relabel_v3(schema: str, run_id: str) -> None:
    """Every record of the run as a v3 writer stored it: no digest at all."""
    for seq, body in _sql(f'SELECT seq, body FROM "{schema}".events WHERE run_id = %s',
                          (run_id,)):
        event = msgspec.json.decode(bytes(body))
        event.pop("digest")
        event["v"] = 3
        _sql(f'UPDATE "{schema}".events SET body = %s WHERE run_id = %s AND seq = %s',
             (msgspec.json.Encoder(order="sorted").encode(event), run_id, seq))


def test_unsealed_records_are_damage_only_in_a_store_created_sealed(
    store: PostgresStore, schema: str
) -> None:
    store.append("r", make_events("r", 0, 0, _facts(3)), expected_seq=0, epoch=0)
    _relabel_v3(schema, "r")
    _sql(f"""UPDATE "{schema}".runs SET last_digest = '' WHERE run_id = 'r'""")  # its head too
    with pytest.raises(CorruptLogError, match="unsealed record in a store created") as caught:
        list(store.read("r"))
    assert caught.value.seq == 1
    # A store created before sealing (migrations 1-3 ran before 4) may hold such records.
    _sql(f"""UPDATE "{schema}".schema_version SET applied_at = applied_at - interval '1 day'
             WHERE version < 4""")
    with PostgresStore(PG_URL, schema=schema) as older:
        assert [e.seq for e in older.read("r")] == [1, 2, 3]


def test_a_new_run_opens_without_reading_its_empty_log(
        store: PostgresStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """The lease's grant read the run's row: an empty log is not read again (two round
    trips fewer for every new run); a short one is folded from its events without a
    look for a snapshot (a round trip fewer); a longer one is loaded as ever."""
    from agentjournal.journal import SHORT_LOG, open_journal

    reads: list[str] = []
    for name in ("read", "snapshots"):
        real = getattr(store, name)
        monkeypatch.setattr(store, name, lambda *a, _n=name, _r=real, **k: (
            reads.append(_n), _r(*a, **k))[1])
    with open_journal(store, "fresh") as j:
        assert j.state.last_seq == 0 and reads == []
        j.record(EventType.RUN_STARTED, task="t")
    with open_journal(store, "fresh") as j:
        assert j.state.last_seq == 1 and j.state.task == "t"
        assert reads == ["read"]
        j.record_all([(EventType.USER_MESSAGE, {"content": f"m{i}"})
                      for i in range(SHORT_LOG)])
    reads.clear()
    with open_journal(store, "fresh") as j:
        assert j.state.last_seq == SHORT_LOG + 1
        assert reads == ["snapshots", "read"]


def test_renewals_and_group_commits_lock_runs_in_one_order(schema: str) -> None:
    """A worker renews every lease it holds in one statement while group commits append
    to those runs: both lock the runs' rows in run id order. Locked in two orders, they
    deadlock; the loser waits deadlock_timeout (a second) and fails, and a heartbeat
    that keeps losing lets every lease lapse."""
    from agentjournal.journal import open_journal

    runs = [f"r{i:03d}" for i in range(120)]
    errors: list[BaseException] = []
    with PostgresStore(PG_URL, schema=schema, pool_size=8, group_commit="always") as store:
        journals = [open_journal(store, run_id, owner="w", ttl=30) for run_id in runs]
        going = threading.Event()
        going.set()

        def renew() -> None:
            leases = [j.lease for j in journals]
            try:
                for i in range(60):  # the input order turned around each time
                    store.renew_all(leases[::-1] if i % 2 else leases, 30)
            except BaseException as exc:
                errors.append(exc)
            finally:
                going.clear()

        def append(mine: list[Any]) -> None:
            try:
                while going.is_set():
                    for j in mine:
                        j.record(EventType.USER_MESSAGE, content="x")
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=renew),
                   *(threading.Thread(target=append, args=(journals[k::8][::-1 if k % 2 else 1],))
                     for k in range(8))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        for j in journals:
            j.close()
    assert errors == []


def test_leases_of_runs_opened_or_closed_together_commit_together(
        schema: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Acquires that meet go in one transaction, each granted or refused on its own: a
    new run (epoch 1), a released one (taken over: epoch 2), its holder's own again (a
    renewal, same epoch), another's (held: LeaseHeldError, that one alone) and the same
    new run asked for twice (the second, by another owner, finds it held). Releases that
    meet likewise go in one transaction."""
    from agentjournal.errors import LeaseHeldError

    with PostgresStore(PG_URL, schema=schema) as store:
        store.release(store.acquire("released", "w0", 60))
        store.acquire("mine", "w1", 60)
        store.acquire("theirs", "w2", 60)
        calls = [("first", lambda: store.acquire("first", "w1", 60)),
                 ("new", lambda: store.acquire("new", "w1", 60)),
                 ("released", lambda: store.acquire("released", "w1", 60)),
                 ("mine", lambda: store.acquire("mine", "w1", 60)),
                 ("theirs", lambda: store.acquire("theirs", "w1", 60)),
                 ("twice", lambda: store.acquire("twice", "w1", 60)),
                 ("twice-again", lambda: store.acquire("twice", "w3", 60))]
        got, commits = in_one_group(store, store._acquirer, calls, monkeypatch)
        # The held first, the group, and the second ask for "twice" after it.
        assert commits == 3
        assert {k: v.epoch for k, v in got.items() if not isinstance(v, Exception)} == {
            "first": 1, "new": 1, "released": 2, "mine": 1, "twice": 1}
        assert got["new"].last_seq == 0 and got["new"].expires_at > 0
        assert isinstance(got["theirs"], LeaseHeldError) and got["theirs"].owner == "w2"
        assert isinstance(got["twice-again"], LeaseHeldError) and got["twice-again"].owner == "w1"
        assert _sql(f'SELECT run_id, lease_owner, lease_epoch FROM "{schema}".runs'
                    " ORDER BY run_id") == [
            ("first", "w1", 1), ("mine", "w1", 1), ("new", "w1", 1), ("released", "w1", 2),
            ("theirs", "w2", 1), ("twice", "w1", 1)]

        leases = [got[k] for k in ("first", "new", "released", "mine", "twice")]
        got, commits = in_one_group(store, store._releaser,
                                [(lease.run_id, lambda lease=lease: store.release(lease))
                                 for lease in leases], monkeypatch)
        assert commits == 2 and set(got.values()) == {None}
        assert {store.acquire(lease.run_id, "w4", 60).epoch for lease in leases[1:]} == {2, 3}


def test_batched_appends_of_runs_that_meet_commit_together_without_a_sync(
        schema: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """With durability=batched, warm appends that meet go in one transaction (as with
    fsync) that turns synchronous_commit off; before, each took the locked way alone (two
    round trips and a commit each: a third of the appends a second of the default)."""
    with PostgresStore(PG_URL, schema=schema, durability=Durability.BATCHED) as store:
        runs = [f"b{i}" for i in range(6)]
        for run_id in runs:  # one event each: every append after is a warm one
            store.append(run_id, make_events(run_id, 0, 0, _facts(1)), expected_seq=0, epoch=0)
        settings: list[str] = []
        real = store._sync

        def spy(conn: Any) -> None:
            settings.append(conn.execute("SHOW synchronous_commit").fetchone()[0])
            real(conn)

        monkeypatch.setattr(store, "_sync", spy)
        got, commits = in_one_group(store, store._grouper, [
            (run_id, lambda run_id=run_id: store.append(
                run_id, make_events(run_id, 1, 0, _facts(1)), expected_seq=1, epoch=0))
            for run_id in runs], monkeypatch)
        assert got == {run_id: 2 for run_id in runs}
        # The held one alone (autocommit: durable at once), then the group of five.
        assert commits == 2 and settings[1:] == ["off"], settings
        assert all(len(list(store.read(run_id))) == 2 for run_id in runs)


FROZEN_HOLDER = """
import os, signal, sys
from agentjournal.store.postgres import PostgresStore

url, schema, run_id = sys.argv[1:]
store = PostgresStore(url, schema=schema)
with store._conn() as conn, conn.transaction():
    conn.execute(f'SELECT 1 FROM "{schema}".runs WHERE run_id = %s FOR UPDATE', (run_id,))
    print("locked", flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)  # frozen before its COMMIT, as under a SIGSTOP
"""


def test_a_process_frozen_inside_a_transaction_does_not_hide_its_run_from_claims(
        store: PostgresStore, schema: str) -> None:
    """A worker SIGSTOPped between a statement and its COMMIT held its run's row lock, and
    the claim (SKIP LOCKED) skipped the run for as long as it stayed frozen (a successor
    never claimed it, in CI). The server now ends such a session after
    IDLE_IN_TRANSACTION_TIMEOUT: the run is claimed a few seconds later."""
    from agentjournal.fleet import queue_of

    queue = queue_of(store)
    queue.submit("frozen-run", "tests.chaos_agents:ledger_agent", "t")
    with store._conn() as conn:
        assert conn.execute("SHOW idle_in_transaction_session_timeout").fetchone() == ("5s",)
    holder = subprocess.Popen([sys.executable, "-c", FROZEN_HOLDER, PG_URL, schema,
                               "frozen-run"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        deadline = time.monotonic() + 30 + pg_module.IDLE_IN_TRANSACTION_TIMEOUT
        claim = None
        while claim is None and time.monotonic() < deadline:
            claim = queue.claim("successor", 5.0, ["default"])
            time.sleep(0.2)
        assert claim is not None and claim.lease.run_id == "frozen-run"
    finally:
        holder.kill()
        holder.wait()
