"""Child process for tests/test_pydantic_ai.py: an unchanged Pydantic AI agent, made durable
by ``JournalDurability`` (or, for the comparison, by Pydantic AI's own ``DBOSDurability``).

    python -m tests.pydantic_agent --store URL --run-id ID --receiver URL [--prefix P]
                                   [--mode lookup|none] [--dbos SQLITE_FILE] [--stream]

The model is a ``FunctionModel`` that counts how often it is asked (in this process): its
first answer asks for ``post_effect(Pa)`` and ``post_effect(Pb)`` in one turn (parallel
calls), its second says what was posted. ``post_effect`` is irreversible: it POSTs to the
receiver (tests/crash_agent.py), which counts what it is sent. Mode ``lookup`` declares the
receiver's lookup in the tool's metadata; ``none`` declares none. ``--stream`` runs it
with ``agent.run_stream`` (the model streams the same answers). Prints one JSON line.
``AGENTJOURNAL_FAULT`` kills it in a window (agentjournal.faults); ``KILL_AFTER_POST=1``
kills it inside the tool right after its POST, the same window for either engine (DBOS has
no fault points of ours). A test resumes runs in its own process with
:func:`drive`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from typing import Any

from pydantic_ai import Agent, DeferredToolRequests
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, FunctionModel

from agentjournal import current_call
from agentjournal.demo.ledger import FENCING_HEADER, http_json

from .receiver_lookup import lookup_at

LABELS = ("a", "b")


class CountingModel:
    """The scripted model, and how often it was asked."""

    def __init__(self, labels: list[str]) -> None:
        self.labels = labels
        self.asked = 0

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.asked += 1
        if len(messages) == 1:
            return ModelResponse(parts=[
                ToolCallPart("post_effect", {"label": label}, tool_call_id=f"call-{label}")
                for label in self.labels])
        returns = [p.content for p in messages[-1].parts if p.part_kind == "tool-return"]
        return ModelResponse(parts=[TextPart("posted " + ", ".join(
            f"{r['label']} ({r['status']})" if isinstance(r, dict) else str(r)
            for r in returns))])

    async def stream(self, messages: list[ModelMessage], info: AgentInfo) -> Any:
        """The same answers, streamed: each call whole, the text a word at a time."""
        for part in self(messages, info).parts:
            if isinstance(part, ToolCallPart):
                yield {part.tool_call_id: DeltaToolCall(
                    name=part.tool_name, json_args=json.dumps(part.args),
                    tool_call_id=part.tool_call_id)}
            elif isinstance(part, TextPart):
                first, *rest = part.content.split(" ")
                yield first
                for word in rest:
                    yield " " + word


def poster(url: str, *, kill_after_post: bool = False) -> Any:
    """The tool body: POST the effect with the call's key (when journaled)."""
    def post_effect(label: str) -> dict[str, Any]:
        """Apply the effect named `label` once at the receiver."""
        ctx = current_call()
        key = ctx.key if ctx is not None else f"untracked-{label}"
        headers = {"Idempotency-Key": key,
                   FENCING_HEADER: str(ctx.epoch if ctx is not None else 0)}
        status, answer = http_json("POST", f"{url}/effects", {"label": label}, headers)
        if status >= 400:
            raise RuntimeError(f"receiver answered {status}")
        if kill_after_post:
            os.kill(os.getpid(), signal.SIGKILL)
        return {"label": answer["label"], "status": answer["status"]}
    return post_effect


def make_agent(url: str, model: CountingModel, capability: Any, mode: str,
               *, kill_after_post: bool = False) -> Agent[None, str | DeferredToolRequests]:
    declared: dict[str, Any] = {"effect": "irreversible", "identity": ["label"]}
    if mode == "lookup":
        declared["lookup"] = lookup_at(url)
    agent: Agent[None, str | DeferredToolRequests] = Agent(
        FunctionModel(model, stream_function=model.stream), name="poster",
        output_type=[str, DeferredToolRequests], capabilities=[capability])
    agent.tool_plain(metadata={"agentjournal": declared})(
        poster(url, kill_after_post=kill_after_post))
    return agent


def drive(store_url: str, run_id: str, url: str, mode: str = "lookup",
          prefix: str = "", *, kill_after_post: bool = False,
          stream: bool = False) -> dict[str, Any]:
    """Run (or resume) the run once, durable on agentjournal; what it did."""
    from agentjournal.integrations.pydantic_ai import JournalDurability

    model = CountingModel([prefix + label for label in LABELS])
    durability = JournalDurability(store_url, run_id)
    agent = make_agent(url, model, durability, mode, kill_after_post=kill_after_post)
    prompt = f"post {', '.join(model.labels)}"

    async def streamed() -> Any:
        async with agent.run_stream(prompt) as result:
            return await result.get_output()

    output = asyncio.run(streamed()) if stream else agent.run_sync(prompt).output
    deferred = ([c.tool_call_id for c in output.calls]
                if isinstance(output, DeferredToolRequests) else None)
    run = durability.last_run
    return {"output": None if deferred is not None else output, "deferred": deferred,
            "model_calls": model.asked, "status": run.status if run else None,
            "uncertain": [p.key for p in run.state.pending.values()] if run else []}


def drive_dbos(sqlite_file: str, run_id: str, url: str, prefix: str = "",
               *, kill_after_post: bool = False) -> dict[str, Any]:
    """The same agent under Pydantic AI's DBOSDurability on SQLite: run the workflow, or
    (after a kill) let DBOS recover it at launch and wait for it."""
    from dbos import DBOS, DBOSConfig
    from pydantic_ai.durable_exec.dbos import DBOSDurability

    model = CountingModel([prefix + label for label in LABELS])
    config: DBOSConfig = {"name": "agentjournal-compare",
                          "system_database_url": f"sqlite:///{sqlite_file}"}
    dbos = DBOS(config=config)
    agent = make_agent(url, model, DBOSDurability(), "none", kill_after_post=kill_after_post)

    @DBOS.workflow(name="poster_run")
    async def poster_run(prompt: str) -> str:
        return str((await agent.run(prompt)).output)

    DBOS.launch()
    try:
        handle = DBOS.retrieve_workflow(run_id) if _known(run_id) else None
        if handle is None:
            from dbos import SetWorkflowID

            with SetWorkflowID(run_id):
                handle = DBOS.start_workflow(poster_run, f"post {', '.join(model.labels)}")
        output = handle.get_result()
    finally:
        DBOS.destroy(destroy_registry=True)
        del dbos
    return {"output": output, "model_calls": model.asked}


def _known(run_id: str) -> bool:
    from dbos import DBOS

    return any(w.workflow_id == run_id for w in DBOS.list_workflows())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.pydantic_agent")
    parser.add_argument("--store", default="")
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--receiver", required=True)
    parser.add_argument("--prefix", default="")
    parser.add_argument("--mode", choices=["lookup", "none"], default="lookup")
    parser.add_argument("--dbos", default="", help="run under DBOSDurability on this SQLite file")
    parser.add_argument("--stream", action="store_true", help="with agent.run_stream")
    args = parser.parse_args(argv)
    kill = os.environ.get("KILL_AFTER_POST") == "1"
    if args.dbos:
        out = drive_dbos(args.dbos, args.run_id, args.receiver, args.prefix,
                         kill_after_post=kill)
    else:
        out = drive(args.store, args.run_id, args.receiver, args.mode, args.prefix,
                    kill_after_post=kill, stream=args.stream)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
