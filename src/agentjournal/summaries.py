"""What a run is, in words and numbers, for a person: one place, below the CLI and the
viewer, so `agentjournal show` and the viewer's pages say the same thing the same way.

- an event in one line (``summary``, ``summaries``), with the tokens, cost and time of a
  model turn (``turn_usage``, ``count``, ``money``, ``span``);
- the versions a run went on under (``version_line``, ``latest_version``) and the recorded
  turns served to a request the code now makes otherwise (``request_changes``,
  ``request_change_line``);
- a run's status word and why (``status_word``, ``status_said``, ``is_stalled``), and
  where it stands for whoever would act on it (``standing_of``, ``decision_said``,
  ``open_call``);
- the gap between two lease epochs of a log (``lease_gap``): a kill, a wait, a decision.

Plain functions of events, states and leases: no terminal, no web page. Nothing here
imports the CLI (``agentjournal.cli``) or the viewer (``agentjournal.ui``), and nothing
here writes (tests/test_layers.py holds both).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from .continuation import was_interrupted
from .events import Event, EventType
from .fleet import QueuedRun
from .integrations._graphlog import summary as graph_summary
from .state import PendingCall, RunState
from .store import Lease, Store

E = EventType


# --- text and numbers, short --------------------------------------------------------------


def short(value: Any, width: int = 80) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def human_age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def money(cost: float | None) -> str:
    if cost is None:
        return "unknown price"
    return f"${cost:,.2f}" if cost >= 1 else f"${cost:.4g}"


def count(n: int) -> str:
    """A token count, short: 950, 12.3k, 4.1M."""
    for unit, size in (("M", 1_000_000), ("k", 1_000)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)


def span(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds:.2f} s" if seconds < 60 else human_age(seconds)


def turn_usage(payload: dict[str, Any]) -> str:
    """One turn's tokens, cost and latency: ``20 in (5 cached) / 7 out, $0.0001, 0.84 s``."""
    usage = payload.get("usage") or {}
    cached = usage.get("cached_input_tokens", 0)
    parts = [f"{count(usage.get('input_tokens', 0))} in"
             + (f" ({count(cached)} cached)" if cached else "")
             + f" / {count(usage.get('output_tokens', 0))} out",
             money(usage.get("cost_usd", 0.0))]
    if (latency := payload.get("latency_ms")) is not None:
        parts.append(span(latency / 1000))
    return ", ".join(parts)


# --- an event in one line -----------------------------------------------------------------


