"""Tenants on a shared PostgreSQL schema: one database role per tenant.

Every row of run data (``runs``, ``events``, ``snapshots``, ``queue``, ``workers``)
carries the role that wrote it in ``tenant`` (``DEFAULT current_user``), and row-level
security lets any role but the tables' owner see and change only its own rows;
``events``, ``snapshots`` and ``queue`` rows may be written only for a run whose
``runs`` row is the role's own (see the last migration in store/postgres.py). The
owner, who runs the migrations, is exempt and sees every tenant.

A tenant's role must therefore be none of: a superuser, ``BYPASSRLS``, the owner of
the tables, or a member of the owner's role (a member inheriting the owner's
privileges is exempt from row-level security like the owner). :func:`grant_tenant`
refuses such a role; :func:`create_tenant` creates a role that is none of them.

The admin (the owner) calls these with its own URL; tenants then open the store with
theirs, e.g. ``postgresql://tenant_a@db:5432/app?schema=agentjournal``. Opening an
up-to-date schema runs no DDL, so a tenant needs only what :func:`grant_tenant`
gives. A later release's migration is run by the admin first (opening the store with
the admin's URL), then :func:`grant_tenant` again for each tenant (new tables, columns).

A tenant cannot stall the others by locking the tables every write uses: it holds no
table-wide UPDATE, DELETE or TRUNCATE on ``runs``, ``events`` or ``queue`` (UPDATE is
granted column by column), which ``LOCK TABLE`` needs; the locks it can still take are
bounded by the store's ``lock_timeout`` (docs/tenants.md). Its workers wait on a
``LISTEN`` channel of its own, named at random in ``tenant_channels`` (which row-level
security lets only it and the admin read), so no tenant hears another's submits.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import psycopg
from psycopg import sql

from ..errors import JournalError, StoreLockedError
from . import mask_secrets
from .postgres import DEFAULT_LOCK_TIMEOUT, DEFAULT_SCHEMA, PostgresStore, lock_timeout_of

#: Tables whose rows belong to a tenant: read and written under row-level security.
TENANT_TABLES = ("runs", "events", "snapshots", "segments", "queue", "workers", "views")
#: Tables every tenant reads and none writes.
SHARED_TABLES = ("quarantine", "schema_version")
#: What a tenant may do to each table of run data, no more: ``LOCK TABLE`` in any mode
#: that blocks another tenant's writes needs UPDATE, DELETE or TRUNCATE on the whole
#: table, so UPDATE is granted column by column (``tenant`` excepted) and DELETE only
#: where a tenant prunes its own rows. The log itself is append-only to a tenant, and
#: archiving a run (gc, which deletes its events) is the admin's.
TABLE_PRIVILEGES = {"runs": "SELECT, INSERT", "events": "SELECT, INSERT",
                    "snapshots": "SELECT, INSERT, DELETE", "segments": "SELECT, INSERT, DELETE",
                    "queue": "SELECT, INSERT", "workers": "SELECT, INSERT, DELETE",
                    "views": "SELECT, INSERT"}
#: Tables a tenant updates (every column but ``tenant``).
UPDATED_TABLES = ("runs", "snapshots", "segments", "queue", "workers", "views")
#: Each tenant's notification channel: a random name only the tenant and the admin read.
CHANNELS_TABLE = "tenant_channels"


class TenantRoleError(JournalError, ValueError):
    """A role that cannot be a tenant (it would see every tenant's runs), or is unknown."""

    def __init__(self, role: str, reason: str) -> None:
        super().__init__(f"role {role!r} cannot be a tenant: {reason}")
        self.role = role
        self.reason = reason


@dataclass(frozen=True)
class TenantInfo:
    """A tenant of a schema: a role granted access to it, or one owning rows in it."""

    role: str
    granted: bool  # holds USAGE on the schema (revoked or dropped roles may own rows)
    can_login: bool
    runs: int  # runs with at least one event
    queued: int  # queue entries not done


def _admin_store(admin_url: str, schema: str | None) -> PostgresStore:
    """The store as its owner opens it: migrated to this release's version."""
    parts = urlsplit(admin_url)
    query = parse_qs(parts.query, keep_blank_values=True)
    named = query.pop("schema", [DEFAULT_SCHEMA])[-1]
    waits = query.pop("lock_timeout", None)
    timeout = DEFAULT_LOCK_TIMEOUT if waits is None else lock_timeout_of(
        mask_secrets(admin_url), waits[-1])
    conninfo = parts._replace(scheme="postgresql", query=urlencode(query, doseq=True)).geturl()
    return PostgresStore(conninfo, schema=schema or named, pool_size=1, lock_timeout=timeout)


@contextmanager
def _admin_conn(store: PostgresStore) -> Iterator[psycopg.Connection[tuple[Any, ...]]]:
    """A connection of the admin's that waits for a lock no longer than the store's calls."""
    with psycopg.connect(store.dsn) as conn:
        conn.execute("SELECT set_config('lock_timeout', %s, false)",
                     (f"{round(store.lock_timeout * 1000)}ms",))
        try:
            yield conn
        except psycopg.errors.LockNotAvailable:
            raise StoreLockedError(store.url, "granting or revoking a tenant needed a lock that",
                                   store.lock_timeout) from None


# UPDATE on every column of a table but ``tenant``, as the columns are when it runs.
_GRANT_COLUMNS = """DO $aj_grant$ DECLARE t text; BEGIN
    FOREACH t IN ARRAY {tables}::text[] LOOP
        EXECUTE format('GRANT UPDATE (%s) ON %I.%I TO %I', (
            SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum) FROM pg_attribute
            WHERE attrelid = format('%I.%I', {schema}, t)::regclass AND attnum > 0
            AND NOT attisdropped AND attname <> 'tenant'), {schema}, t, {role});
    END LOOP;
END $aj_grant$"""

# The channels table, made by the first grant (a tenant's row: its own, as elsewhere), and
# this role's channel: random, so no other tenant can name it to LISTEN (which needs no
# privilege). It stays the same across grants, so running workers keep hearing it.
_CHANNEL = """DO $aj_channels$ BEGIN
    IF to_regclass({table}) IS NULL THEN
        CREATE TABLE {s}.{t} (tenant text PRIMARY KEY, channel text NOT NULL UNIQUE);
        ALTER TABLE {s}.{t} ENABLE ROW LEVEL SECURITY;
        CREATE POLICY tenant ON {s}.{t} USING (tenant = current_user);
    END IF;
END $aj_channels$;
INSERT INTO {s}.{t} VALUES ({role}, 'aj_' || replace(gen_random_uuid()::text, '-', ''))
    ON CONFLICT (tenant) DO NOTHING;
GRANT SELECT ON {s}.{t} TO {r}"""


def grant_sql(schema: str, role: str) -> sql.Composed:
    """The statements that let ``role`` work as a tenant of ``schema`` (for a script).
    Idempotent; they first take back what an older release granted (whole-table UPDATE
    and DELETE, with which a tenant could lock every other tenant out)."""
    s, r = sql.Identifier(schema), sql.Identifier(role)

    def tables(names: tuple[str, ...]) -> sql.Composable:
        return sql.SQL(", ").join(sql.Identifier(schema, t) for t in names)

    by_privileges: dict[str, tuple[str, ...]] = {}
    for table, privileges in TABLE_PRIVILEGES.items():
        by_privileges[privileges] = (*by_privileges.get(privileges, ()), table)
    return sql.SQL("; ").join([
        sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(s, r),
        sql.SQL("REVOKE ALL ON {} FROM {}").format(tables(TENANT_TABLES), r),
        *(sql.SQL("GRANT {} ON {} TO {}").format(sql.SQL(privileges), tables(names), r)
          for privileges, names in by_privileges.items()),
        sql.SQL(_GRANT_COLUMNS).format(tables=sql.Literal(list(UPDATED_TABLES)),
                                       schema=sql.Literal(schema), role=sql.Literal(role)),
        sql.SQL("GRANT SELECT ON {} TO {}").format(tables(SHARED_TABLES), r),
        sql.SQL(_CHANNEL).format(table=sql.Literal(f'"{schema}".{CHANNELS_TABLE}'), s=s,
                                 t=sql.Identifier(CHANNELS_TABLE), role=sql.Literal(role), r=r),
    ])


def _check_role(conn: psycopg.Connection[tuple[object, ...]], schema: str, role: str) -> None:
    row = conn.execute(
        "SELECT r.rolsuper, r.rolbypassrls,"
        " coalesce(bool_or(pg_has_role(r.oid, c.relowner, 'USAGE')), false)"
        " FROM pg_roles r LEFT JOIN pg_class c ON c.relnamespace ="
        " (SELECT oid FROM pg_namespace WHERE nspname = %s) AND c.relkind = 'r'"
        " WHERE r.rolname = %s GROUP BY r.rolsuper, r.rolbypassrls",
        (schema, role)).fetchone()
    if row is None:
        raise TenantRoleError(role, "no such role (create_tenant creates one)")
    superuser, bypass, owner = row
    if superuser:
        raise TenantRoleError(role, "it is a superuser, which row-level security never limits")
    if bypass:
        raise TenantRoleError(role, "it has BYPASSRLS; ALTER ROLE ... NOBYPASSRLS first")
    if owner:
        raise TenantRoleError(role, f"it owns the tables of schema {schema!r} or has the "
                              "privileges of their owner, who sees every tenant's rows")


def grant_tenant(admin_url: str, schema: str | None, role: str) -> None:
    """Let the existing ``role`` use the store at ``admin_url`` as a tenant: USAGE on the
    schema, what :data:`TABLE_PRIVILEGES` and :data:`UPDATED_TABLES` say on the tenant
    tables (row-level security limits it to its own rows), SELECT on ``quarantine`` and
    ``schema_version``, and a notification channel of its own.

    ``admin_url`` is a store URL of the tables' owner; ``schema`` overrides its
    ``?schema=`` (None: the URL's, or the default). The schema is created and migrated
    first if needed. Refuses (TenantRoleError) a role row-level security would not
    limit. Idempotent; run it again after an upgrade's migration."""
    with _admin_store(admin_url, schema) as store, _admin_conn(store) as conn:
        _check_role(conn, store.schema, role)
        conn.execute(grant_sql(store.schema, role))
        conn.commit()


def create_tenant(admin_url: str, schema: str | None, role: str, *,
                  password: str | None = None) -> None:
    """Create ``role`` as a login role that can be a tenant (not superuser, no BYPASSRLS,
    no CREATEDB or CREATEROLE, a member of nothing) if it does not exist, then
    :func:`grant_tenant` it. The admin needs CREATEROLE (or is a superuser)."""
    with _admin_store(admin_url, schema) as store, _admin_conn(store) as conn:
        exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
        if exists is None:
            create = sql.SQL("CREATE ROLE {} LOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB"
                             " NOCREATEROLE NOREPLICATION").format(sql.Identifier(role))
            if password is not None:
                create += sql.SQL(" PASSWORD {}").format(sql.Literal(password))
            conn.execute(create)
        _check_role(conn, store.schema, role)
        conn.execute(grant_sql(store.schema, role))
        conn.commit()


def revoke_tenant(admin_url: str, schema: str | None, role: str) -> None:
    """Take back what :func:`grant_tenant` gave ``role``; its rows stay (the owner sees
    them). Dropping the role afterwards is the admin's choice (``DROP ROLE``)."""
    with _admin_store(admin_url, schema) as store, _admin_conn(store) as conn:
        s, r = sql.Identifier(store.schema), sql.Identifier(role)
        tables = sql.SQL(", ").join(sql.Identifier(store.schema, t)
                                    for t in TENANT_TABLES + SHARED_TABLES)
        conn.execute(sql.SQL("REVOKE ALL ON {} FROM {}").format(tables, r))
        channels = sql.Identifier(store.schema, CHANNELS_TABLE)
        found = conn.execute("SELECT to_regclass(%s)", (channels.as_string(conn),)).fetchone()
        if found != (None,):  # its channel goes with its grants
            conn.execute(sql.SQL("REVOKE ALL ON {} FROM {}").format(channels, r))
            conn.execute(sql.SQL("DELETE FROM {} WHERE tenant = %s").format(channels), (role,))
        conn.execute(sql.SQL("REVOKE ALL ON SCHEMA {} FROM {}").format(s, r))
        conn.commit()


def list_tenants(admin_url: str, schema: str | None = None) -> list[TenantInfo]:
    """The tenants of the schema, by role name: every role granted USAGE on it (but the
    owner) and every role owning rows in it (the owner included, if it ran any runs)."""
    with _admin_store(admin_url, schema) as store, _admin_conn(store) as conn:
        rows = conn.execute(sql.SQL(
            "WITH granted AS ("
            "  SELECT DISTINCT a.grantee AS oid FROM pg_namespace n,"
            "  aclexplode(n.nspacl) a WHERE n.nspname = %(schema)s"
            "  AND a.privilege_type = 'USAGE' AND a.grantee <> n.nspowner),"
            " names AS ("
            "  SELECT rolname AS role FROM pg_roles WHERE oid IN (SELECT oid FROM granted)"
            "  UNION SELECT tenant FROM {s}.runs UNION SELECT tenant FROM {s}.queue)"
            " SELECT names.role,"
            "  coalesce(r.oid IN (SELECT oid FROM granted), false), coalesce(r.rolcanlogin, false),"
            "  (SELECT count(*) FROM {s}.runs x WHERE x.tenant = names.role AND x.last_seq > 0),"
            "  (SELECT count(*) FROM {s}.queue q WHERE q.tenant = names.role"
            "   AND q.state <> 'done')"
            " FROM names LEFT JOIN pg_roles r ON r.rolname = names.role ORDER BY names.role"
        ).format(s=sql.Identifier(store.schema)), {"schema": store.schema}).fetchall()
    return [TenantInfo(role=str(r[0]), granted=bool(r[1]), can_login=bool(r[2]),
                       runs=int(r[3]), queued=int(r[4])) for r in rows]
