"""What each page of ``agentjournal ui`` shows, as plain data (the JSON twin of every page).

Everything here reads through the store (its outlines, events and snapshots, each
snapshot checked as ``load_state`` checks one), ``fold`` and ``durable_fields``, and
returns dicts and lists of JSON values; the HTML is rendered from the same data, so
the two never disagree. Nothing here writes.

A page costs what it shows: the summaries of runs come from the store's outlines
(projections.py: each run's summary, kept with its log), never from a fold of every
run; a run's state at a seq starts from its newest sound snapshot at or before it; a
call's page reads from the call's start to its end.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

import msgspec

from ..errors import InvalidRunIdError, JournalError
from ..events import Event, EventType
from ..fleet import QueuedRun
from ..keyed import Segmented
from ..snapshots import decode_snapshot, gc_paused, refusal
from ..state import PendingCall, RunState, apply, durable_fields, fold
from ..store import RunInfo, Store
from ..store.base import Snapshot, validate_run_id
from ..summaries import (
    FOR_A_PERSON,
    args_text,
    decision_said,
    lease_gap,
    open_call,
    request_change_line,
    request_changes,
    standing_of,
    summary,
    version_line,
)
from .standing import driver, going_on, queue_runs

E = EventType

#: Events per page of a run's timeline, and runs per page of the list.
PAGE_EVENTS = 100
PAGE_RUNS = 50
#: The events a long run's state page shows the messages and calls of (up to its seq):
#: about as many calls as a page lists (SHOWN_AT_MOST) for a run that calls a tool a turn.
WINDOW = 600
#: The first chunk a call's page reads from its start, doubled up to the second.
CALL_CHUNK, CALL_CHUNK_MAX = 64, 4096


class NotFound(Exception):
    """A run id that is not a valid id, or names no run: the page is a 404."""


def checked_id(run_id: str) -> str:
    """``run_id`` if it is a valid id; a hostile one (``../x``) is NotFound before any
    store is asked, so it can never reach a file name."""
    try:
        return validate_run_id(run_id)
    except InvalidRunIdError:
        raise NotFound(run_id) from None


class States:
    """What a page needs of a run besides its outline (which the store keeps): the
    payload of its ``run_started`` and its request_changed events, each read once and
    kept (a log only grows)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._started: dict[str, dict[str, Any] | None] = {}
        # Per run: the seq read up to, and the request_changed events up to it (record-only,
        # so no outline keeps them): each look reads only the events since the last.
        self._changes: dict[str, tuple[int, list[dict[str, Any]]]] = {}

    def outline(self, run_id: str) -> RunState | None:
        """The run's outline as of its head (None: no such run); a run whose log cannot
        be read or folded raises its error."""
        found = self.store.outlines([run_id]).get(run_id)
        if isinstance(found, JournalError):
            raise found
        return found

    def started(self, state: RunState) -> dict[str, Any] | None:
        """The payload of the run's ``run_started``, where ``continuation`` needs it (a
        LangGraph thread's id, a run an integration opened under a MODULE:OBJECT): read
        once per run and kept (it never changes); None for a run whose recorded agent
        says enough."""
        agent = state.agent or ""
        if not agent or agent.startswith(("pydantic_ai:", "openai-agents:")):
            return None
        with self._lock:
            if state.run_id in self._started:
                return self._started[state.run_id]
        first = next(iter(self.store.read(state.run_id, upto=1)), None)
        payload = dict(first.payload) if first is not None else None
        with self._lock:
            self._started[state.run_id] = payload
        return payload

    def request_changes(self, run_id: str, state: RunState) -> list[dict[str, Any]]:
        """The run's request_changed events up to its state's seq: recorded model turns
        served to a request the code now makes otherwise. Only a run that went on after
        its first process (resumed, or a fork) can have any: another's log is not read."""
        last_seq = state.last_seq
        if not state.resumes and state.origin is None:
            return []
        with self._lock:
            read_to, found = self._changes.get(run_id, (0, []))
        if read_to < last_seq:
            events = self.store.read(run_id, after_seq=read_to, upto=last_seq)
            try:
                found = [*found, *request_changes(events)]
            finally:
                close = getattr(events, "close", None)
                if close is not None:  # a generator holding a cursor: done with it
                    close()
            with self._lock:
                self._changes[run_id] = (last_seq, found)
        return [c for c in found if c["at_seq"] <= last_seq]


