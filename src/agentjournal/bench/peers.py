"""9. ``--peers``: the same N-step workload through peer libraries, in this process.

Every system runs N steps of one tool call returning ``order_result(i)``, durable per step
on SQLite in WAL mode with synchronous=FULL, and is timed from its first step to its last
(opening the database and building the graph or application are not timed):

    agentjournal   the Agent as shipped: 3 durable events per step (model turn, call
                   started, call completed), snapshots on
    langgraph      a StateGraph: a model node and a tool node, each appending one message
                   to a messages list (operator.add); SqliteSaver, durability="sync"
    eventsourcing  an aggregate recording one event per step with the tool's result,
                   saved after each step (eventsourcing.sqlite)

Each stands beside the hand-written floor measured in the same rounds: two rows per step,
each its own INSERT+COMMIT. Resume (agentjournal and LangGraph) is reopening the database
and having the latest state ready, beside the floor's reopen + read + decode of its rows.

The peers are an optional extra, imported here lazily.
"""

from __future__ import annotations

import importlib
import operator
import sqlite3
import time
import uuid
from functools import partial
from pathlib import Path
from typing import Annotated, Any, TypedDict

import msgspec

from ..agent import Agent
from ..policy import Budget
from ..snapshots import load_state
from ..store import open_store
from ..tools import Tool
from ._common import (
    TASK,
    TURN_TEXT,
    Figure,
    Say,
    as_new_process,
    figure,
    medians,
    order_result,
    store_url,
)
from .appends import raw_sqlite
from .cpu import (
    SYNCED_AGENT,
    TWO_RECORDS,
    FixedCostModel,
    lookup_tool,
    step_records,
    synced_agent_us,
    two_records_us,
)

EXTRA_HINT = "--peers needs the peers extra: pip install 'agentjournal[peers]'"
PEER_MODULES = ("langgraph.graph", "langgraph.checkpoint.sqlite", "eventsourcing.application",
                "eventsourcing.domain")
QUICK_STEPS, FULL_STEPS = (20, 200), (200, 2_000)
RESUME_STEPS = (1_000, 10_000)
REPS = 3  # LangGraph's 2,000-step run writes ~1.5 GB of checkpoints: a round takes ~20 s
RUN_ID = "peer-run"
READ_FLOOR = "hand-written: reopen + SELECT + msgspec decode of the 2 rows per step"


def peers_problem() -> str | None:
    """Why the peers cannot be measured here, or None."""
    try:
        for name in PEER_MODULES:
            importlib.import_module(name)
    except ImportError:
        return EXTRA_HINT
    return None


