"""The agent of tests/test_fleet_versions.py in two releases, run by worker processes as
``tests.versioned_agents:ledger``. Which release a worker's code is comes from its
environment, as a deploy would give it other code:

    VERSIONED_RELEASE   "v1" (the old release), "v2" (the new one) or "v2+v1" (the new
                        one still serving runs pinned to v1: a rollout)
    VERSIONED_LEDGER    the LedgerService's URL

A run posts one correction (an irreversible effect at the ledger), then files a
ticket a person must approve (it waits), then answers. v2 changes the instructions.
"""

from __future__ import annotations

import os

from agentjournal import Agent
from agentjournal.demo.reconcile import LEDGERS, ledger_tools
from agentjournal.fleet import Versions
from agentjournal.models import ModelRequest, ModelResponse, ScriptedModel, calls, reply
from agentjournal.policy import Rules

RELEASE_ENV, URL_ENV = "VERSIONED_RELEASE", "VERSIONED_LEDGER"
INSTRUCTIONS = {"v1": "Post the correction, then file a ticket for it.",
                "v2": "Post the correction, then file a ticket for it. Keep memos short."}


def _post(request: ModelRequest) -> ModelResponse:
    return calls(("post_correction", {"correction_id": f"{request.run_id}-c1",
                                      "ledger": LEDGERS[0], "amount": 1,
                                      "memo": f"versioned run {request.run_id}"}))


def _ticket(request: ModelRequest) -> ModelResponse:
    return calls(("file_ticket", {"ticket_id": f"{request.run_id}-t1",
                                  "title": "correction posted", "body": request.run_id}))


def release(version: str) -> Agent:
    """The agent as release ``version`` has it."""
    return Agent(ScriptedModel([_post, _ticket, reply("done")]),
                 ledger_tools(os.environ[URL_ENV], "lookup"),
                 policy=Rules(require_approval={"file_ticket"}),
                 instructions=INSTRUCTIONS[version], version=version)


def ledger() -> Versions:
    """The versions this process's release serves, newest first."""
    return Versions(*(release(v) for v in os.environ[RELEASE_ENV].split("+")))
