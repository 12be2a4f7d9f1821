"""``JournalRunner``: the SDK's ``Runner`` with every model call and tool call journaled.

The SDK's loop drives; agentjournal's bridge (``agentjournal.bridge``) lends it the
journal and the call protocol, so a run killed at any point resumes without asking the
model again for a turn it answered, and without making a recorded call again:

- **model calls**: the agent (and every agent it hands off to) gets a model wrapper; a
  call is a bridge step named ``openai_agents.model.<segment>``, fingerprinted by what
  the model was asked (instructions, input, tools, handoffs, output type). On resume
  the recorded answer is served, also when the code now asks something else (a deploy
  edited the instructions, added a tool): history is history, and a ``request_changed``
  fact names the parts that changed; the next turn is asked with the new code.
  ``strict=True`` refuses instead (``NondeterminismError``). A call the log holds open
  (uncertain, or waiting for an approval) that the new code makes under another tool,
  identity or effect class, or whose tool is gone, pauses the run for a person
  (``CodeChanged``, a ``NeedsPerson``) with a reason naming the change. The agent's
  version (``version=``, else :func:`agent_version`) is recorded at start and resume.
- **function tools** (and MCP tools): ``on_invoke_tool`` is replaced by one that goes
  through the bridge's call protocol with the tool's effect class, identity and lookup
  (:class:`ToolPolicy`; an MCP tool's annotations give its class when no policy is
  given; else irreversible). ``tool_call_started`` is durable before the tool runs;
  the tool gets the idempotency key through ``agentjournal.current_call()``. The starts
  of a turn's calls are appended in the order the model gave them.
- **agents used as tools** (``Agent.as_tool``): the call is journaled as any function
  tool's; the agent it runs inside that call is not journaled yet (issue 45), but each
  call that agent makes gets a ``current_call()`` of its own, keyed as a call of the run
  would be (its tool and arguments, or its policy's identity, in the run's scope): two
  different calls never share the outer call's key, and a retried outer call sends the
  same keys again.
- **agents run with the SDK's own Runner inside a call** (a function tool calling
  ``Runner.run(child, ...)``): their calls are not journaled, so each would send the
  outer call's key. ``current_call()`` read in a tool of such a run raises
  ``JournalError`` (before anything is sent), naming what to do instead (run the child
  with ``JournalRunner`` under a run id of its own, or use ``Agent.as_tool``); the
  outer call is left uncertain, never completed, and the refusal is raised to the
  caller, even where a tool answered it. "Such a run" is told by the SDK's own mark of
  a run, which every ``Runner.run`` sets anew.
- **interruptions**: a tool with ``needs_approval`` records ``approval_requested``; a
  call whose effect is uncertain and that no lookup settles becomes an SDK interruption
  too (its tool asks "approval"). The SDK's ``RunState`` at an interruption is stored
  in the journal (a bridge step ``openai_agents.state.<k>``), so the next
  ``run`` with the same run id resumes from it, applying the decisions recorded in the
  journal (``agentjournal approve`` / ``deny`` / ``resolve``, or approvals made on the SDK's state
  and passed back): nothing needs to be kept by the caller (openai-agents-python#4244).
- **traces**: the SDK's spans of the run are summarised into one ``trace_recorded``
  event (an observer: see tracing.py).

A segment is the part of a run between two stored ``RunState``s: segment 0 starts
from the input, segment k goes on from the k-th state stored (``state.<k-1>``).
A streamed run (``JournalRunner.run_streamed``) is journaled the same way: a model's
stream passes through as it comes, but its ``response.completed`` waits until the answer
is recorded; on resume a recorded answer comes as that one event, without its deltas.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import hashlib
import inspect
import json
import logging
import threading
import types
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from agents import (
    Agent,
    Handoff,
    Model,
    RunConfig,
    Runner,
    RunResult,
    RunResultStreaming,
    RunState,
    StreamEvent,
)
from agents.exceptions import ModelBehaviorError
from agents.items import ModelResponse, ToolApprovalItem

# The SDK's own mark of one run (each Runner.run / run_streamed sets its own, and an agent
# used as a tool runs one too): who reads a call's context (openai-agents 0.24).
from agents.run_internal.agent_tool_configuration import _current_run as _SDK_RUN
from agents.tool import FunctionTool, maybe_invoke_function_tool_failure_error_function
from agents.tool_context import ToolContext as SdkToolContext
from agents.tracing import gen_trace_id
from agents.usage import Usage, deserialize_usage, serialize_usage
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseOutputItem,
    ResponseOutputItemDoneEvent,
    ResponseUsage,
)
from pydantic import TypeAdapter

from ...bridge import _CURRENT, BridgedRun, CodeChanged, Turn, open_run, reading_checked
from ...deploys import DESCRIBERS, AgentShape, ToolShape, digest, model_identity
from ...deploys import agent_shape as make_shape
from ...errors import CallRefused, JournalError, NeedsPerson, ResultNotKeptError
from ...events import EventType
from ...fleet.runnable import Stopped
from ...keys import idempotency_key
from ...results import to_json
from ...store import Store
from ...tools import Absent, Effect, Found, Reconciler, ToolContext
from . import tracing

__all__ = ["JournalAgent", "JournalRunner", "JournaledStream", "ToolPolicy", "agent_shape",
           "agent_version", "mcp_effect"]

log = logging.getLogger("agentjournal.openai_agents")

MODEL_STEP = "openai_agents.model"
STATE_STEP = "openai_agents.state"
_OUTPUT_ITEM: TypeAdapter[Any] = TypeAdapter(ResponseOutputItem)
#: Seconds a call waits for the call before it in the model's answer to start: past it,
#: that call is taken to be one the SDK does not run (the order is then not kept).
ORDER_WAIT = 5.0

T = TypeVar("T")
#: Where a run stopped: its status, the seq of its last event, its lease epoch.
Ended = tuple[str, int, int]
#: What the SDK's Runner gave: a run's result, or a streamed run's once it ended.
SdkResult = RunResult | RunResultStreaming
#: Where a streamed run's events go, as they come.
Emit = Callable[[StreamEvent], None]


@dataclass(frozen=True, kw_only=True)
class ToolPolicy:
    """How a tool's calls are journaled: its effect class, the argument fields that name
    the action (default: all), the lookup that settles an uncertain call (as
    ``@tool(reconcile=...)``: it gets the ``PendingCall`` and returns Found, Absent,
    Conflict or Unknown), and how long its receiver keeps idempotency keys."""

    effect: Effect | str = Effect.IRREVERSIBLE
    identity: Sequence[str] = ()
    lookup: Reconciler | None = None
    key_retention: float | None = None


def mcp_effect(annotations: Any) -> Effect:
    """The effect class an MCP tool's annotations declare: ``readOnlyHint`` read-only,
    ``idempotentHint`` idempotent (repeating the call with the same arguments has no
    further effect), anything else irreversible (the hints are the server's claims;
    without them nothing is assumed)."""
    if _hint(annotations, "read_only_hint", "readOnlyHint"):
        return Effect.READ_ONLY
    if _hint(annotations, "idempotent_hint", "idempotentHint"):
        return Effect.IDEMPOTENT
    return Effect.IRREVERSIBLE


def _hint(annotations: Any, *names: str) -> bool:
    """An MCP annotation's hint, by its Python or its wire name (or a dict's key): the
    first name it has (MCP SDK 2 keeps the wire name as a deprecated alias)."""
    if isinstance(annotations, dict):
        return any(annotations.get(name) is True for name in names)
    name = next((n for n in names if n in type(annotations).__dict__
                 or n in getattr(type(annotations), "model_fields", {})), names[-1])
    return getattr(annotations, name, None) is True


class JournalRunner:
    """``Runner.run`` / ``Runner.run_sync`` with the run kept in an agentjournal store."""

    @classmethod
    async def run(cls, starting_agent: Agent[Any], input: str | list[Any] | RunState[Any],
                  *, store: Store, run_id: str,
                  policies: Mapping[str, ToolPolicy | Effect | str] | None = None,
                  context: Any = None, max_turns: int | None = None, hooks: Any = None,
                  run_config: RunConfig | None = None, session: Any = None,
                  owner: str | None = None, ttl: float = 30.0, trace: bool = True,
                  context_serializer: Callable[[Any], Mapping[str, Any]] | None = None,
                  context_deserializer: Callable[[Mapping[str, Any]], Any] | None = None,
                  strict: bool = False, version: str | None = None) -> RunResult:
        """Start run ``run_id`` or resume it: the SDK's ``RunResult``.

        The same call resumes a run that was killed, or stopped at an interruption
        (``result.interruptions``). ``input`` is the run's input (recorded at its start;
        a resume with another input is refused), or the ``RunState`` of an interruption
        with approvals made on it (they are recorded in the journal first).
        ``policies`` maps tool names to their :class:`ToolPolicy` (or just an effect).
        The other arguments are ``Runner.run``'s. Raises what ``Runner.run`` raises, and
        ``CodeChanged`` when the code changed under a call the log holds open (the run is
        paused for a person). ``strict``: raise the bridge's ``NondeterminismError`` when
        the agent asks the model something other than what the log recorded (default:
        the recorded answer is served and the change recorded). ``version``: the agent's
        version recorded with the run (default: :func:`agent_version`).
        """
        result, _ = await _run(starting_agent, input, **_run_args(
            store=store, run_id=run_id, policies=policies, context=context,
            max_turns=max_turns, hooks=hooks, run_config=run_config, session=session,
            owner=owner, ttl=ttl, trace=trace, context_serializer=context_serializer,
            context_deserializer=context_deserializer, strict=strict, version=version))
        return cast(RunResult, result)

    @classmethod
    def run_sync(cls, starting_agent: Agent[Any], input: str | list[Any] | RunState[Any],
                 **kwargs: Any) -> RunResult:
        """:meth:`run` in a new event loop (not from inside a running one)."""
        return asyncio.run(cls.run(starting_agent, input, **kwargs))

    @classmethod
    def run_streamed(cls, starting_agent: Agent[Any], input: str | list[Any] | RunState[Any],
                     **kwargs: Any) -> JournaledStream:
        """:meth:`run`, streamed as ``Runner.run_streamed`` streams: iterate
        ``stream_events()``, then read ``final_output`` / ``interruptions``. Takes
        :meth:`run`'s arguments. The run starts (or resumes) when the iteration does."""
        given = inspect.signature(cls.run).bind(starting_agent, input, **kwargs)  # checked now
        given.apply_defaults()
        args = _run_args(**given.kwargs)
        return JournaledStream(lambda emit: _run(starting_agent, input, emit=emit, **args))


