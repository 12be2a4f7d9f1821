"""Layer 2: a run's state, and the pure fold that derives it from the log.

``fold`` is the definition of what a run's state means. Every event type
either has a rule in ``FOLD_RULES`` or is listed in ``RECORD_ONLY``; a test
keeps the two sets exact. The live loop applies the same rules one event at a
time (``apply``), so a resumed run holds exactly the state the live run held.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, MutableMapping
from datetime import datetime
from typing import Any, Literal

import msgspec

from .errors import UnknownEventTypeError
from .events import Event, EventType, render

#: Bumped whenever a fold rule or the state's shape changes (snapshots record it).
#: v3: completed calls keep their arguments; the seqs of the last escalation and
#: of the last decision a person made. v4: a completion whose result could not be
#: kept says why (``CompletedCall.error``); payloads may carry ``redactions``.
#: v5: instructions; an assistant message keeps its provider's items; usage counts
#: cache writes and reasoning tokens; a model call in flight; failed model attempts;
#: a run_resumed a person recorded (a requeue) is a decision. v6: sagas (``saga``,
#: statuses compensating and compensated); observations with a freshness, re-read or
#: marked stale (``observations``); status cancelled; workspace checkpoints
#: (``workspace``; a change made while the run was down, or a restore, is told to the
#: model, after the results of the calls it awaits: ``notes``). v7: a drift the workspace
#: guards kept from being compared is told to the model too. v8: a freshness check made
#: for a call about to run (``for_call``) is told to the model too, after the results; a
#: tool call may stand in for arguments over the size limit (``ToolCall.too_large``);
#: a turn whose price was unknown (cost None) is counted in ``unpriced_turns``, not
#: summed as $0. v9: the trace context a run_started / run_resumed records (``trace``).
#: v10: a finished run's run_resumed with ``reopened`` (a LangGraph thread given new
#: input) runs it again.
#: v11: a conversation session's items (``session``: added, popped, cleared).
#: v12: the agent versions that started and continued the run (``versions``).
FOLD_VERSION = 12

Trust = Literal["user", "assistant", "tool", "untrusted"]
Status = Literal["new", "running", "waiting_approval", "paused", "escalated", "finished",
                 "cancelled", "compensating", "compensated"]


# gc=False on the structs a run holds by the thousand (events, messages, calls): each is
# a tree of JSON data that never takes part in a reference cycle, so the cyclic GC need
# not track them. Resuming a run of 10k events took 55 ms, 22 of them in one collection
# of what the load had made; now 32 ms.


class ToolCall(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, gc=False):
    """A tool call as the model asked for it. ``id`` is the model's, never part of a key."""

    id: str
    name: str
    args: dict[str, Any] = msgspec.field(default_factory=dict)
    #: What the model sent when it was not a JSON object (``args`` is then empty).
    raw_arguments: str | None = None
    #: Bytes of arguments over the run's limit, not kept (``args`` is then empty): the
    #: call is denied, never made with the empty arguments (limits.py).
    too_large: int | None = None


class Message(msgspec.Struct, kw_only=True, gc=False):
    role: Literal["user", "assistant", "tool"]
    content: str
    trust: Trust
    seq: int  # the event that produced this message
    # Tuples: most messages have neither, and an empty tuple is one shared object the
    # cyclic GC does not track (an empty list per message was 40k tracked lists in a
    # resumed run of 10k steps).
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None
    is_error: bool = False
    provider: str | None = None  # for an assistant message: who wrote it
    items: tuple[dict[str, Any], ...] = ()  # its opaque items


class Usage(msgspec.Struct, kw_only=True, gc=False):
    """Tokens by one convention (OpenAI's): ``input_tokens`` includes cache reads
    (``cached_input_tokens``) and cache writes; ``output_tokens`` includes reasoning."""

    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    #: USD. In a turn: None when the model's price was unknown (never a false $0). In a
    #: run's total: the sum of the turns that had a price (``RunState.unpriced_turns``
    #: counts the others).
    cost_usd: float | None = 0.0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0


