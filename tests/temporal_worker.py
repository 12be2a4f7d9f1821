"""Temporal worker processes for tests/test_temporal.py (run from the repository root):

    python -m tests.temporal_worker --address HOST:PORT --task-queue Q --store URL
                                    --receiver URL

Registers agentjournal's plugin with the test agents below, and a plain Temporal
workflow (``plain.Post``) whose activity posts one effect with no journal: the baseline.
``AGENTJOURNAL_FAULT`` in the environment kills (or stops) the process at a fault point;
the plain activity has its own ``after_effect`` point, right after the receiver answered.
Prints ``worker ready`` once polling.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from datetime import timedelta
from typing import Any

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.worker import Worker

from agentjournal import Agent, Budget, Rules, ScriptedModel, calls, reply, tool
from agentjournal.demo.ledger import http_json
from agentjournal.faults import fault_point
from agentjournal.temporal import AgentJournalPlugin
from agentjournal.tools import Tool, ToolContext

from .crash_agent import effect_tool

HEARTBEAT = 2.0  # seconds: Temporal's heartbeat timeout and each agent's lease TTL
LONG_STEPS = 1000
SLOW_POSTS = 30  # the "slow" agent posts p0..p29, one a turn, each turn 0.1 s
READY = "worker ready"


def blind_tool(url: str) -> Tool:
    """``post_effect`` with no lookup: an uncertain call can only be settled by a person."""

    @tool(effect="irreversible", identity=["label"])
    def post_effect(ctx: ToolContext, label: str) -> dict[str, Any]:
        """Apply the effect named `label` once at the receiver."""
        return dict(http_json("POST", f"{url}/effects", {"label": label},
                              {"Idempotency-Key": ctx.key})[1])

    return post_effect


@tool(effect="read_only")
def count(i: int) -> int:
    """Count one step."""
    return i


def agents(url: str) -> dict[str, Agent]:
    post = ScriptedModel([calls(("post_effect", {"label": "a"})), reply("posted")])
    return {
        "post": Agent(post, [effect_tool(url, set(), set())], lease_ttl=HEARTBEAT),
        "post_blind": Agent(post, [blind_tool(url)], lease_ttl=HEARTBEAT),
        "approval": Agent(post, [effect_tool(url, set(), set())], lease_ttl=HEARTBEAT,
                          policy=Rules(require_approval=["post_effect"])),
        "slow": Agent(ScriptedModel([calls(("post_effect", {"label": f"p{i}"}))
                                     for i in range(SLOW_POSTS)] + [reply("posted all")],
                                    delay=0.1),
                      [effect_tool(url, set(), set())], lease_ttl=HEARTBEAT),
        "long": Agent(ScriptedModel([calls(("count", {"i": i})) for i in range(LONG_STEPS)]
                                    + [reply("counted")]), [count], lease_ttl=HEARTBEAT,
                      snapshot_every=200, budget=Budget.unlimited()),
    }


class Plain:
    def __init__(self, url: str) -> None:
        self.url = url

    @activity.defn(name="plain.post")
    def post(self, label: str) -> dict[str, Any]:
        info = activity.info()
        key = f"{info.workflow_run_id}:{info.activity_id}"  # Temporal's own key recipe
        answer = http_json("POST", f"{self.url}/effects", {"label": label},
                           {"Idempotency-Key": key})[1]
        fault_point("after_effect")
        return {"answer": answer, "attempt": info.attempt}


@workflow.defn(name="plain.Post", sandboxed=False)
class PlainPost:
    @workflow.run
    async def run(self, label: str) -> dict[str, Any]:
        result: dict[str, Any] = await workflow.execute_activity(
            "plain.post", label, start_to_close_timeout=timedelta(seconds=60),
            heartbeat_timeout=timedelta(seconds=HEARTBEAT))
        return result


async def serve(address: str, task_queue: str, store: str, url: str) -> None:
    import concurrent.futures

    plugin = AgentJournalPlugin(agents(url), store, single_host=True)
    client = await Client.connect(address, plugins=[plugin])
    plain = Plain(url)
    worker = Worker(client, task_queue=task_queue, workflows=[PlainPost],
                    activities=[plain.post],
                    activity_executor=concurrent.futures.ThreadPoolExecutor(8),
                    graceful_shutdown_timeout=timedelta(seconds=10),
                    # No sticky queue: the workflow's next task need not wait for a killed
                    # worker's sticky timeout (10 s) before another worker takes it.
                    max_cached_workflows=0)
    stopping = asyncio.Event()  # SIGTERM: a graceful shutdown, as a deploy does
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
    async with worker:
        print(READY, flush=True)
        await stopping.wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", required=True)
    parser.add_argument("--task-queue", required=True)
    parser.add_argument("--store", required=True)
    parser.add_argument("--receiver", required=True)
    args = parser.parse_args()
    asyncio.run(serve(args.address, args.task_queue, args.store, args.receiver))
    # The worker has shut down. The SDK's native threads can still call into Python
    # while the interpreter finalizes, and that aborts the process ("PyGILState_Release:
    # thread state must be current", SIGABRT; once in about 40 shutdowns here).
    # Nothing is left to finalize, so leave without it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
