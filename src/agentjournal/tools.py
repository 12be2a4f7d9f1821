"""Tools: functions the model may call, each declaring the effect it has on the world.

    @tool(effect="irreversible", identity=["correction_id"], reconcile=find_correction)
    def post_correction(ctx: ToolContext, ledger: str, correction_id: str, amount: int) -> dict:
        return ledger_api.post(..., headers={"Idempotency-Key": ctx.key})

The argument schema comes from the type hints. The tool receives a context
carrying its idempotency key, to send to the receiver (provider-side
idempotency), and the run's lease epoch, for receivers that fence.

Exceptions are classified. ``ToolFailed`` means the tool proves the effect
did not happen: it is recorded without a key and may be tried again. Any
other exception from a tool with an effect may have happened after the
request left (a timeout, a reset connection): it is *uncertain*, and only
recovery may decide what happens next. A read-only tool's exceptions are
plain failures.

A call has a timeout (``@tool(timeout=...)``, else the agent's ``tool_timeout``).
Past it the call is abandoned, not stopped (Python cannot stop a thread): it is
recorded as uncertain (a read-only one as failed) and settled like any other, and
whatever it still does is on its own thread. It can no longer write to the run.
"""

from __future__ import annotations

import collections
import functools
import inspect
import math
import os
import threading
import time
import typing
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar, overload

import msgspec

from .keys import idempotency_key
from .state import PendingCall


class Effect(StrEnum):
    READ_ONLY = "read_only"  # no effect: retry freely
    IDEMPOTENT = "idempotent"  # the receiver dedupes on the key we send
    REVERSIBLE = "reversible"  # has a compensation
    IRREVERSIBLE = "irreversible"  # neither: an uncertain call goes to a person


@dataclass(frozen=True, kw_only=True)
class ToolContext:
    """What a tool knows of the call it serves.

    ``key`` is the call's idempotency key (send it to the receiver); ``epoch`` the
    run's lease epoch (for receivers that fence). ``memory`` is the run's memory
    as of this call; ``remember(key, value)`` records a memory_written event,
    durable before it returns, so a resumed run has it too.
    """

    run_id: str
    key: str
    attempt: int
    epoch: int
    call_id: str
    scope: str
    memory: Mapping[str, Any] = field(default_factory=dict)
    remember: Callable[[str, Any], None] = field(default=lambda key, value: None, repr=False)


class ToolFailed(Exception):
    """Raise from a tool when it knows the effect did not happen (e.g. a 4xx refusal)."""


class ToolUncertain(Exception):
    """Raise from a tool when the effect may have happened (e.g. a timeout after sending)."""


class ToolTimedOut(ToolUncertain):
    """The call did not return within its timeout. It was abandoned, not stopped: it may
    still be running and its effect may still happen, so it is uncertain."""


# --- running a call within its timeout -----------------------------------------------


def abandoned(what: str, timeout: float) -> ToolTimedOut:
    """The error of a sync call abandoned at its timeout (on its thread, or its run's)."""
    return ToolTimedOut(f"{what} did not return within {timeout:g}s; abandoned "
                        "(it may still be running)")


T = TypeVar("T")