class PendingCall(msgspec.Struct, kw_only=True, gc=False):
    """A tool call started and not yet completed: in flight, or uncertain after a crash."""

    started_seq: int
    key: str
    tool: str
    args: dict[str, Any]
    call_id: str
    effect: str
    attempt: int
    started_at: datetime
    last_error: str | None = None


class CompletedCall(msgspec.Struct, kw_only=True, gc=False):
    result: Any
    seq: int
    source: str = "tool"  # "tool", "reconciliation", "person" or "scope" (another run's)
    #: The arguments of the call that took effect: the same key with other arguments
    #: is another intent, never answered with this result. None only for a completion
    #: settled by a verdict in a log written before they were recorded.
    args: dict[str, Any] | None = None
    #: Why the result was not kept (it had no JSON form); the call happened all the same.
    error: str | None = None


class Approval(msgspec.Struct, kw_only=True):
    approval_id: str
    key: str
    tool: str
    args: dict[str, Any]
    reason: str
    requested_seq: int
    requested_at: datetime


class ApprovalDecision(msgspec.Struct, kw_only=True):
    approved: bool
    key: str
    args: dict[str, Any]  # the exact call approved: a changed call is refused
    by: str
    reason: str
    seq: int
    decided_at: datetime


class GuardrailHit(msgspec.Struct, kw_only=True):
    name: str
    action: Literal["flag", "redact"]
    severity: str
    seq: int
    message_index: int | None = None


class Observation(msgspec.Struct, kw_only=True):
    """A tool result in the model's context that holds for ``fresh_for`` seconds."""

    call_id: str
    tool: str
    args: dict[str, Any]
    key: str | None
    seq: int  # the event that last observed it
    at: datetime
    fresh_for: float


class WorkspaceVersion(msgspec.Struct, kw_only=True):
    """Where the run's files live, and the checkpoint they were last recorded at."""

    directory: str
    shadow: str
    commit: str | None  # None: the last checkpoint was skipped (a guard)
    seq: int


class PlannedUndo(msgspec.Struct, kw_only=True):
    """One effect a saga undoes: the completion it undoes, and the undo's own key."""

    effect_seq: int  # the completion of the effect
    key: str  # the effect's idempotency key
    undo_key: str  # the compensation's: derived from the effect's
    tool: str


class Saga(msgspec.Struct, kw_only=True):
    """A run's compensation: its plan (newest effect first), and how far it got.

    An effect is undone when its ``undo_key`` is in the run's ``completed``."""

    seq: int
    by: str
    reason: str
    through_seq: int
    plan: list[PlannedUndo]
    #: The newest effect in the span that cannot be compensated: the saga stops there.
    blocked: dict[str, Any] | None = None
    failures: dict[str, str] = msgspec.field(default_factory=dict)  # undo_key -> last error
    finished_seq: int = 0


