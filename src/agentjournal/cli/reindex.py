"""reindex: rebuild every projection of a store from its logs."""

from __future__ import annotations

import click
import msgspec

from ..integrations._graphviews import rebuild_thread_index
from ..reindex import reindex
from ._base import _fail, cli, json_option, opened, progress, store_option
from ._safe import echo, emit_json


@cli.command(name="reindex")
@click.argument("run_ids", metavar="[RUN]...", nargs=-1)
@json_option
@store_option
@click.pass_context
def reindex_cmd(ctx: click.Context, run_ids: tuple[str, ...], as_json: bool,
                store_url: str) -> None:
    """Rebuild each run's outline (the summary the runs list, the viewer and the metrics
    read) and every view kept beside a log (a LangGraph thread's head), from the log
    itself.

    Projections are caches of the log: this changes no log. Run it after `agentjournal
    verify` reports a projection that differs from the log (exit 3), or to project a
    store an older release wrote before reading it with read-only commands. A run whose
    log is damaged is named (exit 3) and every other run is rebuilt all the same;
    stopped midway, the store stays usable and the next reindex finishes the work.

    \b
    Examples:
      agentjournal reindex --store sqlite:///runs.db
      agentjournal reindex RUN --json | jq .damaged
    """
    with opened(store_url) as store, progress("reindex: reading the logs") as update:
        report = reindex(store, run_ids or None, views=[rebuild_thread_index],
                         progress=lambda done, total: update(
                             f"reindex: {done} of {total} runs"))
    if as_json:
        emit_json(msgspec.to_builtins(report))
    else:
        rate = report.events / report.seconds if report.seconds else 0.0
        echo(f"reindexed {report.runs} run(s), {report.events} events in "
             f"{report.seconds:.2f} s ({rate:,.0f} events/s)")
    codes = [_fail(f"{d.run_id}: not reindexed: {d.error}", 3) for d in report.damaged]
    if codes:
        ctx.exit(max(codes))
