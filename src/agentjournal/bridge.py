"""A journaled run that another framework's loop steps through.

agentjournal's own loop (steps.py, settle.py) decides when to ask the model and
which calls to make. A framework (Pydantic AI, LangGraph, the OpenAI Agents SDK)
has a loop of its own; this module lends it the journal and the call protocol,
so the framework keeps driving and a bridged run is still a run like any other
(``agentjournal show / events / runs / resolve / approve`` treat it so):

    with open_run(store, "order-7", agent="pydantic_ai:shop", input=prompt) as run:
        reply = run.step("model.request", fingerprint, ask_model, turn=summary_of)
        result = run.call("charge", {"order": 7}, call_id="c1",
                          effect=Effect.IRREVERSIBLE, body=lambda ctx: charge(ctx.key))
        run.finish(output)

Start and resume are the same call with the same run id. Opening takes the run's
lease (fencing as for native runs) and records ``run_started`` with the input on
first open, so a crash before any step loses nothing.

**Steps** (``step`` / ``astep``): the n-th unit of a name. Recorded before with the
same fingerprint: its stored value is decoded and the body is not called. Recorded
with another fingerprint (the code changed since: a prompt edited, a tool added, the
model switched): history is history, the recorded value is served all the same and a
``request_changed`` fact says which ``parts`` of the request differ (once per step);
``open_run(strict=True)`` refuses instead (:class:`NondeterminismError`, naming
both). A model step given the ``tools`` the code has now pauses the run for a person
(:class:`NeedsPerson`) when a call the log holds open (uncertain, or waiting for an
approval) is of a tool no longer among them: nothing could settle it. Otherwise the
body runs and its value is appended, durably, before it is used: as a ``model_turn``
when ``turn`` summarises it (text, tool calls, usage: shown like a native turn; the
framework's own JSON stored beside it), else as a record-only ``step_recorded``. A
turn that asks for calls is stored with the first fact about them (their starts, in
one append), as the loop does: a crash before that asks the model again.

**Calls** (``call`` / ``acall`` / ``call_batch`` / ``acall_batch``): the loop's own
rules, run by the loop's own code (a ``StepMachine`` whose tools are the bridged
calls). A call whose call id the log holds open (started and uncertain, or waiting
for an approval) under another tool, key or effect class (the code changed under it)
is never made under its new key: the run pauses for a person (:class:`NeedsPerson`,
the reason naming both), who settles the recorded call with ``agentjournal resolve``
(then the call is answered from that) or cancels the run. A call already answered in
this run (completed, failed, refused: matched by call id and idempotency key) is
answered from the log, the body not called. Otherwise: a completed key is served
(same arguments only; the same identity with other arguments is refused,
:class:`CallRefused`); an uncertain key is settled by settle.py (the lookup, a retry
with the same key for read-only and idempotent calls, else :class:`NeedsPerson`, the
run paused); an approval is bound to the exact arguments (:class:`NeedsApproval`
until a person or the caller decides); then ``tool_call_started`` is durable before
the body runs and the completion is appended after. A body raising ``ToolFailed``
proves the effect did not happen (recorded as a failure, may be tried again); any
other exception from a call with an effect leaves it uncertain. A value the body
returned that has no JSON form (``encode`` raised, or the body raised
``results.ResultNotEncodable``: the framework's own encoder refused it) completes
the call as "result not kept", as the loop does (``ResultNotKeptError``).

A call's body receives a :class:`~agentjournal.ToolContext` (``ctx.key``: the
idempotency key to send to the receiver; ``ctx.epoch``: the lease epoch, for a
receiver that fences). Code that the framework calls and that cannot take it as
an argument reads it with :func:`current_call`.

Concurrency: the sync methods may be called from several threads (the framework's
tool threads), the async ones from several tasks: the rules run under one lock,
released while a body or a lookup runs (async appends wait on a stepper thread,
never on the loop). Calls started together by ``call_batch`` are appended in one
batch, in the order given (sort them by call id for a deterministic log).
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import threading
import time
from collections.abc import Awaitable, Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from .agent import require_run_id
from .continuation import continuation
from .errors import (
    CallRefused,
    NeedsApproval,
    NeedsPerson,
    NondeterminismError,
    ResultNotKeptError,
    RunMismatchError,
    ScopeSharedError,
)
from .events import Event, EventType, render
from .faults import fault_point
from .journal import RunJournal, open_journal
from .keys import run_scope
from .models import cost_of
from .ops import (
    Invoke,
    Op,
    Outcome,
    Sleep,
    Steps,
    _advance,
    in_thread,
    run_async,
    run_sync,
)
from .policy import Allow, Decision, RequireApproval
from .redaction import Redaction
from .results import NotKept, ResultNotEncodable
from .settle import Ready, changed_intent, same_intent
from .state import PendingCall, RunState, ToolCall, Usage
from .steps import StepMachine, not_kept
from .store import Store
from .tools import Effect, Reconciler, Tool, ToolContext, ToolFailed

__all__ = ["Answer", "BridgedRun", "CallSpec", "CodeChanged", "Turn", "aopen_run",
           "current_call", "open_run"]

E = EventType
_ANSWERS = (E.TOOL_CALL_COMPLETED, E.TOOL_RESULT_SERVED, E.TOOL_CALL_DENIED)
#: Seconds between looks at a call in flight that another call of the run waits for.
IN_FLIGHT_POLL = 0.005
Encode = Callable[[Any], Any]

_CURRENT: contextvars.ContextVar[ToolContext | None] = contextvars.ContextVar(
    "agentjournal.bridge.current_call", default=None)


#: Set by an integration around a call's body (:func:`reading_checked`): raises where
#: the call's context is read by code that is not that call, such as a tool of another
#: agent run the body started, whose calls agentjournal does not journal.
_CHECK: contextvars.ContextVar[Callable[[ToolContext], None] | None] = contextvars.ContextVar(
    "agentjournal.bridge.current_call_check", default=None)


def current_call() -> ToolContext | None:
    """The context of the bridged call whose body is running in this thread or task
    (its idempotency key, lease epoch, attempt, call id); None outside a call body.

    Raises :class:`JournalError` where the context is not the reader's own (its
    integration says where: for Pydantic AI, a tool of an agent run started inside the
    call without a ``JournalDurability`` of its own): its calls would all send this one
    call's key, and a receiver that honours keys would apply only the first."""
    ctx = _CURRENT.get()
    check = _CHECK.get()
    if ctx is not None and check is not None:
        check(ctx)
    return ctx