class RunState(msgspec.Struct, kw_only=True):
    run_id: str = ""
    status: Status = "new"
    outcome: Any = None
    task: str = ""
    instructions: str | None = None  # the system prompt, as last recorded
    scope: str = ""
    origin: dict[str, Any] | None = None
    agent: str | None = None  # "module:object" of the agent that runs it, if known
    #: The agent versions that started the run and then continued it, in order (each
    #: once in a row): run_started's and run_resumed's ``agent_version``.
    versions: list[str] = msgspec.field(default_factory=list)
    started_at: datetime | None = None
    last_seq: int = 0
    messages: list[Message] = msgspec.field(default_factory=list)
    turns: int = 0
    usage: Usage = msgspec.field(default_factory=Usage)
    unpriced_turns: int = 0  # turns whose cost is unknown: not in usage.cost_usd
    #: A dict, except in a journal's state resumed from a snapshot: there it and
    #: ``attempts`` decode the snapshot's segments when a lookup needs one (keyed.py).
    #: To encode such a state, pass ``enc_hook=plain`` (below) or ``snapshots.settle`` it.
    completed: MutableMapping[str, CompletedCall] = msgspec.field(default_factory=dict)
    pending: dict[int, PendingCall] = msgspec.field(default_factory=dict)
    awaiting: dict[str, ToolCall] = msgspec.field(default_factory=dict)
    attempts: MutableMapping[str, int] = msgspec.field(default_factory=dict)
    approvals: dict[str, Approval] = msgspec.field(default_factory=dict)
    decisions: dict[str, ApprovalDecision] = msgspec.field(default_factory=dict)
    guardrails: list[GuardrailHit] = msgspec.field(default_factory=list)
    memory: dict[str, Any] = msgspec.field(default_factory=dict)
    compactions: int = 0
    tool_calls: int = 0
    resumes: int = 0
    pause_reason: str | None = None
    escalation: dict[str, Any] | None = None
    #: A model call left running at the provider (background mode): its id, turn, seq.
    model_call: dict[str, Any] | None = None
    model_failures: int = 0  # failed model attempts, each recorded
    escalated_seq: int = 0  # the last run_escalated
    decided_seq: int = 0  # the last decision a person recorded (approval or verdict)
    saga: Saga | None = None  # set once the run is being compensated
    #: Results of tools that declared ``fresh_for``, by call id, while they may still be
    #: re-read or marked stale (tools.py; steps.py ``_refresh``).
    observations: dict[str, Observation] = msgspec.field(default_factory=dict)
    workspace: WorkspaceVersion | None = None
    #: Messages for the model that wait until it has every result it awaits.
    notes: list[Message] = msgspec.field(default_factory=list)
    #: The trace context (W3C ``traceparent``) of the newest process segment that
    #: recorded one in its run_started / run_resumed: the next segment's span links to
    #: it across a crash (otel.py). None when no tracer was attached.
    trace: dict[str, str] | None = None
    #: A conversation session's items, oldest first (an OpenAI Agents SDK session kept
    #: in this log); None for a log that never held one.
    session: list[dict[str, Any]] | None = None

    @property
    def waits_for_a_person(self) -> bool:
        """Escalated, and no person has decided anything since: opening it again
        could only repeat the lookup and the escalation."""
        return self.status == "escalated" and self.decided_seq < self.escalated_seq

    @property
    def uncertain(self) -> dict[str, PendingCall]:
        """Calls started without a completion, by idempotency key.

        While a run is live this is the call in flight; after a crash every
        entry is a call whose effect may or may not have happened.
        """
        return {p.key: p for p in self.pending.values()}

    @property
    def cost_usd(self) -> float:
        """What the turns with a known price cost (see ``unpriced_turns``)."""
        return self.usage.cost_usd or 0.0

    @property
    def pending_approvals(self) -> dict[str, Approval]:
        return self.approvals

    def copy(self) -> RunState:
        return msgspec.json.decode(msgspec.json.encode(self, enc_hook=plain), type=RunState)


def plain(value: Any) -> Any:
    """An ``enc_hook`` for msgspec that encodes a resumed run's lazy maps (keyed.py) as
    the dicts they stand for."""
    if isinstance(value, Mapping):
        return dict(value.items())
    raise TypeError(f"Encoding objects of type {type(value).__name__} is unsupported")


def durable_fields(state: RunState) -> dict[str, Any]:
    """The fields a resumed run relies on, in a form stable across releases.

    Snapshot+tail must equal full replay on every one of these; permanent
    fixtures record them at every seq.
    """
    return {
        "status": state.status,
        "outcome": state.outcome,
        "scope": state.scope,  # keys are computed from it
        "attempts": dict(sorted(state.attempts.items())),
        "turns": state.turns,
        "input_tokens": state.usage.input_tokens,
        "output_tokens": state.usage.output_tokens,
        "cost_usd": round(state.cost_usd, 9),
        "completed": {k: c.result for k, c in sorted(state.completed.items())},
        "uncertain": sorted(p.key for p in state.pending.values()),
        "approvals": sorted(state.approvals),
        "decisions": {k: d.approved for k, d in sorted(state.decisions.items())},
        "messages": [[m.role, m.trust, m.content] for m in state.messages],
        "compactions": state.compactions,
        "memory": dict(sorted(state.memory.items())),
        "completed_args": {k: c.args for k, c in sorted(state.completed.items())},
        "waits_for_a_person": state.waits_for_a_person,
        "instructions": state.instructions,
        "model_call": state.model_call,
        "model_failures": state.model_failures,
        "usage": msgspec.to_builtins(state.usage),
        **({"unpriced_turns": state.unpriced_turns} if state.unpriced_turns else {}),
        # Only a compensated run has one: the fields fixtures recorded before stay as they were.
        **({"saga": msgspec.to_builtins(state.saga)} if state.saga is not None else {}),
        **({"observations": msgspec.to_builtins(state.observations)}
           if state.observations else {}),
        **({"workspace": msgspec.to_builtins(state.workspace)} if state.workspace else {}),
        **({"notes": msgspec.to_builtins(state.notes)} if state.notes else {}),
        **({"trace": state.trace} if state.trace else {}),
        **({"session": state.session} if state.session is not None else {}),
    }


