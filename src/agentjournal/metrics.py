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

Calls still open and the age of the oldest by risk class are read from the
runs themselves: `agentjournal uncertain`.
"""

from __future__ import annotations

import threading
from typing import Any


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: dict[str, float] = {}
        self._gauges: dict[str, float] = {}
        self._timings: dict[str, list[float]] = {}  # name -> [count, sum, max]

    def count(self, name: str, value: float = 1) -> None:
        with self._lock:
            self._counters[name] = self._counters.get(name, 0) + value

    def gauge(self, name: str, value: float) -> None:
        with self._lock:
            self._gauges[name] = value

    def time(self, name: str, ms: float) -> None:
        with self._lock:
            t = self._timings.setdefault(name, [0, 0.0, 0.0])
            t[0] += 1
            t[1] += ms
            t[2] = max(t[2], ms)

    def snapshot(self) -> dict[str, Any]:
        """Every metric as plain data: counters and gauges by name, timings as dicts."""
        with self._lock:
            timings = {k: {"count": int(c), "sum_ms": s, "max_ms": m}
                       for k, (c, s, m) in self._timings.items()}
            return {**self._counters, **self._gauges, **timings}

    def reset(self) -> None:
        with self._lock:
            self._counters.clear()
            self._gauges.clear()
            self._timings.clear()


METRICS = Metrics()
