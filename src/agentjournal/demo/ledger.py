"""A small ledger service: the receiver of side effects for crash tests and the demo.

It runs as a separate process on loopback (stdlib only) and counts every effect it
applies, honestly, so a test can assert "exactly once" from the receiver's side.

    python -m agentjournal.demo.ledger --db PATH [--port 0] [--host 127.0.0.1]
                                       [--no-idempotency] [--latency-ms N]

Endpoints (JSON in and out):

- ``GET /health``, ``GET /ledgers``, ``GET /ledgers/{name}``
- ``POST /corrections`` ``{"correction_id", "ledger", "amount", "memo"?}``
- ``GET /corrections/{correction_id}``: the reconcile lookup
- ``POST /tickets`` ``{"ticket_id", "title", "body"}``
- ``GET /effects``: applied rows per id, plus the number of idempotent replays

POSTs honour an ``Idempotency-Key`` header (unless ``--no-idempotency``): a repeated
key with the same body replays the stored response and applies nothing; with a
different body it is refused with 422. A correction of ``amount`` cents closes that
much of its ledger's discrepancy, so a double-applied correction is visible.

POSTs also honour a ``Fencing-Token`` header: the writer's lease epoch (an agent
sends ``ctx.epoch``). The service remembers the newest epoch it has seen for each
identity (a correction id, a ticket id) and refuses a request carrying an older one
with 409, applying nothing: a worker that was paused, lost its lease and woke up
cannot apply an effect after its successor has acted on the same identity. (A
request from the old epoch that arrives before the successor's first request is
not refused; the idempotency key, or the successor's lookup, covers that order.)
"""

from __future__ import annotations

import argparse
import hashlib
import ipaddress
import json
import os
import queue
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType, TracebackType
from typing import IO, Any, cast
from urllib.parse import unquote, urlsplit

__all__ = ["LedgerApp", "LedgerService", "Reply", "http_json", "main"]

MAX_BODY = 1 << 20
READY_PREFIX = "listening on "

# name -> (discrepancy in cents, [(entry_id, posted_on, description, amount in cents)])
SEED: dict[str, tuple[int, list[tuple[str, str, str, int]]]] = {
    "ledger-a": (1250, [
        ("a-001", "2024-01-02", "Opening balance", 1_500_000),
        ("a-002", "2024-02-14", "Vendor payment: Acme Supplies", -231_450),
        ("a-003", "2024-03-29", "Customer receipt: Globex", 487_000),
    ]),
    "ledger-b": (-300, [
        ("b-001", "2024-01-02", "Opening balance", 820_000),
        ("b-002", "2024-01-31", "Payroll", -412_500),
        ("b-003", "2024-03-15", "Bank fee", -2_700),
    ]),
    "ledger-c": (4200, [
        ("c-001", "2024-01-02", "Opening balance", 64_000),
        ("c-002", "2024-02-20", "Refund to Initech", -15_800),
        ("c-003", "2024-03-08", "Card settlement", 93_150),
        ("c-004", "2024-03-30", "FX revaluation", 1_040),
    ]),
}

SCHEMA = """
CREATE TABLE IF NOT EXISTS ledgers (
    name TEXT PRIMARY KEY, discrepancy INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS entries (
    ledger TEXT NOT NULL, entry_id TEXT NOT NULL, posted_on TEXT NOT NULL,
    description TEXT NOT NULL, amount INTEGER NOT NULL, PRIMARY KEY (ledger, entry_id));
CREATE TABLE IF NOT EXISTS applied (
    applied_id INTEGER PRIMARY KEY AUTOINCREMENT, correction_id TEXT NOT NULL,
    ledger TEXT NOT NULL, amount INTEGER NOT NULL, memo TEXT, idempotency_key TEXT,
    applied_at TEXT NOT NULL, epoch INTEGER);
CREATE INDEX IF NOT EXISTS applied_by_id ON applied (correction_id);
CREATE TABLE IF NOT EXISTS tickets (
    filed_id INTEGER PRIMARY KEY AUTOINCREMENT, ticket_id TEXT NOT NULL, title TEXT NOT NULL,
    body TEXT NOT NULL, idempotency_key TEXT, filed_at TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS tickets_by_id ON tickets (ticket_id);
CREATE TABLE IF NOT EXISTS idempotency (
    key TEXT PRIMARY KEY, request_digest TEXT NOT NULL, status INTEGER NOT NULL,
    response TEXT NOT NULL, created_at TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS fences (identity TEXT PRIMARY KEY, epoch INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
"""
FENCING_HEADER = "Fencing-Token"