def age_s(since: datetime | None, now: datetime) -> float | None:
    return None if since is None else max(0.0, (now - since).total_seconds())


def plain(value: Any) -> Any:
    """JSON data of any struct or value (datetimes as ISO text)."""
    return msgspec.to_builtins(value)


# --- needs a person --------------------------------------------------------------------


def needs_a_person(store: Store, states: States) -> dict[str, Any]:
    """Every pending approval, uncertain call and escalation across runs, oldest first:
    from the outlines of the runs that hold one (the store's index), never a fold."""
    now = datetime.now(UTC)
    items: list[dict[str, Any]] = []
    unreadable: list[dict[str, str]] = []
    for run_id, state in store.outlines(attention=True).items():
        if isinstance(state, JournalError):
            unreadable.append({"run_id": run_id, "error": str(state)})
            continue
        items += _approvals(state, now)
        items += _uncertain(store, state, now)
        items += _escalation(state, now)
    items.sort(key=lambda i: i["since"])
    return {"items": items, "unreadable": unreadable}


def _approvals(state: RunState, now: datetime) -> Iterator[dict[str, Any]]:
    for a in state.approvals.values():
        yield {"kind": "approval", "run_id": state.run_id, "run_status": state.status,
               "id": a.approval_id, "tool": a.tool, "args": a.args, "reason": a.reason,
               "seq": a.requested_seq, "since": a.requested_at.isoformat(),
               "age_s": age_s(a.requested_at, now)}


def _for_a_person(store: Store, state: RunState, now: datetime) -> list[PendingCall]:
    """The run's open calls a person is asked about: all of them once the run stopped
    for a person (paused, escalated); else none while its lease is held (in flight), and
    those a resume would hand to a person when nobody holds it (its process stopped)."""
    if not state.pending or state.status in ("paused", "escalated"):
        return list(state.pending.values())
    holder = store.holder(state.run_id)
    if holder is not None and holder.expires_at > now.timestamp():
        return []
    return [p for p in state.pending.values() if p.effect in FOR_A_PERSON]


def _uncertain(store: Store, state: RunState, now: datetime) -> Iterator[dict[str, Any]]:
    for p in _for_a_person(store, state, now):
        yield {"kind": "compensation" if p.effect == "compensation" else "uncertain",
               "run_id": state.run_id, "run_status": state.status, "id": p.key,
               "tool": p.tool, "args": p.args, "effect": p.effect, "attempts": p.attempt,
               "last_error": p.last_error, "seq": p.started_seq,
               "since": p.started_at.isoformat(), "age_s": age_s(p.started_at, now),
               "evidence": verdicts_on(store, state.run_id, p.key, p.started_seq),
               "conflict": _conflict(state, p.key, p.args)}


def _conflict(state: RunState, key: str, ours: Any) -> dict[str, Any] | None:
    """Ours against theirs, when the run was escalated over this call."""
    esc = state.escalation
    if not state.waits_for_a_person or esc is None or esc.get("key") != key:
        return None
    return {"reason": esc.get("reason"), "ours": esc.get("ours", ours),
            "theirs": esc.get("theirs")}


def _escalation(state: RunState, now: datetime) -> Iterator[dict[str, Any]]:
    """A run escalated (a conflict: ours against what the world holds) with no open call
    to settle: the call's row already shows a conflict over an open call."""
    if not state.waits_for_a_person or state.escalation is None:
        return
    esc = state.escalation
    if esc.get("key") in {p.key for p in state.pending.values()}:
        return
    since = esc.get("started_at") or (state.started_at.isoformat() if state.started_at
                                      else now.isoformat())
    yield {"kind": "escalation", "run_id": state.run_id, "run_status": state.status,
           "id": esc.get("key") or "", "tool": esc.get("tool"), "reason": esc.get("reason"),
           "ours": esc.get("ours"), "theirs": esc.get("theirs", esc.get("found")),
           "seq": state.escalated_seq, "since": since,
           "age_s": age_s(datetime.fromisoformat(since), now)}