class JournalAgent:
    """An SDK agent that a worker of the fleet can drive (a ``Runnable``: see
    ``agentjournal.fleet.runnable``). Name it in a trusted module and submit runs of it:

        # myapp/agents.py
        billing = JournalAgent(Agent(name="billing", ...), policies={...})

        agentjournal submit --agent myapp.agents:billing --task "Invoice acme" ...
        agentjournal worker --agents myapp.agents ...

    The worker claims a run and calls :meth:`run_claimed`, which runs it with
    :class:`JournalRunner` holding the claimed lease (kept when it returns: the worker
    hands the run back). The task is the run's input. A run stopped at an interruption
    waits for a person (``agentjournal approve`` / ``deny`` / ``resolve``); the worker
    picks it up again once one decided.
    """

    def __init__(self, agent: Agent[Any], *,
                 policies: Mapping[str, ToolPolicy | Effect | str] | None = None,
                 context: Any = None, max_turns: int | None = None,
                 run_config: RunConfig | None = None, trace: bool = True,
                 strict: bool = False, version: str | None = None) -> None:
        self.agent, self.policies, self.context = agent, dict(policies or {}), context
        self.max_turns, self.run_config, self.trace = max_turns, run_config, trace
        self.strict, self.version = strict, version

    def run_claimed(self, store: Store, run_id: str, task: str | None, *, agent_ref: str,
                    owner: str, ttl: float, stop: threading.Event) -> Stopped:
        """Run (or resume) the claimed run to its end or its next interruption; it
        cannot stop mid-run, so a draining worker waits for that. A run the new code
        cannot go on with (:class:`CodeChanged`) is handed back paused, waiting for a
        person: not a crash."""
        try:
            _, (status, last_seq, epoch) = asyncio.run(_run(
                self.agent, task, store=store, run_id=run_id, policies=self.policies,
                context=self.context, max_turns=self.max_turns, hooks=None,
                run_config=self.run_config or RunConfig(), session=None, owner=owner,
                ttl=ttl, trace=self.trace, serializer=None, deserializer=None,
                agent_ref=agent_ref, keep_lease=True, strict=self.strict,
                version=self.version))
        except CodeChanged as changed:
            if changed.stopped_at is None:
                raise
            status, last_seq, epoch = changed.stopped_at
        return Stopped(status, last_seq, epoch)


class JournaledStream:
    """A journaled run, streamed (:meth:`JournalRunner.run_streamed`).

    ``stream_events()`` yields the SDK's stream events as the run makes them. A model's
    ``response.completed`` comes once its answer is recorded; a resumed run's recorded
    answers come as that one event each, without their deltas. Stopping the iteration
    early cancels the run (it resumes from its log). Then ``result`` is the run's
    result: ``final_output``, ``interruptions``, ``to_state()``.
    """

    def __init__(self, run: Callable[[Emit], Awaitable[tuple[SdkResult, Ended]]]) -> None:
        self._run = run
        self.result: SdkResult | None = None

    def stream_events(self) -> AsyncIterator[StreamEvent]:
        return _relayed(self._run, self._keep)

    def _keep(self, ended: tuple[SdkResult, Ended]) -> None:
        self.result = ended[0]

    @property
    def final_output(self) -> Any:
        return self._ended().final_output

    @property
    def interruptions(self) -> list[ToolApprovalItem]:
        return self._ended().interruptions

    def _ended(self) -> SdkResult:
        if self.result is None:
            raise RuntimeError("the run has not ended: iterate stream_events() first")
        return self.result