@dataclass(frozen=True)
class Reply:
    """One HTTP response: status, JSON body bytes, and whether it is a stored replay."""

    status: int
    body: bytes
    replayed: bool = False


def reply(status: int, payload: Mapping[str, Any]) -> Reply:
    return Reply(status, json.dumps(payload, sort_keys=True).encode())


def _now() -> str:
    return datetime.now(UTC).isoformat()


def _digest(path: str, body: Mapping[str, Any]) -> str:
    # Over the parsed body, so key order and whitespace do not make a "different" request.
    canonical = json.dumps([path, body], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _check_fields(
    body: Mapping[str, Any], required: Mapping[str, type], optional: Mapping[str, type]
) -> str | None:
    """Why ``body`` is invalid, or None. bool is not accepted where an int is expected."""
    for name, kind in {**required, **optional}.items():
        if name not in body:
            if name in required:
                return f"missing field {name!r}"
            continue
        value = body[name]
        if isinstance(value, bool) or not isinstance(value, kind):
            return f"field {name!r} must be {kind.__name__}"
        if kind is str and name in required and not value:
            return f"field {name!r} must not be empty"
    return None


def _parse_epoch(token: str | None) -> int | Reply | None:
    if token is None:
        return None
    if not token.isascii() or not token.isdigit():
        return reply(400, {"error": f"{FENCING_HEADER} must be a non-negative integer"})
    return int(token)


def _parse_object(raw: bytes) -> dict[str, Any] | Reply:
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return reply(400, {"error": "malformed JSON"})
    if not isinstance(value, dict):
        return reply(400, {"error": "body must be a JSON object"})
    return value


class LedgerApp:
    """The service's logic, independent of HTTP: each call is one SQLite transaction."""

    def __init__(self, db_path: Path, *, idempotency: bool = True, latency_ms: int = 0) -> None:
        self.db_path = db_path
        self.idempotency = idempotency
        self.latency = latency_ms / 1000

    def _connect(self) -> sqlite3.Connection:
        # A connection per request; timeout is SQLite's busy wait for the write lock.
        conn = sqlite3.connect(self.db_path, isolation_level=None, timeout=30)
        conn.execute("PRAGMA synchronous=FULL")
        return conn

    @contextmanager
    def _tx(self, *, write: bool) -> Iterator[sqlite3.Connection]:
        # BEGIN IMMEDIATE takes the write lock up front, so two requests with the same
        # key serialise: the second one sees the first one's stored response.
        conn = self._connect()
        try:
            conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        finally:
            conn.close()

    def init_db(self) -> None:
        """Create tables and seed the ledgers if missing; idempotent across restarts."""
        conn = self._connect()
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.executescript(SCHEMA)
        finally:
            conn.close()
        with self._tx(write=True) as conn:
            conn.execute("INSERT OR IGNORE INTO counters VALUES ('replays', 0), ('fenced', 0)")
            for name, (discrepancy, entries) in SEED.items():
                conn.execute("INSERT OR IGNORE INTO ledgers VALUES (?, ?)", (name, discrepancy))
                conn.executemany(
                    "INSERT OR IGNORE INTO entries VALUES (?, ?, ?, ?, ?)",
                    [(name, *entry) for entry in entries],
                )

    # -- routing ---------------------------------------------------------------------

    def get(self, path: str) -> Reply:
        parts = [unquote(p) for p in path.strip("/").split("/")]
        match parts:
            case ["health"]:
                return reply(200, {"ok": True})
            case ["effects"]:
                return self.effects()
            case ["ledgers"]:
                return self.ledger_names()
            case ["ledgers", name]:
                time.sleep(self.latency)
                return self.ledger(name)
            case ["corrections", correction_id]:
                return self.correction(correction_id)
            case ["corrections" | "tickets"]:
                return reply(405, {"error": "method not allowed"})
        return reply(404, {"error": "not found", "path": path})

    def post(self, path: str, raw: bytes, key: str | None, token: str | None = None) -> Reply:
        """``token`` is the Fencing-Token header (the writer's epoch), if it sent one."""
        handlers: dict[str, Callable[[dict[str, Any], str | None, int | None], Reply]] = {
            "/corrections": self.post_correction,
            "/tickets": self.post_ticket,
        }
        handler = handlers.get(path.rstrip("/"))
        if handler is None:
            known = path.strip("/").split("/")[0] in {"health", "effects", "ledgers"}
            return reply(405, {"error": "method not allowed"}) if known else reply(
                404, {"error": "not found", "path": path})
        body = _parse_object(raw)
        if isinstance(body, Reply):
            return body
        epoch = _parse_epoch(token)
        if isinstance(epoch, Reply):
            return epoch
        result = handler(body, key or None, epoch)
        # The window a crash test wants: effect committed, response not yet sent.
        time.sleep(self.latency)
        return result

    # -- reads -----------------------------------------------------------------------

    def ledger_names(self) -> Reply:
        with self._tx(write=False) as conn:
            rows = conn.execute("SELECT name FROM ledgers ORDER BY name").fetchall()
        return reply(200, {"ledgers": [name for (name,) in rows]})

    def ledger(self, name: str) -> Reply:
        with self._tx(write=False) as conn:
            row = conn.execute("SELECT discrepancy FROM ledgers WHERE name = ?", (name,)).fetchone()
            if row is None:
                return reply(404, {"error": "unknown ledger", "ledger": name})
            entries = conn.execute(
                "SELECT entry_id, posted_on, description, amount FROM entries"
                " WHERE ledger = ? ORDER BY posted_on, entry_id", (name,)).fetchall()
            corrections = conn.execute(
                "SELECT applied_id, correction_id, amount, memo, applied_at FROM applied"
                " WHERE ledger = ? ORDER BY applied_id", (name,)).fetchall()
        entry_keys = ("entry_id", "posted_on", "description", "amount")
        correction_keys = ("applied_id", "correction_id", "amount", "memo", "applied_at")
        return reply(200, {
            "ledger": name,
            "entries": [dict(zip(entry_keys, e, strict=True)) for e in entries],
            "corrections": [dict(zip(correction_keys, c, strict=True)) for c in corrections],
            # Every applied correction closes its amount, so a double apply shows up here.
            "discrepancy": row[0] - sum(c[2] for c in corrections),
        })

    def correction(self, correction_id: str) -> Reply:
        with self._tx(write=False) as conn:
            row = conn.execute(
                "SELECT ledger, amount, memo, applied_id, epoch,"
                " (SELECT COUNT(*) FROM applied WHERE correction_id = ?)"
                " FROM applied WHERE correction_id = ? ORDER BY applied_id DESC LIMIT 1",
                (correction_id, correction_id)).fetchone()
        if row is None:
            return reply(404, {"error": "not found", "correction_id": correction_id})
        ledger, amount, memo, applied_id, epoch, count = row
        return reply(200, {
            "correction_id": correction_id, "ledger": ledger, "amount": amount, "memo": memo,
            "applied_id": applied_id, "applied_count": count, "epoch": epoch,
        })

    def effects(self) -> Reply:
        with self._tx(write=False) as conn:
            corrections = conn.execute(
                "SELECT correction_id, COUNT(*) FROM applied GROUP BY correction_id").fetchall()
            tickets = conn.execute(
                "SELECT ticket_id, COUNT(*) FROM tickets GROUP BY ticket_id").fetchall()
            counters = dict(conn.execute("SELECT name, value FROM counters").fetchall())
        return reply(200, {
            "corrections": dict(corrections), "tickets": dict(tickets),
            "replays": counters["replays"], "fenced": counters["fenced"],
        })

    # -- effects ---------------------------------------------------------------------

    def post_correction(self, body: dict[str, Any], key: str | None,
                        epoch: int | None = None) -> Reply:
        problem = _check_fields(
            body, {"correction_id": str, "ledger": str, "amount": int}, {"memo": str})
        if problem:
            return reply(400, {"error": problem})

        def apply(conn: sqlite3.Connection, key: str | None) -> Reply:
            known = conn.execute("SELECT 1 FROM ledgers WHERE name = ?", (body["ledger"],))
            if known.fetchone() is None:
                return reply(404, {"error": "unknown ledger", "ledger": body["ledger"]})
            cursor = conn.execute(
                "INSERT INTO applied (correction_id, ledger, amount, memo, idempotency_key,"
                " applied_at, epoch) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (body["correction_id"], body["ledger"], body["amount"], body.get("memo"),
                 key, _now(), epoch))
            return reply(201, {
                "correction_id": body["correction_id"], "ledger": body["ledger"],
                "amount": body["amount"], "applied_id": cursor.lastrowid, "status": "applied",
            })

        identity = f"corrections/{body['correction_id']}"
        return self._idempotent("/corrections", body, key, apply, identity, epoch)

    def post_ticket(self, body: dict[str, Any], key: str | None,
                    epoch: int | None = None) -> Reply:
        problem = _check_fields(body, {"ticket_id": str, "title": str, "body": str}, {})
        if problem:
            return reply(400, {"error": problem})

        def apply(conn: sqlite3.Connection, key: str | None) -> Reply:
            conn.execute(
                "INSERT INTO tickets (ticket_id, title, body, idempotency_key, filed_at)"
                " VALUES (?, ?, ?, ?, ?)",
                (body["ticket_id"], body["title"], body["body"], key, _now()))
            return reply(201, {"ticket_id": body["ticket_id"], "status": "filed"})

        identity = f"tickets/{body['ticket_id']}"
        return self._idempotent("/tickets", body, key, apply, identity, epoch)

    def _idempotent(
        self, path: str, body: dict[str, Any], key: str | None,
        apply: Callable[[sqlite3.Connection, str | None], Reply],
        identity: str, epoch: int | None,
    ) -> Reply:
        """Fence, replay, refuse, or apply, with the key's record in the effect's
        transaction."""
        digest = _digest(path, body)
        with self._tx(write=True) as conn:
            if epoch is not None and (stale := self._fence(conn, identity, epoch)):
                return stale
            if key is not None and self.idempotency:
                stored = conn.execute(
                    "SELECT request_digest, status, response FROM idempotency WHERE key = ?",
                    (key,)).fetchone()
                if stored is not None:
                    return self._replay(conn, digest, stored)
            result = apply(conn, key)
            # Like Stripe, only an executed request is remembered; a refusal is not.
            if key is not None and self.idempotency and result.status < 300:
                conn.execute(
                    "INSERT INTO idempotency VALUES (?, ?, ?, ?, ?)",
                    (key, digest, result.status, result.body.decode(), _now()))
            return result

    @staticmethod
    def _fence(conn: sqlite3.Connection, identity: str, epoch: int) -> Reply | None:
        """A 409 if ``identity`` was seen at a newer epoch; else remember ``epoch``."""
        row = conn.execute("SELECT epoch FROM fences WHERE identity = ?", (identity,)).fetchone()
        if row is not None and row[0] > epoch:
            conn.execute("UPDATE counters SET value = value + 1 WHERE name = 'fenced'")
            return reply(409, {"error": "stale epoch", "epoch": epoch, "current_epoch": row[0],
                               "identity": identity})
        conn.execute("INSERT INTO fences VALUES (?, ?) ON CONFLICT (identity)"
                     " DO UPDATE SET epoch = excluded.epoch", (identity, epoch))
        return None

    @staticmethod
    def _replay(conn: sqlite3.Connection, digest: str, stored: tuple[str, int, str]) -> Reply:
        stored_digest, status, response = stored
        if stored_digest != digest:
            return reply(422, {"error": "idempotency key reused with different parameters"})
        conn.execute("UPDATE counters SET value = value + 1 WHERE name = 'replays'")
        return Reply(status, response.encode(), replayed=True)


