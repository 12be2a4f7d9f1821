"""What every figure shares: the Figure record, the workload, timing."""

from __future__ import annotations

import gc
import itertools
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import msgspec

from ..events import Event, EventType, make_events
from ..keyed import forget_probes
from ..keys import idempotency_key, run_scope
from ..snapshots import gc_paused
from ..store import Store

E = EventType
RUN = "bench-run"
DEFAULT_POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"
SNAPSHOT_EVERY = 1000
# Recovery stores get their snapshots at seq % 1000 == 500, so every size
# recovers the same 500-event tail (the mean tail at interval 1000) and only
# the run's length varies.
RECOVERY_TAIL = 500
NEVER = 10**9  # a jsonl batch_every that never fsyncs: "syncing off"

Say = Callable[[str], None]
Fact = tuple[EventType, dict[str, Any]]
Write = Callable[[int, bytes], None]  # store (seq, bytes), nothing else: a floor


class Figure(msgspec.Struct, frozen=True):
    name: str
    value: float | None  # None: not measured here (the note says why)
    unit: str
    floor: float | None = None
    floor_name: str | None = None
    ratio: float | None = None  # value / floor
    note: str = ""


def figure(
    name: str, value: float | None, unit: str, floor: float | None = None,
    floor_name: str | None = None, note: str = "",
) -> Figure:
    ratio = value / floor if value is not None and floor else None
    return Figure(name, value, unit, floor, floor_name, ratio, note)


class Plan(msgspec.Struct, frozen=True, kw_only=True):
    appends: int  # durable appends timed per backend
    reps: int  # repetitions behind each median
    sizes: tuple[int, ...]  # event counts for replay and recovery
    steps: tuple[int, ...]  # run lengths for storage
    cpu_events: int  # events per round, syncing off
    agent_steps: tuple[int, int] = (200, 2000)
    agent_reps: int = 5  # the loop's µs/step swings ±30 % run to run here
    step_reps: int = 3  # synced steps: fsync-bound, 2,200 steps a round
    group_events: int = 30  # events each of the group commit's runs appends
    saga_effects: int = 100  # effects made, then undone, per round
    temporal_steps: int = 200  # steps of the run timed under Temporal and directly
    fleet_workers: tuple[int, ...] = (1, 2, 4)  # worker processes, one round each
    fleet_runs: int = 48  # runs per fleet round
    fleet_claims: int = 100  # claims behind the claim latency
    takeover_kills: int = 3  # SIGKILLed workers behind the takeover latency
    pydantic_steps: int = 100  # steps of the Pydantic AI agent, with and without durability
    ui_runs: int = 10_000  # runs behind the viewer's runs page
    ui_events: int = 100_000  # events of the run behind its run page
    density_runs: tuple[int, ...] = (100, 300)  # runs held at once on one loop (--density)
    density_latency: float = 0.5  # seconds each model turn takes
    density_turns: int = 4  # model turns per run (all but the last call a tool)
    sdk_turns: int = 40  # turns of the OpenAI Agents SDK run timed four ways
    check_runs: int = 1_000  # unfinished runs `agentjournal check` judges
    reindex_runs: int = 1_000  # runs `agentjournal reindex` rebuilds...
    reindex_events: int = 100  # ...of this many events each


QUICK = Plan(appends=240, reps=3, sizes=(1_000, 10_000), steps=(100, 1_000), cpu_events=1_500,
             agent_reps=3, step_reps=2)
FULL = Plan(appends=1_500, reps=5, sizes=(1_000, 10_000, 100_000), steps=(100, 1_000, 10_000),
            cpu_events=4_000, agent_reps=9, step_reps=5, group_events=200,
            saga_effects=500, temporal_steps=1_000, fleet_workers=(1, 2, 4, 8), fleet_runs=160,
            fleet_claims=400, takeover_kills=10, density_runs=(100, 300, 1_000),
            density_latency=1.0, density_turns=10, pydantic_steps=500,
            sdk_turns=200, check_runs=10_000, reindex_runs=10_000)
#: Every section at its smallest meaningful size, one round: for the tests, which check
#: what each section measured, never how fast (``run_bench(plan=SMOKE)``).
SMOKE = Plan(appends=20, reps=1, sizes=(1_000, 2_000), steps=(100, 300), cpu_events=300,
             agent_steps=(20, 200), agent_reps=1, step_reps=1, group_events=5, saga_effects=10,
             temporal_steps=20, fleet_workers=(1, 2), fleet_runs=8, fleet_claims=20,
             takeover_kills=1, ui_runs=100, ui_events=2_000, density_runs=(20,),
             density_latency=0.05, density_turns=2, pydantic_steps=10, sdk_turns=4,
             check_runs=50, reindex_runs=40, reindex_events=50)