# --- one open run --------------------------------------------------------------------


def _run_args(*, policies: Mapping[str, ToolPolicy | Effect | str] | None,
              run_config: RunConfig | None, context_serializer: Any,
              context_deserializer: Any, **given: Any) -> dict[str, Any]:
    """:meth:`JournalRunner.run`'s keyword arguments, as :func:`_run_once` takes them."""
    return dict(given, policies=policies or {}, run_config=run_config or RunConfig(),
                serializer=context_serializer, deserializer=context_deserializer)


async def _run(agent: Agent[Any], input: Any, *, emit: Emit | None = None,
               **args: Any) -> tuple[SdkResult, Ended]:
    try:
        return await _run_once(agent, input, emit=emit, **args)
    except Exception as error:
        needs = _needs_person(error)
        if needs is None:
            raise
        if isinstance(needs, CodeChanged):  # the same code stops there again
            raise needs from error
    # A call's effect became uncertain as it ran, and nothing settled it: the run is
    # paused. Opened again, the SDK meets that call in the log, as an interruption (a
    # replay of what a stream already showed: not streamed again).
    return await _run_once(agent, input, **args)


async def _run_once(agent: Agent[Any], input: Any, *, store: Store, run_id: str,
                    policies: Mapping[str, ToolPolicy | Effect | str], owner: str | None,
                    ttl: float, trace: bool, run_config: RunConfig,
                    agent_ref: str | None = None, keep_lease: bool = False,
                    strict: bool = False, version: str | None = None,
                    **runner: Any) -> tuple[SdkResult, Ended]:
    given_state = input if isinstance(input, RunState) else None
    recorded_input = None if given_state is not None else _plain(input)
    shape = agent_shape(agent, policies, version=version, strict=strict)
    with open_run(store, run_id, agent=agent_ref or f"openai-agents:{agent.name}",
                  input=recorded_input, owner=owner, ttl=ttl, keep_lease=keep_lease,
                  strict=strict, agent_version=shape.version,
                  instructions=_instructions_text(agent)) as run:
        if input is None and given_state is None:
            input = run.state.task  # a resume that did not repeat the input
        driver = _Driver(run, policies)
        # A finished run is replayed from its log: nothing new to trace.
        processor = tracing.install() if trace and run.status != "finished" else None
        if processor is not None:
            trace_id = run_config.trace_id or gen_trace_id()
            run_config = dataclasses.replace(run_config, trace_id=trace_id)
            processor.bind(trace_id)
        refusal: JournalError | None = None
        try:
            result = await driver.drive(agent, given_state, input, run_config=run_config,
                                        **runner)
        except Exception as error:
            if isinstance(changed := _needs_person(error), CodeChanged):
                changed.stopped_at = (run.status, run.state.last_seq, run.journal.lease.epoch)
            if (refusal := driver.refusal_behind(error)) is None:
                raise
        finally:
            if processor is not None:
                driver.record_trace(processor, run_config.trace_id or "")
        if refusal is not None:  # the caller is told what to change, not the SDK's wrap
            raise refusal
        if not result.interruptions:
            run.finish(to_json(result.final_output, "final_output"))
        return result, (run.status, run.state.last_seq, run.journal.lease.epoch)


async def _sdk_run(agent: Agent[Any], start: Any, emit: Emit | None,
                   **runner: Any) -> SdkResult:
    """``Runner.run``; or, given ``emit``, ``Runner.run_streamed`` with each event told to
    it, cancelled if this is (the caller stopped listening)."""
    if emit is None:
        return await Runner.run(agent, start, **runner)
    streamed = Runner.run_streamed(agent, start, **runner)
    async for event in streamed.stream_events():  # (cancelled, it cancels the run)
        emit(event)
    return streamed


def _needs_person(error: BaseException | None) -> NeedsPerson | None:
    """The NeedsPerson behind ``error`` (the SDK may wrap what a tool raised)."""
    seen = 0
    while error is not None and seen < 10:
        if isinstance(error, NeedsPerson):
            return error
        error, seen = error.__cause__ or error.__context__, seen + 1
    return None


