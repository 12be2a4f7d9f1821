"""The queue on SQLite: every worker on one host, each claim one immediate transaction.

Leases are judged as the store judges them (the host's boot clock, see
store/base.py), so the claim reads the candidates and decides in Python while
it holds the database's write lock: no other claim can interleave.
"""

from __future__ import annotations

import sqlite3
import time
import typing
from collections.abc import Sequence

import msgspec

from ..continuation import check_resubmission
from ..store import Lease
from ..store.base import host_clock, lease_left, validate_run_id
from ..store.sqlite import SQLiteStore, last_seq_of
from .queue import (
    LAPSED,
    Claim,
    QueuedRun,
    QueueState,
    Served,
    WorkerInfo,
    check_pin,
    has_stop,
    parked_reason,
    serves,
    stop_line,
    stops_in,
    taken_back,
    unserved,
)

_CANDIDATES = f"""
    SELECT q.run_id, q.state, q.parked_seq, q.agent, q.task, q.queue, q.crashes, q.worker,
           q.reason, q.pin_version, l.epoch, l.expires_at, l.boot_id, l.deadline,
           {last_seq_of("q.run_id")}
    FROM queue q LEFT JOIN leases l ON l.run_id = q.run_id
    WHERE q.state != 'done' {{where}}
    ORDER BY q.priority DESC, q.submitted_at, q.run_id
"""


def _runnable(state: str, parked_seq: int, last_seq: int, left: float) -> bool:
    if state == "queued":
        return True
    if state == "running":
        return left <= 0  # its worker died, or stalled past its lease
    # A person decided, and is done writing (a decision holds the lease while it writes).
    return state in ("waiting", "parked") and last_seq > parked_seq and left <= 0


