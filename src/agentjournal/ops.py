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
import collections
import contextlib
import contextvars
import functools
import heapq
import inspect
import itertools
import os
import threading
import time
import weakref
from collections.abc import Callable, Generator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from .models import Model, ModelRequest
from .state import PendingCall
from .tools import (
    CallGuard,
    CallRunner,
    Tool,
    ToolTimedOut,
    abandoned,
    wait_for,
)

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


def _one_by_one(op: Invoke) -> bool:
    """Whether ``op``'s calls are made one after the other (one call, or a limit of one);
    else at once, on a pool."""
    return len(op.calls) == 1 or op.limit <= 1


def _invoke_sync(op: Invoke) -> None:
    if _one_by_one(op):
        for i, call in enumerate(op.calls):
            op.done(i, _outcome(lambda call=call: call_in_thread(call)))  # type: ignore[misc]
        return
    with ThreadPoolExecutor(min(op.limit, len(op.calls)),
                            thread_name_prefix="agentjournal-call") as pool:
        running = {pool.submit(_outcome, lambda c=c: call_in_thread(c)): i  # type: ignore[misc]
                   for i, c in enumerate(op.calls)}
        # (not as_completed: its wait has no end, and Ctrl-C must end it: see wait_for)
        finished: collections.deque[Future[Outcome]] = collections.deque()
        came = threading.Semaphore(0)

        def arrived(future: Future[Outcome]) -> None:
            finished.append(future)
            came.release()

        for future in running:
            future.add_done_callback(arrived)
        for _ in running:
            wait_for(lambda wait: came.acquire(timeout=wait), None)
            future = finished.popleft()
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


@dataclass(frozen=True)
class _InFlight:
    """The call a driver is making, and what a driver that goes on without it needs."""

    call: Call
    deadline: float  # time.monotonic()
    op: Invoke
    index: int


class _Watch:
    """One sync run driven on a thread of its own while the caller's thread watches it.

    Handing each tool call to another thread, to be able to stop waiting at its
    timeout, cost two wake-ups of an idle core per call (~100 µs here, a quarter of a
    step). Instead the driver makes the run's steps, model calls and tool calls alike,
    and the caller sleeps until the run ends or the call in flight passes its deadline.
    Then the caller abandons that call, with the driver stuck in it, and a new driver
    goes on from the call's timeout. A driver goes on only while it is ``driver``.
    """

    def __init__(self, steps: Steps[Any]) -> None:
        self.steps = steps
        self.context = contextvars.copy_context()  # the caller's, as for a call inline
        self.lock = threading.Condition(threading.Lock())  # all below, but steps
        self.busy = threading.Lock()  # held while a driver advances the steps
        self.driver: object | None = None
        self.in_flight: _InFlight | None = None
        self.wake_at = float("inf")  # when the watcher wakes: one due sooner wakes it
        self.patience: float | None = None  # the last call's timeout: sleep between calls
        self.ended = False
        self.value: Any = None
        self.error: BaseException | None = None

    def run(self) -> Any:
        try:
            with self.lock:
                self._start(None)
                while not self.ended:
                    self._watch()
        except BaseException:  # the caller was interrupted: no driver goes on
            with self.lock:
                self.driver = None
            with self.busy:  # but one amid its steps (appending) gets to their end first
                raise
        if self.error is not None:
            raise self.error
        return self.value

    def _watch(self) -> None:
        """Sleep until the run ends or the call in flight is due; abandon a call due."""
        now, flight = time.monotonic(), self.in_flight
        if flight is not None and flight.deadline <= now:
            flight.call.guard.abandon()
            assert flight.call.timeout is not None  # (only a call with one is in flight)
            self._start((flight, Outcome(error=abandoned(flight.call.name,
                                                         flight.call.timeout))))
            return
        wait = (flight.deadline - now if flight is not None else self.patience)
        self.wake_at = now + wait if wait is not None else float("inf")
        # In slices on the main thread (see wait_for), and a notify that comes as a slice
        # times out is lost (Condition.wait returns False): look at what it would say.
        wait_for(lambda slice: (self.lock.wait(slice) or self.ended
                                or self.in_flight is not flight), wait)

    def _start(self, after: tuple[_InFlight, Outcome] | None) -> None:
        """A new driver (the caller holds ``lock``), from the start or after a call."""
        token = self.driver = object()
        self.in_flight = None
        threading.Thread(target=self.context.copy().run, args=(self._drive, token, after),
                         name="agentjournal-run", daemon=True).start()

    def _drive(self, token: object, after: tuple[_InFlight, Outcome] | None) -> None:
        value: Any = None
        error: BaseException | None = None
        try:
            while True:
                if after is not None:  # the rest of a batch, from a call's timeout
                    (flight, outcome), after = after, None
                    op: Op = flight.op
                    first = flight.index
                else:
                    with self.busy:
                        if self.driver is not token:
                            return
                        try:
                            op = (self.steps.throw(error) if error is not None
                                  else self.steps.send(value))
                        except StopIteration as stop:
                            self._end(token, stop.value, None)
                            return
                    first, outcome = 0, None
                value, error = None, None
                try:
                    if isinstance(op, Invoke) and _one_by_one(op):
                        if not self._calls(token, op, first, outcome):
                            return
                    elif isinstance(op, Invoke):  # at once, each timed by its own thread
                        _invoke_sync(Invoke(op.calls, functools.partial(self._record, token, op),
                                            op.limit))
                    else:
                        value = _perform_sync(op)
                except Exception as exc:  # thrown into the steps at their next advance
                    error = exc
        except BaseException as exc:  # the steps' own, or one that is not an Exception
            self._end(token, None, exc)

    def _calls(self, token: object, op: Invoke, first: int, outcome: Outcome | None) -> bool:
        """Make ``op``'s calls one by one from ``first`` (whose ``outcome`` may be known:
        its timeout), each completion recorded; False once this driver may not go on."""
        for i in range(first, len(op.calls)):
            if outcome is None:
                outcome = self._make(token, op, i)
                if outcome is None:
                    return False
            self._record(token, op, i, outcome)
            if self.driver is not token:
                return False
            outcome = None
        return True

    def _record(self, token: object, op: Invoke, i: int, outcome: Outcome) -> None:
        """Call ``i``'s completion recorded, unless this driver may no longer go on."""
        with self.busy:
            if self.driver is token:
                op.done(i, outcome)

    def _make(self, token: object, op: Invoke, i: int) -> Outcome | None:
        """Call ``i``'s outcome, or None if it was abandoned at its timeout meanwhile."""
        call = op.calls[i]
        if call.timeout is not None:
            with self.lock:
                deadline = time.monotonic() + call.timeout
                self.in_flight = _InFlight(call, deadline, op, i)
                self.patience = call.timeout
                if deadline < self.wake_at:
                    self.lock.notify()
        outcome = _outcome(lambda: _resolve(call.run()))
        with self.lock:
            if self.driver is not token:
                return None
            self.in_flight = None
        return outcome

    def _end(self, token: object, value: Any, error: BaseException | None) -> None:
        with self.lock:
            if self.driver is token:
                self.ended, self.value, self.error = True, value, error
                self.lock.notify()


