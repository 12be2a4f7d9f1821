"""JournalSaver against LangGraph's own conformance suite (which calls only the async
methods) on every backend, and the same cases through the sync methods."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Callable, Iterator
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
