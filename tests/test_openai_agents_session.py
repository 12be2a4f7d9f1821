"""JournalSession: the OpenAI Agents SDK's own session cases (tests/memory/test_session.py,
test_session_limit.py, test_session_context_wrapper.py of openai-agents-python) on every
store backend, the orphaned tool output refused, and a real SIGKILL between two
``add_items`` that never leaves half a batch."""

from __future__ import annotations

import asyncio
import concurrent.futures
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

import pytest
from agents import Agent, RunConfig, RunContextWrapper, Runner, SessionSettings
from agents.memory.session import Session, _session_accepts_wrapper
from agents.testing import ScriptedModel, assistant_message

from agentjournal import EventType, fold, open_store
from agentjournal.integrations.openai_agents import (
    JournalSession,
    OrphanToolOutputError,
    session_run_id,
)
from agentjournal.store import Store
from tests.conftest import backend_params
from tests.openai_agents_child import batch_items

ROOT = Path(__file__).resolve().parents[1]
T = TypeVar("T")
Items = list[Any]


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def texts(items: Items) -> list[Any]:
    return [i.get("content") for i in items]


def run_agent(method: str, agent: Agent[Any], data: Any, **kwargs: Any) -> Any:
    """One run by ``Runner.run``, ``run_sync`` or ``run_streamed`` (as the SDK's tests)."""
    if method == "run_sync":
        return Runner.run_sync(agent, data, **kwargs)

    async def go() -> Any:
        if method == "run":
            return await Runner.run(agent, data, **kwargs)
        result = Runner.run_streamed(agent, data, **kwargs)
        async for _ in result.stream_events():
            pass
        return result

    return run(go())


pytestmark = backend_params()


# --- the SDK's direct session cases -----------------------------------------------------


def test_it_is_a_session_that_takes_the_run_context(make_store: Callable[[], Store]) -> None:
    session = JournalSession(make_store(), "protocol")
    assert isinstance(session, Session)
    assert _session_accepts_wrapper(session)  # the SDK passes it the run's context
    assert session.session_settings is None  # no limit (the SDK reads None so)
    limited = JournalSession(make_store(), "protocol", session_settings={"limit": 0})
    assert isinstance(limited.session_settings, SessionSettings)
    assert limited.session_settings.limit == 0


def test_items_round_trip_and_clear(make_store: Callable[[], Store]) -> None:
    session = JournalSession(make_store(), "direct_test")
    items: Items = [{"role": "user", "content": "Hello"},
                    {"role": "assistant", "content": "Hi there!"}]

    async def go() -> None:
        await session.add_items(items)
        assert await session.get_items() == items
        await session.clear_session()
        assert await session.get_items() == []

    run(go())


def test_pop_item_returns_newest_first_then_none(make_store: Callable[[], Store]) -> None:
    session = JournalSession(make_store(), "pop_test")

    async def go() -> None:
        assert await session.pop_item() is None
        await session.add_items([{"role": "user", "content": "Hello"},
                                 {"role": "assistant", "content": "Hi there!"},
                                 {"role": "user", "content": "How are you?"}])
        assert len(await session.get_items()) == 3
        assert await session.pop_item() == {"role": "user", "content": "How are you?"}
        assert texts(await session.get_items()) == ["Hello", "Hi there!"]
        assert (await session.pop_item() or {}).get("content") == "Hi there!"
        assert (await session.pop_item() or {}).get("content") == "Hello"
        assert await session.pop_item() is None
        assert await session.get_items() == []

    run(go())


def test_pops_and_clears_are_recorded_and_nothing_is_deleted(
        make_store: Callable[[], Store]) -> None:
    store = make_store()
    session = JournalSession(store, "audit")

    async def go() -> None:
        await session.add_items([{"role": "user", "content": f"m{i}"} for i in range(3)])
        await session.pop_item()
        await session.clear_session()
        await session.clear_session()  # already empty: nothing to record
        await session.pop_item()  # empty: nothing to record

    run(go())
    log = list(store.read(session_run_id("audit")))
    assert [e.type for e in log] == [EventType.SESSION_ITEMS_ADDED,
                                     EventType.SESSION_ITEM_POPPED, EventType.SESSION_CLEARED]
    assert len(log[0].payload["items"]) == 3  # the popped and cleared items stay in the log
    assert log[1].payload["index"] == 2 and log[2].payload["count"] == 2
    assert fold(log).session == []


