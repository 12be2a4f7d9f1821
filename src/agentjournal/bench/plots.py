"""The bench's plots (``agentjournal bench --plot``): replay and recovery against run
length, and fleet throughput against worker processes. matplotlib (the plot extra) is
imported only when a plot is asked for."""

from __future__ import annotations

import importlib
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ._common import Figure

Series = dict[str, list[tuple[int, float]]]  # a line's label -> (events, ms) points


def pyplot() -> Any:
    """matplotlib's pyplot drawing to files; ImportError when matplotlib is absent."""
    matplotlib = importlib.import_module("matplotlib")
    matplotlib.use("Agg")  # files only: no display needed
    return importlib.import_module("matplotlib.pyplot")


def _replay_series(figures: Sequence[Figure]) -> Series:
    """Replay duration (ms) against event count: the fold in memory and its decode floor."""
    out: Series = {}
    for f in figures:
        if not f.name.startswith("replay.gc_off.") or f.value is None:
            continue
        n = int(f.name.rsplit(".", 1)[1])
        out.setdefault("fold(decode(...)), GC paused", []).append((n, n / f.value * 1e3))
        if f.floor:
            out.setdefault("decode only (floor)", []).append((n, n / f.floor * 1e3))
    return out


def _recovery_series(figures: Sequence[Figure]) -> Series:
    """Recovery duration (ms) against run length, per backend and mode."""
    out: Series = {}
    for f in figures:
        parts = f.name.split(".")
        if parts[0] != "recovery" or len(parts) != 4 or f.value is None:
            continue
        _, backend, mode, n = parts
        label = f"{backend}, {'snapshot + tail' if mode == 'snapshots' else 'full replay'}"
        out.setdefault(label, []).append((int(n), f.value))
    return out


def _panel(ax: Any, series: Series, title: str) -> None:
    for label, points in sorted(series.items()):
        xs, ys = zip(*sorted(points), strict=True)
        dashed = "full" in label or "floor" in label
        ax.plot(xs, ys, marker="o", linestyle="--" if dashed else "-", label=label)
    ax.set(xscale="log", yscale="log", xlabel="events in the run", ylabel="ms", title=title)
    ax.grid(True, which="both", alpha=0.3)
    if series:
        ax.legend(fontsize="small")


def write_plot(figures: Sequence[Figure], path: Path) -> None:
    """Two panels in one PNG: replay against event count, recovery against run length."""
    plt = pyplot()
    fig, (replay, recovery) = plt.subplots(1, 2, figsize=(12, 4.5))
    _panel(replay, _replay_series(figures), "Replay in memory against event count")
    _panel(recovery, _recovery_series(figures), "Recovery (open + state ready) against run length")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_fleet_plot(figures: Sequence[Figure], path: Path) -> bool:
    """Runs/s against worker processes to ``path``; False (nothing drawn) if none measured."""
    points = sorted((int(f.name.rsplit(".", 1)[1]), f.value) for f in figures
                    if f.name.startswith("fleet.runs_per_s.") and f.value is not None)
    if not points:
        return False
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    xs, ys = zip(*points, strict=True)
    ax.plot(xs, ys, marker="o", label="runs/s")
    floors = [f.floor for f in figures if f.name.startswith("fleet.runs_per_s.") and f.floor]
    if floors:
        ax.axhline(statistics.median(floors), linestyle="--", color="grey",
                   label="commit floor (one connection), in runs/s")
    ax.set(xlabel="worker processes", ylabel="runs/s", xticks=list(xs),
           title="Fleet throughput on PostgreSQL")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def fleet_plot_path(path: Path) -> Path:
    """The fleet plot's file beside the recovery plot's: recovery.png -> recovery-fleet.png."""
    return path.with_name(f"{path.stem}-fleet{path.suffix or '.png'}")
