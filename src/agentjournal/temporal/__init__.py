"""agentjournal on Temporal (the ``[temporal]`` extra): a run as a workflow whose one
activity runs the unchanged ``Agent.run``, so an effect that may have happened is
reconciled from the journal, never re-run blindly by Temporal's retries.

    plugin = AgentJournalPlugin(agents={"reconcile": agent}, store="postgresql://...")
    client = await Client.connect("localhost:7233", plugins=[plugin])
    await Worker(client, task_queue="agents").run()
    # elsewhere:
    await client.start_workflow(JournalRun.run, Start(agent="reconcile", run_id="q3",
                                task="..."), id="q3", task_queue="agents")
"""

from __future__ import annotations

from .activities import AgentJournalPlugin, summary_of
from .messages import Approve, Resolve, RunSummary, Start
from .workflow import JournalRun

__all__ = ["AgentJournalPlugin", "Approve", "JournalRun", "Resolve", "RunSummary", "Start",
           "summary_of"]