@contextlib.contextmanager
def reading_checked(check: Callable[[ToolContext], None]) -> Iterator[None]:
    """Inside, :func:`current_call` gives the call's context only where ``check`` passes
    (it raises where the reader is not the call)."""
    token = _CHECK.set(check)
    try:
        yield
    finally:
        _CHECK.reset(token)


class CodeChanged(NeedsPerson):
    """The code changed under a call the log holds open (its tool is gone, or its name,
    identity or effect class is not the recorded one): the run is paused for a person,
    the reason naming the change. Running the same code again stops here again."""

    #: Where the run stopped (status, last seq, lease epoch), when the integration that
    #: raised it knows: a worker hands the run back paused with it.
    stopped_at: tuple[str, int, int] | None = None


def _same(value: Any) -> Any:
    return value


@dataclass(frozen=True, kw_only=True)
class Turn:
    """What a model step's value says, for people: recorded as a ``model_turn``.

    ``tool_calls``: the calls the model asked for, each ``{"id", "name", "args"}``.
    ``usage``: token counts by agentjournal's convention (``input_tokens`` includes
    cache reads; keys as :class:`agentjournal.state.Usage`); ``cost_usd`` None when
    unknown (never a false $0)."""

    text: str = ""
    tool_calls: Sequence[dict[str, Any]] = ()
    usage: dict[str, Any] = field(default_factory=dict)
    model: str | None = None
    provider: str | None = None
    finish_reason: str | None = None


@dataclass(frozen=True, kw_only=True)
class CallSpec:
    """One bridged call: what ``call`` takes, for ``call_batch``.

    ``body(ctx)`` makes the call (a coroutine function for ``acall``); its return
    value, passed through ``encode``, must be JSON data. ``identity``: the argument
    fields that name the action (default: all of them). ``lookup``: the reconcile
    lookup for an uncertain call (as ``@tool(reconcile=...)``). ``approval``: a
    person's approval of these exact arguments is required first (``str``: the
    reason shown). ``decode`` turns a recorded result back into the framework's value.
    """

    tool: str
    args: dict[str, Any]
    call_id: str
    body: Callable[[ToolContext], Any]
    effect: Effect | str = Effect.IRREVERSIBLE
    identity: Sequence[str] = ()
    lookup: Reconciler | None = None
    approval: bool | str = False
    key_retention: float | None = None
    untrusted: bool = False
    encode: Encode = _same
    decode: Encode = _same


@dataclass(frozen=True)
class Answer:
    """How a call was answered in the run's log. ``kind``: ``result`` (completed, or
    served from an earlier completion; ``source`` says by whom: tool, reconciliation,
    person, scope, served), ``failed`` (a proven failure: ``message``), ``refused`` (a
    denial: ``message``)."""

    kind: Literal["result", "failed", "refused"]
    result: Any
    source: str
    message: str
    seq: int
    key: str | None
    not_kept: str | None = None


@dataclass
class _Unit:
    seq: int
    fingerprint: str
    value: Any
    #: The digests of the request's parts (instructions, tools, model...), when recorded.
    parts: dict[str, str] | None = None
    #: The ids of the calls a recorded model turn asked for.
    calls: tuple[str, ...] = ()


#: A request's parts by name, each a digest; or a function making them when needed (only
#: a step that is asked, or one whose request changed, needs them).
Parts = Mapping[str, str] | Callable[[], Mapping[str, str]]


