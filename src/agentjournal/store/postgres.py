"""Shared and multi-host: one PostgreSQL schema holding ``events`` and ``runs``.

``runs`` has one row per run: where its log ends and its lease. Every write
first locks that row (``SELECT ... FOR UPDATE``) and only then checks
``expected_seq`` and the lease epoch, so writers to one run serialize on it
while writers to different runs never wait for each other; ``PRIMARY KEY
(run_id, seq)`` on ``events`` enforces uniqueness underneath. Bodies are the
exact bytes of :func:`~agentjournal.events.encode` in ``bytea`` (``jsonb``
would reorder keys and refuse ``\\u0000``), so reads are byte-identical.

Each event's digest chains from the one before it, so an append must know the
digest the log ends with. ``runs.last_digest`` holds it, moved by the same
statement that moves ``last_seq``; a handle remembers each run's end (from its
own appends, and from reads that reach the end), so a warm append is still one
statement and a commit. That memory is only a guess the claim checks
(``last_digest = prev`` in its WHERE): a stale one costs a round trip, never a
broken chain.

Snapshots (a cache beside the log) are rows of ``snapshots``, body and
metadata together, so one transaction publishes one whole; ``quarantine``
lists fold versions whose snapshots must never be loaded.

Lease times come from the server's clock, so workers on hosts with skewed
clocks agree on when a lease expires.

Durability: ``FSYNC`` acknowledges an append once its commit is flushed
(synchronous_commit as configured on the server, on by default). ``BATCHED``
sets ``synchronous_commit = off`` for appends only: a server crash or power
cut may lose the most recent acknowledged appends (up to about three
``wal_writer_delay``, 600 ms by default), always a suffix of the log, never a
hole; a client crash loses nothing acknowledged. Lease writes always commit
synchronously: a lost lease grant could hand the same epoch out twice.

A schema is ours when it has a ``schema_version`` table. Opening never migrates
into another schema's tables (``NotAStoreError``); opened ``readonly`` it creates
nothing at all (no schema, no table, no migration) and refuses every write; a
schema at a newer version than this release is ``UnsupportedVersionError``.

During an outage psycopg_pool logs its reconnection attempts as warnings to the
``psycopg.pool`` logger; a ``NullHandler`` there keeps them out of a CLI user's
stderr when the application configured no logging (they still reach any handler
it did configure), and a call waits for a connection at most ``connect_timeout``
(10 s unless the URL sets it). A ``release`` lost to a dropped connection is retried at once
on a fresh one, and else on the handle's next use and on ``close``, so a
successor does not wait out the TTL.

No statement waits for a lock longer than ``lock_timeout`` (30 s unless the URL says
``?lock_timeout=SECONDS``; 0 waits forever): another session's ``LOCK TABLE``, advisory
lock or long transaction (a tenant's: store/tenants.py) makes the call fail with
``StoreLockedError`` instead of stalling it. A session idle inside a transaction
(its process frozen between a statement and its commit) is ended by the server after
``IDLE_IN_TRANSACTION_TIMEOUT`` (5 s), releasing the locks it held, unless the URL's
``options`` or the role or database set ``idle_in_transaction_session_timeout``. An
up-to-date schema is opened without the migration lock, so a session holding that lock
can delay a migration, never an open.
"""

from __future__ import annotations

import errno
import logging
import re
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext, suppress
from dataclasses import dataclass
from functools import partial
from typing import Any, LiteralString
from urllib.parse import quote, urlencode

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.errors import UniqueViolation
from psycopg_pool import ConnectionPool

from ..errors import (
    ArchivedRunError,
    ConflictError,
    CorruptLogError,
    DurabilityError,
    FencedError,
    JournalError,
    LeaseHeldError,
    LeaseReleasedError,
    NotArchivedError,
    NotAStoreError,
    ReadOnlyStoreError,
    ScopeSharedError,
    StoreIOError,
    StoreLockedError,
    StoreUnavailableError,
    StoreUrlError,
    UnsupportedVersionError,
)
from ..events import GENESIS, Event, seal, stored_digest
from ..projections import columns
from ..projections import encode as encode_outline
from ..state import RunState
from .base import (
    Durability,
    Head,
    Lease,
    RunInfo,
    Snapshot,
    Tombstone,
    UnanchoredStoreError,
    check_batch,
    check_head,
    check_records,
    decode_record,
    records_digest,
    scope_started,
    validate_run_id,
)
from .group import GroupCommit, Grouper, Pending
from .outlined import (
    OUTLINE_VERSION,
    OutlineCache,
    Stored,
    base_outline,
    outline_after,
    project,
    served,
)

logging.getLogger("psycopg.pool").addHandler(logging.NullHandler())  # see the docstring
log = logging.getLogger("agentjournal")

DEFAULT_SCHEMA = "agentjournal"
# Postgres silently truncates identifiers past 63 bytes, which could alias two schemas.
_SCHEMA = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_CONNECT_TIMEOUT = 10  # seconds, unless the conninfo sets connect_timeout
DEFAULT_LOCK_TIMEOUT = 30.0  # seconds a statement waits for a lock, unless ?lock_timeout=
IDLE_IN_TRANSACTION_TIMEOUT = 5.0  # seconds a frozen session keeps its locks (_configure)
_MIGRATION_LOCK = 0x414A  # advisory lock key ("AJ"), paired with hashtext(schema)
_OUTLINES = 11  # the migration that added outlines
_PAGE = 1000  # events per read query: a long run is never held in memory at once
_ENDS = 4096  # runs whose log end a handle remembers (the most recently used)