class CallGuard:
    """Whether a call was abandoned. What the call still does through its context (a
    ``remember``) happens wholly before the abandonment, or is refused."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.abandoned = False

    def run(self, fn: Callable[..., T], *args: Any) -> T:
        with self._lock:
            if self.abandoned:
                raise ToolTimedOut("the call was abandoned at its timeout; it can no longer "
                                   "write to the run")
            return fn(*args)

    def abandon(self) -> None:
        with self._lock:
            self.abandoned = True


#: The longest the main thread waits on another thread in one go. Ctrl-C whose handler
#: runs after the thread last looked for a signal and before it began to wait does not
#: end that wait (only one arriving during it does): it is acted on when the wait ends,
#: so within this, not when the call waited on returns (it happened, under load).
SIGNAL_LATENCY = 0.5


def wait_for(wait: Callable[[float | None], bool], timeout: float | None) -> bool:
    """``wait(timeout)`` (a lock's ``acquire`` or a condition's ``wait``: True once what
    it waits for came), made in waits of at most SIGNAL_LATENCY on the main thread, so
    Ctrl-C is acted on between them. Elsewhere no signal is acted on: one wait."""
    if threading.current_thread() is not threading.main_thread():
        return wait(timeout)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = math.inf if deadline is None else max(0.0, deadline - time.monotonic())
        if wait(min(left, SIGNAL_LATENCY)):
            return True
        if left <= SIGNAL_LATENCY:
            return False


class _Job:
    __slots__ = ("done", "error", "fn", "result")

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.done = threading.Lock()  # held until the call returns: cheaper than an Event
        self.done.acquire()
        self.result: Any = None
        self.error: BaseException | None = None

    def wait(self, timeout: float | None) -> bool:
        """Whether the call returned within ``timeout`` seconds (None: however long)."""
        return self.done.acquire(timeout=-1 if timeout is None else timeout)


class _Worker:
    """A daemon thread that makes the calls handed to it, one at a time.

    It is woken through a pipe, not a lock: ``os.write`` lets go of the GIL before it
    wakes the thread, which can then run at once. Released under the GIL, a lock would
    wake a thread that can only wait for it, and switch twice as often (a call cost
    ~35 µs of wall time here, ~15 µs so). ``None`` as a job stops the thread."""

    def __init__(self) -> None:
        self.pid = os.getpid()  # a forked child starts its own: this thread is not in it
        self._jobs: collections.deque[_Job | None] = collections.deque()
        self._wake_r, self._wake_w = os.pipe()
        threading.Thread(target=self._serve, name="agentjournal-tool", daemon=True).start()

    def hand(self, job: _Job | None) -> None:
        self._jobs.append(job)
        os.write(self._wake_w, b"\0")

    def forget(self) -> None:
        """In a forked child: close its copy of the pipe, which its parent's thread reads."""
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _serve(self) -> None:
        try:
            while os.read(self._wake_r, 1):
                if not self._jobs:
                    continue
                if (job := self._jobs.popleft()) is None:
                    return
                try:
                    job.result = job.fn()
                except BaseException as exc:  # handed to the caller, who decides
                    job.error = exc
                job.done.release()
        finally:  # the sentinel came last: nothing writes to the pipe any more
            os.close(self._wake_r)
            os.close(self._wake_w)


class CallRunner:
    """Runs calls on a worker thread, so the caller can stop waiting at a timeout.

    The thread is reused from call to call (a hand-off costs microseconds; a thread
    start costs more); a call past its timeout is abandoned with its thread, which
    exits once the call returns, and the next call gets a new one. The thread is a
    daemon: an abandoned call never holds up the process's exit. A runner serves one
    calling thread at a time: each would otherwise wait for the other's calls.
    """

    def __init__(self) -> None:
        self._worker: _Worker | None = None
        self._finalizer: weakref.finalize | None = None  # type: ignore[type-arg]

    def call(self, fn: Callable[[], T], timeout: float, guard: CallGuard, what: str) -> T:
        """``fn()``, or ToolTimedOut after ``timeout`` seconds (``guard`` is abandoned)."""
        worker = self._worker
        if worker is None or worker.pid != os.getpid():
            worker = self._start()
        job = _Job(fn)
        worker.hand(job)
        if not wait_for(job.wait, timeout):
            guard.abandon()
            self._retire()
            raise abandoned(what, timeout)
        if job.error is not None:
            raise job.error
        result: T = job.result
        return result

    def _start(self) -> _Worker:
        if self._worker is not None:  # a forked child's copy of its parent's: let it be
            assert self._finalizer is not None
            self._finalizer.detach()
            self._worker.forget()
        worker = self._worker = _Worker()
        self._finalizer = weakref.finalize(self, worker.hand, None)  # runner gone: it exits
        return worker

    def _retire(self) -> None:
        """Let the current thread go: it exits after the call it is stuck in."""
        if self._finalizer is not None:
            self._finalizer()  # hands it the sentinel now, once
        self._worker = self._finalizer = None


