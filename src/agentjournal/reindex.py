"""Rebuild every projection of a store from its logs: ``agentjournal reindex``.

Each run's outline is folded from its log again and stored, one run at a time (each in
its own transaction: a crash keeps what was done, and the next reindex does it all
again, so it finishes the work). A run whose log is damaged gets no outline from it;
it is named, and every other run is rebuilt all the same. Projections are caches of
the log: rebuilding them never changes the log.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import msgspec

from .errors import JournalError
from .projections import advance
from .snapshots import gc_paused
from .store import Store


class Damaged(msgspec.Struct, frozen=True):
    run_id: str
    error: str


class ReindexReport(msgspec.Struct, frozen=True):
    runs: int  # runs rebuilt
    events: int  # events folded
    seconds: float
    damaged: list[Damaged]  # runs whose log could not be read or folded: none rebuilt


def reindex(store: Store, run_ids: Sequence[str] | None = None, *,
            views: Sequence[Callable[[Store, str], None]] = (),
            progress: Callable[[int, int], None] | None = None) -> ReindexReport:
    """Fold each run's log (of ``run_ids``, or every run) and store its outline again;
    each of ``views`` rebuilds the views a kind of run keeps beside its log (a LangGraph
    thread's: ``rebuild_thread_index``); ``progress(done, total)`` after each run."""
    ids = list(run_ids) if run_ids is not None else [i.run_id for i in store.list_runs()]
    started = time.perf_counter()
    damaged: list[Damaged] = []
    events = rebuilt = 0
    with gc_paused():
        for done, run_id in enumerate(ids, 1):
            try:
                state = advance(None, store.read(run_id))
                store.put_outline(run_id, state)
                for rebuild in views:
                    rebuild(store, run_id)
            except JournalError as exc:
                damaged.append(Damaged(run_id, str(exc)))
            except Exception as exc:  # a payload the fold's rules cannot read
                damaged.append(Damaged(run_id, f"its events do not fold ({exc!r})"))
            else:
                events += state.last_seq
                rebuilt += 1
            if progress is not None:
                progress(done, len(ids))
    return ReindexReport(rebuilt, events, time.perf_counter() - started, damaged)
