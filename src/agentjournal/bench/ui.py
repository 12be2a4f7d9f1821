"""15. The viewer (`agentjournal ui`): pages at scale, and the live tail's latency.

One SQLite store holds 10,000 short runs (one in ``WAITING_EVERY`` waiting for an
approval) and one run of 100,000 events, snapshotted at its end as a long run is
(``Plan.ui_runs``, ``Plan.ui_events``: the same in --quick); the viewer serves it from a
uvicorn thread and is asked over loopback HTTP, as a browser would. Each page is timed
warm (a median) and cold (``_cold``: the first request for it after the viewer starts,
the pages in the order below).

- ``ui.needs_person``: ``/``, every approval waiting across the runs (100 of 10,000),
  HTML. Floor: ``store.outlines(attention=True)`` alone, the one query it cannot avoid.
- ``ui.runs_page``: the first page of ``/runs`` (50 runs of 10,000, HTML; cold: the 50
  runs' outlines, one query). Floor: ``store.list_runs(limit=51)`` alone, the one query
  the page cannot avoid.
- ``ui.run_page``: the latest page of the long run (its state and 100 events, HTML).
  Floor: reading those 100 events from the store.
- ``ui.time_travel``: ``/runs/<long run>/state`` at its last seq (HTML): the state from
  its snapshot, the messages and calls of the last ``WINDOW`` events. Floor: reading
  those events from the store.
- ``ui.call_page``: the page of the long run's last call, from the start its link
  carries (HTML). Floor: reading the call's events, its start to its end.
- ``ui.tail``: from an append returning to the viewer's event stream delivering that
  event to a connected client. Floor: a loopback GET of a static file.

Targets: each page ≤ 300 ms (needs a person, time travel: cold), a call's page ≤ 50 ms
(cold), the tail ≤ 100 ms (absolute).
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
from collections.abc import Callable
from contextlib import closing
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

from ..events import EventType, make_events
from ..snapshots import write_snapshot
from ..state import fold
from ..store import Store, open_store
from ._common import Fact, Figure, Plan, Say, figure, medians, run_facts, workload

TAIL_ROUNDS = 20
LONG_RUN, TAIL_RUN = "bench-long", "bench-tail"
LIST_FLOOR = "store.list_runs(limit=51) alone"
ATTENTION_FLOOR = "store.outlines(attention=True) alone"
#: One short run in this many waits for an approval (the needs-a-person page's items).
WAITING_EVERY = 100


class Call(NamedTuple):
    """A call of the long run: its key, and the seqs of its start and its completion."""

    key: str
    start: int
    end: int


def _short_facts(run_id: str, r: int) -> list[Fact]:
    """A short run's events: a step, and (one run in WAITING_EVERY) an approval asked."""
    facts = list(itertools.islice(run_facts(run_id), 5))
    if r % WAITING_EVERY == 0:
        facts.append((EventType.APPROVAL_REQUESTED, {
            "approval_id": f"approve-{r}", "key": f"refund-{r}", "tool": "refund",
            "args": {"order": f"ord-{r:06d}", "amount": 120}, "reason": "over 100"}))
    return facts


def _fill(store: Store, runs: int, long: int, say: Say) -> Call:
    """Write the runs; the long run's last completed call."""
    say(f"ui: writing {runs:,} runs and one of {long:,} events")
    for r in range(runs):
        run_id = f"run-{r:05d}"
        events = make_events(run_id, 0, 0, _short_facts(run_id, r))
        store.append(run_id, events, expected_seq=0, epoch=0)
    events = workload(LONG_RUN, long)
    for start in range(0, long, 1000):
        batch = events[start:start + 1000]
        store.append(LONG_RUN, batch, expected_seq=start, epoch=0)
    write_snapshot(store, fold(events))
    store.append(TAIL_RUN, workload(TAIL_RUN, 2), expected_seq=0, epoch=0)
    done = next(e for e in reversed(events) if e.type is EventType.TOOL_CALL_COMPLETED)
    return Call(done.payload["idempotency_key"], done.payload["started_seq"], done.seq)


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