def verdicts_on(store: Store, run_id: str, key: str, started_seq: int) -> list[dict[str, Any]]:
    """The reconcile verdicts recorded on a call since it started: the evidence so far."""
    return [{"seq": e.seq, "ts": e.ts.isoformat(), **e.payload}
            for e in store.read(run_id, after_seq=started_seq)
            if e.type is E.TOOL_CALL_RECONCILED and e.payload.get("key") == key]


# --- runs --------------------------------------------------------------------------------


def runs_page(store: Store, states: States, *, status: str | None = None,
              older_than_s: float | None = None, newer_than_s: float | None = None,
              page: int = 1, per_page: int = PAGE_RUNS, query: str | None = None
              ) -> dict[str, Any]:
    """One page of runs, newest activity first, filtered by status (the recorded one, or
    the state to act on: waiting, runnable, running, stalled...), age, and ``query``:
    text in the run id or the agent. Each row is its run's outline: one query for the
    page's runs (a filter on status or text: for every run)."""
    now = datetime.now(UTC)
    skip = (page - 1) * per_page
    filtered = (status is not None or older_than_s is not None or newer_than_s is not None
                or bool(query))
    # Unfiltered, the store lists only the runs up to this page's end (and one more,
    # to know there are more); a filter looks at every run, newest first.
    listed = store.list_runs() if filtered else store.list_runs(limit=skip + per_page + 1)
    infos = [i for i in listed if _age_fits(i, now, older_than_s, newer_than_s)]
    rows: list[dict[str, Any]] = []
    more = False
    matched = len(infos) if filtered and status is None and not query else None  # (ages)
    if status is None and not query:  # the earlier pages need no outline to be skipped
        infos, skip = infos[skip:skip + per_page + 1], 0
        outlines = store.outlines([i.run_id for i in infos])
    else:
        outlines = store.outlines()
    queued = queue_runs(store)
    for info in infos:  # newest first, as the store lists them
        row = _run_row(store, outlines.get(info.run_id), info, now, queued.get(info.run_id))
        if status is not None and status not in (row["status"], row["standing"]["state"]):
            continue
        if query and not _matches(query, row):
            continue
        if skip:
            skip -= 1
            continue
        if len(rows) == per_page:
            more = True
            break
        rows.append(row)
    return {"runs": rows, "page": page, "per_page": per_page, "more": more,
            "matched": matched, "status": status}


def _matches(query: str, row: dict[str, Any]) -> bool:
    text = query.strip().lower()
    return text in row["run_id"].lower() or text in (row.get("agent") or "").lower()


def _age_fits(info: RunInfo, now: datetime, older: float | None, newer: float | None) -> bool:
    age = age_s(info.updated_at, now) or 0.0
    return (older is None or age >= older) and (newer is None or age <= newer)


def _run_row(store: Store, state: RunState | JournalError | None, info: RunInfo,
             now: datetime, queued: QueuedRun | None) -> dict[str, Any]:
    """A run's row from its outline (None: the run went away since it was listed)."""
    if not isinstance(state, RunState):
        error = str(state) if state is not None else "its log is gone"
        return {"run_id": info.run_id, "status": "unreadable", "error": error,
                "standing": {"state": "failed", "label": "unreadable", "detail": error},
                "events": info.last_seq, "agent": None, "approvals": 0, "uncertain": 0,
                "age_s": age_s(info.created_at, now), "idle_s": age_s(info.updated_at, now),
                "cost_usd": None, "unpriced_turns": 0, "duration_s": None}
    return {"run_id": info.run_id, "status": state.status, "agent": state.agent,
            "standing": standing_of(state, store.holder(info.run_id), queued,
                                    now.timestamp()),
            "events": state.last_seq, "approvals": len(state.approvals),
            "uncertain": len(state.pending), "age_s": age_s(info.created_at, now),
            "cost_usd": state.usage.cost_usd, "unpriced_turns": state.unpriced_turns,
            "duration_s": (None if state.started_at is None or info.updated_at is None
                           else max(0.0, (info.updated_at - state.started_at).total_seconds())),
            "idle_s": age_s(info.updated_at, now),
            "last_event": info.updated_at.isoformat() if info.updated_at else None}


