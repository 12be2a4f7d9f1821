"""The whole run, its output, and the `agentjournal bench` command."""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

import click
import msgspec
from rich.console import Console
from rich.table import Table

from ._common import (
    COMPACT_EVERY,
    DEFAULT_POSTGRES,
    FULL,
    QUICK,
    RUN,
    SMOKE,
    Figure,
    Plan,
    Say,
    workload,
)
from .appends import (
    durable_figures,
)
from .chain import (
    chain_figures,
)
from .check import check_figures
from .cpu import (
    agent_figures,
    cpu_figures,
    step_figures,
)
from .density import density_figures
from .fleet import (
    fleet_figures,
)
from .group_commit import (
    group_commit_figures,
)
from .langgraph import langgraph_figures
from .models import (
    model_figures,
)
from .openai_agents import (
    openai_agents_figures,
)
from .peers import (
    peer_figures,
    peers_problem,
)
from .plots import (
    fleet_plot_path,
    pyplot,
    write_fleet_plot,
    write_plot,
)
from .postgres import postgres_problem
from .pydantic_ai import (
    pydantic_ai_figures,
)
from .reindex import reindex_figures
from .replay import (
    recovery_figures,
    replay_figures,
)
from .retention import (
    retention_figures,
)
from .saga import (
    saga_figures,
)
from .storage import (
    storage_figures,
)
from .targets import (
    Target,
    targets,
)
from .temporal import (
    temporal_figures,
)
from .ui import (
    ui_figures,
)
from .workspace import (
    workspace_figures,
)

# --- the whole run -----------------------------------------------------------------------------


def log_figures(workdir: Path, postgres_url: str | None, plan: Plan, say: Say) -> list[Figure]:
    """Replay and recovery over one generated log, freed before the next measurements,
    so its heap is not theirs to scan."""
    say(f"generating {max(plan.sizes):,} events")
    events = workload(RUN, max(plan.sizes))
    figures = [*replay_figures(events, plan.sizes, plan.reps, say),
               *chain_figures(events[:min(plan.sizes)], plan.reps, say)]
    # Resume is measured on a run that compacts its context, as a long run does (the
    # target's case): what still grows with the run is then the state, not the context.
    del events
    compacting = workload(RUN, max(plan.sizes), COMPACT_EVERY)
    return [*figures, *recovery_figures(workdir, compacting, plan.sizes, plan.reps, say,
                                        postgres_url)]


def _stderr(message: str) -> None:
    click.echo(message, err=True)


class _Run(msgspec.Struct, frozen=True):
    """What every section of one run measures with."""

    workdir: Path
    postgres_url: str | None
    plan: Plan
    progress: Say
    quick: bool
    peers: bool
    density: bool = False


#: The command's sections, in the order they run (``--only`` picks some).
_SECTIONS: dict[str, Callable[[_Run], list[Figure]]] = {
    "appends": lambda r: durable_figures(r.workdir, r.postgres_url, r.plan, r.progress),
    "log": lambda r: log_figures(r.workdir, r.postgres_url, r.plan, r.progress),
    "storage": lambda r: storage_figures(r.workdir, r.plan.steps, r.postgres_url, r.progress),
    "cpu": lambda r: cpu_figures(r.workdir, r.plan, r.progress),
    "agent": lambda r: agent_figures(r.workdir, r.plan, r.progress),
    "step": lambda r: step_figures(r.workdir, r.plan, r.progress),
    "group-commit": lambda r: group_commit_figures(r.workdir, r.plan, r.progress),
    "saga": lambda r: saga_figures(r.workdir, r.postgres_url, r.plan, r.progress),
    "check": lambda r: check_figures(r.workdir, r.plan, r.progress),
    "reindex": lambda r: reindex_figures(r.workdir, r.plan, r.progress),
    "workspace": lambda r: workspace_figures(r.workdir, r.plan, r.progress),
    "retention": lambda r: retention_figures(r.workdir, r.plan, r.progress),
    "temporal": lambda r: temporal_figures(r.workdir, r.plan, r.progress),
    "pydantic-ai": lambda r: pydantic_ai_figures(r.workdir, r.plan, r.progress),
    "models": lambda r: model_figures(r.workdir, r.plan, r.progress),
    "fleet": lambda r: fleet_figures(r.workdir, r.postgres_url, r.plan, r.progress),
    "ui": lambda r: ui_figures(r.workdir, r.plan, r.progress),
    "openai-agents": lambda r: openai_agents_figures(r.workdir, r.plan, r.progress),
    "peers": lambda r: peer_figures(r.workdir, r.quick, r.progress) if r.peers else [],
    "langgraph": lambda r: langgraph_figures(r.workdir, r.postgres_url, r.plan, r.quick,
                                             r.progress, smoke=r.plan == SMOKE),
    "density": lambda r: (density_figures(r.workdir, r.postgres_url, r.plan, r.progress)
                          if r.density else []),
}
SECTIONS = tuple(_SECTIONS)


