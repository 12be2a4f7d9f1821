"""The targets: each a limit on a ratio (or a value) computed from figures of the same run.

``direction`` says which side of ``limit`` meets it: "max" (at most: times, sizes, growth)
or "min" (at least: throughputs). ``on`` says what the limit bounds: the ratio value /
floor, or the value itself (absolute targets). ``met`` is None when this run did not
measure the figures a target needs; ``note`` then says why.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

import msgspec

from ._common import Figure
from .fleet_settings import TAKEOVER_TTL

Direction = Literal["max", "min"]
On = Literal["ratio", "value"]
NOT_MEASURED = "not measured in this run"
STEP_SIZES = [200, 2000]  # the synced-step targets named when none was measured


class Target(msgspec.Struct, frozen=True):
    name: str
    value: float | None
    floor: float | None
    ratio: float | None  # value / floor
    limit: float
    direction: Direction
    on: On
    unit: str  # the value's (and the floor's)
    met: bool | None
    note: str = ""


def _check(name: str, value: float, floor: float | None, unit: str, limit: float,
           direction: Direction, on: On, note: str) -> Target:
    ratio = value / floor if floor else None
    bounded = ratio if on == "ratio" else value
    met = None
    if bounded is not None:
        met = bounded <= limit if direction == "max" else bounded >= limit
    return Target(name, value, floor, ratio, limit, direction, on, unit, met, note)


def _unmeasured(name: str, limit: float, direction: Direction, on: On, why: str) -> Target:
    return Target(name, None, None, None, limit, direction, on, "", None, why)


def _why(figures: Sequence[Figure | None], unmeasured: str) -> str:
    """Why these figures give no comparison: absent from the run, or skipped (their note)."""
    for f in figures:
        if f is None:
            return unmeasured
        if f.value is None:
            return f.note or f"{f.name} not measured"
    return ""


def _against_floor(name: str, fig: Figure | None, limit: float, direction: Direction,
                   note: str, *, on: On = "ratio") -> Target:
    """A figure against its own floor (or, ``on="value"``, its value against the limit)."""
    if fig is None or fig.value is None:
        return _unmeasured(name, limit, direction, on, _why([fig], NOT_MEASURED))
    return _check(name, fig.value, fig.floor, fig.unit, limit, direction, on, note)


def _between(name: str, fig: Figure | None, base: Figure | None, limit: float, note: str, *,
             unmeasured: str = NOT_MEASURED) -> Target:
    """A figure against another figure's value (the base stands for the floor): at most."""
    if fig is None or fig.value is None or base is None or base.value is None:
        return _unmeasured(name, limit, "max", "ratio", _why([fig, base], unmeasured))
    return _check(name, fig.value, base.value, fig.unit, limit, "max", "ratio", note)


def _sizes(figures: dict[str, Figure], prefix: str) -> list[int]:
    """The sizes measured under ``prefix`` (the last part of the names), ascending."""
    return sorted(int(name.rsplit(".", 1)[1]) for name in figures
                  if name.startswith(prefix) and name.rsplit(".", 1)[1].isdigit())


def _growth(figures: dict[str, Figure], name: str, prefix: str, limit: float,
            note: str) -> Target:
    """The figure at the largest size against the one at the smallest."""
    sizes = _sizes(figures, prefix)
    if len(sizes) < 2:
        return _unmeasured(name, limit, "max", "ratio", f"fewer than 2 sizes of {prefix}*")
    small, large = sizes[0], sizes[-1]
    return _between(name, figures[f"{prefix}{large}"], figures[f"{prefix}{small}"], limit,
                    f"{note}: {large:,} / {small:,}")


def _bytes_per_step(figures: dict[str, Figure], backend: str) -> Target:
    """B/step with snapshots against the events alone, in the longest run measured."""
    name, prefix = f"bytes_per_step.{backend}", f"storage.{backend}+snapshots.step."
    steps = _sizes(figures, prefix)
    if not steps:
        return _unmeasured(name, 1.5, "max", "ratio", NOT_MEASURED)
    most = steps[-1]
    return _between(name, figures[f"{prefix}{most}"], figures.get(f"storage.{backend}.step.{most}"),
                    1.5, f"{backend} B/step at {most:,} steps: with snapshots / events alone")


def _past_ceiling(target: Target, ceiling: float | None,
                  what: Callable[[float], str]) -> Target:
    """``target``, its note saying so (``what(ceiling)``) when the run measured a ceiling
    that does not reach its limit: then no change to the store's own work meets it on
    this machine."""
    if target.met is not False or ceiling is None or ceiling >= target.limit:
        return target
    return msgspec.structs.replace(
        target, note=f"{target.note}; out of reach here: {what(ceiling)}")


def _replay(by_name: dict[str, Figure], n: int) -> Target:
    """Replay against decode-only; bounded by decoding into a kept list, which a replay
    must do (its ratio to the same floor is the best a fold that costs nothing gets)."""
    fig, kept = by_name.get(f"replay.gc_off.{n}"), by_name.get(f"replay.vs_kept.{n}")
    target = _against_floor(f"replay.{n}", fig, 0.5, "min",
                            "fraction of decode-only speed, GC paused")
    if fig is None or kept is None or not fig.floor or kept.floor is None:
        return target
    return _past_ceiling(target, kept.floor / fig.floor,
                         lambda bound: f"decoding into a kept list alone is {bound:.2f}x")