class _Driver:
    """What one ``JournalRunner.run`` call wraps the SDK's agents with."""

    def __init__(self, run: BridgedRun, policies: Mapping[str, ToolPolicy | Effect | str]):
        self.run = run
        self.policies = {name: p if isinstance(p, ToolPolicy) else ToolPolicy(effect=p)
                         for name, p in policies.items()}
        self.segment = 0
        self.config = RunConfig()
        self.turns = _Turns()
        self._agents: dict[int, Agent[Any]] = {}
        self._inside: dict[int, Agent[Any]] = {}  # the agents run inside a call, keyed
        # Each call context given out (by id, while it is current): the SDK run it was
        # given in, the only one that may read it (see read_in).
        self._given_in: dict[int, object] = {}
        self._refusals: list[JournalError] = []  # raised by a tool to the run's caller

    async def drive(self, agent: Agent[Any], given: RunState[Any] | None, input: Any, *,
                    context: Any, serializer: Any, deserializer: Any, run_config: RunConfig,
                    emit: Emit | None = None, **runner: Any) -> SdkResult:
        self.config = run_config
        if run_config.model is not None:  # it answers for every agent of the run
            model = _JournaledModel(self, run_config.model)
            run_config = dataclasses.replace(run_config, model=model)
        runner["run_config"] = run_config
        if runner.get("session") is not None:
            runner["session"] = _ReplayedSession(self, runner["session"])
        if runner.get("max_turns") is None:
            runner.pop("max_turns", None)  # the SDK's default
        wrapped = self.wrap_agent(agent)
        saved = self.saved_states()
        if given is not None:
            self.record_decisions(given)
            if not saved:  # a state from outside the journal: it is the first one
                saved = [self.save_state(given, serializer, index=0)]
        self.segment = len(saved)  # segment k goes on from the k-th state saved
        if saved:
            state = await RunState.from_json(wrapped, saved[-1], context_override=context,
                                             context_deserializer=deserializer)
            self.apply_decisions(state)
            result = await _sdk_run(wrapped, state, emit, **runner)
        else:
            result = await _sdk_run(wrapped, input, emit, context=context, **runner)
        if result.interruptions:
            self.save_state(result.to_state(), serializer, index=self.segment)
            self.pause_for_uncertain(result.interruptions)
        return result

    def pause_for_uncertain(self, interruptions: Sequence[ToolApprovalItem]) -> None:
        """Record why the run stopped when an interruption is an uncertain call (an
        approval's request already says so): what a person must decide, and how."""
        keys = []
        for item in interruptions:
            call = _call_of(item)
            approval = None if call is None else self.approval_id(call[1], call[2])
            if call is not None and approval not in self.run.state.approvals and (
                    approval not in self.run.state.decisions):
                now = self.key(call[1], call[2])
                started = self.started_key(call[0]) or now
                # The key its start recorded: the one a person resolves. Another key now
                # (a deploy changed the tool's identity) is said, never used.
                keys.append(f"{call[1]} {started[:16]}" + (
                    "" if started == now else f" (recorded under that key; the code now "
                    f"keys it {now[:16]}: the tool's name or identity fields changed)"))
        if keys:
            self.run.pause(f"uncertain: {', '.join(keys)}; decide with `agentjournal resolve "
                           f"{self.run.run_id} KEY --happened | --did-not-happen`, then run "
                           "again")

    # --- the stored RunStates and the decisions on them ---------------------------------

    def saved_states(self) -> list[dict[str, Any]]:
        """The RunStates stored at this run's interruptions, oldest first."""
        states: list[dict[str, Any]] = []
        while recorded := self.run.recorded(f"{STATE_STEP}.{len(states)}"):
            states.append(recorded[0])
        return states

    def save_state(self, state: RunState[Any], serializer: Any, *,
                   index: int) -> dict[str, Any]:
        """Store the SDK's state at an interruption, as the run's ``index``-th."""
        saved: dict[str, Any] = to_json(state.to_json(context_serializer=serializer),
                                        "the SDK's RunState")
        return cast(dict[str, Any], self.run.step(
            f"{STATE_STEP}.{index}", f"state {index}", lambda: saved))

    def record_decisions(self, state: RunState[Any]) -> None:
        """Record the approvals the caller made on an interruption's RunState."""
        context = state._context
        for item in state.get_interruptions():
            call = _call_of(item)
            if call is None or context is None:
                continue
            approved = context.is_tool_approved(call[1], call[0])
            approval_id = self.approval_id(call[1], call[2])
            if approved is not None and approval_id in self.run.state.approvals:
                self.run.decide_approval(approval_id, approved=approved,
                                         by="openai-agents caller")

    def apply_decisions(self, state: RunState[Any]) -> None:
        """Apply to a stored RunState what was decided since: approvals and denials
        (``agentjournal approve`` / ``deny``), and verdicts on uncertain calls (``resolve``)."""
        for item in state.get_interruptions():
            call = _call_of(item)
            if call is None:
                continue
            call_id, tool, args = call
            decision = self.run.state.decisions.get(self.approval_id(tool, args))
            if decision is not None and decision.approved:
                state.approve(item)
            elif decision is not None:
                state.reject(item, rejection_message=decision.reason or None)
            elif self.uncertain_settled(call_id, tool, args):
                state.approve(item)  # a person resolved it: the bridge answers or remakes it

    def approval_id(self, tool: str, args: dict[str, Any]) -> str:
        return self.run.approval_id(tool, args, identity=self.policy(tool).identity)

    def uncertain_settled(self, call_id: str, tool: str, args: dict[str, Any]) -> bool:
        """Whether a call that stopped the run as uncertain has been decided since (one
        that never started, e.g. waiting for an approval, is not: it stays waiting)."""
        key = self.started_key(call_id) or self.key(tool, args)
        if not self.run.state.attempts.get(key, 0):
            return False  # never started: not an uncertain call
        if self.run.answer(call_id) is not None:
            return True  # it happened (a person or a lookup said so): served from the log
        return not any(p.key == key for p in self.run.state.pending.values())

    def started_key(self, call_id: str) -> str | None:
        """The key call ``call_id`` was started under (open, or answered), if it was: the
        code may key it otherwise now (a deploy changed its tool's identity)."""
        for p in self.run.state.pending.values():
            if p.call_id == call_id:
                return p.key
        answer = self.run.answer(call_id)
        return answer.key if answer is not None else None

    async def needs_person(self, tool: str, args: dict[str, Any], policy: ToolPolicy) -> bool:
        """Whether the call would stop the run for a person if made now: its key is
        uncertain (started, never completed), its effect may not be retried blindly, and
        its lookup (run here: a read) neither finds it nor proves it absent. The call
        itself then settles it again by the bridge's rules (found: served; absent: made
        again with the same key); this only decides whether the SDK is to ask a person."""
        key = self.key(tool, args)
        pending = next((p for p in self.run.state.pending.values() if p.key == key), None)
        if pending is None or Effect(policy.effect) in (Effect.READ_ONLY, Effect.IDEMPOTENT):
            return False
        if policy.lookup is None:
            return True
        try:
            if inspect.iscoroutinefunction(policy.lookup):
                evidence = await policy.lookup(pending)
            else:
                evidence = await asyncio.to_thread(policy.lookup, pending)
        except Exception:
            return True  # the lookup failed: nothing is known
        return not isinstance(evidence, Found | Absent) or (
            isinstance(evidence, Absent) and not evidence.final)

    def key(self, tool: str, args: dict[str, Any]) -> str:
        identity = tuple(self.policy(tool).identity) or None
        return idempotency_key(self.run.state.scope, tool, args, identity)

    def policy(self, tool: str, annotations: Any = None) -> ToolPolicy:
        if tool in self.policies:
            return self.policies[tool]
        return ToolPolicy(effect=mcp_effect(annotations))

    # --- who reads a call's context --------------------------------------------------

    @contextlib.contextmanager
    def given(self, ctx: ToolContext) -> Iterator[None]:
        """``ctx`` is given out in the SDK run current here, while inside."""
        self._given_in[id(ctx)] = _SDK_RUN.get()
        try:
            yield
        finally:
            self._given_in.pop(id(ctx), None)

    def read_in(self, tool: str,
                refused: list[JournalError]) -> Callable[[ToolContext], None]:
        """Who may read a call's context (``current_call()``) inside a call of ``tool``:
        code of the SDK run it was given in (the tool's, or, for an agent used as a
        tool, that agent's: :meth:`key_tool`). A tool of another run, one its body
        started with the SDK's own Runner, is refused (each refusal kept in
        ``refused``): its calls are not journaled, so each would send that context's
        key, and a receiver that honours keys would apply only the first of them."""
        def check(ctx: ToolContext) -> None:
            reader, given_in = _SDK_RUN.get(), self._given_in.get(id(ctx))
            if reader is None or given_in is None or reader is given_in:
                return
            agent = _starting_agent(reader)
            refused.append(JournalError(
                f"current_call() was read in a tool of agent {agent!r}, run with the "
                f"SDK's own Runner inside tool call {tool!r} ({ctx.call_id}) of run "
                f"{self.run.run_id!r}: its calls are not journaled, so each would send "
                "that one call's idempotency key, and a receiver that honours keys would "
                f"apply only the first. Run {agent!r} with JournalRunner under a run id of "
                "its own (same store, e.g. one made of this call's key), or give it to "
                "the agent as a tool (Agent.as_tool): each of its calls then has a key of "
                "its own.", run_id=self.run.run_id))
            raise refused[-1]
        return check

    def refusal(self, refused: JournalError) -> JournalError:
        """What a call whose body read a context it was refused raises: that refusal,
        for the run's caller (not a person asked, nor the model told), a new error with
        no pause behind it (the call is already left uncertain: :meth:`refusal_behind`)."""
        told = JournalError(str(refused), run_id=self.run.run_id)
        self._refusals.append(told)
        return told

    def refusal_behind(self, error: BaseException) -> JournalError | None:
        """The refusal a tool raised (:meth:`refusal`) behind ``error``: the SDK wraps
        what a tool raises in its own ``UserError``."""
        seen: BaseException | None = error
        for _ in range(10):
            if seen is None:
                break
            if any(seen is told for told in self._refusals):
                return cast(JournalError, seen)
            seen = seen.__cause__ or seen.__context__
        return None

    # --- traces ------------------------------------------------------------------------

    def record_trace(self, processor: tracing.JournalTraceProcessor, trace_id: str) -> None:
        """The run's span summaries, in one event: an observer, so a failure to record
        them is logged, never raised."""
        spans, dropped = processor.take(trace_id)
        processor.unbind(trace_id)
        if not spans and not dropped:
            return
        try:
            self.run.journal.record(EventType.TRACE_RECORDED, trace_id=trace_id, spans=spans,
                                    dropped=dropped)
        except JournalError:
            log.warning("run %s: could not record its trace %s", self.run.run_id, trace_id,
                        exc_info=True)

    # --- wrapping the SDK's agents -----------------------------------------------------

    def wrap_agent(self, agent: Agent[Any], *, inside: bool = False) -> Agent[Any]:
        """A clone of ``agent`` (and of the agents it hands off to) whose model and
        function tools go through the journal; ``inside`` a call (an agent used as a
        tool runs inside its call), one whose function tools are keyed (:meth:`key_tool`)."""
        done = self._inside if inside else self._agents
        if (clone := done.get(id(agent))) is not None:
            return clone
        clone = agent.clone()
        done[id(agent)] = clone  # before the handoffs: they may lead back here
        wrap = self.key_tool if inside else self.wrap_tool
        if not inside:  # (a child's own turns are not journaled yet: issue 45)
            clone.model = _JournaledModel(self, agent.model)
        clone.tools = [wrap(t) if isinstance(t, FunctionTool) else t for t in agent.tools]
        clone.handoffs = [self._wrap_handoff(h, inside) for h in agent.handoffs]
        if agent.mcp_servers:
            self._wrap_mcp_tools(clone, wrap)
        return clone

    def _wrap_mcp_tools(self, clone: Agent[Any],
                        wrap: Callable[[FunctionTool], FunctionTool]) -> None:
        """The clone's MCP tools, listed by its servers each turn, wrapped as they are
        listed (the effect class from each tool's annotations unless a policy names it)."""
        listed = clone.get_mcp_tools

        async def get_mcp_tools(run_context: Any) -> list[Any]:
            return [wrap(t) if isinstance(t, FunctionTool) else t
                    for t in await listed(run_context)]

        clone.get_mcp_tools = get_mcp_tools  # type: ignore[method-assign]

    def _wrap_handoff(self, handoff: Agent[Any] | Handoff[Any, Any], inside: bool) -> Any:
        if isinstance(handoff, Agent):
            return self.wrap_agent(handoff, inside=inside)
        invoke = handoff.on_invoke_handoff

        async def wrapped(*args: Any, **kwargs: Any) -> Any:
            return self.wrap_agent(await invoke(*args, **kwargs), inside=inside)

        return dataclasses.replace(handoff, on_invoke_handoff=wrapped)

    def _child_of(self, tool: FunctionTool, impl: Any) -> Any:
        """``impl`` (a tool's invocation), running its agent keyed if the tool is an agent
        used as a tool (``Agent.as_tool``): the calls that agent makes inside this call
        each get a key of their own (:meth:`key_tool`), never this call's."""
        child = getattr(tool, "_agent_instance", None)
        if not getattr(tool, "_is_agent_tool", False) or not isinstance(child, Agent):
            return impl
        return _running(impl, self.wrap_agent(child, inside=True), tool.name)

    def key_tool(self, tool: FunctionTool) -> FunctionTool:
        """``tool`` of an agent that runs inside a call (an agent used as a tool): its
        calls are not journaled (a sub-agent as a run of its own is issue 45), but each
        has a context of its own for ``current_call()``: the key it would have as a call
        of the run (its tool, its arguments or the identity its policy declares, in the
        run's scope), its call id under the outer call's. With the outer call's context,
        two different calls would send one key, and a receiver that honours keys would
        answer the second from the first: an effect lost."""
        identity = tuple(self.policy(tool.name).identity) or None
        original = tool.on_invoke_tool
        clone = dataclasses.replace(tool)
        inner = getattr(original, "_invoke_tool_impl", None)
        if inner is not None:  # an agent used as a tool inside this one: keyed too
            original = copy.copy(original)
            original._invoke_tool_impl = self._child_of(tool, inner)  # type: ignore[attr-defined]

        async def invoke(ctx: SdkToolContext[Any], arguments: str) -> Any:
            # The outer call's context as set: read here, in the child's run, it is not
            # this tool's to send (current_call() would refuse it).
            args, outer = _arguments(arguments), _CURRENT.get()
            if args is None or outer is None:  # not a JSON object: the SDK says so
                return await original(ctx, arguments)
            own = dataclasses.replace(
                outer, key=idempotency_key(outer.scope, tool.name, args, identity),
                call_id=f"{outer.call_id}/{ctx.tool_call_id}")
            with _calling(own), self.given(own):
                return await original(ctx, arguments)

        clone.on_invoke_tool = invoke
        return clone

    def wrap_tool(self, tool: FunctionTool, annotations: Any = None) -> FunctionTool:
        """``tool`` with its calls made by the call protocol."""
        policy = self.policy(tool.name, annotations if annotations is not None
                             else tool.mcp_annotations)
        original = tool.on_invoke_tool
        # Its own exceptions, not the SDK's text for them: an exception from a tool with
        # an effect may mean the effect happened (uncertain), never just "an error".
        raw = self._child_of(tool, getattr(original, "_invoke_tool_impl", original))
        clone = dataclasses.replace(tool)
        driver = self

        async def invoke(ctx: SdkToolContext[Any], arguments: str) -> Any:
            args = _arguments(arguments)
            if args is None:  # not a JSON object: the SDK says so to the model
                return await original(ctx, arguments)
            call_id = ctx.tool_call_id
            await driver.turns.wait(call_id)
            refused: list[JournalError] = []  # reads of current_call() refused in the body

            async def body(given: ToolContext) -> Any:
                driver.turns.release(call_id)  # our start is durable: the next may start
                with driver.given(given), reading_checked(
                        driver.read_in(tool.name, refused)):
                    result = await raw(ctx, arguments)
                if refused:  # answered inside (by the SDK or a tool): still no result, as
                    raise refused[0]  # the child's calls were not made: not completed
                return result

            try:
                return await driver.run.acall(
                    tool.name, args, call_id=call_id, body=body, effect=policy.effect,
                    identity=policy.identity, lookup=policy.lookup,
                    key_retention=policy.key_retention, encode=_encode_result)
            except (CallRefused, ResultNotKeptError) as denied:
                return denied.reason
            except Exception as error:  # a person needed, a proven failure (or a read-only
                if not refused:  # tool's error), unless a read was refused (below)
                    if isinstance(error, NeedsPerson):
                        raise
                    said = await maybe_invoke_function_tool_failure_error_function(
                        function_tool=clone, context=ctx, error=error)
                    if said is None:
                        raise
                    return said
            finally:
                driver.turns.release(call_id)
            # A read of current_call() was refused inside: the caller is told what to
            # change (not a person asked, nor the model told), raised outside the handler
            # so that nothing takes it for a pause.
            raise driver.refusal(refused[0])

        asks = tool.needs_approval

        async def needs_approval(wrapper: Any, args: dict[str, Any], call_id: str) -> bool:
            own = asks if isinstance(asks, bool) else await asks(wrapper, args, call_id)
            if own:
                driver.run.request_approval(tool.name, args, call_id=call_id,
                                            identity=policy.identity,
                                            reason=f"{tool.name} needs approval")
            elif not await driver.needs_person(tool.name, args, policy):
                return False
            driver.turns.release(call_id)  # it will not run now: the next may start
            return True

        clone.on_invoke_tool = invoke
        clone.needs_approval = needs_approval
        return clone

    def expect_calls(self, response: ModelResponse) -> None:
        """The function calls of a model answer: their starts are appended in this order."""
        self.turns.expect([str(getattr(i, "call_id", "")) for i in response.output
                           if getattr(i, "type", None) == "function_call"])


