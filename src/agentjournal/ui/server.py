"""Serving the viewer: the store handles it reads and decides through, and uvicorn."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from starlette.applications import Starlette

from ..store import Store, open_store
from .app import create_app
from .views import States


class Viewer:
    """The viewer's app and the store handles behind it; ``close()`` closes them."""

    def __init__(self, store_url: str, *, allow_decisions: bool = False,
                 token: str | None = None, host: str = "127.0.0.1", by: str = "ui",
                 metrics: bool = True) -> None:
        # Decisions write: that handle is opened first and reads too (a SQLite reader
        # opened before a writer of the same process would keep it from writing).
        # Without decisions, nothing can write: the store is opened read-only.
        self.store = open_store(store_url, readonly=not allow_decisions)
        self.states = States(self.store)
        self.app: Starlette = create_app(
            self.store, store_url, allow_decisions=allow_decisions, token=token, host=host,
            by=by, states=self.states,
            metrics=_metrics(self.store) if metrics else None)

    def close(self) -> None:
        self.store.close()


def _metrics(store: Store) -> Callable[[], bytes] | None:
    """``/metrics`` when prometheus_client is installed (the ``[prometheus]`` extra),
    its store gauges from the runs' outlines (``store_counts``: one query a scrape)."""
    try:
        from ..prometheus import JournalCollector, exposition, store_counts
    except ImportError:
        return None
    collector = JournalCollector(counts=lambda: store_counts(store))
    return lambda: exposition(collector)


def open_viewer(store_url: str, **options: Any) -> Viewer:
    return Viewer(store_url, **options)


def serve_in_thread(viewer: Viewer, host: str = "127.0.0.1",
                    port: int = 0) -> tuple[Any, threading.Thread, int]:
    """Serve ``viewer`` from a daemon thread (tests, the bench); returns the uvicorn
    server (``should_exit = True`` stops it), its thread and the bound port."""
    import socket

    import uvicorn

    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)  # connections wait in the backlog until uvicorn accepts them
    config = uvicorn.Config(viewer.app, log_level="warning", lifespan="off",
                            timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True,
                              name="agentjournal-ui")
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    if not server.started:
        raise RuntimeError("the viewer's server did not start")
    return server, thread, sock.getsockname()[1]
