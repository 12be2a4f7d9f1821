"""Durable Pydantic AI agents on agentjournal, with no server (``agentjournal[pydantic-ai]``).

    from agentjournal.integrations.pydantic_ai import JournalDurability

    agent = Agent(model, name="shop", tools=[...],
                  capabilities=[JournalDurability("sqlite:///runs.db", run_id="order-7")])
    result = agent.run_sync("Refund order 7")   # start, or resume after a crash: the same call

``JournalDurability`` is a ``BaseDurabilityCapability`` whose backend is a
``JournalCallableOperationBackend`` over :mod:`agentjournal.bridge`. A run of the agent
is the agentjournal run ``run_id``: its lease is taken (a second process gets
``LeaseHeldError``), its input recorded on the first run, and then

- each **model request** is a step: recorded once (a ``model_turn``, shown like a native
  one), served from the log on a resume (the model is not asked again). A request that
  differs from the recorded one at the same place (a deploy edited the instructions,
  added a tool, switched the model) is served the recorded answer all the same, and a
  ``request_changed`` fact names the parts that changed (instructions, tools, model,
  settings, output, history); the next request is asked with the new code.
  ``JournalDurability(strict=True)`` refuses instead (``NondeterminismError``);
- a call the log holds open (uncertain after a crash, or waiting for an approval) that
  the new code makes under another tool, identity (key) or effect class, or whose tool
  is gone, pauses the run for a person with a reason naming the change (never made
  again under a new key);
- the agent's version (``version=``, else a digest of its instructions, tools and
  model: :func:`agent_version`) is recorded as the run starts and at each resume;
- each **tool call** (function, MCP and dynamic toolsets) goes through agentjournal's
  call protocol: ``tool_call_started`` is durable before the tool runs, the completion
  after; a call already answered is answered from the log; the same identity with other
  arguments is refused; a call left uncertain by a crash is settled by its lookup, made
  again with the same key (read-only, idempotent), or handed to a person: the run ends
  the Pydantic AI way, with ``DeferredToolRequests``, and a person's decision
  (``agentjournal resolve``, or the caller's ``DeferredToolResults``) is recorded;
- a tool with ``requires_approval=True`` waits for an approval bound to its exact
  arguments (``agentjournal decide``, or the caller's ``DeferredToolResults``);
- other units (tool discovery, capability operations, the event stream handler) are
  replayed by name and position.

Effects are declared per tool: ``metadata={"agentjournal": {"effect": "idempotent",
"identity": ["order_id"], "lookup": find_refund}}``, or an ``effects=`` map on the
capability (which wins), or, for an MCP tool, its annotations (``readOnlyHint``:
read_only, ``idempotentHint``: idempotent); anything else is ``irreversible``. A tool
reads its idempotency key and lease epoch with :func:`agentjournal.current_call`.

A tool that raises ``ModelRetry``, ``ToolFailed``, ``ApprovalRequired`` or
``CallDeferred`` declares that its effect did not happen: that answer is recorded and
replayed, and the call may be asked for again. Any other exception from a tool with an
effect leaves the call uncertain.

A tool that runs another agent with a ``JournalDurability`` of its own opens a child
run, linked both ways (``agentjournal.child_run`` steps in the parent's log, ``parent``
in the child's run_started). When the parent's call is settled without running it (its
lookup, a person, the caller, the scope), the child's open calls are settled with the
parent's outcome and the child is cancelled when the parent's run ends: nothing is left
open that no one would resume. A child *without* one is refused the call's key: its tools
are not journaled, so each would send the outer call's key (a receiver that honours keys
would apply only the first of them); ``current_call()`` read there raises
``JournalError``, before anything is sent, and the parent's run raises it to its caller.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, ClassVar, cast

from agentjournal.errors import MissingExtraError

try:
    import pydantic_ai  # noqa: F401
except ImportError as exc:  # pragma: no cover - the extra is installed in tests
    raise MissingExtraError("pydantic-ai", "pydantic-ai-slim") from exc

from opentelemetry import context as otel_context
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind
from pydantic import TypeAdapter
from pydantic_ai import Agent, DeferredToolRequests
from pydantic_ai._run_context import get_current_run_context
from pydantic_ai.durable_exec import (
    JSON_CODEC,
    BaseDurabilityCapability,
    DurabilityEngineSpec,
    DurableOperationId,
    JournalCallableOperationBackend,
    ModelRequestId,
    RoleBasedOperationConfig,
    ToolsetCallToolId,
    ToolsetValidateToolArgumentsId,
    record_durable_unit,
    replay_scope,
)
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    ToolReturnPart,
)
from pydantic_ai.models import Model, ModelRequestParameters
from pydantic_ai.tools import AgentDepsT, RunContext, ToolDefinition
from pydantic_core import to_jsonable_python

from agentjournal import (
    BridgedRun,
    CallRefused,
    Effect,
    JournalError,
    NeedsApproval,
    NeedsPerson,
    PendingCall,
    ResultNotKeptError,
    Store,
    ToolContext,
    ToolFailed,
    Turn,
    canonical_args,
    idempotency_key,
    open_run,
    open_store,
)
from agentjournal.agent import require_run_id
from agentjournal.bridge import _CURRENT, reading_checked
from agentjournal.deploys import DESCRIBERS, AgentShape, ToolShape, digest, model_identity
from agentjournal.deploys import agent_shape as make_shape
from agentjournal.errors import LeaseHeldError, RunNotFoundError
from agentjournal.events import EventType
from agentjournal.fleet import Stopped
from agentjournal.journal import open_journal
from agentjournal.results import ResultNotEncodable, holds_non_finite
from agentjournal.snapshots import load_state

__all__ = ["DurableAgent", "JournalDurability", "ToolEffect", "agent_shape", "agent_version",
           "effect_of_annotations"]

#: Where a tool's metadata holds its declaration, and the capability's engine name.
METADATA_KEY = "agentjournal"
#: The payload kinds of a tool that answered; every other kind says it did not act.
_ANSWERED = frozenset({"tool_return", "tool_content_result"})
#: How a control-flow answer (ModelRetry, ToolFailed, ...) is kept in a failure's message.
_FLOW = "pydantic_ai:"
Reconciler = Callable[[PendingCall], Any]
#: The digests of a run's messages, by message object (see request_fingerprint).
#: The same without their instructions, for a request's ``history`` part (request_parts).
_HISTORY_DIGESTS: ContextVar[dict[int, tuple[Any, str]] | None] = ContextVar(
    "agentjournal.pydantic_ai.history_digests", default=None)
_DIGESTS: ContextVar[dict[int, tuple[Any, str]] | None] = ContextVar(
    "agentjournal.pydantic_ai.digests", default=None)
#: The trace context of the agent's run (its ``invoke_agent`` span): where a span of a
#: call settled here goes, beside the spans of the calls made here.
_RUN_TRACE: ContextVar[Context | None] = ContextVar(
    "agentjournal.pydantic_ai.run_trace", default=None)
#: The run whose agent is running in this context: a run opened inside one of its calls
#: (a tool that runs another agent) is its child.
_ENCLOSING: ContextVar[BridgedRun | None] = ContextVar(
    "agentjournal.pydantic_ai.enclosing", default=None)
#: Message keys Pydantic AI makes anew on every run: not part of what a request asks.
_VOLATILE = ("timestamp", "run_id", "conversation_id")


@dataclass(frozen=True, kw_only=True)
class ToolEffect:
    """What a tool does to the world: its effect class, the argument fields that name
    the action (default: all of them), and a reconcile lookup for an uncertain call
    (``lookup(pending) -> Found | Absent | Conflict | Unknown``, as ``@tool(reconcile=)``)."""

    effect: Effect | str = Effect.IRREVERSIBLE
    identity: Sequence[str] = ()
    lookup: Reconciler | None = None
    key_retention: float | None = None


def effect_of_annotations(annotations: Mapping[str, Any] | None) -> Effect:
    """An MCP tool's effect class from its annotations: ``readOnlyHint`` is read-only,
    ``idempotentHint`` idempotent, anything else (or none) irreversible."""
    hints = annotations or {}
    if hints.get("readOnlyHint"):
        return Effect.READ_ONLY
    if hints.get("idempotentHint"):
        return Effect.IDEMPOTENT
    return Effect.IRREVERSIBLE


def _not_journalable(error: Exception) -> BaseException:
    # The same value fails the same way every time: retrying cannot help. A tool's value:
    # the tool ran, so the bridge completes the call as "result not kept" (results.py).
    return ResultNotEncodable(f"its result has no JSON form ({error})")


class _FaithfulJson:
    """Pydantic AI's JSON codec, under agentjournal's result rule (results.py): a tool's
    value holding a NaN or an infinity, which Pydantic writes as null (another value than
    the tool's), is refused like a value with no JSON form, as the loop refuses it. A
    model's response is recorded as Pydantic writes it (a logprob may be -inf)."""

    def __init__(self) -> None:
        self._adapters: dict[Any, TypeAdapter[Any]] = {}

    def dump(self, tp: Any, value: Any) -> Any:
        plain = JSON_CODEC.dump(tp, value)
        if tp is ModelResponse:
            return plain
        adapter = self._adapters.get(tp)
        if adapter is None:
            adapter = self._adapters[tp] = TypeAdapter(tp)
        if holds_non_finite(adapter.dump_python(value, mode="python")):
            raise TypeError("it holds a NaN or an infinity, which JSON cannot hold")
        return plain

    def load(self, tp: Any, payload: Any) -> Any:
        return JSON_CODEC.load(tp, payload)


_NO_CONFIG: RoleBasedOperationConfig[None] = RoleBasedOperationConfig(
    model=None, event=None, capability=None, tool=None)


class JournalDurability(BaseDurabilityCapability[AgentDepsT]):
    """Durable runs of an unchanged Pydantic AI agent on an agentjournal store.

    ``store``: a :class:`agentjournal.Store` or a store URL (opened for each run and
    closed after it). ``run_id``: the run to start or resume (required, as for
    ``Agent.run`` of agentjournal's own agents). ``effects``: per tool name, an
    :class:`agentjournal.Effect` (or its name) or a :class:`ToolEffect`; it wins over the
    tool's metadata and an MCP tool's annotations. ``scope``: the idempotency scope
    (default: the run). ``owner``, ``ttl``: the lease's holder and time to live.
    ``keep_lease``: leave the lease held when the run returns (a worker hands the run
    back itself). ``models``, ``event_stream_handler``, ``name``: as for every
    Pydantic AI durability capability (the agent's ``name``, or ``name``, names its
    steps). ``strict``: a model request that differs from the one recorded at its place
    raises ``NondeterminismError`` (default: the recorded answer is served and the
    change recorded). ``version``: the agent's version recorded with the run (default:
    :func:`agent_version`, a digest of its instructions, tools and model).
    """

    engine_spec: ClassVar[DurabilityEngineSpec] = DurabilityEngineSpec(
        engine_name="agentjournal", durable_unit_noun="step", durable_container_noun="run",
        codec=_FaithfulJson(), serialization_failure=_not_journalable,
        tool_config_key=METADATA_KEY,
        wrapped_toolset_kinds=frozenset({"function", "mcp", "dynamic"}),
        toolset_lifecycles={"function": "enter-always", "mcp": "enter-in-durable-unit",
                            "dynamic": "enter-never"})

    def __init__(self, store: Store | str | None = None, run_id: str | None = None, *,
                 effects: Mapping[str, Effect | str | ToolEffect] | None = None,
                 scope: str | None = None, owner: str | None = None, ttl: float = 30.0,
                 keep_lease: bool = False, models: Mapping[str, Model] | None = None,
                 event_stream_handler: Any = None, name: str | None = None,
                 strict: bool = False, version: str | None = None) -> None:
        super().__init__(models=models, event_stream_handler=event_stream_handler, name=name)
        self.store, self.run_id, self.scope = store, run_id, scope
        self.strict, self.version = strict, version
        self.owner, self.ttl, self.keep_lease = owner, ttl, keep_lease
        self.effects = {tool: given if isinstance(given, ToolEffect) else ToolEffect(effect=given)
                        for tool, given in (effects or {}).items()}
        self._active: ContextVar[BridgedRun | None] = ContextVar(
            f"agentjournal.pydantic_ai.{run_id}", default=None)
        # A worker's run: the store, run id and lease it gives (see bound()).
        self._bound: ContextVar[_Binding | None] = ContextVar(
            f"agentjournal.pydantic_ai.bound.{run_id}", default=None)
        #: Tools that wait for a person's approval (``requires_approval=True``).
        self._approval_tools: set[str] = set()

        # The run last driven; shared with the copies Pydantic AI binds to each agent.
        self._last: list[BridgedRun] = []

    @property
    def last_run(self) -> BridgedRun | None:
        """The run this capability last drove (closed): its ``state``, ``status``."""
        return self._last[-1] if self._last else None

    @property
    def in_durable_context(self) -> bool:
        return self._active.get() is not None

    def get_durable_operation_backend(self) -> _JournalBackend:
        return _JournalBackend(self)

    # --- the run ---------------------------------------------------------------------

    @contextmanager
    def bound(self, *, store: Store, run_id: str, owner: str, ttl: float, agent_ref: str,
              keep_lease: bool = True) -> Iterator[_Binding]:
        """Runs of the agent in this context use ``store`` and ``run_id``, hold the lease
        as ``owner`` and keep it: how a worker drives the agent (:class:`DurableAgent`).
        The binding's ``run`` is the run once it was opened."""
        binding = _Binding(store=store, run_id=run_id, owner=owner, ttl=ttl,
                           agent_ref=agent_ref, keep_lease=keep_lease)
        token = self._bound.set(binding)
        try:
            yield binding
        finally:
            self._bound.reset(token)

    async def wrap_run(self, ctx: RunContext[AgentDepsT], *, handler: Any) -> Any:
        if self._active.get() is not None:  # a nested run of the same agent: the same run
            return await super().wrap_run(ctx, handler=handler)
        binding = self._bound.get()
        given = binding.store if binding is not None else self.store
        if given is None:
            raise ValueError("JournalDurability has no store: give one (a Store or a URL)")
        store = open_store(given) if isinstance(given, str) else given
        try:
            run_id = require_run_id(binding.run_id if binding is not None else self.run_id)
            with open_run(store, run_id, parent=_as_child(run_id),
                          agent=binding.agent_ref if binding else f"pydantic_ai:{self.name}",
                          input=_plain(ctx.prompt) if ctx.prompt is not None else None,
                          scope=self.scope, owner=binding.owner if binding else self.owner,
                          ttl=binding.ttl if binding else self.ttl,
                          keep_lease=binding.keep_lease if binding else self.keep_lease,
                          strict=self.strict,
                          agent_version=agent_version(ctx.agent, self),
                          instructions=_instructions_text(ctx.agent)) as run:
                self._last[:] = [run]
                if binding is not None:
                    binding.run = run
                token, digests = self._active.set(run), _DIGESTS.set({})
                history_digests = _HISTORY_DIGESTS.set({})
                trace_token = _RUN_TRACE.set(otel_context.get_current())
                enclosing = _ENCLOSING.set(run)
                try:
                    with replay_scope():
                        result = await super().wrap_run(ctx, handler=handler)
                finally:
                    self._active.reset(token)
                    _DIGESTS.reset(digests)
                    _HISTORY_DIGESTS.reset(history_digests)
                    _RUN_TRACE.reset(trace_token)
                    _ENCLOSING.reset(enclosing)
                # Before the outcome: a crash in between leaves the run to resume, and
                # the next end closes them.
                _close_settled_children(run)
                self._record_outcome(run, result.output)
                return result
        finally:
            if store is not given:
                store.close()

    def _record_outcome(self, run: BridgedRun, output: Any) -> None:
        if not isinstance(output, DeferredToolRequests):
            run.finish(_plain(output))
            return
        # An approval the journal holds was recorded when its call asked (NeedsApproval);
        # one a tool asks for itself (it raised ApprovalRequired) is the tool's to judge.
        names = ", ".join(f"{c.tool_name} ({c.tool_call_id})"
                          for c in [*output.calls, *output.approvals])
        run.pause(f"deferred tool calls wait for a person: {names}")

    async def prepare_tools(self, ctx: RunContext[AgentDepsT],
                            tool_defs: list[ToolDefinition]) -> list[ToolDefinition]:
        """A tool that requires approval is called, and the journal holds it until an
        approval of its exact arguments is recorded (a person's, or the caller's): the
        approval survives the caller, and a resume that replays the call finds it."""
        if not self.in_durable_context:
            return tool_defs
        prepared = []
        for tool_def in tool_defs:
            if tool_def.kind == "unapproved":
                self._approval_tools.add(tool_def.name)
                tool_def = _with_kind(tool_def, "function")
            prepared.append(tool_def)
        return prepared

    # --- what a tool declares -----------------------------------------------------------

    def _declared(self, tool_name: str, tool_def: ToolDefinition | None) -> ToolEffect:
        """The tool's effect: the ``effects=`` map, its metadata, its MCP annotations."""
        if (given := self.effects.get(tool_name)) is not None:
            return given
        metadata = (tool_def.metadata or {}) if tool_def is not None else {}
        own = metadata.get(METADATA_KEY)
        if isinstance(own, Mapping):
            return ToolEffect(effect=own.get("effect", Effect.IRREVERSIBLE),
                              identity=tuple(own.get("identity", ())),
                              lookup=own.get("lookup"), key_retention=own.get("key_retention"))
        if isinstance(own, str):
            return ToolEffect(effect=own)
        annotations = metadata.get("annotations")
        return ToolEffect(effect=effect_of_annotations(
            annotations if isinstance(annotations, Mapping) else None))


@dataclass(kw_only=True)
class _Binding:
    store: Store
    run_id: str
    owner: str
    ttl: float
    agent_ref: str
    keep_lease: bool
    run: BridgedRun | None = None


class DurableAgent:
    """A Pydantic AI agent that ``agentjournal worker`` can drive: a fleet Runnable
    (agentjournal.fleet.Runnable). Name a trusted factory of it in the run's agent ref:

        durability = JournalDurability()          # the worker gives store and run id
        shop = Agent(model, name="shop", capabilities=[durability], tools=[...])

        def shop_runnable() -> DurableAgent:       # agentjournal submit myapp:shop_runnable
            return DurableAgent(shop, durability)

    A worker's run holds the lease the worker claimed and hands it back when the agent's
    run ends (finished, or waiting for a person with DeferredToolRequests). A Pydantic
    AI run cannot stop mid-way, so a draining worker lets it finish first.
    """

    def __init__(self, agent: Any, durability: JournalDurability[Any]) -> None:
        self.agent, self.durability = agent, durability

    def run_claimed(self, store: Store, run_id: str, task: str | None, *, agent_ref: str,
                    owner: str, ttl: float, stop: threading.Event) -> Stopped:
        """Start or resume ``run_id`` with ``task`` as the prompt (see Runnable)."""
        with self.durability.bound(store=store, run_id=run_id, owner=owner, ttl=ttl,
                                   agent_ref=agent_ref) as binding:
            try:
                self.agent.run_sync(task)
            except JournalError:
                raise  # the lease was lost, the store is away: the worker knows what to do
            except Exception:
                if binding.run is None:
                    raise
                # Recorded as the run's pause (its reason the error): handed back waiting.
        run = binding.run
        assert run is not None
        return Stopped(run.status, run.state.last_seq, run.journal.lease.epoch)


class _JournalBackend(JournalCallableOperationBackend[None]):
    """Runs each durable operation of the agent through the run's bridge."""

    def __init__(self, durability: JournalDurability[Any]) -> None:
        super().__init__(agent_name=durability.name,
                         default_model_id=durability.default_model_id, config=_NO_CONFIG)
        self._durability = durability

    async def execute(self, *, operation_id: DurableOperationId, name: str,
                      body: Callable[[], Awaitable[object]], cache_key: tuple[object, ...],
                      config: None) -> object:
        run = self._durability._active.get()
        if run is None:
            return await body()
        match operation_id:
            case ModelRequestId():
                return await self._model_request(run, name, body, cache_key)
            case ToolsetCallToolId():
                return await self._tool_call(run, body, cache_key)
            case ToolsetValidateToolArgumentsId():
                return await body()  # local and deterministic: nothing to record
            case _:
                # Discovery, compaction, capability operations, the event stream handler,
                # and the ids later releases add: replayed by name and position.
                return await run.astep(name, "", body, executed=_report)

    async def _model_request(self, run: BridgedRun, name: str,
                             body: Callable[[], Awaitable[object]],
                             cache_key: tuple[object, ...]) -> object:
        model_id, messages, settings, parameters, _ = cache_key
        history = cast(list[ModelMessage], messages)
        _record_callers_answers(run, history)
        fingerprint = request_fingerprint(
            cast("str | None", model_id), history, cast("Mapping[str, Any] | None", settings),
            cast(ModelRequestParameters, parameters), _DIGESTS.get(),
            recorded=run.journal.as_recorded)
        # The n-th request of a run follows its n-th response, replayed or continued.
        position = sum(isinstance(m, ModelResponse) for m in history)
        request = cast(ModelRequestParameters, parameters)
        tools = {t.name for t in (*request.function_tools, *request.output_tools)}

        # The model that answers: the request names it only when the capability's
        # ``models=`` does (a part only, never the fingerprint: recorded runs stay served).
        asking = get_current_run_context()
        model = model_id or (model_identity(asking.model) if asking is not None else None)

        def parts() -> dict[str, str]:
            return request_parts(cast("str | None", model), history,
                                 cast("Mapping[str, Any] | None", settings), request,
                                 _HISTORY_DIGESTS.get(), recorded=run.journal.as_recorded)

        return await run.astep(name, fingerprint, body, turn=turn_of, executed=_report,
                               position=position, parts=parts, tools=tools)

    async def _tool_call(self, run: BridgedRun, body: Callable[[], Awaitable[object]],
                         cache_key: tuple[object, ...]) -> object:
        tool_name, args, ctx, tool = cache_key[:4]
        tool_name, ctx = cast(str, tool_name), cast(RunContext[Any], ctx)
        tool_def = getattr(tool, "tool_def", tool)
        declared = self._durability._declared(
            tool_name, tool_def if isinstance(tool_def, ToolDefinition) else None)
        call_args = cast(dict[str, Any], _plain(args))
        call_id = ctx.tool_call_id or f"{tool_name}:{canonical_args(call_args).decode()}"
        approval = tool_name in self._durability._approval_tools
        if ctx.tool_call_approved and not approval:
            # A tool that asked for approval itself (ApprovalRequired, recorded as this
            # call's answer) is called again once approved: that is another call.
            call_id += "#approved"
        if approval and ctx.tool_call_approved:  # the caller's DeferredToolResults approved it
            approval_id = run.request_approval(tool_name, call_args, call_id=call_id,
                                               identity=declared.identity)
            run.decide_approval(approval_id, approved=True, by="caller",
                                reason="approved in DeferredToolResults")

        made: list[bool] = []  # the tool's body ran in this process
        told: list[bool] = []  # the bridge's word: made (True) or answered from the log
        refused: list[JournalError] = []  # the body's reads of current_call() refused

        async def make(_: ToolContext) -> object:
            made.append(True)
            with reading_checked(_read_in(ctx, run.run_id, call_id, refused)):
                payload = await body()
            if refused:  # caught in the body: still not a result (the child made no call
                raise refused[0]  # with a key of its own), so the call is not completed
            kind = payload.get("kind") if isinstance(payload, dict) else None
            if kind not in _ANSWERED:  # it did not act: recorded as a proven failure
                raise ToolFailed(_FLOW + json.dumps(payload, sort_keys=True))
            return payload

        key = idempotency_key(run.state.scope, tool_name, call_args,
                              tuple(declared.identity) or None)
        # A copy first (one step under the GIL): another task's call may be appending.
        uncertain = any(p.key == key for p in list(run.state.pending.values()))
        since, began = run.state.last_seq, time.time_ns()
        payload = await self._answer(run, tool_name, call_args, call_id, make, declared,
                                     approval, told)
        verdicts = _verdicts_since(run, key, since) if uncertain else []
        _report_call(run, call_id, made=bool(made), told=told, settled=bool(verdicts))
        for verdict in verdicts:
            _reconciled_span(ctx, verdict, call_id, Effect(declared.effect), began)
        if refused:  # the call is settled by the rules (the error is its tool's); the
            raise refused[0]  # caller is told what to change, not a deferred call
        return payload

    @staticmethod
    async def _answer(run: BridgedRun, tool_name: str, call_args: dict[str, Any],
                      call_id: str, make: Callable[[ToolContext], Awaitable[object]],
                      declared: ToolEffect, approval: bool, told: list[bool]) -> object:
        """The call made or answered by the call protocol, as Pydantic AI's payload."""
        try:
            return await run.acall(
                tool_name, call_args, call_id=call_id, body=make, effect=declared.effect,
                identity=declared.identity, lookup=declared.lookup,
                key_retention=declared.key_retention, approval=approval,
                encode=_tool_result, decode=_tool_payload, executed=told.append)
        except ToolFailed as failed:
            return _flow_payload(str(failed))
        except NeedsApproval as waiting:
            return {"kind": "approval_required", "metadata": {METADATA_KEY: {
                "approval_id": waiting.approval_id, "key": waiting.key}}}
        except NeedsPerson as needs:
            return {"kind": "call_deferred", "metadata": {METADATA_KEY: {
                "key": needs.key, "reason": needs.reason, "run_id": run.run_id}}}
        except (CallRefused, ResultNotKeptError) as refused:
            return {"kind": "tool_failed", "message": refused.reason}


def _report(executed: bool) -> None:
    record_durable_unit(executed=executed)


def _read_in(made_in: RunContext[Any], run_id: str, call_id: str,
             refused: list[JournalError]) -> Callable[[ToolContext], None]:
    """Who may read a call's context (``current_call()``): the agent run that made the
    call (its tool's body). A tool of another agent run that body started, one without
    a ``JournalDurability`` of its own, is refused (each refusal kept in ``refused``):
    agentjournal does not see its calls (Pydantic AI gives no hook into a run without
    one, and inside such a tool only its run is known, not its tool or arguments), so
    each would send this call's key, and a receiver that honours keys would apply only
    the first of them."""
    def check(call: ToolContext) -> None:
        reader = get_current_run_context()
        if reader is None or reader.run_id == made_in.run_id:
            return
        agent = getattr(reader.agent, "name", None) or "the agent"
        refused.append(JournalError(
            f"current_call() was read in a tool of agent {agent!r}, run inside tool call "
            f"{made_in.tool_name!r} ({call_id}) of run {run_id!r} without a "
            "JournalDurability of its own: each of its calls would send that one call's "
            "idempotency key, and a receiver that honours keys would apply only the first. "
            f"Give {agent!r} a JournalDurability of its own (same store, a run id of its "
            "own): it then runs as a child run of this call, each of its calls with a key "
            "of its own.", run_id=run_id))
        raise refused[-1]
    return check


# --- a run opened inside a call of another: a tool that runs an agent --------------------

#: The step of a parent's log that names a run one of its calls opened (its child).
CHILD_STEP = "agentjournal.child_run"
#: Statuses after which a run's loop never runs again.
_ENDED = ("finished", "cancelled", "compensating", "compensated")
#: How a parent's call was settled without running it, by its completion's source.
_SETTLED_BY = {"reconciliation": "by its lookup", "person": "by a person or its caller",
               "scope": "from another run of its scope"}
#: One link at a time per process: a link's place among its run's links is its count.
_LINKING = threading.Lock()


def _as_child(run_id: str) -> dict[str, str] | None:
    """The link to record in run ``run_id``'s run_started when one of another run's
    calls opens it (see _parent_of), recorded in that run's log first; else None."""
    parent = _parent_of(run_id)
    if parent is None:
        return None
    _link_child(*parent, run_id)
    return parent[1]


def _parent_of(run_id: str) -> tuple[BridgedRun, dict[str, str]] | None:
    """The run one of whose calls is opening run ``run_id`` here (its parent), and the
    link: the parent's run id, the call's key and call id. None outside such a call."""
    # The context as set, unchecked: the child's own run is opening, inside the call.
    enclosing, call = _ENCLOSING.get(), _CURRENT.get()
    if (enclosing is None or call is None or call.run_id != enclosing.run_id
            or enclosing.run_id == run_id):
        return None
    return enclosing, {"run_id": enclosing.run_id, "key": call.key, "call_id": call.call_id}


def _link_child(parent: BridgedRun, link: Mapping[str, str], child_id: str) -> None:
    """Record in the parent's log that its call opens run ``child_id``, before the child
    opens: whoever settles that call without the child finds it there."""
    child = {"run_id": child_id, "key": link["key"], "call_id": link["call_id"]}
    with _LINKING:
        known = parent.recorded(CHILD_STEP)
        if child not in known:
            parent.record([(EventType.STEP_RECORDED, {
                "name": CHILD_STEP, "n": len(known), "fingerprint": "", "value": child})])


def _close_settled_children(run: BridgedRun) -> None:
    """Close the children still open of each call the run settled without running it
    again (its lookup, a person, the caller, another run of the scope): that call will
    never run them, so no one would resume them."""
    for link in run.recorded(CHILD_STEP):
        done = run.state.completed.get(link["key"])
        if done is not None and done.source != "tool":
            _close_child(run.journal.store, run.run_id, link, done.source)


def _close_child(store: Store, parent_id: str, link: Mapping[str, str], how: str) -> None:
    """Settle the open calls of the child ``link`` names with its parent's outcome (they
    happened, as part of the call its parent settled) and cancel it, in one append; then
    its own children likewise. Nothing when it is closed already, is not this call's
    child (its run_started names another parent), or is held by a live process."""
    child_id = link["run_id"]
    try:
        state = load_state(store, child_id).state
    except RunNotFoundError:
        return
    if state.last_seq == 0 or (state.status in _ENDED and not state.pending):
        return
    log = list(store.read(child_id))
    named = log[0].payload.get("parent") or {}
    if (named.get("run_id"), named.get("key")) != (parent_id, link["key"]):
        return
    reason = (f"run {parent_id!r} settled its call that ran this run ({link['call_id']}, "
              f"key {link['key'][:12]}) {_SETTLED_BY.get(how, f'by {how}')}, without "
              "it: its open calls are taken as made, and it is not resumed")
    try:
        journal = open_journal(store, child_id, owner=f"parent:{parent_id}", must_exist=True)
    except LeaseHeldError:
        return  # a live process drives it: not left to no one
    with journal as j:
        facts = [fact for p in j.state.pending.values()
                 for fact in _settled_by_parent(p, dict(named), reason)]
        if j.state.status not in _ENDED:
            facts.append((EventType.RUN_CANCELLED, {"by": f"parent run {parent_id}",
                                                    "reason": reason}))
        if facts:
            j.record_all(facts)
        completed = j.state.completed
    for event in log:  # its own children, of the calls just settled
        if event.type is EventType.STEP_RECORDED and event.payload["name"] == CHILD_STEP:
            grandchild = event.payload["value"]
            done = completed.get(grandchild["key"])
            if done is not None and done.source != "tool":
                _close_child(store, child_id, grandchild, done.source)


def _settled_by_parent(p: PendingCall, parent: dict[str, Any],
                       reason: str) -> list[tuple[EventType, dict[str, Any]]]:
    """The verdict on a child's open call that its parent's settled call stands for, and
    its completion (no result: the parent's outcome holds it), appended together."""
    common = {"started_seq": p.started_seq, "key": p.key, "tool": p.tool}
    return [(EventType.TOOL_CALL_RECONCILED, {**common, "verdict": "found",
                                              "by": "agentjournal", "reason": reason,
                                              "parent": parent}),
            (EventType.TOOL_CALL_COMPLETED, {
                "call_id": p.call_id, "tool": p.tool, "started_seq": p.started_seq,
                "idempotency_key": p.key, "args": p.args, "result": None,
                "source": "parent", "content": reason})]


def _report_call(run: BridgedRun, call_id: str, *, made: bool, told: list[bool],
                 settled: bool) -> None:
    """Tell Pydantic AI's telemetry whether the tool ran here. A call answered without
    running it (from the log, by a lookup, from another run of the scope) is not
    reported as executed, so no span of the tool running is exported for it. A call
    stopped here (an approval, a person's decision, a denial) is left to Pydantic AI,
    whose span says so."""
    if made:
        _report(True)
    elif told or settled or getattr(run.answer(call_id), "kind", None) == "result":
        _report(False)


def _verdicts_since(run: BridgedRun, key: str, since: int) -> list[Any]:
    """The verdicts this process reached on the uncertain call ``key`` (its lookup, the
    scope's record, a retry), recorded after seq ``since``."""
    return [e for e in run.journal.store.read(run.run_id, after_seq=since)
            if e.type is EventType.TOOL_CALL_RECONCILED and e.payload.get("key") == key
            and e.payload.get("by") == "agentjournal"]


def _reconciled_span(ctx: RunContext[Any], verdict: Any, call_id: str, effect: Effect,
                     began: int) -> None:
    """The span of a verdict reached here, as the native loop's tracer exports it
    (agentjournal.otel): ``execute_tool`` with outcome ``reconciled``, under the run's
    span. The lookup ran here, never the tool, so it carries no result."""
    p = verdict.payload
    span = ctx.tracer.start_span(
        f"execute_tool {p['tool']}", context=_RUN_TRACE.get(), kind=SpanKind.INTERNAL,
        start_time=began, attributes={
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": p["tool"],
            "gen_ai.tool.call.id": call_id, "gen_ai.tool.type": "function",
            "agentjournal.tool.effect": str(effect), "agentjournal.tool.outcome": "reconciled",
            "agentjournal.tool.verdict": p.get("verdict") or "",
            "agentjournal.seq": verdict.seq})
    span.end(end_time=max(began, int(verdict.ts.timestamp() * 1_000_000_000)))


def _tool_result(payload: Any) -> Any:
    """What a tool's payload records: its return value itself (shown as the call's
    result, and the form a person gives with ``agentjournal resolve --result``), unless
    that value would read as a payload of its own."""
    inner = payload.get("result") if payload.get("kind") == "tool_return" else None
    if inner is None or (isinstance(inner, dict) and inner.get("kind") in _ANSWERED):
        return payload
    return inner


def _tool_payload(recorded: Any) -> Any:
    """A recorded result as Pydantic AI's tool payload: the tool's own, or a value a
    person gave (``agentjournal resolve --happened --result``) as the tool's return."""
    if isinstance(recorded, dict) and recorded.get("kind") in _ANSWERED:
        return recorded
    return {"kind": "tool_return", "result": recorded}


def _flow_payload(message: str) -> Any:
    """The control-flow answer a failure's message keeps, or the failure as ToolFailed."""
    text = message.removeprefix("error: ")
    if text.startswith(_FLOW):
        return json.loads(text.removeprefix(_FLOW))
    return {"kind": "tool_failed", "message": text}


def _record_callers_answers(run: BridgedRun, history: Sequence[ModelMessage]) -> None:
    """Results the caller supplied (``DeferredToolResults``) for calls the journal holds
    as uncertain: recorded as the caller's verdict ("happened"), so the journal agrees
    with what the model is told."""
    uncertain = {p.call_id for p in run.state.pending.values()}
    if not uncertain or not history or not isinstance(history[-1], ModelRequest):
        return
    for part in history[-1].parts:
        if isinstance(part, ToolReturnPart) and part.tool_call_id in uncertain:
            run.resolve(part.tool_call_id, happened=True, by="caller",
                        reason="a result in DeferredToolResults",
                        result={"kind": "tool_return", "result": _plain(part.content)})


def request_fingerprint(model_id: str | None, messages: Sequence[ModelMessage],
                        settings: Mapping[str, Any] | None,
                        parameters: ModelRequestParameters,
                        digests: dict[int, tuple[ModelMessage, str]] | None = None, *,
                        recorded: Callable[[Any], Any] | None = None) -> str:
    """What a model request asks, as a digest: the model, the messages (without the
    timestamps and ids Pydantic AI makes anew on each run), the settings that shape the
    answer, and the request parameters (tool definitions without their metadata, which
    is not sent, output mode).

    ``recorded``: the run's redaction (``RunJournal.as_recorded``), applied to each
    message before it is digested: a response is replayed as it was recorded, redacted,
    so a secret in it (a key in its text, in a tool name it made up) must not make the
    replayed request differ from the live one.

    ``digests`` caches each message's digest by the message object, for one run: a
    request carries the whole history, and digesting it anew at every step would cost
    the square of the run's length. A replay makes the same objects in the same order,
    so it digests them as the live run did."""
    shown = _plain(parameters, opaque=True)
    for kind in ("function_tools", "output_tools"):
        for tool_def in shown.get(kind) or ():
            tool_def.pop("metadata", None)
    content_settings = {k: v for k, v in (settings or {}).items() if k != "timeout"}
    head = {"model": model_id, "settings": _plain(content_settings, opaque=True),
            "parameters": shown}
    digest = hashlib.sha256(_canonical_json(head))
    cache = {} if digests is None else digests
    for message in messages:
        known = cache.get(id(message))
        if known is None or known[0] is not message:
            known = cache[id(message)] = (message, _message_digest(message, recorded))
        digest.update(known[1].encode())
    return digest.hexdigest()[:32]


def request_parts(model_id: str | None, messages: Sequence[ModelMessage],
                  settings: Mapping[str, Any] | None, parameters: ModelRequestParameters,
                  digests: dict[int, tuple[ModelMessage, str]] | None = None, *,
                  recorded: Callable[[Any], Any] | None = None) -> dict[str, str]:
    """A model request's parts, each a digest, to say which changed when a request
    differs from the one recorded at its place: ``instructions`` (the agent's, in the
    messages and the parameters), ``tools`` (their definitions without metadata),
    ``model``, ``settings``, ``output`` (the other request parameters) and ``history``
    (the messages, without their instructions). Made only when a request is asked of
    the model or differs from the recorded one: never on a plain replay. ``digests``
    caches each message's digest, for one run (as for request_fingerprint)."""
    shown = _plain(parameters, opaque=True)
    tools = []
    for kind in ("function_tools", "output_tools"):
        for tool_def in shown.pop(kind, None) or ():
            tool_def.pop("metadata", None)
            tools.append(tool_def)
    instructions = [shown.pop("instruction_parts", None)]
    history = hashlib.sha256()
    cache = {} if digests is None else digests
    for message in messages:
        if isinstance(message, ModelRequest):
            instructions.append(message.instructions)
        known = cache.get(id(message))
        if known is None or known[0] is not message:
            known = cache[id(message)] = (
                message, _message_digest(message, recorded, without=("instructions",)))
        history.update(known[1].encode())
    content_settings = {k: v for k, v in (settings or {}).items() if k != "timeout"}
    return {"instructions": _part(instructions), "tools": _part(tools),
            "model": _part(model_id), "settings": _part(_plain(content_settings, opaque=True)),
            "output": _part(shown), "history": history.hexdigest()[:16]}


def _part(value: Any) -> str:
    return hashlib.sha256(_canonical_json(value)).hexdigest()[:16]


def agent_shape(agent: Any, durability: JournalDurability[Any] | None = None) -> AgentShape:
    """What a deploy may change about a Pydantic AI agent (``agentjournal check`` and the
    run's recorded version): its instructions (a function by its name), its function
    tools (name, description, parameters; effect and identity as ``durability`` and
    their metadata declare them) and its model. ``durability``: the agent's
    ``JournalDurability`` (default: the one among its capabilities). No argument check:
    a recorded call is settled by its key (its lookup finds it, or a person), whatever
    the tool's arguments are now, as a resume does."""
    durability = durability or _durability_of(agent)
    tools = []
    toolset = getattr(agent, "_function_toolset", None)
    for tool in (getattr(toolset, "tools", None) or {}).values():
        tool_def = tool.tool_def
        declared = (durability._declared(tool_def.name, tool_def) if durability is not None
                    else ToolEffect())
        tools.append(ToolShape(
            name=tool_def.name, effect=str(Effect(declared.effect)),
            identity=tuple(declared.identity) or None,
            schema_digest=digest([tool_def.name, tool_def.description,
                                  tool_def.parameters_json_schema])))
    model = getattr(agent, "model", None)
    return make_shape(instructions=_instructions_text(agent), tools=tools,
                      model=None if model is None else model if isinstance(model, str)
                      else model_identity(model),
                      version=durability.version if durability is not None else None,
                      strict=durability.strict if durability is not None else False)


def agent_version(agent: Any, durability: JournalDurability[Any] | None = None) -> str:
    """The version a run of ``agent`` records: ``JournalDurability(version=)``, else
    derived from its shape (:func:`agent_shape`). The same code gives the same version."""
    return agent_shape(agent, durability).version


def _instructions_text(agent: Any) -> str | None:
    """The agent's instructions as recorded with a run: the texts, a function by name."""
    given = [_named(getattr(i, "instruction", i)) for i in getattr(agent, "_instructions", ())]
    return "\n\n".join(str(i) for i in given) if given else None


def _durability_of(agent: Any) -> JournalDurability[Any] | None:
    root = getattr(agent, "_root_capability", None)
    return next((c for c in getattr(root, "capabilities", None) or ()
                 if isinstance(c, JournalDurability)), None)


def _describe(obj: object) -> AgentShape | None:
    """deploys.DESCRIBERS: a Pydantic AI agent, or a worker's DurableAgent."""
    if isinstance(obj, DurableAgent):
        return agent_shape(obj.agent, obj.durability)
    if isinstance(obj, Agent):
        return agent_shape(obj)
    return None


DESCRIBERS.append(_describe)


def _named(value: Any) -> Any:
    """``value`` as the same text in every process: a function or a class by its
    qualified name (its repr holds an address), a list item by item."""
    if isinstance(value, list | tuple):
        return [_named(v) for v in value]
    if callable(value):
        return f"{getattr(value, '__module__', '')}.{getattr(value, '__qualname__', '')}"
    return value


def _message_digest(message: ModelMessage, recorded: Callable[[Any], Any] | None = None,
                    *, without: Sequence[str] = ()) -> str:
    (dumped,) = ModelMessagesTypeAdapter.dump_python([message], mode="json")
    kept = {k: v for k, v in dumped.items() if k not in _VOLATILE and k not in without}
    kept["parts"] = [{k: v for k, v in part.items() if k != "timestamp"}
                     for part in dumped.get("parts", [])]
    if recorded is not None:
        kept = recorded(kept)
    return hashlib.sha256(_canonical_json(kept)).hexdigest()


def _canonical_json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      default=lambda v: f"<{type(v).__qualname__}>").encode()


