"""Layer 4: the durable loop.

``Agent.run(store, run_id, task)`` starts a run or resumes it: the same call.
Opening replays the log; then uncertain calls are settled before the model
is asked anything; then the loop alternates model turns and tool calls, each
fact made durable before it is relied on. A tool call is:

    completed key  -> serve the stored result (same arguments only), do not call the tool
    uncertain key  -> recovery (reconcile or a person), never a blind call
    key done, or left uncertain, by another run of the scope -> the same, from there
    otherwise      -> policy -> tool_call_started (durable) -> invoke -> completed
"""

from __future__ import annotations

import math
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

import msgspec

from .errors import EncodingError, InvalidRunIdError, RunMismatchError
from .events import EventType, now, render
from .faults import fault_point
from .journal import Observer, RunJournal, open_journal
from .keys import canonical_args, idempotency_key, run_scope
from .metrics import METRICS
from .models import Model, ModelError, ModelRequest, ModelResponse
from .peers import Elsewhere, peers_of
from .policy import (
    AllowAll,
    Budget,
    Compaction,
    Deny,
    Guardrail,
    InvisibleText,
    Policy,
    RegexGuardrail,
    RequireApproval,
)
from .redaction import Redaction, was_redacted
from .results import to_json
from .state import (
    SETTLING_VERDICTS,
    Approval,
    CompletedCall,
    Message,
    PendingCall,
    RunState,
    Status,
    ToolCall,
)
from .store import Store, validate_run_id
from .tools import (
    Absent,
    CallGuard,
    CallRunner,
    Conflict,
    Effect,
    Found,
    Tool,
    ToolContext,
    ToolFailed,
    Unknown,
)

E = EventType
Fact = tuple[EventType, dict[str, Any]]


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
    def of(cls, state: RunState) -> RunResult:
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


def same_intent(recorded: dict[str, Any] | None, asked: dict[str, Any]) -> bool:
    """Whether a call asks for exactly what was recorded (compared canonically).

    Unknown recorded arguments (a verdict-settled completion in a log written
    before completions kept them) are taken as the same, as they were then.
    """
    return recorded is None or canonical_args(recorded) == canonical_args(asked)


def changed_intent(tool: Tool, recorded: dict[str, Any] | None, asked: dict[str, Any],
                   where: str | None = None) -> str:
    """Why a call whose key is done, with other arguments, is refused (the model reads it)."""
    done = f"run {where!r} of this scope" if where else "this run"
    identity = ", ".join(tool.identity) or "arguments"
    return (f"{tool.name} with this identity ({identity}) was already done by {done} with "
            f"arguments {canonical_args(recorded or {}).decode()}; this call asks for "
            f"{canonical_args(asked).decode()}. The same identity with other arguments is "
            "another action, and it was not made: repeat the recorded arguments to get the "
            f"recorded result, or use a new {identity} for a new action.")


def as_json(value: Any) -> Any:
    """``value`` as plain JSON data by the result rule (results.py), for evidence kept
    beside a verdict; a value with no JSON form is recorded as why, never as its repr."""
    try:
        return to_json(value, "evidence")
    except EncodingError as exc:
        return {"not_kept": str(exc)}


#: Untrusted content has invisible and bidi control characters stripped by default.
DEFAULT_INVISIBLE = InvisibleText()


def not_kept(reason: str) -> str:
    """What the model reads for a call whose result could not be stored."""
    return f"error: the call was made, but its result was not kept: {reason}"