# --- fold rules: one function per state-changing event type --------------------


def _run_started(st: RunState, ev: Event) -> None:
    p = ev.payload
    st.run_id = ev.run_id
    st.status = "running"
    st.task = p.get("task", "")
    st.scope = p.get("scope") or f"run:{ev.run_id}"
    st.origin = p.get("origin")
    st.instructions = p.get("instructions")
    st.agent = p.get("agent")
    st.versions = [p["agent_version"]] if p.get("agent_version") else []
    st.started_at = ev.ts
    st.trace = p.get("trace", st.trace)


def _user_message(st: RunState, ev: Event) -> None:
    p = ev.payload
    st.messages.append(
        Message(role="user", content=p["content"], trust=p.get("trust", "user"), seq=ev.seq)
    )


def _model_turn(st: RunState, ev: Event) -> None:
    p = ev.payload
    calls = tuple(ToolCall(id=c["id"], name=c["name"], args=c.get("args") or {},
                           raw_arguments=c.get("raw_arguments"), too_large=c.get("too_large"))
                  for c in p.get("tool_calls", ()))
    st.messages.append(
        Message(
            role="assistant", content=p.get("text", ""), trust="assistant", seq=ev.seq,
            tool_calls=calls, provider=p.get("provider"), items=tuple(p.get("items") or ()),
        )
    )
    st.awaiting = {c.id: c for c in calls}
    st.turns += 1
    st.model_call = None  # answered
    if usage := p.get("usage"):
        u, get = st.usage, usage.get
        u.input_tokens += get("input_tokens", 0)
        u.output_tokens += get("output_tokens", 0)
        u.cached_input_tokens += get("cached_input_tokens", 0)
        u.cache_write_tokens += get("cache_write_tokens", 0)
        u.reasoning_tokens += get("reasoning_tokens", 0)
        cost = get("cost_usd", 0.0)
        if cost is None:  # the model's price was unknown: not a free turn
            st.unpriced_turns += 1
        else:
            u.cost_usd = (u.cost_usd or 0.0) + cost


def _model_call_started(st: RunState, ev: Event) -> None:
    # Background mode: the provider holds the call; a resumed run collects it by id.
    p = ev.payload
    st.model_call = {"handle": p["handle"], "provider": p.get("provider"),
                     "turn": p.get("turn", st.turns), "seq": ev.seq}


def _model_call_failed(st: RunState, ev: Event) -> None:
    st.model_failures += 1
    if ev.payload.get("lost"):  # the provider no longer has the call: ask anew
        st.model_call = None


def _instructions_changed(st: RunState, ev: Event) -> None:
    st.instructions = ev.payload.get("instructions")


def _tool_call_started(st: RunState, ev: Event) -> None:
    p = ev.payload
    st.pending[ev.seq] = PendingCall(
        started_seq=ev.seq, key=p["key"], tool=p["tool"], args=p.get("args", {}),
        call_id=p.get("call_id", ""), effect=p.get("effect", "irreversible"),
        attempt=p.get("attempt", 1), started_at=ev.ts,
    )
    st.attempts[p["key"]] = st.attempts.get(p["key"], 0) + 1
    st.tool_calls += 1