def summary(event: Event, then: Event | None = None) -> str:
    """One short line saying what ``event`` records (``then``: the event after it, which
    says whether a failed model attempt was retried or the run gave up)."""
    p = event.payload
    match event.type:
        case E.GRAPH_INPUT | E.GRAPH_CHECKPOINT | E.GRAPH_WRITES:
            return graph_summary(event)
        case E.RUN_STARTED if p.get("agent") == "langgraph":
            return f"LangGraph thread {short(p.get('thread_id', ''), 60)}"
        case E.RUN_STARTED:
            origin = p.get("origin")
            fork_note = f" [fork of {origin['run_id']}@{origin['at_seq']}]" if origin else ""
            return f"{short(p.get('task', ''))}{fork_note}"
        case E.USER_MESSAGE:
            return short(p.get("content", ""))
        case E.MODEL_TURN:
            asks = calls_line(p.get("tool_calls", []))
            said = " → ".join(filter(None, [short(p.get("text", ""), 60), asks]))
            who = " ".join(filter(None, [p.get("model"), p.get("finish_reason")]))
            # Usage first: it has a bounded width, so a narrow terminal cuts only the text.
            return f"{turn_usage(p)}: {said} [{who}]" if who else f"{turn_usage(p)}: {said}"
        case E.MODEL_CALL_STARTED:
            return f"turn {p.get('turn')} running at the provider as {p.get('handle')}"
        case E.MODEL_CALL_FAILED:
            error = short(p.get("error", ""), 90)
            return f"attempt {p.get('attempt')}: {error} ({_next_try(p, then)})"
        case E.INSTRUCTIONS_CHANGED:
            return f"instructions now: {short(p.get('instructions') or '')}"
        case E.TOOL_CALL_STARTED:
            return (f"{p['tool']} {p['key'][:12]} {short(p.get('args', {}), 60)} "
                    f"({p.get('effect')}, attempt {p.get('attempt', 1)})")
        case E.TOOL_CALL_COMPLETED:
            how = "error" if p.get("is_error") else p.get("source", "tool")
            shown = p["content"] if "content" in p else p.get("result")
            return f"{p.get('tool')} [{how}] {short(shown, 60)}"
        case E.TOOL_CALL_UNCERTAIN:
            return f"{p['key'][:12]} {short(p.get('error', ''))}"
        case E.TOOL_CALL_RECONCILED:
            why = f": {short(p['reason'], 60)}" if p.get("reason") else ""
            return f"{p['tool']} {p['key'][:12]} → {p['verdict']} (by {p.get('by')}){why}"
        case E.TOOL_RESULT_SERVED:
            return f"{p.get('tool')} served from seq {p.get('served_from_seq')}"
        case E.TOOL_CALL_DENIED:
            return f"{p.get('tool')}: {short(p.get('reason', ''))}"
        case E.APPROVAL_REQUESTED:
            return f"{p['approval_id']} {p['tool']} {short(p.get('args', {}), 60)}"
        case E.APPROVAL_DECIDED:
            verdict = "approved" if p.get("approved") else "denied"
            why = f": {short(p['reason'])}" if p.get("reason") else ""
            return f"{p['approval_id']} {verdict} by {p.get('by')}{why}"
        case E.BUDGET_EXCEEDED:
            return f"{p.get('budget')}: {p.get('used')} of {p.get('limit')}"
        case E.STEP_RECORDED:
            return f"{p.get('name')} #{p.get('n')}: {short(p.get('value'), 60)}"
        case E.REQUEST_CHANGED:
            return request_change_line(p)
        case E.RUN_RESUMED if p.get("agent_version"):
            said = short(p.get("reason") or p.get("name") or "")
            return " ".join(filter(None, [said, f"[version {p['agent_version']}]"]))
        case E.RUN_FINISHED:
            return short(p.get("outcome", ""))
        case E.WORKSPACE_CHECKPOINT:
            if p.get("skipped"):
                return f"{p.get('cause')}: not versioned: {short(p['skipped'], 80)}"
            files = ", ".join(p.get("changed", [])[:5]) + (" ..." if p.get("count", 0) > 5
                                                           else "")
            by = f" by {p['by']} to seq {p.get('restored_seq')}" if p.get("by") else ""
            return (f"{p.get('cause')}{by}: {str(p.get('commit'))[:12]}, "
                    f"{p.get('count', 0)} file(s) changed: {files}")
        case E.RUN_CANCELLED:
            why = f": {short(p['reason'], 80)}" if p.get("reason") else ""
            return f"by {p.get('by')}{why}"
        case E.SAGA_STARTED:
            stop = f", stops before {p['blocked']['tool']}" if p.get("blocked") else ""
            why = f": {short(p['reason'], 60)}" if p.get("reason") else ""
            return (f"undo {len(p.get('plan', []))} effect(s) after seq {p.get('through_seq', 0)}"
                    f"{stop} (by {p.get('by')}){why}")
        case E.COMPENSATION_STARTED:
            return (f"undo {p['tool']} seq {p['effect_seq']} {p['key'][:12]} "
                    f"(attempt {p.get('attempt', 1)})")
        case E.COMPENSATION_COMPLETED:
            if p.get("error") is not None:
                return f"undo of seq {p['effect_seq']} failed: {short(p['error'], 80)}"
            how = p.get("source", "tool")
            return f"seq {p['effect_seq']} undone [{how}] {short(p.get('result'), 60)}"
        case E.OBSERVATIONS_CHECKED:
            items = p.get("items", [])
            reread = [i for i in items if i["verdict"] in ("changed", "unchanged")]
            changed = sum(i["verdict"] == "changed" for i in reread)
            stale = ", ".join(f"{i['tool']} stale ({i['age_s']:.0f} s)" for i in items
                              if i["verdict"] == "stale")
            return (f"the world since: {len(reread)} re-read ({changed} changed)"
                    + (f"; {stale}" if stale else ""))
        case E.SESSION_ITEMS_ADDED:
            return session_items_line(p.get("items", []))
        case E.SESSION_ITEM_POPPED:
            return f"item {p.get('index')} popped (it stays in the log)"
        case E.SESSION_CLEARED:
            return f"{p.get('count', 0)} item(s) cleared"
        case E.TRACE_RECORDED:
            return trace_line(p.get("spans", []), p.get("dropped", 0))
        case E.SAGA_FINISHED:
            stands = p.get("blocked_stands")
            kept = f"; {stands['tool']} at seq {stands['effect_seq']} stands" if stands else ""
            return f"{p.get('undone', 0)} effect(s) undone{kept}"
    return short(p.get("reason") or p.get("name") or p.get("key") or "")