# Numbered, append-only migrations; {s} is the quoted schema. The
# schema_version table records which ran.
MIGRATIONS: tuple[LiteralString, ...] = (
    """
    CREATE TABLE {s}.events (
        run_id text NOT NULL,
        seq bigint NOT NULL,
        type text NOT NULL,
        ts timestamptz NOT NULL,
        body bytea NOT NULL,
        PRIMARY KEY (run_id, seq)
    );
    CREATE TABLE {s}.runs (
        run_id text PRIMARY KEY,
        last_seq bigint NOT NULL,
        lease_owner text,
        lease_epoch bigint NOT NULL DEFAULT 0,
        lease_expires_at timestamptz,
        created_at timestamptz,
        updated_at timestamptz
    );
    """,
    """
    CREATE TABLE {s}.snapshots (
        run_id text NOT NULL,
        seq bigint NOT NULL,
        fold_version integer NOT NULL,
        schema_version integer NOT NULL,
        digest text NOT NULL,
        body bytea NOT NULL,
        created_at timestamptz NOT NULL,
        PRIMARY KEY (run_id, seq, fold_version)
    );
    CREATE TABLE {s}.quarantine (
        fold_version integer PRIMARY KEY,
        reason text NOT NULL,
        at timestamptz NOT NULL DEFAULT now()
    );
    """,
    """
    ALTER TABLE {s}.runs ADD COLUMN scope text;
    UPDATE {s}.runs r SET scope = coalesce(convert_from(e.body, 'UTF8')::jsonb
        #>> '{{payload,scope}}', 'run:' || r.run_id)
        FROM {s}.events e WHERE e.run_id = r.run_id AND e.seq = 1;
    CREATE INDEX runs_scope ON {s}.runs (scope) WHERE scope IS NOT NULL;
    """,
    # The digest of each run's last event: a sealed record starts {"digest":"<32 hex>"
    # (events.seal); one written before v4 has none, and the next event chains from ''.
    """
    ALTER TABLE {s}.runs ADD COLUMN last_digest text NOT NULL DEFAULT '';
    UPDATE {s}.runs r SET last_digest = encode(substring(e.body FROM 12 FOR 32), 'escape')
        FROM {s}.events e WHERE e.run_id = r.run_id AND e.seq = r.last_seq
        AND substring(e.body FOR 11) = convert_to('{{"digest":"', 'UTF8')
        AND substring(e.body FROM 44 FOR 1) = convert_to('"', 'UTF8');
    """,
    # The queue of runs and the workers draining it (fleet/): see fleet/queue.py.
    """
    CREATE TABLE {s}.queue (
        run_id text PRIMARY KEY,
        queue text NOT NULL,
        priority integer NOT NULL,
        agent text NOT NULL,
        task text NOT NULL,
        state text NOT NULL,
        worker text,
        parked_seq bigint NOT NULL DEFAULT 0,
        claims integer NOT NULL DEFAULT 0,
        crashes integer NOT NULL DEFAULT 0,
        submitted_at timestamptz NOT NULL DEFAULT now(),
        changed_at timestamptz NOT NULL DEFAULT now()
    );
    CREATE INDEX queue_open ON {s}.queue (queue, priority DESC, submitted_at)
        WHERE state <> 'done';
    CREATE TABLE {s}.workers (
        worker_id text PRIMARY KEY,
        info jsonb NOT NULL,
        heartbeat_at timestamptz NOT NULL
    );
    """,
    # Tenants on a shared schema (store/tenants.py, docs/tenants.md): each row of run data
    # belongs to the role that wrote it (existing rows: the role migrating, the owner).
    # Row-level security, not forced, so the owner still sees everything: another role
    # sees and changes only its own rows, and writes events, snapshots and queue entries
    # only for a run whose ``runs`` row is its own (run ids stay unique across tenants).
    """
    ALTER TABLE {s}.runs ADD COLUMN tenant text NOT NULL DEFAULT current_user;
    ALTER TABLE {s}.events ADD COLUMN tenant text NOT NULL DEFAULT current_user;
    ALTER TABLE {s}.snapshots ADD COLUMN tenant text NOT NULL DEFAULT current_user;
    ALTER TABLE {s}.queue ADD COLUMN tenant text NOT NULL DEFAULT current_user;
    ALTER TABLE {s}.workers ADD COLUMN tenant text NOT NULL DEFAULT current_user;
    CREATE INDEX runs_tenant ON {s}.runs (tenant);  -- never updated: appends stay HOT
    CREATE INDEX queue_tenant_open ON {s}.queue (tenant, queue, priority DESC, submitted_at)
        WHERE state <> 'done';
    ALTER TABLE {s}.runs ENABLE ROW LEVEL SECURITY;
    ALTER TABLE {s}.events ENABLE ROW LEVEL SECURITY;
    ALTER TABLE {s}.snapshots ENABLE ROW LEVEL SECURITY;
    ALTER TABLE {s}.queue ENABLE ROW LEVEL SECURITY;
    ALTER TABLE {s}.workers ENABLE ROW LEVEL SECURITY;
    CREATE POLICY tenant ON {s}.runs
        USING (tenant = current_user) WITH CHECK (tenant = current_user);
    CREATE POLICY tenant ON {s}.workers
        USING (tenant = current_user) WITH CHECK (tenant = current_user);
    CREATE POLICY tenant ON {s}.events USING (tenant = current_user)
        WITH CHECK (tenant = current_user
                    AND EXISTS (SELECT 1 FROM {s}.runs r WHERE r.run_id = events.run_id));
    CREATE POLICY tenant ON {s}.snapshots USING (tenant = current_user)
        WITH CHECK (tenant = current_user
                    AND EXISTS (SELECT 1 FROM {s}.runs r WHERE r.run_id = snapshots.run_id));
    CREATE POLICY tenant ON {s}.queue USING (tenant = current_user)
        WITH CHECK (tenant = current_user
                    AND EXISTS (SELECT 1 FROM {s}.runs r WHERE r.run_id = queue.run_id));
    """,
    # Runs archived and deleted by gc (retention.py): the runs row stays as the tombstone
    # (base.Tombstone), with last_seq 0 and where the log went; no append claims it.
    """
    ALTER TABLE {s}.runs ADD COLUMN archived_to text;
    ALTER TABLE {s}.runs ADD COLUMN archived_seq bigint;
    ALTER TABLE {s}.runs ADD COLUMN archived_digest text;
    ALTER TABLE {s}.runs ADD COLUMN archived_at timestamptz;
    """,
    # The parts snapshots refer to by digest (snapshots.py), so each is written once;
    # a tenant's own, as its snapshots are.
    """
    CREATE TABLE {s}.segments (
        run_id text NOT NULL,
        digest text NOT NULL,
        body bytea NOT NULL,
        tenant text NOT NULL DEFAULT current_user,
        PRIMARY KEY (run_id, digest)
    );
    ALTER TABLE {s}.segments ENABLE ROW LEVEL SECURITY;
    CREATE POLICY tenant ON {s}.segments USING (tenant = current_user)
        WITH CHECK (tenant = current_user
                    AND EXISTS (SELECT 1 FROM {s}.runs r WHERE r.run_id = segments.run_id));
    -- Roles that write snapshots (tenants granted before this table) write segments too.
    DO $$ DECLARE r record; BEGIN
        FOR r IN SELECT rolname FROM pg_roles WHERE rolname <> current_user AND NOT rolsuper
                 AND has_table_privilege(oid, '{s}.snapshots', 'INSERT') LOOP
            EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON {s}.segments TO %I',
                           r.rolname);
        END LOOP;
    END $$;
    """,
    # Why a worker parked a run (a refused agent ref, a poison run): see fleet/queue.py.
    """
    ALTER TABLE {s}.queue ADD COLUMN IF NOT EXISTS reason text;
    """,
    # The version a run is pinned to (submit --pin-version): see fleet/queue.py.
    """
    ALTER TABLE {s}.queue ADD COLUMN IF NOT EXISTS pin_version text;
    """,
    # Each run's outline (projections.py), set by the statement that appends; filled from
    # the logs when a writer first opens an older schema (PostgresStore._project). And
    # per-run views: caches a reader of one kind of run keeps beside its log.
    """
    ALTER TABLE {s}.runs ADD COLUMN IF NOT EXISTS outline bytea;
    ALTER TABLE {s}.runs ADD COLUMN IF NOT EXISTS outline_seq bigint;
    ALTER TABLE {s}.runs ADD COLUMN IF NOT EXISTS outline_version integer;
    ALTER TABLE {s}.runs ADD COLUMN IF NOT EXISTS status text;
    ALTER TABLE {s}.runs ADD COLUMN IF NOT EXISTS agent text;
    ALTER TABLE {s}.runs ADD COLUMN IF NOT EXISTS attention boolean NOT NULL DEFAULT false;
    CREATE INDEX IF NOT EXISTS runs_attention ON {s}.runs (run_id) WHERE attention;
    CREATE TABLE IF NOT EXISTS {s}.views (
        run_id text NOT NULL,
        name text NOT NULL,
        seq bigint NOT NULL,
        body bytea NOT NULL,
        tenant text NOT NULL DEFAULT current_user,
        PRIMARY KEY (run_id, name)
    );
    ALTER TABLE {s}.views ENABLE ROW LEVEL SECURITY;
    DROP POLICY IF EXISTS tenant ON {s}.views;
    CREATE POLICY tenant ON {s}.views USING (tenant = current_user)
        WITH CHECK (tenant = current_user
                    AND EXISTS (SELECT 1 FROM {s}.runs r WHERE r.run_id = views.run_id));
    """,
)

def _param(name: str) -> str:
    """A statement's parameter ``name``."""
    return f"%({name})s"


def _others_in_scope(value: Callable[[str], str]) -> str:
    """Another run of scope ``alone_in`` with events (an append ``alone_in`` it is
    refused); ``value`` as for _claim_update."""
    return (f"SELECT 1 FROM {{s}}.runs o WHERE o.scope = {value('alone_in')}::text"
            f" AND o.run_id <> {value('run')} AND o.last_seq > 0")


_SHARED = _others_in_scope(_param)


def _claim_update(value: Callable[[str], str], source: str = "") -> str:
    """The UPDATE that claims an append: it moves the run's end, and its WHERE is the
    whole check (the expected end, the lease's epoch, the digest the batch was sealed
    from, not archived, and, for an append ``alone_in`` a scope, no other run of it with
    events). ``value(name)``: the SQL of the claim's value ``name``, a parameter or a
    column of ``source`` (the group's claims), which the UPDATE reads FROM."""
    return (
        f"UPDATE {{s}}.runs r SET last_seq = {value('last')}, last_digest = {value('digest')},"
        f" outline = {value('outline')}::bytea, outline_seq = {value('outline_seq')}::int8,"
        f" outline_version = {OUTLINE_VERSION}, status = {value('status')}::text,"
        f" agent = {value('agent')}::text, attention = {value('attention')}::bool,"
        f" scope = coalesce({value('scope')}::text, r.scope),"
        f" created_at = least(r.created_at, {value('first_ts')}),"
        f" updated_at = greatest(r.updated_at, {value('last_ts')})"
        + (f" FROM {source}" if source else "") +
        f" WHERE r.run_id = {value('run')} AND r.last_seq = {value('expected')}"
        f" AND r.lease_epoch = {value('epoch')} AND r.last_digest = {value('prev')}"
        f" AND r.archived_to IS NULL AND ({value('alone_in')}::text IS NULL"
        f" OR NOT EXISTS ({_others_in_scope(value)}))")


# An append's one statement: claim (see _claim_update) and, only if that claimed the
# row, insert the events. {rows}: one event's values as scalars (a third cheaper than
# arrays, and most appends are one event), or arrays.
_CLAIM = (
    "WITH claimed AS (" + _claim_update(_param) + " RETURNING r.run_id),"
    " added AS (INSERT INTO {s}.events {rows} WHERE EXISTS (SELECT 1 FROM claimed))"
    " SELECT count(*) FROM claimed"
)
# A group's claims in one statement: the runs' rows locked in run id order (as
# renew_all locks them), each claim checked by its own WHERE as in _CLAIM, and the
# events of the claimed ones inserted; the claimed ones' places in the group. (Two
# claims of one run: the row is updated by one, and only its events go in.) The arrays
# go in binary: psycopg dumps a text array element by element in Python, escaping each:
# twenty times slower for bytea and timestamps.
_CLAIM_GROUP = (
    "WITH c AS (SELECT * FROM unnest(%(run)b::text[], %(expected)b::int8[],"
    " %(epoch)b::int8[], %(last)b::int8[], %(prev)b::text[], %(digest)b::text[],"
    " %(scope)b::text[], %(first_ts)b::timestamptz[], %(last_ts)b::timestamptz[],"
    " %(alone_in)b::text[], %(outline)b::bytea[], %(outline_seq)b::int8[],"
    " %(status)b::text[], %(agent)b::text[], %(attention)b::bool[])"
    " WITH ORDINALITY AS c(run, expected, epoch, last, prev, digest, scope, first_ts,"
    " last_ts, alone_in, outline, outline_seq, status, agent, attention, i)),"
    " locked AS MATERIALIZED (SELECT r.run_id FROM {s}.runs r"
    " WHERE r.run_id = ANY(%(run)b::text[]) ORDER BY r.run_id FOR UPDATE),"
    " claimed AS (" + _claim_update(lambda name: f"c.{name}", "c") +
    " AND r.run_id IN (SELECT run_id FROM locked) RETURNING c.i),"
    " added AS (INSERT INTO {s}.events SELECT e.run_id, e.seq, e.type, e.ts, e.body"
    " FROM unnest(%(of_claim)b::int8[], %(event_run)b::text[], %(seq)b::int8[],"
    " %(type)b::text[], %(ts)b::timestamptz[], %(body)b::bytea[])"
    " AS e(i, run_id, seq, type, ts, body) WHERE e.i IN (SELECT i FROM claimed))"
    " SELECT array_agg(i) FROM claimed"
)
#: The parameters of an append's claim that _CLAIM_GROUP takes, one array each.
_GROUPED = ("run", "expected", "epoch", "last", "prev", "digest", "scope", "first_ts",
            "last_ts", "alone_in", "outline", "outline_seq", "status", "agent", "attention")