class _BridgedTool(Tool):
    """A bridged call as the loop's rules see a tool: invoking it runs the body."""

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)

    def check_args(self, args: dict[str, Any]) -> msgspec.Struct:
        return msgspec.Struct()  # the framework validated them

    def invoke(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        return self.fn(ctx)


class _Approvals:
    """The bridged run's policy: approval for the calls that ask for it, else allow."""

    def __init__(self) -> None:
        self.required: dict[str, str] = {}  # call id -> reason

    def decide(self, call: ToolCall, tool: Tool, state: RunState) -> Decision:
        reason = self.required.get(call.id)
        return Allow() if reason is None else RequireApproval(reason)


class BridgedRun(StepMachine):
    """An open run stepped through by another framework. Made by :func:`open_run`."""

    reads_ride = False  # the framework asks the model: a result is stored as it comes
    #: The caller's ``opening`` facts as stored with ``run_started`` or ``run_resumed``
    #: (see open_run); empty when neither was recorded.
    opened: tuple[Event, ...] = ()

    def __init__(self, journal: RunJournal, *, tool_timeout: float | None,
                 max_attempts: int, max_recoveries: int,
                 max_result_bytes: int | None, strict: bool = False) -> None:
        self.journal = journal
        #: A recorded step asked with another fingerprint raises (NondeterminismError)
        #: instead of being served with a request_changed fact.
        self.strict = strict
        self.run_id = journal.run_id
        self.tools: dict[str, Tool] = {}
        self._approvals = _Approvals()
        self.policy = self._approvals
        self.guardrails = []
        self.compaction = None
        self.workspace = None
        self.parallel_calls = 64
        self.lease_ttl = journal.ttl
        self.tool_timeout = tool_timeout
        self.stuck_after = None
        self.max_attempts = max_attempts
        self.max_recoveries = max_recoveries
        self.max_args_bytes = None
        self.max_result_bytes = max_result_bytes
        self._lock = threading.RLock()
        self._units: dict[str, dict[int, _Unit]] = {}  # recorded steps by name and position
        self._next: dict[str, int] = {}  # the position of the next step of each name
        self._answers: dict[str, Event] = {}  # call id -> the last event answering it
        self._start_keys: dict[int, str] = {}  # a start's seq -> its key
        self._start_ids: dict[int, str] = {}  # a start's seq -> its call id
        self._live: dict[str, tuple[bool, Any]] = {}  # call id -> (ok, value or error)
        self._input: Any = None  # the input recorded when the run started
        self._in_flight: set[str] = set()  # keys of calls this run is making now
        self._closed = False
        # (step, n, asked) of each request_changed recorded: each told once.
        self._changes: set[tuple[str, int, str]] = set()
        # call id -> (tool, key, approval id) of each approval asked for.
        self._approval_calls: dict[str, tuple[str, str, str]] = {}
        self._opened_at = journal.state.last_seq  # the log as this process found it
        self._changes_staged = False  # request_changed facts wait for the next append
        self._asked: set[str] = set()  # the call ids the framework asked for here

    # --- reading the log ----------------------------------------------------------

    def _index(self, event: Event, state: RunState | None = None) -> None:
        """Keep the units and answers of ``event`` (the log at open, then each append)."""
        p = event.payload
        if event.type is E.STEP_RECORDED or (event.type is E.MODEL_TURN and "step" in p):
            step = p["step"] if event.type is E.MODEL_TURN else p
            units = self._units.setdefault(step["name"], {})
            calls = tuple(str(c.get("id")) for c in p.get("tool_calls") or ()
                          if isinstance(c, dict))
            units.setdefault(step["n"], _Unit(event.seq, step["fingerprint"], p.get("value"),
                                              step.get("parts"), calls))
        elif event.type is E.REQUEST_CHANGED:
            self._changes.add((p.get("step", ""), p.get("n", -1), p.get("asked", "")))
        elif event.type is E.APPROVAL_REQUESTED and p.get("call_id"):
            self._approval_calls[p["call_id"]] = (p["tool"], p["key"], p["approval_id"])
        elif event.type is E.RUN_STARTED:
            self._input = p.get("input")
        elif event.type is E.TOOL_CALL_STARTED:
            self._start_keys[event.seq] = p["key"]
            self._start_ids[event.seq] = p.get("call_id", "")
        elif event.type in _ANSWERS and p.get("call_id"):
            self._answers[p["call_id"]] = event

    def answer(self, call_id: str) -> Answer | None:
        """How call ``call_id`` was answered in this run (by its tool, a lookup, a
        person, or a denial), or None while it has no answer."""
        event = self._answers.get(call_id)
        if event is None:
            return None
        p = event.payload
        if event.type is E.TOOL_CALL_DENIED:
            return Answer("refused", None, "denied", p.get("reason", ""), event.seq, p.get("key"))
        if event.type is E.TOOL_RESULT_SERVED:
            return Answer("result", p.get("result"), "served", "", event.seq, p.get("key"),
                          p.get("content") if p.get("content") else None)
        key = p.get("idempotency_key")
        if key is None:  # a proven failure: recorded without a key
            started = p.get("started_seq")
            return Answer("failed", None, p.get("source", "tool"), p.get("content", ""),
                          event.seq, self._start_keys.get(started) if started else None)
        result = p.get("result")
        if result is None and p.get("content") and p.get("encoding_error") is None:
            result = p["content"]  # a person's "happened" without its result (decisions.py)
        return Answer("result", result, p.get("source", "tool"), "", event.seq, key,
                      p.get("encoding_error"))

    decision_for = answer

    @property
    def state(self) -> RunState:
        """The run's folded state (live: it changes as facts are recorded)."""
        return self.journal.state

    @property
    def status(self) -> str:
        return self.journal.state.status

    # --- steps --------------------------------------------------------------------

    def recorded(self, name: str) -> list[Any]:
        """The values recorded for the steps named ``name``, in order, as stored (not
        decoded), without claiming any: to find how far a run got before asking for the
        next one (e.g. the newest of the states a framework saved at its pauses)."""
        with self._lock:
            units = self._units.get(name, {})
            return [units[n].value for n in range(len(units)) if n in units]

    def _claim(self, name: str, fingerprint: str, position: int | None,
               parts: Parts | None) -> tuple[int, _Unit | None, dict[str, Any] | None]:
        """The position of this step of ``name``, its recorded unit if it has one, and
        the ``request_changed`` fact to record when it was recorded for another request
        (None when the request is the same, or the change was told already)."""
        with self._lock:
            n = self._next.get(name, 0) if position is None else position
            self._next[name] = n + 1
            unit = self._units.get(name, {}).get(n)
        if unit is None or unit.fingerprint == fingerprint:
            return n, unit, None
        if self.strict:
            raise NondeterminismError(self.run_id, name, n, unit.fingerprint, fingerprint,
                                      unit.seq)
        with self._lock:
            if (name, n, fingerprint) in self._changes:
                return n, unit, None
            self._changes.add((name, n, fingerprint))
        asked = _parts_of(parts)
        changed = ([k for k in sorted({*unit.parts, *asked})
                    if unit.parts.get(k) != asked.get(k)] if unit.parts and asked else [])
        return n, unit, {"step": name, "n": n, "recorded": unit.fingerprint,
                         "asked": fingerprint, "changed": changed or ["request"],
                         "seq": unit.seq}

    def _tell_changed(self, change: dict[str, Any] | None) -> None:
        """Record that a recorded step was served to a request the code now makes
        otherwise (record-only: the run's state is the same). Staged: stored with the
        run's next append (one sync for a resume that serves many changed turns), and
        before the next request is asked; a crash before that tells it again."""
        if change is not None:
            with self._lock:
                self.journal.stage([(E.REQUEST_CHANGED, change)])
                self._changes_staged = True

    def _store_changes(self) -> None:
        """Store the request_changed facts staged, before the world is waited on."""
        with self._lock:
            if self._changes_staged:
                self._changes_staged = False
                self.journal.flush()

    def _orphaned(self, unit: _Unit | None,
                  tools: Collection[str]) -> list[tuple[str, PendingCall | None]]:
        """The calls the log holds open that no one will settle, each with why. For a
        recorded turn: the calls it asked for whose tool is not among ``tools`` (the
        model's tools now). For a turn to be asked: also each call left uncertain before
        this process that the framework did not make again (its tool no longer accepts
        the recorded arguments, say): asked on, the model could make it again under a
        new key."""
        j = self.journal
        found: list[tuple[str, PendingCall | None]] = []

        def mine(call_id: str) -> bool:
            return unit is None or call_id in unit.calls

        for p in list(j.state.pending.values()):
            if p.key in self._in_flight or not mine(p.call_id):
                continue
            said = (f"call {p.call_id} of tool {p.tool!r} (key {p.key[:16]}, {p.effect}) "
                    "was started and its outcome is unknown")
            if p.tool not in tools:
                found.append((f"{said}, and the agent has no tool {p.tool!r} any more", p))
            elif (unit is None and p.started_seq <= self._opened_at
                  and p.call_id not in self._asked):
                found.append((f"{said}, and the code did not make it again (does tool "
                              f"{p.tool!r} still accept its recorded arguments "
                              f"{render(p.args)}?)", p))
        for call_id, (tool, _, approval_id) in list(self._approval_calls.items()):
            if tool not in tools and approval_id in j.state.approvals and mine(call_id):
                found.append((f"call {call_id} of tool {tool!r} waits for approval "
                              f"{approval_id}, and the agent has no tool {tool!r} any more",
                              None))
        return found

    def _stranded(self, name: str,
                  found: list[tuple[str, PendingCall | None]]) -> CodeChanged:
        """Pause the run for the calls :meth:`_orphaned` found; the error saying why."""
        reason = (f"the code changed under an open call: {'; '.join(w for w, _ in found)}. "
                  f"Settle it with `agentjournal resolve {self.run_id} KEY --happened | "
                  "--did-not-happen` (or deploy the tool again under its old name), then run "
                  f"again; or cancel the run (`agentjournal cancel {self.run_id} "
                  "[--compensate]`)")
        self._pause_for_change(reason)
        pending = next((p for _, p in found if p is not None), None)
        if pending is None:
            return CodeChanged(self.run_id, name, "model", reason)
        return CodeChanged(self.run_id, pending.call_id, pending.tool, reason,
                           key=pending.key, pending=pending)

    def _record_step(self, name: str, n: int, fingerprint: str, value: Any,
                     turn: Turn | None, latency_ms: float, parts: Parts | None = None) -> None:
        step: dict[str, Any] = {"name": name, "n": n, "fingerprint": fingerprint}
        if parts is not None:
            step["parts"] = _parts_of(parts)
        if turn is None:
            fact = (E.STEP_RECORDED, {**step, "value": value})
        else:
            summary: dict[str, Any] = {
                "text": turn.text, "tool_calls": [dict(c) for c in turn.tool_calls],
                "usage": _priced(turn), "latency_ms": round(latency_ms, 3)}
            for label in ("model", "provider", "finish_reason"):
                if (given := getattr(turn, label)) is not None:
                    summary[label] = given
            fact = (E.MODEL_TURN, {**summary, "step": step, "value": value})
        with self._lock:
            if turn is not None and turn.tool_calls:
                # Stored with the first fact about its calls (their starts): one sync, not
                # two, as the loop does. A crash before that asks the model again.
                self.journal.stage([fact])
                fault_point("turn_staged")
            else:
                self.journal.record_all([fact])

    def step(self, name: str, fingerprint: str, body: Callable[[], Any], *,
             encode: Encode = _same, decode: Encode = _same,
             turn: Callable[[Any], Turn] | None = None,
             executed: Callable[[bool], None] | None = None,
             position: int | None = None, parts: Parts | None = None,
             tools: Collection[str] | None = None) -> Any:
        """The value of the next step named ``name``: recorded, or made by ``body()``.

        ``encode`` turns the value into JSON data to record, ``decode`` a recorded one
        back. ``turn`` (a model step): summarises the encoded value for people; the step
        is recorded as a ``model_turn``. ``executed(bool)`` is told whether the body ran
        (False: replayed from the log). ``position``: the step's place among the steps
        of its name when the framework knows it (e.g. the number of model responses in
        the history a request carries, for a framework that continues a run from a
        history instead of replaying it); default: the one after the last asked here.
        ``parts``: the request's parts by name (instructions, tools, model, settings,
        output, history), each a digest, or a function making them: recorded with the
        step, so a later request at its place can be told apart by part. ``tools``
        (a model step): the names of the tools the model is given now (see
        :meth:`_orphaned`)."""
        n, unit, change = self._claim(name, fingerprint, position, parts)
        self._tell_changed(change)
        if tools is not None and (found := self._orphaned(unit, tools)):
            raise self._stranded(name, found)
        if unit is not None:
            _tell(executed, False)
            return decode(unit.value)
        self._store_changes()
        if turn is not None:
            fault_point("model_call")
        began = time.monotonic()
        value = encode(body())
        self._record_step(name, n, fingerprint, value, turn(value) if turn else None,
                          (time.monotonic() - began) * 1000, parts)
        _tell(executed, True)
        return decode(value)

    async def astep(self, name: str, fingerprint: str, body: Callable[[], Awaitable[Any]], *,
                    encode: Encode = _same, decode: Encode = _same,
                    turn: Callable[[Any], Turn] | None = None,
                    executed: Callable[[bool], None] | None = None,
                    position: int | None = None, parts: Parts | None = None,
                    tools: Collection[str] | None = None) -> Any:
        """:meth:`step` for an async body."""
        n, unit, change = self._claim(name, fingerprint, position, parts)
        self._tell_changed(change)  # staged: no wait on the store
        if tools is not None and (found := self._orphaned(unit, tools)):
            raise await in_thread(self._stranded, name, found)
        if unit is not None:
            _tell(executed, False)
            return decode(unit.value)
        if self._changes_staged:
            await in_thread(self._store_changes)
        if turn is not None:
            fault_point("model_call")
        began = time.monotonic()
        value = encode(await body())
        # The append waits on a stepper thread, never on the loop (as ops.run_async does).
        await in_thread(self._record_step, name, n, fingerprint, value,
                        turn(value) if turn else None, (time.monotonic() - began) * 1000,
                        parts)
        _tell(executed, True)
        return decode(value)

    # --- calls --------------------------------------------------------------------

    def call(self, tool: str, args: dict[str, Any], *, call_id: str,
             body: Callable[[ToolContext], Any], effect: Effect | str = Effect.IRREVERSIBLE,
             identity: Sequence[str] = (), lookup: Reconciler | None = None,
             approval: bool | str = False, key_retention: float | None = None,
             untrusted: bool = False, encode: Encode = _same, decode: Encode = _same,
             executed: Callable[[bool], None] | None = None) -> Any:
        """Make (or replay) one call by the call protocol; its result. See the module
        docstring for the rules and :class:`CallSpec` for the arguments. Raises
        ``ToolFailed`` (a proven failure, live or recorded; live, the body's own
        exception), :class:`CallRefused`, :class:`NeedsPerson` / :class:`NeedsApproval`,
        :class:`ResultNotKeptError`."""
        spec = CallSpec(tool=tool, args=args, call_id=call_id, body=body, effect=effect,
                        identity=identity, lookup=lookup, approval=approval,
                        key_retention=key_retention, untrusted=untrusted, encode=encode,
                        decode=decode)
        (outcome,) = self.call_batch([spec], executed=executed)
        return _unwrap(outcome)

    async def acall(self, tool: str, args: dict[str, Any], *, call_id: str,
                    body: Callable[[ToolContext], Awaitable[Any]],
                    effect: Effect | str = Effect.IRREVERSIBLE, identity: Sequence[str] = (),
                    lookup: Reconciler | None = None, approval: bool | str = False,
                    key_retention: float | None = None, untrusted: bool = False,
                    encode: Encode = _same, decode: Encode = _same,
                    executed: Callable[[bool], None] | None = None) -> Any:
        """:meth:`call` for an async body (awaited on this event loop)."""
        spec = CallSpec(tool=tool, args=args, call_id=call_id, body=body, effect=effect,
                        identity=identity, lookup=lookup, approval=approval,
                        key_retention=key_retention, untrusted=untrusted, encode=encode,
                        decode=decode)
        (outcome,) = await self.acall_batch([spec], executed=executed)
        return _unwrap(outcome)

    def call_batch(self, specs: Sequence[CallSpec], *,
                   executed: Callable[[bool], None] | None = None) -> list[Outcome]:
        """Several calls of one turn: those that must run start in one append, in the
        order given, then run at once (threads). Each outcome holds the call's result
        or the exception :meth:`call` would raise."""
        outcomes: list[Outcome] = run_sync(_under(self._calls(specs, executed), self._lock))
        return outcomes

    async def acall_batch(self, specs: Sequence[CallSpec], *,
                          executed: Callable[[bool], None] | None = None) -> list[Outcome]:
        """:meth:`call_batch` for async bodies (run at once as tasks)."""
        outcomes: list[Outcome] = await run_async(
            _under(self._calls(specs, executed), self._lock))
        return outcomes

    def _calls(self, specs: Sequence[CallSpec],
               executed: Callable[[bool], None] | None) -> Steps[list[Outcome]]:
        outcomes: dict[int, Outcome] = {}
        ready: list[tuple[int, Ready]] = []
        later: list[int] = []  # the same key as a call before it in the batch: after it
        for i, spec in enumerate(specs):
            tool = self._register(spec)
            key = tool.key(self.journal.state.scope, spec.args)
            if any(key == r[2] for _, r in ready):
                later.append(i)
                continue
            outcome = yield from self._one(spec, tool, key, executed)
            if isinstance(outcome, Outcome):
                outcomes[i] = outcome
            else:
                ready.append((i, outcome))
        if ready:
            keys, calls = {r[2] for _, r in ready}, [r for _, r in ready]
            self._in_flight |= keys
            try:
                yield from self._execute(self.journal, calls,
                                         alone=self._unasked(self.journal, calls))
            except ScopeSharedError:
                shared = True
            else:
                shared = False
            finally:
                self._in_flight -= keys
            if shared:  # nothing was started: clear them again, peers asked
                return (yield from self._calls(specs, executed))
            _tell(executed, True)
            for i, (_, _, key) in ready:
                outcomes[i] = self._outcome(specs[i], key)
        for i in later:  # now answered from the call before it (served), or made
            (outcomes[i],) = yield from self._calls([specs[i]], executed)
        return [outcomes[i] for i in range(len(specs))]

    def _one(self, spec: CallSpec, tool: Tool, key: str,
             executed: Callable[[bool], None] | None) -> Steps[Ready | Outcome]:
        """One call of a batch: its recorded answer, how the rules answered or stopped it,
        or the call ready to run. A call whose key another call of this run is making
        right now waits for it (a start in flight is not an uncertain one)."""
        self._asked.add(spec.call_id)
        while key in self._in_flight:
            yield Sleep(IN_FLIGHT_POLL)
        if (changed := self._changed_under(spec, key)) is not None:
            return changed
        if (replayed := self._replayed(spec, key)) is not None:
            _tell(executed, False)
            return replayed
        cleared = yield from self._cleared(spec, tool, key)
        return cleared

    def _register(self, spec: CallSpec) -> Tool:
        """The call as a tool of this run's rules: its body, effect, identity, lookup."""
        spec_body, encode, call_id = spec.body, spec.encode, spec.call_id
        live = self._live

        if inspect.iscoroutinefunction(spec_body):
            async def run_async_body(ctx: ToolContext) -> Any:
                token = _CURRENT.set(ctx)
                try:
                    value = await spec_body(ctx)
                except ResultNotEncodable as exc:  # it ran: its value has no JSON form
                    live[call_id] = (True, None)
                    return NotKept(exc.detail)
                except BaseException as exc:
                    live[call_id] = (False, exc)
                    raise
                finally:
                    _CURRENT.reset(token)
                live[call_id] = (True, value)
                return _encoded(encode, value)
            fn: Callable[..., Any] = run_async_body
        else:
            def run_body(ctx: ToolContext) -> Any:
                token = _CURRENT.set(ctx)
                try:
                    value = spec_body(ctx)
                except ResultNotEncodable as exc:  # it ran: its value has no JSON form
                    live[call_id] = (True, None)
                    return NotKept(exc.detail)
                except BaseException as exc:
                    live[call_id] = (False, exc)
                    raise
                finally:
                    _CURRENT.reset(token)
                live[call_id] = (True, value)
                return _encoded(encode, value)
            fn = run_body
        tool = _BridgedTool(name=spec.tool, fn=fn, effect=Effect(spec.effect),
                            identity=tuple(spec.identity), reconcile=spec.lookup,
                            key_retention=spec.key_retention, untrusted=spec.untrusted,
                            takes_context=True)
        with self._lock:
            self.tools[spec.tool] = tool
            if spec.approval:
                reason = spec.approval if isinstance(spec.approval, str) else "approval required"
                self._approvals.required[spec.call_id] = reason
            else:
                self._approvals.required.pop(spec.call_id, None)
        return tool

    def _changed_under(self, spec: CallSpec, key: str) -> Outcome | None:
        """The pause for a person when the log holds this call id open (started and
        uncertain, or waiting for an approval) as another call: another tool, key
        (identity) or effect class. Made under its new key, the effect could happen a
        second time; only a person knows whether the recorded one happened."""
        j, effect = self.journal, Effect(spec.effect).value
        for p in list(j.state.pending.values()):
            if p.call_id != spec.call_id or p.key in self._in_flight:
                continue
            if (p.tool, p.key, p.effect) == (spec.tool, key, effect):
                return None  # the same call: the rules settle it
            what = _differs(("tool", p.tool, spec.tool), ("key", p.key[:16], key[:16]),
                            ("effect", p.effect, effect))
            return self._changed_pause(spec, key, p.key, p, (
                f"call {spec.call_id} was started as {p.tool} (key {p.key[:16]}, "
                f"{p.effect}) and its outcome is unknown; the code now makes it as "
                f"{spec.tool} (key {key[:16]}, {effect}): {what} changed. Made under the "
                f"new key its effect could happen twice"))
        opened = self._approval_calls.get(spec.call_id)
        if opened is not None and opened[2] in j.state.approvals and opened[:2] != (
                spec.tool, key):
            tool, old_key, approval_id = opened
            what = _differs(("tool", tool, spec.tool), ("key", old_key[:16], key[:16]))
            return self._changed_pause(spec, key, old_key, None, (
                f"call {spec.call_id} waits for approval {approval_id} as {tool} (key "
                f"{old_key[:16]}); the code now makes it as {spec.tool} (key {key[:16]}): "
                f"{what} changed, so the approval asked for is not this call's"))
        return None

    def _pause_for_change(self, reason: str) -> None:
        """Record that the run waits for a person because the code changed under it,
        also when it was waiting for an approval: the reason names the change."""
        with self._lock:
            j = self.journal
            if j.state.status == "waiting_approval":
                j.record(E.RUN_PAUSED, reason=reason, uncertain=[])
            else:
                j.flush()
                self._pause(j, reason)  # with the uncertain calls, as the loop does

    def _changed_pause(self, spec: CallSpec, key: str, old_key: str,
                       pending: PendingCall | None, what: str) -> Outcome:
        run = self.run_id
        reason = (f"{what}. Settle the recorded call with `agentjournal resolve {run} "
                  f"{old_key[:16]} --happened | --did-not-happen` (or deploy its old "
                  f"definition again), then run again; or cancel the run (`agentjournal "
                  f"cancel {run} [--compensate]`)")
        self._pause_for_change(reason)
        return Outcome(error=CodeChanged(run, spec.call_id, spec.tool, reason, key=old_key,
                                         pending=pending))

    def _replayed(self, spec: CallSpec, key: str) -> Outcome | None:
        """The recorded answer to this very call (same call id and key), if it has one."""
        found = self.answer(spec.call_id)
        if found is None:
            return None
        if found.key not in (key, None) and not self._settled_before(spec, found):
            return None
        return self._as_outcome(spec, found)

    def _settled_before(self, spec: CallSpec, found: Answer) -> bool:
        """Whether ``found``, under another key, is a person's verdict on this very call
        started under its old definition (see _changed_under): it stands for the call."""
        if found.source != "person" or found.kind != "result":
            return False
        return any(key == found.key for seq, key in self._start_keys.items()
                   if self._start_ids.get(seq) == spec.call_id)

    def _as_outcome(self, spec: CallSpec, found: Answer) -> Outcome:
        if found.kind == "refused":
            return Outcome(error=CallRefused(self.run_id, spec.call_id, spec.tool, found.message))
        if found.kind == "failed":
            return Outcome(error=ToolFailed(found.message))
        if found.not_kept is not None:
            reason = found.not_kept if found.source == "served" else not_kept(found.not_kept)
            return Outcome(error=ResultNotKeptError(self.run_id, spec.call_id, spec.tool,
                                                    reason))
        return Outcome(value=spec.decode(found.result))

    def _cleared(self, spec: CallSpec, tool: Tool, key: str) -> Steps[Ready | Outcome]:
        """The call ready to run, or how it was answered (or stopped) without running."""
        j = self.journal
        call = ToolCall(id=spec.call_id, name=spec.tool, args=spec.args)
        for p in list(j.state.pending.values()):
            if p.key != key:
                continue
            if not same_intent(p.args, j.as_recorded(spec.args)):
                reason = changed_intent(tool, p.args, spec.args)
                return Outcome(error=CallRefused(self.run_id, spec.call_id, spec.tool, reason))
            if not (yield from self._settle(j, p)):  # settle.py: a lookup, a retry, a person
                return self._stopped(spec, key, p)
            if (found := self.answer(spec.call_id)) is not None and found.key == key:
                return self._as_outcome(spec, found)  # settled as this very call
        cleared = yield from self._clear(j, call)
        if cleared is True:  # served or denied
            found = self.answer(spec.call_id)
            assert found is not None
            return self._as_outcome(spec, found)
        if cleared is False:
            return self._stopped(spec, key, None)
        return cleared

    def _stopped(self, spec: CallSpec, key: str, p: PendingCall | None) -> Outcome:
        """The run must stop for a person: an approval to decide, an uncertain call."""
        j = self.journal
        waiting = [a for a in j.state.approvals.values() if a.key == key]
        if waiting:
            return Outcome(error=NeedsApproval(self.run_id, spec.call_id, spec.tool,
                                               waiting[0].approval_id, key))
        self._pause(j, f"call {spec.tool} {key[:12]} is uncertain")
        reason = j.state.pause_reason or (j.state.escalation or {}).get("reason") or j.state.status
        pending = p or next((q for q in j.state.pending.values() if q.key == key), None)
        return Outcome(error=NeedsPerson(self.run_id, spec.call_id, spec.tool, str(reason),
                                         key=key, pending=pending))

    def _outcome(self, spec: CallSpec, key: str) -> Outcome:
        """How a call that was started ended: its live value or error, else the log's."""
        live = self._live.pop(spec.call_id, None)
        found = self.answer(spec.call_id)
        if found is not None and found.key in (key, None):
            if live is not None and found.kind != "refused":
                ok, value = live
                if not ok and isinstance(value, Exception):
                    return Outcome(error=value)  # the body's own exception, ToolFailed
                if ok and found.not_kept is None:
                    return Outcome(value=value)
            return self._as_outcome(spec, found)
        return self._stopped(spec, key, None)

    # --- approvals and decisions ----------------------------------------------------

    def approval_id(self, tool: str, args: dict[str, Any], *,
                    identity: Sequence[str] = ()) -> str:
        """The id of the approval of exactly this call (as the loop makes it)."""
        from .keys import idempotency_key

        key = idempotency_key(self.journal.state.scope, tool, args, tuple(identity) or None)
        return "approval-" + idempotency_key(key, tool, args)[:16]

    def request_approval(self, tool: str, args: dict[str, Any], *, call_id: str,
                         identity: Sequence[str] = (), reason: str = "approval required") -> str:
        """Record that call ``call_id`` waits for a person's approval of these exact
        arguments (once); its approval id."""
        from .keys import idempotency_key

        j = self.journal
        key = idempotency_key(j.state.scope, tool, args, tuple(identity) or None)
        approval_id = self.approval_id(tool, args, identity=identity)
        with self._lock:
            if approval_id not in j.state.approvals and approval_id not in j.state.decisions:
                j.record(E.APPROVAL_REQUESTED, approval_id=approval_id, key=key, tool=tool,
                         args=args, call_id=call_id, reason=reason)
        return approval_id

    def decide_approval(self, approval_id: str, *, approved: bool, by: str,
                        reason: str = "") -> bool:
        """Record a decision on an open approval (one the framework's caller passed
        back). False when it was decided already (the standing decision is kept)."""
        j = self.journal
        with self._lock:
            if approval_id not in j.state.approvals:
                return False
            j.record(E.APPROVAL_DECIDED, approval_id=approval_id, approved=approved, by=by,
                     reason=reason)
        return True

    def resolve(self, call_id: str, *, happened: bool, by: str, reason: str = "",
                result: Any = None) -> bool:
        """Record what the framework's caller established about the uncertain call
        ``call_id`` (as ``agentjournal resolve``: happened, with its result, or did not
        happen: it is made again with the same key). False when it is not uncertain."""
        from .decisions import resolution_facts

        j = self.journal
        with self._lock:
            pending = next((p for p in j.state.pending.values() if p.call_id == call_id), None)
            if pending is None:
                return False
            j.record_all(resolution_facts(pending, "happened" if happened else "did_not_happen",
                                          by=by, reason=reason, result=result))
        return True

    def _start_or_resume(self, *, agent: str | None, input: Any, task: str | None,
                         scope: str | None, parent: Mapping[str, Any] | None = None,
                         opening: Sequence[tuple[EventType, dict[str, Any]]] = (),
                         agent_version: str | None = None,
                         instructions: str | None = None) -> None:
        j = self.journal
        if j.state.last_seq == 0:
            text = task if task is not None else render(input) if input is not None else ""
            started = {"task": text, "input": input, "agent": agent,
                       "scope": scope or run_scope(j.run_id)}
            if parent is not None:
                started["parent"] = dict(parent)
            if agent_version:
                started["agent_version"] = agent_version
            if instructions is not None:
                started["instructions"] = instructions
            j.stage([(E.RUN_STARTED, started), (E.USER_MESSAGE, {"content": text})])
            # The caller's own facts in the same batch (opaque encodings: not redacted).
            self.opened = tuple(j.record_all(list(opening), redact=False))
            return
        given = (("input", self._input, input), ("agent", j.state.agent, agent),
                 ("scope", j.state.scope, scope))
        for name, was, now in given:
            if now is not None and was is not None and j.as_recorded(now) != was:
                raise RunMismatchError(j.run_id, name, was, now, resume=continuation(
                    j.state, started={"input": self._input}).command)
        if j.state.status not in ("finished", "cancelled", "compensating", "compensated"):
            # The caller's facts in the same append as run_resumed, as with run_started:
            # a crash never leaves the run reopened without the input it was opened for.
            j.stage([(E.RUN_RESUMED, {"agent_version": agent_version} if agent_version
                      else {})])
            self.opened = tuple(j.record_all(list(opening), redact=False))

    def record(self, facts: Sequence[tuple[EventType, dict[str, Any]]], *,
               redact: bool = True) -> list[Event]:
        """Append the framework's own facts (its record-only event types) in one atomic
        batch under the run's lease, in order with the calls' facts. ``redact=False``
        only for opaque encodings (see ``RunJournal.record_all``)."""
        with self._lock:
            return self.journal.record_all(list(facts), redact=redact)

    # --- how the run ends -------------------------------------------------------------

    def finish(self, output: Any) -> None:
        """Record the run's outcome (JSON data); nothing when it already finished."""
        with self._lock:
            if self.journal.state.status != "finished":
                self.journal.record(E.RUN_FINISHED, outcome=output)

    def pause(self, reason: str) -> None:
        """Record that the run stopped, resumable, and why (unless it already stopped:
        the pause or escalation recorded then says why)."""
        with self._lock:
            if self.journal.state.status in ("running", "waiting_approval"):
                self.journal.record(E.RUN_PAUSED, reason=reason)

    def fail(self, error: BaseException) -> None:
        """Record that the framework failed with ``error``: the run is paused (a resume
        tries again from the log), the error its reason."""
        self.pause(f"error: {type(error).__name__}: {error}")

    def close(self) -> None:
        """Store what is staged (a model turn whose calls were not made), release the
        lease (unless kept) and stop renewing it. Idempotent."""
        if not self._closed:
            self._closed = True
            try:
                with self._lock:
                    self.journal.flush()
                self.journal.at_rest()
            finally:
                self.journal.close()

    def __enter__(self) -> BridgedRun:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: object) -> None:
        try:
            if isinstance(exc, Exception) and not isinstance(exc, NeedsPerson):
                with _suppressed():
                    self.fail(exc)
        finally:
            self.close()

    async def __aenter__(self) -> BridgedRun:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: object) -> None:
        self.__exit__(kind, exc, tb)


