"""Tenants on a shared PostgreSQL schema: two tenants' roles, row-level security between them.

Tenant A owns a run (started, leased, snapshotted) and queued runs (one claimed, one
waiting). Tenant B, on the same schema with its own role, sees nothing of them, and
every write across the boundary is refused or changes nothing (the admin, the tables'
owner, reads A's rows before and after). A's own work is unaffected.

Needs a server (conftest's POSTGRES_URL): skipped when unreachable, a failure under CI=true.
"""

from __future__ import annotations

import secrets
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

import pytest

from .conftest import POSTGRES_URL, postgres_reason

if _why := postgres_reason():
    pytest.skip(_why, allow_module_level=True)

import psycopg

from agentjournal import (
    Agent,
    EventType,
    JournalError,
    ScriptedModel,
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
from agentjournal.store.postgres import PostgresStore
from agentjournal.store.tenants import (
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
    assert tables == {**dict.fromkeys(TENANT_TABLES, True), **dict.fromkeys(SHARED_TABLES, False)}
    assert _sql("SELECT relforcerowsecurity FROM pg_class WHERE relname = 'runs' AND"
                " relnamespace = %s::regnamespace", (shared.schema,)) == [(False,)]
    policies = _sql("SELECT tablename, cmd, qual FROM pg_policies WHERE schemaname = %s"
                    " ORDER BY tablename", (shared.schema,))
    assert [p[0] for p in policies] == sorted(TENANT_TABLES)
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