def _tool_message(st: RunState, ev: Event, content: str, is_error: bool) -> None:
    # A tool message answers the model's call: it is no longer awaited.
    p = ev.payload
    st.awaiting.pop(p.get("call_id", ""), None)
    st.messages.append(
        Message(
            role="tool", content=content, trust=p.get("trust", "tool"), seq=ev.seq,
            tool_call_id=p.get("call_id"), name=p.get("tool"), is_error=is_error,
        )
    )
    if st.notes and not st.awaiting:  # every result is in: what waited may follow
        st.messages.extend(st.notes)
        st.notes.clear()


def _tell(st: RunState, message: Message) -> None:
    """A note for the model: now, or after the results of the calls it awaits (a
    message between a turn's calls and their results would break every provider)."""
    (st.notes if st.awaiting else st.messages).append(message)


def _tool_call_completed(st: RunState, ev: Event) -> None:
    # A completion is both an observation (the tool message the model sees)
    # and, only when it carries an idempotency key, a deduplication fact. A
    # proven failure carries no key, so it may be attempted again.
    # Its arguments are the start's; a completion whose start was already settled
    # by a verdict, or that was made by another run of the scope, carries them.
    p = ev.payload
    started = st.pending.pop(p["started_seq"], None) if p.get("started_seq") is not None else None
    is_error = bool(p.get("is_error", False))
    content = p.get("content")
    _tool_message(st, ev, render(p.get("result")) if content is None else content, is_error)
    args = p.get("args", started.args if started else None)
    if key := p.get("idempotency_key"):
        st.completed[key] = CompletedCall(
            result=p.get("result"), seq=ev.seq, source=p.get("source", "tool"), args=args,
            error=p.get("encoding_error"),
        )
    if p.get("fresh_for") is not None and not is_error:
        st.observations[p["call_id"]] = Observation(
            call_id=p["call_id"], tool=p["tool"], args=args or {}, key=key, seq=ev.seq,
            at=ev.ts, fresh_for=p["fresh_for"])


def _tool_call_uncertain(st: RunState, ev: Event) -> None:
    pending = st.pending.get(ev.payload["started_seq"])
    if pending is not None:
        pending.last_error = ev.payload.get("error")


#: Verdicts that settle an uncertain call: it happened (a completion follows),
#: it provably did not, or the receiver dedupes so a retry with the same key
#: is safe. "conflict" and "unknown" leave it uncertain for a person.
SETTLING_VERDICTS = frozenset({"found", "absent", "retry"})


def _tool_call_reconciled(st: RunState, ev: Event) -> None:
    # started_seq is None for a verdict on a call another run of the scope left uncertain.
    if ev.payload["verdict"] in SETTLING_VERDICTS and ev.payload["started_seq"] is not None:
        st.pending.pop(ev.payload["started_seq"], None)
    if ev.payload.get("by", "agentjournal") != "agentjournal":
        st.decided_seq = ev.seq  # a person's verdict


def _tool_result_served(st: RunState, ev: Event) -> None:
    # The model asked again for a call already completed: it sees the stored
    # result, and the tool is not called.
    p = ev.payload
    content = p.get("content")
    _tool_message(st, ev, render(p.get("result")) if content is None else content, False)


def _tool_call_denied(st: RunState, ev: Event) -> None:
    p = ev.payload
    _tool_message(st, ev, f"denied: {p.get('reason', '')}", True)


def _approval_requested(st: RunState, ev: Event) -> None:
    p = ev.payload
    st.approvals[p["approval_id"]] = Approval(
        approval_id=p["approval_id"], key=p["key"], tool=p["tool"], args=p.get("args", {}),
        reason=p.get("reason", ""), requested_seq=ev.seq, requested_at=ev.ts,
    )
    st.status = "waiting_approval"


def _approval_decided(st: RunState, ev: Event) -> None:
    p = ev.payload
    asked = st.approvals.pop(p["approval_id"], None)
    st.decided_seq = ev.seq
    st.decisions[p["approval_id"]] = ApprovalDecision(
        approved=bool(p["approved"]), key=asked.key if asked else "",
        args=asked.args if asked else {}, by=p.get("by", ""), reason=p.get("reason", ""),
        seq=ev.seq, decided_at=ev.ts,
    )
    if not st.approvals and st.status == "waiting_approval":
        st.status = "running"