def test_pop_only_affects_its_own_session(make_store: Callable[[], Store]) -> None:
    store = make_store()
    one, two = JournalSession(store, "session_1"), JournalSession(store, "session_2")

    async def go() -> None:
        await one.add_items([{"role": "user", "content": "Session 1 message"}])
        await two.add_items([{"role": "user", "content": "Session 2 message 1"},
                             {"role": "user", "content": "Session 2 message 2"}])
        assert (await two.pop_item() or {}).get("content") == "Session 2 message 2"
        assert texts(await one.get_items()) == ["Session 1 message"]
        assert texts(await two.get_items()) == ["Session 2 message 1"]

    run(go())


def test_get_items_with_limit(make_store: Callable[[], Store]) -> None:
    session = JournalSession(make_store(), "count_test")
    items: Items = [{"role": r, "content": f"{w} {n}"} for n in (1, 2, 3)
                    for r, w in (("user", "Message"), ("assistant", "Response"))]

    async def go() -> None:
        await session.add_items(items)
        assert await session.get_items() == items
        assert await session.get_items(limit=2) == items[-2:]
        assert await session.get_items(limit=4) == items[-4:]
        assert await session.get_items(limit=10) == items
        assert await session.get_items(limit=0) == []
        assert await session.get_items(limit=-1) == items  # SQLiteSession's: all of them

    run(go())


def test_settings_limit_is_the_default_and_an_explicit_limit_wins(
        make_store: Callable[[], Store]) -> None:
    store = make_store()
    three = JournalSession(store, "settings", session_settings=SessionSettings(limit=3))
    five = JournalSession(store, "settings", session_settings={"limit": 5})

    async def go() -> None:
        await three.add_items([{"role": "user", "content": f"Message {i}"} for i in range(10)])
        assert texts(await three.get_items()) == [f"Message {i}" for i in (7, 8, 9)]
        assert len(await five.get_items()) == 5
        assert texts(await five.get_items(limit=2)) == ["Message 8", "Message 9"]

    run(go())
    with pytest.raises(TypeError, match="Unknown session settings: limitt"):
        JournalSession(store, "bad", session_settings={"limitt": 1})


def test_unicode_and_sql_like_content_round_trip(make_store: Callable[[], Store]) -> None:
    session = JournalSession(make_store(), "special")
    contents = ["こんにちは", "😊👍", "Привет", "O'Reilly", "DROP TABLE sessions;",
                '"SELECT * FROM users WHERE name = "admin";"',
                "Robert'); DROP TABLE students;--", "line\nbreak\u2028and\x1bescape"]

    async def go() -> None:
        await session.add_items([{"role": "user", "content": c} for c in contents])
        assert texts(await session.get_items()) == contents

    run(go())


def test_concurrent_writers_lose_nothing(make_store: Callable[[], Store]) -> None:
    # Threads of this process on one session, and a second handle (another writer, as
    # another process would be) on the same store: every item lands, each batch whole.
    store, other = make_store(), make_store()
    session, elsewhere = JournalSession(store, "concurrent"), JournalSession(other, "concurrent")

    def add(i: int) -> None:
        target = session if i % 2 else elsewhere
        asyncio.run(target.add_items([{"role": "user", "content": f"Message {i}"},
                                      {"role": "assistant", "content": f"Reply {i}"}]))

    with concurrent.futures.ThreadPoolExecutor(max_workers=5) as pool:
        list(pool.map(add, range(10)))
    got = texts(run(session.get_items()))
    assert sorted(got) == sorted([f"Message {i}" for i in range(10)]
                                 + [f"Reply {i}" for i in range(10)])
    assert all(got[k + 1] == got[k].replace("Message", "Reply") for k in range(0, 20, 2))
    assert run(elsewhere.get_items()) == run(session.get_items())


def test_a_stale_writer_reads_what_it_missed_before_it_pops(
        make_store: Callable[[], Store]) -> None:
    one, two = JournalSession(make_store(), "stale"), JournalSession(make_store(), "stale")

    async def go() -> None:
        await one.add_items([{"role": "user", "content": "first"}])
        assert texts(await one.get_items()) == ["first"]  # one has folded up to seq 1
        await two.add_items([{"role": "user", "content": "second"}])
        assert (await one.pop_item() or {}).get("content") == "second"  # not "first"
        assert texts(await two.get_items()) == ["first"]

    run(go())


# --- the orphaned tool output (openai-agents-python#4827) --------------------------------


def call(call_id: str) -> dict[str, Any]:
    return {"type": "function_call", "call_id": call_id, "name": "lookup", "arguments": "{}"}


def output(call_id: str) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": "sunny"}


