"""``--only langgraph``: JournalSaver beside LangGraph's own savers, same graph, same run.

The workload is the peers' graph (peers.py): a model node and a tool node, each
appending one message to a messages list, so the state grows every step. Figures:

- bytes stored over N steps (1,000; 200 in quick mode): JournalSaver on SQLite against
  ``SqliteSaver`` (the files, WAL checkpointed), and on PostgreSQL against LangGraph's
  ``PostgresSaver`` (the tables' total relation size), each as a ratio; and how a late
  step's bytes compare with an early one's (``growth``: 1 is constant per step);
- time per step with ``durability="sync"``: JournalSaver (SQLite, fsync) against
  ``SqliteSaver`` (WAL, synchronous=FULL), same N;
- resume at 1k and 10k steps (quick: 1k): a new store handle and saver reading the
  thread's latest checkpoint, against ``SqliteSaver.get_tuple`` on a new connection;
- list at the same sizes: a new store handle and saver listing the thread's ten newest
  checkpoints (``list(limit=10)``, values and all, as ``get_state_history`` pages),
  against ``SqliteSaver.list`` on a new connection (its thread given ten more steps
  stored one by one, each checkpoint holding the whole state, so it has ten to list).

Needs the langgraph extra (and langgraph-checkpoint-sqlite/-postgres, in dev); without
them the section reports nothing measured, saying why.
"""

from __future__ import annotations

import importlib
import sqlite3
import time
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from ..store import Durability, open_store
from ._common import TASK, Figure, Plan, Say, as_new_process, figure
from .peers import _graph, _langgraph_resume_ms, _remove_db, _thread, _wal_full

MODULES = ("langgraph.graph", "langgraph.checkpoint.sqlite", "agentjournal.integrations.langgraph")
HINT = "needs: pip install 'agentjournal[langgraph]' langgraph-checkpoint-sqlite"
QUICK_STEPS, FULL_STEPS = 200, 1_000
QUICK_RESUME, FULL_RESUME = (1_000,), (1_000, 10_000)
GROWTH = "bytes a checkpoint adds in the last tenth of the run / in the second tenth"


def problem() -> str | None:
    try:
        for name in MODULES:
            importlib.import_module(name)
    except ImportError:
        return HINT
    return None


def _input() -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": TASK}]}


def _check(out: dict[str, Any], steps: int) -> None:
    if len(out["messages"]) != 2 * steps + 2:
        raise RuntimeError(f"the graph ended after {len(out['messages'])} messages")


def _sqlite_bytes(path: Path) -> int:
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))


def _journal_run(url: str, steps: int, durability: str) -> tuple[float, Any]:
    """(seconds for the run, the store's url) of N steps through JournalSaver."""
    from ..integrations.langgraph import JournalSaver

    store = open_store(url)
    try:
        saver = JournalSaver(store)
        graph = _graph(steps).compile(checkpointer=saver)
        start = time.perf_counter()
        out = graph.invoke(_input(), _thread(steps), durability=durability)
        elapsed = time.perf_counter() - start
        saver.close()
    finally:
        store.close()
    _check(out, steps)
    return elapsed, url


def _stock_sqlite_run(path: Path, steps: int, durability: str) -> float:
    from langgraph.checkpoint.sqlite import SqliteSaver

    conn = _wal_full(path)
    try:
        graph = _graph(steps).compile(checkpointer=SqliteSaver(conn))
        start = time.perf_counter()
        out = graph.invoke(_input(), _thread(steps), durability=durability)
        elapsed = time.perf_counter() - start
    finally:
        conn.close()
    _check(out, steps)
    return elapsed


def _journal_growth(url: str) -> float:
    """GROWTH of a JournalSaver thread: the stored bytes of its checkpoint events."""
    from ..events import EventType, encode
    from ..integrations._graphlog import thread_run_id
    from .peers import RUN_ID

    store = open_store(url, readonly=True)
    try:
        sizes = [len(encode(e)) for e in store.read(thread_run_id(RUN_ID))
                 if e.type is EventType.GRAPH_CHECKPOINT]
    finally:
        store.close()
    return _growth(sizes)


def _stock_growth(path: Path) -> float:
    conn = sqlite3.connect(path)
    sizes = [n for (n,) in conn.execute(
        "SELECT length(checkpoint) + length(metadata) FROM checkpoints ORDER BY checkpoint_id")]
    conn.close()
    return _growth(sizes)