# --- the workload: what Agent records for a run calling one tool per turn ----------------

TASK = "Reconcile this week's shipped orders against the carrier manifest; report mismatches."
TURN_TEXT = "Checking the next order against the manifest before I mark it reconciled."


def order_result(i: int) -> dict[str, Any]:
    """A tool result of about 200 bytes."""
    return {
        "order": f"ord-{i:06d}", "status": "shipped", "carrier": "DHL Express",
        "eta": "2026-12-03", "items": [{"sku": "A-1001", "qty": 2}, {"sku": "B-2002", "qty": 1}],
        "note": "left at the front desk; customer notified by email",
    }


def _step_facts(scope: str, i: int, started_seq: int) -> list[Fact]:
    call_id, args = f"call_{i}_0", {"order": f"ord-{i:06d}"}
    key = idempotency_key(scope, "lookup", args)
    result = order_result(i)
    # The prompt grows every step (input_tokens), the recorded facts do not.
    usage = {"input_tokens": 40 + 110 * i, "output_tokens": 26, "cached_input_tokens": 0,
             "cost_usd": 0.0004}
    return [
        (E.MODEL_TURN, {"text": TURN_TEXT, "usage": usage,
                        "tool_calls": [{"id": call_id, "name": "lookup", "args": args}]}),
        (E.TOOL_CALL_STARTED, {"key": key, "tool": "lookup", "args": args, "call_id": call_id,
                               "effect": "read_only", "attempt": 1}),
        (E.TOOL_CALL_COMPLETED, {"started_seq": started_seq, "call_id": call_id,
                                 "tool": "lookup", "idempotency_key": key, "result": result,
                                 "source": "tool"}),  # as the loop writes it: result once
    ]


#: A long run's context policy, for the recovery figures: every 100 steps the context is
#: compacted to a summary and the newest 20 messages.
COMPACT_EVERY, COMPACT_KEEP = 100, 20
SUMMARY = "Orders 1 to N reconciled against the manifest; no mismatch so far."


def run_facts(run_id: str, compact_every: int | None = None) -> Iterator[Fact]:
    scope = run_scope(run_id)
    yield E.RUN_STARTED, {"task": TASK, "scope": scope, "agent": None}
    yield E.USER_MESSAGE, {"content": TASK}
    seq = 2
    for i in itertools.count(1):
        yield from _step_facts(scope, i - 1, started_seq=seq + 2)
        seq += 3
        if compact_every and i % compact_every == 0:
            yield E.CONTEXT_COMPACTED, {"summary": SUMMARY, "kept": COMPACT_KEEP}
            seq += 1


def workload(run_id: str, n: int, compact_every: int | None = None) -> list[Event]:
    """The first ``n`` events of the run (2 opening events, then 3 per step; with
    ``compact_every``, a compaction after every that many steps)."""
    return make_events(run_id, 0, 0, itertools.islice(run_facts(run_id, compact_every), n))


# --- timing --------------------------------------------------------------------------


def as_new_process() -> None:
    """Start a timed resume from a collected heap and no kept probes, as a new process
    does, not with the garbage and the cache of the bench's last resume."""
    forget_probes()
    gc.collect()


def clock(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    result = fn()
    elapsed = time.perf_counter() - start
    del result  # freeing a big result is not part of what was measured
    return elapsed


def timed(fn: Callable[[], object], *, gc_off: bool) -> float:
    if not gc_off:
        return clock(fn)
    with gc_paused():
        return clock(fn)


def medians(reps: int, cases: Sequence[Callable[[], float]]) -> list[float]:
    """The median of each case's measurement, the cases taken in turn round by round,
    so the machine's drift over the run hits every case alike."""
    rounds: list[list[float]] = [[] for _ in cases]
    for _ in range(reps):
        for case, results in zip(cases, rounds, strict=True):
            gc.collect()  # every measurement starts from the same heap
            results.append(case())
    return [statistics.median(r) for r in rounds]


def _p99(xs: Sequence[float]) -> float:
    return sorted(xs)[min(len(xs) - 1, int(len(xs) * 0.99))]


def store_url(backend: str, path: Path, query: str = "") -> str:
    suffix = ".db" if backend == "sqlite" else ""
    return f"{backend}:///{path}{suffix}" + (f"?{query}" if query else "")


def append_one_by_one(store: Store, events: Sequence[Event]) -> None:
    store.append(RUN, events, expected_seq=events[0].seq - 1, epoch=0)


