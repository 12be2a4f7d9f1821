"""One metrics interface for replay, snapshots and recovery.

Counters only grow; gauges hold the latest value; timings keep a count, a sum
and the maximum. ``METRICS`` is the process-wide registry the library writes
to; an exporter (Prometheus, OpenTelemetry, logs) reads ``snapshot()``.

Names used by the library:

    events_replayed                      counter  events folded while opening runs
    replay_duration_ms                   timing   time to fold a run's log (or its tail)
    snapshot_load_ms                     timing   time to read, check and decode a snapshot
    snapshot_write_ms                    timing   time to encode and publish a snapshot
    snapshot_seq_gap                     gauge    events replayed after the last snapshot used
    snapshot_misses                      counter  snapshots refused (digest, version, gap, ...)
    full_replay_equivalence_failures     counter  verify: snapshot+tail differed from full replay
    uncertain_opened                     counter  calls a tool left uncertain (a timeout)
    uncertain_checked                    counter  uncertain calls recovery examined on open
    uncertain_found|absent|retry         counter  settled automatically, by verdict
    uncertain_conflict|unknown           counter  left for a person, by verdict
    uncertain_handed_to_a_person         counter  calls listed when a run paused for a person

The recovery metrics (events_replayed, replay_duration_ms, snapshot_load_ms,
snapshot_write_ms, snapshot_seq_gap, full_replay_equivalence_failures) are
also kept per ``schema_version`` label: the log and fold version of the release
that did the work, or for a snapshot the version it was written with. A fleet
in the middle of an upgrade shows old and new side by side. ``snapshot()``
gives each labelled series as ``name{label="value"}`` beside the name's total;
``prometheus()`` renders the same in Prometheus' text format (`agentjournal
worker --metrics-port` serves it).

Calls still open and the age of the oldest by risk class are read from the
runs themselves: `agentjournal uncertain`.
"""

from __future__ import annotations

import functools
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported when serving: http.server costs every process ~20 ms
    from http.server import ThreadingHTTPServer

Labels = tuple[tuple[str, str], ...]


def _series(name: str, labels: Labels) -> str:
    if not labels:
        return name
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in labels) + "}"


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: dict[tuple[str, Labels], float] = {}
        self._gauges: dict[tuple[str, Labels], float] = {}
        self._timings: dict[tuple[str, Labels], list[float]] = {}  # [count, sum, max]

    @staticmethod
    def _keys(name: str, labels: dict[str, Any]) -> list[tuple[str, Labels]]:
        """The series a value goes to: the name's total, and its labelled series."""
        if not labels:
            return [(name, ())]
        return [(name, ()), (name, tuple(sorted((k, str(v)) for k, v in labels.items())))]

    def count(self, name: str, value: float = 1, **labels: Any) -> None:
        with self._lock:
            for key in self._keys(name, labels):
                self._counters[key] = self._counters.get(key, 0) + value

    def gauge(self, name: str, value: float, **labels: Any) -> None:
        with self._lock:
            for key in self._keys(name, labels):
                self._gauges[key] = value

    def time(self, name: str, ms: float, **labels: Any) -> None:
        with self._lock:
            for key in self._keys(name, labels):
                t = self._timings.setdefault(key, [0, 0.0, 0.0])
                t[0] += 1
                t[1] += ms
                t[2] = max(t[2], ms)

    def snapshot(self) -> dict[str, Any]:
        """Every series as plain data: counters and gauges by name, timings as dicts;
        a labelled series as ``name{label="value"}``."""
        with self._lock:
            timings = {_series(*k): {"count": int(c), "sum_ms": s, "max_ms": m}
                       for k, (c, s, m) in self._timings.items()}
            plain = {_series(*k): v for k, v in [*self._counters.items(),
                                                  *self._gauges.items()]}
            return {**plain, **timings}

    def prometheus(self, prefix: str = "agentjournal_") -> str:
        """Every metric in Prometheus' text exposition format: a name kept per label by
        its labelled series (a query sums them), any other name by its total."""
        with self._lock:
            counters, gauges = dict(self._counters), dict(self._gauges)
            timings = {k: list(v) for k, v in self._timings.items()}
        lines: list[str] = []
        for kind, series in (("counter", counters), ("gauge", gauges)):
            suffix = "_total" if kind == "counter" else ""
            for name in sorted({n for n, _ in series}):
                metric = f"{prefix}{name}{suffix}"
                lines.append(f"# TYPE {metric} {kind}")
                lines += [f"{_series(metric, labels)} {value:g}"
                          for labels, value in _exposed(series, name)]
        for name in sorted({n for n, _ in timings}):
            metric = f"{prefix}{name}"
            lines.append(f"# TYPE {metric} summary")
            for labels, (count, total, peak) in _exposed(timings, name):
                lines += [f"{_series(metric + '_count', labels)} {count:g}",
                          f"{_series(metric + '_sum', labels)} {total:g}",
                          f"{_series(metric + '_max', labels)} {peak:g}"]
        return "\n".join(lines) + "\n"

    def reset(self) -> None:
        with self._lock:
            self._counters.clear()
            self._gauges.clear()
            self._timings.clear()


def _exposed(series: dict[tuple[str, Labels], Any], name: str) -> list[tuple[Labels, Any]]:
    """A name's labelled series, or its total when it has none (Prometheus sums them)."""
    labelled = sorted((labels, v) for (n, labels), v in series.items() if n == name and labels)
    return labelled or [((), series[(name, ())])]


METRICS = Metrics()


@functools.cache
def _exposition() -> type:
    """The request handler of ``/metrics``."""
    from http.server import BaseHTTPRequestHandler

    class Exposition(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404, "metrics are at /metrics")
                return
            body = METRICS.prometheus().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # a scrape every few seconds is not news

    return Exposition


def serve(host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    """Serve ``/metrics`` (Prometheus text) from a daemon thread; returns the server
    (``server.server_address`` has the port when 0 asked for any free one)."""
    from http.server import ThreadingHTTPServer

    server = ThreadingHTTPServer((host, port), _exposition())
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="agentjournal-metrics",
                     daemon=True).start()
    return server