# --- a run -------------------------------------------------------------------------------


def run_summary(store: Store, states: States, run_id: str,
                store_hint: str = "") -> dict[str, Any]:
    """The facts at the head of a run's page: status, counts, usage, what waits (its
    outline, as of its head)."""
    run_id = checked_id(run_id)
    state = states.outline(run_id)
    if state is None or not state.last_seq:
        raise NotFound(run_id)
    now = time.time()
    holder, queued = driver(store, run_id, state, now)
    stand = standing_of(state, holder, queued, now)
    return {
        "run_id": run_id, "status": state.status, "pause_reason": state.pause_reason,
        "standing": stand, "runnable": stand["state"] == "runnable",
        "going_on": (going_on(store, state, queued, now, states.started(state), store_hint)
                     if stand["state"] in ("runnable", "stalled") else None),
        # The outline's own last seq: the seq the whole page is as of.
        "agent": state.agent, "task": state.task, "events": state.last_seq,
        "versions": list(state.versions),
        "versions_line": version_line(state.versions) if state.versions else None,
        "request_changes": [{**c, "line": request_change_line(c)}
                            for c in states.request_changes(run_id, state)],
        "turns": state.turns,
        "tool_calls": state.tool_calls, "resumes": state.resumes,
        "started_at": state.started_at.isoformat() if state.started_at else None,
        "usage": plain(state.usage), "origin": state.origin, "outcome": state.outcome,
        "escalation": state.escalation,
        "approvals": [plain(a) for a in state.approvals.values()],
        "uncertain": [{**plain(p), "open": open_call(stand["state"], p)}
                      for p in state.pending.values()],
        "decisions": {k: plain(d) for k, d in state.decisions.items()},
        "workspace": plain(state.workspace),
        "saga": None if state.saga is None else {"by": state.saga.by,
                                                 "through_seq": state.saga.through_seq},
    }


# --- decisions that ask for a confirmation ------------------------------------------------

#: What each verdict does, in a line (the confirmation page says it again).
VERDICTS = {
    "approve": "the call runs with exactly these arguments when the run goes on",
    "happened": "the call is recorded as done, with the result given, and never made again",
    "did_not_happen": "the run makes the call again, with the same idempotency key",
    "conflict": "nothing is retried; the run stays stopped for a person",
}


def approval_to_confirm(store: Store, states: States, run_id: str,
                        approval_id: str) -> dict[str, Any] | None:
    """What approving ``approval_id`` lets happen (every approval is confirmed: it is
    the one click between a model's request and its effect); None: not pending."""
    state = states.outline(checked_id(run_id))
    a = state.approvals.get(approval_id) if state is not None else None
    if a is None:
        return None
    return {"verb": "approve", "tool": a.tool, "args": a.args, "effect": "approval",
            "what": f"Approving lets {a.tool} run: {VERDICTS['approve']}."}


def verdict_to_confirm(store: Store, states: States, run_id: str, key: str,
                       outcome: str) -> dict[str, Any] | None:
    """What a verdict on an irreversible call settles; None when it asks for no
    confirmation (another effect class, or no such open call)."""
    state = states.outline(checked_id(run_id))
    named = ([p for p in state.pending.values() if p.key.startswith(key)]
             if key and state is not None else [])
    if len(named) != 1 or named[0].effect != "irreversible":
        return None
    p = named[0]
    verb = {"happened": "it happened", "did_not_happen": "it did not happen",
            "conflict": "conflict"}[outcome]
    return {"verb": verb, "tool": p.tool, "args": p.args, "effect": p.effect,
            "what": f"{p.tool} is irreversible: if you say {verb!r}, {VERDICTS[outcome]}."}