def open_run(store: Store, run_id: str, *, agent: str | None = None, input: Any = None,
             task: str | None = None, scope: str | None = None, owner: str | None = None,
             ttl: float = 30.0, keep_lease: bool = False, redaction: Redaction | None = None,
             tool_timeout: float | None = None, max_attempts: int = 3,
             max_recoveries: int = 20, max_result_bytes: int | None = None,
             snapshot_every: int | None = None,
             parent: Mapping[str, Any] | None = None,
             opening: Sequence[tuple[EventType, dict[str, Any]]] = (),
             strict: bool = False, agent_version: str | None = None,
             instructions: str | None = None) -> BridgedRun:
    """Start run ``run_id`` or resume it, for a framework to step through.

    Takes the run's lease (LeaseHeldError while another live owner holds it; a dead
    holder's is taken over at once). On first open records ``run_started`` with
    ``input`` (JSON data) and ``agent`` (what drives it, e.g. "pydantic_ai:shop"),
    and the input as the run's first user message (``task``: its text, default the
    input rendered). A resume given another ``input`` or ``agent`` than the recorded
    ones is refused (RunMismatchError); leaving them out is a plain resume.

    Use it as a context manager (``with`` or ``async with``); an exception leaving it
    pauses the run with the error as its reason. ``keep_lease``: closing leaves the
    lease held (a worker hands the run back itself). ``tool_timeout``: seconds a call
    may take before it is abandoned as uncertain (None: no limit). ``parent``: the call
    of another run that opens this one (its ``run_id``, the call's ``key`` and
    ``call_id``), recorded in ``run_started`` on first open. ``opening``: facts of the
    framework's own (record-only types) stored in the one append that opens the run,
    with ``run_started`` when it is new or ``run_resumed`` when it resumes, e.g. the
    input it is opened for (``run.opened``); not stored (``run.opened`` empty) when
    neither is recorded (a finished or cancelled run: the caller records them itself).
    ``agent_version``: the version of the agent code that opens it (given by the user,
    or a digest of its instructions, tools and model: ``deploys.AgentShape.version``),
    recorded with ``run_started`` or ``run_resumed``; ``instructions``: the agent's, as
    text, recorded with ``run_started`` (``agentjournal check`` tells an edit by them).
    ``strict``: a recorded step asked with another fingerprint (the
    code changed) raises :class:`NondeterminismError` instead of being served.
    """
    run_id = require_run_id(run_id)
    holder: list[BridgedRun] = []

    def observe(event: Event, state: RunState) -> None:
        if holder:
            holder[0]._index(event)

    journal = open_journal(store, run_id, owner=owner, ttl=ttl, observer=observe,
                           redaction=redaction, keep_lease=keep_lease,
                           snapshot_every=snapshot_every)
    try:
        run = BridgedRun(journal, tool_timeout=tool_timeout, max_attempts=max_attempts,
                         max_recoveries=max_recoveries, max_result_bytes=max_result_bytes,
                         strict=strict)
        if journal.state.last_seq:
            for event in store.read(run_id):
                run._index(event)
        holder.append(run)
        run._start_or_resume(opening=opening, agent=agent,
                             input=input, task=task, scope=scope,
                             parent=parent, agent_version=agent_version,
                             instructions=instructions)
    except BaseException:
        journal.close()
        raise
    return run


