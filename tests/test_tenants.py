"""Tenants on a shared PostgreSQL schema: two tenants' roles, row-level security between them.

Tenant A owns a run (started, leased, snapshotted) and queued runs (one claimed, one
waiting). Tenant B, on the same schema with its own role, sees nothing of them, and
every write across the boundary is refused or changes nothing (the admin, the tables'
owner, reads A's rows before and after). A's own work is unaffected.

Needs a server (conftest's POSTGRES_URL): skipped when unreachable, a failure under CI=true.
"""

from __future__ import annotations

import secrets
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Any, TypeVar, cast
from urllib.parse import quote, urlsplit

import pytest

from .conftest import POSTGRES_URL, postgres_reason

if _why := postgres_reason():
    pytest.skip(_why, allow_module_level=True)

import psycopg
from psycopg import sql

from agentjournal import (
    Agent,
    EventType,
    JournalError,
    ScriptedModel,
    StoreLockedError,
    StoreUnavailableError,
    calls,
    make_events,
    open_store,
    reply,
    tool,
)
from agentjournal.events import seal
from agentjournal.fleet import WorkerInfo, queue_of, submit
from agentjournal.store import Lease, Store
from agentjournal.store import postgres as pg_module
from agentjournal.store.base import Tombstone
from agentjournal.store.postgres import PostgresStore
from agentjournal.store.tenants import (
    CHANNELS_TABLE,
    SHARED_TABLES,
    TENANT_TABLES,
    TenantRoleError,
    create_tenant,
    grant_tenant,
    list_tenants,
    revoke_tenant,
)

from .builders import snapshot_at

SEG = "ab" * 32  # a segment's digest