def test_an_output_whose_call_is_not_in_the_session_is_refused_whole(
        make_store: Callable[[], Store]) -> None:
    store = make_store()
    session = JournalSession(store, "orphans")

    async def go() -> None:
        await session.add_items([{"role": "user", "content": "weather?"}, call("call_1")])
        with pytest.raises(OrphanToolOutputError, match=r"call 'call_2'.*No tool call found"):
            await session.add_items([output("call_1"), output("call_2")])
        # An output before its call in one batch is refused too, and nothing is stored.
        with pytest.raises(OrphanToolOutputError) as refused:
            await session.add_items(cast(Any, [output("call_3"), call("call_3")]))
        assert refused.value.call_id == "call_3"
        assert refused.value.item_type == "function_call_output"
        assert len(await session.get_items()) == 2
        # The call's own output, later or with its call in one batch, is stored.
        await session.add_items(cast(Any, [output("call_1"), call("call_4"), output("call_4")]))
        assert len(await session.get_items()) == 5
        # Other kinds of call are paired the same way.
        with pytest.raises(OrphanToolOutputError):
            await session.add_items([{"type": "computer_call_output", "call_id": "cc_9",
                                      "output": {"type": "computer_screenshot"}}])

    run(go())
    assert store.last_seq(session_run_id("orphans")) == 2  # the refused batches left nothing


def test_an_output_naming_no_call_or_an_item_that_is_not_a_call_is_refused_whole(
        make_store: Callable[[], Store]) -> None:
    store = make_store()
    session = JournalSession(store, "unnamed")
    message = {"type": "message", "id": "msg_1", "role": "assistant", "call_id": "msg_1",
               "content": [{"type": "output_text", "text": "Looking.", "annotations": []}]}
    unanswerable = {
        "an empty call id": output(""),
        "no call id": {"type": "function_call_output", "output": "sunny"},
        "a null call id": {"type": "function_call_output", "call_id": None, "output": "x"},
        "a message's id": output("msg_1"),
        "a call of another kind": {"type": "computer_call_output", "call_id": "call_1",
                                   "output": {"type": "computer_screenshot"}},
    }

    async def go() -> None:
        await session.add_items(cast(Any, [message, call("call_1")]))
        for why, orphan in unanswerable.items():
            with pytest.raises(OrphanToolOutputError, match="nothing of this batch") as refused:
                await session.add_items(cast(Any, [output("call_1"), orphan]))
            assert refused.value.item_type == orphan["type"], why
            assert refused.value.call_id == (orphan.get("call_id") or ""), why
        assert len(await session.get_items()) == 2
        # An anonymous tool search (the API's own, without ids) answers the one before it.
        await session.add_items(cast(Any, [{"type": "tool_search_call", "arguments": {}},
                                           {"type": "tool_search_output", "tools": []}]))

    run(go())
    assert store.last_seq(session_run_id("unnamed")) == 2  # the refused batches left nothing


def test_the_sdk_limit_boundary_drops_an_output_whose_call_it_cut(
        make_store: Callable[[], Store]) -> None:
    # The session returns the raw tail; the SDK drops the output whose call the limit cut.
    session = JournalSession(make_store(), "limit_tool_pair")
    history: Items = [{"role": "user", "content": "What is the weather?"}, call("call_1"),
                      output("call_1"),
                      {"type": "message", "role": "assistant", "content": [
                          {"type": "output_text", "text": "It is sunny.", "annotations": []}]}]
    run(session.add_items(history))
    assert run(session.get_items(limit=2)) == history[-2:]
    model = ScriptedModel(steps=[[assistant_message("Tomorrow is sunny too.")]])
    Runner.run_sync(Agent(name="test", model=model), "What about tomorrow?", session=session,
                    run_config=RunConfig(session_settings=SessionSettings(limit=2)))
    assert model.calls[-1].input == [history[-1],
                                     {"role": "user", "content": "What about tomorrow?"}]


# --- the SDK's runner cases -------------------------------------------------------------


@pytest.mark.parametrize("method", ["run", "run_sync", "run_streamed"])
def test_the_runner_keeps_the_conversation_in_the_session(
        make_store: Callable[[], Store], method: str) -> None:
    store = make_store()
    model = ScriptedModel()
    agent = Agent(name="test", model=model)
    cats, dogs = JournalSession(store, "session_1"), JournalSession(store, "session_2")
    model.enqueue([assistant_message("San Francisco")])
    first = run_agent(method, agent, "What city is the Golden Gate Bridge in?", session=cats)
    assert first.final_output == "San Francisco"
    model.enqueue([assistant_message("I like dogs")])
    run_agent(method, agent, "I like dogs", session=dogs)
    # A new handle on the store: the conversation comes from the log, not from memory.
    again = JournalSession(open_store(store.url), "session_1")
    model.enqueue([assistant_message("California")])
    second = run_agent(method, agent, "What state is it in?", session=again)
    assert second.final_output == "California"
    sent = model.calls[-1].input
    assert [i.get("content") for i in sent if i.get("role") == "user"] == [
        "What city is the Golden Gate Bridge in?", "What state is it in?"]
    assert len(run(again.get_items())) == 4
    assert len(run(dogs.get_items())) == 2


