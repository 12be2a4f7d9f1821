"""`agentjournal check` over many unfinished runs, beside reading each run's state.

A store holds N unfinished runs of one agent, recorded under its old version (v1): each
asked the model once and started a call; nine in ten completed it, one in ten left it
open under a tool the new code no longer has (those pause for a person). The new agent
changed its instructions and its tools, so every run takes the whole judgement (what
changed, each open call against the tool now), not the unchanged-version shortcut.

The first figure is µs per run of ``check.inspect_runs`` (list the runs, read each one's state,
judge it); the floor is the part no check can skip: ``load_state`` of every run, through
the same read-only handle, in the same rounds. The ratio is what judging adds.

The second is a resume under changed code: µs per step of a run recorded under the old
agent, resumed under the next release (other instructions, one more tool) and run on,
beside the same resume under the code that recorded it. The ratio is what judging the
change (deploys.forecast, the new version recorded) adds per step.
"""

from __future__ import annotations

import contextlib
import shutil
import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

from ..agent import Agent
from ..check import inspect_runs
from ..events import EventType, make_events
from ..keys import idempotency_key, run_scope
from ..models import ScriptedModel, calls, reply
from ..policy import Budget
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


# --- a resume under changed code, step by step -------------------------------------------

#: Steps a run records under the old code before it stops, and steps it then makes.
RECORDED_STEPS = 50


def _release(steps: int, changed: bool) -> Agent:
    """The agent that recorded the run (``changed=False``), or the next release: other
    instructions and one more tool, so another version. Its model makes ``steps`` read
    calls, then answers."""
    @tool(effect="read_only")
    def lookup(order: str) -> dict[str, Any]:
        """Look an order up."""
        return {"order": order}

    @tool(effect="read_only")
    def manifest(order: str) -> dict[str, Any]:
        """Read an order's manifest line."""
        return {"order": order, "line": 1}

    script = [calls(("lookup", {"order": f"ord-{i:04d}"})) for i in range(steps)]
    tools: list[Tool] = [lookup, manifest] if changed else [lookup]
    return Agent(ScriptedModel([*script, reply("done")]), tools, budget=Budget.unlimited(),
                 instructions="Reconcile each order." + (" Read its manifest too." if changed
                                                          else ""))


def _recorded(url: str) -> None:
    """A run that made RECORDED_STEPS calls under the old code and stopped (a deploy)."""
    stop = threading.Event()
    agent = _release(RECORDED_STEPS, changed=False)
    made = 0

    def counted(*_: Any) -> None:
        nonlocal made
        made += 1
        if made >= RECORDED_STEPS:
            stop.set()

    with contextlib.closing(open_store(url)) as store:
        agent.run(store, "deployed", TASK, agent_ref=REF, stop=stop, observer=counted)


def _resume_us(base: Path, target: Path, steps: int, changed: bool) -> float:
    """µs per step of resuming the recorded run and making ``steps`` more."""
    shutil.copyfile(base, target)
    agent = _release(steps, changed)
    url = f"sqlite:///{target}?durability=batched"
    with contextlib.closing(open_store(url)) as store:
        start = time.perf_counter()
        result = agent.run(store, "deployed")
        elapsed = time.perf_counter() - start
    if result.status != "finished" or result.state.versions[-1] != agent.version:
        raise RuntimeError(f"the resume ended {result.status} ({result.state.pause_reason}), "
                           f"versions {result.state.versions}")
    return elapsed / steps * 1e6


def resume_figures(workdir: Path, plan: Plan, say: Say) -> list[Figure]:
    steps, reps = plan.agent_steps[0], plan.agent_reps
    say(f"check: a run resumed under changed code vs the code that recorded it, {steps} "
        f"steps x {reps}")
    base = workdir / "deployed.db"
    _recorded(f"sqlite:///{base}?durability=batched")
    changed, same = medians(reps, [
        partial(_resume_us, base, workdir / "changed.db", steps, True),
        partial(_resume_us, base, workdir / "same.db", steps, False)])
    return [figure(f"check.resume_changed.{steps}", changed, "µs/step", same,
                   "the same resume under the code that recorded the run",
                   f"a run of {RECORDED_STEPS} recorded steps resumed under other "
                   f"instructions and one more tool (another version), then {steps} steps; "
                   "sqlite, batched")]


def check_figures(workdir: Path, plan: Plan, say: Say) -> list[Figure]:
    return [*_check_figures(workdir, plan, say), *resume_figures(workdir, plan, say)]


def _check_figures(workdir: Path, plan: Plan, say: Say) -> list[Figure]:
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
