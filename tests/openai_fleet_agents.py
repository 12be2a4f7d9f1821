"""SDK agents for tests/test_openai_agents_fleet.py, driven by a real worker process as
``tests.openai_fleet_agents:NAME`` (each a factory annotated to return a JournalAgent).
The receiver's URL comes from ``$OPENAI_FLEET_RECEIVER``; the labels from the run id, so
the test counts each run's effects at the receiver."""

from __future__ import annotations

import os

from agentjournal.integrations.openai_agents import JournalAgent
from tests.openai_agents_child import poster as _poster

RECEIVER = "OPENAI_FLEET_RECEIVER"


def poster() -> JournalAgent:
    """Posts a and b (irreversible, with a lookup), then says so."""
    agent, policies = _poster(os.environ[RECEIVER], prefix="fleet-")
    return JournalAgent(agent, policies=policies)


def approved_poster() -> JournalAgent:
    """The same, each call waiting for a person's approval first."""
    agent, policies = _poster(os.environ[RECEIVER], prefix="fleet-approved-", approval=True)
    return JournalAgent(agent, policies=policies)
