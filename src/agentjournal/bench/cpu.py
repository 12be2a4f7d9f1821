"""6. CPU cost per event with syncing off, and the agent loop per step: unsynced, and synced
beside the hand-written floor of a durable step (two records, each committed)."""

from __future__ import annotations

import itertools
import os
import statistics
import time
import uuid
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import msgspec

from ..agent import Agent
from ..events import SCHEMA_VERSION, make_events
from ..models import Model, ModelRequest, ModelResponse, ScriptedModel, calls, reply
from ..policy import Budget
from ..state import ToolCall
from ..store import Durability, Store, open_store
from ..store.jsonl import JsonlStore
from ..tools import Tool, tool
from ._common import (
    NEVER,
    RUN,
    TASK,
    TURN_TEXT,
    Fact,
    Figure,
    Plan,
    Say,
    Write,
    figure,
    medians,
    order_result,
    run_facts,
    store_url,
)
from .appends import (
    raw_sqlite,
)

# --- 6. CPU cost with syncing off, and the loop ------------------------------------------------


def _store_round(store: Store, run_id: str, n: int) -> float:
    """Seconds per event to build each envelope and append it alone, as RunJournal does,
    to a new run (each round's: a call's completion names its start's seq in that run)."""
    facts = list(itertools.islice(run_facts(run_id), n))
    start = time.perf_counter()
    for seq, fact in enumerate(facts):
        events = make_events(run_id, seq, 0, [fact])
        store.append(run_id, events, expected_seq=seq, epoch=0)
    return (time.perf_counter() - start) / len(facts)


def _floor_round(write: Write, facts: list[Fact], after: int) -> float:
    """The hand-written floor: a dict envelope, one msgspec encode, one raw write."""
    encoder = msgspec.json.Encoder()
    start = time.perf_counter()
    for seq, (kind, payload) in enumerate(facts, start=after + 1):
        write(seq, encoder.encode({"run_id": RUN, "seq": seq, "type": kind.value,
                                   "ts": datetime.now(UTC), "epoch": 0, "v": SCHEMA_VERSION,
                                   "payload": payload}))
    return (time.perf_counter() - start) / len(facts)


def _cpu_figure(backend: str, store: Store, write: Write,
                floor_name: str, facts: list[Fact], reps: int) -> Figure:
    after, ours, floors = 0, [], []
    for round_no in range(reps + 1):  # the first round warms up and is dropped
        ours.append(_store_round(store, f"{RUN}-{round_no}", len(facts)))
        floors.append(_floor_round(write, facts, after))
        after += len(facts)
    return figure(f"cpu_per_event.{backend}", statistics.median(ours[1:]) * 1e6, "µs/event",
                  statistics.median(floors[1:]) * 1e6, floor_name,
                  "make_events + append, one event per call; target ≤ 15 µs")


