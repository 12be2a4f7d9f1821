"""What the step machine asks of the world, and the two shells that do it.

The loop's logic (steps.py, settle.py) is written once, as generators: it
records facts itself (appends are synchronous and fast) and *yields* every
operation that waits on the world — a model call, a lookup, a batch of tool
calls, a pause before a retry. ``run_sync`` performs them in the calling
thread (a batch of calls on a thread pool); ``run_async`` awaits them (a batch
as tasks, sync tools and models in threads). An operation's value is sent back
into the generator; its exception is thrown into it at the ``yield``.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import heapq
import inspect
import itertools
import os
import threading
import time
from collections.abc import Callable, Generator
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any, TypeVar

from .models import Model, ModelRequest
from .state import PendingCall
from .tools import CallGuard, CallRunner, Tool, ToolTimedOut

T = TypeVar("T")


@dataclass(frozen=True)
class Ask:
    """One model call; its value is the ModelResponse (or a ModelError is thrown)."""

    model: Model
    request: ModelRequest


@dataclass(frozen=True)
class Begin:
    """Start a background model call; its value is the provider's id for it."""

    model: Any  # a BackgroundModel
    request: ModelRequest


@dataclass(frozen=True)
class Collect:
    """Wait for the answer of a background call started earlier, maybe by a dead process."""

    model: Any  # a BackgroundModel
    handle: str
    request: ModelRequest


@dataclass(frozen=True)
class Sleep:
    seconds: float


@dataclass(frozen=True)
class LookUp:
    """A tool's reconcile lookup for an uncertain call; its value is the evidence."""

    tool: Tool
    pending: PendingCall


@dataclass(frozen=True)
class Call:
    """One tool call ready to run: ``run()`` calls the tool (an awaitable for an async one)."""

    run: Callable[[], Any]
    timeout: float | None
    guard: CallGuard
    name: str
    is_async: bool = False


@dataclass(frozen=True)
class Outcome:
    value: Any = None
    error: BaseException | None = None


@dataclass(frozen=True)
class Invoke:
    """Run ``calls`` concurrently (at most ``limit`` at once); ``done(i, outcome)`` is called
    in the shell's own thread as each finishes, so completions are recorded as they come."""

    calls: list[Call]
    done: Callable[[int, Outcome], None]
    limit: int


Op = Ask | Begin | Collect | Sleep | LookUp | Invoke
Steps = Generator[Op, Any, T]


# --- the sync shell --------------------------------------------------------------------

_runners = threading.local()  # a CallRunner per calling thread


def _runner() -> CallRunner:
    runner: CallRunner | None = getattr(_runners, "runner", None)
    if runner is None:
        runner = _runners.runner = CallRunner()
    return runner


def _resolve(value: Any) -> Any:
    """An async tool's (or lookup's) awaitable, run to its end in this thread."""
    return asyncio.run(value) if inspect.isawaitable(value) else value  # type: ignore[arg-type]


def call_in_thread(call: Call) -> Any:
    """The call within its timeout, on a worker thread; inline when it has none."""
    if call.timeout is None:
        return _resolve(call.run())
    return _runner().call(lambda: _resolve(call.run()), call.timeout, call.guard, call.name)


def _outcome(fn: Callable[[], Any]) -> Outcome:
    try:
        return Outcome(value=fn())
    except Exception as exc:
        return Outcome(error=exc)


def _invoke_sync(op: Invoke) -> None:
    if len(op.calls) == 1 or op.limit <= 1:
        for i, call in enumerate(op.calls):
            op.done(i, _outcome(lambda call=call: call_in_thread(call)))  # type: ignore[misc]
        return
    with ThreadPoolExecutor(min(op.limit, len(op.calls)),
                            thread_name_prefix="agentjournal-call") as pool:
        running = {pool.submit(_outcome, lambda c=c: call_in_thread(c)): i  # type: ignore[misc]
                   for i, c in enumerate(op.calls)}
        for future in as_completed(running):
            op.done(running[future], future.result())