# --- after a decision: what was recorded, and what happens next ---------------------------


def decision_note(store: Store, states: States, run_id: str, seq: int,
                  store_hint: str = "") -> dict[str, Any] | None:
    """What a person's decision recorded at ``seq`` of ``run_id``, and what happens next:
    the run still waits for a person (for what), or how it goes on (``continuation``:
    a worker takes it up, or the command or call that continues that kind of run).
    None when no decision is recorded there."""
    run_id = checked_id(run_id)
    last = store.last_seq(run_id)
    if not 0 < seq <= last:
        return None
    recorded = [s for e in store.read(run_id, after_seq=seq - 1, upto=seq + 3)
                if (s := decision_said(e))]
    state = states.outline(run_id)
    if not recorded or state is None:
        return None
    now = time.time()
    holder, queued = driver(store, run_id, state, now)
    stand = standing_of(state, holder, queued, now)
    note: dict[str, Any] = {"run_id": run_id, "seq": seq, "recorded": recorded,
                            "standing": stand, "command": "", "shell": True, "silent": ""}
    if stand["state"] == "waiting":
        note["next"] = f"the run still waits for a person: {stand['detail']}"
        return note
    note.update(going_on(store, state, queued, now, states.started(state), store_hint))
    return note


def events_page(store: Store, run_id: str, after: int = 0, limit: int = PAGE_EVENTS,
                upto: int | None = None) -> dict[str, Any]:
    """Up to ``limit`` events after seq ``after`` (and up to ``upto``: the seq the rest of
    the page is as of), each with its one-line summary and the gap before it when the
    lease epoch changed (a kill or a stop, then a resume)."""
    run_id = checked_id(run_id)
    last = store.last_seq(run_id) if upto is None else upto
    if not last:
        raise NotFound(run_id)
    count = max(0, min(limit, last - after))
    earlier, shown = _window(store, run_id, after, after + count)
    return {"run_id": run_id, "after": after, "limit": limit, "last_seq": last,
            "events": event_rows(shown, earlier[-1] if earlier else None,
                                 call_starts([*earlier, *shown]))}


#: Events read before a page or a tail batch: the last shows the gap before the first
#: row, and their starts give the first completions their durations.
LOOKBACK = 16


def _window(store: Store, run_id: str, after: int, upto: int) -> tuple[list[Event], list[Event]]:
    """The events after ``after`` up to ``upto``, and up to LOOKBACK before them."""
    start = max(0, after - LOOKBACK)
    window = list(itertools.islice(store.read(run_id, after_seq=start), max(0, upto - start)))
    return window[:after - start], window[after - start:]


def call_starts(events: Iterable[Event]) -> dict[int, datetime]:
    """When each call started in ``events`` began, by its seq: a completion's row says
    how long its call took (a completion names its start's seq)."""
    return {e.seq: e.ts for e in events if e.type is E.TOOL_CALL_STARTED}


def event_rows(events: Sequence[Event], before: Event | None = None,
               starts: dict[int, datetime] | None = None) -> list[dict[str, Any]]:
    """Each event as a row; a completion's row carries how long its call took (from its
    start in ``starts``)."""
    rows = []
    starts = starts or {}
    for i, e in enumerate(events):
        prev = events[i - 1] if i else before
        started = starts.get(e.payload.get("started_seq", -1)) \
            if e.type is E.TOOL_CALL_COMPLETED else None
        rows.append({"seq": e.seq, "ts": e.ts.isoformat(), "type": e.type.value,
                     "epoch": e.epoch, "summary": summary(e), "payload": e.payload,
                     "key": e.payload.get("key") or e.payload.get("idempotency_key"),
                     # where the call's page starts reading: its start
                     "call_at": e.payload.get("started_seq") or e.seq,
                     "effect": e.payload.get("effect"), "gap": lease_gap(prev, e),
                     "took": None if started is None else (e.ts - started).total_seconds()})
    return rows


