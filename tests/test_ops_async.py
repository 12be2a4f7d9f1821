"""The async shell's trips to stepper threads (ops.in_thread): results, errors, the
caller's context, cancellation, and the order the threads take work in."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time

import pytest

from agentjournal import ops

where: contextvars.ContextVar[str] = contextvars.ContextVar("where", default="unset")


def test_a_trip_returns_the_value_raises_the_error_and_sees_the_callers_context() -> None:
    async def main() -> tuple[int, str]:
        where.set("the caller")
        with pytest.raises(KeyError, match="missing"):
            await ops.in_thread(lambda: {}["missing"])
        return await ops.in_thread(lambda a, b: a + b, 2, 3), await ops.in_thread(where.get)

    assert asyncio.run(main()) == (5, "the caller")


def test_a_cancelled_trip_waits_for_its_function_to_return() -> None:
    started, release = threading.Event(), threading.Event()
    returned: list[str] = []

    def slow() -> None:
        started.set()
        release.wait(30)
        returned.append("returned")

    async def main() -> list[str]:
        task = asyncio.ensure_future(ops.in_thread(slow))
        await asyncio.to_thread(started.wait, 30)
        task.cancel()
        await asyncio.sleep(0.05)
        seen_before_release = list(returned)
        assert not task.done()  # still waiting for slow() to return
        task.cancel()  # a second cancel changes nothing
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        return seen_before_release

    assert asyncio.run(main()) == []
    assert returned == ["returned"]


def test_the_oldest_ranked_work_goes_first() -> None:
    """A run that came back from its model first makes its appends first: the threads
    take jobs by rank, not by arrival."""
    steppers = ops._Steppers(1)
    busy, release = threading.Event(), threading.Event()
    order: list[int] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()

        def hold() -> None:
            busy.set()
            release.wait(30)

        first = ops._Job(hold, (), loop)
        steppers.submit((0.0, 0), first)
        await asyncio.to_thread(busy.wait, 30)
        jobs = [ops._Job(order.append, (n,), loop) for n in (3, 1, 2)]
        for n, job in zip((3, 1, 2), jobs, strict=True):
            steppers.submit((float(n), n), job)
        release.set()
        await asyncio.gather(first.future, *(job.future for job in jobs))

    asyncio.run(main())
    assert order == [1, 2, 3]


def test_trips_that_end_while_the_loop_is_busy_wake_it_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Twenty trips end while the loop is busy (blocked in a callback): the loop is
    woken once for all of them (one callback from the threads), and each still gets
    its own value or error."""
    woken: list[object] = []
    real = asyncio.BaseEventLoop.call_soon_threadsafe

    def counted(self: asyncio.BaseEventLoop, callback: object, *args: object) -> object:
        woken.append(callback)
        return real(self, callback, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(asyncio.BaseEventLoop, "call_soon_threadsafe", counted)

    def work(i: int) -> int:
        if i % 5 == 0:
            raise ValueError(i)
        return i * i

    async def main() -> list[object]:
        trips = [asyncio.ensure_future(ops.in_thread(work, i)) for i in range(20)]
        await asyncio.sleep(0)  # the trips are submitted
        ended, deadline = ops._ended_on(asyncio.get_running_loop()), time.monotonic() + 30
        while len(ended.jobs) < 20:  # the loop busy until every one has ended
            assert time.monotonic() < deadline
            time.sleep(0.001)
        return await asyncio.gather(*trips, return_exceptions=True)

    results = asyncio.run(main())
    assert [r if isinstance(r, int) else repr(r) for r in results] == [
        repr(ValueError(i)) if i % 5 == 0 else i * i for i in range(20)]
    assert len(woken) == 1, woken


def test_an_async_run_makes_one_trip_to_open_one_per_advance_and_one_to_close(
        tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run whose model answers at once: its open, the step machine's two advances
    (to the model's question, then to the end) and one trip for the rest (at rest, its
    result, its journal closed): four trips to a stepper thread, not six."""
    from agentjournal import Agent, open_store
    from agentjournal.models import ScriptedModel, reply

    trips: list[str] = []
    real = ops.in_thread

    async def counted(fn: object, *args: object) -> object:
        trips.append(getattr(fn, "__name__", repr(fn)))
        return await real(fn, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(ops, "in_thread", counted)
    import agentjournal.agent as agent_module

    monkeypatch.setattr(agent_module, "in_thread", counted)
    store = open_store(f"sqlite:///{tmp_path}/runs.db")
    try:
        result = asyncio.run(Agent(ScriptedModel([reply("done")]), []).arun(store, "r", "t"))
    finally:
        store.close()
    assert result.status == "finished"
    assert trips == ["__enter__", "_advance", "_advance", "_closed"], trips


def test_a_loop_that_made_trips_is_not_kept_alive_after_it_ends() -> None:
    """Each asyncio.run makes a new loop; once it has ended, nothing of the stepper
    threads' keeps it (a process running many would otherwise keep them all)."""
    import gc
    import weakref

    loops: list[weakref.ref[asyncio.AbstractEventLoop]] = []

    async def main() -> None:
        loops.append(weakref.ref(asyncio.get_running_loop()))
        await ops.in_thread(lambda: None)

    for _ in range(20):
        asyncio.run(main())
    deadline = time.monotonic() + 30  # a stepper thread may not have dropped its last job yet
    while True:
        gc.collect()
        alive = [ref for ref in loops if ref() is not None]
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    assert alive == []


FIRST_TRIP = """
import asyncio, threading
from agentjournal import ops

loop_thread, starts, real_start = threading.get_ident(), [], threading.Thread.start

def start(thread):
    starts.append(threading.get_ident())
    real_start(thread)

threading.Thread.start = start
assert asyncio.run(ops.in_thread(lambda: 7)) == 7
print(starts.count(loop_thread), ops.STEPPER_THREADS)
"""


def test_the_first_trip_of_a_process_waits_for_one_thread_to_start_not_all() -> None:
    """Thread.start waits until the new thread runs: the loop that makes a process's
    first trip starts one stepper thread, which starts the others (on a loaded machine,
    32 starts held that loop ~100 ms)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", FIRST_TRIP], capture_output=True, text=True,
                         check=True, timeout=60).stdout.split()
    on_loop, threads = map(int, out)
    assert (on_loop, threads) == (1, 32)