def run_watched(steps: Steps[T]) -> T:
    """:func:`run_sync`, with the steps and calls made on a driver thread while this one
    watches: a tool call past its timeout is abandoned as by :func:`call_in_thread`, at
    no cost to a call that returns in time (see _Watch). A call of a batch run at once
    is still timed by its own thread. Interrupted (KeyboardInterrupt), this thread
    returns at once (or within SIGNAL_LATENCY: see wait_for) unless the driver is
    appending: then once it has, and no driver goes on."""
    result: T = _Watch(steps).run()
    return result


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

    __slots__ = ("args", "context", "error", "finished", "fn", "future", "loop", "value",
                 "waiter")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...],
                 loop: asyncio.AbstractEventLoop) -> None:
        self.fn, self.args, self.loop = fn, args, loop
        self.value: Any = None
        self.error: BaseException | None = None
        # In the caller's context (as asyncio.to_thread): a context variable the loop's
        # code set (a tracing span, the current call) is seen by what runs there.
        self.context = contextvars.copy_context()
        self.future: asyncio.Future[Any] = loop.create_future()
        self.finished = False
        self.waiter: asyncio.Future[None] | None = None  # a cancelled caller's wait

    def run(self) -> None:
        try:
            self.value = self.context.run(self.fn, *self.args)
        except BaseException as exc:
            self.error = exc
        _ended_on(self.loop).add(self)

    def _ended(self) -> None:
        self.finished = True
        if not self.future.done():
            if self.error is None:
                self.future.set_result(self.value)
            else:
                self.future.set_exception(self.error)
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)


class _Ended:
    """The jobs a loop's stepper threads finished, handed to the loop in batches: one
    wake-up of the loop (a write to its self-pipe) for all the jobs that end while it
    is busy, not one each."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # Weakly: held strongly, the loop would outlive its last use as a key of
        # _ended_by_loop (a process that runs asyncio.run often would keep every loop).
        self.loop = weakref.ref(loop)
        self.jobs: collections.deque[_Job] = collections.deque()
        self.lock = threading.Lock()
        self.woken = False  # a drain is scheduled and has not begun

    def add(self, job: _Job) -> None:
        self.jobs.append(job)
        with self.lock:
            if self.woken:
                return  # the drain to come takes this one too
            self.woken = True
        loop = self.loop()
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        with self.lock:
            self.woken = False  # from here on, a job added schedules another drain
        while self.jobs:
            self.jobs.popleft()._ended()


_ended_by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Ended] = (
    weakref.WeakKeyDictionary())
_ended_lock = threading.Lock()


def _ended_on(loop: asyncio.AbstractEventLoop) -> _Ended:
    ended = _ended_by_loop.get(loop)
    if ended is None:
        with _ended_lock:
            ended = _ended_by_loop.setdefault(loop, _Ended(loop))
    return ended


class _Steppers:
    """The stepper threads, taking jobs oldest rank first (see ``_rank``)."""

    def __init__(self, threads: int) -> None:
        self._jobs: list[tuple[tuple[float, int], int, _Job]] = []
        self._ready = threading.Condition(threading.Lock())
        # The first starts the others: Thread.start waits until the new thread runs, and
        # on a loaded machine 32 such waits held the first caller's event loop ~100 ms.
        threading.Thread(target=self._start_all, args=(threads,), name="agentjournal-step-0",
                         daemon=True).start()

    def _start_all(self, threads: int) -> None:
        """(The first stepper thread's) the others started, then its own work."""
        for i in range(1, threads):
            threading.Thread(target=self._work, name=f"agentjournal-step-{i}",
                             daemon=True).start()
        self._work()

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
            del job  # (it holds its loop: a thread waiting for work keeps none alive)


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


def to_the_back() -> None:
    """Rank this task's next work behind the work waiting now: a task new to the
    stepper threads, or coming back from the world. A resumed run goes there too once
    it is open: a worker that took hundreds of runs over opens them all (the
    successor's first event in each) before any goes on. (Not a new run: a thousand
    started at once would then all ask their models at once, turn after turn, where
    going on as each opens spreads their turns out.)"""
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
        to_the_back()
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
        to_the_back()  # back from the world
