"""agentjournal under the OpenAI Agents SDK (the ``openai-agents`` extra).

- :class:`JournalSession`: the SDK's ``Session`` (conversation memory) kept in an
  agentjournal log: atomic batches, pops and clears recorded, an orphaned tool output
  refused. It does not import the SDK (which takes seconds to import).
- :class:`JournalRunner`: the SDK's ``Runner`` with model calls and tool calls
  journaled (see runner.py), streamed too (:class:`JournaledStream`),
  :class:`ToolPolicy` per tool, ``mcp_effect``.
- :class:`JournalAgent`: an SDK agent that a fleet worker drives (a ``Runnable``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .session import JournalSession, OrphanToolOutputError, session_run_id

if TYPE_CHECKING:
    from .runner import JournalAgent, JournaledStream, JournalRunner, ToolPolicy, mcp_effect

__all__ = ["JournalAgent", "JournalRunner", "JournalSession", "JournaledStream",
           "OrphanToolOutputError", "ToolPolicy", "mcp_effect", "session_run_id"]

_RUNNER = ("JournalAgent", "JournalRunner", "JournaledStream", "ToolPolicy", "mcp_effect")


def __getattr__(name: str) -> Any:
    # The runner imports the SDK: only when it is asked for.
    if name in _RUNNER:
        from ...errors import MissingExtraError

        try:
            from . import runner
        except ImportError as exc:
            if exc.name is not None and exc.name.split(".")[0] in ("agents", "openai"):
                raise MissingExtraError("openai-agents", "openai-agents") from exc
            raise
        return getattr(runner, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
