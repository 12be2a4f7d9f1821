"""``JournalSession``: an OpenAI Agents SDK session kept in an agentjournal log.

A session is the SDK's conversation memory. Here it is a log of its own in the store
(run id ``session:<session_id>``), of three facts:

- ``session_items_added{items}``: one ``add_items`` call, one atomic append, so a crash
  never leaves half a batch (a model's call without its output, or the reverse);
- ``session_item_popped{index}`` and ``session_cleared{count}``: recorded, never deleted;
  the log keeps every item ever added;
- ``get_items(limit)`` is the fold of those facts (``RunState.session``).

It refuses to store a tool's output whose call is not in the session: that is the
state which makes every later request fail with "No tool call found for function call
output" (openai-agents-python#4827), refused when it would be written instead of found
at the next turn. Several writers (processes, hosts on PostgreSQL) may share a session:
each append names the seq it follows, and one that lost the race reads what it missed
and tries again.

The class is the SDK's ``Session`` protocol by shape (the SDK checks it structurally);
it imports the SDK only to read ``session_settings`` given as a dict.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec

from ...errors import ConflictError, JournalError, RunNotFoundError
from ...events import EventType, make_events
from ...redaction import Redaction
from ...state import RunState, apply
from ...store import Store, validate_run_id

if TYPE_CHECKING:
    from agents import RunContextWrapper, SessionSettings, TResponseInputItem

__all__ = ["JournalSession", "OrphanToolOutputError", "session_run_id"]

_T = TypeVar("_T")
Facts = list[tuple[EventType, dict[str, Any]]]


class OrphanToolOutputError(JournalError, ValueError):
    """A tool output whose call is not in the session (nor earlier in the same batch).

    Stored, it would make every later request of the conversation fail with "No tool
    call found for function call output"; nothing of the batch was stored."""

    def __init__(self, session_id: str, call_id: str, item_type: str) -> None:
        super().__init__(
            f"session {session_id!r}: refusing a {item_type} for call {call_id!r}, which is "
            "not in the session: the model would be sent an output without its call, and "
            "every later turn would fail (HTTP 400 'No tool call found for function call "
            "output'). Add the call's item first (in the same add_items batch, before its "
            "output); nothing of this batch was stored.",
            run_id=session_run_id(session_id))
        self.session_id, self.call_id, self.item_type = session_id, call_id, item_type


def session_run_id(session_id: str) -> str:
    """The run id of the log that holds session ``session_id``: ``session:<id>``."""
    return validate_run_id(f"session:{session_id}")


def _is_output(item: dict[str, Any]) -> bool:
    kind = item.get("type")
    return isinstance(kind, str) and kind.endswith("_output") and bool(item.get("call_id"))


def orphan_outputs(held: list[dict[str, Any]], batch: list[dict[str, Any]]) -> list[
        dict[str, Any]]:
    """The items of ``batch`` that answer a call neither ``held`` nor ``batch`` (before
    them) holds: a ``*_output`` item with a ``call_id`` no earlier call item has."""
    calls = {i.get("call_id") for i in held if not _is_output(i)}
    orphans = []
    for item in batch:
        if _is_output(item):
            if item["call_id"] not in calls:
                orphans.append(item)
        else:
            calls.add(item.get("call_id"))
    return orphans


