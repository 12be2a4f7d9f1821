"""Layer 4: the durable loop's entry points.

``Agent.run(store, run_id, task)`` starts a run or resumes it: the same call;
``await Agent.arun(...)`` is the same for async code. Opening replays the log;
then uncertain calls are settled before the model is asked anything (settle.py);
then the loop alternates model turns and tool calls (steps.py). The logic is
written once, as a step machine; ``run`` and ``arun`` are thin shells that
perform what it asks for (ops.py), in a thread or on an event loop.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import os
import sys
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import msgspec

from .deploys import AgentShape, agent_shape, forecast, model_identity, tool_shape
from .errors import AgentRefError, InvalidRunIdError, RunMismatchError
from .events import EventType
from .journal import Observer, RunJournal, open_journal
from .keys import run_scope
from .limits import MAX_ARGS_BYTES, MAX_RESULT_BYTES, checked_limit
from .models import Model
from .ops import in_thread, run_async, run_watched, to_the_back
from .peers import peers_of
from .policy import (
    AllowAll,
    Budget,
    Compaction,
    Guardrail,
    InvisibleText,
    Policy,
    RegexGuardrail,
)
from .redaction import Redaction
from .settle import as_json, changed_intent, same_intent, uncertain_of
from .snapshots import settle as settle_maps
from .state import Approval, PendingCall, RunState, Status
from .steps import StepMachine, limit, not_kept
from .store import Lease, Store, validate_run_id
from .tools import Tool
from .workspace import Workspace

E = EventType

__all__ = ["Agent", "RunResult", "as_json", "changed_intent", "load_agent", "new_run_id",
           "not_kept", "require_run_id", "same_intent"]


class RunResult(msgspec.Struct, frozen=True, kw_only=True):
    run_id: str
    status: Status
    outcome: Any
    last_seq: int
    uncertain: list[PendingCall]
    approvals: list[Approval]
    pause_reason: str | None
    escalation: dict[str, Any] | None
    state: RunState  # the whole folded state, as the run left it

    @classmethod
    def of(cls, state: RunState, *, settle: bool = True) -> RunResult:
        if settle:  # it may outlive the run's store: no map of it may need the store
            settle_maps(state)
        return cls(
            run_id=state.run_id, status=state.status, outcome=state.outcome,
            last_seq=state.last_seq, uncertain=list(state.pending.values()),
            approvals=list(state.approvals.values()), pause_reason=state.pause_reason,
            escalation=state.escalation, state=state,
        )


def new_run_id() -> str:
    """A fresh run id, for a caller that means to start a new run (keep it to resume).

    Ids are never made up on the caller's behalf: an empty id from a supervisor
    that lost its own would start a second run and repeat every effect.
    """
    return f"run-{uuid.uuid4().hex[:12]}"


def require_run_id(run_id: object) -> str:
    """``run_id``, refused with InvalidRunIdError when it is missing, empty or unsafe."""
    if run_id is None or (isinstance(run_id, str) and not run_id.strip()):
        raise InvalidRunIdError(
            "" if run_id is None else run_id,
            f"it is empty{' (None)' if run_id is None else ''}; a run id names the run to "
            "start or resume (pass new_run_id() to start a new run, and keep it to resume)")
    return validate_run_id(run_id)


#: Untrusted content has invisible and bidi control characters stripped by default.
DEFAULT_INVISIBLE = InvisibleText()


class Agent(StepMachine):
    def __init__(
        self,
        model: Model,
        tools: Sequence[Tool],
        *,
        policy: Policy | None = None,
        guardrails: Sequence[Guardrail] = (),
        compaction: Compaction | None = None,
        budget: Budget | None = None,
        max_attempts: int = 3,
        max_recoveries: int = 20,
        model_retries: int = 3,
        model_backoff: float = 0.25,
        max_retry_wait: float = 60.0,
        instructions: str | None = None,
        parallel_calls: int = 8,
        lease_ttl: float = 30.0,
        snapshot_every: int | None = 1000,
        tool_timeout: float | None = 300.0,
        stuck_after: float | None = None,
        redaction: Redaction | None = None,
        invisible: InvisibleText | None = DEFAULT_INVISIBLE,
        workspace: Workspace | str | os.PathLike[str] | None = None,
        max_args_bytes: int | None = MAX_ARGS_BYTES,
        max_result_bytes: int | None = MAX_RESULT_BYTES,
        version: str | None = None,
        strict: bool = False,
        renamed: Mapping[str, str] | None = None,
    ) -> None:
        """``tool_timeout``: seconds a tool call may take unless the tool says otherwise
        (None: no limit); past it the call is abandoned and uncertain. ``stuck_after``:
        seconds without progress (an append, a tool's return) after which the run counts
        as stuck and stops renewing its lease, so another worker can take it over;
        default ``tool_timeout + lease_ttl`` (never less than a call's own timeout plus
        the TTL while it runs), ``math.inf`` never.

        ``budget``: default ``Budget()``, with default limits on turns, tool calls and
        tokens (``Budget.unlimited()`` for none). ``redaction``: what is kept off disk
        (default ``Redaction()``, common credential patterns; ``Redaction.none()``:
        nothing); the patterns of redacting ``RegexGuardrail``s are added to it.
        ``invisible``: how invisible and bidi control characters in untrusted content
        are handled before the model reads them (default: stripped; None: left).

        ``instructions``: the system prompt, recorded when a run starts and sent in each
        provider's own way. ``model_retries``: how many times a retryable model error
        (rate limit, overload, 5xx, a lost connection) is retried, after
        ``model_backoff * 2**n`` seconds or the provider's retry-after, whichever is
        longer; a wait over ``max_retry_wait`` pauses the run instead. Every failed
        attempt is recorded. ``parallel_calls``: how many of one turn's tool calls run
        at once (1: one after another).

        ``workspace``: a directory the tools edit (or a :class:`Workspace`, to choose
        its shadow store and guards). It is committed to a shadow git store when a run
        starts and after each turn whose calls changed it, the commit recorded with the
        turn's results in one batch; a change made while the run was stopped is
        recorded, and told to the model, before it is asked anything.

        ``max_args_bytes`` (default 1 MiB), ``max_result_bytes`` (default 4 MiB): the
        largest arguments and result of one tool call, as JSON, that are stored (None:
        no limit). Arguments over it are not kept and the call is denied, telling the
        model why; the run goes on. A result over it comes after the effect: the call
        is completed (never made again), its result's size and sha256 kept instead of
        it, and the model told. See limits.py.

        ``version``: this agent's version, recorded in run_started and in each
        run_resumed (default: a digest of the instructions, the tools' definitions and
        the model's identity, ``agent.version``). A run resumed under another version
        continues from its history (deploys.py): recorded turns are served, the next one
        asked with this agent; a changed instructions is recorded. A call the change
        made unusable (its tool gone, its identity or effect class changed, its
        arguments no longer valid) pauses the run for a person. ``strict=True`` refuses
        a resume under another version instead (also per run: ``run(..., strict=)``).
        ``renamed``: old tool name -> new, so calls recorded under the old name are
        settled and served by the new tool, under their old keys."""
        self.model = model
        self.tools = {t.name: t for t in tools}
        self.policy = policy or AllowAll()
        # Invisible characters first: they could hide a match from the guardrails after.
        self.guardrails = [*([invisible] if invisible is not None else []), *guardrails]
        self.redaction = self._redaction(redaction, guardrails)
        self.compaction = compaction
        self.budget = Budget() if budget is None else budget
        self.max_attempts = max_attempts
        self.max_recoveries = max_recoveries
        self.model_retries = model_retries
        self.model_backoff = model_backoff
        self.max_retry_wait = max_retry_wait
        self.instructions = instructions
        if parallel_calls < 1:
            raise ValueError(f"parallel_calls must be at least 1, not {parallel_calls!r}")
        self.parallel_calls = parallel_calls
        self.lease_ttl = lease_ttl
        self.snapshot_every = snapshot_every
        self.tool_timeout = limit(tool_timeout)
        if stuck_after is None and self.tool_timeout is not None:
            stuck_after = self.tool_timeout + lease_ttl
        self.stuck_after = limit(stuck_after)
        self.workspace = (workspace if isinstance(workspace, Workspace) or workspace is None
                          else Workspace(workspace))
        self.max_args_bytes = checked_limit("max_args_bytes", max_args_bytes)
        self.max_result_bytes = checked_limit("max_result_bytes", max_result_bytes)
        self.strict = strict
        self.renamed = dict(renamed or {})
        unknown = sorted(new for new in self.renamed.values() if new not in self.tools)
        if unknown:
            raise ValueError(f"renamed maps to tools this agent does not have: {unknown}")
        self._version = version

    @functools.cached_property
    def shape(self) -> AgentShape:
        """What a deploy may change about this agent (deploys.py), computed once."""
        return agent_shape(instructions=self.instructions, model=model_identity(self.model),
                           tools=[tool_shape(t) for t in self.tools.values()],
                           version=self._version, strict=self.strict, renamed=self.renamed)

    @property
    def version(self) -> str:
        return self.shape.version

    @staticmethod
    def _redaction(given: Redaction | None, guardrails: Sequence[Guardrail]) -> Redaction:
        """The run's redaction: ``given`` (or the default) plus every redacting regex
        guardrail's pattern, so what a guardrail redacts is kept off disk too."""
        base = Redaction() if given is None else given
        merged = Redaction.none()
        merged.extend(base)
        for g in guardrails:
            if isinstance(g, RegexGuardrail) and g.action == "redact":
                merged.add(g.name, g.pattern.pattern, "[redacted]")
        return merged

    # --- the one entry point ---------------------------------------------------------

    def run(
        self,
        store: Store,
        run_id: str,
        task: str | None = None,
        *,
        scope: str | None = None,
        owner: str | None = None,
        observer: Observer | None = None,
        agent_ref: str | None = None,
        change_instructions: bool = False,
        stop: threading.Event | None = None,
        keep_lease: bool = False,
        settle: bool = True,
        lease: Lease | None = None,
        strict: bool | None = None,
    ) -> RunResult:
        """Start ``run_id`` with ``task``, or resume it. Returns where the run stopped.

        ``run_id`` is the run's identity and is required: the same id resumes the
        run, and an empty one is refused (InvalidRunIdError), never replaced by a
        fresh id that would start the work, and its effects, again. To start a new
        run, pass :func:`new_run_id` and keep the id. Resuming with a task, scope or
        agent_ref other than the recorded ones is refused (RunMismatchError);
        leaving them out, or repeating them, is a plain resume.

        New agent code (instructions, tools, model: another ``version``) goes on from
        the run's history: a changed instructions is recorded (``instructions_changed``)
        before the model is asked, and a recorded call the change made unusable pauses
        the run for a person (deploys.py). ``strict`` (default: the agent's) refuses
        another version instead (RunMismatchError), unless ``change_instructions=True``
        accepts the change.

        ``scope`` is the idempotency scope (default: the run; see keys.py);
        ``agent_ref`` ("module:object") is recorded so `agentjournal resume`
        can find this agent again. ``stop``: once set, the run returns at its next
        step boundary (before a model turn or a batch of calls), still running, for
        another process to resume (a draining worker). ``keep_lease``: leave the lease
        held on return, for the caller to release (a worker's hand-back).
        ``lease``: a lease on the run the caller holds already (a worker's claim),
        adopted instead of acquiring one (see open_journal). ``settle=False``: the
        result's state keeps a resumed run's completed calls and
        attempts as lazy maps that read ``store`` (see keyed.py), for a caller that
        looks at the status only; by default they are decoded into dicts, as much work
        as a long run's resume once did.
        """
        if not callable(getattr(self.model, "complete", None)):
            raise TypeError(f"{type(self.model).__name__} has no complete(): it is an async "
                            "model, so run the agent with `await agent.arun(...)`")
        with self._opened(store, run_id, task, scope, owner, observer, agent_ref,
                          change_instructions, keep_lease, lease, strict) as (j, drive):
            if drive:
                run_watched(self._drive(j, stop))
                j.at_rest()
            return RunResult.of(j.state, settle=settle)

    async def arun(
        self,
        store: Store,
        run_id: str,
        task: str | None = None,
        *,
        scope: str | None = None,
        owner: str | None = None,
        observer: Observer | None = None,
        agent_ref: str | None = None,
        change_instructions: bool = False,
        stop: threading.Event | None = None,
        keep_lease: bool = False,
        settle: bool = True,
        lease: Lease | None = None,
        strict: bool | None = None,
    ) -> RunResult:
        """:meth:`run` for async code: async models and tools are awaited, sync ones run
        in threads, and the calls of one turn run concurrently as tasks. The event loop
        never waits on the store: opening, every append (the step machine between two
        operations), snapshots and closing run on stepper threads (ops.in_thread), and
        the appends of the process's runs that arrive together are committed together
        (the store's group commit). An observer is called on those threads."""
        opened = self._opened(store, run_id, task, scope, owner, observer, agent_ref,
                              change_instructions, keep_lease, lease, strict)
        j, drive = await in_thread(opened.__enter__)
        if j.state.resumes:  # see to_the_back; a new run asks its model at once
            to_the_back()
        try:
            if drive:
                await run_async(self._drive(j, stop))
        except BaseException as exc:
            await in_thread(opened.__exit__, type(exc), exc, exc.__traceback__)
            raise
        return await in_thread(_closed, opened, j, drive, settle)  # one trip, not three

    @contextlib.contextmanager
    def _opened(self, store: Store, run_id: str, task: str | None, scope: str | None,
                owner: str | None, observer: Observer | None, agent_ref: str | None,
                change_instructions: bool, keep_lease: bool, lease: Lease | None,
                strict: bool | None = None) -> Iterator[tuple[RunJournal, bool]]:
        """The run's journal, started or resumed, and whether there is anything to
        drive (not when it waits for a person)."""
        run_id = require_run_id(run_id)
        with open_journal(store, run_id, owner=owner, ttl=self.lease_ttl, observer=observer,
                          snapshot_every=self.snapshot_every, redaction=self.redaction,
                          keep_lease=keep_lease, lease=lease) as j:
            try:
                yield j, self._start_or_resume(j, task, scope, agent_ref, change_instructions,
                                               strict)
            finally:
                segment_hook(observer, "segment_ended", j.state)

    def _start_or_resume(self, j: RunJournal, task: str | None, scope: str | None,
                         agent_ref: str | None, change_instructions: bool,
                         strict: bool | None = None) -> bool:
        version = self.version
        if j.state.last_seq == 0:
            if task is None:
                raise ValueError(f"run {j.run_id!r} does not exist yet; give it a task")
            # One batch: a run never exists without its task (or its redaction).
            trace = segment_hook(j.observer, "segment_started", j.state)
            j.record_all(self._guarded(j, [
                (E.RUN_STARTED, {"task": task, "scope": scope or run_scope(j.run_id),
                                 "agent": agent_ref, "instructions": self.instructions,
                                 "agent_version": version,
                                 **({"trace": trace} if trace else {})}),
                (E.USER_MESSAGE, {"content": task}),
            ]))
            return True
        # Compared as recorded: a task holding a secret was recorded redacted.
        self._check_same_run(j.state, task=j.as_recorded(task), scope=j.as_recorded(scope),
                             agent_ref=j.as_recorded(agent_ref))
        # History is history: the change is judged (deploys.forecast, as `agentjournal
        # check` judges it), then recorded, and the run continues from what it recorded.
        ahead = forecast(j.state, self.shape, strict=strict, accept=change_instructions)
        if ahead.action == "refuse":
            raise RunMismatchError(j.run_id, "agent version", j.state.versions[-1]
                                   if j.state.versions else None, version, advice=ahead.sentence)
        changed = j.as_recorded(self.instructions) != j.state.instructions
        if j.state.saga is not None or j.state.status == "cancelled":
            return False  # cancelled, or being compensated: its loop never runs again
        if self._waits_for_a_person(j):
            # Nothing new to act on: another lookup would only escalate again.
            return False
        if j.state.status == "finished":
            return True
        if ahead.action == "pause" and j.state.status == "paused" \
                and j.state.pause_reason == ahead.sentence:
            return False  # paused for this very reason, nothing settled since: no new facts
        trace = segment_hook(j.observer, "segment_started", j.state)
        resumed: list[tuple[EventType, dict[str, Any]]] = [
            (E.RUN_RESUMED, {"agent_version": version, **({"trace": trace} if trace else {})})]
        if changed:
            resumed.append((E.INSTRUCTIONS_CHANGED, {"instructions": self.instructions}))
        if ahead.action == "pause":
            # Before recovery could retry, look up or re-make a call under the new code.
            resumed.append((E.RUN_PAUSED, {"reason": ahead.sentence,
                                           "uncertain": uncertain_of(j.state)}))
        j.record_all(resumed)
        return ahead.action != "pause"

    @staticmethod
    def _waits_for_a_person(j: RunJournal) -> bool:
        """Escalated, and nothing decided since. A conflict over a call another run of
        the scope left uncertain is decided there, where the call can be resolved: this
        run waits while that call is still open."""
        if not j.state.waits_for_a_person:
            return False
        where = (j.state.escalation or {}).get("from")
        if where is None:
            return True
        peer = peers_of(j).state_of(where["run_id"])
        return peer is not None and where["seq"] in peer.pending

    @staticmethod
    def _check_same_run(state: RunState, *, task: str | None, scope: str | None,
                        agent_ref: str | None) -> None:
        """Refuse to resume ``state`` as other work: its recorded effects would be served
        to, or its open calls made for, an intent that is not the one they were for."""
        for field, recorded, given in (("task", state.task, task), ("scope", state.scope, scope),
                                       ("agent", state.agent, agent_ref)):
            if given is not None and recorded is not None and given != recorded:
                raise RunMismatchError(state.run_id, field, recorded, given)



def load_agent(ref: str) -> Agent:
    """The Agent named by ``MODULE:OBJECT`` (what ``agent_ref`` records): an Agent, or a
    zero-argument factory of one. The working directory is importable, as under
    ``python -m``. AgentRefError says what is wrong with the reference."""
    module_name, _, attr = ref.partition(":")
    if not module_name or not attr:
        raise AgentRefError(ref, "it is not MODULE:OBJECT (e.g. myagents:reconciler)")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    obj: Any = resolve_ref(ref, "run from the directory that holds it, or install it")
    if not isinstance(obj, Agent) and callable(obj) and _takes_no_args(obj):
        obj = obj()
    if not isinstance(obj, Agent):
        raise AgentRefError(ref, f"it is a {type(obj).__name__}, not an Agent or a "
                            "zero-argument callable returning one")
    return obj


def resolve_ref(ref: str, hint: str) -> object:
    """What ``MODULE:OBJECT`` names, imported (the import path as it is); AgentRefError
    when the module cannot be imported (``hint`` says what to do) or has no such name."""
    module_name, _, attr = ref.partition(":")
    try:
        found: object = importlib.import_module(module_name)
    except ImportError as exc:
        raise AgentRefError(ref, f"cannot import module {module_name!r} ({exc}); "
                            f"{hint}") from None
    for part in attr.split("."):
        missing = object()
        found = getattr(found, part, missing)
        if found is missing:
            raise AgentRefError(ref, f"module {module_name!r} has no {attr!r}")
    return found


def _takes_no_args(fn: Callable[..., Any]) -> bool:
    try:
        inspect.signature(fn).bind()
    except (TypeError, ValueError):
        return False
    return True


def segment_hook(observer: Observer | None, name: str, state: RunState) -> Any:
    """Call an observer's optional segment hook: ``segment_started(state)`` before this
    process records run_started / run_resumed (what it returns, a trace context, is
    recorded in that event), ``segment_ended(state)`` when the run returns or fails.
    A tracer (otel.py) marks a process's segment so; a plain function has neither."""
    hook = getattr(observer, name, None)
    return hook(state) if callable(hook) else None


def _closed(opened: contextlib.AbstractContextManager[tuple[RunJournal, bool]], j: RunJournal,
            drove: bool, settle: bool) -> RunResult:
    """The run at rest (snapshotted if due, once it was driven), its result, and its
    journal closed (``opened`` was entered on another trip)."""
    with contextlib.ExitStack() as stack:
        stack.push(opened)
        if drove:
            j.at_rest()
        return RunResult.of(j.state, settle=settle)