def _group_commit(by_name: dict[str, Figure]) -> Target:
    target = _against_floor("group_commit.sqlite", by_name.get("group_commit.sqlite"), 20_000,
                            "min", "durable events/s, 100 concurrent runs on one store",
                            on="value")
    ceiling = by_name.get("group_commit_ceiling.sqlite")
    return _past_ceiling(target, ceiling.value if ceiling is not None else None,
                         lambda rate: f"one thread, syncing off, makes the same appends "
                                      f"at {rate:,.0f}/s")


def targets(figures: Sequence[Figure], *, peers: bool) -> list[Target]:
    by_name = {f.name: f for f in figures}
    get = by_name.get
    return [
        *(_against_floor(f"step_us.sqlite.{n}", get(f"step.sqlite.{n}"), 1.3, "max",
                         "Agent on sqlite, synced, vs 2 committed records per step")
          for n in _sizes(by_name, "step.sqlite.") or STEP_SIZES),
        _against_floor("cpu_per_event.jsonl", get("cpu_per_event.jsonl"), 15, "max",
                       "µs per event with syncing off, absolute", on="value"),
        _against_floor("cpu_per_event.sqlite", get("cpu_per_event.sqlite"), 1.3, "max",
                       "vs a raw INSERT+COMMIT, syncing off"),
        *(_growth(by_name, f"resume_growth.{backend}", f"recovery.{backend}.snapshots.", 2,
                  "recovery with snapshots of a run that compacts its context, largest / "
                  "smallest run (events)")
          for backend in ("sqlite", "jsonl", "postgres")),
        _between("resume_vs_langgraph.10k", get("peers.resume.agentjournal.10000"),
                 get("peers.resume.langgraph.10000"), 1.0,
                 "resume after 10,000 steps, agentjournal / LangGraph",
                 unmeasured=NOT_MEASURED if peers else "measured only with --peers"),
        *(_bytes_per_step(by_name, backend) for backend in ("sqlite", "jsonl", "postgres")),
        *(_growth(by_name, f"bytes_per_step_growth.{backend}",
                  f"storage.{backend}+snapshots.step.", 1.1,
                  f"{backend} B/step with snapshots, largest / smallest run (steps)")
          for backend in ("sqlite", "jsonl", "postgres")),
        _against_floor("postgres_append", get("append.postgres"), 1.3, "max",
                       "vs one psycopg INSERT+COMMIT"),
        *(_replay(by_name, n) for n in _sizes(by_name, "replay.gc_off.")),
        *(_against_floor(f"saga.{backend}", get(f"saga.{backend}"), 1.3, "max",
                         "saga bookkeeping per effect undone vs one durable effect")
          for backend in ("sqlite", "jsonl", "postgres")),
        _group_commit(by_name),
        _against_floor("agent_step.fixed_model.2000", get("agent_step.fixed_model.2000"), 300,
                       "max", "the Agent's loop, syncing off, µs per step, absolute",
                       on="value"),
        *(_against_floor(f"density.{backend}.1000", get(f"density.{backend}.1000.wall"), 1.15,
                         "max", "1,000 runs on one loop, wall / ideal (bench --density)",
                         on="value")
          for backend in ("sqlite", "postgres")),
        _against_floor("density.commits_per_step", get("density.postgres.1000.commits_per_step"),
                       0.3, "max", "PostgreSQL commits per step at 1,000 runs", on="value"),
        *(_against_floor(f"langgraph.{call}", get(f"langgraph.{read}.{n}"), 1.0, "max",
                         f"JournalSaver.{call} on a fresh handle after {n:,} steps / "
                         "SqliteSaver's")
          for read, call in (("resume", "get_tuple"), ("list", "list"))
          for n in _sizes(by_name, f"langgraph.{read}.")[-1:] or [10_000]),
        *(_against_floor(f"reindex.{backend}", get(f"reindex.{backend}.{n}"), 0.5, "min",
                         f"reindex of {n:,} events, events/s / a plain fold's")
          for backend in ("sqlite", "jsonl")
          for n in _sizes(by_name, f"reindex.{backend}.")[-1:] or [1_000_000]),
        _against_floor("takeover.p99", get("takeover.p99"), TAKEOVER_TTL + 1, "max",
                       "a SIGKILLed worker's runs continued, p99, its last heartbeat to a "
                       "successor's first event; ratio: TTLs", on="value"),
        # The first request after start, as issue 44 asks (a warm one costs less).
        *(_against_floor(f"ui.{page}_cold", get(f"ui.{page}_cold"), limit, "max",
                         f"`agentjournal ui` {what}, first request, ms, absolute", on="value")
          for page, limit, what in (
              ("runs_page", 300, "/runs at 10,000 runs"),
              ("run_page", 300, "a run page of 100,000 events"),
              ("needs_person", 300, "needs a person at 10,000 runs"),
              ("time_travel", 300, "time travel to the last seq of 100,000 events"),
              ("call_page", 50, "a call's page in a run of 100,000 events"))),
        _against_floor("ui.tail", get("ui.tail"), 100, "max",
                       "`agentjournal ui` live tail: append to the event on the stream, ms",
                       on="value"),
    ]