def turn_of(value: Any) -> Turn:
    """A recorded ``ModelResponse`` (JSON) as people read a turn: text, calls, usage."""
    parts = value.get("parts", []) if isinstance(value, dict) else []
    text = "".join(p.get("content", "") for p in parts if p.get("part_kind") == "text")
    calls = [{"id": p.get("tool_call_id", ""), "name": p.get("tool_name", ""),
              "args": _args_of(p.get("args"))} for p in parts
             if p.get("part_kind") == "tool-call"]
    usage = value.get("usage") or {}
    counts = {"input_tokens": usage.get("input_tokens", 0),
              "output_tokens": usage.get("output_tokens", 0),
              "cached_input_tokens": usage.get("cache_read_tokens", 0),
              "cache_write_tokens": usage.get("cache_write_tokens", 0)}
    return Turn(text=text, tool_calls=calls, usage=counts, model=value.get("model_name"),
                provider=value.get("provider_name"), finish_reason=value.get("finish_reason"))


def _args_of(args: Any) -> dict[str, Any]:
    if isinstance(args, dict):
        return args
    if isinstance(args, str) and args:
        try:
            decoded = json.loads(args)
        except ValueError:
            return {"raw": args}
        return decoded if isinstance(decoded, dict) else {"value": decoded}
    return {}


def _plain(value: Any, *, opaque: bool = False) -> Any:
    """``value`` as JSON data, as Pydantic renders it; ``opaque``: what has no JSON form
    (a function) is named by its type, the same on every run."""
    fallback = (lambda v: f"<{type(v).__qualname__}>") if opaque else None
    return to_jsonable_python(value, bytes_mode="base64", fallback=fallback)


def _with_kind(tool_def: ToolDefinition, kind: Any) -> ToolDefinition:
    from dataclasses import replace

    return replace(tool_def, kind=kind)
