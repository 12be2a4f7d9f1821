"""``JournalSession``: an OpenAI Agents SDK session kept in an agentjournal log.

A session is the SDK's conversation memory. Here it is a log of its own in the store
(run id ``session:<session_id>``), of three facts:

- ``session_items_added{items}``: one ``add_items`` call, one atomic append, so a crash
  never leaves half a batch (a model's call without its output, or the reverse);
- ``session_item_popped{index}`` and ``session_cleared{count}``: recorded, never deleted;
  the log keeps every item ever added;
- ``get_items(limit)`` is the fold of those facts (``RunState.session``).

It refuses to store a tool's output whose call is not in the session (nor one with no
call_id, an empty one, or one naming no call of its kind, such as a message's id): that
is the state which makes every later request fail with "No tool call found for function
call output" (openai-agents-python#4827), refused when it would be written instead of
found at the next turn. Several writers (processes, hosts on PostgreSQL) may share a session:
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
    """A tool output that answers no call of the session (nor one earlier in the same
    batch): its ``call_id`` is missing or empty, or names no call of its kind (e.g. a
    message's id).

    Stored, it would make every later request of the conversation fail with "No tool
    call found for function call output"; nothing of the batch was stored."""

    def __init__(self, session_id: str, call_id: str, item_type: str) -> None:
        named = f"for call {call_id!r}, which is not in the session" if call_id else (
            "with no call_id: it answers no call")
        super().__init__(
            f"session {session_id!r}: refusing a {item_type} {named}: the model would be "
            "sent an output without its call, and every later turn would fail (HTTP 400 "
            "'No tool call found for function call output'). Add the call's item first (in "
            "the same add_items batch, before its output) and give the output that call's "
            "call_id; nothing of this batch was stored.",
            run_id=session_run_id(session_id))
        self.session_id, self.call_id, self.item_type = session_id, call_id, item_type


def session_run_id(session_id: str) -> str:
    """The run id of the log that holds session ``session_id``: ``session:<id>``."""
    return validate_run_id(f"session:{session_id}")


#: Each kind of tool output and the kind of call it answers (as the SDK pairs them).
_CALL_OF_OUTPUT = {
    "function_call_output": "function_call", "computer_call_output": "computer_call",
    "custom_tool_call_output": "custom_tool_call", "shell_call_output": "shell_call",
    "local_shell_call_output": "local_shell_call", "apply_patch_call_output": "apply_patch_call",
    "program_output": "program", "tool_search_output": "tool_search_call",
}
_CALLS = frozenset(_CALL_OF_OUTPUT.values())
#: A tool search the API ran itself may have no ids: its output answers such a call.
_ANONYMOUS = frozenset({"tool_search_call"})
#: A call as an output names it: (the call's kind, its call_id; None when it has none).
Named = tuple[str, str | None]


def _is_output(item: dict[str, Any]) -> bool:
    kind = item.get("type")
    return isinstance(kind, str) and kind.endswith("_output")


def _call_id(item: dict[str, Any]) -> str | None:
    """The call an item names: its ``call_id`` (a local shell output's may be its ``id``,
    as the API's type has it); None when it has none or an empty one."""
    call_id = item.get("call_id")
    if call_id is None and item.get("type") == "local_shell_call_output":
        call_id = item.get("id")
    return call_id if isinstance(call_id, str) and call_id else None


def _named_call(item: dict[str, Any]) -> Named | None:
    """The name an output would give this item if it is a call (only a call is: a
    message's or an output's id is not), else None."""
    kind, call_id = item.get("type"), _call_id(item)
    if kind in _CALLS and (call_id is not None or kind in _ANONYMOUS):
        return (str(kind), call_id)
    return None


def _answers(output: dict[str, Any], calls: set[Named]) -> bool:
    """Whether a tool output answers one of ``calls``: a call of its kind with its
    non-empty call_id (an unknown kind of output: a call of any kind with it)."""
    call_id, kind = _call_id(output), _CALL_OF_OUTPUT.get(str(output["type"]))
    if kind is None:
        return call_id is not None and any(call_id == named for _, named in calls)
    return (kind, call_id) in calls and (call_id is not None or kind in _ANONYMOUS)


def orphan_outputs(held: list[dict[str, Any]], batch: list[dict[str, Any]]) -> list[
        dict[str, Any]]:
    """The items of ``batch`` that are tool outputs answering no call ``held`` or
    ``batch`` (before them) holds: with no call_id, an empty one, or one that names no
    call of the output's kind."""
    calls = {named for i in held if (named := _named_call(i)) is not None}
    orphans = []
    for item in batch:
        if _is_output(item):
            if not _answers(item, calls):
                orphans.append(item)
        elif (named := _named_call(item)) is not None:
            calls.add(named)
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
                raise OrphanToolOutputError(self.session_id, _call_id(orphans[0]) or "",
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