def run_bench(*, quick: bool, postgres_url: str | None, workdir: Path,
              progress: Say = _stderr, peers: bool = False,
              rounds: int | None = None, only: Collection[str] | None = None,
              plan: Plan | None = None, density: bool = False) -> list[Figure]:
    """Measure every figure family (or the ``only`` sections of SECTIONS); scratch stores
    go under ``workdir``. ``plan`` overrides the sizes ``quick`` picks (QUICK or FULL),
    e.g. SMOKE in the tests.

    Postgres is skipped (with a note) when unreachable, except under ``CI=true``,
    where that raises ``RuntimeError``. ``peers`` adds the peer libraries' figures
    (``RuntimeError`` if the peers extra is not installed). ``density`` adds many runs
    held on one event loop (bench/density.py), LangGraph's async savers beside them when
    the peers extra is installed.
    """
    if os.environ.get("CI") == "true" and (problem := postgres_problem(postgres_url)):
        raise RuntimeError(f"CI=true, so Postgres must be measured, but {problem}")
    if peers and (problem := peers_problem()):
        raise RuntimeError(problem)
    plan = plan or (QUICK if quick else FULL)
    if rounds is not None:  # fewer (or more) rounds behind every median
        plan = msgspec.structs.replace(plan, reps=rounds, agent_reps=rounds, step_reps=rounds)
    workdir.mkdir(parents=True, exist_ok=True)
    run = _Run(workdir, postgres_url, plan, progress, quick, peers, density)
    return [figure for name, measure in _SECTIONS.items()
            if only is None or name in only for figure in measure(run)]


def document(figures: Sequence[Figure], *, quick: bool, peers: bool) -> dict[str, Any]:
    """What ``--json`` prints: the figures, the targets judged from them, the machine."""
    return {"figures": figures, "targets": targets(figures, peers=peers), "machine": machine(),
            "quick": quick, "peers": peers}


def machine() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "sqlite": sqlite3.sqlite_version,
        "msgspec": msgspec.__version__,
    }


# --- output --------------------------------------------------------------------------------


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def _console() -> Console:
    """The terminal's width; piped (to a file, a pager, a CI log) and with no COLUMNS set,
    160 columns, so that no figure's name folds into a column a character wide."""
    console = Console()
    if console.is_terminal or "COLUMNS" in os.environ:
        return console
    return Console(width=160)


def print_table(figures: Sequence[Figure]) -> None:
    table = Table(title="agentjournal bench", caption="ratio = value / floor, measured side by "
                  "side: for events/s the fraction of the floor's speed, else floors spent")
    table.add_column("name", overflow="fold")
    for column in ("value", "unit", "floor", "ratio"):
        table.add_column(column, justify="right" if column != "unit" else "left", no_wrap=True)
    table.add_column("note", min_width=24)
    for f in figures:
        ratio = f"{f.ratio:.2f}x" if f.ratio is not None else "-"
        table.add_row(f.name, _num(f.value), f.unit, _num(f.floor), ratio, f.note)
    _console().print(table)


def _limit(t: Target) -> str:
    sign = "≤" if t.direction == "max" else "≥"
    return f"{sign} {t.limit:g}x" if t.on == "ratio" else f"{sign} {_num(t.limit)} {t.unit}"


def print_targets(results: Sequence[Target]) -> None:
    table = Table(title="targets", caption="each from figures of this run; ratio = value / "
                  "floor; met '-': not measured here (the note says why)")
    table.add_column("name", overflow="fold")
    for column in ("value", "unit", "floor", "ratio", "limit", "met"):
        table.add_column(column, justify="right" if column != "unit" else "left", no_wrap=True)
    table.add_column("note", min_width=24)
    for t in results:
        ratio = f"{t.ratio:.2f}x" if t.ratio is not None else "-"
        met = "-" if t.met is None else "yes" if t.met else "NO"
        table.add_row(t.name, _num(t.value), t.unit, _num(t.floor), ratio, _limit(t), met, t.note)
    _console().print(table)


# --- the command ---------------------------------------------------------------------------


def _default_postgres() -> str:
    return os.environ.get("AGENTJOURNAL_TEST_POSTGRES", DEFAULT_POSTGRES)


@contextlib.contextmanager
def _scratch(store_dir: Path | None) -> Iterator[Path]:
    if store_dir is not None:
        store_dir.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix="agentjournal-bench-", dir=store_dir))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _sections(_ctx: click.Context, _param: click.Parameter,
              value: str | None) -> tuple[str, ...] | None:
    """``--only``'s comma-separated sections, each one of SECTIONS."""
    if value is None:
        return None
    names = tuple(name.strip() for name in value.split(",") if name.strip())
    if unknown := [name for name in names if name not in SECTIONS]:
        raise click.BadParameter(f"no section {', '.join(map(repr, unknown))}; choose from "
                                 f"{', '.join(SECTIONS)}")
    if not names:
        raise click.BadParameter(f"name at least one of {', '.join(SECTIONS)}")
    return names


