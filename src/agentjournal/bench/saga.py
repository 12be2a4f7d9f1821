"""10. Sagas: the bookkeeping of undoing one effect, beside one durable effect's own cost.

A run of N reversible effects is made by a real Agent (not timed), then ``compensate``
undoes them all, its undo a no-op so only the saga's own work is timed: the plan, and per
effect ``compensation_started`` (durable before the undo) and ``compensation_completed``.
The floor is one durable effect as the loop records it, through the same store and the
run's journal, measured in the same rounds: ``tool_call_started`` then
``tool_call_completed``, two durable appends.
"""

from __future__ import annotations

import contextlib
import itertools
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from functools import partial
from pathlib import Path
from typing import Any

from ..agent import Agent
from ..journal import open_journal
from ..models import ScriptedModel, calls, reply
from ..policy import Budget
from ..saga import compensate
from ..store import open_store
from ..tools import Tool, Undo, tool
from ._common import Figure, Plan, Say, figure, medians, run_facts, store_url
from .postgres import postgres_problem, throwaway_schema

TARGET = 1.3  # x one durable effect


def _hold_tool() -> Tool:
    def release(undo: Undo) -> dict[str, Any]:
        return {"released": undo.args["hold_id"]}

    @tool(effect="reversible", identity=["hold_id"], compensate=release)
    def hold(hold_id: str) -> dict[str, Any]:
        return {"held": hold_id}

    return hold


def _saga_us(url: str, effects: int, hold: Tool) -> float:
    """µs per effect undone, for a fresh run of ``effects`` holds."""
    run_id = f"saga-{uuid.uuid4().hex[:8]}"
    turns = [calls(("hold", {"hold_id": f"h{i}"})) for i in range(effects)]
    agent = Agent(ScriptedModel([*turns, reply("held")]), [hold], budget=Budget.unlimited(),
                  snapshot_every=None)
    with contextlib.closing(open_store(url)) as store:
        agent.run(store, run_id, "hold them")
        start = time.perf_counter()
        result = compensate(store, run_id, [hold])
        elapsed = time.perf_counter() - start
    if result.status != "compensated" or len(result.undone) != effects:
        raise RuntimeError(f"the saga undid {len(result.undone)} of {effects}: {result.status}")
    return elapsed / effects * 1e6


def _effect_us(url: str, effects: int) -> float:
    """µs per durable effect as the loop records one: its start, then its completion,
    each recorded through the run's journal (envelope, redaction, append, fold)."""
    run_id = f"effect-{uuid.uuid4().hex[:8]}"
    facts = list(itertools.islice(run_facts(run_id), 2 + 3 * effects))
    with contextlib.closing(open_store(url)) as store, \
            open_journal(store, run_id) as journal:
        journal.record_all(facts[:3])  # the run's opening and the first model turn
        spent = 0.0
        for i in range(3, len(facts), 3):
            start = time.perf_counter()
            journal.record_all([facts[i]])  # started
            journal.record_all([facts[i + 1]])  # completed
            spent += time.perf_counter() - start
            if i + 2 < len(facts):
                journal.record_all([facts[i + 2]])  # the next model turn: not timed
    return spent / effects * 1e6


def _measure(backend: str, url_of: Callable[[], AbstractContextManager[str]], effects: int,
             reps: int) -> Figure:
    hold = _hold_tool()
    with url_of() as url:
        ours, floor = medians(reps, [partial(_saga_us, url, effects, hold),
                                     partial(_effect_us, url, effects)])
    return figure(f"saga.{backend}", ours, "µs/effect undone", floor,
                  "one durable effect: tool_call_started + tool_call_completed, each recorded",
                  f"{effects} effects undone newest first, no-op undo; target ≤ {TARGET}x")


def saga_figures(workdir: Path, postgres_url: str | None, plan: Plan, say: Say) -> list[Figure]:
    effects, reps = plan.saga_effects, min(plan.reps, 3)
    say(f"saga: {effects} effects undone vs {effects} durable effects, per backend x {reps}")
    figures = [_measure(backend, partial(_local, workdir, backend), effects, reps)
               for backend in ("sqlite", "jsonl")]
    problem = postgres_problem(postgres_url)
    if problem or not postgres_url:
        return [*figures, figure("saga.postgres", None, "µs/effect undone",
                                 note=f"skipped: {problem or 'no Postgres URL'}")]
    return [*figures, _measure("postgres", partial(throwaway_schema, postgres_url), effects,
                               reps)]


def _local(workdir: Path, backend: str) -> AbstractContextManager[str]:
    return nullcontext(store_url(backend, workdir / f"saga-{backend}-{uuid.uuid4().hex[:6]}"))
