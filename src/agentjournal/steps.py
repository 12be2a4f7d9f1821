"""The step machine: what the loop records next, written once for both shells.

A run alternates model turns and tool calls, each fact made durable before it
is relied on. A tool call is:

    completed key  -> serve the stored result (same arguments only), do not call the tool
    uncertain key  -> recovery (settle.py: reconcile or a person), never a blind call
    key done, or left uncertain, by another run of the scope -> the same, from there
                     (not for a tool declared ``local``: its effect stays with its run)
    otherwise      -> policy -> tool_call_started (durable) -> invoke -> completed

The calls of one turn that are cleared to run start together, in one batch of
``tool_call_started`` events, then run concurrently; each completion is recorded
as it comes. A crash in between leaves several uncertain calls, which recovery
settles one by one. Every wait on the world is a yielded operation (ops.py).
"""

from __future__ import annotations

import functools
import math
import re
import threading
import time
from collections import Counter
from collections.abc import Collection, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import msgspec

from .errors import EncodingError, ScopeSharedError
from .events import EventType, render
from .faults import fault_point
from .keys import canonical_args, idempotency_key
from .limits import args_refused, result_over, result_too_deep, within_args_limit
from .metrics import METRICS
from .models import Model, ModelError, ModelRequest, ModelResponse, in_background, stop_kind
from .ops import Ask, Begin, Call, Collect, Invoke, Outcome, Sleep, Steps
from .policy import Budget, Compaction, Deny, Guardrail, Policy, RequireApproval
from .redaction import was_redacted
from .results import NotKept, TooDeep, to_json
from .settle import Fact, Ready, Settling, changed_intent, same_intent
from .state import CompletedCall, Message, Observation, ToolCall
from .tools import CallGuard, Effect, Tool, ToolContext, ToolFailed
from .workspace import Workspace

if TYPE_CHECKING:
    from .journal import RunJournal

E = EventType

#: Why a turn that stopped this way is not the run's answer (the pause says it).
STOP_EXPLAINED = {
    "length": "it was cut short at its output token limit",
    "max_tokens": "it was cut short at its output token limit (max_tokens)",
    "max_output_tokens": "it was cut short at its output token limit (max_output_tokens)",
    "content_filter": "the provider's content filter stopped it",
    "refusal": "the model refused",
    "model_context_window_exceeded": "the context window is full",
}


def not_kept(reason: str) -> str:
    """What the model reads for a call whose result could not be stored."""
    return f"error: the call was made, but its result was not kept: {reason}"


def bad_arguments(raw: str) -> str:
    """Why arguments the model sent are refused, in words the model can act on."""
    try:
        decoded = msgspec.json.decode(raw)
        problem = f"they are a JSON {type(decoded).__name__}, not an object"
    except msgspec.DecodeError as exc:
        problem = f"they are not valid JSON ({exc})"
    shown = raw if len(raw) <= 200 else raw[:200] + "..."
    return f"invalid arguments: {problem}: {shown!r}; send the arguments as one JSON object"


