"""Child process for tests/test_pydantic_subagent.py: a Pydantic AI agent ("orchestrator")
whose tool ``delegate`` runs another Pydantic AI agent ("worker"), each made durable by
``JournalDurability`` in the same store. The worker's run is ``{run_id}-worker``.

    python -m tests.pydantic_subagent --store URL --run-id ID --receiver URL --label L
                                      [--parent-lookup] [--worker-lookup]

The orchestrator's model asks for ``delegate(L)`` and then reports what it answered. The
worker's model asks for ``post_effect(L)`` (tests/pydantic_agent.py: irreversible, it POSTs
to the receiver, tests/crash_agent.py, which counts what it is sent) and then says what
was posted. ``--parent-lookup``: ``delegate`` declares a lookup (the receiver's count of
the label); ``--worker-lookup``: ``post_effect`` declares the receiver's lookup by key.
``KILL_AFTER_POST=1`` kills the process inside the worker's tool, right after its POST.
Prints one JSON line. A test resumes the orchestrator in its own process with
:func:`drive`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from pydantic_ai import Agent, DeferredToolRequests
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from agentjournal import Absent, Found, PendingCall
from agentjournal.demo.ledger import http_json
from agentjournal.integrations.pydantic_ai import JournalDurability

from .pydantic_agent import CountingModel, poster
from .receiver_lookup import lookup_at

#: The call id of the orchestrator's one call.
DELEGATE = "delegate-1"


def worker_run(run_id: str) -> str:
    return f"{run_id}-worker"


def orchestrate(label: str) -> FunctionModel:
    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) == 1:
            return ModelResponse(parts=[ToolCallPart("delegate", {"task": label},
                                                     tool_call_id=DELEGATE)])
        return ModelResponse(parts=[TextPart(f"delegated: {messages[-1].parts[0].content}")])
    return FunctionModel(answer)


def counted_at(url: str) -> Any:
    """The orchestrator's lookup: the receiver applied the delegated label."""
    def applied(call: PendingCall) -> Found | Absent:
        counts = http_json("GET", f"{url}/effects")[1]["by_label"]
        task = call.args["task"]
        return Found(f"posted {task} (applied)") if counts.get(task) else Absent(final=True)
    return applied


def make_orchestrator(store_url: str, run_id: str, url: str, label: str, *,
                      parent_lookup: bool = False, worker_lookup: bool = False,
                      kill_after_post: bool = False
                      ) -> tuple[Agent[None, str | DeferredToolRequests], JournalDurability[Any]]:
    durability: JournalDurability[Any] = JournalDurability(store_url, run_id)
    orchestrator: Agent[None, str | DeferredToolRequests] = Agent(
        orchestrate(label), name="orchestrator", output_type=[str, DeferredToolRequests],
        capabilities=[durability])
    declared: dict[str, Any] = {"identity": ["task"]}
    if parent_lookup:
        declared["lookup"] = counted_at(url)

    @orchestrator.tool_plain(metadata={"agentjournal": declared})
    async def delegate(task: str) -> str:
        """Have the worker agent post `task`."""
        worker: Agent[None, str] = Agent(
            FunctionModel(CountingModel([task])), name="worker",
            capabilities=[JournalDurability(store_url, worker_run(run_id))])
        effect: dict[str, Any] = {"identity": ["label"]}
        if worker_lookup:
            effect["lookup"] = lookup_at(url)
        worker.tool_plain(metadata={"agentjournal": effect})(
            poster(url, kill_after_post=kill_after_post))
        return (await worker.run(f"post {task}")).output

    return orchestrator, durability


def drive(store_url: str, run_id: str, url: str, label: str, *, parent_lookup: bool = False,
          worker_lookup: bool = False, kill_after_post: bool = False) -> dict[str, Any]:
    """Run (or resume) the orchestrator once; what it did."""
    agent, durability = make_orchestrator(store_url, run_id, url, label,
                                          parent_lookup=parent_lookup,
                                          worker_lookup=worker_lookup,
                                          kill_after_post=kill_after_post)
    output = agent.run_sync(f"delegate {label}").output
    deferred = output if isinstance(output, DeferredToolRequests) else None
    run = durability.last_run
    return {"output": None if deferred else output, "status": run.status if run else None,
            "deferred": [c.tool_call_id for c in deferred.calls] if deferred else None,
            "keys": [deferred.metadata[c.tool_call_id]["agentjournal"]["key"]
                     for c in deferred.calls] if deferred else []}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.pydantic_subagent")
    parser.add_argument("--store", required=True)
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--receiver", required=True)
    parser.add_argument("--label", required=True)
    parser.add_argument("--parent-lookup", action="store_true")
    parser.add_argument("--worker-lookup", action="store_true")
    args = parser.parse_args(argv)
    out = drive(args.store, args.run_id, args.receiver, args.label,
                parent_lookup=args.parent_lookup, worker_lookup=args.worker_lookup,
                kill_after_post=os.environ.get("KILL_AFTER_POST") == "1")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
