"""Where a run stands, and how it goes on: the one state a worker or a person would act
on (from its log's fold, its lease and the fleet's queue), what a person is asked about,
and what continues it (``continuation``). Plain data for the viewer's pages."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from ..continuation import continuation
from ..errors import NoQueueError
from ..events import Event, EventType
from ..fleet import QueuedRun, queue_of
from ..state import PendingCall, RunState
from ..store import Lease, Store

E = EventType

#: Statuses that need nothing more from anyone.
DONE = frozenset({"finished", "cancelled", "compensated"})
#: Effects whose open call a resume hands to a person (settle.py): a retry could make
#: the effect twice. A read-only or idempotent one is retried by whoever resumes the run.
FOR_A_PERSON = frozenset({"reversible", "irreversible", "compensation"})


def driver(store: Store, run_id: str, state: RunState,
           now: float) -> tuple[Lease | None, QueuedRun | None]:
    """The run's lease, and its queue entry unless it is not needed (the run ended, or
    its lease is held): the queue is read whole, and a live tail asks at every batch."""
    holder = store.holder(run_id)  # not state.run_id: '' in a log without run_started
    if state.status in DONE or (holder is not None and holder.expires_at > now):
        return holder, None
    return holder, queue_runs(store).get(run_id)


def queue_runs(store: Store) -> dict[str, QueuedRun]:
    """The fleet's queue entries by run id; none when the store has no queue (JSONL)."""
    try:
        return {q.run_id: q for q in queue_of(store).runs()}
    except NoQueueError:
        return {}


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


#: A worker whose last heartbeat is older than this is "not seen for a while".
WORKER_SILENT_S = 60.0


def going_on(store: Store, state: RunState, queued: QueuedRun | None, now: float,
             started: dict[str, Any] | None, store_hint: str = "") -> dict[str, Any]:
    """How the run continues (``continuation``), and whether the workers it waits for
    were heard from lately."""
    how = continuation(state, started=started, store_hint=store_hint,
                       queue_state=queued.state if queued else None,
                       waiting_for=queued.waiting_for if queued else None)
    return {"next": how.sentence, "command": how.command, "shell": how.shell,
            "silent": _workers_silent(store, now) if how.kind == "worker" else ""}


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


def _workers_silent(store: Store, now: float) -> str:
    """A sentence when no worker of the queue was heard from lately; empty otherwise."""
    try:
        beats = [w.heartbeat_at for w in queue_of(store).workers()]
    except NoQueueError:
        return ""
    if not beats:
        return ("no worker has been seen on this store: start one (agentjournal worker) "
                "or the run waits")
    quiet = now - max(beats)
    if quiet < WORKER_SILENT_S:
        return ""
    return (f"no worker has been seen for {quiet / 60:.0f} min (last heartbeat "
            f"{clock(max(beats))}): the run waits until one runs")


def open_call(standing: str, p: PendingCall) -> str:
    """What an open call is: ``in flight`` while its run's lease is held, ``uncertain``
    when a person is asked about it (as on the needs-a-person page), else ``retried``
    (read-only or idempotent: whoever continues the run makes it again)."""
    if standing == "running":
        return "in flight"
    if standing == "waiting" or p.effect in FOR_A_PERSON:
        return "uncertain"
    return "retried"


def _a_decision(lease: Lease) -> bool:
    """A lease a person's decision took to write it (decisions.py): not a driver's."""
    return lease.owner.startswith("decision:")


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


def args_text(args: dict[str, Any], width: int = 60) -> str:
    text = ", ".join(f"{k}={v!r}" for k, v in args.items())
    return text if len(text) <= width else text[: width - 1] + "…"


def clock(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%H:%M:%S UTC")