class StepMachine(Settling):
    """The loop's logic. ``Agent`` holds the configuration it reads."""

    model: Model
    policy: Policy
    guardrails: list[Guardrail]
    compaction: Compaction | None
    budget: Budget
    instructions: str | None
    model_retries: int
    model_backoff: float
    max_retry_wait: float
    parallel_calls: int
    lease_ttl: float
    tool_timeout: float | None
    stuck_after: float | None
    workspace: Workspace | None
    max_args_bytes: int | None
    max_result_bytes: int | None

    #: A read-only call's result is staged, to be stored with the run's next facts (the
    #: model's next turn: see _drive) rather than on its own: a step of reads is then
    #: one append, not two. A crash while the model answers loses the result, and the
    #: read is made again. Not for a driver that stores nothing staged before it waits
    #: (BridgedRun: its framework asks the model), nor for a run with an observer given
    #: each fact with the state as of that fact (unless it is ``journal.stateless``).
    reads_ride = True

    def _drive(self, j: RunJournal, stop: threading.Event | None = None) -> Steps[None]:
        """The loop, with every staged fact stored before the world is waited on, but for
        a model: a crash while it answers loses only facts whose loss is safe."""
        steps = self._loop(j, stop)
        value: Any = None
        error: BaseException | None = None
        while True:
            try:
                op = steps.throw(error) if error is not None else steps.send(value)
            except StopIteration:
                j.flush()
                return
            if not isinstance(op, Ask):  # an answer depends on nothing stored: what is
                j.flush()  # staged is stored with the turn it brings (see stage)
            value, error = None, None
            try:
                value = yield op
            except Exception as exc:
                error = exc

    def _loop(self, j: RunJournal, stop: threading.Event | None) -> Steps[None]:
        if self.workspace is not None:
            self._look_at_workspace(j)  # before anything else reads or changes it
        if not (yield from self._recover(j)):
            return
        while j.state.status == "running":
            if stop is not None and stop.is_set():
                return  # asked to stop (a draining worker): the run stays running
            if j.state.awaiting:
                if not (yield from self._answer(j)):
                    return
                self._compact(j)
                continue
            if self._over_budget(j):
                return
            yield from self._refresh(j)
            asked = yield from self._ask_model(j)
            if asked is None:
                return
            self._record_turn(j, *asked)

    # --- the model's turn ------------------------------------------------------------

    def _request(self, j: RunJournal) -> ModelRequest:
        return ModelRequest(run_id=j.run_id, turn=j.state.turns, messages=list(j.state.messages),
                            tools=[t.spec() for t in self.tools.values()],
                            memory=dict(j.state.memory), instructions=self.instructions)

    def _ask_model(self, j: RunJournal) -> Steps[tuple[ModelResponse, float] | None]:
        """The model's answer and how long it took (ms); None when the run paused.

        The one retry layer: retryable errors are retried with backoff that honours
        the provider's retry-after, and every failed attempt is recorded."""
        request = self._request(j)
        j.expect_progress(self.stuck_after)  # a model call that never answers is stuck
        error: ModelError | None = None
        for attempt in range(1, self.model_retries + 2):
            fault_point("model_call")
            began = time.monotonic()
            try:
                response = yield from self._call_model(j, request)
                return response, (time.monotonic() - began) * 1000
            except ModelError as exc:
                error = exc
            failed = (E.MODEL_CALL_FAILED, self._failure(error, attempt))
            wait = self._retry_wait(error, attempt)
            if wait is None:
                j.record_all([failed, (E.RUN_PAUSED, {"reason": self._gave_up(error, attempt)})])
                return None
            j.record_all([failed])
            METRICS.count("model_retries")
            if wait:
                yield Sleep(wait)
        return None

    def _call_model(self, j: RunJournal, request: ModelRequest) -> Steps[ModelResponse]:
        model = self.model
        response: ModelResponse
        if not in_background(model):
            response = yield Ask(model, request)
            return response
        # The call's id is durable before we wait: a crash resumes this call, not a new one.
        open_call = j.state.model_call
        if open_call is not None and open_call.get("turn") == j.state.turns:
            handle = str(open_call["handle"])
        else:
            handle = yield Begin(model, request)
            j.record(E.MODEL_CALL_STARTED, handle=handle, turn=j.state.turns)
            fault_point("model_started")
        response = yield Collect(model, handle, request)
        return response

    @staticmethod
    def _failure(error: ModelError, attempt: int) -> dict[str, Any]:
        detail = {"status": error.status, "retry_after": error.retry_after,
                  "request_id": error.request_id}
        return {"attempt": attempt, "error": str(error), "retryable": error.retryable,
                "lost": error.lost, **{k: v for k, v in detail.items() if v is not None}}

    def _retry_wait(self, error: ModelError, attempt: int) -> float | None:
        """Seconds to wait before asking again, or None to stop asking. A lost background
        call (the provider no longer has it) is asked anew after the same backoff."""
        if not (error.retryable or error.lost) or attempt > self.model_retries:
            return None
        backoff = min(self.model_backoff * 2 ** (attempt - 1), 8.0)
        wait = max(backoff, error.retry_after or 0.0)
        return None if wait > self.max_retry_wait else wait

    def _gave_up(self, error: ModelError, attempt: int) -> str:
        if not error.retryable and not error.lost:
            return f"model error (not retryable): {error}"
        if error.retry_after is not None and error.retry_after > self.max_retry_wait:
            return (f"model error: the provider asked to wait {error.retry_after:g}s, longer "
                    f"than max_retry_wait ({self.max_retry_wait:g}s): {error}")
        return f"model error after {attempt} attempts: {error}"

    def _record_turn(self, j: RunJournal, response: ModelResponse, latency_ms: float) -> None:
        """The turn, with what it means for the run, in one batch: a final answer and
        the finish stand together; a turn cut short pauses the run instead. Arguments
        over the limit are recorded as their size only (limits.py), then denied."""
        response = within_args_limit(response, self.max_args_bytes)
        response = named_plainly(response, self.tools)
        given = [c.id for c in response.tool_calls]
        response = ids_plainly(response, distinct_ids(
            response.tool_calls, j.state.turns, j.call_ids_in_context()))
        payload = self._turn_payload(response, latency_ms)
        for call, provider_id in zip(payload["tool_calls"], given, strict=True):
            if call["id"] != provider_id and (plain_id(provider_id) or not provider_id):
                call["provider_id"] = provider_id  # what the provider sent, for the record
        turn: list[Fact] = [(E.MODEL_TURN, payload)]
        kind = stop_kind(response)
        if response.tool_calls or kind == "continue":
            pass  # calls to answer, or a paused turn the provider continues when asked
        elif kind == "pause":
            why = STOP_EXPLAINED.get(response.finish_reason or "", "its response was incomplete")
            turn.append((E.RUN_PAUSED, {"reason": (
                f"the model stopped without an answer ({response.finish_reason}): {why}; "
                "its text was not taken as the run's outcome. Resume to ask again.")}))
        else:
            turn.append((E.RUN_FINISHED, {"outcome": response.text}))
        if response.tool_calls:
            j.stage(turn)  # stored with the first facts about its calls: one sync, not two
            fault_point("turn_staged")
        else:
            j.record_all(turn)
        self._keep_live_args(j, response)

    @staticmethod
    def _turn_payload(response: ModelResponse, latency_ms: float) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "text": response.text, "tool_calls": msgspec.to_builtins(response.tool_calls),
            "usage": msgspec.to_builtins(response.usage), "latency_ms": round(latency_ms, 3)}
        for field in ("provider", "model", "response_id", "request_id", "finish_reason"):
            if (value := getattr(response, field)) is not None:
                payload[field] = value
        if response.items:
            payload["items"] = response.items
        return payload

    @staticmethod
    def _keep_live_args(j: RunJournal, response: ModelResponse) -> None:
        """Hold the arguments the log could not keep (redacted), for this process only."""
        for call in response.tool_calls:
            recorded = j.state.awaiting.get(call.id)
            if recorded is not None and recorded.args != call.args:
                j.live_args[call.id] = call.args
            else:  # a model may reuse a call id: never lend an older call's arguments
                j.live_args.pop(call.id, None)

    # --- the calls of a turn ---------------------------------------------------------

    def _answer(self, j: RunJournal) -> Steps[bool]:
        """Answer the awaited calls; False when the run must stop here.

        Each is checked in order; those cleared to run start together. A call whose
        key another call of the batch has is left for after it (then served). When a
        call stops the run (an approval to wait for, an uncertain key), the calls
        cleared before it are not started: nothing is done while a run is stopping."""
        ready: list[Ready] = []
        for call in list(j.state.awaiting.values()):
            cleared = yield from self._clear(j, call)
            if cleared is False:
                return False
            if cleared is not True and all(cleared[2] != key for _, _, key in ready):
                ready.append(cleared)
        if not ready:
            return True
        try:
            made = yield from self._execute(j, ready, alone=self._unasked(j, ready))
        except ScopeSharedError:  # nothing was started: clear them again, the peers asked
            return (yield from self._answer(j))
        if not made:
            names = ", ".join(f"{p.tool} {p.key[:12]}" for p in j.state.pending.values())
            self._pause(j, f"call {names} is uncertain")
            return False
        return True

    def _clear(self, j: RunJournal, call: ToolCall) -> Steps[Ready | bool]:
        """The call, its tool and key when it may run now; True when it was answered
        without running (served, denied); False when the run must stop here."""
        if call.too_large is not None:  # its arguments were not kept: never make it
            return self._deny(j, call, None, args_refused(call.too_large, self.max_args_bytes))
        tool = self._tool_for(call.name)
        if tool is None:
            return self._deny(j, call, None, self._unknown(call.name), unknown_tool=True)
        if call.raw_arguments is not None:
            return self._deny(j, call, None, bad_arguments(call.raw_arguments))
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
        # A call under a tool's old name (``renamed``) keeps the key it was recorded with
        # (the old name's), never a new one its receiver has not seen.
        key = tool.key(j.state.scope, call.args, called=call.name)
        if (done := j.state.completed.get(key)) is not None:
            return self._serve(j, call, tool, key, done)
        for p in list(j.state.pending.values()):
            if p.key == key and not (yield from self._settle(j, p)):
                self._pause(j, f"call {call.name} {key[:12]} is uncertain")
                return False
        if key in j.state.completed:
            return (yield from self._clear(j, call))  # settled as found: serve it
        peers = self._asks_peers(tool)
        if peers and j.shared_scope and not (yield from self._clear_in_scope(j, call, tool, key)):
            return j.state.status == "running"  # answered from another run, or stopped
        decision = self.policy.decide(call, tool, j.state)
        if isinstance(decision, Deny):
            return self._deny(j, call, key, decision.reason)
        if isinstance(decision, RequireApproval):
            # A person is asked only about a call the scope has not made: the peers first,
            # even while none is known (else the start's refusal would only tell later).
            if peers and not j.shared_scope and not (
                    yield from self._clear_in_scope(j, call, tool, key)):
                return j.state.status == "running"
            if not self._approved(j, call, key, decision):
                return j.state.status == "running"
        if tool.requires_fresh and not (yield from self._fresh_enough(j, call, tool)):
            return True  # denied: the model decides again on what it reads now
        return call, tool, key


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

    def _deny(self, j: RunJournal, call: ToolCall, key: str | None, reason: str, *,
              unknown_tool: bool = False) -> bool:
        """Record the call's denial. ``unknown_tool``: the name is the model's, not one of
        the agent's tools, so no trace or metric takes it for a tool's name (otel.py)."""
        marked = {"unknown_tool": True} if unknown_tool else {}
        j.record(E.TOOL_CALL_DENIED, call_id=call.id, tool=call.name, key=key, reason=reason,
                 **marked)
        return True

    def _unknown(self, name: str) -> str:
        """Why a call to a tool this agent does not have is denied, in words the model
        can act on (the name as recorded: redacted, or NOT_A_TOOL_NAME in its place)."""
        names = sorted(self.tools)
        listed = ", ".join(names[:20]) + (f" and {len(names) - 20} more" if len(names) > 20
                                          else "")
        asked = (f"named {name!r}" if name != NOT_A_TOOL_NAME else
                 "by the name you gave, which is not a tool name (a name is 1 to 64 letters, "
                 "digits, '_', '-' or '.') and was not kept")
        use = f"call one of its tools by name: {listed}" if names else "it has no tools"
        return f"this agent has no tool {asked}: the call was not made; {use}"

    # --- making the calls ------------------------------------------------------------

    def _unasked(self, j: RunJournal, ready: list[Ready]) -> bool:
        """Whether ``_clear`` left the peers unasked for some of ``ready``: while no other
        run is known to share the scope, the starts are appended on condition that none
        does (one round trip, the check and the start in one transaction)."""
        return not j.shared_scope and any(self._asks_peers(tool) for _, tool, _ in ready)

    def _execute(self, j: RunJournal, ready: list[Ready], *, alone: bool = False) -> Steps[bool]:
        """Start ``ready`` (one durable batch), run them, complete each as it returns.
        False if a call ends uncertain and cannot be settled. ``alone``: the starts only
        if no other run shares the scope, else ScopeSharedError (nothing started)."""
        starts = j.record_all([(E.TOOL_CALL_STARTED, {
            "key": key, "tool": call.name, "args": call.args, "call_id": call.id,
            "effect": tool.effect.value, "attempt": j.state.attempts.get(key, 0) + 1,
            **_retention(tool)}) for call, tool, key in ready], alone=alone)
        calls = [self._prepared(j, start.seq, start.payload["attempt"], *r)
                 for start, r in zip(starts, ready, strict=True)]
        for _, tool, _ in ready:  # each call's window, as if it ran alone
            fault_point("before_effect")
            if tool.effect is not Effect.READ_ONLY:
                # A worker paused past its lease may have been replaced, and its successor
                # may have settled this very call: making it now could apply it twice.
                j.check_lease(tool.name)
                fault_point("lease_checked")
        j.expect_progress(self._quiet_for(calls))
        try:
            yield Invoke(calls, functools.partial(self._finish, j, starts, ready),
                         self.parallel_calls)
        finally:
            j.expect_progress(self.stuck_after)  # returns, or abandonments: progress
        if self.workspace is not None:  # the results, staged, go with the version they made
            if any(tool.effect is not Effect.READ_ONLY for _, tool, _ in ready):
                self._checkpoint(j, "turn")
            else:  # read-only calls change no file: no version to look for (a resume
                j.flush()  # would still see one that did, as drift)
        settled = True
        for start in starts:  # each call that ended uncertain, settled by the usual rules
            p = j.state.pending.get(start.seq)
            if p is not None and not (yield from self._settle(j, p)):
                settled = False
        return settled

    def _prepared(self, j: RunJournal, started_seq: int, attempt: int, call: ToolCall,
                  tool: Tool, key: str) -> Call:
        if j.state.pending[started_seq].args != call.args:  # recorded redacted: a retry in
            j.live_args[call.id] = call.args  # this process needs the originals
        guard = CallGuard()  # an abandoned call may no longer write to the run
        ctx = ToolContext(run_id=j.run_id, key=key, attempt=attempt, epoch=j.lease.epoch,
                          call_id=call.id, scope=j.state.scope, memory=dict(j.state.memory),
                          remember=lambda k, v: guard.run(self._remember, j, k, v))
        return Call(run=functools.partial(tool.invoke, call.args, ctx),
                    timeout=self._timeout_of(tool), guard=guard, name=tool.name,
                    is_async=tool.is_async)

    def _quiet_for(self, calls: list[Call]) -> float | None:
        """While calls run, the run is quiet but not stuck: not until their timeout has
        passed (plus a TTL of slack), and never while a call with no limit runs."""
        if self.stuck_after is None or any(c.timeout is None for c in calls):
            return None
        return max(self.stuck_after, *(c.timeout + self.lease_ttl for c in calls
                                       if c.timeout is not None))

    def _finish(self, j: RunJournal, starts: Sequence[Any], ready: list[Ready], i: int,
                outcome: Outcome) -> None:
        """Record how call ``i`` of a batch ended, as soon as it has."""
        call, tool, key = ready[i]
        seq = starts[i].seq
        error = outcome.error
        # With a workspace, a turn's results wait for the checkpoint of what they did.
        rides = self.reads_ride and tool.effect is Effect.READ_ONLY and not j.observes_state
        keep = j.stage if self.workspace is not None or rides else j.record_all
        if error is None:
            fault_point("after_effect")
            keep(self._guarded(j, [self._completion(seq, call, key, outcome.value,
                                                    source="tool")]))
        elif isinstance(error, ToolFailed):
            keep([self._failure_fact(seq, call, str(error))])
        elif tool.effect is Effect.READ_ONLY:
            keep([self._failure_fact(seq, call, f"{type(error).__name__}: {error}")])
        else:
            keep([(E.TOOL_CALL_UNCERTAIN, {"started_seq": seq, "key": key,
                                           "error": f"{type(error).__name__}: {error}"})])
            METRICS.count("uncertain_opened")

    def _timeout_of(self, tool: Tool) -> float | None:
        return limit(self.tool_timeout if tool.timeout is None else tool.timeout)

    @staticmethod
    def _remember(j: RunJournal, key: str, value: Any) -> None:
        # The result rule: a value with no faithful JSON form is refused to the tool.
        j.record(E.MEMORY_WRITTEN, key=key, value=to_json(value, f"memory value {key!r}"))

    def _completion(self, started_seq: int | None, call: ToolCall, key: str, result: Any, *,
                    source: str, args: dict[str, Any] | None = None,
                    origin: dict[str, Any] | None = None,
                    not_kept_why: str | None = None) -> Fact:
        """A completion. ``args`` when its start is not (or no longer) open in this run,
        so the fold can keep them; ``origin`` names the run and seq it came from;
        ``not_kept_why`` why the run that made it kept no result (``CompletedCall.error``)."""
        tool = self._tool_for(call.name)
        assert tool is not None  # a call completes only through a tool the agent has
        extra: dict[str, Any] = {"trust": "untrusted"} if tool.untrusted else {}
        if tool.fresh_for is not None:
            extra["fresh_for"] = tool.fresh_for
        if args is not None:
            extra["args"] = args
        if origin is not None:
            extra["from"] = origin
        extra.update(self._result_fields(result, not_kept_why))
        return (E.TOOL_CALL_COMPLETED, {
            "started_seq": started_seq, "call_id": call.id, "tool": call.name,
            "idempotency_key": key, "source": source, **extra})

    def _result_fields(self, result: Any, not_kept_why: str | None) -> dict[str, Any]:
        """The result as a completion holds it, or why it is not kept: no JSON form (or a
        shell's ``NotKept``), nested past results.MAX_DEPTH or over ``max_result_bytes``
        (then its size and sha256 instead). The effect happened either way: the key stays,
        so the call is never made again, and the model is told, never given a repr or a
        part."""
        over: dict[str, Any] = {}
        if not_kept_why is None and isinstance(result, NotKept):
            not_kept_why = result.why
        if not_kept_why is None:
            try:
                plain = to_json(result)
            except TooDeep:
                not_kept_why, over = result_too_deep(result)
            except EncodingError as exc:
                not_kept_why = str(exc)
            else:
                if (found := result_over(plain, self.max_result_bytes)) is None:
                    return {"result": plain}
                not_kept_why, over = found
        return {"result": None, "is_error": True, "encoding_error": not_kept_why,
                "content": not_kept(not_kept_why), **over}

    @staticmethod
    def _failure_fact(started_seq: int, call: ToolCall, error: str) -> Fact:
        # A proven failure carries no idempotency key: the action may be tried again.
        return (E.TOOL_CALL_COMPLETED, {
            "started_seq": started_seq, "call_id": call.id, "tool": call.name,
            "idempotency_key": None, "is_error": True, "content": f"error: {error}"})

    # --- the workspace -----------------------------------------------------------------

    def _checkpoint(self, j: RunJournal, cause: str) -> None:
        """Commit the workspace and record the version with what is staged; nothing new
        to record when the files did not change."""
        assert self.workspace is not None
        ws = self.workspace
        fault_point("before_checkpoint")
        made = ws.checkpoint(j.run_id, f"{j.run_id} seq {j.state.last_seq}: {cause}")
        last = j.state.workspace
        if last is not None and made.commit == last.commit and made.skipped is None:
            j.flush()
            return
        where = ({"directory": str(ws.directory), "shadow": str(ws.shadow)}
                 if last is None or last.directory != str(ws.directory) else {})
        j.record_all([(E.WORKSPACE_CHECKPOINT, {
            "cause": cause, **where, **msgspec.to_builtins(made)})])

    def _look_at_workspace(self, j: RunJournal) -> None:
        """A new run records where its files start; a resumed one, whether they changed
        while it was stopped (recorded, and told to the model, before it is asked)."""
        assert self.workspace is not None
        last = j.state.workspace
        if last is None or last.directory != str(self.workspace.directory):
            self._checkpoint(j, "start")
        elif last.commit is None or self.workspace.drift(j.run_id, last.commit) != []:
            # Changed, or unknown: a guard stops the comparison now, or stopped the last
            # version (then what changed is told against the run's last commit).
            self._checkpoint(j, "drift")

    # --- freshness --------------------------------------------------------------------

    def _refresh(self, j: RunJournal) -> Steps[None]:
        """Results in the model's context older than their tool's ``fresh_for``: re-read
        (read-only tools, called again) or marked stale, in one fact the model reads
        before its next turn. A crash before it is recorded only re-reads again."""
        due = _due(j, j.state.observations.values())
        if due:
            yield from self._recheck(j, due)

    def _fresh_enough(self, j: RunJournal, call: ToolCall, tool: Tool) -> Steps[bool]:
        """Before ``tool`` runs, the observations it ``requires_fresh`` are re-read if
        they aged past their freshness; if one changed (or could not be re-read), the
        call is denied naming it, and the model decides again. What it read then, what
        holds now and the age are told as before any turn: the check's note, which the
        fold holds until the turn's last result is in."""
        due = _due(j, [o for o in j.state.observations.values()
                       if o.tool in tool.requires_fresh])
        if not due:
            return True
        items = yield from self._recheck(j, due, for_call=call.id)
        moved = [f"{i['tool']}({render(i['args'])}) "
                 + ("changed" if i["verdict"] == "changed" else "could not be read again")
                 for i in items if i["verdict"] != "unchanged"]
        if not moved:
            return True
        self._deny(j, call, None, (
            f"what it was decided on may no longer hold: {'; '.join(moved)}; the note "
            "after these results says what you read then and what holds now; decide again "
            "on what you read now"))
        return False

    def _recheck(self, j: RunJournal, due: list[Observation],
                 for_call: str | None = None) -> Steps[list[dict[str, Any]]]:
        now = datetime.now(UTC)
        rereads = [(o, t) for o in due if (t := self.tools.get(o.tool)) is not None
                   and t.effect is Effect.READ_ONLY]
        outcomes: dict[int, Outcome] = {}
        if rereads:
            yield Invoke([self._reread(j, o, t) for o, t in rereads], outcomes.__setitem__,
                         self.parallel_calls)
        reread = {o.call_id: outcomes[i] for i, (o, _) in enumerate(rereads)}
        items = [self._checked(j, o, reread.get(o.call_id), (now - o.at).total_seconds())
                 for o in due]
        untrusted = any(self.tools[o.tool].untrusted for o in due if o.tool in self.tools)
        j.record(E.OBSERVATIONS_CHECKED, items=items,
                 **({"trust": "untrusted"} if untrusted else {}),
                 **({"for_call": for_call} if for_call is not None else {}))
        return items

    def _reread(self, j: RunJournal, o: Observation, tool: Tool) -> Call:
        key = tool.key(j.state.scope, o.args)
        ctx = ToolContext(run_id=j.run_id, key=key, attempt=1, epoch=j.lease.epoch,
                          call_id=o.call_id, scope=j.state.scope, memory=dict(j.state.memory),
                          remember=lambda k, v: None)  # a re-read is an observation only
        return Call(run=functools.partial(tool.invoke, o.args, ctx),
                    timeout=self._timeout_of(tool), guard=CallGuard(), name=tool.name,
                    is_async=tool.is_async)

    def _checked(self, j: RunJournal, o: Observation, outcome: Outcome | None,
                 age: float) -> dict[str, Any]:
        item: dict[str, Any] = {"call_id": o.call_id, "tool": o.tool, "args": o.args,
                                "observed_seq": o.seq, "age_s": round(age, 3)}
        if outcome is None:
            return {**item, "verdict": "stale", "why": "not re-read: the tool is not read-only"}
        if outcome.error is not None:
            return {**item, "verdict": "stale",
                    "why": f"re-reading it failed: {type(outcome.error).__name__}: "
                           f"{outcome.error}"}
        try:
            result = to_json(outcome.value)
        except EncodingError as exc:
            return {**item, "verdict": "stale", "why": f"the re-read result was not kept: {exc}"}
        if (over := result_over(result, self.max_result_bytes)) is not None:
            why, _ = over
            return {**item, "verdict": "stale", "why": f"the re-read result was not kept: {why}"}
        before = j.state.completed.get(o.key) if o.key else None
        seen = next(m.content for m in reversed(j.state.messages) if m.tool_call_id == o.call_id)
        same = (before.result == result) if before is not None else seen == render(result)
        return {**item, "verdict": "unchanged" if same else "changed", "result": result}

    # --- guardrails, compaction, budget ----------------------------------------------

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
        name, cap, used = hit
        j.record_all([(E.BUDGET_EXCEEDED, {"budget": name, "limit": cap, "used": used}),
                      (E.RUN_PAUSED, {"reason": f"budget exceeded: {name} {used:g} of {cap:g}"})])
        return True