#: Each timed page, by figure name: its floor's name and its note (facts filled in later).
PAGES = {
    "needs_person": (ATTENTION_FLOOR, "/, the {waiting} approvals waiting across {runs:,} runs, "
                     "HTML"),
    "runs_page": (LIST_FLOOR, "/runs, first page of {runs:,} runs, HTML"),
    "run_page": ("reading those 100 events",
                 "/runs/{long_run}: state and the latest 100 of {events:,} events, HTML"),
    "time_travel": ("reading those events",
                    "/runs/{long_run}/state at seq {events:,}: its snapshot and the "
                    "messages and calls of the last {window} events, HTML"),
    "call_page": ("reading the call's events, start to end",
                  "/runs/{long_run}/calls/<its last call>?at=<its start>, HTML"),
}


def _paths(call: Call) -> dict[str, str]:
    """Each page's path, by figure name (the order of the cold requests)."""
    return {"needs_person": "/", "runs_page": "/runs", "run_page": f"/runs/{LONG_RUN}",
            "time_travel": f"/runs/{LONG_RUN}/state",
            "call_page": f"/runs/{LONG_RUN}/calls/{call.key}?at={call.start}"}


def _floors(store: Store, last: int, window: int, call: Call) -> dict[str, Callable[[], Any]]:
    """What each page cannot avoid, by figure name: the store read it makes."""
    return {
        "needs_person": lambda: store.outlines(attention=True),
        "runs_page": lambda: store.list_runs(limit=51),
        "run_page": lambda: list(itertools.islice(store.read(LONG_RUN, after_seq=last - 100),
                                                  100)),
        "time_travel": lambda: list(store.read(LONG_RUN, after_seq=last - window)),
        "call_page": lambda: list(store.read(LONG_RUN, after_seq=call.start - 1,
                                             upto=call.end)),
    }


def ui_figures(workdir: Path, plan: Plan, say: Say) -> list[Figure]:
    try:
        from ..ui import Viewer
        from ..ui.server import serve_in_thread
        from ..ui.views import WINDOW
    except ImportError as exc:
        return [figure("ui.runs_page", None, "ms", note=f"skipped: {exc} (the ui extra)")]
    url = f"sqlite:///{workdir / 'ui.db'}?durability=batched"
    with closing(open_store(url)) as store:
        call = _fill(store, plan.ui_runs, plan.ui_events, say)
        paths, floors = _paths(call), _floors(store, plan.ui_events, WINDOW, call)
        viewer = Viewer(url)
        server, thread, port = serve_in_thread(viewer)
        try:
            say(f"ui: pages and the live tail, x {plan.reps}")
            cold = {page: _get_ms(port, path) for page, path in paths.items()}
            timed = medians(plan.reps, [
                *(partial(_get_ms, port, path) for path in paths.values()),
                *(partial(_timed_ms, floors[page]) for page in paths),
                lambda: _get_ms(port, "/static/ui.css")])
            tail = _tail_ms(store, port)
        finally:
            server.should_exit = True
            thread.join(10)
            viewer.close()
    (workdir / "ui.db").unlink(missing_ok=True)
    pages = len(paths)
    warm = dict(zip(paths, timed[:pages], strict=True))
    floor = dict(zip(paths, timed[pages:2 * pages], strict=True))
    facts = {"runs": plan.ui_runs + 2, "long_run": LONG_RUN, "events": plan.ui_events,
             "window": WINDOW, "waiting": -(-plan.ui_runs // WAITING_EVERY)}
    return [
        *(f for page, (floor_name, note) in PAGES.items() for f in (
            figure(f"ui.{page}", warm[page], "ms", floor[page], floor_name,
                   f"{note.format(**facts)}, warm"),
            figure(f"ui.{page}_cold", cold[page], "ms", floor[page], floor_name,
                   f"{note.format(**facts)}, first request after start"))),
        figure("ui.tail", statistics.median(tail), "ms", timed[-1],
               "a loopback GET of a static file",
               f"append returned to the event on the stream, median of {TAIL_ROUNDS}; "
               f"max {max(tail):.1f} ms"),
    ]
