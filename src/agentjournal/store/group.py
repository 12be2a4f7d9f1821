"""Group commit: the appends that arrive while a group commits go together in the next.

A thread that appends while no group is committing leads at once (a lone writer waits
for nothing); one that arrives while a group commits waits, on a lock of its own, until
that group is done, and the first of those waiting then leads every append waiting at
that moment. The leader's ``commit`` settles each pending append (its ``result``, or its
``error``) and none is woken before the commit that holds it returned. SQLite's and
PostgreSQL's stores both group their appends with it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class GroupCommit(StrEnum):
    """How a store groups the appends of concurrent runs (``?group_commit=``).

    ``on`` (default): appends that meet while a group commits go in one transaction;
    a lone append commits alone at once. ``off``: every append is its own transaction.
    ``always``: every append takes the group's transaction, even alone (to test that
    path, or to compare it)."""

    ON = "on"
    OFF = "off"
    ALWAYS = "always"


def _held() -> threading.Lock:
    """A lock already held: its owner sleeps on it until another thread releases it."""
    lock = threading.Lock()
    lock.acquire()
    return lock


@dataclass(slots=True)
class Pending:
    """One append waiting for its group's commit, and how it ended."""

    item: Any
    result: Any = None
    error: BaseException | None = None
    done: bool = False
    #: Held until its thread is woken, once: its group committed, or it leads the next.
    #: (A lock per append, not one condition for all: a hundred waiters woken together
    #: would queue for the condition's lock, under the GIL.)
    wake: threading.Lock = field(default_factory=_held)


class Grouper:
    """Leader/follower group commit around ``commit(group)``, which must settle every
    pending append of ``group`` (set ``result`` or ``error``); an exception it raises is
    every one's error."""

    def __init__(self, commit: Callable[[list[Pending]], None], *, alone: bool = False) -> None:
        self._commit = commit
        self._alone = alone  # group_commit=off: each leader takes one append
        self._lock = threading.Lock()  # guards _waiting and _leading
        self._waiting: list[Pending] = []
        self._leading = False

    def submit(self, item: Any) -> Any:
        """``item`` committed in a group; its result, or its error raised."""
        mine = Pending(item)
        with self._lock:
            self._waiting.append(mine)
            leads, self._leading = not self._leading, True
        if not leads:
            mine.wake.acquire()  # its group committed, or it leads the next group
        if not mine.done:
            self._lead(mine)
        if mine.error is not None:
            raise mine.error
        return mine.result

    def _lead(self, mine: Pending) -> None:
        with self._lock:
            if self._alone:
                group, self._waiting = [mine], [p for p in self._waiting if p is not mine]
            else:
                group, self._waiting = self._waiting, []
        try:
            self._commit(group)
        except BaseException as exc:
            for one in group:
                if one.error is None:
                    one.error = exc
        finally:
            for one in group:
                one.done = True
            with self._lock:
                if self._waiting:
                    self._waiting[0].wake.release()
                else:
                    self._leading = False
            for one in group:
                if one is not mine:
                    one.wake.release()