def _perform_sync(op: Op) -> Any:
    match op:
        case Ask(model=model, request=request):
            return model.complete(request)
        case Begin(model=model, request=request):
            return model.begin(request)
        case Collect(model=model, handle=handle, request=request):
            return model.collect(handle, request)
        case Sleep(seconds=seconds):
            time.sleep(seconds)
            return None
        case LookUp(tool=tool, pending=pending):
            assert tool.reconcile is not None
            return _resolve(tool.reconcile(pending))
        case Invoke():
            return _invoke_sync(op)
    raise TypeError(f"unknown operation {op!r}")


def run_sync(steps: Steps[T]) -> T:
    """Drive ``steps`` to its end, performing each operation in this thread."""
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            op = steps.throw(error) if error is not None else steps.send(value)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        value, error = None, None
        try:
            value = _perform_sync(op)
        except Exception as exc:
            error = exc


# --- the async shell -------------------------------------------------------------------

#: Threads that advance async runs' step machines and make their appends. Each one
#: waiting on a commit is a run whose batch joins the next group, so there are many.
STEPPER_THREADS = 32

#: The rank of the work a task hands the stepper threads: (when the run last came back
#: from waiting on the world, a tie-breaker). Oldest first, so a run that got its model's
#: answer first makes all its appends first and waits on its model again first: a
#: thousand runs answered at once spread out, instead of each waiting for all the
#: others' appends before its own next turn.
_rank: contextvars.ContextVar[tuple[float, int]] = contextvars.ContextVar("agentjournal_rank")
_order = itertools.count()


class _Job:
    """One function for a stepper thread, and how it ended (set on the loop's thread)."""

    __slots__ = ("args", "context", "finished", "fn", "future", "loop", "waiter")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...],
                 loop: asyncio.AbstractEventLoop) -> None:
        self.fn, self.args, self.loop = fn, args, loop
        # In the caller's context (as asyncio.to_thread): a context variable the loop's
        # code set (a tracing span, the current call) is seen by what runs there.
        self.context = contextvars.copy_context()
        self.future: asyncio.Future[Any] = loop.create_future()
        self.finished = False
        self.waiter: asyncio.Future[None] | None = None  # a cancelled caller's wait

    def run(self) -> None:
        try:
            value, error = self.context.run(self.fn, *self.args), None
        except BaseException as exc:
            value, error = None, exc
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
            self.loop.call_soon_threadsafe(self._ended, value, error)

    def _ended(self, value: Any, error: BaseException | None) -> None:
        self.finished = True
        if not self.future.done():
            if error is None:
                self.future.set_result(value)
            else:
                self.future.set_exception(error)
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)


class _Steppers:
    """The stepper threads, taking jobs oldest rank first (see ``_rank``)."""

    def __init__(self, threads: int) -> None:
        self._jobs: list[tuple[tuple[float, int], int, _Job]] = []
        self._ready = threading.Condition(threading.Lock())
        for i in range(threads):
            threading.Thread(target=self._work, name=f"agentjournal-step-{i}",
                             daemon=True).start()

    def submit(self, rank: tuple[float, int], job: _Job) -> None:
        with self._ready:
            heapq.heappush(self._jobs, (rank, next(_order), job))
            self._ready.notify()

    def _work(self) -> None:
        while True:
            with self._ready:
                while not self._jobs:
                    self._ready.wait()
                job = heapq.heappop(self._jobs)[2]
            job.run()


_steppers: _Steppers | None = None
_steppers_lock = threading.Lock()


def _stepper_threads() -> _Steppers:
    global _steppers
    if _steppers is None:
        with _steppers_lock:
            if _steppers is None:
                _steppers = _Steppers(STEPPER_THREADS)
    return _steppers


def _forget_steppers() -> None:
    """In a forked child: the parent's threads are not there, and its lock may be held."""
    global _steppers, _steppers_lock
    _steppers, _steppers_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_steppers)


def _ranked() -> None:
    """Rank this task's next work as coming back from the world now."""
    _rank.set((time.monotonic(), next(_order)))


