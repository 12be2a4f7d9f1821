"""Snapshot planning: plan-snapshots (``bench`` is loaded lazily: _base.JournalGroup)."""

from __future__ import annotations

import click

from ._base import (
    CliError,
    cli,
    json_option,
    note,
    opened,
    store_option,
)
from ._safe import emit_json

# --- snapshots and benchmarks ----------------------------------------------------------


@cli.command(name="plan-snapshots")
@click.option("--events", type=click.IntRange(min=1), help="Events per run (default: the "
              "store's largest run).")
@click.option("--replay-ms", type=click.FloatRange(min=0, min_open=True),
              help="Replay cost per event, ms (default: measured on the store).")
@click.option("--snapshot-ms", type=click.FloatRange(min=0),
              help="Snapshot write cost, ms (default: measured on the store).")
@click.option("--recoveries", type=click.FloatRange(min=0), default=1.0, show_default=True,
              help="Expected recoveries per run.")
@click.option("--objective-ms", type=click.FloatRange(min=0), default=1000.0,
              show_default=True, help="Worst-case recovery time allowed, ms.")
@click.option("--interval", type=click.IntRange(min=1), help="Evaluate this interval instead "
              "of choosing one.")
@json_option
@store_option
def plan_snapshots(events: int | None, replay_ms: float | None, snapshot_ms: float | None,
                   recoveries: float, objective_ms: float, interval: int | None,
                   as_json: bool, store_url: str) -> None:
    """Choose a snapshot interval from replay cost, snapshot cost, recoveries per run and
    the worst-case recovery objective, and show the arithmetic. Costs not given are
    measured on the store's largest run (which also leaves a snapshot of it).

    \b
    Example (the worked example: 4,000 events, 2 ms each, 120 ms snapshots, 6 recoveries):
      agentjournal plan-snapshots --events 4000 --replay-ms 2 --snapshot-ms 120 \\
          --recoveries 6 --objective-ms 300
    """
    from ..planner import measure, plan

    if events is None or replay_ms is None or snapshot_ms is None:
        with opened(store_url) as store:
            runs = store.list_runs()
            if not runs:
                raise CliError(f"no runs in {store_url} to measure; give --events, "
                               "--replay-ms and --snapshot-ms", 2)
            largest = max(runs, key=lambda r: r.last_seq)
            measured = measure(store, largest.run_id)
        note(f"measured on run {measured.run_id} ({measured.events} events): "
             f"{measured.replay_ms_per_event:.4f} ms/event replay, "
             f"{measured.snapshot_ms:.2f} ms per snapshot")
        events = events or measured.events
        replay_ms = replay_ms or measured.replay_ms_per_event
        snapshot_ms = snapshot_ms if snapshot_ms is not None else measured.snapshot_ms
    result = plan(events, replay_ms, snapshot_ms, recoveries, objective_ms, interval)
    if as_json:
        emit_json(result)
        return
    for line in result.arithmetic:
        click.echo(line)
    verdict = "meets" if result.meets_objective else "MISSES"
    click.echo(f"interval: snapshot every {result.interval} events ({verdict} the "
               f"{objective_ms:g} ms objective)")