def _guardrail_triggered(st: RunState, ev: Event) -> None:
    p = ev.payload
    index = p.get("message_index")
    st.guardrails.append(
        GuardrailHit(
            name=p.get("name", ""), action=p["action"], severity=p.get("severity", "warn"),
            seq=ev.seq, message_index=index,
        )
    )
    if p["action"] == "redact" and index is not None and 0 <= index < len(st.messages):
        # Replace, never mutate: a Message object may be shared with a copy.
        redacted = p.get("replacement", "[redacted]")
        st.messages[index] = msgspec.structs.replace(st.messages[index], content=redacted)


def _context_compacted(st: RunState, ev: Event) -> None:
    # Replace the discarded span with the live run's exact summary, so a
    # resumed run sees the context the live run had, not the full history.
    p = ev.payload
    kept = int(p.get("kept", 0))
    head = st.messages[:1]
    tail = st.messages[max(1, len(st.messages) - kept):] if kept else []
    summary = Message(role="user", content=p["summary"], trust="untrusted", seq=ev.seq)
    st.messages = [*head, summary, *tail]
    st.compactions += 1


def _memory_written(st: RunState, ev: Event) -> None:
    st.memory[ev.payload["key"]] = ev.payload.get("value")


def _run_resumed(st: RunState, ev: Event) -> None:
    # Recovery runs again on every open, so a paused or escalated run is
    # live again; it pauses again if nothing new settles its calls. One a person
    # recorded (``by``: a requeue) is their decision to go on.
    st.resumes += 1
    st.trace = ev.payload.get("trace", st.trace)
    version = ev.payload.get("agent_version")
    if version and (not st.versions or st.versions[-1] != version):
        st.versions.append(version)
    if ev.payload.get("by"):
        st.decided_seq = ev.seq
    if st.status == "finished" and ev.payload.get("reopened"):
        st.status = "running"  # a finished run given new input (a LangGraph thread): fold v10
    elif st.status in ("paused", "escalated", "new"):
        # A run being compensated goes on with its saga, never with its loop.
        st.status = "compensating" if st.saga is not None else "running"
        st.pause_reason = None


def _run_paused(st: RunState, ev: Event) -> None:
    st.status = "paused"
    st.pause_reason = ev.payload.get("reason", "")


def _run_escalated(st: RunState, ev: Event) -> None:
    st.status = "escalated"
    st.escalation = dict(ev.payload)
    st.escalated_seq = ev.seq


def _run_finished(st: RunState, ev: Event) -> None:
    st.status = "finished"
    st.outcome = ev.payload.get("outcome")


def _run_cancelled(st: RunState, ev: Event) -> None:
    st.status = "cancelled"  # its loop never runs again; a saga may still undo it
    st.approvals.clear()  # nothing will make the calls they would clear
    st.decided_seq = ev.seq
    st.outcome = f"cancelled by {ev.payload.get('by', '')}: {ev.payload.get('reason', '')}"


def _saga_started(st: RunState, ev: Event) -> None:
    p = ev.payload
    st.saga = Saga(seq=ev.seq, by=p.get("by", ""), reason=p.get("reason", ""),
                   through_seq=p.get("through_seq", 0),
                   plan=[PlannedUndo(**u) for u in p.get("plan", ())], blocked=p.get("blocked"))
    st.status = "compensating"  # the loop never drives this run again
    st.pause_reason = None


def _compensation_started(st: RunState, ev: Event) -> None:
    p = ev.payload
    st.pending[ev.seq] = PendingCall(
        started_seq=ev.seq, key=p["key"], tool=p["tool"], args=p.get("args", {}),
        call_id=f"undo-{p['effect_seq']}", effect="compensation",
        attempt=p.get("attempt", 1), started_at=ev.ts,
    )
    st.attempts[p["key"]] = st.attempts.get(p["key"], 0) + 1
    st.status = "compensating"  # going on after an escalation a person decided


