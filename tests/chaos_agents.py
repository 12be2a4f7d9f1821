"""The ledger agent of tests/test_fleet_chaos.py, run by worker processes as
``tests.chaos_agents:ledger_agent`` (workers start with the repository root as cwd).

Configured by environment variables, since a worker loads it by name:

    CHAOS_LEDGER_URL       the LedgerService's URL (required)
    CHAOS_MODEL_DELAY      seconds each model turn takes (default 0.4)
    CHAOS_SNAPSHOT_EVERY   the agent's snapshot_every (default 3)

A run reads one ledger, then posts ``parts_of(run_id)`` corrections, one per turn,
each with a correction id of its own run (``correction_ids(run_id)``), so runs never
collide at the ledger; then it answers. The tools are the reconcile demo's in
``lookup`` mode: an uncertain correction is settled by asking the ledger.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

from agentjournal import Agent
from agentjournal.demo.reconcile import LEDGERS, ledger_tools
from agentjournal.models import ModelRequest, ModelResponse, ScriptedModel, calls, reply
from agentjournal.policy import Budget

URL_ENV, DELAY_ENV, SNAPSHOT_ENV = "CHAOS_LEDGER_URL", "CHAOS_MODEL_DELAY", "CHAOS_SNAPSHOT_EVERY"
MIN_PARTS, MAX_PARTS = 3, 8


def parts_of(run_id: str) -> int:
    """How many corrections the run posts (3-8, fixed by its id): runs end at
    different times, so the chaos keeps finding runs in flight."""
    spread = MAX_PARTS - MIN_PARTS + 1
    return MIN_PARTS + int(hashlib.sha256(run_id.encode()).hexdigest(), 16) % spread


def correction_ids(run_id: str) -> list[str]:
    return [f"{run_id}-c{p}" for p in range(1, parts_of(run_id) + 1)]


def _correct(part: int) -> Any:
    def turn(request: ModelRequest) -> ModelResponse:
        if part > parts_of(request.run_id):
            return reply(f"Posted {parts_of(request.run_id)} corrections.")
        return calls(("post_correction", {
            "correction_id": f"{request.run_id}-c{part}",
            "ledger": LEDGERS[part % len(LEDGERS)], "amount": part,
            "memo": f"chaos run {request.run_id}"}), text=f"Correction {part}.")
    return turn


def ledger_agent() -> Agent:
    url = os.environ[URL_ENV]
    delay = float(os.environ.get(DELAY_ENV, "0.4"))
    script = [calls(("read_ledger", {"name": LEDGERS[0]})),
              *(_correct(p) for p in range(1, MAX_PARTS + 1)), reply("done")]
    return Agent(ScriptedModel(script, delay=delay), ledger_tools(url, "lookup"),
                 snapshot_every=int(os.environ.get(SNAPSHOT_ENV, "3")),
                 budget=Budget(max_turns=len(script) + 10, max_tool_calls=200))