def _fail(message: str) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(1)


@click.command()
@click.option("--quick", is_flag=True,
              help="Smaller sizes (1k and 10k events, 100 and 1,000 steps, 3 rounds): about "
                   "4 minutes on 2 quiet CPUs with a disk that syncs in ~3 ms (7 when other "
                   "work loads them), mostly syncs and worker start-ups. The time taken is "
                   "printed.")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object on stdout (progress stays on stderr).")
@click.option("--plot", type=click.Path(dir_okay=False, path_type=Path), metavar="FILE",
              help="Also draw replay and recovery time against event count to FILE (two "
                   "panels), and fleet runs/s "
                   "against worker processes beside it (FILE's name + '-fleet': recovery.png "
                   "-> recovery-fleet.png) when Postgres was measured (PNG; needs the plot extra).")
@click.option("--peers", is_flag=True,
              help="Also run the same N-step workload through LangGraph (SqliteSaver) and "
                   "eventsourcing (SQLite) in this process, beside agentjournal and a "
                   "hand-written floor, and resume after 1k and 10k steps (needs the peers "
                   "extra).")
@click.option("--density", is_flag=True,
              help="Also hold many runs on one event loop (100 and 300; 1,000 too without "
                   "--quick): wall time over the ideal, commits per step on PostgreSQL, "
                   "events/s, memory per run, LangGraph's async savers beside them.")
@click.option("--rounds", type=click.IntRange(min=1), metavar="N",
              help="Rounds behind each median (default: 3 with --quick, 5 or more "
                   "without); 1 checks that everything runs, not how fast.")
@click.option("--only", metavar="SECTION[,SECTION...]", callback=_sections,
              help=f"Run only these sections: {', '.join(SECTIONS)} (targets from the "
                   "others read 'not measured'). 'peers' implies --peers.")
@click.option("--store-dir", type=click.Path(file_okay=False, path_type=Path), metavar="DIR",
              help="Put scratch stores in a fresh subdirectory of DIR, removed afterwards "
                   "(default: the system temp directory). Pick the disk you will deploy on.")
@click.option("--postgres", "postgres_url", default=_default_postgres, metavar="URL",
              show_default="$AGENTJOURNAL_TEST_POSTGRES or " + DEFAULT_POSTGRES,
              help="Server for the Postgres figures, used in a throwaway bench_<random> "
                   "schema; '' to skip.")
def bench(quick: bool, as_json: bool, plot: Path | None, peers: bool, density: bool,
          rounds: int | None, only: tuple[str, ...] | None, store_dir: Path | None,
          postgres_url: str) -> None:
    """Measure durability, replay, recovery, storage and CPU cost on this machine.

    Every figure with a physical floor (a raw write + fsync, a raw INSERT +
    COMMIT, a decode-only loop) is measured beside that floor in the same run
    and reported as ratio = value / floor: for times and sizes, floors spent
    (lower is better); for events/s, the fraction of the floor's speed
    (higher is better). Ratios survive a noisy machine; absolute values do not.

    \b
    Examples:
        agentjournal bench --quick
        agentjournal bench --json --plot recovery.png > bench.json
        agentjournal bench --quick --peers
        agentjournal bench --store-dir /mnt/nvme --postgres ''
        agentjournal bench --quick --only cpu,step,group-commit
        agentjournal bench --quick --density --only density
    """
    peers = peers or "peers" in (only or ())
    density = density or "density" in (only or ())
    if plot is not None:
        try:
            pyplot()
        except ImportError:
            _fail("--plot needs matplotlib: pip install 'agentjournal[plot]'")
    if peers and (problem := peers_problem()):
        _fail(problem)
    began = time.monotonic()
    with _scratch(store_dir) as workdir:
        try:
            figures = run_bench(quick=quick, postgres_url=postgres_url or None, workdir=workdir,
                                peers=peers, rounds=rounds, only=only, density=density)
        except RuntimeError as exc:
            _fail(str(exc))
    _stderr(f"measured in {time.monotonic() - began:.0f} s")
    doc = document(figures, quick=quick, peers=peers)
    if plot is not None:
        write_plot(figures, plot)
        _stderr(f"plot written to {plot}")
        if write_fleet_plot(figures, fleet_plot_path(plot)):
            _stderr(f"fleet plot written to {fleet_plot_path(plot)}")
    if as_json:
        click.echo(msgspec.json.encode(doc).decode())
    else:
        print_table(figures)
        print_targets(doc["targets"])


if __name__ == "__main__":
    bench()
