"""Outlines: each run's summary, a projection of its log that a read can use instead of a fold.

An *outline* is a ``RunState`` holding only what a summary of the run reads: status
and why, agent, versions, task, counts, usage, the open approvals and calls, the
escalation, the lease-free facts a person acts on. The collections that grow with the
run (messages, completed calls, attempts, memory, guardrails, observations, notes, a
session's items) stay empty. No field an outline keeps is computed from one it drops
(the fold rules for them read only each other), so advancing an outline with the very
rules of ``state.apply`` gives exactly the outline of the full fold: one definition of
what a run's state means, never a second copy of its rules.

The store keeps each run's outline in the append's own transaction (PostgreSQL at each
append, SQLite when due: ``store.outlined.due``) or catches a sidecar up from the log
before answering (JSONL). An outline
records the seq it is folded to; a read never serves one behind the log's head: it
folds the events after it first (``store.outlined.served``). Outlines are rebuildable
from the log (``agentjournal reindex``) and checked against a fresh fold (``agentjournal
verify``): the log is the only copy of anything.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from .errors import CorruptLogError
from .events import Event
from .state import RunState, apply

#: Bumped when what an outline keeps changes: a store's outlines of another version are
#: rebuilt from the log (by a writer on open), never read.
OUTLINE_VERSION = 1

#: The RunState fields an outline leaves empty: each grows with the run.
DROPPED = ("messages", "completed", "attempts", "awaiting", "memory", "guardrails",
           "observations", "notes", "session")

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(RunState)


def outline(state: RunState) -> RunState:
    """The outline of ``state``: a new RunState sharing its kept fields' values."""
    kept = {f: getattr(state, f) for f in RunState.__struct_fields__ if f not in DROPPED}
    return RunState(**kept)


def advance(base: RunState | None, events: Iterable[Event]) -> RunState:
    """The outline after ``events``, from ``base`` (changed in place and returned; an
    empty outline when None). The fold's own rules; what they add to the dropped
    collections is cleared once the events are in."""
    st = RunState() if base is None else base
    for event in events:
        apply(st, event)
    _clear(st)
    return st


def _clear(st: RunState) -> None:
    if st.messages:
        st.messages = []
    if st.completed:
        st.completed = {}
    if st.attempts:
        st.attempts = {}
    if st.awaiting:
        st.awaiting = {}
    if st.memory:
        st.memory = {}
    if st.guardrails:
        st.guardrails = []
    if st.observations:
        st.observations = {}
    if st.notes:
        st.notes = []
    st.session = None


def encode(st: RunState) -> bytes:
    """An outline as stored: msgpack, as a snapshot's body."""
    return _encoder.encode(st)


def decode(body: bytes, run_id: str = "", seq: int = 0) -> RunState:
    """An outline from its stored bytes; bytes that do not decode to one are damage of
    the projection (never of the log): ``CorruptLogError`` naming the run."""
    try:
        return _decoder.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise CorruptLogError(run_id, seq, f"its outline does not decode: {exc}") from None


def needs_a_person(st: RunState) -> bool:
    """Whether the run holds something a person may be asked about: an open approval,
    an open call (in flight, or uncertain once its process stopped), an escalation. The
    cross-run index of the needs-a-person page holds the runs where this is true."""
    return bool(st.approvals or st.pending or st.status == "escalated")


def columns(st: RunState) -> dict[str, Any]:
    """What a store keeps beside an outline's bytes, to select and order by."""
    return {"status": st.status, "agent": st.agent, "attention": needs_a_person(st)}


def differences(stored: RunState, fresh: RunState) -> list[str]:
    """The fields in which a stored outline differs from the outline of a fresh fold
    (empty: it tells the truth)."""
    return [f for f in RunState.__struct_fields__
            if f not in DROPPED and _plain(getattr(stored, f)) != _plain(getattr(fresh, f))]


def _plain(value: Any) -> Any:
    return msgspec.to_builtins(value)