def state_at(store: Store, run_id: str, seq: int, after: int | None = None
             ) -> dict[str, Any]:
    """The run as of ``seq`` (time travel), for a reader: its messages, its tool calls
    (tool, arguments, outcome, duration), usage; and its durable fields as folded from
    events 1..seq (``state``), from the newest sound snapshot at or before ``seq``.

    A long run is shown through a window: the messages, calls (each read from its
    start), completions and attempts of the events after ``after`` (by default the last
    WINDOW up to ``seq``; 0: the whole run, as its whole log up to ``seq`` says),
    so a late seq of a long run costs a window, not the log."""
    run_id = checked_id(run_id)
    last = store.last_seq(run_id)
    if not last:
        raise NotFound(run_id)
    seq = min(max(1, seq), last)
    after = max(0, seq - WINDOW) if after is None else min(max(0, after), seq)
    try:
        state = _state_at(store, run_id, seq, lazy=after > 0)
        after, events = _calls_window(store, run_id, state, after, seq)
        shown = _windowed(state, events, after) if after else state
    except JournalError:  # (a snapshot's segment found damaged when looked up, which
        # a read-only handle cannot set aside): decoded whole, a damaged one is passed by
        state = _state_at(store, run_id, seq, lazy=False)
        after, events = _calls_window(store, run_id, state, after, seq)
        shown = _windowed(state, events, after) if after else state
    return {"run_id": run_id, "seq": seq, "last_seq": last, "status": state.status,
            "turns": state.turns, "usage": plain(state.usage),
            "messages": [_message(m) for m in shown.messages],
            "calls": calls_of(events), "after": after, "all_messages": len(state.messages),
            "approvals": [plain(a) for a in state.approvals.values()],
            "state": durable_fields(shown)}


def _windowed(state: RunState, events: Sequence[Event], after: int) -> RunState:
    """``state`` with its messages, completed calls and attempts cut to those of the
    events after ``after`` (the window ``events`` holds)."""
    completed = {k for e in events if e.type is E.TOOL_CALL_COMPLETED
                 and (k := e.payload.get("idempotency_key"))}
    started = {k for e in events if e.type is E.TOOL_CALL_STARTED and (k := e.payload.get("key"))}
    messages = (state.messages.since(after) if isinstance(state.messages, Segmented)
                else [m for m in state.messages if m.seq > after])
    return msgspec.structs.replace(
        state, messages=messages,
        completed={k: c for k in sorted(completed) if (c := state.completed.get(k))},
        attempts={k: n for k in sorted(started) if (n := state.attempts.get(k))})


def _state_at(store: Store, run_id: str, seq: int, *, lazy: bool) -> RunState:
    """The run's state as of ``seq``: its newest snapshot at or before it that is sound
    (checked as ``load_state`` checks one) with the events after it up to ``seq``
    folded in; else a fold from seq 1. ``lazy``: the completed calls and attempts in
    the snapshot's segments are decoded when looked up, its messages when read
    (keyed.py): a window decodes the segments that hold its messages, not the run's."""
    with gc_paused():  # decoding and folding allocate many objects and free none
        for snapshot in store.snapshots(run_id):  # newest first
            state = _sound(store, snapshot, seq, lazy)
            if state is not None and _folded_to(state, store.read(
                    run_id, after_seq=snapshot.seq, upto=seq), seq):
                return state
        return fold(store.read(run_id, upto=seq))


def _folded_to(state: RunState, events: Iterator[Event], seq: int) -> bool:
    """Fold ``events`` into ``state``; whether they continue it right after its seq, one
    by one, up to ``seq`` (else ``state`` is half folded: not to be used)."""
    try:
        for event in events:
            if event.seq != state.last_seq + 1:
                return False
            apply(state, event)
    finally:
        close = getattr(events, "close", None)
        if close is not None:  # a generator holding a cursor: done with it
            close()
    return state.last_seq == seq


def _sound(store: Store, snapshot: Snapshot, seq: int, lazy: bool) -> RunState | None:
    """The state ``snapshot`` holds, if it is at or before ``seq``, of this release's
    fold, not quarantined, and decodes to the state at its seq (as ``load_state``
    checks one); else None."""
    if snapshot.seq > seq or refusal(snapshot, store.quarantined()) is not None:
        return None
    state, _ = decode_snapshot(store, snapshot, lazy=lazy, lazy_messages=lazy)
    return state