def _compensation_completed(st: RunState, ev: Event) -> None:
    # Like a tool's completion, but no message: the model never reads a saga.
    p = ev.payload
    started = st.pending.pop(p["started_seq"], None)
    if p.get("error") is not None:
        if st.saga is not None:
            st.saga.failures[p["key"]] = p["error"]
        return
    st.completed[p["key"]] = CompletedCall(
        result=p.get("result"), seq=ev.seq, source=p.get("source", "tool"),
        args=p.get("args", started.args if started else None))


def _saga_finished(st: RunState, ev: Event) -> None:
    if st.saga is not None:
        st.saga.finished_seq = ev.seq
    st.status = "compensated"


def _observations_checked(st: RunState, ev: Event) -> None:
    # Each item supersedes its result in the context (re-read) or says it may no longer
    # hold (stale); one note tells the model what it read then, what holds now and how
    # old it was, before its next turn (after the results it awaits, as every note).
    lines = []
    for item in ev.payload.get("items", ()):
        at = _tool_result(st, item["call_id"])
        label = (f"{item['tool']}({render(item.get('args', {}))}), observed "
                 f"{_age(item['age_s'])} ago")
        obs = st.observations.get(item["call_id"])
        if item["verdict"] in ("changed", "unchanged") and at is not None:
            seen, new = st.messages[at], render(item.get("result"))
            lines.append(f"{label}, was re-read: changed from {seen.content} to {new}"
                         if item["verdict"] == "changed" else f"{label}, was re-read: unchanged")
            # Replaced, never changed in place: a snapshot's segments go by identity.
            st.messages[at] = msgspec.structs.replace(seen, content=new)
            if obs is not None:
                obs.seq, obs.at = ev.seq, ev.ts
                # A later identical call is served the new one.
                if obs.key is not None and obs.key in st.completed:
                    st.completed[obs.key] = msgspec.structs.replace(
                        st.completed[obs.key], result=item.get("result"))
        else:
            lines.append(f"{label}, may no longer hold: {item.get('why', 'not re-read')}")
            st.observations.pop(item["call_id"], None)
    if not lines or (st.awaiting and "for_call" not in ev.payload):
        return  # a check for a call, written before fold v8: only its denial told the model
    _tell(st, Message(role="user", trust=ev.payload.get("trust", "tool"), seq=ev.seq,
                      content="The world since this run last looked:\n" + "\n".join(
                          f"- {line}" for line in lines)))


def _workspace_checkpoint(st: RunState, ev: Event) -> None:
    p = ev.payload
    before = st.workspace
    st.workspace = WorkspaceVersion(
        directory=p.get("directory", before.directory if before else ""),
        shadow=p.get("shadow", before.shadow if before else ""),
        commit=p.get("commit"), seq=ev.seq)
    cause, count = p.get("cause"), p.get("count", 0)
    shown = ", ".join(p.get("changed", ())) + (" ..." if count > len(p.get("changed", ()))
                                              else "")
    if cause == "drift" and p.get("skipped"):
        _tell(st, Message(role="user", trust="tool", seq=ev.seq, content=(
            "While this run was stopped, its workspace could not be compared with its last "
            f"recorded version ({p['skipped']}): any file in it may have changed. Read "
            "again what you rely on before relying on what you knew.")))
    elif cause == "drift" and count:
        _tell(st, Message(role="user", trust="tool", seq=ev.seq, content=(
            f"While this run was stopped, {count} file(s) in the workspace changed since "
            "its last recorded version (by someone else, or by calls of this run whose "
            f"results were lost when it stopped): {shown}. Read them again before relying "
            "on what you knew.")))
    elif cause == "restore":
        _tell(st, Message(role="user", trust="tool", seq=ev.seq, content=(
            f"The workspace was restored by {p.get('by', 'a person')} to its version at "
            f"seq {p.get('restored_seq')}; {count} file(s) changed: {shown}.")))


def _session_items_added(st: RunState, ev: Event) -> None:
    # One batch of items, added whole: the event is the atomic unit.
    if st.session is None:
        st.session = []
    st.session.extend(ev.payload.get("items", ()))


def _session_item_popped(st: RunState, ev: Event) -> None:
    # Recorded, never deleted: the item stays in the log, the session no longer holds it.
    items, index = st.session, ev.payload.get("index", -1)
    if items is not None and 0 <= index < len(items):
        del items[index]