# --- what a reconcile lookup may conclude ------------------------------------------


class Found(msgspec.Struct, frozen=True):
    """The effect happened, with the same semantic fields; ``result`` is what it returned."""

    result: Any


class Absent(msgspec.Struct, frozen=True):
    """The effect is not there. ``final``: it cannot commit later either."""

    final: bool = True


class Conflict(msgspec.Struct, frozen=True):
    """Something with this identity happened, but with different fields."""

    found: Any


class Unknown(msgspec.Struct, frozen=True):
    """The lookup could not tell (unavailable, stale, ambiguous)."""

    reason: str


Reconciliation = Found | Absent | Conflict | Unknown
Reconciler = Callable[[PendingCall], Reconciliation]


@dataclass(frozen=True)
class Undo:
    """What a compensation is asked to undo. ``key`` is the compensation's own
    idempotency key (derived from the effect's): send it to the receiver, so an undo
    retried after a crash is applied once."""

    run_id: str
    key: str
    effect_key: str
    tool: str
    args: dict[str, Any]  # the effect's arguments
    result: Any  # what the effect returned
    attempt: int


Compensator = Callable[[Undo], Any]
#: Whether an undo whose outcome is unknown took effect: Found, Absent or Unknown.
CompensationLookup = Callable[[Undo], Reconciliation]


