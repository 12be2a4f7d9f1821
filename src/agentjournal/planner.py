"""Choose a snapshot interval from measured replay economics, not a round number.

With N events per run, replay cost c per event, snapshot write cost s, R
recoveries per run spread uniformly, and interval K:

    full replay      R * N/2 * c
    with snapshots   ceil(N/K) * s  +  R * K/2 * c

The objective bounds the worst case: a recovery replays at most K-1 tail
events, so (K-1) * c must fit in the objective. Within that bound the total
cost is least at K* = sqrt(2 N s / (R c)).
"""

from __future__ import annotations

import math
import time

import msgspec

from .snapshots import load_state, take
from .store import Store


def _s(ms: float) -> str:
    return f"{ms / 1000:.2f} s"


class SnapshotPlan(msgspec.Struct, frozen=True, kw_only=True):
    events_per_run: int
    replay_ms_per_event: float
    snapshot_ms: float
    recoveries_per_run: float
    objective_ms: float
    interval: int
    max_tail_events: int
    full_replay_ms_per_recovery: float
    full_replay_ms_per_run: float
    snapshot_writes: int
    snapshot_write_ms_per_run: float
    tail_replay_ms_per_recovery: float
    with_snapshots_ms_per_run: float
    net_saving_ms_per_run: float
    saving_ms_per_recovery: float
    break_even_recoveries: float
    meets_objective: bool
    arithmetic: list[str]


def plan(
    events_per_run: int,
    replay_ms_per_event: float,
    snapshot_ms: float,
    recoveries_per_run: float,
    objective_ms: float,
    interval: int | None = None,
) -> SnapshotPlan:
    """The interval that meets the objective at least cost (or the given one), with its sums."""
    n, c, s, r = events_per_run, replay_ms_per_event, snapshot_ms, recoveries_per_run
    max_tail = math.floor(objective_ms / c) if c > 0 else n
    if interval is None:
        best = math.sqrt(2 * n * s / (r * c)) if r > 0 and c > 0 else float(n)
        interval = max(1, min(round(best), max_tail + 1, n))
    k = interval
    full_one = n / 2 * c
    writes = math.ceil(n / k)
    tail_one = k / 2 * c
    saving_one = full_one - tail_one
    write_total = writes * s
    with_snapshots = r * tail_one + write_total
    break_even = write_total / saving_one if saving_one > 0 else math.inf
    lines = [
        f"full replay per recovery   {n} / 2 x {c:g} ms = {_s(full_one)}",
        f"full replay per run        {r:g} x {_s(full_one)} = {_s(r * full_one)}",
        f"snapshot every {k} events   {writes} x {s:g} ms = {_s(write_total)}",
        f"tail replay per recovery   {k} / 2 x {c:g} ms = {_s(tail_one)}",
        f"tails plus writes per run  {r:g} x {_s(tail_one)} + {_s(write_total)}"
        f" = {_s(with_snapshots)}",
        f"net saving per run         {_s(r * full_one)} - {_s(with_snapshots)}"
        f" = {_s(r * full_one - with_snapshots)}",
        f"break-even recovery rate   {_s(write_total)} / {_s(saving_one)}"
        f" = {break_even:.2f} recoveries per run",
        f"worst-case tail            {k - 1} events x {c:g} ms = {(k - 1) * c:.0f} ms"
        f" (the {objective_ms:g} ms objective allows {max_tail} tail events)",
    ]
    return SnapshotPlan(
        events_per_run=n, replay_ms_per_event=c, snapshot_ms=s, recoveries_per_run=r,
        objective_ms=objective_ms, interval=k, max_tail_events=max_tail,
        full_replay_ms_per_recovery=full_one, full_replay_ms_per_run=r * full_one,
        snapshot_writes=writes, snapshot_write_ms_per_run=write_total,
        tail_replay_ms_per_recovery=tail_one, with_snapshots_ms_per_run=with_snapshots,
        net_saving_ms_per_run=r * full_one - with_snapshots, saving_ms_per_recovery=saving_one,
        break_even_recoveries=break_even,
        meets_objective=(k - 1) * c <= objective_ms, arithmetic=lines,
    )


class Measured(msgspec.Struct, frozen=True):
    run_id: str
    events: int
    replay_ms_per_event: float
    snapshot_ms: float


def measure(store: Store, run_id: str) -> Measured:
    """Replay cost per event and snapshot cost, measured on one run of this store."""
    started = time.perf_counter()
    loaded = load_state(store, run_id, use_snapshots=False)
    replay_ms = (time.perf_counter() - started) * 1000
    started = time.perf_counter()
    store.put_snapshot(take(loaded.state))
    snapshot_ms = (time.perf_counter() - started) * 1000
    events = max(loaded.replayed, 1)
    return Measured(run_id, loaded.replayed, replay_ms / events, snapshot_ms)
