"""JournalSaver against LangGraph's own conformance suite (which calls only the async
methods) on every backend, and the same cases through the sync methods."""

from __future__ import annotations

import asyncio
import inspect
import json
import resource
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph.checkpoint.conformance")

from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.spec import (
    test_delete_thread,
    test_get_tuple,
    test_list,
    test_put,
    test_put_writes,
)

from agentjournal import open_store
from agentjournal.integrations.langgraph import JournalSaver
from agentjournal.store import Store

from .conftest import backend_params

BASE = {"put", "put_writes", "get_tuple", "list", "delete_thread"}


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    s = open_store(store_url)
    yield s
    s.close()


@backend_params()
def test_the_conformance_suite_passes(store: Store) -> None:
    savers: list[JournalSaver] = []

    @checkpointer_test(name=f"JournalSaver[{store.url.split(':')[0]}]")
    async def factory() -> AsyncIterator[JournalSaver]:
        saver = JournalSaver(store)
        savers.append(saver)
        yield saver
        saver.close()

    report = asyncio.run(validate(factory))
    failures = {name: r.failures for name, r in report.results.items() if r.passed is False}
    assert failures == {}
    assert report.passed_all_base()
    assert {name for name, r in report.results.items() if r.passed} == BASE


class SyncSaver:
    """The suite's async calls answered by JournalSaver's *sync* methods, so the same
    cases check the sync path (the suite itself calls only the async twins)."""

    def __init__(self, saver: JournalSaver) -> None:
        self.saver = saver

    async def aput(self, *args: Any, **kwargs: Any) -> Any:
        return self.saver.put(*args, **kwargs)

    async def aput_writes(self, *args: Any, **kwargs: Any) -> None:
        self.saver.put_writes(*args, **kwargs)

    async def aget_tuple(self, *args: Any, **kwargs: Any) -> Any:
        return self.saver.get_tuple(*args, **kwargs)

    async def alist(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        for item in self.saver.list(*args, **kwargs):
            yield item

    async def adelete_thread(self, thread_id: str) -> None:
        self.saver.delete_thread(thread_id)


def _cases() -> list[Callable[..., Any]]:
    return [*test_put.ALL_PUT_TESTS, *test_put_writes.ALL_PUT_WRITES_TESTS,
            *test_get_tuple.ALL_GET_TUPLE_TESTS, *test_list.ALL_LIST_TESTS,
            *test_delete_thread.ALL_DELETE_THREAD_TESTS]


@backend_params()
def test_the_sync_methods_pass_the_same_cases(store: Store) -> None:
    saver = JournalSaver(store)
    failed = []
    for case in _cases():
        assert inspect.iscoroutinefunction(case)
        try:
            asyncio.run(case(SyncSaver(saver)))
        except Exception as exc:  # collect every failing case, not only the first
            failed.append(f"{case.__name__}: {type(exc).__name__}: {exc}")
    saver.close()
    assert failed == []
    assert len(_cases()) == 58  # every case of the five base capabilities (0.0.2)


@backend_params()
def test_pending_writes_come_back_in_langgraphs_order(store: Store) -> None:
    """The same writes, put in a scrambled order, read back as InMemorySaver orders them
    (writes_sort_key: task path, task id, idx), special channels replaced, repeats kept
    once."""
    from langgraph.checkpoint.base import empty_checkpoint
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.checkpoint.serde.types import ERROR, INTERRUPT

    batches = [
        (("~__pregel_pull, b", "t-2"), [("x", 1), ("y", 2)]),
        (("~__pregel_pull, a", "t-9"), [("x", 3), (INTERRUPT, "first")]),
        (("~__pregel_push, 0", "t-1"), [("z", 4)]),
        (("~__pregel_pull, a", "t-9"), [("x", 5), (INTERRUPT, "second")]),  # repeat
        (("~__pregel_pull, b", "t-2"), [(ERROR, "boom")]),
    ]
    ours, memory = JournalSaver(store), InMemorySaver()
    got = []
    for saver in (ours, memory):
        config = saver.put({"configurable": {"thread_id": "order", "checkpoint_ns": ""}},
                           empty_checkpoint(), {"source": "loop", "step": 0}, {})
        for (path, task), writes in batches:
            saver.put_writes(config, writes, task, path)
        tup = saver.get_tuple(config)
        assert tup is not None
        got.append(tup.pending_writes)
    assert got[0] == got[1]
    assert ("t-9", "x", 3) in got[0] and ("t-9", INTERRUPT, "second") in got[0]
    ours.close()


# --- a value changed under a version it was stored with --------------------------------
#
# A version names a value in LangGraph's savers only because theirs are unique (a random
# suffix); JournalSaver's are counters, so a time-travel fork (update_state on an older
# checkpoint) gives a channel a version another branch already stored with another value.
# Each case runs in a child limited in memory and time: a read that loops (as one did,
# growing by gigabytes a minute) fails the test at once instead of eating the machine.

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 1 << 30  # bytes of address space for the child (it needs about a third)
HANG = 120  # seconds: a hang guard, never a timing assertion


def bounded(case: str, store_url: str) -> Any:
    """``case(store_url)`` run in a child process under LIMIT and HANG: its JSON result."""
    code = ("import json, sys\n"
            f"from tests.test_langgraph_saver import {case}\n"
            f"print(json.dumps({case}(sys.argv[1])))\n")
    done = subprocess.run(
        [sys.executable, "-c", code, store_url], cwd=ROOT, capture_output=True, text=True,
        timeout=HANG, preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT)))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def puts_under_one_version(store_url: str) -> dict[str, Any]:
    """The report's case: three puts giving channel "m" (a list longer than a chunk, so
    the later ones are stored as changes) and "s" other values under version 1, then a
    checkpoint that changes nothing; each read back by a fresh saver."""
    from langgraph.checkpoint.base import empty_checkpoint

    store = open_store(store_url)
    saver = JournalSaver(store)
    config: dict[str, Any] = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    shared = [f"item {k}" for k in range(20)]  # the same objects in the first chunk
    for n in range(3):
        cp = empty_checkpoint()
        cp["id"] = f"cp-{n}"
        cp["channel_values"] = {"m": [*shared, f"put {n}"], "s": f"scalar {n}"}
        cp["channel_versions"] = {"m": 1, "s": 1}
        config = saver.put(config, cp, {"step": n}, {"m": 1, "s": 1})
    cp = empty_checkpoint()
    cp["id"], cp["channel_versions"] = "cp-3", {"m": 1, "s": 1}
    saver.put(config, cp, {"step": 3}, {})  # nothing new: both as its parent's
    saver.close()
    fresh = JournalSaver(store)
    got = {}
    for n in range(4):
        tup = fresh.get_tuple({"configurable": {"thread_id": "t", "checkpoint_ns": "",
                                                "checkpoint_id": f"cp-{n}"}})
        assert tup is not None
        values = tup.checkpoint["channel_values"]
        got[f"cp-{n}"] = [len(values["m"]), values["m"][-1], values["s"]]
    fresh.close()
    store.close()
    return got