#: ``async with aopen_run(...) as run``: the same object (opening appends at most one
#: short batch, made on the event loop as the native ``arun`` does).
aopen_run = open_run


def _priced(turn: Turn) -> dict[str, Any]:
    """The turn's usage with its cost: given, else by the model's price (None: unknown)."""
    usage = dict(turn.usage)
    if "cost_usd" not in usage:
        counts = {k: v for k, v in usage.items() if k in Usage.__struct_fields__}
        usage["cost_usd"] = cost_of(Usage(**counts), turn.model)
    return usage


def _encoded(encode: Encode, value: Any) -> Any:
    """The value a call returned, encoded by the shell for the log; NotKept when the
    encoder refuses it: the call was made, so it completes as "result not kept" (as under
    the loop, results.py), never as an uncertain call."""
    try:
        return encode(value)
    except Exception as exc:
        return NotKept(f"its result has no JSON form: {type(exc).__name__}: {exc}")


def _parts_of(parts: Parts | None) -> dict[str, str]:
    if parts is None:
        return {}
    return dict(parts() if callable(parts) else parts)


def _differs(*fields: tuple[str, str, str]) -> str:
    """The names of the fields whose old and new values differ, as a phrase."""
    return " and ".join(name for name, old, new in fields if old != new) or "nothing"