# -- HTTP ----------------------------------------------------------------------------


class _Server(ThreadingHTTPServer):
    # Finish in-flight requests on shutdown; the handler timeout bounds a stalled client.
    daemon_threads = False
    block_on_close = True

    def __init__(self, address: tuple[str, int], app: LedgerApp) -> None:
        self.app = app
        super().__init__(address, _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that hangs up (as crash tests do) is not an error worth printing.
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    timeout = 5
    server_version = "agentjournal-ledger/0.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: only unexpected exceptions reach stderr (see _dispatch)

    def do_GET(self) -> None:
        self._dispatch(lambda app, path: app.get(path))

    def do_POST(self) -> None:
        self._dispatch(self._post)

    def _post(self, app: LedgerApp, path: str) -> Reply:
        raw = self._read_body()
        if isinstance(raw, Reply):
            return raw
        return app.post(path, raw, self.headers.get("Idempotency-Key"),
                        self.headers.get(FENCING_HEADER))

    def _read_body(self) -> bytes | Reply:
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            return reply(400, {"error": "invalid Content-Length"})
        if length < 0:
            return reply(400, {"error": "invalid Content-Length"})
        if length > MAX_BODY:
            return reply(413, {"error": "body too large"})
        return self.rfile.read(length)

    def _dispatch(self, handle: Callable[[LedgerApp, str], Reply]) -> None:
        app = cast(_Server, self.server).app
        try:
            result = handle(app, urlsplit(self.path).path)
        except Exception:
            traceback.print_exc(file=sys.stderr)
            result = reply(500, {"error": "internal error"})
        self._send(result)

    def _send(self, result: Reply) -> None:
        self.send_response(result.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(result.body)))
        if result.replayed:
            self.send_header("Idempotent-Replayed", "true")
        self.end_headers()
        self.wfile.write(result.body)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        # Protocol-level errors (bad request line, unsupported method) are JSON too.
        self.close_connection = True
        text = message or self.responses.get(code, ("error",))[0]
        self._send(reply(code, {"error": text}))