#: A name of a tool the agent does not have that a turn keeps as the model sent it
#: (redacted, as all its text is): a name as providers define one (1 to 64 letters, digits,
#: ``_``, ``-``, ``.``). Anything else the model sends as a name (quotes, braces, control
#: characters, kilobytes) is not one: NOT_A_TOOL_NAME is kept in its place.
_TOOL_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
NOT_A_TOOL_NAME = "not_a_tool_name"


def named_plainly(response: ModelResponse, tools: Collection[str]) -> ModelResponse:
    """``response`` with each call to a name that is neither one of ``tools`` nor a tool
    name at all renamed NOT_A_TOOL_NAME, in its calls and in the provider items that repeat
    the name, before anything is recorded: a name the agent lacks is untrusted model output,
    and such a one is never stored, shown, sent back to the provider (which would refuse
    it) or made a span name. The call is then denied (``_clear``)."""
    odd = {c.name for c in response.tool_calls
           if c.name not in tools and not _TOOL_NAME.fullmatch(c.name)}
    if not odd:
        return response
    tool_calls = [msgspec.structs.replace(c, name=NOT_A_TOOL_NAME) if c.name in odd else c
                  for c in response.tool_calls]
    items = [{**item, "name": NOT_A_TOOL_NAME}
             if isinstance(item.get("name"), str) and item["name"] in odd else item
             for item in response.items]
    return msgspec.structs.replace(response, tool_calls=tool_calls, items=items)


