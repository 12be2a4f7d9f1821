"""15. The viewer (`agentjournal ui`): pages at scale, and the live tail's latency.

One SQLite store holds 10,000 short runs and one run of 100,000 events, snapshotted at
its end as a long run is (``Plan.ui_runs``, ``Plan.ui_events``: the same in --quick);
the viewer serves it from a uvicorn thread and is asked over loopback HTTP, as a
browser would.

- ``ui.runs_page``: the first page of ``/runs`` (50 runs of 10,000, HTML), warm and
  cold (the first request after start: the 50 runs' outlines, one query). Floor:
  ``store.list_runs(limit=51)`` alone, the one query the page cannot avoid.
- ``ui.run_page``: the latest page of the long run (its state and 100 events, HTML),
  warm and cold. Floor: reading those 100 events from the store.
- ``ui.tail``: from an append returning to the viewer's event stream delivering that
  event to a connected client. Floor: a loopback GET of a static file.

Targets: each page ≤ 300 ms, the tail ≤ 100 ms (absolute).
"""

from __future__ import annotations

import contextlib
import http.client
import itertools
import random
import socket
import statistics
import threading
import time
from contextlib import closing
from pathlib import Path
from typing import Any

from ..events import EventType, make_events
from ..snapshots import write_snapshot
from ..state import fold
from ..store import Store, open_store
from ._common import Figure, Plan, Say, figure, medians, run_facts, workload

TAIL_ROUNDS = 20
LONG_RUN, TAIL_RUN = "bench-long", "bench-tail"
LIST_FLOOR = "store.list_runs(limit=51) alone"


def _fill(store: Store, runs: int, long: int, say: Say) -> None:
    say(f"ui: writing {runs:,} runs and one of {long:,} events")
    for r in range(runs):
        run_id = f"run-{r:05d}"
        events = make_events(run_id, 0, 0, itertools.islice(run_facts(run_id), 5))
        store.append(run_id, events, expected_seq=0, epoch=0)
    events = workload(LONG_RUN, long)
    for start in range(0, long, 1000):
        batch = events[start:start + 1000]
        store.append(LONG_RUN, batch, expected_seq=start, epoch=0)
    write_snapshot(store, fold(events))
    store.append(TAIL_RUN, workload(TAIL_RUN, 2), expected_seq=0, epoch=0)


def _get_ms(port: int, path: str) -> float:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        start = time.perf_counter()
        conn.request("GET", path)
        answer = conn.getresponse()
        body = answer.read()
        elapsed = (time.perf_counter() - start) * 1000
    finally:
        conn.close()
    if answer.status != 200 or not body:
        raise RuntimeError(f"GET {path} answered {answer.status}")
    return elapsed


def _timed_ms(fn: Any) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000


class _Tail:
    """A client on the long-lived event stream, noting when each new seq arrives."""

    def __init__(self, port: int, after: int) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        self.conn.request("GET", f"/runs/{TAIL_RUN}/tail?after={after}")
        self.sock = self.conn.sock  # the stream's socket: shut down to end the reader
        self.answer = self.conn.getresponse()
        self.arrived: dict[int, float] = {}
        self.changed = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        # close() ends the read with one of these: http.client cannot stop a read cleanly.
        with contextlib.suppress(OSError, AttributeError, ValueError):
            self._lines()

    def _lines(self) -> None:
        event = ""
        for raw in self.answer:
            line = raw.decode().rstrip("\n")
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: ") and event == "seq":
                with self.changed:
                    self.arrived[int(line[6:])] = time.perf_counter()
                    self.changed.notify_all()

    def wait_for(self, seq: int) -> float:
        with self.changed:
            if not self.changed.wait_for(lambda: seq in self.arrived, timeout=30):
                raise RuntimeError(f"the tail never delivered seq {seq}")
            return self.arrived[seq]

    def close(self) -> None:
        # The reader holds the response's buffer while it waits for the next line: the
        # socket is shut down first, so that wait ends now, not at the next keepalive.
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.conn.close()


def _tail_ms(store: Store, port: int) -> list[float]:
    last = store.last_seq(TAIL_RUN)
    tail = _Tail(port, last)
    latencies = []
    pause = random.Random(29)
    try:
        for _ in range(TAIL_ROUNDS):
            # At a random moment, not right after the last delivery (the stream polls
            # again at once then, which would flatter the figure).
            time.sleep(pause.uniform(0, 0.05))
            (event,) = make_events(TAIL_RUN, last, 0, [(EventType.USER_MESSAGE,
                                                        {"content": "more"})])
            store.append(TAIL_RUN, [event], expected_seq=last, epoch=0)
            appended = time.perf_counter()
            last += 1
            latencies.append((tail.wait_for(last) - appended) * 1000)
    finally:
        tail.close()
    return latencies


def ui_figures(workdir: Path, plan: Plan, say: Say) -> list[Figure]:
    try:
        from ..ui import Viewer
        from ..ui.server import serve_in_thread
    except ImportError as exc:
        return [figure("ui.runs_page", None, "ms", note=f"skipped: {exc} (the ui extra)")]
    url = f"sqlite:///{workdir / 'ui.db'}?durability=batched"
    with closing(open_store(url)) as store:
        _fill(store, plan.ui_runs, plan.ui_events, say)
        viewer = Viewer(url)
        server, thread, port = serve_in_thread(viewer)
        try:
            say(f"ui: pages and the live tail, x {plan.reps}")
            long_path = f"/runs/{LONG_RUN}"
            runs_cold, run_cold = _get_ms(port, "/runs"), _get_ms(port, long_path)
            runs_warm, run_warm, list_floor, read_floor, static = medians(plan.reps, [
                lambda: _get_ms(port, "/runs"), lambda: _get_ms(port, long_path),
                lambda: _timed_ms(lambda: store.list_runs(limit=51)),
                lambda: _timed_ms(lambda: list(itertools.islice(
                    store.read(LONG_RUN, after_seq=plan.ui_events - 100), 100))),
                lambda: _get_ms(port, "/static/ui.css")])
            tail = _tail_ms(store, port)
        finally:
            server.should_exit = True
            thread.join(10)
            viewer.close()
    (workdir / "ui.db").unlink(missing_ok=True)
    runs_note = f"/runs, first page of {plan.ui_runs + 2:,} runs, HTML"
    run_note = f"/runs/{LONG_RUN}: state and the latest 100 of {plan.ui_events:,} events, HTML"
    return [
        figure("ui.runs_page", runs_warm, "ms", list_floor, LIST_FLOOR, f"{runs_note}, warm"),
        figure("ui.runs_page_cold", runs_cold, "ms", list_floor, LIST_FLOOR,
               f"{runs_note}, first request (the outlines of the runs shown)"),
        figure("ui.run_page", run_warm, "ms", read_floor, "reading those 100 events",
               f"{run_note}, warm"),
        figure("ui.run_page_cold", run_cold, "ms", read_floor, "reading those 100 events",
               f"{run_note}, first request (loads the snapshot)"),
        figure("ui.tail", statistics.median(tail), "ms", static,
               "a loopback GET of a static file",
               f"append returned to the event on the stream, median of {TAIL_ROUNDS}; "
               f"max {max(tail):.1f} ms"),
    ]