@contextlib.contextmanager
def _calling(ctx: ToolContext) -> Iterator[None]:
    """``current_call()`` is ``ctx`` inside: a call made inside another's body."""
    token = _CURRENT.set(ctx)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def _running(impl: Any, agent: Agent[Any], tool: str) -> Any:
    """``Agent.as_tool``'s invocation ``impl``, running ``agent`` (a clone of the one it
    was made of) in place of its own: the SDK keeps that agent in the closure (``self``)."""
    code = getattr(impl, "__code__", None)
    if code is None or "self" not in code.co_freevars or impl.__closure__ is None:
        raise JournalError(
            f"cannot journal the agent used as tool {tool!r}: this version of the Agents "
            "SDK builds Agent.as_tool differently from the ones agentjournal supports "
            "(openai-agents 0.24), and its calls would share one idempotency key. Use the "
            "supported version, or make the agent a handoff instead of a tool.")
    cells = list(impl.__closure__)
    cells[code.co_freevars.index("self")] = types.CellType(agent)
    rebound = types.FunctionType(code, impl.__globals__, impl.__name__, impl.__defaults__,
                                 tuple(cells))
    rebound.__kwdefaults__ = impl.__kwdefaults__
    return rebound


# --- the model ---------------------------------------------------------------------------


class _JournaledModel(Model):
    """A model whose answers are bridge steps: recorded once, served on resume."""

    def __init__(self, driver: _Driver, inner: Any) -> None:
        self.driver, self.inner = driver, inner

    def _model(self) -> Model:
        """The model that answers: the agent's, or the one the run's provider names."""
        if not isinstance(self.inner, Model):
            self.inner = self.driver.config.model_provider.get_model(self.inner)
        return cast(Model, self.inner)

    async def get_response(self, system_instructions: str | None, input: Any,
                           model_settings: Any, tools: list[Any], output_schema: Any,
                           handoffs: list[Any], tracing: Any, **kwargs: Any) -> ModelResponse:
        inner = self._model()

        async def ask() -> ModelResponse:
            return await inner.get_response(system_instructions, input, model_settings,
                                            tools, output_schema, handoffs, tracing, **kwargs)

        if _asked_by_a_child(self.driver.run.run_id):
            return await ask()
        asked = _fingerprint(system_instructions, input, tools, output_schema, handoffs,
                             kwargs, self.driver.run.journal.as_recorded)
        parts = _Parts(system_instructions, input, tools, output_schema, handoffs, kwargs,
                       self.driver.run.journal.as_recorded, inner)
        return await self._answer(asked, ask, tools, inner, parts, handoffs)

    async def _answer(self, asked: str, ask: Callable[[], Awaitable[ModelResponse]],
                      tools: list[Any], inner: Model, parts: _Parts,
                      handoffs: list[Any]) -> ModelResponse:
        """The answer to ``asked``: recorded, or asked of the model and recorded."""
        tool_names = {t.name for t in tools if isinstance(t, FunctionTool)}
        given = {str(getattr(t, "name", "")) for t in tools} | {
            str(getattr(h, "tool_name", "")) for h in handoffs}
        response: ModelResponse = await self.driver.run.astep(
            f"{MODEL_STEP}.{self.driver.segment}", asked, ask, encode=_encode_response,
            decode=_decode_response, turn=lambda value: _turn(value, tool_names, inner),
            parts=parts, tools=given)
        self.driver.expect_calls(response)
        return response

    async def stream_response(self, system_instructions: str | None, input: Any,
                              model_settings: Any, tools: list[Any], output_schema: Any,
                              handoffs: list[Any], tracing: Any,
                              **kwargs: Any) -> AsyncIterator[Any]:
        """The model's stream, its events passed on as they come, but for the last
        (``response.completed``): that one waits until the answer is recorded, so the SDK
        acts on no answer a crash could lose. A recorded answer is that one event."""
        inner = self._model()
        if _asked_by_a_child(self.driver.run.run_id):
            async for event in inner.stream_response(
                    system_instructions, input, model_settings, tools, output_schema,
                    handoffs, tracing, **kwargs):
                yield event
            return
        asked = _fingerprint(system_instructions, input, tools, output_schema, handoffs,
                             kwargs, self.driver.run.journal.as_recorded)
        parts = _Parts(system_instructions, input, tools, output_schema, handoffs, kwargs,
                       self.driver.run.journal.as_recorded, inner)
        completed: list[ResponseCompletedEvent] = []

        async def answer(put: Callable[[Any], None]) -> ModelResponse:
            async def ask() -> ModelResponse:
                finished = []
                async for event in inner.stream_response(
                        system_instructions, input, model_settings, tools, output_schema,
                        handoffs, tracing, **kwargs):
                    if isinstance(event, ResponseCompletedEvent):
                        completed.append(event)
                    elif not completed:
                        put(event)
                        if isinstance(event, ResponseOutputItemDoneEvent):
                            finished.append(event.item)
                if not completed:
                    raise ModelBehaviorError(
                        "the model's stream ended without response.completed")
                final = completed[0].response
                if not final.output:  # some backends give the items only as each is done
                    final.output = finished
                return _model_response(final)

            return await self._answer(asked, ask, tools, inner, parts, handoffs)

        answered: list[ModelResponse] = []
        async for event in _relayed(answer, answered.append):
            yield event
        yield completed[0] if completed else _completed_event(answered[0], inner)

    async def close(self) -> None:
        if isinstance(self.inner, Model):
            await self.inner.close()


