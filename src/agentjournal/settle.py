"""Settling uncertain calls: the rules by which a call that may or may not have
happened is decided from evidence, retried with its key, or handed to a person.

A call is uncertain when its start is durable and its completion is not: the
worker died, the tool raised after sending, it timed out. Recovery runs these
rules before the model is asked anything, and a call that meets an uncertain
key on its way runs them too:

    another run of the scope completed the key  -> found there (a tool not ``local``)
    the tool has a lookup                       -> found / absent / conflict / unknown
    read-only or idempotent, retry not blocked  -> retry with the same key
    otherwise                                   -> a person decides (the run pauses)

The same rules judge a call another run of the scope left uncertain
(``settle_elsewhere``): its verdict is recorded here, naming where it is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from .errors import EncodingError
from .events import EventType, now
from .keys import canonical_args
from .limits import result_over
from .metrics import METRICS
from .ops import LookUp, Steps
from .peers import Elsewhere, peers_of
from .redaction import was_redacted
from .results import to_json
from .state import SETTLING_VERDICTS, CompletedCall, PendingCall, RunState, ToolCall
from .tools import Absent, Conflict, Effect, Found, Tool, Unknown

if TYPE_CHECKING:
    from .journal import RunJournal

E = EventType
Fact = tuple[EventType, dict[str, Any]]
Ready = tuple[ToolCall, Tool, str]  # a call cleared to run, its tool and its key


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


def as_json(value: Any, limit: int | None = None) -> Any:
    """``value`` as plain JSON data by the result rule (results.py), for evidence kept
    beside a verdict; a value with no JSON form, or over ``limit`` bytes, is recorded as
    why (and its size and sha256), never as its repr."""
    try:
        plain = to_json(value, "evidence")
    except EncodingError as exc:
        return {"not_kept": str(exc)}
    if (over := result_over(plain, limit)) is None:
        return plain
    why, size = over
    return {"not_kept": why, "bytes": size["result_bytes"], "sha256": size["result_sha256"]}


def uncertain_of(state: RunState) -> list[dict[str, Any]]:
    """The run's open calls, as a pause records them for a person."""
    return [{"key": p.key, "tool": p.tool, "args": p.args, "effect": p.effect,
             "started_at": p.started_at.isoformat(), "attempt": p.attempt,
             "last_error": p.last_error} for p in state.pending.values()]