# -- command line --------------------------------------------------------------------


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m agentjournal.demo.ledger", description="Run the demo ledger service.")
    parser.add_argument("--db", required=True, type=Path, help="SQLite file (created if missing)")
    parser.add_argument("--host", default="127.0.0.1", help="loopback address only")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--no-idempotency", action="store_true",
                        help="ignore Idempotency-Key: every POST applies again")
    parser.add_argument("--latency-ms", type=int, default=0,
                        help="sleep after each POST commits (and before GET /ledgers)")
    args = parser.parse_args(argv)
    # A test fixture that applies effects on request must never be reachable off-host.
    if not is_loopback(args.host):
        parser.error(f"refusing non-loopback --host {args.host!r}")
    if args.latency_ms < 0:
        parser.error("--latency-ms must be >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    app = LedgerApp(args.db, idempotency=not args.no_idempotency, latency_ms=args.latency_ms)
    app.init_db()
    server_class = _Server6 if ":" in args.host else _Server
    server = server_class((args.host, args.port), app)
    host, port = server.socket.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host

    def on_signal(signum: int, frame: FrameType | None) -> None:
        signal.signal(signum, signal.SIG_DFL)  # a second signal kills outright
        # shutdown() blocks until serve_forever returns, so it cannot run on this thread.
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    print(f"{READY_PREFIX}http://{shown}:{port}", flush=True)
    try:
        server.serve_forever(poll_interval=0.1)
    finally:
        server.server_close()  # joins in-flight requests
    return 0


# -- helpers for tests and the demo --------------------------------------------------


def http_json(
    method: str, url: str, body: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None, timeout: float = 10.0,
) -> tuple[int, dict[str, Any]]:
    """(status, JSON body) for 2xx and 4xx answers.

    Transport errors (URLError, timeouts, ConnectionError) and 5xx propagate: after a
    request was sent, the caller must treat them as "maybe applied".
    """
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    for name, value in (headers or {}).items():
        request.add_header(name, value)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, _json_object(response.read())
    except urllib.error.HTTPError as error:
        if not 400 <= error.code < 500:
            raise
        try:
            return error.code, _json_object(error.read())
        finally:
            error.close()


def _json_object(raw: bytes) -> dict[str, Any]:
    value = json.loads(raw)
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object, got {type(value).__name__}")
    return value


class LedgerService:
    """The ledger service as a real subprocess: ``with LedgerService(db).start() as svc``."""

    def __init__(self, db_path: str | os.PathLike[str], *, idempotency: bool = True,
                 latency_ms: int = 0) -> None:
        self.db_path = Path(db_path)
        self.idempotency = idempotency
        self.latency_ms = latency_ms
        self.url = ""
        self.process: subprocess.Popen[str] | None = None
        self._stderr: IO[bytes] | None = None

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "agentjournal.demo.ledger", "--db", str(self.db_path),
               "--port", "0", "--latency-ms", str(self.latency_ms)]
        return cmd if self.idempotency else [*cmd, "--no-idempotency"]

    def start(self) -> LedgerService:
        if self.process is not None and self.process.poll() is None:
            raise RuntimeError("ledger service already running")
        # stderr goes to a file: a pipe nobody drains could block the server.
        if self._stderr is not None:
            self._stderr.close()
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the service
        self.process = subprocess.Popen(
            self.command(), stdout=subprocess.PIPE, stderr=self._stderr, text=True,
            env=_env_with_src())
        line = _read_line(self.process, timeout=20.0)
        if line is None or not line.startswith(READY_PREFIX):
            self.stop()
            raise RuntimeError(f"ledger service failed to start: {line!r}\n{self.stderr()}")
        self.url = line.removeprefix(READY_PREFIX).strip()
        return self

    def stderr(self) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")

    def effects(self) -> dict[str, Any]:
        status, body = http_json("GET", f"{self.url}/effects")
        if status != 200:
            raise RuntimeError(f"GET /effects answered {status}: {body}")
        return body

    def stop(self) -> None:
        process = self.process
        if process is None:
            return
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if process.stdout is not None:
            process.stdout.close()

    def __enter__(self) -> LedgerService:
        return self if self.process is not None and self.process.poll() is None else self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def _env_with_src() -> dict[str, str]:
    # The child must import this same package even when it is not installed.
    src = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    return env


def _read_line(process: subprocess.Popen[str], timeout: float) -> str | None:
    """The child's first stdout line, or None on timeout or early exit."""
    lines: queue.Queue[str] = queue.Queue()
    stdout = process.stdout
    assert stdout is not None
    threading.Thread(target=lambda: lines.put(stdout.readline()), daemon=True).start()
    try:
        return lines.get(timeout=timeout) or None
    except queue.Empty:
        return None


if __name__ == "__main__":
    sys.exit(main())