def _wal_full(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    return conn


def _remove_db(path: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


# --- LangGraph ------------------------------------------------------------------------------


class Conversation(TypedDict):
    messages: Annotated[list[dict[str, Any]], operator.add]


def _graph(steps: int) -> Any:
    """Model node -> tool node -> model node ... until ``steps`` calls are answered."""
    def model(state: Conversation) -> dict[str, Any]:
        n = (len(state["messages"]) - 1) // 2  # the task, then 2 messages per step
        if n >= steps:
            return {"messages": [{"role": "assistant", "content": "all reconciled"}]}
        call = {"id": f"call_{n}_0", "name": "lookup", "args": {"order": f"ord-{n:06d}"}}
        return {"messages": [{"role": "assistant", "content": TURN_TEXT, "tool_calls": [call]}]}

    def tools(state: Conversation) -> dict[str, Any]:
        call = state["messages"][-1]["tool_calls"][0]
        result = order_result(int(call["args"]["order"].removeprefix("ord-")))
        return {"messages": [{"role": "tool", "tool_call_id": call["id"], "content": result}]}

    return wired(model, tools)


def wired(model: Any, tools: Any) -> Any:
    """The bench's graph: START -> model -> tools -> model ... -> END, the model node
    routing to the tools while its last message asks for a call (a StateGraph builder)."""
    from langgraph.graph import END, START, StateGraph

    def route(state: Conversation) -> str:
        return "tools" if state["messages"][-1].get("tool_calls") else END

    builder = StateGraph(Conversation)
    builder.add_node("model", model)
    builder.add_node("tools", tools)
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", route, ["tools", END])
    builder.add_edge("tools", "model")
    return builder


def _thread(steps: int) -> Any:  # a RunnableConfig
    return {"configurable": {"thread_id": RUN_ID}, "recursion_limit": 2 * steps + 10}


def _langgraph_run_s(path: Path, steps: int, durability: str) -> float:
    from langgraph.checkpoint.sqlite import SqliteSaver

    conn = _wal_full(path)
    try:
        graph = _graph(steps).compile(checkpointer=SqliteSaver(conn))
        start = time.perf_counter()
        out = graph.invoke({"messages": [{"role": "user", "content": TASK}]}, _thread(steps),
                           durability=durability)
        elapsed = time.perf_counter() - start
    finally:
        conn.close()
    if len(out["messages"]) != 2 * steps + 2:
        raise RuntimeError(f"the LangGraph run ended after {len(out['messages'])} messages")
    return elapsed


def _langgraph_us(workdir: Path, steps: int) -> float:
    path = workdir / f"langgraph-{uuid.uuid4().hex[:8]}.db"
    try:
        return _langgraph_run_s(path, steps, "sync") / steps * 1e6
    finally:
        _remove_db(path)  # every checkpoint holds the whole list: O(steps²) bytes


def _langgraph_resume_ms(path: Path, steps: int) -> float:
    from langgraph.checkpoint.sqlite import SqliteSaver

    as_new_process()
    start = time.perf_counter()
    conn = _wal_full(path)
    latest = SqliteSaver(conn).get_tuple(_thread(steps))
    elapsed = time.perf_counter() - start
    conn.close()
    if latest is None or len(latest.checkpoint["channel_values"]["messages"]) != 2 * steps + 2:
        raise RuntimeError(f"LangGraph did not load the {steps}-step thread")
    return elapsed * 1e3


# --- eventsourcing --------------------------------------------------------------------------


def _eventsourcing_app(path: Path) -> Any:
    from eventsourcing.application import Application

    app: Any = Application(env={"PERSISTENCE_MODULE": "eventsourcing.sqlite",
                           "SQLITE_DBNAME": str(path)})
    # The library sets WAL itself and leaves synchronous at SQLite's default: check it is FULL.
    with app.recorder.datastore.transaction(commit=False) as cursor:
        cursor.execute("PRAGMA synchronous")
        if cursor.fetchone()[0] != 2:
            raise RuntimeError("eventsourcing's SQLite connection is not synchronous=FULL")
    return app


def _run_class() -> Any:
    from eventsourcing.domain import Aggregate, event

    class AgentRun(Aggregate):
        @event("Started")
        def __init__(self, task: str) -> None:
            self.task = task
            self.results: list[dict[str, Any]] = []

        @event("StepCompleted")
        def complete_step(self, call_id: str, result: dict[str, Any]) -> None:
            self.results.append(result)

    return AgentRun


def _eventsourcing_us(workdir: Path, steps: int, run_class: Any) -> float:
    path = workdir / f"eventsourcing-{uuid.uuid4().hex[:8]}.db"
    app = _eventsourcing_app(path)
    try:
        start = time.perf_counter()
        run = run_class(TASK)
        app.save(run)
        for i in range(steps):
            run.complete_step(f"call_{i}_0", order_result(i))
            app.save(run)  # one transaction per step
        elapsed = time.perf_counter() - start
    finally:
        app.close()
    return elapsed / steps * 1e6


# --- agentjournal and the floor, for resume --------------------------------------------------


def _build_agentjournal(workdir: Path, steps: int, lookup: Tool) -> tuple[str, int]:
    """The store's URL and the run's events."""
    path = workdir / f"resume-agentjournal-{steps}"
    # Batched: the same bytes on disk as a synced run, built without waiting on the disk.
    store = open_store(store_url("sqlite", path, "durability=batched"))
    try:
        Agent(FixedCostModel(steps), [lookup], budget=Budget.unlimited()).run(store, RUN_ID, TASK)
        events = store.last_seq(RUN_ID)
    finally:
        store.close()
    return store_url("sqlite", path), events


def _agentjournal_resume_ms(url: str, events: int) -> float:
    as_new_process()
    start = time.perf_counter()
    store = open_store(url)
    loaded = load_state(store, RUN_ID, lazy=True)  # as a journal loads it
    elapsed = time.perf_counter() - start
    store.close()
    if loaded.state.last_seq != events:
        raise RuntimeError(f"agentjournal recovered {loaded.state.last_seq} of {events} events")
    return elapsed * 1e3


def _build_records(workdir: Path, steps: int) -> Path:
    path = workdir / f"resume-records-{steps}.db"
    db, _ = raw_sqlite(path, "FULL")
    rows = [(2 * i + k + 1, body) for i in range(steps) for k, body in enumerate(step_records(i))]
    db.execute("BEGIN")
    db.executemany("INSERT INTO floor VALUES (?, ?)", rows)
    db.execute("COMMIT")
    db.close()
    return path


def _records_resume_ms(path: Path, steps: int) -> float:
    decode = msgspec.json.decode
    as_new_process()
    start = time.perf_counter()
    db = sqlite3.connect(path)
    records = [decode(body) for (body,) in db.execute("SELECT body FROM floor ORDER BY seq")]
    elapsed = time.perf_counter() - start
    db.close()
    if len(records) != 2 * steps:
        raise RuntimeError(f"the floor read {len(records)} records")
    return elapsed * 1e3


# --- the figures ---------------------------------------------------------------------------

LANGGRAPH = "StateGraph model + tool nodes appending to a messages list, SqliteSaver"
EVENTSOURCING = "eventsourcing.sqlite (WAL, FULL checked): 1 event per step, saved per step"


def step_peer_figures(workdir: Path, steps: tuple[int, ...], say: Say) -> list[Figure]:
    lookup, run_class = lookup_tool(), _run_class()
    say(f"peers: {' and '.join(map(str, steps))} steps through agentjournal, LangGraph, "
        f"eventsourcing and the floor, x {REPS}")
    cases = [case for n in steps for case in (
        partial(synced_agent_us, workdir, n, lookup), partial(_langgraph_us, workdir, n),
        partial(_eventsourcing_us, workdir, n, run_class), partial(two_records_us, workdir, n))]
    us = iter(medians(REPS, cases))
    figures = []
    for n in steps:
        ours, langgraph, eventsourcing, floor = (next(us) for _ in range(4))
        figures += [
            figure(f"peers.step.agentjournal.{n}", ours, "µs/step", floor, TWO_RECORDS,
                   SYNCED_AGENT),
            figure(f"peers.step.langgraph.{n}", langgraph, "µs/step", floor, TWO_RECORDS,
                   f"{LANGGRAPH}, durability=sync, WAL+FULL"),
            figure(f"peers.step.eventsourcing.{n}", eventsourcing, "µs/step", floor,
                   TWO_RECORDS, EVENTSOURCING),
        ]
    return figures


def resume_peer_figures(workdir: Path, say: Say,
                        sizes: tuple[int, ...] = RESUME_STEPS) -> list[Figure]:
    lookup, figures = lookup_tool(), []
    for n in sizes:
        say(f"peers: resume after {n:,} steps, agentjournal and LangGraph (building the runs)")
        url, events = _build_agentjournal(workdir, n, lookup)
        graph_db = workdir / f"resume-langgraph-{n}.db"
        # Resume reads the latest checkpoint only: build it without a checkpoint per step.
        _langgraph_run_s(graph_db, n, "exit")
        records = _build_records(workdir, n)
        ours, langgraph, floor = medians(REPS, [
            partial(_agentjournal_resume_ms, url, events),
            partial(_langgraph_resume_ms, graph_db, n),
            partial(_records_resume_ms, records, n)])
        figures += [
            figure(f"peers.resume.agentjournal.{n}", ours, "ms", floor, READ_FLOOR,
                   f"open_store + load_state (newest snapshot + tail), {events:,} events"),
            figure(f"peers.resume.langgraph.{n}", langgraph, "ms", floor, READ_FLOOR,
                   f"connect + SqliteSaver.get_tuple: the latest checkpoint, {2 * n + 2:,} "
                   "messages"),
        ]
        _remove_db(graph_db)
    return figures


def peer_figures(workdir: Path, quick: bool, say: Say) -> list[Figure]:
    """Per step at two run lengths, then resume at 1k and 10k steps."""
    steps = QUICK_STEPS if quick else FULL_STEPS
    return [*step_peer_figures(workdir, steps, say), *resume_peer_figures(workdir, say)]

