"""`agentjournal check` over many unfinished runs, beside reading each run's state.

A store holds N unfinished runs of one agent, recorded under its old version (v1): each
asked the model once and started a call; nine in ten completed it, one in ten left it
open under a tool the new code no longer has (those pause for a person). The new agent
changed its instructions and its tools, so every run takes the whole judgement (what
changed, each open call against the tool now), not the unchanged-version shortcut.

The figure is µs per run of ``check.inspect_runs`` (list the runs, read each one's state,
judge it); the floor is the part no check can skip: ``load_state`` of every run, through
the same read-only handle, in the same rounds. The ratio is what judging adds.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

from ..agent import Agent
from ..check import inspect_runs
from ..events import EventType, make_events
from ..keys import idempotency_key, run_scope
from ..models import ScriptedModel, reply
from ..snapshots import load_state
from ..store import Store, open_store
from ..tools import Tool, tool
from ._common import Figure, Plan, Say, figure, medians, store_url

E = EventType
REF = "bench.deploys:reconciler"
TASK = "Reconcile the order against the manifest, then mark it."
#: One run in this many left a call open under a tool the new code removed.
OPEN_EVERY = 10


def new_agent() -> Agent:
    """The agent as the new release defines it: other instructions, `retire` gone,
    `mark` added (tools are never called here)."""
    @tool(effect="read_only")
    def lookup(order: str) -> dict[str, Any]:
        """Look an order up."""
        return {"order": order}

    @tool(effect="irreversible", identity=["order"])
    def mark(order: str) -> dict[str, Any]:
        """Mark an order reconciled."""
        return {"marked": order}

    tools: list[Tool] = [lookup, mark]
    return Agent(ScriptedModel([reply("done")]), tools,
                 instructions="Reconcile each order; mark it once it matches.")


def _facts(run_id: str, i: int) -> list[tuple[EventType, dict[str, Any]]]:
    """What the old release recorded for run ``i``: a turn and one call, completed, or
    left open under `retire` (an irreversible tool the new code removed)."""
    scope = run_scope(run_id)
    retire = i % OPEN_EVERY == 0
    name, effect = ("retire", "irreversible") if retire else ("lookup", "read_only")
    args = {"order": f"ord-{i:06d}"}
    key = idempotency_key(scope, name, args, ["order"] if retire else None)
    facts: list[tuple[EventType, dict[str, Any]]] = [
        (E.RUN_STARTED, {"task": TASK, "scope": scope, "agent": REF, "agent_version": "v1",
                         "instructions": "Reconcile each order."}),
        (E.USER_MESSAGE, {"content": TASK}),
        (E.MODEL_TURN, {"text": "Checking.", "usage": {"input_tokens": 40, "output_tokens": 8},
                        "tool_calls": [{"id": "call_0", "name": name, "args": args}]}),
        (E.TOOL_CALL_STARTED, {"key": key, "tool": name, "args": args, "call_id": "call_0",
                               "effect": effect, "attempt": 1}),
    ]
    if not retire:
        facts.append((E.TOOL_CALL_COMPLETED, {"started_seq": 4, "call_id": "call_0",
                                               "tool": name, "idempotency_key": key,
                                               "result": {"order": args["order"]},
                                               "source": "tool"}))
    return facts


def make_store(url: str, runs: int) -> None:
    with contextlib.closing(open_store(url)) as store:
        for i in range(runs):
            run_id = f"open-{i:06d}"
            store.append(run_id, make_events(run_id, 0, 0, _facts(run_id, i)),
                         expected_seq=0, epoch=0)


def _check_us(store: Store, agent: Agent, runs: int) -> float:
    start = time.perf_counter()
    checked = inspect_runs(store, REF, agent)
    elapsed = time.perf_counter() - start
    paused = sum(f.action == "pause" for f in checked.forecasts)
    if len(checked.runs) != runs or paused != -(-runs // OPEN_EVERY):
        raise RuntimeError(f"check judged {len(checked.runs)} of {runs} runs, {paused} "
                           "pausing: not the store it was given")
    return elapsed / runs * 1e6


def _read_us(store: Store, runs: int) -> float:
    start = time.perf_counter()
    states = [load_state(store, info.run_id).state for info in store.list_runs()]
    elapsed = time.perf_counter() - start
    if len(states) != runs:
        raise RuntimeError(f"read {len(states)} of {runs} runs")
    return elapsed / runs * 1e6


@contextlib.contextmanager
def _reader(url: str) -> Iterator[Store]:
    with contextlib.closing(open_store(url, readonly=True)) as store:
        yield store


def check_figures(workdir: Path, plan: Plan, say: Say) -> list[Figure]:
    runs, reps = plan.check_runs, min(plan.reps, 3)
    say(f"check: {runs:,} unfinished runs judged against new code vs reading each x {reps}")
    url = store_url("sqlite", workdir / "check", "durability=batched")
    make_store(url, runs)
    agent = new_agent()
    with _reader(url) as store:
        ours, floor = medians(reps, [partial(_check_us, store, agent, runs),
                                     partial(_read_us, store, runs)])
    return [figure(f"check.{runs}", ours, "µs/run", floor,
                   "load_state of each run (snapshot + tail), the same read-only handle",
                   f"{runs:,} unfinished runs of one agent (1 in {OPEN_EVERY} with an open "
                   "call under a removed tool), judged against a changed agent; sqlite")]