def calls_line(calls: Iterable[dict[str, Any]]) -> str:
    return ", ".join(f"{c.get('name')}({short(c.get('args', {}), 60)})" for c in calls)


def request_change_line(p: dict[str, Any]) -> str:
    """A recorded model turn served to a request the code now makes otherwise: which
    turn, and what changed (the turn stands: history is history)."""
    changed = ", ".join(str(c) for c in p.get("changed") or []) or "the request"
    turn = f" (seq {p['seq']})" if p.get("seq") else ""
    return (f"{p.get('step')} #{p.get('n')}: the recorded turn{turn} was served; "
            f"{changed} changed since it was asked")


def session_items_line(items: list[dict[str, Any]]) -> str:
    """A session batch: how many items, and what the first few are (role or type)."""
    kinds = ", ".join(str(i.get("role") or i.get("type") or "item") for i in items[:6])
    more = " ..." if len(items) > 6 else ""
    text = next((c for i in items if isinstance(c := i.get("content"), str) and c), "")
    return f"{len(items)} item(s): {kinds}{more}" + (f": {short(text, 60)}" if text else "")


def trace_line(spans: list[dict[str, Any]], dropped: int) -> str:
    """A framework's trace: its spans by kind with their time, and its errors."""
    kinds: dict[str, list[float]] = {}
    for s in spans:
        kinds.setdefault(str(s.get("kind")), []).append(float(s.get("ms") or 0))
    parts = [f"{len(ms)} {kind} ({sum(ms) / 1000:.2f} s)" for kind, ms in kinds.items()]
    errors = [f"{s.get('kind')} {s.get('name') or ''}: {s['error']}".replace(" :", ":")
              for s in spans if s.get("error")]
    return (f"{len(spans)} span(s): " + ", ".join(parts)
            + (f"; {dropped} dropped" if dropped else "")
            + (f"; errors: {short('; '.join(errors), 80)}" if errors else ""))


def _next_try(failure: dict[str, Any], then: Event | None) -> str:
    """What came of a failed model attempt: the pause recorded with the last one means
    the run gave up (a wait too long, or no attempts left), whatever the error was."""
    if then is not None and then.type == E.RUN_PAUSED:
        return "gave up: the run paused" if failure.get("retryable") or failure.get(
            "lost") else "not retryable: the run paused"
    if not (failure.get("retryable") or failure.get("lost")):
        return "not retryable"
    wait = f", retry after {failure['retry_after']:g}s" if failure.get("retry_after") else ""
    return f"retrying{wait}"


def summaries(events: Sequence[Event]) -> list[str]:
    """A summary per event, each knowing the event after it."""
    return [summary(e, events[i + 1] if i + 1 < len(events) else None)
            for i, e in enumerate(events)]


# --- versions, and turns served to a changed request --------------------------------------


def version_line(versions: Sequence[str]) -> str:
    """Which agent version started the run, and which continued it."""
    if not versions:
        return "agent version: none recorded (the run began before versions were recorded)"
    line = f"started by version {versions[0]}"
    return line + (f", continued by {', then '.join(versions[1:])}" if versions[1:] else "")


def latest_version(versions: Sequence[str]) -> str:
    """The version a run goes on under, and how many it has run under before."""
    if not versions:
        return "-"
    return versions[-1] + (f" (after {len(versions) - 1} other)" if len(versions) > 1 else "")


def request_changes(events: Iterable[Event]) -> list[dict[str, Any]]:
    """The request_changed events: recorded turns served to a changed request."""
    return [{**e.payload, "at_seq": e.seq} for e in events if e.type is E.REQUEST_CHANGED]


# --- a run's status word, and why ---------------------------------------------------------