def cpu_figures(workdir: Path, plan: Plan, say: Say) -> list[Figure]:
    """Syncing off: jsonl never fsyncs; sqlite batched is WAL + synchronous=NORMAL, whose
    floor keeps its per-transaction cost (a raw INSERT+COMMIT alone is ~30 µs here)."""
    facts = list(itertools.islice(run_facts(RUN), plan.cpu_events))
    fd = os.open(workdir / "cpu-floor.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    db, write_row = raw_sqlite(workdir / "cpu-floor.db", "NORMAL")

    def write_line(_seq: int, data: bytes) -> None:
        os.write(fd, data + b"\n")

    jsonl = JsonlStore(workdir / "cpu-jsonl", durability=Durability.BATCHED, batch_every=NEVER)
    sqlite = open_store(store_url("sqlite", workdir / "cpu-sqlite", "durability=batched"))
    try:
        say("CPU per event, syncing off: jsonl, sqlite")
        return [
            _cpu_figure("jsonl", jsonl, write_line, "dict envelope + msgspec encode + os.write",
                        facts, plan.reps),
            _cpu_figure("sqlite", sqlite, write_row,
                        "dict envelope + encode + sqlite3 INSERT+COMMIT (WAL, NORMAL)",
                        facts, plan.reps),
        ]
    finally:
        os.close(fd)
        db.close()
        jsonl.close()
        sqlite.close()


def lookup_tool(effect: str = "read_only") -> Tool:
    @tool(effect=effect)
    def lookup(order: str) -> dict[str, Any]:
        """Look an order up in the carrier's manifest."""
        return order_result(int(order.removeprefix("ord-")))

    return lookup


def _order_turn(i: int) -> ModelResponse:
    return calls(("lookup", {"order": f"ord-{i:06d}"}), text=TURN_TEXT)


class FixedCostModel:
    """ScriptedModel's turns at a constant cost per turn.

    ScriptedModel estimates usage by summing the length of every message in the
    prompt, so its own cost grows with the run; this model isolates the loop's.
    """

    def __init__(self, steps: int) -> None:
        self.steps = steps

    def complete(self, request: ModelRequest) -> ModelResponse:
        n = request.turn
        if n >= self.steps:
            return reply("all reconciled")
        call = ToolCall(id=f"call_{n}_0", name="lookup", args={"order": f"ord-{n:06d}"})
        return ModelResponse(text=TURN_TEXT, tool_calls=[call])


def _model(kind: str, steps: int) -> Model:
    if kind == "fixed_model":
        return FixedCostModel(steps)
    return ScriptedModel([_order_turn(i) for i in range(steps)] + [reply("all reconciled")])


def _agent_run_us(workdir: Path, kind: str, steps: int, lookup: Tool, *,
                  synced: bool = False) -> float:
    """µs/step of one whole run. Unsynced: batched durability, snapshots off (the loop's
    own cost); synced: the Agent and store as shipped (WAL + FULL, snapshots on)."""
    # Thousands of steps on purpose: no budget.
    model, budget = _model(kind, steps), Budget.unlimited()
    agent = (Agent(model, [lookup], budget=budget) if synced
             else Agent(model, [lookup], snapshot_every=None, budget=budget))
    path = workdir / f"agent-{uuid.uuid4().hex[:8]}"
    store = open_store(store_url("sqlite", path, "" if synced else "durability=batched"))
    try:
        start = time.perf_counter()
        result = agent.run(store, f"agent-{steps}", TASK)
        elapsed = time.perf_counter() - start
    finally:
        store.close()
    if result.status != "finished":
        raise RuntimeError(f"the benchmark agent stopped {result.status}: {result.pause_reason}")
    return elapsed / steps * 1e6


ONE_COMMIT = ("hand-written: 1 x sqlite3 INSERT+COMMIT per step (the call's intent and "
              "outcome), WAL+NORMAL")


def step_records(i: int) -> tuple[bytes, bytes]:
    """Step ``i``'s two hand-written records: the call's intent, then its outcome."""
    encode = msgspec.json.encode
    args = {"order": f"ord-{i:06d}"}
    return (encode({"step": i, "tool": "lookup", "args": args}),
            encode({"step": i, "result": order_result(i)}))


def hand_written_us(workdir: Path, steps: int, synchronous: str, *, apart: bool) -> float:
    """µs per step of committing each step's records by hand: ``apart``, each a row
    committed on its own; else the two as one row, one commit."""
    db, write = raw_sqlite(workdir / f"hand-written-{uuid.uuid4().hex[:8]}.db", synchronous)
    seq = itertools.count(1)
    start = time.perf_counter()
    for i in range(steps):
        records = step_records(i)
        for record in records if apart else (b"".join(records),):
            write(next(seq), record)
    elapsed = time.perf_counter() - start
    db.close()
    return elapsed / steps * 1e6


def one_commit_us(workdir: Path, steps: int) -> float:
    """The store's least part of an unsynced step: one row committed, without a sync, as
    the Agent's step of reads is one append."""
    return hand_written_us(workdir, steps, "NORMAL", apart=False)


def agent_figures(workdir: Path, plan: Plan, say: Say) -> list[Figure]:
    """A real Agent, a read-only tool, sqlite batched, snapshots off: µs per step (a model
    turn + a tool call, 3 events), whole run including open and close, median of runs,
    beside one hand-written commit a step measured round by round with it."""
    lookup, figures = lookup_tool(), []
    small, large = plan.agent_steps
    for kind in ("scripted", "fixed_model"):
        say(f"agent loop: {kind}, {small:,} and {large:,} steps x {plan.agent_reps}")
        measured = medians(plan.agent_reps, [case for n in plan.agent_steps for case in (
            partial(_agent_run_us, workdir, kind, n, lookup), partial(one_commit_us, workdir, n))])
        us = dict(zip(plan.agent_steps, measured[::2], strict=True))
        floors = dict(zip(plan.agent_steps, measured[1::2], strict=True))
        model = "ScriptedModel" if kind == "scripted" else "FixedCostModel (O(1) per turn)"
        figures += [figure(f"agent_step.{kind}.{n}", v, "µs/step", floors[n], ONE_COMMIT,
                           model) for n, v in us.items()]
        figures.append(figure(f"agent_step_growth.{kind}", us[large] / us[small], "x",
                              note=f"µs/step, {large:,} / {small:,} steps; target ≤ 1.1x"))
    return figures


# --- the synced step beside the hand-written floor ------------------------------------------

TWO_RECORDS = "hand-written: 2 x sqlite3 INSERT+COMMIT per step (intent, outcome), WAL+FULL"
SYNCED_AGENT = ("Agent defaults (snapshots on), FixedCostModel, sqlite WAL+FULL: 3 durable "
                "events per step, an idempotent tool (a read's result waits for the next "
                "turn: one sync, not two)")


def synced_agent_us(workdir: Path, steps: int, lookup: Tool) -> float:
    return _agent_run_us(workdir, "fixed_model", steps, lookup, synced=True)


def two_records_us(workdir: Path, steps: int) -> float:
    """The least a durable step can cost here: its intent made durable before the tool runs,
    its outcome after, each one row committed on its own (the tool runs inside the step)."""
    return hand_written_us(workdir, steps, "FULL", apart=True)


def step_figures(workdir: Path, plan: Plan, say: Say) -> list[Figure]:
    """The Agent's µs/step with syncing on, interleaved round by round with the floor. A
    step with an effect: its intent is stored before the call, its outcome after."""
    lookup = lookup_tool("idempotent")
    cases = [case for n in plan.agent_steps for case in (
        partial(synced_agent_us, workdir, n, lookup), partial(two_records_us, workdir, n))]
    say(f"synced step: Agent vs 2 committed records, {' and '.join(map(str, plan.agent_steps))}"
        f" steps x {plan.step_reps}")
    us = medians(plan.step_reps, cases)
    return [figure(f"step.sqlite.{n}", ours, "µs/step", floor, TWO_RECORDS,
                   f"{SYNCED_AGENT}; target ≤ 1.3x")
            for n, ours, floor in zip(plan.agent_steps, us[::2], us[1::2], strict=True)]
