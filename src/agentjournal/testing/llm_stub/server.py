"""A loopback HTTP server speaking Chat Completions, Responses and Anthropic Messages.

Stdlib only. Replies come from one shared script, consumed in order by whichever endpoint
asks; a request that fails validation is answered 400 and consumes nothing.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, NamedTuple
from urllib.parse import urlsplit

from .validate import check_chat, check_messages, check_responses
from .wire import (
    Drop,
    Fail,
    Hang,
    Json,
    Memory,
    Outcome,
    Reply,
    ScriptItem,
    anthropic_error,
    openai_error,
    render_chat,
    render_message,
    render_response,
    response_events,
)

COUNT_KEYS = (
    "chat",
    "responses_create",
    "responses_retrieve",
    "responses_cancel",
    "messages",
    "created",  # responses created in background mode
    "rejected",
    "failed",
    "dropped",
)


class Rejection(NamedTuple):
    path: str
    reason: str


@dataclass
class _Stored:
    """A Response kept for GET: background ones report in_progress until ``ready_at``."""

    final: Json
    ready_at: float
    cancelled: bool = False

    def view(self, now: float) -> Json:
        if self.cancelled:
            return {**self.final, "status": "cancelled", "output": [], "usage": None}
        if now < self.ready_at:
            pending: Json = {"output": [], "usage": None, "incomplete_details": None}
            return {**self.final, **pending, "status": "in_progress"}
        return self.final


class StubServer:
    """``with StubServer() as stub:`` then point SDK clients at ``stub.url``."""

    def __init__(
        self,
        script: Iterable[ScriptItem] = (),
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        retrieve: bool = True,
    ) -> None:
        #: False: as several OpenAI-compatible servers, a background response is completed
        #: inside its create call, and there is no retrieve (or cancel) endpoint: 404.
        self.retrieve = retrieve
        self.requests: list[tuple[str, Json, dict[str, str]]] = []
        self.counts: dict[str, int] = dict.fromkeys(COUNT_KEYS, 0)
        self.rejections: list[Rejection] = []
        self.errors: list[str] = []  # script callables that raised
        self.memory = Memory()
        self.lock = threading.RLock()
        self.stopping = threading.Event()
        self._script: deque[ScriptItem] = deque(script)
        self._stored: dict[str, _Stored] = {}
        self._conns: set[socket.socket] = set()
        self._httpd = _HTTPServer((host, port), _Handler, self)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def script(self, items: Iterable[ScriptItem]) -> None:
        """Append replies; once all are consumed, every answer is the text "done"."""
        with self.lock:
            self._script.extend(items)

    def start(self) -> StubServer:
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )
        self._thread.start()
        return self

    def close(self) -> None:
        self.stopping.set()
        if self._thread:
            self._httpd.shutdown()
            self._thread.join(timeout=5)
        # Keep-alive connections would otherwise park handler threads until the client leaves.
        with self.lock:
            conns = list(self._conns)
        for conn in conns:
            _shut(conn)
        self._httpd.server_close()

    def __enter__(self) -> StubServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- used by the handler ---

    def next_outcome(self, body: Json) -> Outcome:
        with self.lock:
            item = self._script.popleft() if self._script else Reply(text="done")
        if isinstance(item, Reply | Fail | Drop | Hang):
            return item
        try:
            outcome = item(body)
            if not isinstance(outcome, Reply | Fail | Drop | Hang):
                raise TypeError(f"script callable returned {outcome!r}, not a Reply/Fail/Drop/Hang")
        except Exception as exc:  # a broken test callable must surface, not hang the client
            with self.lock:
                self.errors.append(repr(exc))
            return Fail(500, message=f"stub script callable raised {exc!r}")
        return outcome

    def sleep(self, seconds: float) -> bool:
        """Sleep in small steps; False when the server is shutting down meanwhile."""
        return not self.stopping.wait(seconds) if seconds > 0 else True

    def count(self, key: str) -> None:
        with self.lock:
            self.counts[key] = self.counts.get(key, 0) + 1

    def store(self, response: Json, ready_at: float = 0.0) -> None:
        with self.lock:
            self._stored[response["id"]] = _Stored(response, ready_at)

    def stored(self, response_id: str) -> _Stored | None:
        with self.lock:
            return self._stored.get(response_id)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], handler: type[_Handler], stub: StubServer):
        self.stub = stub
        super().__init__(address, handler)


def _shut(conn: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already closed by the peer
        conn.shutdown(socket.SHUT_RDWR)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the SDKs' httpx pools expect
    disable_nagle_algorithm = True  # headers and body are two writes: no delayed-ACK stall
    server: _HTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep test output quiet

    def setup(self) -> None:
        super().setup()
        with self.server.stub.lock:
            self.server.stub._conns.add(self.connection)

    def finish(self) -> None:
        with self.server.stub.lock:
            self.server.stub._conns.discard(self.connection)
        super().finish()

    @property
    def stub(self) -> StubServer:
        return self.server.stub

    @property
    def anthropic(self) -> bool:
        return self.path.startswith("/v1/messages")

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def _dispatch(self, method: str) -> None:
        path = urlsplit(self.path).path
        body, bad_json = self._read_body()
        with self.stub.lock:
            headers = {k.lower(): v for k, v in self.headers.items()}
            self.stub.requests.append((path, body, headers))
        parts = path.strip("/").split("/")
        if bad_json:
            self._reject(path, "We could not parse the JSON body of your request.")
        elif (method, path) == ("POST", "/v1/chat/completions"):
            self._generate("chat", body, lambda: check_chat(body), render_chat)
        elif (method, path) == ("POST", "/v1/messages"):
            check = lambda: check_messages(body, self.stub.memory)  # noqa: E731
            self._generate("messages", body, check, render_message)
        elif (method, path) == ("POST", "/v1/responses"):
            check = lambda: check_responses(body, self.stub.memory)  # noqa: E731
            self._generate("responses_create", body, check, render_response)
        elif not self.stub.retrieve and parts[:2] == ["v1", "responses"]:
            self._error(404, f"Unknown route {method} {path}")
        elif method == "GET" and len(parts) == 3 and parts[:2] == ["v1", "responses"]:
            self._retrieve(parts[2])
        elif method == "POST" and len(parts) == 4 and parts[1::2] == ["responses", "cancel"]:
            self._cancel(parts[2])
        else:
            self._error(404, f"Unknown route {method} {path}")

    def _read_body(self) -> tuple[Json, bool]:
        raw = self.rfile.read(int(self.headers.get("content-length") or 0))
        if not raw:
            return {}, False
        try:
            body = json.loads(raw)
        except ValueError:
            return {}, True
        return (body, False) if isinstance(body, dict) else ({}, True)

    def _generate(
        self,
        key: str,
        body: Json,
        check: Callable[[], str | None],
        render: Callable[[Reply, Json, Memory], Json],
    ) -> None:
        self.stub.count(key)
        streamed = bool(body.get("stream"))
        with self.stub.lock:
            reason = ("stub: streaming is supported for /v1/responses only"
                      if streamed and key != "responses_create" else check())
        if reason:
            self._reject(self.path, reason)
            return
        outcome = self.stub.next_outcome(body)
        if not isinstance(outcome, Reply):
            self._misbehave(outcome)
            return
        background = key == "responses_create" and bool(body.get("background"))
        if not (background and self.stub.retrieve) and not self.stub.sleep(outcome.delay):
            self._drop()
            return
        with self.stub.lock:
            payload = render(outcome, body, self.stub.memory)
        if key == "responses_create":
            payload = self._keep_response(payload, body, outcome.delay)
        if streamed:
            self._send_events(response_events(payload))
        else:
            self._send(200, payload)

    def _keep_response(self, response: Json, body: Json, delay: float) -> Json:
        if not body.get("background"):
            if body.get("store") is not False:
                self.stub.store(response)
            return response
        self.stub.count("created")
        if not self.stub.retrieve:  # answered in the create call, kept nowhere
            return response
        self.stub.store(response, ready_at=time.monotonic() + delay)
        return {**response, "status": "queued", "output": [], "usage": None}

    def _retrieve(self, response_id: str) -> None:
        self.stub.count("responses_retrieve")
        stored = self.stub.stored(response_id)
        if stored is None:
            self._error(404, f"Response with id '{response_id}' not found.")
        else:
            self._send(200, stored.view(time.monotonic()))

    def _cancel(self, response_id: str) -> None:
        self.stub.count("responses_cancel")
        stored = self.stub.stored(response_id)
        if stored is None:
            self._error(404, f"Response with id '{response_id}' not found.")
        elif not stored.final.get("background"):
            self._error(400, "Only responses created with background=true can be cancelled.")
        else:
            with self.stub.lock:
                # A response that already finished stays finished, as the real API keeps it.
                if stored.cancelled or time.monotonic() < stored.ready_at:
                    stored.cancelled = True
            self._send(200, stored.view(time.monotonic()))

    def _misbehave(self, outcome: Fail | Drop | Hang) -> None:
        if isinstance(outcome, Fail):
            self.stub.count("failed")
            self._error(outcome.status, outcome.message, outcome.type, _retry_headers(outcome))
            return
        if isinstance(outcome, Hang):
            self.stub.sleep(outcome.seconds)
        self.stub.count("dropped")
        self._drop()

    def _reject(self, path: str, reason: str) -> None:
        with self.stub.lock:
            self.stub.rejections.append(Rejection(urlsplit(path).path, reason))
        self.stub.count("rejected")
        self._error(400, reason)

    def _error(
        self,
        status: int,
        message: str,
        kind: str | None = None,
        headers: Iterable[tuple[str, str]] = (),
    ) -> None:
        if self.anthropic:
            body = anthropic_error(status, message, kind)
        else:
            body = openai_error(status, message, kind)
        self._send(status, body, headers)

    def _send(self, status: int, payload: Json, headers: Iterable[tuple[str, str]] = ()) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        request_id = Memory.new_id("req_")
        self.send_header("request-id" if self.anthropic else "x-request-id", request_id)
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _send_events(self, events: list[Json]) -> None:
        """Server-sent events, the body ending with the connection (as a stream may)."""
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("x-request-id", Memory.new_id("req_"))
        self.send_header("connection", "close")
        self.end_headers()
        for event in events:
            self.wfile.write(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode())
        self.close_connection = True

    def _drop(self) -> None:
        self.close_connection = True
        _shut(self.connection)


def _retry_headers(fail: Fail) -> Iterator[tuple[str, str]]:
    if fail.retry_after is not None:
        yield "retry-after", str(fail.retry_after)
    if fail.retry_after_ms is not None:
        yield "retry-after-ms", str(fail.retry_after_ms)
