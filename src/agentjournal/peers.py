"""The other runs of a run's idempotency scope, as far as the loop needs them.

Effects belong to the scope, not to one log. A fork keeps its origin's scope and
another run of the same tenant operation shares it, so they compute the same
idempotency key for the same action; the world does not fork with the log. Before
a run makes an effect it asks its peers whether one of them has already made it (a
completion there) or may have (a start without a completion there). A tool declared
``local`` is not asked about: its effect stays with its run (the run's workspace).
While a run has no peer, it asks nobody: its start is appended on condition that
none exists (``Store.append(alone_in=)``), and it asks from the first refusal on.

Each peer is folded once per run session (snapshot + tail, like any load) and then
only its new events are applied, so asking again costs one scope query and one tail
read per peer.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

from .journal import RunJournal
from .snapshots import load_state
from .state import CompletedCall, PendingCall, RunState, apply
from .store import Store


@dataclass(frozen=True)
class Elsewhere:
    """What another run of the scope recorded for a key: ``done`` or only ``started``."""

    run_id: str
    seq: int  # of the completion there, or of the start
    done: CompletedCall | None = None
    started: PendingCall | None = None

    @property
    def where(self) -> dict[str, Any]:
        """The run and seq of the record, as events cite it (``from``)."""
        return {"run_id": self.run_id, "seq": self.seq}


class ScopePeers:
    """The folded states of the other runs of ``scope``, kept up to date on demand."""

    def __init__(self, store: Store, scope: str, run_id: str) -> None:
        self.store, self.scope, self.run_id = store, scope, run_id
        self._states: dict[str, RunState] = {}

    def refresh(self) -> None:
        for peer in self.store.scope_runs(self.scope):
            if peer == self.run_id:
                continue
            state = self._states.get(peer)
            if state is None:
                self._states[peer] = load_state(self.store, peer).state
            else:
                for event in self.store.read(peer, after_seq=state.last_seq):
                    apply(state, event)

    def state_of(self, run_id: str) -> RunState | None:
        """The state of peer ``run_id`` as of now; None if it is not a run of the scope."""
        self.refresh()
        return self._states.get(run_id)

    def find(self, key: str) -> Elsewhere | None:
        """Another run's record of ``key``, as of now: a completion if any run has one,
        else a start without one; None if no other run of the scope touched it."""
        self.refresh()
        started: Elsewhere | None = None
        for run_id, state in self._states.items():
            if (done := state.completed.get(key)) is not None:
                return Elsewhere(run_id, done.seq, done=done)
            if started is None:
                started = next((Elsewhere(run_id, p.started_seq, started=p)
                                for p in state.pending.values()
                                if p.key == key), None)
        return started


_SESSIONS: weakref.WeakKeyDictionary[RunJournal, ScopePeers] = weakref.WeakKeyDictionary()


def peers_of(j: RunJournal) -> ScopePeers:
    """The peers of the run ``j`` writes, cached for as long as ``j`` is open."""
    peers = _SESSIONS.get(j)
    if peers is None:
        peers = _SESSIONS[j] = ScopePeers(j.store, j.state.scope, j.run_id)
    return peers