@backend_params()
def test_a_value_changed_under_its_version_reads_back_as_each_checkpoint_put_it(
        store_url: str) -> None:
    got = bounded("puts_under_one_version", store_url)
    assert got == {"cp-0": [21, "put 0", "scalar 0"], "cp-1": [21, "put 1", "scalar 1"],
                   "cp-2": [21, "put 2", "scalar 2"], "cp-3": [21, "put 2", "scalar 2"]}


def _forked_history(saver: Any) -> list[Any]:
    """Two turns, a fork from the first turn's input checkpoint (update_state: the
    message channel's next version is one the first branch used), the fork run on, then
    every checkpoint of the thread: its step and its messages, newest first."""
    from langchain_core.messages import AIMessage, HumanMessage
    from langgraph.graph import END, START, MessagesState, StateGraph

    def answer(state: MessagesState) -> dict[str, Any]:
        return {"messages": [AIMessage(f"answer to {state['messages'][-1].content}")]}

    builder = StateGraph(MessagesState)
    builder.add_node("answer", answer)
    builder.add_edge(START, "answer")
    builder.add_edge("answer", END)
    graph = builder.compile(checkpointer=saver)
    config: dict[str, Any] = {"configurable": {"thread_id": "forked"}}
    for text in ("one", "two"):
        graph.invoke({"messages": [HumanMessage(text)]}, config, durability="sync")
    first_input = [s for s in graph.get_state_history(config) if s.metadata["step"] == 0]
    fork = graph.update_state(first_input[0].config, {"messages": [HumanMessage("fork")]})
    graph.invoke(None, fork, durability="sync")
    graph.invoke({"messages": [HumanMessage("three")]}, config, durability="sync")
    return [[s.metadata["step"], [m.content for m in s.values.get("messages", [])]]
            for s in graph.get_state_history(config)]


def forked_thread(store_url: str) -> list[Any]:
    store = open_store(store_url)
    saver = JournalSaver(store)
    _forked_history(saver)
    saver.close()
    fresh = JournalSaver(store)  # what the log says, not what the writer remembers
    from langgraph.graph import END, START, MessagesState, StateGraph

    builder = StateGraph(MessagesState)
    builder.add_node("answer", lambda state: {})
    builder.add_edge(START, "answer")
    builder.add_edge("answer", END)
    config: dict[str, Any] = {"configurable": {"thread_id": "forked"}}
    history = [[s.metadata["step"], [m.content for m in s.values.get("messages", [])]]
               for s in builder.compile(checkpointer=fresh).get_state_history(config)]
    fresh.close()
    store.close()
    return history


@backend_params()
def test_a_time_travel_fork_reads_back_as_langgraphs_own_saver_reads_it(
        store_url: str) -> None:
    from langgraph.checkpoint.memory import InMemorySaver

    expected = json.loads(json.dumps(_forked_history(InMemorySaver())))
    got = bounded("forked_thread", store_url)
    assert got == expected
    assert ["fork"] in [[m for m in messages if m == "fork"] for _, messages in got]


def test_a_change_built_on_itself_is_refused_as_damage_not_followed_forever() -> None:
    """No writer stores such a reference (a change is based on a version naming one
    value, and the first value stored under a version stands), but a read of any log
    ends: a chain of changes that comes back to itself is a CorruptLogError."""
    from agentjournal import CorruptLogError
    from agentjournal.events import Event, EventType, now
    from agentjournal.integrations._graphlog import GraphIndex

    def checkpoint(seq: int, cid: str, ref: dict[str, Any]) -> Event:  # a crafted log
        return Event(run_id="lg-x", seq=seq, type=EventType.GRAPH_CHECKPOINT, ts=now(),
                     payload={"ns": "", "id": cid, "parent_id": None, "checkpoint": ["", ""],
                              "metadata": ["", ""], "values": {"m": [1, ref]}})

    index = GraphIndex()
    index.apply(checkpoint(1, "a", {"d": [1, 0, []]}))  # version 1: version 1, changed
    record = index.checkpoints[""]["a"]
    ref = index.ref_of(record, "m", 1)
    assert ref is not None
    with pytest.raises(CorruptLogError) as damaged:
        index.read_list(record, "m", ref)
    assert damaged.value.seq == 1 and "built on itself" in str(damaged.value)
