"""agentjournal under the OpenAI Agents SDK (the ``openai-agents`` extra).

- :class:`JournalSession`: the SDK's ``Session`` (conversation memory) kept in an
  agentjournal log: atomic batches, pops and clears recorded, an orphaned tool output
  refused. It does not import the SDK (which takes seconds to import).
"""

from __future__ import annotations

from .session import JournalSession, OrphanToolOutputError, session_run_id

__all__ = ["JournalSession", "OrphanToolOutputError", "session_run_id"]