async def in_thread(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` on a stepper thread, awaited without blocking the loop. Cancelled,
    it still waits for ``fn`` to return (a generator cannot be closed while another
    thread advances it, nor a journal while it appends), then raises CancelledError. It
    runs in a copy of the caller's context, as ``asyncio.to_thread`` does. Stepper
    threads are for work that waits on the store, not on the world: a long call would
    hold one from every run."""
    rank = _rank.get(None)
    if rank is None:
        _ranked()
        rank = _rank.get()
    job = _Job(fn, args, asyncio.get_running_loop())
    _stepper_threads().submit(rank, job)
    try:
        return await job.future  # type: ignore[no-any-return]
    except asyncio.CancelledError:
        while not job.finished:
            job.waiter = job.loop.create_future()
            with contextlib.suppress(asyncio.CancelledError):
                await job.waiter
        raise


def _advance(steps: Steps[T], value: Any, error: BaseException | None,
             before: Callable[[], None] | None = None) -> tuple[bool, Any]:
    """The generator's next operation (False, op), or its result (True, value);
    ``before`` (the last completion of a batch of calls, recorded in the same trip to
    a stepper thread) first: what it raises is thrown into the generator."""
    if before is not None:
        try:
            before()
        except Exception as exc:
            error = exc
    try:
        op = steps.throw(error) if error is not None else steps.send(value)
    except StopIteration as stop:
        return True, stop.value
    return False, op


async def _call_async(call: Call) -> Any:
    if not call.is_async:
        return await asyncio.to_thread(call_in_thread, call)  # a sync tool: in a thread
    try:
        async with asyncio.timeout(call.timeout):
            return await call.run()
    except TimeoutError:
        call.guard.abandon()
        raise ToolTimedOut(f"{call.name} did not return within {call.timeout:g}s; "
                           "abandoned (it may have had an effect already)") from None


async def _invoke_async(op: Invoke, *, keep_last: bool = False) -> Callable[[], None] | None:
    """Run the batch, each completion recorded as it comes; ``keep_last``: the last one
    is returned unrecorded instead, for the caller to record on its next trip to a
    stepper thread (one trip fewer per batch)."""
    gate = asyncio.Semaphore(max(op.limit, 1))

    async def one(i: int, call: Call) -> tuple[int, Outcome]:
        try:
            return i, Outcome(value=await _call_async(call))
        except Exception as exc:
            return i, Outcome(error=exc)

    async def gated(i: int, call: Call) -> tuple[int, Outcome]:
        async with gate:
            return await one(i, call)

    left = len(op.calls)
    # A lone call is awaited as it is: no task, no queue of completions.
    ending = ([one(0, op.calls[0])] if left == 1 else
              asyncio.as_completed([gated(i, c) for i, c in enumerate(op.calls)]))
    for finished in ending:
        i, outcome = await finished
        left -= 1
        if keep_last and not left:
            return functools.partial(op.done, i, outcome)
        await in_thread(op.done, i, outcome)  # it appends the completion
    return None


async def _perform_async(op: Op) -> Any:
    match op:
        case Ask(model=model, request=request):
            if hasattr(model, "acomplete"):  # an AsyncModel (a Protocol's isinstance is slow)
                return await model.acomplete(request)
            return await asyncio.to_thread(model.complete, request)
        case Begin(model=model, request=request):
            if hasattr(model, "abegin"):
                return await model.abegin(request)
            return await asyncio.to_thread(model.begin, request)
        case Collect(model=model, handle=handle, request=request):
            if hasattr(model, "acollect"):
                return await model.acollect(handle, request)
            return await asyncio.to_thread(model.collect, handle, request)
        case Sleep(seconds=seconds):
            await asyncio.sleep(seconds)
            return None
        case LookUp(tool=tool, pending=pending):
            assert tool.reconcile is not None
            if inspect.iscoroutinefunction(tool.reconcile):
                return await tool.reconcile(pending)
            return await asyncio.to_thread(tool.reconcile, pending)
        case Invoke():
            return await _invoke_async(op)
    raise TypeError(f"unknown operation {op!r}")


async def run_async(steps: Steps[T]) -> T:
    """Drive ``steps`` to its end, awaiting each operation; the generator is advanced
    on a stepper thread (its appends wait there, never on the loop)."""
    value: Any = None
    error: BaseException | None = None
    last: Callable[[], None] | None = None  # a batch's last completion, not yet recorded
    while True:
        finished, op = await in_thread(_advance, steps, value, error, last)
        if finished:
            return op  # type: ignore[no-any-return]
        value, error, last = None, None, None
        try:
            if isinstance(op, Invoke):
                last = await _invoke_async(op, keep_last=True)
            else:
                value = await _perform_async(op)
        except Exception as exc:
            error = exc
        _ranked()  # back from the world