class JournalSession:
    """The SDK's ``Session`` protocol over an agentjournal store.

    ``session_id`` names the conversation (its log is ``session:<session_id>``).
    ``scope``: for a context-aware session, a function of the run's ``RunContextWrapper``
    naming the part of the conversation a run sees (e.g. the tenant in its context);
    each scope is a log of its own, ``session:<session_id>:<scope>``. Every method takes
    ``wrapper=`` (the SDK passes it to sessions that accept it); without ``scope`` it is
    not used. ``redaction`` is applied to every item before it is stored (default: the
    default rules, as a run's journal does): a secret in an item is returned redacted.
    """

    session_settings: SessionSettings | None = None

    def __init__(self, store: Store, session_id: str, *,
                 session_settings: SessionSettings | dict[str, Any] | None = None,
                 scope: Callable[[RunContextWrapper[Any]], str] | None = None,
                 redaction: Redaction | None = None) -> None:
        self.store = store
        self.session_id = session_id
        self.run_id = session_run_id(session_id)
        self.session_settings = None if session_settings is None else _settings(
            session_settings)
        self.scope = scope
        self.redaction = Redaction() if redaction is None else redaction
        self._states: dict[str, RunState] = {}  # by run id: folded up to what we read
        self._lock = threading.Lock()  # one read-fold-append at a time in this process

    # --- the protocol ---------------------------------------------------------------

    async def get_items(self, limit: int | None = None, *,
                        wrapper: RunContextWrapper[Any] | None = None,
                        ) -> list[TResponseInputItem]:
        """The session's items, oldest first; with ``limit``, the newest ``limit`` of
        them (``session_settings.limit`` when not given; 0 gives none)."""
        if limit is None and self.session_settings is not None:
            limit = self.session_settings.limit
        items = await asyncio.to_thread(self._items, self._run_of(wrapper), limit)
        return items  # type: ignore[return-value]  # the SDK's input items are JSON dicts

    async def add_items(self, items: list[TResponseInputItem], *,
                        wrapper: RunContextWrapper[Any] | None = None) -> None:
        """Append ``items`` in one atomic batch; OrphanToolOutputError (nothing stored)
        if one is a tool output whose call is neither in the session nor before it."""
        if not items:
            return
        batch: list[dict[str, Any]] = [dict(i) for i in items]

        def facts(state: RunState) -> Facts:
            if orphans := orphan_outputs(state.session or [], batch):
                raise OrphanToolOutputError(self.session_id, orphans[0]["call_id"],
                                            orphans[0]["type"])
            return [(EventType.SESSION_ITEMS_ADDED, {"items": batch})]

        await _settled(asyncio.to_thread(self._append, self._run_of(wrapper), facts))

    async def pop_item(self, *, wrapper: RunContextWrapper[Any] | None = None,
                       ) -> TResponseInputItem | None:
        """Remove the newest item from the session (recorded; the log keeps it) and
        return it; None when the session is empty."""
        popped: list[dict[str, Any]] = []

        def facts(state: RunState) -> Facts:
            popped.clear()
            if not state.session:
                return []
            popped.append(state.session[-1])
            return [(EventType.SESSION_ITEM_POPPED, {"index": len(state.session) - 1})]

        await _settled(asyncio.to_thread(self._append, self._run_of(wrapper), facts))
        return _copy(popped)[0] if popped else None  # type: ignore[return-value]

    async def clear_session(self, *, wrapper: RunContextWrapper[Any] | None = None) -> None:
        """Empty the session (recorded; the log keeps every item)."""
        def facts(state: RunState) -> Facts:
            return [(EventType.SESSION_CLEARED, {"count": len(state.session)})] if (
                state.session) else []

        await _settled(asyncio.to_thread(self._append, self._run_of(wrapper), facts))

    # --- the log --------------------------------------------------------------------

    def _run_of(self, wrapper: RunContextWrapper[Any] | None) -> str:
        if self.scope is None or wrapper is None:
            return self.run_id
        return session_run_id(f"{self.session_id}:{self.scope(wrapper)}")

    def _items(self, run_id: str, limit: int | None) -> list[dict[str, Any]]:
        """A copy of the newest ``limit`` items (all for None or a negative limit, as
        SQLiteSession): the caller may change them without changing the session."""
        with self._lock:
            items = self._read(run_id).session or []
            if limit is not None and limit >= 0:
                items = items[max(0, len(items) - limit):] if limit else []
            return _copy(items)

    def _read(self, run_id: str) -> RunState:
        """The session's state, folded up to the log's end (only the new tail is read)."""
        state = self._states.setdefault(run_id, RunState())
        try:
            for event in self.store.read(run_id, after_seq=state.last_seq):
                apply(state, event)
        except RunNotFoundError:
            if state.last_seq:
                raise  # it had events: gone now is not "empty"
        return state

    def _append(self, run_id: str, facts_for: Callable[[RunState], Facts]) -> None:
        """Append the facts ``facts_for`` derives from the session's current state, in
        one batch; when another writer appended first, read that and derive again."""
        with self._lock:
            while True:
                state = self._read(run_id)
                facts = [(kind, self.redaction.payload(p)) for kind, p in facts_for(state)]
                if not facts:
                    return
                events = make_events(run_id, state.last_seq, 0, facts)
                try:
                    self.store.append(run_id, events, expected_seq=state.last_seq, epoch=0)
                except ConflictError:
                    continue  # another writer's batch landed first
                for event in events:
                    apply(state, event)
                return


def _settings(given: SessionSettings | dict[str, Any]) -> SessionSettings:
    # Imported only here: a session without settings never loads the SDK (slow to import).
    from agents.memory.session_settings import coerce_session_settings

    return coerce_session_settings(given)


def _copy(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return msgspec.json.decode(msgspec.json.encode(items))  # type: ignore[no-any-return]


async def _settled(mutation: Awaitable[_T]) -> _T:
    """The mutation's outcome even if the caller is cancelled meanwhile (then re-raised
    after it): a cancelled ``add_items`` never leaves its caller unsure whether it landed."""
    task = asyncio.ensure_future(mutation)
    cancelled: asyncio.CancelledError | None = None
    while not task.done():
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError as exc:
            cancelled = cancelled or exc
    result = task.result()
    if cancelled is not None:
        raise cancelled
    return result