def _growth(sizes: list[int]) -> float:
    tenth = max(1, len(sizes) // 10)
    early, late = sizes[tenth:2 * tenth], sizes[-tenth:]
    return (sum(late) / len(late)) / (sum(early) / len(early))


def sqlite_figures(workdir: Path, steps: int, say: Say) -> list[Figure]:
    say(f"langgraph: {steps} steps, JournalSaver and SqliteSaver on SQLite, durability=sync")
    ours_path = workdir / f"lg-journal-{uuid.uuid4().hex[:8]}.db"
    stock_path = workdir / f"lg-stock-{uuid.uuid4().hex[:8]}.db"
    try:
        ours_s, url = _journal_run(f"sqlite:///{ours_path}", steps, "sync")
        stock_s = _stock_sqlite_run(stock_path, steps, "sync")
        ours_b, stock_b = _sqlite_bytes(ours_path), _sqlite_bytes(stock_path)
        ours_growth, stock_growth = _journal_growth(url), _stock_growth(stock_path)
    finally:
        _remove_db(ours_path)
        _remove_db(stock_path)
    stock = "SqliteSaver (WAL, synchronous=FULL), same graph"
    return [
        figure(f"langgraph.bytes_per_step.sqlite.{steps}", ours_b / steps, "B/step",
               stock_b / steps, stock, "JournalSaver on SQLite (fsync): the store's file"),
        figure(f"langgraph.growth.journal.{steps}", ours_growth, "x", 1.0, "constant",
               GROWTH),
        figure(f"langgraph.growth.sqlitesaver.{steps}", stock_growth, "x", 1.0, "constant",
               GROWTH),
        figure(f"langgraph.step_sync.sqlite.{steps}", ours_s / steps * 1e6, "µs/step",
               stock_s / steps * 1e6, stock, "a step = one node's put_writes and put"),
    ]


def postgres_figures(workdir: Path, postgres_url: str | None, steps: int,
                     say: Say) -> list[Figure]:
    name = f"langgraph.bytes_per_step.postgres.{steps}"
    if postgres_url is None or importlib.util.find_spec("langgraph.checkpoint.postgres") is None:
        return [figure(name, None, "B/step", note="skipped: no PostgreSQL server or no "
                       "langgraph-checkpoint-postgres")]
    import psycopg
    from langgraph.checkpoint.postgres import PostgresSaver

    say(f"langgraph: {steps} steps, JournalSaver and PostgresSaver on PostgreSQL")
    ours_schema, stock_schema = (f"bench_lg_{uuid.uuid4().hex[:10]}" for _ in range(2))
    sep = "&" if "?" in postgres_url else "?"
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        admin.execute(f'CREATE SCHEMA "{stock_schema}"')
        try:
            _journal_run(f"{postgres_url}{sep}schema={ours_schema}", steps, "sync")
            stock_url = f"{postgres_url}{sep}options=-csearch_path%3D{stock_schema}"
            with PostgresSaver.from_conn_string(stock_url) as stock_saver:
                stock_saver.setup()
                out = _graph(steps).compile(checkpointer=stock_saver).invoke(
                    _input(), _thread(steps), durability="sync")
            _check(out, steps)
            ours_b, stock_b = (_schema_bytes(admin, s) for s in (ours_schema, stock_schema))
        finally:
            for schema in (ours_schema, stock_schema):
                admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    return [figure(name, ours_b / steps, "B/step", stock_b / steps,
                   "PostgresSaver (langgraph-checkpoint-postgres), same graph",
                   "JournalSaver on PostgreSQL: its schema's total relation size")]


def _schema_bytes(conn: Any, schema: str) -> int:
    row = conn.execute(
        "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s "
        "AND c.relkind IN ('r', 'm')", (schema,)).fetchone()
    return int(row[0])


def resume_figures(workdir: Path, sizes: tuple[int, ...], say: Say,
                   reps: int = 3) -> list[Figure]:
    figures = []
    for n in sizes:
        say(f"langgraph: resume after {n:,} steps, JournalSaver and SqliteSaver (building)")
        ours_path = workdir / f"lg-resume-{n}-{uuid.uuid4().hex[:8]}.db"
        stock_path = workdir / f"lg-resume-stock-{n}-{uuid.uuid4().hex[:8]}.db"
        try:
            # Ours keeps every checkpoint (its log is what a resume reads), built with
            # syncing batched to save time (the bytes are the same); the stock saver's
            # resume reads the latest checkpoint only, built without one per step.
            url = f"sqlite:///{ours_path}?durability={Durability.BATCHED.value}"
            _journal_run(url, n, "sync")
            _stock_sqlite_run(stock_path, n, "exit")
            ours_ms, stock_ms = _best_of_both(
                partial(_journal_resume_ms, f"sqlite:///{ours_path}", n),
                partial(_langgraph_resume_ms, stock_path, n), GET_REPS * reps)
            _stock_more(stock_path, n)
            ours_list, stock_list = _best_of_both(
                partial(_journal_list_ms, f"sqlite:///{ours_path}", n),
                partial(_stock_list_ms, stock_path, n), reps)
        finally:
            _remove_db(ours_path)
            _remove_db(stock_path)
        figures.append(figure(
            f"langgraph.resume.{n}", ours_ms, "ms", stock_ms,
            "connect + SqliteSaver.get_tuple (the latest checkpoint)",
            f"open_store + JournalSaver.get_tuple: the thread's log, {n:,} steps"))
        figures.append(figure(
            f"langgraph.list.{n}", ours_list, "ms", stock_list,
            f"connect + SqliteSaver.list(limit={LISTED}) (the newest checkpoints)",
            f"open_store + JournalSaver.list(limit={LISTED}): {n:,} steps"))
    return figures


#: Checkpoints the list figure asks for: a page of get_state_history.
LISTED = 10
#: Tries of a get_tuple per try of a list: a few milliseconds at 1,000 steps, where
#: the best of three still varies by a tenth on a busy machine.
GET_REPS = 3


def _stock_more(path: Path, steps: int) -> None:
    """Give the stock thread (stored at its exit only) LISTED more checkpoints, each
    stored as it is made: a new question, and LISTED / 2 + 1 more steps."""
    from langgraph.checkpoint.sqlite import SqliteSaver

    more = steps + LISTED // 2 + 1
    conn = _wal_full(path)
    try:
        graph = _graph(more).compile(checkpointer=SqliteSaver(conn))
        graph.invoke({"messages": [{"role": "user", "content": "and the next ones?"}]},
                     _thread(more), durability="sync")
    finally:
        conn.close()


def _journal_list_ms(url: str, steps: int) -> float:
    from ..integrations.langgraph import JournalSaver

    as_new_process()
    start = time.perf_counter()
    store = open_store(url, readonly=True)
    listed = list(JournalSaver(store).list(_thread(steps), limit=LISTED))
    elapsed = time.perf_counter() - start
    store.close()
    _check_listed(listed, steps, "JournalSaver")
    return elapsed * 1e3


def _stock_list_ms(path: Path, steps: int) -> float:
    from langgraph.checkpoint.sqlite import SqliteSaver

    as_new_process()
    start = time.perf_counter()
    conn = _wal_full(path)
    listed = list(SqliteSaver(conn).list(_thread(steps), limit=LISTED))
    elapsed = time.perf_counter() - start
    conn.close()
    _check_listed(listed, steps, "SqliteSaver")
    return elapsed * 1e3


def _check_listed(listed: list[Any], steps: int, who: str) -> None:
    sizes = [len(t.checkpoint["channel_values"].get("messages", ())) for t in listed]
    if len(listed) != LISTED or min(sizes) < 2 * steps - LISTED:
        raise RuntimeError(f"{who} did not list the {steps}-step thread: {sizes}")


def _best_of_both(ours: Callable[[], float], theirs: Callable[[], float],
                  reps: int) -> tuple[float, float]:
    """The best of ``reps`` measures of each, taken in turns: a burst of other work on
    the machine then slows both sides, not all of one side's tries."""
    found = [(ours(), theirs()) for _ in range(reps)]
    return min(o for o, _ in found), min(t for _, t in found)


def _journal_resume_ms(url: str, steps: int) -> float:
    from ..integrations.langgraph import JournalSaver

    as_new_process()
    start = time.perf_counter()
    store = open_store(url, readonly=True)
    latest = JournalSaver(store).get_tuple(_thread(steps))
    elapsed = time.perf_counter() - start
    store.close()
    if latest is None or len(latest.checkpoint["channel_values"]["messages"]) != 2 * steps + 2:
        raise RuntimeError(f"JournalSaver did not load the {steps}-step thread")
    return elapsed * 1e3


def langgraph_figures(workdir: Path, postgres_url: str | None, plan: Plan, quick: bool,
                      say: Say, smoke: bool = False) -> list[Figure]:
    """Every figure of the section (see the module docstring)."""
    if (why := problem()) is not None:
        return [figure("langgraph.bytes_per_step.sqlite", None, "B/step",
                       note=f"skipped: {why}")]
    steps = 40 if smoke else QUICK_STEPS if quick else FULL_STEPS
    resume = (100,) if smoke else QUICK_RESUME if quick else FULL_RESUME
    return [*sqlite_figures(workdir, steps, say),
            *postgres_figures(workdir, postgres_url, steps, say),
            *resume_figures(workdir, resume, say, reps=1 if smoke else 3)]