#: A call id as providers make them (OpenAI ``call_...``/``fc_...``, Anthropic
#: ``toolu_...``, OpenAI-compatible servers ``functions.add:0``): 1 to 128 letters, digits,
#: ``_``, ``-``, ``.``, ``:``. A server may pass on whatever the model wrote as the id;
#: anything else (quotes, braces, control characters, kilobytes) is not kept (distinct_ids).
_CALL_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")


def plain_id(call_id: str) -> bool:
    """Whether ``call_id`` has the form of a provider's call id (``_CALL_ID``)."""
    return _CALL_ID.fullmatch(call_id) is not None


def distinct_ids(calls: Sequence[ToolCall], turn: int, taken: set[str]) -> list[ToolCall]:
    """``calls``, each with an id of its own: the provider's, unless it is empty or no
    call id at all (``plain_id``: it is model output, never recorded), shared by another
    call of the turn, or ``taken`` (by a call in the context), as some OpenAI-compatible
    servers send them. Then ``call_{turn}_{place}`` (made unique), which the turn records:
    a replay reads it, and results pair with their calls."""
    ids = {c.id for c in calls}
    if len(ids) == len(calls) and all(map(plain_id, ids)) and ids.isdisjoint(taken):
        return list(calls)  # the usual turn: every id the provider's own
    given = Counter(c.id for c in calls)
    used = set(given)  # this turn's; ``taken`` is the context's, not copied (it grows)
    out = []
    for place, call in enumerate(calls):
        if plain_id(call.id) and given[call.id] == 1 and call.id not in taken:
            out.append(call)
            continue
        derived = f"call_{turn}_{place}"
        n = 1
        while derived in used or derived in taken:
            derived, n = f"call_{turn}_{place}_{n}", n + 1
        used.add(derived)
        out.append(msgspec.structs.replace(call, id=derived))
    return out


