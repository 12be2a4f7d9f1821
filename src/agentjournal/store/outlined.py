"""What every backend shares to keep each run's outline (projections.py) beside its log.

A writer advances a run's outline with the events it appends and stores it in the same
transaction. It needs the outline the run had at the append's expected seq: the one
this handle stored last (``OutlineCache``), else the stored one, else a fold of the log.
A read takes the stored outlines and folds, in memory, the events after any that is
behind its run's head (written by a writer that kept none: an older release, another
program), so what it serves is never stale (``served``).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import suppress
from contextvars import ContextVar
from dataclasses import dataclass

from ..errors import CorruptLogError, JournalError
from ..events import Event
from ..projections import OUTLINE_VERSION, advance, decode, encode, needs_a_person
from ..state import RunState

log = logging.getLogger("agentjournal")

#: Runs whose outline a handle remembers (the most recently appended to).
REMEMBERED = 4096
#: A rebuild of outlines says how far it got every this many runs.
PROGRESS_EVERY = 1000


@dataclass(slots=True, frozen=True)
class Stored:
    """One run's row as a backend reads it: its head's seq, and its outline (None when
    it has none, or one of another OUTLINE_VERSION)."""

    run_id: str
    head: int
    seq: int | None
    body: bytes | None


#: The seq and status of the outline a store holds for a run, as a handle knows it.
Kept = tuple[int, str]

#: How many events a stored outline may lag behind its run's head where a store writes
#: outlines only when due (SQLite, see ``due``); a read folds the events after it.
LAG = 16


def due(kept: Kept | None, state: RunState) -> bool:
    """Whether a writer stores the outline ``state`` with its append: when it does not
    know what the store holds, when the status changes (a run that stops is stored as it
    stopped), or ``LAG`` events after the stored one. In between, the stored outline
    lags: a page written per append for a run in full flight saves a reader a fold of at
    most ``LAG`` events."""
    return kept is None or kept[1] != state.status or state.last_seq - kept[0] >= LAG


class OutlineCache:
    """The outline each run had after this handle's last append to it (seq, bytes), and
    the seq and status of the one the store holds, if known."""

    def __init__(self) -> None:
        self._runs: OrderedDict[str, tuple[int, bytes, Kept | None]] = OrderedDict()

    def get(self, run_id: str, seq: int) -> bytes | None:
        found = self._runs.get(run_id)
        return found[1] if found is not None and found[0] == seq else None

    def kept(self, run_id: str, seq: int) -> Kept | None:
        """What the store holds of the run, known when its outline at ``seq`` is here."""
        found = self._runs.get(run_id)
        return found[2] if found is not None and found[0] == seq else None

    def put(self, run_id: str, seq: int, body: bytes, kept: Kept | None = None) -> None:
        """``kept``: what the store holds of the run (None: not known)."""
        self._runs.pop(run_id, None)
        self._runs[run_id] = (seq, body, kept)
        if len(self._runs) > REMEMBERED:
            self._runs.popitem(last=False)

    def drop(self, run_id: str) -> None:
        self._runs.pop(run_id, None)

    def clear(self) -> None:
        self._runs.clear()


#: A store's read: (run id, after seq, upto=last seq) -> its events.
Reader = Callable[..., Iterator[Event]]


#: What a handle remembers of a run whose log does not fold (a payload the fold's rules
#: cannot read: the store keeps any log; a reader folding it gets the error).
UNFOLDABLE = b""


def base_outline(run_id: str, expected_seq: int, cached: bytes | None,
                 stored: Callable[[], tuple[int, bytes] | None], read: Reader
                 ) -> RunState | None:
    """The run's outline at ``expected_seq``: the cached bytes, else the ``stored``
    outline (with the events it lacks folded in), else a fold of the log; None for a
    new run."""
    if expected_seq == 0:
        return None
    if cached is not None:
        if cached == UNFOLDABLE:
            raise ValueError(f"run {run_id!r} does not fold")
        return decode(cached, run_id)
    base = None
    found = stored()
    if found is not None and found[0] <= expected_seq:
        with suppress(CorruptLogError):  # a damaged outline: the log says it again
            base = decode(found[1], run_id, found[0])
    after = base.last_seq if base is not None else 0
    if after == expected_seq:
        return base
    return advance(base, read(run_id, after, upto=expected_seq))


def outline_after(base: Callable[[], RunState | None], events: Sequence[Event]
                  ) -> tuple[RunState | None, bytes]:
    """The outline after ``events`` from the one ``base`` gives, and its stored bytes;
    (None, UNFOLDABLE) when the log does not fold: its append goes in all the same, with
    no outline (a reader's fold says what is wrong)."""
    try:
        st = advance(base(), events)
    except Exception:  # any payload the rules cannot read
        return None, UNFOLDABLE
    return st, encode(st)


def served(rows: Iterable[Stored], read: Reader, *, attention: bool = False
           ) -> dict[str, RunState | JournalError]:
    """Each run's outline as of its head: the stored one when it is there, else caught
    up from the log (in memory; a read writes nothing). A run whose log cannot be read
    maps to the error. ``attention``: only runs a person may be asked about (and errors)."""
    out: dict[str, RunState | JournalError] = {}
    for row in rows:
        try:
            base = None
            if row.body is not None and row.seq is not None and row.seq <= row.head:
                with suppress(CorruptLogError):  # a damaged outline: the log says it again
                    base = decode(row.body, row.run_id, row.seq)
            if base is not None and base.last_seq == row.head:
                out[row.run_id] = base
                continue
            after = base.last_seq if base is not None else 0
            out[row.run_id] = advance(base, read(row.run_id, after, upto=row.head))
        except JournalError as exc:
            out[row.run_id] = exc
        except Exception as exc:  # a payload the fold's rules cannot read
            out[row.run_id] = CorruptLogError(row.run_id, row.head,
                                              f"its events do not fold ({exc!r})")
    if attention:
        return {k: v for k, v in out.items()
                if not isinstance(v, RunState) or needs_a_person(v)}
    return out


#: Told (runs done, runs in all) as a writer's open projects the runs of a store an older
#: release wrote (see project); the CLI shows it as progress. Unset: log lines.
projecting: ContextVar[Callable[[int, int], None] | None] = ContextVar("projecting",
                                                                       default=None)


def project(url: str, rows: Sequence[Stored], read: Reader,
            put: Callable[[str, RunState], None]) -> None:
    """Give each run of ``rows`` (its outline missing, of another version or behind its
    head) the outline of a fresh fold of its log: a store an older release wrote, at a
    writer's first open. A damaged log gets none (a read says why). ``put`` stores one
    run's outline in its own transaction: a crash keeps what was done."""
    told = projecting.get()
    if len(rows) > PROGRESS_EVERY:
        log.warning("%s: projecting %d runs from their logs (once)", url, len(rows))
    for done, row in enumerate(rows, 1):
        fresh = served([Stored(row.run_id, row.head, None, None)], read)[row.run_id]
        if isinstance(fresh, RunState):
            put(row.run_id, fresh)
        if told is not None:
            told(done, len(rows))
        elif done % PROGRESS_EVERY == 0:
            log.info("%s: %d of %d runs projected", url, done, len(rows))


__all__ = ["LAG", "OUTLINE_VERSION", "PROGRESS_EVERY", "Kept", "OutlineCache", "Stored",
           "UNFOLDABLE", "base_outline", "due", "outline_after", "project", "projecting",
           "served"]