def _sql(query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        cur = conn.execute(query, params)
        return cur.fetchall() if cur.description else []


def _url(schema: str, role: str | None = None, password: str | None = None) -> str:
    """A store URL of the schema as the admin (role None) or as ``role``."""
    parts = urlsplit(POSTGRES_URL)
    if role is not None:
        host = parts.netloc.rpartition("@")[2]
        auth = quote(role, safe="") + (f":{quote(password, safe='')}" if password else "")
        parts = parts._replace(netloc=f"{auth}@{host}")
    sep = "&" if parts.query else "?"
    return parts.geturl() + f"{sep}schema={schema}"


@dataclass
class Shared:
    schema: str
    admin: str  # the admin's store URL
    roles: tuple[str, str]
    urls: tuple[str, str]


@pytest.fixture
def shared() -> Iterator[Shared]:
    schema = f"t_{uuid.uuid4().hex[:16]}"
    tag = uuid.uuid4().hex[:8]
    roles = (f"aj_tenant_a_{tag}", f"aj_tenant_b_{tag}")
    admin = _url(schema)
    urls = []
    try:
        for role in roles:
            password = secrets.token_hex(12)
            create_tenant(admin, None, role, password=password)
            urls.append(_url(schema, role, password))
        yield Shared(schema, admin, roles, (urls[0], urls[1]))
    finally:
        _sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        for role in roles:
            if _sql("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)):
                _sql(f'DROP OWNED BY "{role}"')
                _sql(f'DROP ROLE "{role}"')


def _facts(*texts: str) -> list[tuple[EventType, dict[str, Any]]]:
    return [(EventType.USER_MESSAGE, {"text": t}) for t in texts]


def _rows(schema: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table, read as the admin (who row-level security never limits)."""
    return {t: _sql(f'SELECT * FROM "{schema}"."{t}" ORDER BY 1, 2')
            for t in (*TENANT_TABLES, "quarantine")}


@dataclass
class TenantA:
    run: str  # started, leased, with a snapshot
    lease: Lease
    queued: str  # submitted and claimed
    claim_lease: Lease
    waiting: str  # submitted, not claimed
    scope: str


def _tenant_a_work(store: Store) -> TenantA:
    lease = store.acquire("a-run", "worker-a", 300)
    events = make_events("a-run", 0, lease.epoch, [
        (EventType.RUN_STARTED, {"task": "secret task of A", "scope": "scope-a"}),
        *_facts("secret message of A")])
    store.append("a-run", events, expected_seq=0, epoch=lease.epoch)
    store.put_snapshot(snapshot_at("a-run", 2, b"state of A"))
    store.put_segments("a-run", {SEG: b"part of A's state"})
    queue = queue_of(store)
    submit(store, "tests.agents:a", "queued task of A", "a-queued", priority=5)
    claim = queue.claim("worker-a", 300, ["default"])
    assert claim is not None and claim.lease.run_id == "a-queued"
    submit(store, "tests.agents:a", "waiting task of A", "a-waiting")
    queue.beat(WorkerInfo(worker_id="worker-a", host="host-a", pid=1, queues=["default"],
                          runs=["a-queued"], started_at=time.time(),
                          heartbeat_at=time.time()))
    return TenantA("a-run", lease, "a-queued", claim.lease, "a-waiting", "scope-a")


@contextmanager
def _refused(*leaks: str) -> Iterator[pytest.ExceptionInfo[JournalError]]:
    """The block raises a JournalError whose message holds none of ``leaks``."""
    with pytest.raises(JournalError) as info:
        yield info
    for leak in leaks:
        assert leak not in str(info.value)


def test_the_tenant_roles_are_limited_by_row_level_security(shared: Shared) -> None:
    for role in shared.roles:
        ((superuser, bypass, login),) = _sql(
            "SELECT rolsuper, rolbypassrls, rolcanlogin FROM pg_roles WHERE rolname = %s",
            (role,))
        assert not superuser and not bypass and login
        assert not _sql("SELECT 1 FROM pg_tables WHERE schemaname = %s AND tableowner = %s",
                        (shared.schema, role))
        assert _sql("SELECT has_schema_privilege(%s, %s, 'CREATE')",
                    (role, shared.schema)) == [(False,)]
    tables = dict(_sql("SELECT tablename, rowsecurity FROM pg_tables WHERE schemaname = %s",
                       (shared.schema,)))
    assert tables == {**dict.fromkeys(TENANT_TABLES, True), **dict.fromkeys(SHARED_TABLES, False),
                      CHANNELS_TABLE: True}
    assert _sql("SELECT relforcerowsecurity FROM pg_class WHERE relname = 'runs' AND"
                " relnamespace = %s::regnamespace", (shared.schema,)) == [(False,)]
    policies = _sql("SELECT tablename, cmd, qual FROM pg_policies WHERE schemaname = %s"
                    " ORDER BY tablename", (shared.schema,))
    assert [p[0] for p in policies] == sorted((*TENANT_TABLES, CHANNELS_TABLE))
    assert all(p[1] == "ALL" and p[2] == "(tenant = CURRENT_USER)" for p in policies)


def test_a_tenant_opens_the_schema_without_ddl(shared: Shared) -> None:
    versions = _sql(f'SELECT version, applied_at FROM "{shared.schema}".schema_version')
    with open_store(shared.urls[0]) as store:
        assert store.list_runs() == [] and store.quarantined() == {}
    assert _sql(f'SELECT version, applied_at FROM "{shared.schema}".schema_version') == versions
    assert len(versions) == len(pg_module.MIGRATIONS)


def test_tenant_b_sees_nothing_of_a_and_changes_nothing(shared: Shared) -> None:
    with open_store(shared.urls[0]) as a_store, open_store(shared.urls[1]) as b_store:
        a = _tenant_a_work(a_store)
        before = _rows(shared.schema)
        owners = {r[0] for t in TENANT_TABLES
                  for r in _sql(f'SELECT tenant FROM "{shared.schema}"."{t}"')}
        assert owners == {shared.roles[0]}
        leaks = ("secret", "worker-a", "host-a", shared.roles[0], "state of A")
        b_queue = queue_of(b_store)

        # Every read: nothing.
        for run in (a.run, a.queued, a.waiting):
            assert list(b_store.read(run)) == [] and b_store.last_seq(run) == 0
            assert b_store.snapshots(run) == [] and b_store.segments(run, [SEG]) == {}
        assert b_store.list_runs() == [] and b_store.scope_runs(a.scope) == []
        assert b_queue.runs() == [] and b_queue.workers() == []

        # Every write across the boundary: refused, or it matches nothing.
        for expected, epoch in ((0, 0), (2, a.lease.epoch), (2, 0)):
            events = make_events(a.run, expected, epoch, _facts("B's forgery"))
            with _refused(*leaks) as error:
                b_store.append(a.run, events, expected_seq=expected, epoch=epoch)
            assert "another tenant" in str(error.value) and error.value.run_id == a.run
        for run in (a.run, a.queued, a.waiting):
            with _refused(*leaks):
                b_store.acquire(run, "worker-b", 60)
        with _refused(*leaks):
            b_store.renew(a.lease, 60)
        with _refused(*leaks):
            b_store.renew(a.claim_lease, 60)
        b_store.release(a.lease)
        b_store.release(a.claim_lease)
        with _refused(*leaks):
            b_store.put_snapshot(snapshot_at(a.run, 2, b"B's state"))
        with _refused(*leaks):
            b_store.put_snapshot(snapshot_at(a.run, 1, b"B's state"))
        with _refused(*leaks):
            b_store.put_segments(a.run, {SEG: b"B's part"})
        assert b_store.delete_snapshots(a.run) == 0 and b_store.prune_segments(a.run, []) == 0
        with _refused(*leaks):
            b_store.quarantine(1, "B says so")
        assert b_queue.claim("worker-b", 60, ["default"]) is None  # a.waiting is runnable
        assert not b_queue.hand_back(a.claim_lease, "done", 9)
        assert not b_queue.hand_back(a.claim_lease, "queued", 0)
        assert not b_queue.retry(a.waiting) and not b_queue.retry(a.queued)
        for run in (a.queued, a.waiting, a.run):
            with _refused(*leaks):
                submit(b_store, "tests.agents:b", "queued task of A", run)
        b_queue.forget("worker-a")
        b_queue.wake()

        assert _rows(shared.schema) == before  # as the admin sees it: A's rows untouched

        # A's own work goes on: its lease, its claim, its waiting run.
        a_queue = queue_of(a_store)
        a_store.renew(a.lease, 60)
        events = make_events(a.run, 2, a.lease.epoch, _facts("A goes on"))
        assert a_store.append(a.run, events, expected_seq=2, epoch=a.lease.epoch) == 3
        assert a_queue.hand_back(a.claim_lease, "done", 0)
        claim = a_queue.claim("worker-a", 60, ["default"])
        assert claim is not None and claim.lease.run_id == a.waiting
        assert {r.run_id for r in a_queue.runs()} == {a.queued, a.waiting}
        assert [w.worker_id for w in a_queue.workers()] == ["worker-a"]


def test_tenant_b_has_runs_of_its_own_which_a_never_sees(shared: Shared) -> None:
    with open_store(shared.urls[0]) as a_store, open_store(shared.urls[1]) as b_store:
        a = _tenant_a_work(a_store)
        lease = b_store.acquire("b-run", "worker-b", 60)
        b_store.append("b-run", make_events("b-run", 0, lease.epoch, _facts("B's own")),
                       expected_seq=0, epoch=lease.epoch)
        submit(b_store, "tests.agents:b", "B's task", "b-queued")
        claim = queue_of(b_store).claim("worker-b", 60, ["default"])
        assert claim is not None and claim.lease.run_id == "b-queued"  # never A's
        assert [r.run_id for r in b_store.list_runs()] == ["b-run"]
        assert {r.run_id for r in a_store.list_runs()} == {a.run}
        assert list(a_store.read("b-run")) == [] and queue_of(a_store).claim(
            "worker-a", 60, ["default"]) is not None  # A's waiting run, not B's
        with _refused():
            a_store.acquire("b-run", "worker-a", 60)
        owners = dict(_sql(f'SELECT run_id, tenant FROM "{shared.schema}".runs'))
        assert owners == {"a-run": shared.roles[0], "a-queued": shared.roles[0],
                          "a-waiting": shared.roles[0], "b-run": shared.roles[1],
                          "b-queued": shared.roles[1]}
        tenants = {t.role: t for t in list_tenants(shared.admin)}
        assert set(tenants) == set(shared.roles)
        assert (tenants[shared.roles[0]].runs, tenants[shared.roles[0]].queued) == (1, 2)
        assert (tenants[shared.roles[1]].runs, tenants[shared.roles[1]].queued) == (1, 1)
        assert all(t.granted and t.can_login for t in tenants.values())


@tool(effect="irreversible")
def pay(amount: int) -> str:
    return f"paid {amount}"


def test_a_whole_agent_run_as_a_tenant(shared: Shared) -> None:
    with open_store(shared.urls[0]) as a_store, open_store(shared.urls[1]) as b_store:
        submit(a_store, "tests.agents:a", "pay 5", "a-agent")
        claim = queue_of(a_store).claim("worker-a", 60, ["default"])
        assert claim is not None
        agent = Agent(ScriptedModel([calls(("pay", {"amount": 5})), reply("done")]), [pay])
        result = agent.run(a_store, "a-agent", claim.task, owner="worker-a", keep_lease=True)
        assert result.status == "finished"
        assert queue_of(a_store).hand_back(claim.lease, "done", result.last_seq)
        assert a_store.last_seq("a-agent") == result.last_seq > 2
        assert b_store.last_seq("a-agent") == 0 and b_store.list_runs() == []
        with _refused():
            agent.run(b_store, "a-agent", "pay 5", owner="worker-b")


def test_rows_before_the_migration_belong_to_its_runner(
    shared: Shared, monkeypatch: pytest.MonkeyPatch
) -> None:
    schema = f"{shared.schema}_old"
    try:
        before = next(i for i, m in enumerate(pg_module.MIGRATIONS) if "tenant" in m)
        with monkeypatch.context() as m:  # a schema as the release before tenants left it
            m.setattr(pg_module, "MIGRATIONS", pg_module.MIGRATIONS[:before])
            PostgresStore(POSTGRES_URL, schema=schema).close()
        # ...and a run it wrote (this release's code no longer runs on that schema).
        event = make_events("old", 0, 1, _facts("before"))[0]
        (body,), digest = seal([event], "")
        _sql(f'INSERT INTO "{schema}".runs (run_id, last_seq, lease_owner, lease_epoch,'
             " created_at, updated_at, scope, last_digest) VALUES ('old', 1, 'w', 1, now(),"
             f" now(), 'run:old', '{digest}')")
        _sql(f'INSERT INTO "{schema}".events VALUES (%s, 1, %s, %s, %s)',
             ("old", event.type.value, event.ts, body))
        with PostgresStore(POSTGRES_URL, schema=schema) as new:
            assert [e.seq for e in new.read("old")] == [1]
        ((me,),) = _sql("SELECT current_user")
        assert _sql(f'SELECT tenant FROM "{schema}".runs') == [(me,)]
        assert _sql(f'SELECT tenant FROM "{schema}".events') == [(me,)]
        grant_tenant(_url(schema), None, shared.roles[1])
        with open_store(_url(schema, shared.roles[1])) as tenant:
            assert tenant.list_runs() == [] and list(tenant.read("old")) == []
    finally:
        _sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def test_roles_that_would_see_every_tenant_are_refused(shared: Shared) -> None:
    ((me,),) = _sql("SELECT current_user")
    with pytest.raises(TenantRoleError, match=r"superuser|owns"):
        grant_tenant(shared.admin, None, me)
    with pytest.raises(TenantRoleError, match="no such role"):
        grant_tenant(shared.admin, None, f"aj_nobody_{uuid.uuid4().hex[:8]}")
    _sql(f'ALTER ROLE "{shared.roles[1]}" BYPASSRLS')
    with pytest.raises(TenantRoleError, match="BYPASSRLS"):
        grant_tenant(shared.admin, None, shared.roles[1])
    _sql(f'ALTER ROLE "{shared.roles[1]}" NOBYPASSRLS')
    grant_tenant(shared.admin, None, shared.roles[1])  # idempotent


def test_a_revoked_tenant_can_no_longer_open_the_store(shared: Shared) -> None:
    revoke_tenant(shared.admin, None, shared.roles[1])
    with pytest.raises(JournalError):
        open_store(shared.urls[1]).close()
    tenants = {t.role: t.granted for t in list_tenants(shared.admin)}
    assert tenants == {shared.roles[0]: True}


def test_a_tenant_granted_before_segments_writes_them_after_the_upgrade(
        shared: Shared) -> None:
    """Migration 8 adds the segments table and grants it to every role that writes
    snapshots, so a tenant granted by an older release keeps its snapshots."""
    s, role = f'"{shared.schema}"', shared.roles[0]
    _sql(f"DROP TABLE {s}.segments")  # the schema as the release before left it
    _sql(f"DELETE FROM {s}.schema_version WHERE version >= 8")  # (later ones run again)
    open_store(shared.admin).close()  # the admin opens it: migrated
    with open_store(shared.urls[0]) as tenant:
        events = make_events("a-run", 0, 0, _facts("hello"))
        tenant.append("a-run", events, expected_seq=0, epoch=0)
        tenant.put_segments("a-run", {SEG: b"part"})
        assert tenant.segments("a-run", [SEG]) == {SEG: b"part"}
    assert _sql(f"SELECT tenant FROM {s}.segments") == [(role,)]


# --- one tenant cannot stall the others ----------------------------------------------

HANG_GUARD = 90.0  # seconds: only a hang guard, far above any lock timeout used here
T = TypeVar("T")


def _conninfo(url: str) -> str:
    """A store URL as a plain libpq URL (without agentjournal's own parameters)."""
    parts = urlsplit(url)
    ours = ("schema=", "lock_timeout=")
    query = "&".join(kv for kv in parts.query.split("&") if kv and not kv.startswith(ours))
    return parts._replace(query=query).geturl()


@contextmanager
def _holding(url: str, *statements: str) -> Iterator[None]:
    """Another session (as the URL's role) holding what ``statements`` lock, in an open
    transaction, until the block ends."""
    with psycopg.connect(_conninfo(url)) as conn:
        for statement in statements:
            conn.execute(statement)
        try:
            yield
        finally:
            conn.rollback()


def _unstalled(call: Callable[[], T]) -> T:
    """``call()``'s result (or its exception), failing the test if it is still waiting
    after HANG_GUARD: stalled by another session's lock."""
    outcome: list[tuple[bool, Any]] = []

    def run() -> None:
        try:
            outcome.append((True, call()))
        except BaseException as exc:  # handed to the test's thread
            outcome.append((False, exc))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(HANG_GUARD)
    if not outcome:
        pytest.fail(f"still waiting after {HANG_GUARD:g} s: stalled by another session's lock")
    done, value = outcome[0]
    if not done:
        raise value
    return cast(T, value)


def _migration_lock(schema: str) -> str:
    return f"SELECT pg_advisory_xact_lock({pg_module._MIGRATION_LOCK}, hashtext('{schema}'))"


def test_a_tenant_holding_the_migration_lock_stalls_no_open(shared: Shared) -> None:
    with _holding(shared.urls[0], _migration_lock(shared.schema)):
        for url in (shared.urls[1], shared.admin, shared.urls[0]):
            with _unstalled(partial(open_store, url)) as store:  # up to date: no lock taken
                assert store.list_runs() == []


def test_a_migration_waits_for_the_migration_lock_only_until_the_lock_timeout(
        shared: Shared) -> None:
    fresh = f"{shared.schema}_new"  # to be created: its first open migrates
    try:
        with _holding(shared.urls[0], _migration_lock(fresh)), \
                pytest.raises(StoreLockedError) as info:
            _unstalled(partial(open_store, _url(fresh) + "&lock_timeout=1"))
        error = info.value
        assert isinstance(error, StoreUnavailableError) and error.retryable
        assert error.timeout == 1.0 and "migration lock" in str(error)
        assert "lock_timeout" in str(error) and "pg_locks" in str(error)
        assert not _sql("SELECT 1 FROM pg_namespace WHERE nspname = %s", (fresh,))
        open_store(_url(fresh)).close()  # the lock released: it migrates
        assert _sql(f'SELECT count(*) FROM "{fresh}".schema_version') == [
            (len(pg_module.MIGRATIONS),)]
    finally:
        _sql(f'DROP SCHEMA IF EXISTS "{fresh}" CASCADE')


def test_an_open_waits_for_a_table_lock_only_until_the_lock_timeout(shared: Shared) -> None:
    # Only the owner can take this lock; a tenant opening waits for it, not forever.
    with _holding(shared.admin, f'LOCK TABLE "{shared.schema}".schema_version'), \
            pytest.raises(StoreLockedError, match="opening the schema"):
        _unstalled(partial(open_store, shared.urls[1] + "&lock_timeout=1"))
    open_store(shared.urls[1]).close()


@pytest.mark.parametrize("table", ["runs", "events", "queue", *SHARED_TABLES])
def test_a_tenant_cannot_lock_the_tables_every_write_and_claim_uses(
        shared: Shared, table: str) -> None:
    name = f'"{shared.schema}"."{table}"'
    for statement in (*(f"LOCK TABLE {name} IN {mode} MODE" for mode in (
            "ACCESS EXCLUSIVE", "EXCLUSIVE", "SHARE ROW EXCLUSIVE", "SHARE",
            "SHARE UPDATE EXCLUSIVE", "ROW SHARE")), f"TRUNCATE {name}"):
        with pytest.raises(psycopg.errors.InsufficientPrivilege), \
                _holding(shared.urls[0], statement):
            pass
    for privilege in ("UPDATE", "DELETE", "TRUNCATE"):  # what LOCK TABLE ... EXCLUSIVE needs
        assert _sql("SELECT has_table_privilege(%s, %s, %s)",
                    (shared.roles[0], name, privilege)) == [(False,)]


def test_a_tenants_log_is_append_only_to_it(shared: Shared) -> None:
    """Without DELETE on events a tenant cannot archive (gc) its runs: the admin does."""
    with open_store(shared.urls[0]) as a_store:
        a = _tenant_a_work(a_store)
        before = _rows(shared.schema)
        tombstone = Tombstone(run_id=a.run, last_seq=2, digest="", archive="file:///x",
                              deleted_at=datetime.now(UTC))
        with pytest.raises(JournalError, match="permission denied"):
            a_store.delete_run(tombstone, epoch=a.lease.epoch)
        for statement in (f'DELETE FROM "{shared.schema}".events',
                          f'UPDATE "{shared.schema}".events SET type = type'):
            with pytest.raises(psycopg.errors.InsufficientPrivilege), \
                    _holding(shared.urls[0], statement):
                pass
        assert _rows(shared.schema) == before
    with open_store(shared.admin) as admin:
        admin.delete_run(tombstone, epoch=a.lease.epoch)
        assert admin.tombstone(a.run) is not None


def test_a_table_lock_a_tenant_can_still_take_stalls_others_only_until_the_lock_timeout(
        shared: Shared) -> None:
    """A tenant keeps DELETE on workers, snapshots and segments (pruning is a delete), so
    it can lock them: another tenant's call on them fails with StoreLockedError after
    the lock timeout, and its appends, which never touch them, go on."""
    with open_store(shared.urls[1] + "&lock_timeout=1") as b_store:
        b_queue = queue_of(b_store)
        for table in ("workers", "snapshots", "segments"):
            with _holding(shared.urls[0], f'LOCK TABLE "{shared.schema}".{table}'):
                with pytest.raises(StoreLockedError, match="this call needs"):
                    _unstalled({"workers": b_queue.workers,
                                "snapshots": partial(b_store.snapshots, "b-run"),
                                "segments": partial(b_store.segments, "b-run", [SEG]),
                                }[table])
                seq = b_store.last_seq("b-run")
                events = make_events("b-run", seq, 0, _facts(f"B appends past {table}"))
                assert _unstalled(partial(b_store.append, "b-run", events,
                                          expected_seq=seq, epoch=0)) == seq + 1
        assert b_queue.workers() == [] and b_store.last_seq("b-run") == 3


# --- what one tenant learns of another's activity ------------------------------------

def _heard_before_marker(url: str, channel: str, during: Callable[[], None]) -> list[int]:
    """The pids of every notification on ``channel`` that a session of the URL's role
    hears while ``during`` runs, up to a marker it sends itself afterwards (notifications
    arrive in commit order, so whatever ``during`` sent there arrives first)."""
    with psycopg.connect(_conninfo(url), autocommit=True) as listener, \
            psycopg.connect(_conninfo(url), autocommit=True) as marker:
        listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
        during()
        marker.execute(sql.SQL("NOTIFY {}, 'marker'").format(sql.Identifier(channel)))
        heard = []
        for note in listener.notifies(timeout=HANG_GUARD):
            if note.payload == "marker":
                return heard
            heard.append(note.pid)
    pytest.fail(f"the marker on {channel} never arrived")


def test_a_tenant_hears_nothing_of_another_tenants_submits(shared: Shared) -> None:
    schema_channel = f"agentjournal_{shared.schema}"
    with open_store(shared.urls[1]) as b_store:
        b_submits = partial(submit, b_store, "tests.agents:b", "B's task")
        assert _heard_before_marker(shared.urls[0], schema_channel,
                                    partial(b_submits, "b-1")) == []
        assert _heard_before_marker(shared.urls[0], schema_channel,
                                    partial(queue_of(b_store).wake)) == []


def test_each_tenants_workers_and_the_admins_are_woken_by_its_submits(shared: Shared) -> None:
    with open_store(shared.urls[0]) as a_store, open_store(shared.urls[1]) as b_store, \
            open_store(shared.admin) as admin_store:
        a_queue, b_queue, admin_queue = (queue_of(s) for s in (a_store, b_store, admin_store))
        for queue in (a_queue, b_queue, admin_queue):
            queue.wait(0.0)  # listening from now on
        submit(b_store, "tests.agents:b", "B's task", "b-1")
        assert b_queue.wait(HANG_GUARD) and admin_queue.wait(HANG_GUARD)
        submit(a_store, "tests.agents:a", "A's task", "a-1")
        assert a_queue.wait(HANG_GUARD) and admin_queue.wait(HANG_GUARD)
        # A tenant granted while the admin's worker runs wakes it once it looks again.
        role, password = f"aj_tenant_c_{uuid.uuid4().hex[:8]}", secrets.token_hex(12)
        try:
            create_tenant(shared.admin, None, role, password=password)
            admin_queue.wait(0.0)
            with open_store(_url(shared.schema, role, password)) as c_store:
                submit(c_store, "tests.agents:c", "C's task", "c-1")
                assert admin_queue.wait(HANG_GUARD)
                assert [r.run_id for r in queue_of(c_store).runs()] == ["c-1"]
        finally:
            _sql(f'DROP OWNED BY "{role}"')
            _sql(f'DROP ROLE "{role}"')


def test_a_tenants_channel_is_its_own_secret(shared: Shared) -> None:
    """A channel anyone could name could be heard by anyone (LISTEN needs no privilege):
    each tenant's is random, and only it and the admin can read it."""
    channels = dict(_sql(f'SELECT tenant, channel FROM "{shared.schema}".{CHANNELS_TABLE}'))
    assert set(channels) == set(shared.roles)
    for role, url in zip(shared.roles, shared.urls, strict=True):
        assert role not in channels[role] and shared.schema not in channels[role]
        with psycopg.connect(_conninfo(url)) as conn:
            seen = conn.execute(
                f'SELECT tenant, channel FROM "{shared.schema}".{CHANNELS_TABLE}').fetchall()
        assert seen == [(role, channels[role])]
    grant_tenant(shared.admin, None, shared.roles[0])  # idempotent: the channel stays
    revoke_tenant(shared.admin, None, shared.roles[1])  # ...and goes with the grants
    assert dict(_sql(f'SELECT tenant, channel FROM "{shared.schema}".{CHANNELS_TABLE}')) == {
        shared.roles[0]: channels[shared.roles[0]]}


def test_what_row_level_security_does_not_hide(shared: Shared) -> None:
    """What docs/tenants.md says a tenant can still observe of another: counts and sizes,
    not contents. (If one of these starts to hold, update the page.)"""
    s = f'"{shared.schema}"'
    with open_store(shared.urls[1]) as b_store:
        for i in range(5):
            b_store.append(f"b-{i}", make_events(f"b-{i}", 0, 0, _facts("B's secret", "x")),
                           expected_seq=0, epoch=0)
    _sql(f"ANALYZE {s}.events")
    with psycopg.connect(_conninfo(shared.urls[0]), autocommit=True) as a:
        def one(query: str) -> Any:
            return a.execute(query).fetchone()

        assert one(f"SELECT count(*) FROM {s}.events") == (0,)
        plan = "\n".join(r[0] for r in a.execute(f"EXPLAIN ANALYZE SELECT * FROM {s}.events"))
        assert "Rows Removed by Filter: 10" in plan  # B's row count
        assert one(f"SELECT reltuples FROM pg_class WHERE oid = '{s}.events'::regclass") == (10,)
        assert one(f"SELECT pg_relation_size('{s}.events') > 0") == (True,)
        assert one(f"SELECT count(*) FROM pg_stats WHERE schemaname = '{shared.schema}'") == (0,)
        with PostgresStore(_conninfo(shared.urls[1]), schema=shared.schema) as b_store, \
                b_store._conn() as b_conn:
            b_conn.execute(f"SELECT 1 FROM {s}.runs")  # B inside a transaction, holding a lock
            ((b_pid,),) = b_conn.execute("SELECT pg_backend_pid()").fetchall()
            assert one(f"SELECT usename, query FROM pg_stat_activity WHERE pid = {b_pid}") == (
                shared.roles[1], "<insufficient privilege>")
            assert one(f"SELECT count(*) > 0 FROM pg_locks WHERE pid = {b_pid}"
                       f" AND relation = '{s}.runs'::regclass") == (True,)


def test_a_tenant_granted_before_channels_submits_on_the_schemas_channel(
        shared: Shared) -> None:
    """Until grant_tenant runs again for it, such a tenant has no channel of its own and
    no access to the others': it still submits, and the admin's workers hear it."""
    table = f'"{shared.schema}".{CHANNELS_TABLE}'
    _sql(f'REVOKE ALL ON {table} FROM "{shared.roles[0]}"')
    _sql(f"DELETE FROM {table} WHERE tenant = %s", (shared.roles[0],))
    with open_store(shared.urls[0]) as a_store, open_store(shared.admin) as admin_store:
        admin_queue = queue_of(admin_store)
        admin_queue.wait(0.0)
        heard = _heard_before_marker(shared.admin, f"agentjournal_{shared.schema}",
                                     partial(submit, a_store, "tests.agents:a", "A", "a-1"))
        assert len(heard) == 1 and admin_queue.wait(HANG_GUARD)