def _starting_agent(run: object) -> str:
    """The name of the agent an SDK run started with (the first its mark records)."""
    resolutions = getattr(run, "resolutions", None) or {}
    first = next(iter(resolutions.values()), None)
    return str(getattr(getattr(first, "agent", None), "name", None) or "unnamed")


def _asked_by_a_child(run_id: str) -> bool:
    """Whether the model is asked inside the body of a call of run ``run_id``: by an
    agent that call runs (an agent used as a tool is given the run's config, and with it
    the run config's model). Its turns are not the run's: recorded among the run's, a
    replay that does not run that agent again would meet them where the run's next turn
    is. They are not journaled yet (a sub-agent as a run of its own is issue 45). (Inside
    a call of another run, this run is the one nested: its turns are its own.)"""
    call = _CURRENT.get()  # as set: asked by another run, current_call() would refuse it
    return call is not None and call.run_id == run_id


# --- the session, as the run saw it ------------------------------------------------------------


class _ReplayedSession:
    """The caller's session, read and written through bridge steps: a resumed run is
    given the history the run was given (not the one its first attempt grew), and
    does not add again what it added. (A crash between a session's append and its step
    being recorded repeats that one batch in the session: memory, never an effect.)"""

    def __init__(self, driver: _Driver, inner: Any) -> None:
        self._driver, self._inner = driver, inner
        self.session_id = inner.session_id
        self.session_settings = getattr(inner, "session_settings", None)

    async def get_items(self, limit: int | None = None, *,
                        wrapper: Any = None) -> list[Any]:
        async def read() -> list[Any]:
            items = await _call(self._inner.get_items, wrapper, limit=limit)
            return cast(list[Any], _plain(items))

        return cast(list[Any], await self._driver.run.astep(
            f"openai_agents.session.get.{self._driver.segment}", f"limit {limit}", read))

    async def add_items(self, items: list[Any], *, wrapper: Any = None) -> None:
        async def add() -> None:
            await _call(self._inner.add_items, wrapper, items)

        await self._driver.run.astep(f"openai_agents.session.add.{self._driver.segment}",
                                     _digest(_plain(items)), add)

    async def pop_item(self, *, wrapper: Any = None) -> Any:
        return await _call(self._inner.pop_item, wrapper)

    async def clear_session(self, *, wrapper: Any = None) -> None:
        await _call(self._inner.clear_session, wrapper)


