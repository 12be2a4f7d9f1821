"""Prometheus metrics (the ``[prometheus]`` extra): a collector read at scrape time.

:class:`JournalCollector` turns ``METRICS.snapshot()`` (metrics.py: what this process
did: replays, snapshots, reconcile verdicts, fleet workers) into Prometheus families,
and, given a store, adds what waits in it now: open uncertain calls by effect class,
approvals and escalations waiting for a person, runs by status, events stored. Nothing
is counted on the hot path; a scrape reads what is already there.

Names: the ``agentjournal_`` prefix, base units (a ``*_ms`` timing becomes a
``*_seconds`` summary plus a ``*_max_seconds`` gauge), ``_total`` on counters, and no
run id label (one series per run would grow without bound). The uncertain queue by
verdict is ``agentjournal_uncertain_verdicts_total{verdict=...}``, every verdict always
present (0 until one is given), so an alert on ``conflict`` works on a fresh process.

    from prometheus_client import CollectorRegistry, generate_latest
    registry = CollectorRegistry()
    registry.register(JournalCollector(store=store))
    print(generate_latest(registry).decode())
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from .errors import JournalError, MissingExtraError
from .metrics import METRICS, Metrics
from .state import RunState
from .store import RunInfo, Store

try:
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        Metric,
        SummaryMetricFamily,
    )
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise MissingExtraError("prometheus", "prometheus_client") from exc

PREFIX = "agentjournal_"
#: Verdicts a reconcile can give an uncertain call (settle.py): the first three settle
#: it automatically, the last two leave it for a person.
VERDICTS = ("found", "absent", "retry", "conflict", "unknown")
_SERIES = re.compile(r'^(?P<name>[a-z_]+)(?:\{(?P<labels>.*)\})?$')
_LABEL = re.compile(r'(\w+)="([^"]*)"')

#: What waits in a store now, counted at scrape time (see :func:`store_counts`).
StoreCounts = Callable[[], dict[str, Any]]


class JournalCollector:
    """Prometheus families for ``metrics`` (default: the process's ``METRICS``) and,
    when ``store`` (or ``counts``) is given, for what waits in the store now."""

    def __init__(self, metrics: Metrics = METRICS, store: Store | None = None,
                 counts: StoreCounts | None = None) -> None:
        self.metrics = metrics
        self.counts = counts or ((lambda: store_counts(store)) if store is not None else None)

    def describe(self) -> list[Metric]:
        return []  # families vary with what happened: no fixed description

    def collect(self) -> Iterator[Metric]:
        snapshot = self.metrics.snapshot()
        yield from _verdicts(snapshot)
        yield from _from_snapshot(snapshot)
        if self.counts is not None:
            yield from _from_store(self.counts())


def _parse(series: str) -> tuple[str, dict[str, str]]:
    m = _SERIES.match(series)
    if m is None:
        return series, {}
    return m["name"], dict(_LABEL.findall(m["labels"] or ""))


def _grouped(snapshot: dict[str, Any]) -> dict[str, list[tuple[dict[str, str], Any]]]:
    """Each name's series: its labelled ones when it has any, else its total (a query
    sums the labelled ones; exposing both would count twice)."""
    by_name: dict[str, list[tuple[dict[str, str], Any]]] = {}
    for series, value in snapshot.items():
        name, labels = _parse(series)
        by_name.setdefault(name, []).append((labels, value))
    return {name: ([s for s in rows if s[0]] or rows) for name, rows in by_name.items()}


def _verdicts(snapshot: dict[str, Any]) -> Iterator[Metric]:
    family = CounterMetricFamily(f"{PREFIX}uncertain_verdicts",
                                 "Uncertain calls reconciled, by verdict (found, absent and "
                                 "retry settle automatically; conflict and unknown wait for "
                                 "a person)", labels=["verdict"])
    for verdict in VERDICTS:
        family.add_metric([verdict], float(snapshot.get(f"uncertain_{verdict}", 0)))
    yield family


def _from_snapshot(snapshot: dict[str, Any]) -> Iterator[Metric]:
    for name, series in sorted(_grouped(snapshot).items()):
        if name.removeprefix("uncertain_") in VERDICTS:
            continue  # in uncertain_verdicts
        labels = sorted({k for lab, _ in series for k in lab})
        if isinstance(series[0][1], dict):
            yield from _timing(name, labels, series)
        else:
            kind = GaugeMetricFamily if name in _GAUGES else CounterMetricFamily
            family = kind(PREFIX + name, _help(name), labels=labels)
            for lab, value in series:
                family.add_metric([lab.get(k, "") for k in labels], float(value))
            yield family


def _timing(name: str, labels: list[str],
            series: list[tuple[dict[str, str], Any]]) -> Iterator[Metric]:
    base = name.removesuffix("_ms") + "_seconds"
    summary = SummaryMetricFamily(PREFIX + base, _help(name), labels=labels)
    peak = GaugeMetricFamily(PREFIX + base.removesuffix("_seconds") + "_max_seconds",
                             f"The longest: {_help(name)}", labels=labels)
    for lab, t in series:
        values = [lab.get(k, "") for k in labels]
        summary.add_metric(values, count_value=t["count"], sum_value=t["sum_ms"] / 1000)
        peak.add_metric(values, t["max_ms"] / 1000)
    yield summary
    yield peak


#: Names metrics.py keeps as gauges (everything else the library writes is a counter;
#: its snapshot does not say which, so a new gauge is added here).
_GAUGES = frozenset({"snapshot_seq_gap", "worker_runs_held"})


def _help(name: str) -> str:
    return _HELP.get(name, name.replace("_", " "))


_HELP = {
    "events_replayed": "Events folded while opening runs",
    "replay_duration_ms": "Time to fold a run's log (or its tail)",
    "snapshot_load_ms": "Time to read, check and decode a snapshot",
    "snapshot_write_ms": "Time to encode and publish a snapshot",
    "snapshot_seq_gap": "Events replayed after the last snapshot used",
    "snapshot_misses": "Snapshots refused (digest, version, gap)",
    "uncertain_opened": "Calls a tool left uncertain",
    "uncertain_checked": "Uncertain calls recovery examined on open",
    "uncertain_handed_to_a_person": "Uncertain calls listed when a run paused for a person",
    "worker_claims": "Runs claimed by this process's fleet workers",
    "worker_runs_held": "Runs this process's fleet workers hold now",
}


# --- what waits in a store ---------------------------------------------------------------


def store_counts(store: Store,
                 state_of: Callable[[RunInfo], RunState] | None = None) -> dict[str, Any]:
    """What waits in ``store`` now, from each run's state: ``state_of`` (a cache, as the
    viewer keeps), else the runs' outlines (projections.py), read in one query. A run
    whose log cannot be read is counted as unreadable, never left out."""
    by_status: Counter[str] = Counter()
    uncertain: Counter[str] = Counter()
    approvals = escalations = events = unreadable = 0
    infos = store.list_runs()
    found: dict[str, RunState | JournalError] = (
        {i.run_id: state_of(i) for i in infos} if state_of is not None
        else store.outlines())
    for info in infos:
        state = found.get(info.run_id)
        if state is None:  # (gone since it was listed)
            continue
        events += info.last_seq
        if isinstance(state, JournalError):
            unreadable += 1
            continue
        by_status[state.status] += 1
        uncertain.update(p.effect for p in state.pending.values())
        approvals += len(state.approvals)
        escalations += int(state.waits_for_a_person)
    return {"runs": dict(by_status), "uncertain": dict(uncertain), "approvals": approvals,
            "escalations": escalations, "events": events, "unreadable": unreadable}


def _from_store(counts: dict[str, Any]) -> Iterator[Metric]:
    open_calls = GaugeMetricFamily(f"{PREFIX}uncertain_open",
                                   "Uncertain calls open now, by effect class",
                                   labels=["effect"])
    for effect, n in sorted(counts["uncertain"].items()):
        open_calls.add_metric([effect], n)
    yield open_calls
    yield GaugeMetricFamily(f"{PREFIX}approvals_waiting", "Approvals waiting for a person",
                            value=counts["approvals"])
    yield GaugeMetricFamily(f"{PREFIX}escalations_waiting",
                            "Runs escalated, waiting for a person", value=counts["escalations"])
    runs = GaugeMetricFamily(f"{PREFIX}runs", "Runs in the store, by status",
                             labels=["status"])
    for status, n in sorted(counts["runs"].items()):
        runs.add_metric([status], n)
    yield runs
    yield GaugeMetricFamily(f"{PREFIX}events_stored", "Events in the store's logs",
                            value=counts["events"])
    yield GaugeMetricFamily(f"{PREFIX}runs_unreadable",
                            "Runs whose log cannot be read or folded (verify says why)",
                            value=counts.get("unreadable", 0))


def exposition(collector: JournalCollector) -> bytes:
    """The collector's families in Prometheus' text format (what ``/metrics`` serves)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return generate_latest(registry)
