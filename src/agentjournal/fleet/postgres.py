"""The queue on PostgreSQL: workers on many hosts, a claim is one statement.

Idle workers wait on ``LISTEN`` with a poll as the fallback; ``NOTIFY`` is only a
coalesced hint, sent in the transaction that made a run runnable, never the carrier
of work (Postgres serialises notifying commits, so the work itself stays in the table).

The channel: a tenant's own (store/tenants.py: a random name only it and the admin can
read, since anyone may LISTEN on a channel they can name), so no tenant hears another's
submits; for any other role (the admin, a tenant granted by an older release) the
schema's. The admin's workers claim every tenant's runs, so they listen on the schema's
channel and on every tenant's, looking for new tenants each time they wait.
"""

from __future__ import annotations

import contextlib
import time
import typing
from collections.abc import Sequence
from typing import Any, LiteralString

import msgspec
import psycopg
from psycopg import sql

from ..continuation import check_resubmission
from ..store import Lease
from ..store.base import validate_run_id
from ..store.postgres import PostgresStore
from ..store.tenants import CHANNELS_TABLE
from .queue import (
    LAPSED,
    Claim,
    QueuedRun,
    QueueState,
    Served,
    WorkerInfo,
    check_pin,
    parked_reason,
    served_keys,
    stop_line,
    stops_in,
    taken_back,
    unserved,
)

# Runnable: submitted or handed back; running on an expired lease (its worker died);
# stopped for a person, and something appended since (a person's decision) by a writer
# that is done (a decision holds the lease while it writes).
_RUNNABLE: LiteralString = """(q.state = 'queued'
    OR (q.state IN ('running', 'waiting', 'parked')
        AND coalesce(r.lease_expires_at <= clock_timestamp(), true)
        AND (q.state = 'running' OR r.last_seq > q.parked_seq)))"""

# A pinned run only for a claim serving its version (queue.py's served_keys: "REF VERSION").
_SERVED: LiteralString = """(q.pin_version IS NULL
    OR q.agent || ' ' || q.pin_version = ANY(%(served)s::text[]))"""

# One statement: pick (skipping rows another claim or an append holds), take the lease
# with the next epoch, mark the run running. A claim of a run still marked running
# counts a crash of the worker that held it, and keeps what the stop was (queue.py's
# stop_line, with LAPSED) unless the holder said so already (note_stop: the run raised).
# (``leased`` carries the picked state on:
# joined back to ``pick``, two CTEs the planner takes for one row each, a claim of
# 1,000 compared a million pairs, 0.22 of its 0.23 s.)
_CLAIM: LiteralString = """
WITH pick AS (
    SELECT q.run_id, q.state FROM {s}.queue q JOIN {s}.runs r ON r.run_id = q.run_id
    WHERE q.queue = ANY(%(queues)s) AND """ + _RUNNABLE + """ AND """ + _SERVED + """
    ORDER BY q.priority DESC, q.submitted_at, q.run_id
    LIMIT %(n)s FOR UPDATE OF q, r SKIP LOCKED
), leased AS (
    UPDATE {s}.runs r SET lease_owner = %(owner)s, lease_epoch = r.lease_epoch + 1,
        lease_expires_at = clock_timestamp() + make_interval(secs => %(ttl)s::float8)
    FROM pick WHERE r.run_id = pick.run_id
    RETURNING r.run_id, r.lease_epoch, extract(epoch FROM r.lease_expires_at)::float8 AS until,
        r.last_seq, r.last_digest, r.archived_to IS NULL AS live, pick.state AS was
)
UPDATE {s}.queue q SET state = 'running', worker = %(owner)s, claims = q.claims + 1,
    crashes = q.crashes + (leased.was = 'running')::int, changed_at = clock_timestamp(),
    reason = CASE WHEN leased.was = 'running' AND strpos(E'\\n' || coalesce(q.reason, ''),
            E'\\n- epoch ' || (leased.lease_epoch - 1) || ': ') = 0
        THEN concat_ws(E'\\n', q.reason, '- epoch ' || (leased.lease_epoch - 1) || ': worker '
            || coalesce(q.worker, 'unknown') || ' ' || %(lapsed)s)
        ELSE q.reason END
FROM leased
WHERE q.run_id = leased.run_id
RETURNING q.run_id, leased.lease_epoch, leased.until, q.agent, q.task, q.queue, q.crashes,
    leased.last_seq, leased.last_digest, leased.live, q.reason, q.pin_version
"""

