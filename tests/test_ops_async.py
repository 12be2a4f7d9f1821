"""The async shell's trips to stepper threads (ops.in_thread): results, errors, the
caller's context, cancellation, and the order the threads take work in."""

from __future__ import annotations

import asyncio
import contextvars
import threading

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