class Settling:
    """The recovery rules of the step machine (mixed into ``StepMachine``)."""

    tools: dict[str, Tool]
    #: Old tool name -> new: calls recorded under the old name are the new tool's.
    renamed: Mapping[str, str] = MappingProxyType({})
    max_attempts: int
    max_recoveries: int
    max_result_bytes: int | None

    if TYPE_CHECKING:  # provided by StepMachine
        def _execute(self, j: RunJournal, ready: list[Ready], *,
                     alone: bool = False) -> Steps[bool]: ...
        def _completion(self, started_seq: int | None, call: ToolCall, key: str, result: Any,
                        *, source: str, args: dict[str, Any] | None = None,
                        origin: dict[str, Any] | None = None,
                        not_kept_why: str | None = None) -> Fact: ...
        def _guarded(self, j: RunJournal, facts: list[Fact]) -> list[Fact]: ...
        def _deny(self, j: RunJournal, call: ToolCall, key: str | None, reason: str) -> bool: ...
        @staticmethod
        def _failure_fact(started_seq: int, call: ToolCall, error: str) -> Fact: ...

    def _tool_for(self, name: str) -> Tool | None:
        """The tool that serves calls recorded (or asked) under ``name``."""
        found = self.tools.get(name)
        if found is None and name in self.renamed:
            found = self.tools.get(self.renamed[name])
        return found

    def _evidence(self, value: Any) -> Any:
        """``value`` kept beside a verdict, within the run's result limit."""
        return as_json(value, self.max_result_bytes)

    def _recover(self, j: RunJournal) -> Steps[bool]:
        METRICS.count("uncertain_checked", len(j.state.pending))
        for pending in list(j.state.pending.values()):
            if pending.started_seq in j.state.pending:
                yield from self._settle(j, pending)
        if j.state.pending:
            self._pause(j, "uncertain tool calls need a decision")
        return j.state.status == "running"

    @staticmethod
    def _asks_peers(tool: Tool) -> bool:
        """A call whose effect another run of the scope may have made: not read-only,
        nor ``local`` (its effect stays with its run)."""
        return tool.effect is not Effect.READ_ONLY and not tool.local

    def _settle(self, j: RunJournal, p: PendingCall) -> Steps[bool]:
        """Resolve one uncertain call from evidence; True if it is settled."""
        tool = self._tool_for(p.tool)
        if tool is None and p.effect == Effect.READ_ONLY:
            # A read made nothing: the model is told it failed, and that the tool is gone.
            j.record_all([self._failure_fact(p.started_seq, self._call_of(j, None, p), (
                f"tool {p.tool!r} is no longer in the agent: the read was not made again"))])
            return True
        if tool is None:
            return self._verdict(j, p, "unknown", reason=f"tool {p.tool!r} is not registered")
        if self._asks_peers(tool) and self._done_in_scope(j, p):
            return True
        if tool.reconcile is not None:
            evidence = yield from self._look_up(tool, p)
            return (yield from self._apply_evidence(j, tool, p, evidence))
        if tool.effect in (Effect.READ_ONLY, Effect.IDEMPOTENT):
            if blocked := self._retry_blocked(tool, p) or self._args_lost(j, tool, p):
                return self._verdict(j, p, "unknown", reason=blocked)
            self._verdict(j, p, "retry", staged=True,
                          reason=f"{tool.effect} tool: retry with the same key")
            return (yield from self._execute(j, [(self._call_of(j, tool, p), tool, p.key)]))
        return False  # reversible / irreversible with no lookup: a person decides

    @staticmethod
    def _look_up(tool: Tool, p: PendingCall) -> Steps[Any]:
        try:
            return (yield LookUp(tool, p))
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
                                origin=other.where, not_kept_why=other.done.error)
        found_at: dict[str, Any] = {"from": other.where}  # this run's start, their effect
        return self._verdict(j, p, "found", evidence=self._evidence(other.done.result),
                             then=self._guarded(j, [done]), **found_at)

    def _apply_evidence(self, j: RunJournal, tool: Tool, p: PendingCall,
                        evidence: Any) -> Steps[bool]:
        match evidence:
            case Found(result=result):
                # The verdict and the completion in one batch: between them a crash
                # would leave the call settled but not completed, and it would run again.
                # The verdict closes the start first, so the completion carries the args.
                done = self._completion(p.started_seq, self._call_of(j, None, p), p.key, result,
                                        source="reconciliation", args=p.args)
                self._verdict(j, p, "found", evidence=self._evidence(result),
                              then=self._guarded(j, [done]))
                return True
            case Absent(final=True):
                if blocked := self._retry_blocked(tool, p) or self._args_lost(j, tool, p):
                    return self._verdict(j, p, "unknown", reason=blocked)
                self._verdict(j, p, "absent", staged=True)
                return (yield from self._execute(j, [(self._call_of(j, tool, p), tool, p.key)]))
            case Absent():
                return self._verdict(j, p, "unknown", reason="absent now, but may still commit")
            case Conflict(found=found):
                escalation = {"reason": "conflicting effect found at the receiver",
                              "key": p.key, "tool": p.tool, "ours": p.args,
                              "theirs": self._evidence(found),
                              "started_at": p.started_at.isoformat()}
                return self._verdict(j, p, "conflict", evidence=self._evidence(found),
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
                 elsewhere: Elsewhere | None = None, staged: bool = False,
                 **detail: Any) -> bool:
        """Record the verdict on ``p``, with the facts that must come with it, atomically.

        ``elsewhere``: ``p`` is another run's call, judged here (that run's log has its
        own writer), so the verdict closes no start of this run (started_seq null) and
        names where the call is (``from``). ``staged``: stored with the next append, the
        start of the call made again (one sync for both; lost with it, the verdict is
        reached again from the same evidence)."""
        if elsewhere is not None:
            detail["from"] = elsewhere.where
        (j.stage if staged else j.record_all)([(E.TOOL_CALL_RECONCILED, {
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

    @staticmethod
    def _pause(j: RunJournal, reason: str) -> None:
        if j.state.status != "running":
            return  # escalated or waiting: that already says why it stopped
        uncertain = uncertain_of(j.state)
        j.record(E.RUN_PAUSED, reason=reason, uncertain=uncertain)
        METRICS.count("uncertain_handed_to_a_person", len(uncertain))

    # --- effects belong to the scope, not to one log -----------------------------------
    #
    # A fork keeps its origin's scope and another run of one operation shares it, so
    # both compute the same key for the same action; the world does not fork with the
    # log. Before making an effect, a run asks the other runs of its scope (peers.py),
    # or, while it knows of none, appends the start on condition that none exists.
    # The window that remains: two live runs of one scope reaching the same key at the
    # same instant both find it untouched and both make the call (or one finds the
    # other's start a moment before its effect lands and its lookup says "absent").
    # Only the receiver, deduplicating on the key both send, closes that window.

    def _clear_in_scope(self, j: RunJournal, call: ToolCall, tool: Tool,
                        key: str) -> Steps[bool]:
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
        return (yield from self._settle_elsewhere(j, call, tool, other, other.started))

    def _serve_from_scope(self, j: RunJournal, call: ToolCall, tool: Tool, key: str,
                          other: Elsewhere, done: CompletedCall) -> None:
        if not same_intent(done.args, j.as_recorded(call.args)):
            self._deny(j, call, key, changed_intent(tool, done.args, call.args, other.run_id))
            return
        # A completion here (not a served copy): later calls and forks of this run
        # find the key done in this log, and it says where the effect was made.
        j.record_all(self._guarded(j, [self._completion(
            None, call, key, done.result, source="scope", args=done.args, origin=other.where,
            not_kept_why=done.error)]))

    def _settle_elsewhere(self, j: RunJournal, call: ToolCall, tool: Tool, other: Elsewhere,
                          p: PendingCall) -> Steps[bool]:
        """Another run started this call and never completed it: uncertain here too.
        The usual rules decide; True only when this run may now make the call itself."""
        if tool.reconcile is not None:
            evidence = yield from self._look_up(tool, p)
            return self._evidence_elsewhere(j, call, tool, other, p, evidence)
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
                self._verdict(j, p, "found", elsewhere=other, evidence=self._evidence(result),
                              then=self._guarded(j, [done]))
                return False
            case Found(result=result):
                self._verdict(j, p, "found", elsewhere=other, evidence=self._evidence(result))
                self._deny(j, call, p.key, changed_intent(tool, p.args, call.args, other.run_id))
                return False
            case Absent(final=True) if not self._retry_blocked(tool, p):
                return self._verdict(j, p, "absent", elsewhere=other)
            case Conflict(found=found):
                escalation = {
                    "reason": f"conflicting effect found at the receiver for a call run "
                              f"{other.run_id!r} left uncertain: settle it there (agentjournal "
                              f"resolve {other.run_id} {p.key[:16]} ...), then resume this run",
                    "key": p.key, "tool": p.tool, "ours": p.args, "theirs": self._evidence(found),
                    "started_at": p.started_at.isoformat(), "from": other.where}
                self._verdict(j, p, "conflict", elsewhere=other, evidence=self._evidence(found),
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