class SQLiteQueue:
    def __init__(self, store: SQLiteStore) -> None:
        self.store = store

    def submit(self, run_id: str, agent: str, task: str, *, queue: str = "default",
               priority: int = 0, pin_version: str | None = None) -> bool:
        validate_run_id(run_id)
        now = time.time()
        with self.store._tx() as db:
            row = db.execute("SELECT agent, task, pin_version FROM queue WHERE run_id = ?",
                             (run_id,)).fetchone()
            if row is None:
                db.execute("INSERT INTO queue (run_id, queue, priority, agent, task, state,"
                           " submitted_at, changed_at, pin_version)"
                           " VALUES (?, ?, ?, ?, ?, 'queued', ?, ?, ?)",
                           (run_id, queue, priority, agent, task, now, now, pin_version))
                return True
        check_resubmission(self, run_id, (row[0], row[1]), (agent, task))
        check_pin(run_id, row[2], pin_version)
        return False  # the same request again: nothing changes

    def claim(self, owner: str, ttl: float, queues: Sequence[str], *,
              served: Served | None = None) -> Claim | None:
        claims = self.claim_many(owner, ttl, queues, 1, served=served)
        return claims[0] if claims else None

    def claim_many(self, owner: str, ttl: float, queues: Sequence[str], n: int, *,
                   served: Served | None = None) -> list[Claim]:
        marks = ", ".join("?" * len(queues))
        claims: list[Claim] = []
        with self.store._tx() as db:
            wall, (boot, now) = time.time(), host_clock()
            for row in db.execute(_CANDIDATES.format(where=f"AND q.queue IN ({marks})"),
                                  tuple(queues)).fetchall():
                (run_id, state, parked, agent, task, queue, crashes, holder, reason, pin,
                 epoch, expires, boot_id, deadline, last) = row
                left = lease_left(expires, boot_id, deadline, wall, boot, now) if epoch else 0
                # (In the claim's transaction: a pinned run this claimer does not serve is
                # never taken, so never handed back nor parked.)
                if not _runnable(state, parked, last, left) or not serves(served, agent, pin):
                    continue
                if state == "running":  # its holder stopped without handing it back
                    crashes += 1
                    if not has_stop(reason, epoch or 0):  # (one that raised said so)
                        reason = "\n".join(
                            [*stops_in(reason), stop_line(epoch or 0, holder, LAPSED)])
                lease = self._lease(db, run_id, owner, (epoch or 0) + 1, ttl, wall, boot, now,
                                    last)
                db.execute("UPDATE queue SET state = 'running', worker = ?, claims = claims + 1,"
                           " crashes = ?, reason = ?, changed_at = ? WHERE run_id = ?",
                           (owner, crashes, reason, wall, run_id))
                claims.append(Claim(lease=lease, agent=agent, task=task, queue=queue,
                                    crashes=crashes, stops=stops_in(reason), pin_version=pin))
                if len(claims) == n:
                    break
        return claims

    def _lease(self, db: sqlite3.Connection, run_id: str, owner: str, epoch: int, ttl: float,
               wall: float, boot: str, now: float, last: int) -> Lease:
        db.execute("INSERT OR REPLACE INTO leases (run_id, owner, epoch, expires_at, boot_id,"
                   " deadline) VALUES (?, ?, ?, ?, ?, ?)",
                   (run_id, owner, epoch, *self.store._expiry(ttl, wall, boot, now)))
        return Lease(run_id, owner, epoch, wall + ttl, last_seq=last)  # read in this tx

    def hand_back(self, lease: Lease, state: QueueState, at_seq: int,
                  reason: str | None = None) -> bool:
        with self.store._tx() as db:
            if self.store._epoch(db, lease.run_id) != lease.epoch:
                return False  # taken over: the run is another worker's now
            db.execute("UPDATE leases SET expires_at = 0, deadline = 0 WHERE run_id = ?",
                       (lease.run_id,))
            (kept,) = db.execute("SELECT reason FROM queue WHERE run_id = ?",
                                 (lease.run_id,)).fetchone()
            clean = state in ("done", "waiting")  # the run's crashes are forgotten
            reason = None if clean else "\n".join(
                [*([reason] if reason else []), *stops_in(kept)]) or None
            db.execute("UPDATE queue SET state = ?, worker = NULL, parked_seq = ?, crashes ="
                       " CASE WHEN ? THEN 0 ELSE crashes END, reason = ?, changed_at = ?"
                       " WHERE run_id = ?",
                       (state, at_seq, clean, reason, time.time(), lease.run_id))
        return True

    def note_stop(self, lease: Lease, what: str) -> None:
        with self.store._tx() as db:
            if self.store._epoch(db, lease.run_id) != lease.epoch:
                return
            (reason,) = db.execute("SELECT reason FROM queue WHERE run_id = ?",
                                   (lease.run_id,)).fetchone()
            if not has_stop(reason, lease.epoch):
                db.execute("UPDATE queue SET reason = ? WHERE run_id = ?", (
                    "\n".join([*stops_in(reason), stop_line(lease.epoch, lease.owner, what)]),
                    lease.run_id))

    def keep_waiting(self, run_id: str, at_seq: int) -> None:
        with self.store._tx() as db:
            db.execute("UPDATE queue SET parked_seq = ? WHERE run_id = ? AND state = 'waiting'"
                       " AND parked_seq < ?", (at_seq, run_id, at_seq))

    def absolve(self, run_id: str, epoch: int | None = None) -> QueueState | None:
        with self.store._tx() as db:
            row = db.execute("SELECT state, crashes, reason FROM queue WHERE run_id = ?",
                             (run_id,)).fetchone()
            if row is None:
                return None
            state, crashes, reason = row
            after = taken_back(state, crashes, reason, epoch)
            if after is None:
                return None
            db.execute("UPDATE queue SET crashes = ?, reason = ? WHERE run_id = ?",
                       (*after, run_id))
        return typing.cast(QueueState, state)

    def retry(self, run_id: str, *, forget_crashes: bool = True) -> bool:
        with self.store._tx() as db:
            changed = db.execute("UPDATE queue SET state = 'queued', crashes = CASE WHEN ?"
                                 " THEN 0 ELSE crashes END, reason = CASE WHEN ? THEN NULL"
                                 " ELSE reason END, changed_at = ? WHERE run_id = ?"
                                 " AND state IN ('waiting', 'parked')",
                                 (forget_crashes, forget_crashes, time.time(),
                                  run_id)).rowcount
        return bool(changed)

    def runs(self) -> list[QueuedRun]:
        wall, (boot, now) = time.time(), host_clock()
        with self.store._reading() as db:
            rows = db.execute(
                "SELECT q.run_id, q.queue, q.state, q.priority, q.agent, q.worker, q.crashes,"
                " q.claims, q.submitted_at, q.changed_at, q.parked_seq, q.reason,"
                " q.pin_version, l.epoch, l.expires_at,"
                f" l.boot_id, l.deadline, {last_seq_of('q.run_id')} FROM queue q"
                " LEFT JOIN leases l ON l.run_id = q.run_id"
                " ORDER BY q.submitted_at, q.run_id").fetchall()
            workers = self._workers(db)
        out = []
        for (run_id, queue, state, priority, agent, worker, crashes, claims, submitted,
             changed, parked, reason, pin, epoch, expires, boot_id, deadline, last) in rows:
            left = lease_left(expires, boot_id, deadline, wall, boot, now) if epoch else 0
            runnable = _runnable(state, parked, last, left)
            waiting_for = unserved(agent, pin, workers, wall) if runnable else None
            out.append(QueuedRun(
                run_id=run_id, queue=queue, state=state, priority=priority, agent=agent,
                worker=worker, crashes=crashes, claims=claims, submitted_at=submitted,
                changed_at=changed, runnable=runnable,
                reason=parked_reason(state, reason), stops=stops_in(reason),
                pin_version=pin, waiting_for=waiting_for))
        return out

    def pinned_agents(self, queues: Sequence[str]) -> list[str]:
        marks = ", ".join("?" * len(queues))
        with self.store._reading() as db:
            rows = db.execute("SELECT DISTINCT agent FROM queue WHERE state != 'done'"
                              f" AND pin_version IS NOT NULL AND queue IN ({marks})"
                              " ORDER BY agent", tuple(queues)).fetchall()
        return [agent for (agent,) in rows]

    def beat(self, worker: WorkerInfo) -> None:
        with self.store._tx() as db:
            db.execute("INSERT OR REPLACE INTO workers VALUES (?, ?, ?)",
                       (worker.worker_id, msgspec.json.encode(worker), worker.heartbeat_at))

    def forget(self, worker_id: str) -> None:
        with self.store._tx() as db:
            db.execute("DELETE FROM workers WHERE worker_id = ?", (worker_id,))

    def next_expiry(self, queues: Sequence[str]) -> float | None:
        marks = ", ".join("?" * len(queues))
        with self.store._reading() as db:
            rows = db.execute("SELECT l.expires_at, l.boot_id, l.deadline FROM queue q"
                              " JOIN leases l ON l.run_id = q.run_id"
                              f" WHERE q.state = 'running' AND q.queue IN ({marks})",
                              tuple(queues)).fetchall()
        if not rows:
            return None
        wall, (boot, now) = time.time(), host_clock()
        return max(0.0, min(lease_left(expires, boot_id, deadline, wall, boot, now)
                            for expires, boot_id, deadline in rows))

    def workers(self) -> list[WorkerInfo]:
        with self.store._reading() as db:
            return self._workers(db)

    def _workers(self, db: sqlite3.Connection) -> list[WorkerInfo]:
        rows = db.execute("SELECT info FROM workers ORDER BY worker_id").fetchall()
        return [msgspec.json.decode(r[0], type=WorkerInfo) for r in rows]

    def wait(self, timeout: float) -> bool:
        time.sleep(timeout)  # one host, no notifications: the poll is the wake-up
        return False

    def wake(self) -> None:
        pass

    def close(self) -> None:
        pass
