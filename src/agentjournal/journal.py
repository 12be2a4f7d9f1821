"""A run's single writer: it holds the lease, the folded state, and appends facts.

Every state change goes through ``RunJournal.record``: the event is made
durable first, then folded into the in-memory state with the same rule a
replay uses. Nothing else mutates run state, so the live run and any later
replay agree by construction (and the prefix tests check it).
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import uuid
from collections.abc import Callable
from typing import Any

import msgspec

from .errors import JournalError, RunNotFoundError
from .events import Event, EventType, make_events
from .state import RunState, apply, fold
from .store import Lease, Store, validate_run_id

Observer = Callable[[Event, RunState], None]


def default_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class RunJournal:
    def __init__(
        self, store: Store, lease: Lease, state: RunState, observer: Observer | None = None
    ) -> None:
        self.store, self.lease, self.state = store, lease, state
        self.run_id = lease.run_id
        self.observer = observer
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None

    def record(self, kind: EventType, **payload: Any) -> Event:
        """Append one fact durably, then fold it into the state."""
        (event,) = make_events(self.run_id, self.state.last_seq, self.lease.epoch,
                               [(kind, payload)])
        self.store.append(self.run_id, [event], expected_seq=event.seq - 1,
                          epoch=self.lease.epoch)
        apply(self.state, event)
        if self.observer is not None:
            self.observer(event, self.state)
        return event

    def keep_alive(self, ttl: float) -> None:
        """Renew the lease every ttl/3 in the background while the run is open."""

        def beat() -> None:
            while not self._stop.wait(ttl / 3):
                try:
                    self.lease = self.store.renew(self.lease, ttl)
                except JournalError:
                    return  # fenced or broken: the next append will say so

        self._heartbeat = threading.Thread(target=beat, name=f"lease:{self.run_id}", daemon=True)
        self._heartbeat.start()

    def close(self) -> None:
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join()
        with contextlib.suppress(JournalError):  # fenced or broken: nothing to release
            self.store.release(self.lease)

    def __enter__(self) -> RunJournal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_journal(
    store: Store,
    run_id: str,
    *,
    owner: str | None = None,
    ttl: float = 30.0,
    observer: Observer | None = None,
    must_exist: bool = False,
) -> RunJournal:
    """Take the run's lease and fold its log. Appends nothing."""
    validate_run_id(run_id)
    lease = store.acquire(run_id, owner or default_owner(), ttl)
    try:
        state = fold(store.read(run_id))
        if must_exist and state.last_seq == 0:
            raise RunNotFoundError(run_id)
    except BaseException:
        store.release(lease)
        raise
    journal = RunJournal(store, lease, state, observer)
    journal.keep_alive(ttl)
    return journal


def fork(store: Store, run_id: str, at_seq: int, new_run_id: str | None = None) -> str:
    """Start a new run from the first ``at_seq`` events of ``run_id``; returns its id.

    The fork records its origin and keeps the origin's idempotency scope, so
    it never re-executes an effect its prefix recorded.
    """
    prefix = list(store.read(run_id))[:at_seq]
    if not prefix:
        raise RunNotFoundError(run_id)
    if at_seq < 1 or at_seq > len(prefix) or prefix[0].type is not EventType.RUN_STARTED:
        raise ValueError(f"run {run_id!r} has events 1..{len(prefix)}; fork at one of them")
    new_id = validate_run_id(new_run_id or f"{run_id[:100]}.fork-{uuid.uuid4().hex[:8]}")
    origin_scope = fold(prefix[:1]).scope
    first = {**prefix[0].payload, "scope": origin_scope,
             "origin": {"run_id": run_id, "at_seq": at_seq}}
    # Copies keep their times, so an uncertain call's age stays true.
    copies = [msgspec.structs.replace(prefix[0], payload=first), *prefix[1:]]
    events = [msgspec.structs.replace(e, run_id=new_id, epoch=0) for e in copies]
    store.append(new_id, events, expected_seq=0, epoch=0)
    return new_id