def ids_plainly(response: ModelResponse, tool_calls: list[ToolCall]) -> ModelResponse:
    """``response`` with the ids ``distinct_ids`` gave its calls, in the calls and in the
    provider items that repeat an id that is no call id (OpenAI's ``call_id``, Anthropic's
    ``id``), so none is recorded. An id repeated or taken stays in the items as the
    provider sent it: the adapters send each call item with its call's id
    (``with_call_ids``)."""
    replaced: dict[str, str] = {}
    for before, after in zip(response.tool_calls, tool_calls, strict=True):
        if not plain_id(before.id):
            replaced.setdefault(before.id, after.id)
    if not replaced:
        return msgspec.structs.replace(response, tool_calls=tool_calls)
    items = [{**item, **{field: replaced[value] for field, value in item.items()
                         if field in ("id", "call_id") and isinstance(value, str)
                         and value in replaced}}
             for item in response.items]
    return msgspec.structs.replace(response, tool_calls=tool_calls, items=items)


def _due(j: RunJournal, observations: Collection[Observation]) -> list[Observation]:
    """The observations the model still reads that are older than their freshness."""
    if not observations:
        return []
    now = datetime.now(UTC)
    aged = [o for o in observations if (now - o.at).total_seconds() > o.fresh_for]
    if not aged:
        return []
    # Compaction may have dropped a result: only the ones still in the context count.
    read = {m.tool_call_id for m in j.state.messages if m.role == "tool"}
    return [o for o in aged if o.call_id in read]


def _retention(tool: Tool) -> dict[str, float]:
    """The start's record of how long the receiver keeps keys: gc keeps the run's log at
    least that long (retention.py)."""
    return {} if tool.key_retention is None else {"key_retention": tool.key_retention}


def limit(seconds: float | None) -> float | None:
    """A limit in seconds, or None for none (``math.inf`` says none too)."""
    return None if seconds is None or math.isinf(seconds) else seconds