async def _call(method: Any, wrapper: Any, *args: Any, **kwargs: Any) -> Any:
    """A session method, given the run's context only if it takes one (as the SDK does)."""
    if wrapper is not None and "wrapper" in inspect.signature(method).parameters:
        kwargs["wrapper"] = wrapper
    result = method(*args, **kwargs)
    return await result if inspect.isawaitable(result) else result


def _digest(value: Any) -> str:
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), default=_dump)
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]


# --- parallel calls in order ----------------------------------------------------------------


class _Turns:
    """The starts of a turn's calls, appended in the model's order (the SDK runs them
    together): each call waits for the one before it to start, or to be let go."""

    def __init__(self) -> None:
        self._order: list[str] = []
        self._passed: dict[str, asyncio.Event] = {}

    def expect(self, call_ids: list[str]) -> None:
        self._order = call_ids
        self._passed = {call_id: asyncio.Event() for call_id in call_ids}

    async def wait(self, call_id: str) -> None:
        if call_id not in self._passed:
            return  # not of the last answer (a resumed interruption): no order to keep
        at = self._order.index(call_id)
        if at:  # a call the SDK never runs (a tool guardrail refused it) must not hang it
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._passed[self._order[at - 1]].wait(), ORDER_WAIT)

    def release(self, call_id: str) -> None:
        if (passed := self._passed.get(call_id)) is not None:
            passed.set()


async def _relayed(work: Callable[[Callable[[Any], None]], Awaitable[T]],
                   ended: Callable[[T], None]) -> AsyncIterator[Any]:
    """What ``work`` puts, passed on as it comes, ``work`` running as a task of its own;
    its result told to ``ended``, its error raised. Left early, the task is cancelled
    (a streamed run, or a model's answer, nobody listens to any more)."""
    items: asyncio.Queue[Any] = asyncio.Queue()
    end = object()

    async def run() -> None:
        try:
            ended(await work(items.put_nowait))
        finally:
            items.put_nowait(end)

    task = asyncio.ensure_future(run())
    try:
        while (item := await items.get()) is not end:
            yield item
        await task  # raises what work raised
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


# --- encodings -------------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    """The input as JSON data (the SDK's input items may be pydantic models)."""
    return json.loads(json.dumps(value, default=_dump))


def _dump(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json", exclude_unset=True)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return repr(value)


def _fingerprint(instructions: str | None, input: Any, tools: list[Any], output_schema: Any,
                 handoffs: list[Any], extra: Mapping[str, Any],
                 recorded: Callable[[Any], Any]) -> str:
    """What the model was asked, hashed: the same question on resume serves its answer.
    The input as ``recorded`` (the run's redaction) has it: the model's earlier turns are
    replayed as recorded, redacted, so a secret in one must not change the question."""
    asked = {
        "instructions": instructions,
        "input": recorded(_plain(input)),
        "tools": sorted(str(getattr(t, "name", type(t).__name__)) for t in tools),
        "handoffs": sorted(str(getattr(h, "tool_name", h)) for h in handoffs),
        "output": None if output_schema is None else output_schema.name(),
        "previous_response_id": extra.get("previous_response_id"),
        "conversation_id": extra.get("conversation_id"),
    }
    canonical = json.dumps(asked, sort_keys=True, separators=(",", ":"), default=_dump)
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]


class _Parts:
    """A model request's parts, each a digest (instructions, history, tools, handoffs,
    output, model), made when called: only for a request asked of the model or one that
    differs from the recorded one (never on a plain replay)."""

    def __init__(self, instructions: str | None, input: Any, tools: list[Any],
                 output_schema: Any, handoffs: list[Any], extra: Mapping[str, Any],
                 recorded: Callable[[Any], Any], model: Any) -> None:
        self.given = (instructions, input, tools, output_schema, handoffs, extra, recorded,
                      model)

    def __call__(self) -> dict[str, str]:
        instructions, input, tools, output_schema, handoffs, extra, recorded, model = (
            self.given)
        return {
            "instructions": _digest(instructions)[:16],
            "history": _digest([recorded(_plain(input)), extra.get("previous_response_id"),
                                extra.get("conversation_id")])[:16],
            "tools": _digest(sorted((_tool_shape(t) for t in tools),
                                    key=lambda t: str(t["name"])))[:16],
            "handoffs": _digest(sorted(str(getattr(h, "tool_name", h))
                                       for h in handoffs))[:16],
            "output": _digest(None if output_schema is None else output_schema.name())[:16],
            "model": _digest(_model_name(model))[:16],
        }


def _tool_shape(tool: Any) -> dict[str, Any]:
    """What a tool is to the model (and to keys): its name, description, parameters."""
    return {"name": str(getattr(tool, "name", type(tool).__name__)),
            "description": getattr(tool, "description", None),
            "parameters": getattr(tool, "params_json_schema", None)}