_ONE_ROW = "SELECT %(run)s, %(last)s, %(type)s, %(last_ts)s, %(body)s"
_ROWS = ("SELECT * FROM unnest(%(runs)s::text[], %(seqs)s::bigint[], %(types)s::text[],"
         " %(stamps)s::timestamptz[], %(bodies)s::bytea[])")
#: Batches of up to this many events are sent as rows of plain parameters, not arrays:
#: psycopg dumps an array in Python, element by element, a scalar in C.
_VALUES_MAX = 8
#: A claim whose records are larger than this commits on its own, never in a group's
#: pipeline: a 10 MB claim pipelined with its COMMIT now and then never got its answer
#: on a loaded machine (psycopg waiting in commit for 300 s; never unpipelined), and a
#: pipeline saves nothing where the transfer is the cost.
_PIPELINE_BYTES = 1 << 20


def _outline_params(state: RunState | None, body: bytes) -> dict[str, Any]:
    """The claim's outline columns (all NULL for a log that does not fold: a read's fold
    of it says what is wrong)."""
    if state is None:
        return {"outline": None, "outline_seq": None, "status": None, "agent": None,
                "attention": False}
    return {"outline": body, "outline_seq": state.last_seq, **columns(state)}


def _values(n: int) -> str:
    """The rows of an ``n``-event batch as a VALUES list of plain parameters."""
    return "SELECT * FROM (VALUES " + ", ".join(
        f"(%(run)s, %(seq{i})s::bigint, %(type{i})s, %(ts{i})s::timestamptz,"
        f" %(body{i})s::bytea)" for i in range(n)) + ") rows"


@dataclass(slots=True)
class _Claim:
    """A warm append waiting for its group: the claim's parameters and sealed bodies."""

    run_id: str
    params: dict[str, Any]
    events: Sequence[Event]
    bodies: list[bytes]


def _group_params(claims: list[_Claim]) -> dict[str, list[Any]]:
    """The parameters of _CLAIM_GROUP: an array per parameter of the claims, and per
    column of their events (each with its claim's place in the group, from 1)."""
    params = {key: [one.params[key] for one in claims] for key in _GROUPED}
    rows = [(i, e, body) for i, one in enumerate(claims, 1)
            for e, body in zip(one.events, one.bodies, strict=True)]
    params.update(of_claim=[i for i, _, _ in rows], event_run=[e.run_id for _, e, _ in rows],
                  seq=[e.seq for _, e, _ in rows], type=[e.type.value for _, e, _ in rows],
                  ts=[e.ts for _, e, _ in rows], body=[body for _, _, body in rows])
    return params


# A run's row as the lease and the log's end need it (see PostgresStore._lock_run).
_ROW: LiteralString = (
    "r.last_seq, r.lease_epoch, r.lease_owner,"
    " coalesce(extract(epoch FROM r.lease_expires_at), 0)::float8,"
    " extract(epoch FROM clock_timestamp())::float8, r.last_digest, r.archived_to,"
    " r.archived_seq")
_LOCK_ONE: LiteralString = (
    "INSERT INTO {s}.runs AS r (run_id, last_seq) VALUES (%s, 0)"
    " ON CONFLICT (run_id) DO UPDATE SET run_id = r.run_id RETURNING " + _ROW)
# Many runs' rows, locked in run id order (as every write of several rows locks them).
_LOCK_RUNS: LiteralString = (
    "INSERT INTO {s}.runs AS r (run_id, last_seq)"
    " SELECT id, 0 FROM unnest(%s::text[]) AS u(id) ORDER BY id"
    " ON CONFLICT (run_id) DO UPDATE SET run_id = r.run_id RETURNING r.run_id, " + _ROW)
_SET_EXPIRIES: LiteralString = (
    "UPDATE {s}.runs r SET lease_owner = g.owner, lease_epoch = g.epoch,"
    " lease_expires_at = clock_timestamp() + make_interval(secs => g.ttl)"
    " FROM unnest(%s::text[], %s::text[], %s::bigint[], %s::float8[])"
    " AS g(run_id, owner, epoch, ttl) WHERE r.run_id = g.run_id")
# Leases released: each only at its epoch (a newer lease of the run is never touched),
# the rows locked in run id order (see renew_all).
_RELEASE: LiteralString = (
    "WITH g AS (SELECT * FROM unnest(%s::text[], %s::bigint[]) AS g(run_id, epoch)),"
    " mine AS MATERIALIZED (SELECT r.run_id FROM {s}.runs r JOIN g"
    " ON r.run_id = g.run_id AND r.lease_epoch = g.epoch ORDER BY r.run_id FOR UPDATE OF r)"
    " UPDATE {s}.runs r SET lease_expires_at = to_timestamp(0) FROM g"
    " WHERE r.run_id = g.run_id AND r.lease_epoch = g.epoch"
    " AND r.run_id IN (SELECT run_id FROM mine)")


def _granted(run_id: str, owner: str, ttl: float, row: tuple[Any, ...]) -> Lease | JournalError:
    """The lease on ``run_id`` for ``owner``, given its row as read locked (see
    ``_LOCK_RUNS``), or LeaseHeldError if another holds it."""
    last, current, holder, expires, now, _, archived_to, _ = row
    if holder is None or current == 0:
        epoch = 1
    elif holder == owner and expires > now:
        epoch = current  # the holder re-acquiring: a renewal
    elif expires > now:
        return LeaseHeldError(run_id, holder, current, expires - now)
    else:
        epoch = current + 1  # takeover of an expired or released lease
    return Lease(run_id, owner, epoch, now + ttl,
                 last_seq=int(last) if archived_to is None else None)


def _settle_each(group: list[Pending], fn: Callable[[Any], Any]) -> None:
    """``fn`` of each pending item on its own: its result, or its error."""
    for pending in group:
        try:
            pending.result, pending.error = fn(pending.item), None
        except JournalError as exc:
            pending.result, pending.error = None, exc


Conn = psycopg.Connection[tuple[Any, ...]]
Cursor = psycopg.Cursor[tuple[Any, ...]]


def _tombstone(row: tuple[Any, ...]) -> Tombstone:
    return Tombstone(run_id=row[0], last_seq=row[1], digest=row[2], archive=row[3],
                     deleted_at=row[4])


def _public_url(params: dict[str, Any], schema: str) -> str:
    """The connection as a ``postgresql://`` URL open_store accepts, minus any secret."""
    p = {k: str(v) for k, v in params.items() if "password" not in k}
    user, host, port, db = (p.pop(k, "") for k in ("user", "host", "port", "dbname"))
    if schema != DEFAULT_SCHEMA:
        p["schema"] = schema
    netloc = (quote(user, safe="") + "@" if user else "") + quote(host, safe=",")
    netloc += f":{port}" if port else ""
    query = urlencode(p)
    return f"postgresql://{netloc}/{quote(db, safe='')}" + (f"?{query}" if query else "")


def _oneline(exc: BaseException) -> str:
    from . import mask_secrets  # (the package imports this module lazily)

    return mask_secrets(" ".join(str(exc).split()))  # libpq's messages span lines