def _calls_window(store: Store, run_id: str, state: RunState, after: int, seq: int
                  ) -> tuple[int, list[Event]]:
    """The events after ``after`` up to ``seq``, reaching back to the starts of the
    calls open at ``seq`` and of those the window settles: each call whole. Returns
    the seq the window starts after, and its events."""
    after = min([after, *(p.started_seq - 1 for p in state.pending.values())])
    events = list(store.read(run_id, after_seq=after, upto=seq))
    began = {e.payload.get("key") for e in events if e.type is E.TOOL_CALL_STARTED}
    earlier = [s - 1 for e in events if e.type in _SETTLING and (s := e.payload.get(
        "started_seq")) is not None and s <= after and _key_of(e) not in began]
    if earlier:
        reach = min(earlier)
        events = [*store.read(run_id, after_seq=reach, upto=after), *events]
        after = reach
    return after, events


#: The events about a call that name its start's seq.
_SETTLING = frozenset({E.TOOL_CALL_COMPLETED, E.TOOL_CALL_UNCERTAIN, E.TOOL_CALL_RECONCILED})


def _message(m: Any) -> dict[str, Any]:
    return {"seq": m.seq, "role": m.role, "trust": m.trust, "content": m.content,
            "name": m.name, "is_error": m.is_error,
            "calls": [f"{c.name}({args_text(c.args if isinstance(c.args, dict) else {})})"
                      for c in m.tool_calls]}


#: A call's outcome, by the event that settled it last.
CALL_OUTCOMES = {E.TOOL_CALL_STARTED: "in flight", E.TOOL_CALL_COMPLETED: "completed",
                 E.TOOL_CALL_UNCERTAIN: "uncertain", E.TOOL_CALL_DENIED: "denied",
                 E.TOOL_RESULT_SERVED: "served from an earlier result"}


def calls_of(events: Iterable[Event]) -> list[dict[str, Any]]:
    """Every tool call in ``events``, in the order they started: tool, arguments, its
    outcome by the last event about it, the result, attempts, and how long its last
    attempt took (start to completion, by the events' times)."""
    calls: dict[str, dict[str, Any]] = {}
    for e in events:
        if e.type not in CALL_OUTCOMES and e.type is not E.TOOL_CALL_RECONCILED:
            continue
        p = e.payload
        key = str(p.get("key") or p.get("idempotency_key") or p.get("call_id") or e.seq)
        call = calls.setdefault(key, {"key": key, "tool": p.get("tool"), "args": p.get("args"),
                                      "started_seq": e.seq, "attempts": 0, "result": None,
                                      "seconds": None, "_started": e.ts})
        if e.type is E.TOOL_CALL_STARTED:  # (an attempt's number: its earlier ones may
            # precede the events given)
            call.update(attempts=max(call["attempts"] + 1, p.get("attempt") or 0),
                        _started=e.ts, seconds=None)
        elif e.type is E.TOOL_CALL_RECONCILED:
            call["verdict"] = f"{p.get('verdict')} by {p.get('by', 'agentjournal')}"
            continue
        call["outcome"] = CALL_OUTCOMES[e.type]
        call["tool"] = call["tool"] or p.get("tool")
        call["args"] = call["args"] if call["args"] is not None else p.get("args")
        if e.type is E.TOOL_CALL_COMPLETED:
            call["result"] = p.get("result", p.get("content"))
            call["seconds"] = (e.ts - call["_started"]).total_seconds()
        elif e.type is E.TOOL_CALL_DENIED:
            call["result"] = p.get("reason")
    for call in calls.values():
        del call["_started"]
    return list(calls.values())


def diff_states(before: dict[str, Any], after: dict[str, Any]) -> list[dict[str, Any]]:
    """The durable fields that differ between two states: name, before, after."""
    names = sorted(set(before) | set(after))
    return [{"field": n, "before": before.get(n), "after": after.get(n)}
            for n in names if before.get(n) != after.get(n)]