class Agent:
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
        lease_ttl: float = 30.0,
        snapshot_every: int | None = 1000,
        tool_timeout: float | None = 300.0,
        stuck_after: float | None = None,
        redaction: Redaction | None = None,
        invisible: InvisibleText | None = DEFAULT_INVISIBLE,
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
        are handled before the model reads them (default: stripped; None: left)."""
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
        self.lease_ttl = lease_ttl
        self.snapshot_every = snapshot_every
        self.tool_timeout = self._limit(tool_timeout)
        if stuck_after is None and self.tool_timeout is not None:
            stuck_after = self.tool_timeout + lease_ttl
        self.stuck_after = self._limit(stuck_after)
        self._runners = threading.local()  # a CallRunner per calling thread

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
    ) -> RunResult:
        """Start ``run_id`` with ``task``, or resume it. Returns where the run stopped.

        ``run_id`` is the run's identity and is required: the same id resumes the
        run, and an empty one is refused (InvalidRunIdError), never replaced by a
        fresh id that would start the work, and its effects, again. To start a new
        run, pass :func:`new_run_id` and keep the id. Resuming with a task, scope or
        agent_ref other than the recorded ones is refused (RunMismatchError);
        leaving them out, or repeating them, is a plain resume.

        ``scope`` is the idempotency scope (default: the run; see keys.py);
        ``agent_ref`` ("module:object") is recorded so `agentjournal resume`
        can find this agent again.
        """
        run_id = require_run_id(run_id)
        with open_journal(store, run_id, owner=owner, ttl=self.lease_ttl, observer=observer,
                          snapshot_every=self.snapshot_every, redaction=self.redaction) as j:
            if j.state.last_seq == 0:
                if task is None:
                    raise ValueError(f"run {run_id!r} does not exist yet; give it a task")
                # One batch: a run never exists without its task (or its redaction).
                j.record_all(self._guarded(j, [
                    (E.RUN_STARTED, {"task": task, "scope": scope or run_scope(run_id),
                                     "agent": agent_ref}),
                    (E.USER_MESSAGE, {"content": task}),
                ]))
            else:
                # Compared as recorded: a task holding a secret was recorded redacted.
                self._check_same_run(j.state, task=j.as_recorded(task),
                                     scope=j.as_recorded(scope), agent_ref=j.as_recorded(agent_ref))
                if self._waits_for_a_person(j):
                    # Nothing new to act on: another lookup would only escalate again.
                    return RunResult.of(j.state)
                if j.state.status != "finished":
                    j.record(E.RUN_RESUMED)
            self._drive(j)
            return RunResult.of(j.state)

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

    def _drive(self, j: RunJournal) -> None:
        if not self._recover(j):
            return
        while j.state.status == "running":
            if j.state.awaiting:
                for call in list(j.state.awaiting.values()):
                    if not self._dispatch(j, call):
                        return
                self._compact(j)
                continue
            if self._over_budget(j):
                return
            response = self._ask_model(j)
            if response is None:
                return
            turn: list[Fact] = [(E.MODEL_TURN, {
                "text": response.text, "tool_calls": msgspec.to_builtins(response.tool_calls),
                "usage": msgspec.to_builtins(response.usage)})]
            if not response.tool_calls:  # the final answer and the finish stand together
                turn.append((E.RUN_FINISHED, {"outcome": response.text}))
            j.record_all(turn)
            self._keep_live_args(j, response)

    @staticmethod
    def _keep_live_args(j: RunJournal, response: ModelResponse) -> None:
        """Hold the arguments the log could not keep (redacted), for this process only."""
        for call in response.tool_calls:
            recorded = j.state.awaiting.get(call.id)
            if recorded is not None and recorded.args != call.args:
                j.live_args[call.id] = call.args
            else:  # a model may reuse a call id: never lend an older call's arguments
                j.live_args.pop(call.id, None)

    # --- recovery: settle uncertain calls before anything else -------------------------

    def _recover(self, j: RunJournal) -> bool:
        METRICS.count("uncertain_checked", len(j.state.pending))
        for pending in list(j.state.pending.values()):
            if pending.started_seq in j.state.pending:
                self._settle(j, pending)
        if j.state.pending:
            self._pause(j, "uncertain tool calls need a decision")
        return j.state.status == "running"

    def _settle(self, j: RunJournal, p: PendingCall) -> bool:
        """Resolve one uncertain call from evidence; True if it is settled."""
        tool = self.tools.get(p.tool)
        if tool is None:
            return self._verdict(j, p, "unknown", reason=f"tool {p.tool!r} is not registered")
        if tool.effect is not Effect.READ_ONLY and self._done_in_scope(j, p):
            return True
        if tool.reconcile is not None:
            return self._apply_evidence(j, tool, p, self._look_up(tool, p))
        if tool.effect in (Effect.READ_ONLY, Effect.IDEMPOTENT):
            if blocked := self._retry_blocked(tool, p) or self._args_lost(j, tool, p):
                return self._verdict(j, p, "unknown", reason=blocked)
            self._verdict(j, p, "retry", reason=f"{tool.effect} tool: retry with the same key")
            return self._execute(j, self._call_of(j, tool, p), tool, p.key)
        return False  # reversible / irreversible with no lookup: a person decides

    @staticmethod
    def _look_up(tool: Tool, p: PendingCall) -> Any:
        assert tool.reconcile is not None
        try:
            return tool.reconcile(p)
        except Exception as exc:
            return Unknown(f"lookup failed: {type(exc).__name__}: {exc}")

    def _done_in_scope(self, j: RunJournal, p: PendingCall) -> bool:
        """Settle ``p`` as found if another run of the scope completed its key with its
        arguments (a fork taken between the origin's start and its completion)."""
        other = peers_of(j).find(p.key)
        if other is None or other.done is None or not same_intent(other.done.args, p.args):
            return False
        done = self._completion(p.started_seq, self._call_of(j, None, p), p.key,
                                other.done.result, source="scope", args=p.args,
                                origin=other.where)
        found_at: dict[str, Any] = {"from": other.where}  # this run's start, their effect
        return self._verdict(j, p, "found", evidence=as_json(other.done.result),
                             then=self._guarded(j, [done]), **found_at)

    def _apply_evidence(
        self, j: RunJournal, tool: Tool, p: PendingCall, evidence: Any
    ) -> bool:
        match evidence:
            case Found(result=result):
                # The verdict and the completion in one batch: between them a crash
                # would leave the call settled but not completed, and it would run again.
                # The verdict closes the start first, so the completion carries the args.
                done = self._completion(p.started_seq, self._call_of(j, None, p), p.key, result,
                                        source="reconciliation", args=p.args)
                self._verdict(j, p, "found", evidence=as_json(result),
                              then=self._guarded(j, [done]))
                return True
            case Absent(final=True):
                if blocked := self._retry_blocked(tool, p) or self._args_lost(j, tool, p):
                    return self._verdict(j, p, "unknown", reason=blocked)
                self._verdict(j, p, "absent")
                return self._execute(j, self._call_of(j, tool, p), tool, p.key)
            case Absent():
                return self._verdict(j, p, "unknown", reason="absent now, but may still commit")
            case Conflict(found=found):
                escalation = {"reason": "conflicting effect found at the receiver",
                              "key": p.key, "tool": p.tool, "ours": p.args,
                              "theirs": as_json(found), "started_at": p.started_at.isoformat()}
                return self._verdict(j, p, "conflict", evidence=as_json(found),
                                     then=[(E.RUN_ESCALATED, escalation)])
            case Unknown(reason=reason):
                return self._verdict(j, p, "unknown", reason=reason)
        raise TypeError(f"reconcile for {tool.name!r} returned {evidence!r}")

    def _retry_blocked(self, tool: Tool, p: PendingCall) -> str | None:
        # Errors the tool raised count against max_attempts; a worker that died
        # mid-call left no error, and only a crash loop (max_recoveries) stops it.
        if p.last_error is not None and p.attempt >= self.max_attempts:
            return f"gave up after {p.attempt} attempts; last error: {p.last_error}"
        if p.attempt >= self.max_recoveries:
            return f"the call was interrupted {p.attempt} times; a person should look"
        age = (now() - p.started_at).total_seconds()
        if tool.key_retention is not None and age > tool.key_retention:
            return (f"started {age:.0f}s ago; the receiver keeps keys {tool.key_retention:.0f}s, "
                    "so a retry could apply twice")
        return None

    @staticmethod
    def _verdict(j: RunJournal, p: PendingCall, verdict: str, *, then: Sequence[Fact] = (),
                 elsewhere: Elsewhere | None = None, **detail: Any) -> bool:
        """Record the verdict on ``p``, with the facts that must come with it, atomically.

        ``elsewhere``: ``p`` is another run's call, judged here (that run's log has its
        own writer), so the verdict closes no start of this run (started_seq null) and
        names where the call is (``from``)."""
        if elsewhere is not None:
            detail["from"] = elsewhere.where
        j.record_all([(E.TOOL_CALL_RECONCILED, {
            "started_seq": None if elsewhere else p.started_seq, "key": p.key, "tool": p.tool,
            "verdict": verdict, "by": "agentjournal", **detail}), *then])
        METRICS.count(f"uncertain_{verdict}")  # found / absent / retry: auto-reconciled
        return verdict in SETTLING_VERDICTS

    @staticmethod
    def _call_of(j: RunJournal, tool: Tool | None, p: PendingCall) -> ToolCall:
        """The call ``p`` records, with the arguments this process was given when the
        recorded ones were redacted (checked against the key: they must be the same call)."""
        live = j.live_args.get(p.call_id)
        if live is not None and tool is not None and tool.key(j.state.scope, live) == p.key:
            return ToolCall(id=p.call_id, name=p.tool, args=live)
        return ToolCall(id=p.call_id, name=p.tool, args=p.args)

    def _args_lost(self, j: RunJournal, tool: Tool, p: PendingCall) -> str | None:
        """Why ``p`` cannot be made again from the log: its recorded arguments were
        redacted, and this process does not hold the originals. A retry would send
        the redaction marks, so a person decides."""
        if not was_redacted(p.args) or self._call_of(j, tool, p).args is not p.args:
            return None
        return ("its arguments were redacted before they were recorded and this process "
                "does not hold the originals: a retry would send the redacted values, so "
                "a person decides")

    def _pause(self, j: RunJournal, reason: str) -> None:
        if j.state.status != "running":
            return  # escalated or waiting: that already says why it stopped
        uncertain = [
            {"key": p.key, "tool": p.tool, "args": p.args, "effect": p.effect,
             "started_at": p.started_at.isoformat(), "attempt": p.attempt,
             "last_error": p.last_error}
            for p in j.state.pending.values()
        ]
        j.record(E.RUN_PAUSED, reason=reason, uncertain=uncertain)
        METRICS.count("uncertain_handed_to_a_person", len(uncertain))

    # --- one tool call -------------------------------------------------------------

    def _dispatch(self, j: RunJournal, call: ToolCall) -> bool:
        """Answer one of the model's calls; False when the run must stop here."""
        tool = self.tools.get(call.name)
        if tool is None:
            return self._deny(j, call, None, f"unknown tool {call.name!r}")
        live = j.live_args.get(call.id)
        if live is not None and canonical_args(j.as_recorded(live)) == canonical_args(call.args):
            call = ToolCall(id=call.id, name=call.name, args=live)  # the originals of these
        elif was_redacted(call.args):
            # Asked before a crash: the log holds only the redacted arguments. Making the
            # call would send the redaction marks; it was never started, so deny it.
            return self._deny(j, call, None, (
                "its arguments held a secret that was redacted before it was recorded, and "
                "the process that had the original is gone: the call was not made; ask "
                "again with the full arguments"))
        try:
            tool.check_args(call.args)
        except msgspec.ValidationError as exc:
            return self._deny(j, call, None, f"invalid arguments: {exc}")
        key = tool.key(j.state.scope, call.args)
        if (done := j.state.completed.get(key)) is not None:
            return self._serve(j, call, tool, key, done)
        for p in list(j.state.pending.values()):
            if p.key == key and not self._settle(j, p):
                self._pause(j, f"call {call.name} {key[:12]} is uncertain")
                return False
        if key in j.state.completed:
            return self._dispatch(j, call)  # settled as found: serve it
        if tool.effect is not Effect.READ_ONLY and not self._clear_in_scope(j, call, tool, key):
            return j.state.status == "running"  # answered from another run, or stopped
        decision = self.policy.decide(call, tool, j.state)
        if isinstance(decision, Deny):
            return self._deny(j, call, key, decision.reason)
        if isinstance(decision, RequireApproval) and not self._approved(j, call, key, decision):
            return j.state.status == "running"
        if not self._execute(j, call, tool, key):
            self._pause(j, f"call {call.name} {key[:12]} is uncertain")
            return False
        return True

    def _serve(self, j: RunJournal, call: ToolCall, tool: Tool, key: str,
               done: CompletedCall) -> bool:
        """The recorded result, if the call asks for what was recorded; else a denial
        showing both argument sets (the same identity, another intent: never a success)."""
        if not same_intent(done.args, j.as_recorded(call.args)):
            return self._deny(j, call, key, changed_intent(tool, done.args, call.args))
        served: dict[str, Any] = {"call_id": call.id, "tool": call.name, "key": key,
                                  "result": done.result, "served_from_seq": done.seq}
        if tool.untrusted:
            served["trust"] = "untrusted"
        if done.error is not None:
            served["content"] = not_kept(done.error)
        # Guarded like the completion was: a served result reaches the model too.
        j.record_all(self._guarded(j, [(E.TOOL_RESULT_SERVED, served)]))
        return True

    # --- effects belong to the scope, not to one log -----------------------------------
    #
    # A fork keeps its origin's scope and another run of one operation shares it, so
    # both compute the same key for the same action; the world does not fork with the
    # log. Before making an effect, a run asks the other runs of its scope (peers.py).
    # The window that remains: two live runs of one scope reaching the same key at the
    # same instant both find it untouched and both make the call (or one finds the
    # other's start a moment before its effect lands and its lookup says "absent").
    # Only the receiver, deduplicating on the key both send, closes that window.

    def _clear_in_scope(self, j: RunJournal, call: ToolCall, tool: Tool, key: str) -> bool:
        """True if no other run of the scope made, or may have made, this call. Otherwise
        answer it from theirs or stop the run, and return False (unless their call is
        proven not to have happened, or may be retried with the key: then True)."""
        other = peers_of(j).find(key)
        if other is None:
            return True
        if other.done is not None:
            self._serve_from_scope(j, call, tool, key, other, other.done)
            return False
        assert other.started is not None
        return self._settle_elsewhere(j, call, tool, other, other.started)

    def _serve_from_scope(self, j: RunJournal, call: ToolCall, tool: Tool, key: str,
                          other: Elsewhere, done: CompletedCall) -> None:
        if not same_intent(done.args, j.as_recorded(call.args)):
            self._deny(j, call, key, changed_intent(tool, done.args, call.args, other.run_id))
            return
        # A completion here (not a served copy): later calls and forks of this run
        # find the key done in this log, and it says where the effect was made.
        j.record_all(self._guarded(j, [self._completion(
            None, call, key, done.result, source="scope", args=done.args, origin=other.where)]))

    def _settle_elsewhere(self, j: RunJournal, call: ToolCall, tool: Tool, other: Elsewhere,
                          p: PendingCall) -> bool:
        """Another run started this call and never completed it: uncertain here too.
        The usual rules decide; True only when this run may now make the call itself."""
        if tool.reconcile is not None:
            return self._evidence_elsewhere(j, call, tool, other, p, self._look_up(tool, p))
        if tool.effect is Effect.IDEMPOTENT:
            if not (blocked := self._retry_blocked(tool, p)):
                return self._verdict(j, p, "retry", elsewhere=other,
                                     reason="idempotent tool: retry with the same key")
            self._verdict(j, p, "unknown", elsewhere=other, reason=blocked)
        self._pause_for_elsewhere(j, other, p)  # reversible / irreversible: a person decides
        return False

    def _evidence_elsewhere(self, j: RunJournal, call: ToolCall, tool: Tool, other: Elsewhere,
                            p: PendingCall, evidence: Any) -> bool:
        """``_apply_evidence`` for another run's call. What this run then makes is the
        model's call, under the same key, so a found effect answers it only when the
        arguments are the same."""
        match evidence:
            case Found(result=result) if same_intent(p.args, j.as_recorded(call.args)):
                done = self._completion(None, call, p.key, result, source="reconciliation",
                                        args=p.args, origin=other.where)
                self._verdict(j, p, "found", elsewhere=other, evidence=as_json(result),
                              then=self._guarded(j, [done]))
                return False
            case Found(result=result):
                self._verdict(j, p, "found", elsewhere=other, evidence=as_json(result))
                self._deny(j, call, p.key, changed_intent(tool, p.args, call.args, other.run_id))
                return False
            case Absent(final=True) if not self._retry_blocked(tool, p):
                return self._verdict(j, p, "absent", elsewhere=other)
            case Conflict(found=found):
                escalation = {
                    "reason": f"conflicting effect found at the receiver for a call run "
                              f"{other.run_id!r} left uncertain: settle it there (agentjournal "
                              f"resolve {other.run_id} {p.key[:16]} ...), then resume this run",
                    "key": p.key, "tool": p.tool, "ours": p.args, "theirs": as_json(found),
                    "started_at": p.started_at.isoformat(), "from": other.where}
                self._verdict(j, p, "conflict", elsewhere=other, evidence=as_json(found),
                              then=[(E.RUN_ESCALATED, escalation)])
                return False
            case Unknown(reason=reason):
                pass
            case Absent(final=False):
                reason = "absent now, but may still commit"
            case Absent():
                reason = self._retry_blocked(tool, p) or ""
            case _:
                raise TypeError(f"reconcile for {tool.name!r} returned {evidence!r}")
        self._verdict(j, p, "unknown", elsewhere=other, reason=reason)
        self._pause_for_elsewhere(j, other, p)
        return False

    @staticmethod
    def _pause_for_elsewhere(j: RunJournal, other: Elsewhere, p: PendingCall) -> None:
        if j.state.status != "running":
            return  # escalated: that already says why it stopped
        j.record(E.RUN_PAUSED, reason=(
            f"call {p.tool} {p.key[:12]} is uncertain in run {other.run_id!r} of this scope: "
            f"settle it there (agentjournal resolve {other.run_id} {p.key[:16]} --happened | "
            "--did-not-happen | --conflict), then resume this run"),
            uncertain=[], elsewhere={
                **other.where, "key": p.key, "tool": p.tool, "args": p.args, "effect": p.effect,
                "started_at": p.started_at.isoformat(), "attempt": p.attempt,
                "last_error": p.last_error})
        METRICS.count("uncertain_handed_to_a_person")

    def _approved(self, j: RunJournal, call: ToolCall, key: str, ask: RequireApproval) -> bool:
        # The id binds the exact call, arguments included: a changed call needs
        # its own approval even when its idempotency key is the same.
        approval_id = "approval-" + idempotency_key(key, call.name, call.args)[:16]
        decided = j.state.decisions.get(approval_id)
        if decided is None:
            if approval_id not in j.state.approvals:
                j.record(E.APPROVAL_REQUESTED, approval_id=approval_id, key=key, tool=call.name,
                         args=call.args, call_id=call.id, reason=ask.reason)
            return False
        if not decided.approved:
            self._deny(j, call, key, f"denied by {decided.by}: {decided.reason}")
        same = decided.args == j.as_recorded(call.args)  # recorded redacted, if at all
        if decided.approved and not same:
            self._deny(j, call, key, "the call changed after it was approved")
        return decided.approved and same

    def _deny(self, j: RunJournal, call: ToolCall, key: str | None, reason: str) -> bool:
        j.record(E.TOOL_CALL_DENIED, call_id=call.id, tool=call.name, key=key, reason=reason)
        return True

    def _execute(self, j: RunJournal, call: ToolCall, tool: Tool, key: str) -> bool:
        """Start (durably), invoke, complete. False if the call ends uncertain."""
        attempt = j.state.attempts.get(key, 0) + 1
        start = j.record(E.TOOL_CALL_STARTED, key=key, tool=tool.name, args=call.args,
                         call_id=call.id, effect=tool.effect.value, attempt=attempt)
        if start.payload["args"] != call.args:  # recorded redacted: a same-process retry
            j.live_args[call.id] = call.args  # needs the originals
        guard = CallGuard()  # an abandoned call may no longer write to the run
        ctx = ToolContext(run_id=j.run_id, key=key, attempt=attempt, epoch=j.lease.epoch,
                          call_id=call.id, scope=j.state.scope, memory=dict(j.state.memory),
                          remember=lambda k, v: guard.run(self._remember, j, k, v))
        fault_point("before_effect")
        if tool.effect is not Effect.READ_ONLY:
            # A worker paused past its lease may have been replaced, and its successor may
            # have settled this very call: making it now could apply it twice.
            j.check_lease(tool.name)
            fault_point("lease_checked")
        try:
            result = self._invoke(j, tool, call, ctx, guard)
        except ToolFailed as exc:
            self._fail(j, start.seq, call, str(exc))
            return True
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            if tool.effect is Effect.READ_ONLY:
                self._fail(j, start.seq, call, error)
                return True
            j.record(E.TOOL_CALL_UNCERTAIN, started_seq=start.seq, key=key, error=error)
            METRICS.count("uncertain_opened")
            return self._settle(j, j.state.pending[start.seq])
        fault_point("after_effect")
        self._complete(j, start.seq, call, key, result, source="tool")
        return True

    def _invoke(self, j: RunJournal, tool: Tool, call: ToolCall, ctx: ToolContext,
                guard: CallGuard) -> Any:
        """Call the tool: within its timeout on a worker thread, or inline without one."""
        limit = self._timeout_of(tool)
        # While the call runs, the run is quiet but not stuck: not until its timeout has
        # passed (plus a TTL of slack), and never for a call that has no limit.
        j.expect_progress(None if limit is None or self.stuck_after is None
                          else max(self.stuck_after, limit + self.lease_ttl))
        try:
            if limit is None:
                return tool.invoke(call.args, ctx)
            return self._runner().call(lambda: tool.invoke(call.args, ctx), limit, guard,
                                       tool.name)
        finally:
            j.expect_progress(self.stuck_after)  # a return, or an abandonment: progress

    def _timeout_of(self, tool: Tool) -> float | None:
        return self._limit(self.tool_timeout if tool.timeout is None else tool.timeout)

    @staticmethod
    def _limit(seconds: float | None) -> float | None:
        """A limit in seconds, or None for none (``math.inf`` says none too)."""
        return None if seconds is None or math.isinf(seconds) else seconds

    def _runner(self) -> CallRunner:
        runner: CallRunner | None = getattr(self._runners, "runner", None)
        if runner is None:
            runner = self._runners.runner = CallRunner()
        return runner

    @staticmethod
    def _remember(j: RunJournal, key: str, value: Any) -> None:
        # The result rule: a value with no faithful JSON form is refused to the tool.
        j.record(E.MEMORY_WRITTEN, key=key, value=to_json(value, f"memory value {key!r}"))

    def _completion(self, started_seq: int | None, call: ToolCall, key: str, result: Any, *,
                    source: str, args: dict[str, Any] | None = None,
                    origin: dict[str, Any] | None = None) -> Fact:
        """A completion. ``args`` when its start is not (or no longer) open in this run,
        so the fold can keep them; ``origin`` names the run and seq it came from."""
        extra: dict[str, Any] = {"trust": "untrusted"} if self.tools[call.name].untrusted else {}
        if args is not None:
            extra["args"] = args
        if origin is not None:
            extra["from"] = origin
        try:
            extra["result"] = to_json(result)
        except EncodingError as exc:
            # The effect happened; only its result could not be kept. The key stays, so
            # the call is never made again; the model is told, never given a repr.
            extra.update(result=None, is_error=True, encoding_error=str(exc),
                         content=not_kept(str(exc)))
        return (E.TOOL_CALL_COMPLETED, {
            "started_seq": started_seq, "call_id": call.id, "tool": call.name,
            "idempotency_key": key, "source": source, **extra})

    def _complete(self, j: RunJournal, started_seq: int, call: ToolCall, key: str,
                  result: Any, *, source: str) -> None:
        j.record_all(self._guarded(j, [self._completion(started_seq, call, key, result,
                                                         source=source)]))

    def _fail(self, j: RunJournal, started_seq: int, call: ToolCall, error: str) -> None:
        # A proven failure carries no idempotency key: the action may be tried again.
        j.record(E.TOOL_CALL_COMPLETED, started_seq=started_seq, call_id=call.id,
                 tool=call.name, idempotency_key=None, is_error=True, content=f"error: {error}")

    # --- model, guardrails, compaction, budget ---------------------------------------

    def _ask_model(self, j: RunJournal) -> ModelResponse | None:
        request = ModelRequest(run_id=j.run_id, turn=j.state.turns,
                               messages=list(j.state.messages),
                               tools=[t.spec() for t in self.tools.values()],
                               memory=dict(j.state.memory))
        j.expect_progress(self.stuck_after)  # a model call that never answers is stuck
        for attempt in range(self.model_retries + 1):
            fault_point("model_call")
            try:
                return self.model.complete(request)
            except ModelError as exc:
                if not exc.retryable or attempt == self.model_retries:
                    j.record(E.RUN_PAUSED, reason=f"model error: {exc}")
                    return None
                time.sleep(min(0.1 * 2**attempt, 5.0))
        return None

    def _guarded(self, j: RunJournal, facts: list[Fact]) -> list[Fact]:
        """``facts`` and the guardrails' verdicts on the message the last one adds.

        One batch: a crash must never leave content in the log without the
        redaction the live run would have applied to it.
        """
        kind, p = facts[-1]
        if kind is E.USER_MESSAGE:
            message = Message(role="user", content=p["content"], trust=p.get("trust", "user"),
                              seq=0)
        else:  # a tool's completion
            message = Message(role="tool", content=p.get("content") or render(p.get("result")),
                              trust=p.get("trust", "tool"), seq=0, name=p.get("tool"))
        index = len(j.state.messages)  # no fact before the last one in a batch adds a message
        verdicts = []
        for guardrail in self.guardrails:
            verdict = guardrail.inspect(message)
            if verdict is not None:
                verdicts.append((E.GUARDRAIL_TRIGGERED,
                                 {"message_index": index, **msgspec.to_builtins(verdict)}))
                if verdict.action == "redact" and verdict.replacement is not None:
                    message.content = verdict.replacement  # the next guardrail sees it so
        return [*facts, *verdicts]

    def _compact(self, j: RunJournal) -> None:
        if self.compaction is not None and (plan := self.compaction.plan(j.state.messages)):
            summary, kept = plan
            j.record(E.CONTEXT_COMPACTED, summary=summary, kept=kept)

    def _over_budget(self, j: RunJournal) -> bool:
        # The journal's count, which a wall clock set back cannot rewind.
        elapsed = j.elapsed() if self.budget.max_seconds is not None else 0.0
        hit = self.budget.exceeded(j.state, elapsed)
        if hit is None:
            return False
        name, limit, used = hit
        j.record_all([(E.BUDGET_EXCEEDED, {"budget": name, "limit": limit, "used": used}),
                      (E.RUN_PAUSED, {"reason": f"budget exceeded: {name} {used:g} of {limit:g}"})])
        return True