def status_word(status: str, *, interrupted: bool, stalled: bool) -> str:
    """The status a person reads, in `runs` and `show` alike: "interrupted" (Ctrl-C
    paused it) and "stalled" (nobody drives a run recorded as running) say what --json
    says with their own fields."""
    return "interrupted" if interrupted else "stalled" if stalled else status


#: What "stalled" means, beside it in `show`.
STALLED = "recorded as running, but its lease lapsed and nothing drives it"


def status_said(state: RunState, *, stalled: bool = False) -> str:
    """The status word and why, as `show` heads a run: ``stalled (recorded as running,
    ...)``, ``paused (budget: ...)``; "interrupted" is its own reason (not said twice)."""
    interrupted = was_interrupted(state)
    why = (f" ({STALLED})" if stalled else f" ({state.pause_reason})"
           if state.status == "paused" and state.pause_reason and not interrupted else "")
    return status_word(state.status, interrupted=interrupted, stalled=stalled) + why


def is_stalled(store: Store, run_id: str, state: RunState,
               queued: QueuedRun | None) -> bool:
    """Recorded as running, yet nobody drives it: its lease lapsed or was let go (the
    process driving it was killed or stopped) and no worker of a queue will take it up.
    Read only for runs recorded as running: one lease read each."""
    if state.status not in ("running", "new") or (queued is not None
                                                   and queued.state != "done"):
        return False
    lease = store.holder(run_id)  # a log may lack run_started: state.run_id is then ''
    return lease is None or lease.expires_at <= time.time()


# --- where a run stands, for whoever would act on it --------------------------------------


#: Statuses that need nothing more from anyone.
DONE = frozenset({"finished", "cancelled", "compensated"})


#: Effects whose open call a resume hands to a person (settle.py): a retry could make
#: the effect twice. A read-only or idempotent one is retried by whoever resumes the run.
FOR_A_PERSON = frozenset({"reversible", "irreversible", "compensation"})


def standing_of(state: RunState, holder: Lease | None, queued: QueuedRun | None,
             now: float) -> dict[str, str]:
    """The run's one state, with what it waits for or who holds it: ``waiting`` (for a
    person, and for what), ``runnable`` (nothing to decide, nobody holds it, and what
    drives it would act), ``running`` (its lease is held: by whom, until when),
    ``stalled`` (it was being driven and its lease lapsed or was let go, with nobody
    holding it), ``finished``, ``failed`` (a worker parked it), ``cancelled``.
    ``holder``: ``Store.holder``; ``queued``: its entry in the fleet's queue, if any;
    ``now``: seconds since the epoch."""
    if state.status == "finished":
        return {"state": "finished", "label": "finished", "detail": ""}
    if state.status in ("cancelled", "compensating", "compensated"):
        return {"state": "cancelled", "label": "cancelled", "detail": {
            "compensating": "its effects are being undone",
            "compensated": "its effects were undone"}.get(state.status, "")}
    if queued is not None and queued.state == "parked":
        return {"state": "failed", "label": "failed",
                "detail": f"a worker parked it: {queued.reason or 'no reason recorded'}"}
    wait = _waits_for(state)
    if wait:
        return {"state": "waiting", "label": "waiting for a person", "detail": wait}
    if holder is not None and holder.expires_at > now:
        return {"state": "running", "label": "running", "detail": (
            f"held by {holder.owner} (lease epoch {holder.epoch}) until "
            f"{clock(holder.expires_at)}, {holder.expires_at - now:.0f} s from now")}
    if queued is not None and queued.state in ("queued", "waiting", "running"):
        return {"state": "runnable", "label": "runnable", "detail": "a worker will take it"}
    if state.status in ("running", "new") and holder is not None and not _a_decision(holder):
        how = ("let go of it" if holder.expires_at <= 0 else
               f"stopped renewing it; it lapsed at {clock(holder.expires_at)}")
        return {"state": "stalled", "label": "stalled", "detail": (
            f"{holder.owner}, which held its lease (epoch {holder.epoch}), {how}, and "
            "nobody holds it now")}
    return {"state": "runnable", "label": "runnable",
            "detail": "nothing waits for a person: continuing it acts now"}