def _model_name(model: Any) -> str | None:
    if model is None or isinstance(model, str):
        return model
    return str(getattr(model, "model", None) or type(model).__qualname__)


def agent_shape(agent: Agent[Any],
                policies: Mapping[str, ToolPolicy | Effect | str] | None = None, *,
                version: str | None = None, strict: bool = False) -> AgentShape:
    """What a deploy may change about an SDK agent (``agentjournal check`` and the run's
    recorded version): its instructions (a function by its name), its function tools
    (name, description, parameters; effect and identity as ``policies`` give them, else
    an MCP tool's annotations, else irreversible), its handoffs, output type and model.
    No argument check: a recorded call is settled by its key (its lookup finds it, or a
    person), whatever the tool's arguments are now, as a resume does."""
    given = {name: p if isinstance(p, ToolPolicy) else ToolPolicy(effect=p)
             for name, p in (policies or {}).items()}
    tools = []
    for tool in agent.tools:
        shape = _tool_shape(tool)
        name = str(shape["name"])
        policy = given.get(name) or ToolPolicy(
            effect=mcp_effect(getattr(tool, "mcp_annotations", None)))
        tools.append(ToolShape(name=name, effect=str(Effect(policy.effect)),
                               identity=tuple(policy.identity) or None,
                               schema_digest=digest(shape)))
    for handoff in agent.handoffs:  # a handoff is a tool to the model, with no effect
        name = str(getattr(handoff, "tool_name", None)
                   or f"transfer_to_{getattr(handoff, 'name', '')}")
        tools.append(ToolShape(name=name, effect=str(Effect.READ_ONLY), identity=None,
                               schema_digest=digest(name)))
    model = agent.model
    return make_shape(instructions=_instructions_text(agent), tools=tools,
                      model=model if model is None or isinstance(model, str)
                      else model_identity(model), version=version, strict=strict)


def _instructions_text(agent: Agent[Any]) -> str | None:
    """The agent's instructions as recorded with a run (a function by its name), and its
    output type: what it tells the model besides its tools."""
    instructions = agent.instructions
    if callable(instructions):
        instructions = f"<{getattr(instructions, '__qualname__', type(instructions).__name__)}>"
    output = getattr(agent.output_type, "__qualname__", None) or repr(agent.output_type)
    return None if instructions is None and agent.output_type is None else (
        f"{instructions or ''}\n\noutput: {output}")


def agent_version(agent: Agent[Any],
                  policies: Mapping[str, ToolPolicy | Effect | str] | None = None) -> str:
    """The version a run of ``agent`` records unless given (``version=``): derived from
    its shape (:func:`agent_shape`). The same code gives the same version."""
    return agent_shape(agent, policies).version


def _describe(obj: object) -> AgentShape | None:
    """deploys.DESCRIBERS: an SDK agent, or a worker's JournalAgent."""
    if isinstance(obj, JournalAgent):
        return agent_shape(obj.agent, obj.policies, version=obj.version, strict=obj.strict)
    if isinstance(obj, Agent):
        return agent_shape(obj)
    return None


DESCRIBERS.append(_describe)


def _encode_response(response: ModelResponse) -> dict[str, Any]:
    return {"output": [_dump(item) if hasattr(item, "model_dump") else item
                       for item in response.output],
            "usage": serialize_usage(response.usage),
            "response_id": response.response_id, "request_id": response.request_id}


def _decode_response(value: Mapping[str, Any]) -> ModelResponse:
    return ModelResponse(output=[_OUTPUT_ITEM.validate_python(i) for i in value["output"]],
                         usage=deserialize_usage(value.get("usage") or {}),
                         response_id=value.get("response_id"),
                         request_id=value.get("request_id"))


def _model_response(response: Response) -> ModelResponse:
    """A streamed answer's final ``Response`` as the SDK makes it a ``ModelResponse``."""
    u = response.usage
    usage = Usage() if u is None else Usage(
        requests=1, input_tokens=u.input_tokens, output_tokens=u.output_tokens,
        total_tokens=u.total_tokens, input_tokens_details=u.input_tokens_details,
        output_tokens_details=u.output_tokens_details)
    return ModelResponse(output=list(response.output), usage=usage, response_id=response.id)


def _completed_event(answer: ModelResponse, model: Any) -> ResponseCompletedEvent:
    """A recorded answer as the one event of its replayed stream."""
    u = answer.usage
    usage = None if not u.requests else ResponseUsage(
        input_tokens=u.input_tokens, output_tokens=u.output_tokens,
        total_tokens=u.total_tokens, input_tokens_details=u.input_tokens_details,
        output_tokens_details=u.output_tokens_details)
    response = Response(id=answer.response_id or "", created_at=0.0, object="response",
                        model=str(getattr(model, "model", "") or ""),
                        output=list(answer.output), parallel_tool_calls=True,
                        tool_choice="auto", tools=[], usage=usage)
    return ResponseCompletedEvent(type="response.completed", response=response,
                                  sequence_number=0)


def _turn(value: Mapping[str, Any], tool_names: set[str], model: Any) -> Turn:
    """A model answer as people read it: its text, the function calls, the tokens."""
    text, calls = [], []
    for item in value["output"]:
        if item.get("type") == "message":
            text += [c.get("text", "") for c in item.get("content", ())
                     if c.get("type") == "output_text"]
        elif item.get("type") == "function_call" and item.get("name") in tool_names:
            calls.append({"id": item.get("call_id"), "name": item.get("name"),
                          "args": _arguments(item.get("arguments") or "{}") or {}})
    usage = value.get("usage") or {}
    cached = _detail(usage.get("input_tokens_details"), "cached_tokens")
    reasoning = _detail(usage.get("output_tokens_details"), "reasoning_tokens")
    return Turn(text="".join(text), tool_calls=calls, provider="openai-agents",
                model=str(getattr(model, "model", None) or type(model).__name__),
                usage={"input_tokens": usage.get("input_tokens", 0),
                       "output_tokens": usage.get("output_tokens", 0),
                       "cached_input_tokens": cached or 0, "reasoning_tokens": reasoning or 0})


def _detail(details: Any, name: str) -> int:
    """A token count from the SDK's serialised usage details (a dict, or a list of them)."""
    rows = details if isinstance(details, list) else [details or {}]
    return sum(int(row.get(name) or 0) for row in rows if isinstance(row, dict))


def _arguments(text: str) -> dict[str, Any] | None:
    try:
        args = json.loads(text or "{}")
    except json.JSONDecodeError:
        return None
    return args if isinstance(args, dict) else None


def _encode_result(value: Any) -> Any:
    return to_json(value)


def _call_of(item: ToolApprovalItem) -> tuple[str, str, dict[str, Any]] | None:
    """(call id, tool, arguments) of an interruption for a function tool's call."""
    raw = item.raw_item
    get = raw.get if isinstance(raw, dict) else lambda name, default=None: getattr(
        raw, name, default)
    if get("type") != "function_call":
        return None
    args = _arguments(get("arguments") or "{}")
    return (str(get("call_id")), str(item.tool_name or get("name")), args or {})

