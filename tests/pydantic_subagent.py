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

:func:`make_delegator` is an agent whose tool ``corrector`` runs another agent that posts
two different corrections to the demo ledger (which honours idempotency keys), each with
``current_call().key``: with a ``JournalDurability`` of its own, or without one.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import AsyncIterator
from typing import Any

from pydantic_ai import Agent, DeferredToolRequests
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel

from agentjournal import Absent, Found, PendingCall, current_call
from agentjournal.demo.ledger import FENCING_HEADER, http_json
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


def _corrections(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """The corrector's model: C-1, then C-2 (another amount), then done."""
    asked = sum(isinstance(part, ToolCallPart) for m in messages for part in m.parts)
    if asked < 2:
        n = asked + 1
        return ModelResponse(parts=[ToolCallPart(
            "post_correction", {"correction_id": f"C-{n}", "amount": 100 * n},
            tool_call_id=f"correction-{n}")])
    return ModelResponse(parts=[TextPart("corrected")])


async def _streamed_corrections(messages: list[ModelMessage],
                                info: AgentInfo) -> AsyncIterator[str | DeltaToolCalls]:
    """The corrector's model, streamed: the same answers, as deltas."""
    answer = _corrections(messages, info)
    for part in answer.parts:
        if isinstance(part, ToolCallPart):
            yield {0: DeltaToolCall(name=part.tool_name, json_args=json.dumps(part.args),
                                    tool_call_id=part.tool_call_id)}
        elif isinstance(part, TextPart):
            yield part.content


def _delegation(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    if len(messages) == 1:
        return ModelResponse(parts=[ToolCallPart("corrector", {"task": "close ledger-a"},
                                                 tool_call_id=DELEGATE)])
    return ModelResponse(parts=[TextPart(f"delegated: {messages[-1].parts[0].content}")])


def make_delegator(store_url: str, run_id: str, ledger: str, *, child_durable: bool,
                   how: str = "run") -> Agent[None, str]:
    """An agent whose idempotent tool ``corrector`` runs the corrector agent (``how``:
    ``run``, ``stream``, ``iter``, or ``caught``: run, its error returned as the tool's
    answer), which posts C-1 and C-2 to ledger-a at the ledger service
    ``ledger``, each with the key ``current_call()`` gives. ``child_durable``: the
    corrector has a ``JournalDurability`` of its own (run ``{run_id}-worker``)."""
    parent: Agent[None, str] = Agent(FunctionModel(_delegation), name="delegator",
                                     capabilities=[JournalDurability(store_url, run_id)])

    @parent.tool_plain(metadata={"agentjournal": {"effect": "idempotent"}})
    async def corrector(task: str) -> str:
        """Apply the corrections a ledger needs."""
        capabilities = [JournalDurability(store_url, worker_run(run_id))] if child_durable else []
        child: Agent[None, str] = Agent(
            FunctionModel(_corrections, stream_function=_streamed_corrections),
            name="corrector", capabilities=capabilities)

        @child.tool_plain
        def post_correction(correction_id: str, amount: int) -> str:
            ctx = current_call()
            assert ctx is not None, "a call under JournalDurability knows its key"
            body = {"correction_id": correction_id, "ledger": "ledger-a", "amount": amount}
            status, applied = http_json("POST", f"{ledger}/corrections", body,
                                        {"Idempotency-Key": ctx.key,
                                         FENCING_HEADER: str(ctx.epoch)})
            return f"{correction_id}: {status} {applied.get('status') or applied.get('error')}"

        if how == "caught":  # the tool answers the child's error itself
            try:
                return (await child.run(task)).output
            except Exception as error:
                return f"the corrector failed: {error}"
        if how == "stream":
            async with child.run_stream(task) as streamed:
                return await streamed.get_output()
        if how == "iter":
            async with child.iter(task) as running:
                async for _ in running:
                    pass
            assert running.result is not None
            return running.result.output
        return (await child.run(task)).output

    return parent


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