@dataclass(frozen=True)
class Tool:
    name: str
    fn: Callable[..., Any]
    effect: Effect
    description: str = ""
    identity: tuple[str, ...] = ()
    reconcile: Reconciler | None = None
    compensate: Compensator | None = None  # undoes a completed call (a saga; saga.py)
    compensation_lookup: CompensationLookup | None = None
    key_retention: float | None = None  # seconds the receiver remembers keys
    fresh_for: float | None = None  # seconds its results stay true (steps.py _refresh)
    requires_fresh: tuple[str, ...] = ()  # tools whose results must be fresh before it runs
    untrusted: bool = False  # its results carry outside content (web pages, emails)
    local: bool = False  # its effect stays with the run (its workspace): not the scope's
    timeout: float | None = None  # seconds; None: the agent's default; math.inf: none
    args_type: type[msgspec.Struct] = field(default=msgspec.Struct, repr=False)
    schema: dict[str, Any] = field(default_factory=dict, repr=False)
    takes_context: bool = False

    def key(self, scope: str, args: dict[str, Any], *, called: str | None = None) -> str:
        """The call's idempotency key; ``called``: the name it was called by, when that
        is an old name of this tool (its calls keep the keys they were recorded with)."""
        return idempotency_key(scope, called or self.name, args, self.identity or None)

    def check_args(self, args: dict[str, Any]) -> msgspec.Struct:
        """The arguments, validated against the schema; ``msgspec.ValidationError`` if not."""
        return msgspec.convert(args, self.args_type)

    def invoke(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        checked = self.check_args(args)
        kwargs = {f: getattr(checked, f) for f in self.args_type.__struct_fields__}
        return self.fn(ctx, **kwargs) if self.takes_context else self.fn(**kwargs)

    @functools.cached_property
    def is_async(self) -> bool:
        """Declared ``async def``: the async loop awaits it; the sync loop runs it to its end.
        (Asked at every call: inspect's answer, kept.)"""
        return inspect.iscoroutinefunction(self.fn)

    def spec(self) -> dict[str, Any]:
        """The tool as a model sees it: name, description, JSON schema of its arguments."""
        return {"name": self.name, "description": self.description, "parameters": self.schema}


def _args_struct(name: str, fn: Callable[..., Any]) -> tuple[type[msgspec.Struct], bool]:
    hints = typing.get_type_hints(fn)
    params = list(inspect.signature(fn).parameters.values())
    takes_context = bool(params) and (
        hints.get(params[0].name) is ToolContext or params[0].name == "ctx"
    )
    fields: list[tuple[str, Any] | tuple[str, Any, Any]] = []
    for p in params[1:] if takes_context else params:
        hint = hints.get(p.name, Any)
        fields.append((p.name, hint) if p.default is p.empty else (p.name, hint, p.default))
    struct = msgspec.defstruct(f"{name}_args", fields, forbid_unknown_fields=True, kw_only=True)
    return struct, takes_context


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...


@overload
def tool(
    *,
    name: str | None = None,
    effect: Effect | str = Effect.IRREVERSIBLE,
    identity: Sequence[str] = (),
    reconcile: Reconciler | None = None,
    compensate: Compensator | None = None,
    compensation_lookup: CompensationLookup | None = None,
    key_retention: float | None = None,
    fresh_for: float | None = None,
    requires_fresh: Sequence[str] = (),
    untrusted: bool = False,
    local: bool = False,
    timeout: float | None = None,
    description: str | None = None,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    effect: Effect | str = Effect.IRREVERSIBLE,
    identity: Sequence[str] = (),
    reconcile: Reconciler | None = None,
    compensate: Compensator | None = None,
    compensation_lookup: CompensationLookup | None = None,
    key_retention: float | None = None,
    fresh_for: float | None = None,
    requires_fresh: Sequence[str] = (),
    untrusted: bool = False,
    local: bool = False,
    timeout: float | None = None,
    description: str | None = None,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Declare a tool. The default effect is the cautious one: ``irreversible``.

    ``compensate(undo)`` undoes one completed call when the run is compensated (a
    saga, see :func:`agentjournal.compensate`); ``compensation_lookup(undo)`` says
    whether an undo whose outcome is unknown took effect (Found / Absent / Unknown).
    An effect without ``compensate`` cannot be undone: a saga stops before it.

    ``fresh_for`` is how many seconds the tool's results stay true. Before each model
    turn, a result older than that and still in the model's context is re-read (a
    read-only tool is called again) or, for any other tool, marked stale with its age;
    the model is told what changed. ``requires_fresh`` names tools whose results this
    one relies on (re-read the balance before posting a correction): before it runs,
    their aged results are re-read, and if one changed the call is denied, so the model
    decides again; a note after the turn's results says what it read then and what
    holds now, as before a turn.

    ``untrusted=True`` labels its results ``untrusted`` in the model's context
    (content from outside: a fetched page, an inbound email).

    ``local=True``: the effect stays with the run, not in the world the runs of its
    scope share: the files of its workspace (a tool that edits them), a scratch
    directory of its own. A fork, or another run of the scope, makes such a call itself
    rather than being answered with another run's result (a fork's files were restored
    to its seq: the origin's later edits are not in them). A call completed in the
    run's own log is still served. Leave it False for anything outside the run (a
    payment, an email, a shared database): those belong to the scope and are never
    made twice.

    ``timeout`` is how
    many seconds a call may take before it is abandoned as uncertain (default: the
    agent's ``tool_timeout``; ``math.inf``: no limit).
    """
    if timeout is not None and not timeout > 0:  # NaN too
        raise ValueError(f"timeout must be a positive number of seconds, not {timeout!r}")
    if fresh_for is not None and not 0 <= fresh_for < math.inf:  # NaN too
        raise ValueError(f"fresh_for must be a finite number of seconds >= 0, not {fresh_for!r}")

    def wrap(f: Callable[..., Any]) -> Tool:
        tool_name = name or f.__name__
        args_type, takes_context = _args_struct(tool_name, f)
        _schemas, components = msgspec.json.schema_components([args_type])
        schema = components[args_type.__name__]
        schema.pop("title", None)
        missing = [i for i in identity if i not in args_type.__struct_fields__]
        if missing:
            raise ValueError(f"tool {tool_name!r}: identity fields {missing} are not arguments")
        return Tool(
            name=tool_name, fn=f, effect=Effect(effect),
            description=description or inspect.getdoc(f) or "",
            identity=tuple(identity), reconcile=reconcile, compensate=compensate,
            compensation_lookup=compensation_lookup,
            key_retention=key_retention, fresh_for=fresh_for,
            requires_fresh=tuple(requires_fresh), untrusted=untrusted, local=local,
            timeout=timeout,
            args_type=args_type, schema=schema, takes_context=takes_context,
        )

    return wrap(fn) if fn is not None else wrap