def diff_page(store: Store, run_id: str, a: int, b: int) -> dict[str, Any]:
    """What changed from seq ``a`` to seq ``b``, for a reader: the status, the messages
    added, the calls that started or moved on (with their outcome), usage; and the
    durable fields that differ (``changes``)."""
    # Both states are seen through the same window (each may reach back to an open
    # call's start): every call and message that moved after ``a`` is in it.
    first = state_at(store, run_id, a, after=max(0, min(a, b) - WINDOW))
    second = state_at(store, run_id, b, after=first["after"])
    if second["after"] < first["after"]:
        first = state_at(store, run_id, a, after=second["after"])
    before = {c["key"]: c for c in first["calls"]}
    moved = [dict(c, was=before[c["key"]]["outcome"] if c["key"] in before else None)
             for c in second["calls"] if before.get(c["key"]) != c]
    return {"run_id": first["run_id"], "a": first["seq"], "b": second["seq"],
            "status": [first["status"], second["status"]],
            "messages": [m for m in second["messages"] if m["seq"] > first["seq"]],
            "calls": moved,
            "usage": {k: [first["usage"].get(k), second["usage"].get(k)]
                      for k in ("input_tokens", "output_tokens", "cost_usd")},
            "changes": diff_states(first["state"], second["state"])}


def call_detail(store: Store, run_id: str, key: str, at: int | None = None,
                states: States | None = None) -> dict[str, Any]:
    """Every event about one call (by idempotency key or a prefix): started, completed
    or uncertain, verdicts, who decided. Read from the call's first event (``at``, as
    the links carry it; else an open call's start, from the outline) until it is
    settled; the whole log only when its start is unknown."""
    run_id = checked_id(run_id)
    if not key:
        raise NotFound(run_id)
    if at is None and states is not None:
        state = states.outline(run_id)
        starts = [p.started_seq for p in (state.pending.values() if state else ())
                  if p.key.startswith(key)]
        at = min(starts, default=None)
    events = _call_events(store, run_id, key, at) if at else None
    if not events:  # the start is unknown, or was not this call's
        if not store.last_seq(run_id):
            raise NotFound(run_id)
        events = [e for e in store.read(run_id) if _key_of(e).startswith(key)]
    if not events:
        raise NotFound(key)
    return {"run_id": run_id, "key": _key_of(events[0]),
            "events": event_rows(events, None, call_starts(events))}


#: The events after which nothing more is recorded about a call.
_CALL_ENDS = frozenset({E.TOOL_CALL_COMPLETED, E.TOOL_CALL_DENIED, E.TOOL_RESULT_SERVED})


def _call_events(store: Store, run_id: str, key: str, at: int) -> list[Event]:
    """The events about the call ``key`` from seq ``at`` until it ends (a completion that
    is not a proven failure, a denial, a served result) or the log does, read in
    growing chunks; empty when the event at ``at`` is not about it."""
    found: list[Event] = []
    after, size = at - 1, CALL_CHUNK
    while True:
        chunk = list(store.read(run_id, after_seq=after, upto=after + size))
        for e in chunk:
            if not _key_of(e).startswith(key):
                continue
            if not found and e.seq != at:
                return []
            found.append(e)
            if e.type in _CALL_ENDS and not e.payload.get("is_error"):
                return found
        if len(chunk) < size or not found:
            return found
        after, size = chunk[-1].seq, min(size * 2, CALL_CHUNK_MAX)


def _key_of(event: Event) -> str:
    p = event.payload
    return str(p.get("key") or p.get("idempotency_key") or "")


def tail_rows(store: Store, run_id: str, after: int, upto: int) -> list[dict[str, Any]]:
    """The rows of the events after ``after`` up to ``upto`` (the live tail's next
    batch), with the gap before the first and the durations of the calls they complete."""
    earlier, new = _window(store, run_id, after, upto)
    return event_rows(new, earlier[-1] if earlier else None, call_starts([*earlier, *new]))


def as_json(events: Iterable[Event]) -> list[dict[str, Any]]:
    return [plain(e) for e in events]