def _waits_for(state: RunState) -> str:
    """What a person must do before the run can go on; empty when nothing."""
    asks = [f"approve or deny {a.tool}({args_text(a.args)})" for a in state.approvals.values()]
    if state.status in ("paused", "escalated"):
        asks += [f"say whether {p.tool}({args_text(p.args)}) happened"
                 for p in state.pending.values()]
    if state.waits_for_a_person and not state.pending:
        reason = (state.escalation or {}).get("reason") or "a conflict"
        asks.append(f"decide the escalation ({reason})")
    return "; ".join(asks)


def _a_decision(lease: Lease) -> bool:
    """A lease a person's decision took to write it (decisions.py): not a driver's."""
    return lease.owner.startswith("decision:")


def open_call(standing: str, p: PendingCall) -> str:
    """What an open call is: ``in flight`` while its run's lease is held, ``uncertain``
    when a person is asked about it (as on the needs-a-person page), else ``retried``
    (read-only or idempotent: whoever continues the run makes it again)."""
    if standing == "running":
        return "in flight"
    if standing == "waiting" or p.effect in FOR_A_PERSON:
        return "uncertain"
    return "retried"


def decision_said(e: Event) -> str:
    """A person's decision, in words; empty for any other event."""
    p = e.payload
    if e.type is E.APPROVAL_DECIDED:
        verb = "approved" if p.get("approved") else "denied"
        return (f"seq {e.seq}: {p.get('by')} {verb} {p.get('approval_id')}"
                + (f" ({p['reason']})" if p.get("reason") else ""))
    if e.type is E.TOOL_CALL_RECONCILED and p.get("by", "agentjournal") != "agentjournal":
        said = {"found": "happened", "absent": "did not happen",
                "conflict": "is a conflict"}.get(str(p.get("verdict")), str(p.get("verdict")))
        return (f"seq {e.seq}: {p.get('by')} said the call to {p.get('tool')} {said}"
                + (f" ({p['reason']})" if p.get("reason") else ""))
    return ""


def args_text(args: dict[str, Any], width: int = 60) -> str:
    text = ", ".join(f"{k}={v!r}" for k, v in args.items())
    return text if len(text) <= width else text[: width - 1] + "…"


def clock(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%H:%M:%S UTC")


# --- the gap between two lease epochs -----------------------------------------------------


#: Events after which a run stops on purpose, to wait for a person.
WAITS = frozenset({E.RUN_PAUSED, E.APPROVAL_REQUESTED, E.RUN_ESCALATED})


def lease_gap(prev: Event | None, e: Event) -> dict[str, Any] | None:
    """Where one lease's segment ended and another's began (the epoch moved), and what
    happened in between: the run waited for a person who then decided (``person``),
    went on after a person's decision (``after_decision``), waited and was resumed
    (``waited``), or the process driving it stopped mid-run (``stopped``: killed,
    crashed, or frozen until its lease lapsed; the log cannot tell which)."""
    if prev is None or prev.epoch == e.epoch:
        return None
    seconds = (e.ts - prev.ts).total_seconds()
    took = _duration(seconds)
    decided = decision_said(e)
    if decided:
        kind = "person" if prev.type in WAITS or decision_said(prev) else "stopped"
        before = (f"the run waited {took} for a person" if kind == "person" else
                  f"the process holding lease epoch {prev.epoch} stopped after seq "
                  f"{prev.seq} ({prev.type.value}); {took} later a person decided")
        text = f"{before}: {decided.split(': ', 1)[1]}"
    elif decision_said(prev):
        kind = "after_decision"
        text = (f"{took} after {prev.payload.get('by')}'s decision, the run went on under "
                f"lease epoch {e.epoch}")
    elif prev.type in WAITS:
        kind = "waited"
        text = (f"the run waited {took} ({prev.type.value.replace('_', ' ')}), then went "
                f"on under lease epoch {e.epoch}")
    else:
        kind = "stopped"
        text = (f"the process holding lease epoch {prev.epoch} stopped mid-run after seq "
                f"{prev.seq} ({prev.type.value}): killed, crashed, or frozen until its lease "
                f"lapsed; {took} later lease epoch {e.epoch} took over"
                + (" and resumed it" if e.type is E.RUN_RESUMED else ""))
    return {"from_epoch": prev.epoch, "to_epoch": e.epoch, "seconds": seconds,
            "resumed": e.type is E.RUN_RESUMED, "kind": kind, "text": text}


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.1f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