def test_list_input_is_appended_and_settings_override_the_session_limit(
        make_store: Callable[[], Store]) -> None:
    session = JournalSession(make_store(), "override",
                             session_settings=SessionSettings(limit=100))
    history: Items = [{"role": "user", "content": f"Turn {i}"} for i in range(10)]
    run(session.add_items(history))
    model = ScriptedModel(steps=[[assistant_message("Got it")], [assistant_message("More")]])
    agent = Agent(name="test", model=model)
    Runner.run_sync(agent, [{"role": "user", "content": "Test message"}], session=session)
    assert model.calls[-1].input == [*history, {"role": "user", "content": "Test message"}]
    Runner.run_sync(agent, "New question", session=session,
                    run_config=RunConfig(session_settings=SessionSettings(limit=2)))
    sent = model.calls[-1].input
    assert sent == [{"role": "user", "content": "Test message"}, sent[1],
                    {"role": "user", "content": "New question"}]  # 2 of history, the input
    assert sent[1].get("role") == "assistant"


def test_a_session_input_callback_that_repeats_history_does_not_grow_it(
        make_store: Callable[[], Store]) -> None:
    session = JournalSession(make_store(), "session_repeat")
    model = ScriptedModel()
    agent = Agent(name="test", model=model)

    def repeat_first(history: Items, new_input: Items) -> Items:
        return [*history, history[0], *new_input] if history else new_input

    for turn in range(3):
        model.enqueue([assistant_message(f"assistant {turn}")])
        Runner.run_sync(agent, f"user {turn}", session=session,
                        run_config=RunConfig(session_input_callback=repeat_first))
    stored = run(session.get_items())
    assert [i.get("content") for i in stored if i.get("role") == "user"] == [
        "user 0", "user 1", "user 2"]
    assert len(stored) == 6


@dataclass
class TenantContext:
    tenant_id: str


def test_a_context_aware_session_keeps_each_tenant_apart(
        make_store: Callable[[], Store]) -> None:
    def tenant(wrapper: RunContextWrapper[Any]) -> str:
        return cast(TenantContext, wrapper.context).tenant_id

    store = make_store()
    session = JournalSession(store, "shared", scope=tenant)
    model = ScriptedModel(steps=[[assistant_message("a1")], [assistant_message("b1")],
                                 [assistant_message("a2")]])
    agent = Agent(name="test", model=model)
    for who, said in (("tenant-a", "hello from a"), ("tenant-b", "hello from b"),
                      ("tenant-a", "again from a")):
        Runner.run_sync(agent, said, session=session, context=TenantContext(who))
    sent = model.calls[-1].input
    assert [i.get("content") for i in sent if i.get("role") == "user"] == [
        "hello from a", "again from a"]
    assert run(session.get_items()) == []  # no context: the session's own log, unused
    assert len(fold(store.read(session_run_id("shared:tenant-a"))).session or []) == 4
    assert len(fold(store.read(session_run_id("shared:tenant-b"))).session or []) == 2


# --- SIGKILL between two add_items ------------------------------------------------------


BATCH = 40


def test_a_sigkill_between_add_items_never_leaves_half_a_batch(
        request: pytest.FixtureRequest, store_url: str) -> None:
    rng = random.Random()
    for kill in range(8 if request.config.getoption("--slow") else 2):
        session_id = f"killed-{kill}"
        child = subprocess.Popen(
            [sys.executable, "-m", "tests.openai_agents_child", "session-writer", "--store",
             store_url, "--session", session_id, "--batch", str(BATCH)],
            cwd=ROOT, stdout=subprocess.PIPE, text=True)
        assert child.stdout is not None
        acknowledged = -1
        for _ in range(rng.randint(1, 4)):
            line = child.stdout.readline()
            assert line.startswith("added "), f"writer stopped: {line!r}"
            acknowledged = int(line.split()[1])
        # Somewhere in the next append (or between two): a batch being written.
        time.sleep(rng.uniform(0, 0.02))
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
        store = open_store(store_url)
        try:
            items = run(JournalSession(store, session_id).get_items())
        finally:
            store.close()
        assert len(items) % BATCH == 0, f"a partial batch: {len(items)} items"
        batches = len(items) // BATCH
        assert batches >= acknowledged + 1  # every acknowledged batch is there
        assert items == [i for b in range(batches) for i in batch_items(b, BATCH)]