def lock_timeout_of(url: str, text: str) -> float:
    """The seconds of a ``?lock_timeout=`` parameter (0: wait forever); StoreUrlError if
    it is not a number of seconds."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds < 86400:
        raise StoreUrlError(url, f"lock_timeout={text!r} is not a number of seconds "
                            "(0 waits forever)")
    return seconds


def _set_lock_timeout(conn: Conn, seconds: float) -> None:
    conn.execute("SELECT set_config('lock_timeout', %s, false)", (f"{round(seconds * 1000)}ms",))


def _configure(conn: Conn, *, lock_timeout: float, readonly: bool) -> None:
    # RunInfo datetimes come back in UTC, as from the other backends.
    conn.execute("SET TIME ZONE 'UTC'")
    _set_lock_timeout(conn, lock_timeout)
    # A process frozen between a statement and its COMMIT (SIGSTOP, a paused VM) keeps
    # its row locks: a claim skips such a run, a writer waits on it. The server ends the
    # session instead, unless the user, role or database set a bound of their own.
    conn.execute("SELECT set_config('idle_in_transaction_session_timeout', %s, false)"
                 " WHERE current_setting('idle_in_transaction_session_timeout') = '0'",
                 (f"{round(IDLE_IN_TRANSACTION_TIMEOUT * 1000)}ms",))
    if readonly:
        conn.execute("SET default_transaction_read_only = on")  # the server refuses writes too
    conn.commit()


class PostgresStore:
    def __init__(
        self,
        conninfo: str,
        *,
        schema: str = DEFAULT_SCHEMA,
        durability: Durability = Durability.FSYNC,
        pool_size: int = 4,
        readonly: bool = False,
        lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
        group_commit: GroupCommit = GroupCommit.ON,
    ) -> None:
        self.schema = schema
        # Warm appends of concurrent runs claimed in one transaction (see _commit_group).
        self.group_commit = GroupCommit(group_commit)
        off = self.group_commit is GroupCommit.OFF
        self._grouper = Grouper(self._commit_group, alone=off)
        # Leases of runs opened or closed together, likewise (a commit each, else).
        self._acquirer = Grouper(self._acquire_group, alone=off)
        self._releaser = Grouper(self._release_group, alone=off)
        self.lock_timeout = lock_timeout
        self.durability = Durability(durability)
        self.readonly = readonly
        #: Whether the schema keeps outlines (a read-only handle on an older one folds).
        self.projected = True
        self._broken: str | None = None
        self._unreleased: dict[str, Lease] = {}  # releases lost to a dropped connection
        self._ends: dict[str, tuple[int, str]] = {}  # run -> (last seq, its digest), a guess
        self._outlines = OutlineCache()  # each run's outline after this handle's append
        self._ends_lock = threading.Lock()
        # run -> its whole log and head, read ahead for its next read (see prefetch)
        self._prefetched: dict[str, tuple[list[tuple[int, bytes]], Head | None]] = {}
        try:
            params = conninfo_to_dict(conninfo)
        except (psycopg.Error, ValueError) as exc:
            detail = f"invalid connection string: {_oneline(exc)}"
            raise StoreUrlError("postgresql://", detail) from None
        self.url = _public_url(params, schema)
        if not _SCHEMA.fullmatch(schema):
            raise StoreUrlError(self.url, f"schema {schema!r} is not a plain lowercase identifier")
        self._s = sql.Identifier(schema)
        # Composed once: building and rendering SQL per append is measurable.
        self._lock_one, self._lock_runs, self._set_expiries, self._release_all = (
            sql.SQL(text).format(s=self._s).as_bytes(None)
            for text in (_LOCK_ONE, _LOCK_RUNS, _SET_EXPIRIES, _RELEASE))
        self._claim_group = sql.SQL(_CLAIM_GROUP).format(s=self._s).as_bytes(None)
        self._claim_one, self._claim_many, *self._claim_rows = (
            sql.SQL(_CLAIM).format(s=self._s, rows=sql.SQL(rows)).as_bytes(None)
            for rows in (_ONE_ROW, _ROWS, *map(_values, range(2, _VALUES_MAX + 1))))
        params.setdefault("connect_timeout", _CONNECT_TIMEOUT)
        params.setdefault("application_name", "agentjournal")
        timeout = float(str(params["connect_timeout"]))
        dsn = make_conninfo("", **params)
        self.dsn = dsn  # for a connection of its own (the queue's LISTEN)
        try:
            # A direct connection first: it fails fast with libpq's reason,
            # where the pool would retry quietly until its timeout.
            with psycopg.connect(dsn) as conn:
                _set_lock_timeout(conn, lock_timeout)
                if readonly:
                    self._check_schema(conn)
                else:
                    self._migrate(conn)
                self._sealed = self._created_sealed(conn)
        except psycopg.errors.LockNotAvailable:
            what = "opening the schema needed a lock (the migration lock, or a table) that"
            raise StoreLockedError(self.url, what, lock_timeout) from None
        except psycopg.OperationalError as exc:
            raise StoreUrlError(self.url, f"cannot connect: {_oneline(exc)}") from None
        except psycopg.Error as exc:
            detail = f"cannot set up schema {schema!r}: {_oneline(exc)}"
            raise StoreUrlError(self.url, detail) from None
        self._pool: ConnectionPool[Conn] = ConnectionPool(
            dsn,
            min_size=1,
            max_size=pool_size,
            open=False,
            configure=partial(_configure, lock_timeout=lock_timeout, readonly=readonly),
            # A call waits for a connection no longer than connecting may take (not the
            # pool's 30 s): during an outage each call fails in connect_timeout.
            timeout=timeout,
            # No check per checkout (a round trip per append): after a server restart
            # the first call fails with StoreUnavailableError and the pool reconnects.
            name=f"agentjournal.{schema}",
        )
        try:
            self._pool.open(wait=True, timeout=timeout)
        except psycopg.Error as exc:  # PoolTimeout is an OperationalError
            self._pool.close()
            raise StoreUrlError(self.url, f"cannot connect: {_oneline(exc)}") from None
        if not readonly and len(MIGRATIONS) >= _OUTLINES:  # (not a test's older schema)
            self._project()

    def _q(self, text: LiteralString) -> sql.Composed:
        return sql.SQL(text).format(s=self._s)

    def _version(self, conn: Conn) -> int | None:
        """The schema's migration count; None if it does not exist; NotAStoreError if it
        holds tables but no ``schema_version`` (another program's, such as ``public``)."""
        tables = [r[0] for r in conn.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = %s AND c.relkind IN ('r', 'p', 'v', 'm', 'f')"
            " ORDER BY c.relname", (self.schema,)).fetchall()]
        exists = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (self.schema,))
        if exists.fetchone() is None:
            return None
        if "schema_version" not in tables:
            if tables:
                raise NotAStoreError(self.url, f"schema {self.schema!r} holds other tables "
                                     f"({', '.join(tables[:5])}) and no schema_version; "
                                     "agentjournal adds none to it. Name a schema of its own")
            return 0
        ((version,),) = conn.execute(
            self._q("SELECT coalesce(max(version), 0) FROM {s}.schema_version")).fetchall()
        if version > len(MIGRATIONS):
            raise UnsupportedVersionError(f"store {self.url}", version, len(MIGRATIONS))
        if not version and (made := [t for t in ("events", "runs") if t in tables]):
            # Migrations commit with their schema_version rows, in one transaction.
            raise UnanchoredStoreError(self.url, (
                f"its schema_version table records no migration, yet schema {self.schema!r} "
                f"holds the {' and '.join(made)} table{'s' if len(made) > 1 else ''} "
                "migration 1 makes: the store's record of its migrations was removed"))
        if version and (missing := [t for t in ("events", "runs") if t not in tables]):
            # runs holds each run's head (last_seq, last_digest): without it nothing
            # anchors a run's newest events. Damage, never "check the server".
            raise UnanchoredStoreError(self.url, (
                f"its {' and '.join(missing)} table{'s are' if len(missing) > 1 else ' is'} "
                f"missing from schema {self.schema!r} (migration 1 made it; the schema "
                f"records {version} migrations): it was dropped, and with it what each run's "
                "newest events are checked against"))
        return int(version)

    def _created_sealed(self, conn: Conn) -> bool:
        """Whether the store was created at schema v4 or later, so every record in it is
        sealed: migration 4 (``last_digest``, with sealing) ran in the transaction that
        ran migration 1 (rows of one transaction share its ``now()``)."""
        ((sealed,),) = conn.execute(self._q(
            "SELECT coalesce((SELECT applied_at FROM {s}.schema_version WHERE version = 1) ="
            " (SELECT applied_at FROM {s}.schema_version WHERE version = 4), false)"
        )).fetchall()
        conn.rollback()
        return bool(sealed)

    def _check_schema(self, conn: Conn) -> None:
        """For a read-only open: the schema must be an agentjournal store already."""
        version = self._version(conn)
        conn.rollback()  # leave no transaction open on the connection
        self.projected = (version or 0) >= _OUTLINES
        if not version:
            found = "does not exist" if version is None else "has no agentjournal tables"
            raise NotAStoreError(self.url, f"schema {self.schema!r} {found}; a store is "
                                 "created by its first run or by `agentjournal init`")

    def _migrate(self, conn: Conn) -> None:
        # Up to date (every open but an upgrade's): no DDL, so a read-only server opens
        # too, and no lock, so a session holding the migration lock stalls no open.
        if self._version(conn) == len(MIGRATIONS):
            conn.commit()
            return
        # Two processes opening a fresh schema at once would both try to create
        # it; the lock serializes them and the second finds the work done.
        conn.execute(
            "SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (_MIGRATION_LOCK, self.schema)
        )
        found = self._version(conn)
        if found == len(MIGRATIONS):
            conn.commit()
            return
        if found is None:  # else skipped: it needs CREATE on the database
            conn.execute(self._q("CREATE SCHEMA {s}"))
        conn.execute(
            self._q(
                "CREATE TABLE IF NOT EXISTS {s}.schema_version ("
                " version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
            )
        )
        ((version,),) = conn.execute(
            self._q("SELECT coalesce(max(version), 0) FROM {s}.schema_version")
        ).fetchall()
        for number, script in enumerate(MIGRATIONS[version:], start=version + 1):
            conn.execute(self._q(script))
            conn.execute(self._q("INSERT INTO {s}.schema_version (version) VALUES (%s)"), (number,))
        conn.commit()

    @contextmanager
    def _conn(self, run_id: str | None = None) -> Iterator[Conn]:
        """A pooled connection; a lost server becomes StoreUnavailableError, here only."""
        try:
            with self._pool.connection() as conn:
                yield conn
        except psycopg.errors.ReadOnlySqlTransaction as exc:  # a standby, or read-only role
            raise ReadOnlyStoreError(self.url, "write", reason="the server accepts no writes "
                                     f"({_oneline(exc)})") from exc
        except psycopg.errors.LockNotAvailable as exc:
            raise StoreLockedError(self.url, "a table, row or lock this call needs",
                                   self.lock_timeout, run_id=run_id) from exc
        except psycopg.errors.DiskFull as exc:
            raise StoreIOError(self.url, "write", OSError(errno.ENOSPC, _oneline(exc))) from exc
        except psycopg.errors.InsufficientPrivilege as exc:
            if "row-level security" in str(exc):  # a tenant's write to another's run id
                what = f"run {run_id!r}" if run_id else "this id"
                raise StoreIOError(
                    self.url, "write",
                    OSError(errno.EACCES, f"{what} belongs to another tenant of this schema"),
                    run_id=run_id, advice="Ids are unique across the tenants sharing a schema, "
                    "and a tenant writes only its own runs: choose another id") from exc
            raise StoreIOError(self.url, "use the store", OSError(errno.EACCES, _oneline(exc)),
                               advice="Grant this database role the privileges it needs on "
                               "the schema, or name another store") from exc
        except psycopg.OperationalError as exc:
            raise StoreUnavailableError(self.url, _oneline(exc)) from exc
        except (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedColumn) as exc:
            # Dropped after this handle opened (a table), or a column dropped: the runs
            # table's last_seq and last_digest are each run's head. Damage, as at open.
            raise UnanchoredStoreError(self.url, (
                f"a table or column it needs is missing ({_oneline(exc)}): it was dropped "
                "outside agentjournal, and with it, for runs.last_seq and last_digest, what "
                "each run's newest events are checked against")) from exc

    @contextmanager
    def _read(self) -> Iterator[Conn]:
        """A pooled connection for reads, each statement its own transaction: no COMMIT
        round trip after it (under READ COMMITTED a statement has its own snapshot
        either way)."""
        with self._conn() as conn:
            conn.autocommit = True
            try:
                yield conn
            finally:
                with suppress(psycopg.Error):  # a broken connection: the pool drops it
                    conn.autocommit = False

    def _writable(self, run_id: str | None) -> None:
        if self.readonly:
            raise ReadOnlyStoreError(self.url, "write", run_id=run_id)
        if self._unreleased:
            self._retry_releases()
        if self._broken:
            raise DurabilityError(self._broken, run_id=run_id)

    def _commit_failed(self, exc: psycopg.Error, run_id: str | None) -> DurabilityError:
        # The server may or may not have committed, so this is never retried into
        # success: the handle refuses writes until reopened.
        self._broken = f"commit failed: {_oneline(exc)}"
        return DurabilityError(self._broken, run_id=run_id)

    @contextmanager
    def _write(self, run_id: str | None, *, batched: bool = False,
               pipelined: bool = False) -> Iterator[Cursor]:
        """A transaction committed by :meth:`_sync`; a failed commit breaks the handle.
        ``pipelined``: the statements it reads no result of go with the COMMIT, in one
        round trip; an error the server answers there rolled it all back."""
        self._writable(run_id)
        with (self._conn(run_id) as conn, conn.cursor() as cur,
              conn.pipeline() if pipelined else nullcontext()):
            if batched:
                cur.execute("SET LOCAL synchronous_commit = off")
            yield cur  # an exception here rolls back as the pool's context exits
            try:
                self._sync(conn)
            except psycopg.Error as exc:
                if pipelined and exc.sqlstate is not None:
                    raise
                raise self._commit_failed(exc, run_id) from exc

    def _claim_alone(self, run_id: str, params: dict[str, Any], events: Sequence[Event],
                     bodies: list[bytes]) -> bool:
        """A warm append in one round trip: the claim statement as its own transaction
        (autocommit), durable once it returns (synchronous_commit is on). False if it
        claimed nothing, which changed nothing: the caller then takes the locked way.

        An error the server answered (a unique violation, a full disk) rolled the
        statement back; one it did not (a lost connection) leaves the outcome unknown,
        as a failed commit does, and breaks the handle."""
        self._writable(run_id)
        with self._conn(run_id) as conn:
            conn.autocommit = True
            try:
                # The statement is its own commit: the seam (a no-op here) comes first, so
                # a failure injected there is a commit that did not happen.
                self._sync(conn)
                with conn.cursor() as cur:
                    claimed = self._claim_and_insert(cur, params, events, bodies)
            except psycopg.Error as exc:
                if exc.sqlstate is None:
                    raise self._commit_failed(exc, run_id) from exc
                raise
            finally:
                with suppress(psycopg.Error):
                    conn.autocommit = False
        return claimed

    def _sync(self, conn: Conn) -> None:
        """The durability point (a fault-injection seam for tests)."""
        conn.commit()

    def _commit_group(self, group: list[Pending]) -> None:
        """Claim every warm append of ``group`` (each a :class:`_Claim`) in one statement
        and transaction: each one's result is whether it was claimed. Alone (unless
        ``group_commit=always``) it is one statement in autocommit, as ever, durable
        when it returns even with ``durability=batched`` (a transaction of one turning
        synchronous_commit off costs twice the CPU); a group's transaction turns it off.

        A claim refused by its WHERE changed nothing, so its neighbours commit and it
        takes the locked way after, which says why (a conflict, a fence) or appends (a
        stale guess). A statement the server refused (a unique violation) aborts the
        transaction: nothing of the group was committed, and every claim takes the locked
        way on its own. An error the server did not answer leaves the commit's outcome
        unknown: the handle breaks, and every append of the group fails with it."""
        if len(group) == 1 and self.group_commit is not GroupCommit.ALWAYS:
            one: _Claim = group[0].item
            group[0].result = self._claim_alone(one.run_id, one.params, one.events, one.bodies)
            return
        self._writable(group[0].item.run_id)
        claims: list[_Claim] = [pending.item for pending in group]
        with self._conn(None) as conn:
            try:
                with conn.pipeline():  # the claims and the commit: one round trip
                    if self.durability is Durability.BATCHED:
                        conn.execute("SET LOCAL synchronous_commit = off")
                    cur = conn.execute(self._claim_group, _group_params(claims))
                    self._sync(conn)
                claimed = set(cur.fetchone()[0] or ())  # type: ignore[index]
            except psycopg.Error as exc:
                if exc.sqlstate is None:
                    raise self._commit_failed(exc, None) from exc
                conn.rollback()
                claimed = set()  # nothing committed: each on its own
        for i, pending in enumerate(group, 1):
            pending.result = i in claimed

    def _lock_run(self, cur: Cursor, run_id: str) -> tuple[Any, ...]:
        """Lock the run's row, creating it if missing, and read it with the server's clock.

        One round trip: an upsert takes the row lock as FOR UPDATE would. Returns
        (last_seq, lease_epoch, lease_owner, lease expiry, now, last_digest, archived_to,
        archived_seq), times in epoch seconds.
        """
        cur.execute(self._lock_one, (run_id,))
        (row,) = cur.fetchall()
        return row

    # --- the log ---------------------------------------------------------------

    def append(
        self, run_id: str, events: Sequence[Event], *, expected_seq: int, epoch: int,
        alone_in: str | None = None,
    ) -> int:
        validate_run_id(run_id)
        check_batch(run_id, events, expected_seq, epoch)
        stamps = [e.ts for e in events]
        params = {
            "run": run_id, "expected": expected_seq, "epoch": epoch, "last": events[-1].seq,
            "first_ts": min(stamps), "last_ts": max(stamps), "scope": scope_started(events),
            "alone_in": alone_in,
        }
        state, outline = outline_after(partial(self._outline_at, run_id, expected_seq), events)
        params.update(_outline_params(state, outline))
        prev = self._guess_prev(run_id, expected_seq)
        try:
            # (A new run may have no row to claim yet: it takes the locked way at once,
            # unless this handle saw its row, as a lease's acquire does.)
            if prev is not None and (expected_seq or self._ends.get(run_id) == (0, GENESIS)):
                bodies, digest = seal(events, prev)
                params.update(prev=prev, digest=digest)
                if (self._claim_alone(run_id, params, events, bodies)
                        if sum(map(len, bodies)) > _PIPELINE_BYTES
                        else self._grouper.submit(_Claim(run_id, params, events, bodies))):
                    self._remember(run_id, events[-1].seq, digest)
                    self._outlines.put(run_id, events[-1].seq, outline)
                    return events[-1].seq
                prev = None  # a stale guess, a fence or a conflict: lock, and see which
            with self._write(run_id, batched=self.durability is Durability.BATCHED) as cur:
                if prev is None or alone_in is not None:  # read the row (and lock it) first
                    prev = self._checked_prev(cur, run_id, expected_seq, epoch)
                    if alone_in is not None and cur.execute(self._q(_SHARED), params).fetchone():
                        raise ScopeSharedError(run_id, alone_in)
                for _ in range(2):
                    bodies, digest = seal(events, prev)
                    params.update(prev=prev, digest=digest)
                    if self._claim_and_insert(cur, params, events, bodies):
                        break
                    prev = self._checked_prev(cur, run_id, expected_seq, epoch)
                else:
                    raise AssertionError("unreachable: a checked, locked row is claimed")
        except UniqueViolation:
            # Rows exist past runs.last_seq (written around this store): report the
            # log's real end.
            raise ConflictError(run_id, expected_seq, self.last_seq(run_id)) from None
        self._remember(run_id, events[-1].seq, digest)
        self._outlines.put(run_id, events[-1].seq, outline)
        return events[-1].seq

    def _outline_at(self, run_id: str, expected_seq: int) -> RunState | None:
        """The run's outline at ``expected_seq`` (see outlined.base_outline)."""
        def stored() -> tuple[int, bytes] | None:
            with self._read() as conn:
                row = conn.execute(self._q(
                    "SELECT outline_seq, outline FROM {s}.runs WHERE run_id = %s"
                    " AND outline_version = %s AND outline IS NOT NULL"),
                    (run_id, OUTLINE_VERSION)).fetchone()
            return (int(row[0]), bytes(row[1])) if row else None

        return base_outline(run_id, expected_seq, self._outlines.get(run_id, expected_seq),
                            stored, self.read)

    def _guess_prev(self, run_id: str, expected_seq: int) -> str | None:
        """The digest the log presumably ends with at ``expected_seq``, or None."""
        if expected_seq == 0:
            return GENESIS
        known = self._ends.get(run_id)
        return known[1] if known is not None and known[0] == expected_seq else None

    def _remember(self, run_id: str, seq: int, digest: str) -> None:
        """Where the run's log ends, as this handle last saw it: the next append's prev
        without a round trip. Only a guess; the claim checks it against the row."""
        with self._ends_lock:
            self._prefetched.pop(run_id, None)  # the log moved on: read it afresh
            self._ends.pop(run_id, None)
            self._ends[run_id] = (seq, digest)
            if len(self._ends) > _ENDS:
                del self._ends[next(iter(self._ends))]  # the least recently used

    def _claim_and_insert(self, cur: Cursor, params: dict[str, Any], events: Sequence[Event],
                          bodies: list[bytes]) -> bool:
        """Move the run's end from expected to last and insert the events, in one round trip.

        The UPDATE's WHERE is the whole check: under concurrency Postgres re-evaluates
        it on the row's newest version after waiting for its lock, so exactly one of
        two writers at the same expected seq and epoch claims it; and only a batch
        sealed from the digest the log really ends with is claimed. False: not claimed.
        """
        if len(events) == 1:
            params.update(type=events[0].type.value, body=bodies[0])
            cur.execute(self._claim_one, params)
        elif len(events) <= _VALUES_MAX:
            for i, (e, body) in enumerate(zip(events, bodies, strict=True)):
                params[f"seq{i}"], params[f"type{i}"] = e.seq, e.type.value
                params[f"ts{i}"], params[f"body{i}"] = e.ts, body
            cur.execute(self._claim_rows[len(events) - 2], params)
        else:
            params.update(runs=[e.run_id for e in events], seqs=[e.seq for e in events],
                          types=[e.type.value for e in events], stamps=[e.ts for e in events],
                          bodies=bodies)
            cur.execute(self._claim_many, params)
        (row,) = cur.fetchall()
        return bool(row[0])

    def _checked_prev(self, cur: Cursor, run_id: str, expected_seq: int, epoch: int) -> str:
        """Lock the run's row (creating it if missing) and raise why a claim would be
        refused; else the digest the log ends with, which a claim cannot now miss."""
        last, current, _, _, _, digest, archived_to, archived_seq = self._lock_run(cur, run_id)
        if archived_to is not None:
            raise ArchivedRunError(run_id, archived_to, archived_seq)
        if epoch != current:  # fencing first: a stale writer must stop, not retry
            raise FencedError(run_id, epoch, current)
        if last != expected_seq:
            raise ConflictError(run_id, expected_seq, last)
        return str(digest)

    # A page of a run's log with the run's head (runs.last_seq and last_digest), in one
    # statement, so as of one snapshot: one row with NULL seq when the page is empty.
    _PAGE_AND_HEAD: LiteralString = (
        "SELECT r.last_seq, r.last_digest, e.seq, e.body FROM (SELECT 1) one"
        " LEFT JOIN {s}.runs r ON r.run_id = %(run)s"
        " LEFT JOIN LATERAL (SELECT seq, body FROM {s}.events WHERE run_id = %(run)s"
        " AND seq >= %(after)s ORDER BY seq LIMIT %(limit)s) e ON true ORDER BY e.seq")

    # Runs' whole logs with their heads, in one statement (see prefetch).
    _LOGS_AND_HEADS: LiteralString = (
        "SELECT r.run_id, r.last_seq, r.last_digest, e.seq, e.body FROM {s}.runs r"
        " LEFT JOIN {s}.events e ON e.run_id = r.run_id"
        " WHERE r.run_id = ANY(%(runs)s) AND r.last_seq <= %(most)s ORDER BY r.run_id, e.seq")

    def prefetch(self, run_ids: Sequence[str]) -> None:
        """Read the logs of ``run_ids`` in one round trip (and their outlines in one
        more), each kept for the next read of that run from its start: a worker that
        took hundreds of runs over opens them without a round trip apiece. (Logs of more
        than a page are left to their read.)

        Only a hint, as :attr:`_ends` is: the caller holds the runs' leases, so nothing
        else appends meanwhile; an append through this handle drops the run's copy, and
        one made around it (a lease lost meanwhile) is refused at the next append, its
        expected seq or its epoch stale, as after any read."""
        if not run_ids:
            return
        logs: dict[str, tuple[list[tuple[int, bytes]], Head | None]] = {}
        with self._read() as conn:
            rows = conn.execute(self._q(self._LOGS_AND_HEADS),
                                {"runs": list(run_ids), "most": _PAGE}).fetchall()
            if self.projected:  # their outlines too: each run's next append builds on one
                for run_id, seq, outline in conn.execute(self._q(
                        "SELECT run_id, outline_seq, outline FROM {s}.runs WHERE run_id ="
                        " ANY(%s) AND outline_version = %s AND outline IS NOT NULL"),
                        (list(run_ids), OUTLINE_VERSION)):
                    self._outlines.put(run_id, int(seq), bytes(outline))
        for run_id, last, digest, seq, body in rows:
            records, _ = logs.setdefault(run_id, ([], (int(last), str(digest))))
            if seq is not None:
                records.append((int(seq), bytes(body)))
        with self._ends_lock:
            self._prefetched.update(logs)
            while len(self._prefetched) > _ENDS:
                del self._prefetched[next(iter(self._prefetched))]  # the oldest

    def _page(self, run_id: str, after_seq: int,
              limit: int | None) -> tuple[list[tuple[int, bytes]], Head | None]:
        """The run's records from ``after_seq`` on (at most ``limit``), and its head."""
        if after_seq == 0 and self._prefetched:
            with self._ends_lock:
                log = self._prefetched.pop(run_id, None)
            if log is not None:
                return log
        with self._read() as conn:
            rows = conn.execute(self._q(self._PAGE_AND_HEAD),
                                {"run": run_id, "after": after_seq, "limit": limit}).fetchall()
        head = (int(rows[0][0]), str(rows[0][1])) if rows[0][0] is not None else None
        return [(int(r[2]), bytes(r[3])) for r in rows if r[2] is not None], head

    def read(self, run_id: str, after_seq: int = 0, upto: int | None = None
             ) -> Iterator[Event]:
        validate_run_id(run_id)
        first, prev, end = after_seq, GENESIS, None
        while True:
            # A connection is held per page, never while the caller iterates. Each page
            # starts at the last record already checked: its digest starts the chain.
            size = _PAGE if upto is None else max(0, min(_PAGE, upto - after_seq))
            rows, head = self._page(run_id, after_seq, size + 1)
            if rows and rows[0][0] == after_seq:
                prev, end = stored_digest(rows.pop(0)[1]), after_seq
            if upto is not None:
                rows = [r for r in rows if r[0] <= upto]
            events = []
            for seq, body in rows:
                event, prev = decode_record(run_id, seq, body, prev, sealed_store=self._sealed)
                end = seq
                events.append(event)
            if upto is not None and (end is None or end >= upto or len(rows) < size):
                if head is None or upto >= head[0]:  # (a range short of the head: its
                    check_head(run_id, first, None if end is None else (end, prev), head)
                yield from events  # chain is checked, not its end)
                return
            if len(rows) < _PAGE:  # the last page: the log must end at its head
                check_head(run_id, first, None if end is None else (end, prev), head)
                yield from events
                if end is not None:  # the end of the log: the next append chains from it
                    self._remember(run_id, end, prev)
                return
            yield from events
            after_seq = rows[-1][0]

    def heads(self) -> dict[str, Head]:
        with self._read() as conn:
            rows = conn.execute(self._q("SELECT run_id, last_seq, last_digest FROM {s}.runs"
                                        " WHERE last_seq > 0 ORDER BY run_id")).fetchall()
        return {r[0]: (int(r[1]), str(r[2])) for r in rows}

    def last_seq(self, run_id: str) -> int:
        validate_run_id(run_id)
        with self._read() as conn:
            ((last,),) = conn.execute(
                self._q("SELECT coalesce(max(seq), 0) FROM {s}.events WHERE run_id = %s"),
                (run_id,),
            ).fetchall()
        return int(last)

    def list_runs(self, *, limit: int | None = None) -> list[RunInfo]:
        with self._read() as conn:
            rows = conn.execute(
                self._q(
                    "SELECT run_id, last_seq, created_at, updated_at FROM {s}.runs"
                    " WHERE last_seq > 0 ORDER BY updated_at DESC, run_id LIMIT %s"
                ),
                (limit if limit and limit > 0 else None,),  # like SQLite: 0 means no limit
            ).fetchall()
        return [RunInfo(r[0], r[1], r[2], r[3]) for r in rows]

    def outlines(self, run_ids: Collection[str] | None = None, *,
                 attention: bool = False) -> dict[str, RunState | JournalError]:
        """Each run's outline as of its head (see SQLiteStore.outlines)."""
        return served(self._outline_rows(run_ids, attention), self.read,
                      attention=attention)

    def _outline_rows(self, run_ids: Collection[str] | None, attention: bool,
                      stale: bool = False) -> list[Stored]:
        sql_text = ("SELECT run_id, last_seq, "
                    + ("outline_seq, outline" if self.projected else "NULL, NULL") +
                    " FROM {s}.runs WHERE last_seq > 0"
                    " AND (%(ids)s::text[] IS NULL OR run_id = ANY(%(ids)s))")
        if not self.projected:
            attention = stale = False
        behind = (" outline_seq IS DISTINCT FROM last_seq OR outline IS NULL"
                  " OR outline_version IS DISTINCT FROM %(version)s")
        if attention:
            sql_text += " AND (attention OR" + behind + ")"
        if stale:
            sql_text += " AND (" + behind + ")"
        with self._read() as conn:
            rows = conn.execute(self._q(sql_text), {
                "ids": None if run_ids is None else list(run_ids),
                "version": OUTLINE_VERSION}).fetchall()
        return [Stored(r[0], int(r[1]), r[2], None if r[3] is None else bytes(r[3]))
                for r in rows]

    def _project(self) -> None:
        """Project the runs whose outline is missing, of another version or behind its
        head (see SQLiteStore._project)."""
        project(self.url, self._outline_rows(None, attention=False, stale=True), self.read,
                self.put_outline)

    def put_outline(self, run_id: str, state: RunState) -> None:
        """Store ``state`` as the run's outline if its log still ends at its seq."""
        params = {"run": run_id, "version": OUTLINE_VERSION,
                  **_outline_params(state, encode_outline(state))}
        with self._write(run_id, batched=True) as cur:  # (a cache: the log says it again)
            cur.execute(self._q(
                "UPDATE {s}.runs SET outline = %(outline)s, outline_seq = %(outline_seq)s,"
                " outline_version = %(version)s, status = %(status)s, agent = %(agent)s,"
                " attention = %(attention)s WHERE run_id = %(run)s"
                " AND last_seq = %(outline_seq)s"), params)
        self._outlines.drop(run_id)

    # --- views: caches a reader keeps beside a run's log -----------------------------

    def put_view(self, run_id: str, name: str, seq: int, body: bytes) -> None:
        validate_run_id(run_id)
        with self._write(run_id, batched=True) as cur:
            self._lock_run(cur, run_id)  # (its row: a view belongs to a run of the tenant)
            cur.execute(self._q(
                "INSERT INTO {s}.views (run_id, name, seq, body) VALUES (%s, %s, %s, %s)"
                " ON CONFLICT (run_id, name) DO UPDATE SET seq = excluded.seq,"
                " body = excluded.body"), (run_id, name, seq, body))

    def view(self, run_id: str, name: str) -> tuple[int, bytes] | None:
        validate_run_id(run_id)
        with self._read() as conn:
            row = conn.execute(self._q("SELECT seq, body FROM {s}.views WHERE run_id = %s"
                                       " AND name = %s"), (run_id, name)).fetchone()
        return (int(row[0]), bytes(row[1])) if row else None

    def scope_runs(self, scope: str) -> list[str]:
        with self._read() as conn:
            rows = conn.execute(
                self._q("SELECT run_id FROM {s}.runs WHERE scope = %s AND last_seq > 0"
                        " ORDER BY created_at, run_id"), (scope,)).fetchall()
        return [r[0] for r in rows]

    # --- leases ----------------------------------------------------------------

    def _set_expiry(self, cur: Cursor, run_id: str, owner: str, epoch: int, ttl: float,
                    now: float) -> float:
        """Grant the lease; its expiry as ``now`` (the server's clock when the row was
        locked) plus ``ttl``, never later than the one set. Nothing is read back, so in
        a pipelined write the UPDATE goes with the COMMIT: one round trip."""
        cur.execute(
            self._q(
                "UPDATE {s}.runs SET lease_owner = %s, lease_epoch = %s,"
                " lease_expires_at = clock_timestamp() + make_interval(secs => %s::float8)"
                " WHERE run_id = %s"
            ),
            (owner, epoch, ttl, run_id),
        )
        return now + ttl

    def acquire(self, run_id: str, owner: str, ttl: float) -> Lease:
        validate_run_id(run_id)
        return self._acquirer.submit((run_id, owner, ttl))  # type: ignore[no-any-return]

    def _acquire_group(self, group: list[Pending]) -> None:
        """The acquires of runs opened together (see :meth:`_acquire`), in one
        transaction. A statement the server refused rolled the group back: each then
        goes alone, and meets its own error; one it did not answer breaks the handle."""
        firsts: dict[str, Pending] = {}
        for pending in group:
            firsts.setdefault(pending.item[0], pending)
        together = list(firsts.values())
        try:
            outcomes = self._acquire([pending.item for pending in together])
        except DurabilityError:
            raise
        except JournalError:
            if len(together) == 1:
                raise
            _settle_each(together, self._acquire_alone)
        else:
            for pending, outcome in zip(together, outcomes, strict=True):
                pending.result, pending.error = (
                    (outcome, None) if isinstance(outcome, Lease) else (None, outcome))
        # The same run twice in a group: the later ones after, as if they came later.
        _settle_each([p for p in group if firsts[p.item[0]] is not p], self._acquire_alone)

    def _acquire_alone(self, wanted: tuple[str, str, float]) -> Lease:
        outcome = self._acquire([wanted])[0]
        if isinstance(outcome, Lease):
            return outcome
        raise outcome

    def _acquire(self, wanted: list[tuple[str, str, float]]) -> list[Lease | JournalError]:
        """Leases on distinct runs ((run id, owner, ttl) each), each granted or held by
        another (LeaseHeldError): the rows locked in run id order (created if missing)
        and read in one statement, the expiries set in a second that goes with the
        COMMIT."""
        with self._write(wanted[0][0] if len(wanted) == 1 else None, pipelined=True) as cur:
            cur.execute(self._lock_runs, ([run_id for run_id, _, _ in wanted],))
            rows = {row[0]: row[1:] for row in cur.fetchall()}
            outcomes = [_granted(run_id, owner, ttl, rows[run_id])
                        for run_id, owner, ttl in wanted]
            granted = [(lease, ttl) for lease, (_, _, ttl) in zip(outcomes, wanted, strict=True)
                       if isinstance(lease, Lease)]
            if granted:
                # Each expiry is the server's clock now plus its TTL: never earlier than
                # the one granted (the clock when its row was locked, plus the TTL).
                cur.execute(self._set_expiries, (
                    [lease.run_id for lease, _ in granted], [lease.owner for lease, _ in granted],
                    [lease.epoch for lease, _ in granted], [ttl for _, ttl in granted]))
        for lease, _ in granted:
            if lease.last_seq is not None:  # the row exists now: even a new run's first
                last, *_, digest, _, _ = rows[lease.run_id]  # append is warm
                self._remember(lease.run_id, int(last), str(digest))
        return outcomes

    def holder(self, run_id: str) -> Lease | None:
        validate_run_id(run_id)
        with self._read() as conn:
            row = conn.execute(self._q(
                "SELECT lease_owner, lease_epoch, extract(epoch FROM lease_expires_at"
                " - clock_timestamp())::float8, lease_expires_at <= to_timestamp(0)"
                " FROM {s}.runs WHERE run_id = %s AND lease_owner IS NOT NULL"),
                (run_id,)).fetchone()
        if row is None:
            return None
        owner, epoch, left, released = row
        return Lease(run_id, owner, int(epoch), 0.0 if released else time.time() + left)

    def renew(self, lease: Lease, ttl: float) -> Lease:
        with self._write(lease.run_id, pipelined=True) as cur:
            _, current, _, expires, now, *_ = self._lock_run(cur, lease.run_id)
            if current != lease.epoch:
                raise FencedError(lease.run_id, lease.epoch, current)
            if expires <= 0:  # released: see release
                raise LeaseReleasedError(lease.run_id, lease.epoch)
            expires_at = self._set_expiry(cur, lease.run_id, lease.owner, lease.epoch, ttl,
                                          now)
        return Lease(lease.run_id, lease.owner, lease.epoch, expires_at)

    def renew_all(self, leases: Sequence[Lease], ttl: float) -> dict[str, Lease]:
        """Renew many leases in one statement (a worker's heartbeat for every run it
        holds); the ones renewed, by run id. A lease whose epoch moved on (another worker
        took the run) is not renewed, and is missing from the answer."""
        if not leases:
            return {}
        with self._write(None) as cur:
            # The rows locked in run id order, as a group commit locks them: two writers
            # that lock several rows in different orders can deadlock, and the loser
            # waits deadlock_timeout (a second) to fail. Locking re-checks the conditions
            # on a row changed meanwhile, and a locked row stays as it was checked.
            cur.execute(self._q(
                "WITH h AS (SELECT * FROM unnest(%(runs)s::text[], %(epochs)s::bigint[],"
                " %(owners)s::text[]) AS h(run_id, epoch, owner)),"
                " mine AS MATERIALIZED (SELECT r.run_id, h.owner FROM {s}.runs r JOIN h"
                " ON r.run_id = h.run_id AND r.lease_epoch = h.epoch"
                " AND r.lease_expires_at > to_timestamp(0)"  # not one released
                " ORDER BY r.run_id FOR UPDATE OF r)"
                " UPDATE {s}.runs r SET lease_expires_at = clock_timestamp()"
                " + make_interval(secs => %(ttl)s::float8), lease_owner = mine.owner"
                " FROM mine WHERE r.run_id = mine.run_id"
                " RETURNING r.run_id, extract(epoch FROM r.lease_expires_at)::float8"),
                {"ttl": ttl, "runs": [lease.run_id for lease in leases],
                 "epochs": [lease.epoch for lease in leases],
                 "owners": [lease.owner for lease in leases]})
            renewed = dict(cur.fetchall())
        return {lease.run_id: Lease(lease.run_id, lease.owner, lease.epoch,
                                    float(renewed[lease.run_id]))
                for lease in leases if lease.run_id in renewed}

    def release(self, lease: Lease) -> None:
        """Release ``lease``. A connection dropped under it is retried at once on a fresh
        one (the pool discards the dead one); if the server is still away, the release is
        kept and retried on this handle's next write and on ``close``."""
        try:
            self._releaser.submit(lease)
        except StoreUnavailableError:
            try:
                self._release([lease])
            except StoreUnavailableError:
                self._unreleased[lease.run_id] = lease
                raise

    def _release_group(self, group: list[Pending]) -> None:
        """The releases of runs closed together, in one transaction; if the server
        refused one, each on its own (and meets its own error)."""
        try:
            self._release([pending.item for pending in group])
        except StoreUnavailableError:
            raise  # for every one: each retries on its own (see release)
        except JournalError:
            if len(group) == 1:
                raise
            _settle_each(group, lambda lease: self._release([lease]))

    def _release(self, leases: list[Lease]) -> None:
        # Not waited for on disk: a release a server crash loses only leaves the lease to
        # expire by its TTL. One statement, however many.
        with self._write(leases[0].run_id if len(leases) == 1 else None, batched=True,
                         pipelined=True) as cur:
            cur.execute(self._release_all, ([lease.run_id for lease in leases],
                                            [lease.epoch for lease in leases]))
        for lease in leases:
            self._unreleased.pop(lease.run_id, None)

    def _retry_releases(self) -> None:
        """Best effort: a release that failed earlier (a newer lease of the run is never
        touched: the update matches the old epoch only)."""
        pending, self._unreleased = self._unreleased, {}
        for run_id, lease in pending.items():
            try:
                self._release([lease])
            except JournalError:
                self._unreleased.setdefault(run_id, lease)

    # --- snapshots ---------------------------------------------------------------

    def put_snapshot(self, snapshot: Snapshot, *, keep: int = 2) -> None:
        run_id = validate_run_id(snapshot.run_id)
        with self._write(run_id) as cur:  # body and pointer are one row: one transaction
            self._lock_snapshots(cur, run_id)
            cur.execute(
                self._q(
                    "INSERT INTO {s}.snapshots (run_id, seq, fold_version, schema_version,"
                    " digest, body, created_at) VALUES (%s, %s, %s, %s, %s, %s, %s)"
                    " ON CONFLICT (run_id, seq, fold_version) DO UPDATE SET"
                    " schema_version = EXCLUDED.schema_version, digest = EXCLUDED.digest,"
                    " body = EXCLUDED.body, created_at = EXCLUDED.created_at"
                ),
                (
                    run_id,
                    snapshot.seq,
                    snapshot.fold_version,
                    snapshot.schema_version,
                    snapshot.digest,
                    snapshot.body,
                    snapshot.created_at,
                ),
            )
            self._prune(cur, run_id, max(keep, 1))

    def _prune(self, cur: Cursor, run_id: str, keep: int) -> int:
        cur.execute(
            self._q(
                "DELETE FROM {s}.snapshots WHERE run_id = %s AND (seq, fold_version) NOT IN"
                " (SELECT seq, fold_version FROM {s}.snapshots WHERE run_id = %s"
                " ORDER BY seq DESC, created_at DESC LIMIT %s)"
            ),
            (run_id, run_id, keep),
        )
        return cur.rowcount

    def _lock_snapshots(self, cur: Cursor, run_id: str) -> None:
        # Serialize writers of this run's snapshots (not its appends or lease), so
        # two prunes never each keep a different newest ``keep``.
        cur.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                    (f"agentjournal.snapshots:{self.schema}:{run_id}",))

    def prune_snapshots(self, run_id: str, *, keep: int) -> int:
        validate_run_id(run_id)
        with self._write(run_id) as cur:
            self._lock_snapshots(cur, run_id)
            return self._prune(cur, run_id, max(keep, 0))

    def snapshots(self, run_id: str, *, limit: int | None = None) -> list[Snapshot]:
        validate_run_id(run_id)
        with self._read() as conn:
            rows = conn.execute(
                self._q(
                    "SELECT seq, schema_version, fold_version, digest, body, created_at"
                    " FROM {s}.snapshots WHERE run_id = %s ORDER BY seq DESC, created_at DESC"
                    " LIMIT %s"
                ),
                (run_id, limit),
            ).fetchall()
        return [
            Snapshot(
                run_id=run_id,
                seq=r[0],
                schema_version=r[1],
                fold_version=r[2],
                digest=r[3],
                body=bytes(r[4]),
                created_at=r[5],
            )
            for r in rows
        ]

    def delete_snapshots(self, run_id: str) -> int:
        validate_run_id(run_id)
        with self._write(run_id) as cur:
            cur.execute(self._q("DELETE FROM {s}.segments WHERE run_id = %s"), (run_id,))
            cur.execute(self._q("DELETE FROM {s}.snapshots WHERE run_id = %s"), (run_id,))
            deleted = cur.rowcount
        return deleted

    def put_segments(self, run_id: str, segments: Mapping[str, bytes]) -> None:
        validate_run_id(run_id)
        with self._write(run_id) as cur:
            cur.executemany(
                self._q("INSERT INTO {s}.segments (run_id, digest, body) VALUES (%s, %s, %s)"
                        " ON CONFLICT (run_id, digest) DO UPDATE SET body = EXCLUDED.body"),
                [(run_id, digest, body) for digest, body in segments.items()])

    def segments(self, run_id: str, digests: Collection[str]) -> dict[str, bytes]:
        validate_run_id(run_id)
        with self._read() as conn:
            rows = conn.execute(
                self._q("SELECT digest, body FROM {s}.segments"
                        " WHERE run_id = %s AND digest = ANY(%s)"),
                (run_id, list(digests))).fetchall()
        return {digest: bytes(body) for digest, body in rows}

    def segment_digests(self, run_id: str) -> set[str]:
        validate_run_id(run_id)
        with self._read() as conn:
            rows = conn.execute(self._q("SELECT digest FROM {s}.segments WHERE run_id = %s"),
                                (run_id,)).fetchall()
        return {digest for (digest,) in rows}

    def prune_segments(self, run_id: str, keep: Collection[str]) -> int:
        validate_run_id(run_id)
        with self._write(run_id) as cur:
            cur.execute(self._q("DELETE FROM {s}.segments"
                                " WHERE run_id = %s AND NOT digest = ANY(%s)"),
                        (run_id, list(keep)))
            return cur.rowcount

    def quarantine(self, fold_version: int, reason: str) -> None:
        with self._write(None) as cur:
            cur.execute(
                self._q(
                    "INSERT INTO {s}.quarantine (fold_version, reason) VALUES (%s, %s)"
                    " ON CONFLICT (fold_version) DO UPDATE SET reason = EXCLUDED.reason,"
                    " at = now()"
                ),
                (fold_version, reason),
            )

    def quarantined(self) -> dict[int, str]:
        with self._read() as conn:
            rows = conn.execute(self._q("SELECT fold_version, reason FROM {s}.quarantine"))
            return {int(v): str(r) for v, r in rows.fetchall()}

    # --- retention ---------------------------------------------------------------

    def records(self, run_id: str) -> list[bytes]:
        validate_run_id(run_id)
        rows, head = self._page(run_id, 0, None)
        records = [body for _, body in rows]
        check_records(run_id, records, sealed_store=self._sealed)
        check_head(run_id, 0, (len(records), stored_digest(records[-1])) if records else None,
                   head)
        return records

    def delete_run(self, tombstone: Tombstone, *, epoch: int) -> None:
        run_id = validate_run_id(tombstone.run_id)
        with self._write(run_id) as cur:
            last, current, *_, archived_to, _ = self._lock_run(cur, run_id)
            if epoch != current:
                raise FencedError(run_id, epoch, current)
            if last != tombstone.last_seq or archived_to is not None:
                raise ConflictError(run_id, tombstone.last_seq, last)
            for table in ("events", "snapshots", "segments", "queue", "views"):
                cur.execute(sql.SQL("DELETE FROM {s}.{t} WHERE run_id = %s").format(
                    s=self._s, t=sql.Identifier(table)), (run_id,))
            cur.execute(self._q(
                "UPDATE {s}.runs SET last_seq = 0, last_digest = '', outline = NULL,"
                " outline_seq = NULL, status = NULL, agent = NULL, attention = false,"
                " archived_to = %s,"
                " archived_seq = %s, archived_digest = %s, archived_at = %s WHERE run_id = %s"),
                (tombstone.archive, tombstone.last_seq, tombstone.digest, tombstone.deleted_at,
                 run_id))
        with self._ends_lock:
            self._ends.pop(run_id, None)
        self._outlines.drop(run_id)

    _TOMBSTONES: LiteralString = (
        "SELECT run_id, archived_seq, archived_digest, archived_to, archived_at FROM {s}.runs"
        " WHERE archived_to IS NOT NULL")

    def tombstone(self, run_id: str) -> Tombstone | None:
        validate_run_id(run_id)
        with self._read() as conn:
            rows = conn.execute(self._q(self._TOMBSTONES + " AND run_id = %s"),
                                (run_id,)).fetchall()
        return _tombstone(rows[0]) if rows else None

    def tombstones(self) -> list[Tombstone]:
        with self._read() as conn:
            rows = conn.execute(self._q(self._TOMBSTONES + " ORDER BY archived_at, run_id"))
            return [_tombstone(r) for r in rows.fetchall()]

    def restore_run(self, run_id: str, records: Sequence[bytes]) -> None:
        validate_run_id(run_id)
        if not records:
            raise ValueError("restore_run needs the records of a whole log")
        events = check_records(run_id, records)
        with self._write(run_id) as cur:
            cur.execute(self._q("SELECT archived_digest FROM {s}.runs WHERE run_id = %s"
                                " FOR UPDATE"), (run_id,))
            row = cur.fetchone()
            if row is None or row[0] is None:
                raise NotArchivedError(run_id, "it has no tombstone here")
            if records_digest(records) != row[0]:
                raise CorruptLogError(run_id, len(records), "these records are not the log "
                                      "its tombstone names (their digest differs)")
            cur.executemany(self._q("INSERT INTO {s}.events (run_id, seq, type, ts, body)"
                                    " VALUES (%s, %s, %s, %s, %s)"),
                            [(run_id, e.seq, e.type.value, e.ts, body)
                             for e, body in zip(events, records, strict=True)])
            cur.execute(self._q(
                "UPDATE {s}.runs SET last_seq = %s, last_digest = %s, scope = %s,"
                " created_at = %s, updated_at = %s, archived_to = NULL, archived_seq = NULL,"
                " archived_digest = NULL, archived_at = NULL WHERE run_id = %s"),
                (events[-1].seq, stored_digest(records[-1]), scope_started(events),
                 events[0].ts, max(e.ts for e in events), run_id))
            outline = _outline_params(*outline_after(lambda: None, events))
            cur.execute(self._q(
                "UPDATE {s}.runs SET outline = %(outline)s, outline_seq = %(outline_seq)s,"
                " outline_version = %(version)s, status = %(status)s, agent = %(agent)s,"
                " attention = %(attention)s WHERE run_id = %(run)s"),
                {**outline, "run": run_id, "version": OUTLINE_VERSION})

    def close(self) -> None:
        if self._unreleased:
            self._retry_releases()
        self._pool.close()

    def __enter__(self) -> PostgresStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