# The stop lines (queue.py's stops_in) of the row's reason; NULL if none.
_STOPS: LiteralString = """nullif(array_to_string(ARRAY(
    SELECT line FROM regexp_split_to_table(coalesce(q.reason, ''), E'\\n') AS line
    WHERE line ~ '^- epoch [0-9]+: '), E'\\n'), '')"""

# Done or waiting: its crashes forgotten. Otherwise its stops kept, after the reason given.
_HAND_BACK: LiteralString = """
WITH mine AS (
    UPDATE {s}.runs SET lease_expires_at = to_timestamp(0)
    WHERE run_id = %(run)s AND lease_epoch = %(epoch)s RETURNING run_id
)
UPDATE {s}.queue q SET state = %(state)s, worker = NULL, parked_seq = %(seq)s,
    crashes = CASE WHEN %(state)s IN ('done', 'waiting') THEN 0 ELSE q.crashes END,
    reason = CASE WHEN %(state)s IN ('done', 'waiting') THEN NULL
        ELSE nullif(concat_ws(E'\\n', %(reason)s::text, """ + _STOPS + """), '') END,
    changed_at = clock_timestamp()
FROM mine WHERE q.run_id = mine.run_id RETURNING q.run_id
"""


class PostgresQueue:
    def __init__(self, store: PostgresStore) -> None:
        self.store = store
        self.schema_channel = f"agentjournal_{store.schema}"
        self._own: str | None = None  # the channel this role notifies, once looked up
        self._listener: psycopg.Connection[Any] | None = None
        self._heard: set[str] = set()  # the channels the listener is listening on
        self._claim, self._hand_back = (store._q(text) for text in (_CLAIM, _HAND_BACK))

    def submit(self, run_id: str, agent: str, task: str, *, queue: str = "default",
               priority: int = 0, pin_version: str | None = None) -> bool:
        validate_run_id(run_id)
        with self.store._write(run_id) as cur:
            # The run's row first (a claim joins on it): a tenant queues only its own runs.
            self.store._lock_run(cur, run_id)
            cur.execute(self.store._q(
                "INSERT INTO {s}.queue (run_id, queue, priority, agent, task, state,"
                " pin_version) VALUES (%s, %s, %s, %s, %s, 'queued', %s)"
                " ON CONFLICT (run_id) DO NOTHING RETURNING run_id"),
                (run_id, queue, priority, agent, task, pin_version))
            if cur.fetchall():
                self._notify(cur)
                return True
            cur.execute(self.store._q(
                "SELECT agent, task, pin_version FROM {s}.queue WHERE run_id = %s"), (run_id,))
            (row,) = cur.fetchall()
        check_resubmission(self, run_id, (row[0], row[1]), (agent, task))
        check_pin(run_id, row[2], pin_version)
        return False  # the same request again: nothing changes

    def claim(self, owner: str, ttl: float, queues: Sequence[str], *,
              served: Served | None = None) -> Claim | None:
        claims = self.claim_many(owner, ttl, queues, 1, served=served)
        return claims[0] if claims else None

    def claim_many(self, owner: str, ttl: float, queues: Sequence[str], n: int, *,
                   served: Served | None = None) -> list[Claim]:
        """Up to ``n`` runs claimed in one statement (a worker holding many runs, taking
        them over after another died), most urgent first."""
        with self.store._write(None) as cur:
            cur.execute(self._claim, {"queues": list(queues), "owner": owner, "ttl": ttl,
                                      "n": n, "lapsed": LAPSED,
                                      "served": served_keys(served)})
            rows = cur.fetchall()
        urgent = {run_id: i for i, (run_id, *_) in enumerate(rows)}
        claims = []
        for (run_id, epoch, until, agent, task, queue, crashes, last, digest, live, reason,
             pin) in sorted(rows, key=lambda r: urgent[r[0]]):
            if live:  # as an acquire does: the run's first append under the claim is warm
                self.store._remember(run_id, int(last), str(digest))
            lease = Lease(run_id, owner, int(epoch), float(until),
                          last_seq=int(last) if live else None)
            claims.append(Claim(lease=lease, agent=agent, task=task, queue=queue,
                                crashes=int(crashes), stops=stops_in(reason), pin_version=pin))
        return claims

    def hand_back(self, lease: Lease, state: QueueState, at_seq: int,
                  reason: str | None = None) -> bool:
        with self.store._write(lease.run_id) as cur:
            cur.execute(self._hand_back, {"run": lease.run_id, "epoch": lease.epoch,
                                          "state": state, "seq": at_seq, "reason": reason})
            mine = bool(cur.fetchall())
            if mine and state == "queued":
                self._notify(cur)
        return mine

    def keep_waiting(self, run_id: str, at_seq: int) -> None:
        with self.store._write(run_id) as cur:
            cur.execute(self.store._q(
                "UPDATE {s}.queue SET parked_seq = %s WHERE run_id = %s AND state = 'waiting'"
                " AND parked_seq < %s"), (at_seq, run_id, at_seq))

    def note_stop(self, lease: Lease, what: str) -> None:
        with self.store._write(lease.run_id) as cur:
            cur.execute(self.store._q(
                "UPDATE {s}.queue q SET reason = concat_ws(E'\\n', q.reason, %(line)s::text)"
                " FROM {s}.runs r WHERE q.run_id = %(run)s AND r.run_id = q.run_id"
                " AND r.lease_epoch = %(epoch)s"
                " AND strpos(E'\\n' || coalesce(q.reason, ''), %(mark)s::text) = 0"),
                {"run": lease.run_id, "epoch": lease.epoch,
                 "line": stop_line(lease.epoch, lease.owner, what),
                 "mark": f"\n- epoch {lease.epoch}: "})

    def absolve(self, run_id: str, epoch: int | None = None) -> QueueState | None:
        with self.store._write(run_id) as cur:
            cur.execute(self.store._q("SELECT state, crashes, reason FROM {s}.queue"
                                      " WHERE run_id = %s FOR UPDATE"), (run_id,))
            row = cur.fetchone()
            if row is None:
                return None
            state, crashes, reason = row
            after = taken_back(state, crashes, reason, epoch)
            if after is None:
                return None
            cur.execute(self.store._q("UPDATE {s}.queue SET crashes = %s, reason = %s"
                                      " WHERE run_id = %s"), (*after, run_id))
        return typing.cast(QueueState, state)

    def retry(self, run_id: str, *, forget_crashes: bool = True) -> bool:
        with self.store._write(run_id) as cur:
            cur.execute(self.store._q(
                "UPDATE {s}.queue SET state = 'queued', changed_at = now(),"
                " crashes = CASE WHEN %(forget)s THEN 0 ELSE crashes END,"
                " reason = CASE WHEN %(forget)s THEN NULL ELSE reason END"
                " WHERE run_id = %(run)s AND state IN ('waiting', 'parked') RETURNING run_id"),
                {"run": run_id, "forget": forget_crashes})
            changed = bool(cur.fetchall())
            if changed:
                self._notify(cur)
        return changed

    def runs(self) -> list[QueuedRun]:
        with self.store._conn() as conn:
            rows = conn.execute(self.store._q(
                "SELECT q.run_id, q.queue, q.state, q.priority, q.agent, q.worker, q.crashes,"
                " q.claims, extract(epoch FROM q.submitted_at)::float8,"
                " extract(epoch FROM q.changed_at)::float8, q.reason, " + _RUNNABLE
                + ", q.pin_version"
                " FROM {s}.queue q JOIN {s}.runs r ON r.run_id = q.run_id"
                " ORDER BY q.submitted_at, q.run_id")).fetchall()
            workers = self._workers(conn)
        out, now = [], time.time()  # (the clock the workers' heartbeats are written with)
        for r in rows:
            waiting_for = unserved(r[4], r[12], workers, now) if r[11] else None
            out.append(QueuedRun(
                run_id=r[0], queue=r[1], state=r[2], priority=r[3], agent=r[4], worker=r[5],
                crashes=r[6], claims=r[7], submitted_at=r[8], changed_at=r[9],
                reason=parked_reason(r[2], r[10]), stops=stops_in(r[10]),
                runnable=bool(r[11]), pin_version=r[12],
                waiting_for=waiting_for))
        return out

    def pinned_agents(self, queues: Sequence[str]) -> list[str]:
        with self.store._read() as conn:
            rows = conn.execute(self.store._q(
                "SELECT DISTINCT agent FROM {s}.queue WHERE state <> 'done'"
                " AND pin_version IS NOT NULL AND queue = ANY(%s) ORDER BY agent"),
                (list(queues),)).fetchall()
        return [agent for (agent,) in rows]

    def beat(self, worker: WorkerInfo) -> None:
        with self.store._write(None) as cur:
            cur.execute(self.store._q(
                "INSERT INTO {s}.workers VALUES (%s, %s::jsonb, to_timestamp(%s))"
                " ON CONFLICT (worker_id) DO UPDATE SET info = excluded.info,"
                " heartbeat_at = excluded.heartbeat_at"),
                (worker.worker_id, msgspec.json.encode(worker).decode(), worker.heartbeat_at))

    def forget(self, worker_id: str) -> None:
        with self.store._write(None) as cur:
            cur.execute(self.store._q("DELETE FROM {s}.workers WHERE worker_id = %s"),
                        (worker_id,))

    def next_expiry(self, queues: Sequence[str]) -> float | None:
        with self.store._read() as conn:
            ((left,),) = conn.execute(self.store._q(
                "SELECT extract(epoch FROM min(r.lease_expires_at) - clock_timestamp())::float8"
                " FROM {s}.queue q JOIN {s}.runs r ON r.run_id = q.run_id"
                " WHERE q.queue = ANY(%s) AND q.state = 'running'"), (list(queues),)).fetchall()
        return None if left is None else max(0.0, float(left))

    def workers(self) -> list[WorkerInfo]:
        with self.store._conn() as conn:
            return self._workers(conn)

    def _workers(self, conn: psycopg.Connection[Any]) -> list[WorkerInfo]:
        rows = conn.execute(self.store._q(
            "SELECT info FROM {s}.workers ORDER BY worker_id")).fetchall()
        return [msgspec.convert(r[0], WorkerInfo) for r in rows]

    # --- wake-ups --------------------------------------------------------------------

    def _channels(self, cur: psycopg.Cursor[Any]) -> tuple[str, list[str]]:
        """(the channel this role notifies, the channels its workers listen on)."""
        # (A tenant granted by an older release may not read the table: no channel.)
        cur.execute("SELECT has_table_privilege(to_regclass(%s)::oid, 'SELECT')",
                    (sql.Identifier(self.store.schema, CHANNELS_TABLE).as_string(cur),))
        rows: list[tuple[bool, str]] = []
        if cur.fetchone() == (True,):  # row-level security: a tenant reads its own row only
            cur.execute(sql.SQL("SELECT tenant = current_user, channel FROM {}").format(
                sql.Identifier(self.store.schema, CHANNELS_TABLE)))
            rows = cur.fetchall()
        own = [channel for mine, channel in rows if mine]
        if own:
            return own[0], own
        return self.schema_channel, [self.schema_channel, *(channel for _, channel in rows)]

    def _notify(self, cur: psycopg.Cursor[Any]) -> None:
        if self._own is None:
            self._own = self._channels(cur)[0]
        cur.execute(sql.SQL("NOTIFY {}").format(sql.Identifier(self._own)))

    def wake(self) -> None:
        with self.store._write(None) as cur:
            self._notify(cur)

    def wait(self, timeout: float) -> bool:
        """True when woken by a notification; False after ``timeout`` (or when the
        server is away: the caller's poll then finds out, and this reconnects later)."""
        try:
            listener = self._listen()
            woken = any(True for _ in listener.notifies(timeout=timeout, stop_after=1))
            if woken:  # coalesce: whatever else arrived meanwhile says the same
                for _ in listener.notifies(timeout=0.0):
                    pass
            return woken
        except psycopg.Error:
            self._drop_listener()
            time.sleep(min(timeout, 1.0))
            return False

    def _listen(self) -> psycopg.Connection[Any]:
        if self._listener is None or self._listener.closed:
            self._listener = psycopg.connect(self.store.dsn, autocommit=True)
            self._heard = set()
        if not self._heard or self._own == self.schema_channel:  # the admin: new tenants?
            with self._listener.cursor() as cur:
                own, channels = self._channels(cur)
                self._own = own
                for channel in set(channels) - self._heard:
                    cur.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
                    self._heard.add(channel)
        return self._listener

    def _drop_listener(self) -> None:
        if self._listener is not None:
            with contextlib.suppress(psycopg.Error):
                self._listener.close()
            self._listener = None
            self._heard = set()

    def close(self) -> None:
        self._drop_listener()