def _tell(executed: Callable[[bool], None] | None, ran: bool) -> None:
    if executed is not None:
        executed(ran)


def _unwrap(outcome: Outcome) -> Any:
    if outcome.error is not None:
        raise outcome.error
    return outcome.value


class _suppressed:
    """Recording why a run stopped must not hide the error that stopped it."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, exc: object, tb: object) -> bool:
        return isinstance(exc, Exception)


def _under(steps: Steps[Any], lock: threading.RLock) -> Steps[Any]:
    """``steps`` with ``lock`` held while the rules read and record (each advance, each
    completion) and released while the world is waited on (calls, lookups), so the
    calls of other threads and tasks go on. Driven by ops.run_sync or ops.run_async."""
    value: Any = None
    error: BaseException | None = None
    while True:
        with lock:
            finished, op = _advance(steps, value, error)
        if finished:
            return op
        value, error = None, None
        try:
            value = yield _locked(op, lock)
        except Exception as exc:
            error = exc


def _locked(op: Op, lock: threading.RLock) -> Op:
    """``op``, its completions recorded under ``lock``."""
    if not isinstance(op, Invoke):
        return op
    done = op.done

    def record(i: int, outcome: Outcome) -> None:
        with lock:
            done(i, outcome)

    return Invoke(op.calls, record, op.limit)
