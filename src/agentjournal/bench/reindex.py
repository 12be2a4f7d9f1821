"""``--only reindex``: rebuilding every run's outline from its log, beside folding it.

A store holds N runs of the bench's workload (M events each: 1,000,000 events in all at
full size). The figure is events/s of ``reindex`` (read each log, fold its outline,
store it); the floor is a plain fold of the same logs through the same store (read and
``fold``, nothing written), in the same rounds. The ratio is the fraction of the fold's
speed that reindex keeps (higher is better): what storing the outlines costs.
"""

from __future__ import annotations

import contextlib
import time
from functools import partial
from pathlib import Path

from ..reindex import reindex
from ..snapshots import gc_paused
from ..state import fold
from ..store import open_store
from ._common import Figure, Plan, Say, figure, medians, workload


def _store(url: str, runs: int, events: int) -> None:
    with contextlib.closing(open_store(url)) as store:
        for i in range(runs):
            run_id = f"run-{i:06d}"
            store.append(run_id, workload(run_id, events), expected_seq=0, epoch=0)


def _reindex_rate(url: str, total: int) -> float:
    with contextlib.closing(open_store(url)) as store:
        report = reindex(store)
    if report.events != total or report.damaged:
        raise RuntimeError(f"reindex folded {report.events} of {total} events, "
                           f"{len(report.damaged)} runs damaged")
    return report.events / report.seconds


def _fold_rate(url: str, total: int) -> float:
    with contextlib.closing(open_store(url)) as store:  # (a handle as reindex's)
        start = time.perf_counter()
        with gc_paused():
            folded = sum(fold(store.read(i.run_id)).last_seq for i in store.list_runs())
        elapsed = time.perf_counter() - start
    if folded != total:
        raise RuntimeError(f"folded {folded} of {total} events")
    return folded / elapsed


def reindex_figures(workdir: Path, plan: Plan, say: Say) -> list[Figure]:
    runs, events = plan.reindex_runs, plan.reindex_events
    figures = []
    for backend in ("sqlite", "jsonl"):
        say(f"reindex: {runs:,} runs of {events} events, {backend}")
        url = (f"sqlite:///{workdir / 'reindex.db'}?durability=batched" if backend == "sqlite"
               else f"jsonl:///{workdir / 'reindex-jsonl'}?durability=batched")
        _store(url, runs, events)
        ours, floor = medians(plan.reps, [partial(_reindex_rate, url, runs * events),
                                          partial(_fold_rate, url, runs * events)])
        figures.append(figure(
            f"reindex.{backend}.{runs * events}", ours, "events/s", floor,
            "a plain fold of the same logs (read and fold, nothing stored)",
            f"{runs:,} runs of {events} events; each outline stored in its own transaction"))
    return figures