def _session_cleared(st: RunState, ev: Event) -> None:
    st.session = []


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.1f} s"


def _tool_result(st: RunState, call_id: str) -> int | None:
    """Where the result of call ``call_id`` is in the messages (the latest), if there."""
    return next((i for i in range(len(st.messages) - 1, -1, -1)
                 if st.messages[i].role == "tool" and st.messages[i].tool_call_id == call_id),
                None)


Rule = Callable[[RunState, Event], None]

FOLD_RULES: dict[EventType, Rule] = {
    EventType.RUN_STARTED: _run_started,
    EventType.USER_MESSAGE: _user_message,
    EventType.MODEL_TURN: _model_turn,
    EventType.MODEL_CALL_STARTED: _model_call_started,
    EventType.MODEL_CALL_FAILED: _model_call_failed,
    EventType.INSTRUCTIONS_CHANGED: _instructions_changed,
    EventType.TOOL_CALL_STARTED: _tool_call_started,
    EventType.TOOL_CALL_COMPLETED: _tool_call_completed,
    EventType.TOOL_CALL_UNCERTAIN: _tool_call_uncertain,
    EventType.TOOL_CALL_RECONCILED: _tool_call_reconciled,
    EventType.TOOL_CALL_DENIED: _tool_call_denied,
    EventType.TOOL_RESULT_SERVED: _tool_result_served,
    EventType.APPROVAL_REQUESTED: _approval_requested,
    EventType.APPROVAL_DECIDED: _approval_decided,
    EventType.GUARDRAIL_TRIGGERED: _guardrail_triggered,
    EventType.CONTEXT_COMPACTED: _context_compacted,
    EventType.MEMORY_WRITTEN: _memory_written,
    EventType.RUN_RESUMED: _run_resumed,
    EventType.RUN_PAUSED: _run_paused,
    EventType.RUN_ESCALATED: _run_escalated,
    EventType.RUN_FINISHED: _run_finished,
    EventType.SAGA_STARTED: _saga_started,
    EventType.COMPENSATION_STARTED: _compensation_started,
    EventType.COMPENSATION_COMPLETED: _compensation_completed,
    EventType.SAGA_FINISHED: _saga_finished,
    EventType.OBSERVATIONS_CHECKED: _observations_checked,
    EventType.RUN_CANCELLED: _run_cancelled,
    EventType.WORKSPACE_CHECKPOINT: _workspace_checkpoint,
    EventType.SESSION_ITEMS_ADDED: _session_items_added,
    EventType.SESSION_ITEM_POPPED: _session_item_popped,
    EventType.SESSION_CLEARED: _session_cleared,
}

#: Deliberate no-ops: facts kept for audit that change no state. A step_recorded is a
#: unit of a run another framework drives (bridge.py): only that framework reads it back.
RECORD_ONLY: frozenset[EventType] = frozenset({
    EventType.BUDGET_EXCEEDED, EventType.STEP_RECORDED,
    # A LangGraph thread's own records: the saver indexes them (integrations/_graphlog.py).
    EventType.GRAPH_INPUT, EventType.GRAPH_CHECKPOINT, EventType.GRAPH_WRITES,
    # A framework's trace spans are what it observed, for people; no run relies on them.
    EventType.TRACE_RECORDED,
    # A recorded turn served to a request the code now makes otherwise: the turn stands
    # (history is history); the change is kept for people (show, the viewer, check).
    EventType.REQUEST_CHANGED,
})


def apply(state: RunState, event: Event) -> RunState:
    """Apply one event to ``state`` in place (the live loop's path) and return it."""
    rule = FOLD_RULES.get(event.type)
    if rule is not None:
        rule(state, event)
    elif event.type not in RECORD_ONLY:
        raise UnknownEventTypeError(str(event.type))
    state.last_seq = event.seq
    return state


def fold(events: Iterable[Event], state: RunState | None = None) -> RunState:
    """The state after ``events``, starting from ``state`` (not modified) or empty."""
    st = RunState() if state is None else state.copy()
    for event in events:
        apply(st, event)
    return st
