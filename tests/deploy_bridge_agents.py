"""Child process for tests/test_deploys_bridge.py: a Pydantic AI agent (``JournalDurability``)
and an OpenAI Agents SDK agent (``JournalRunner``), each in the code it had before a deploy
(``base``) and in each code a deploy may bring (the variants).

    python -m tests.deploy_bridge_agents --store URL --receiver URL --prefix P [--only F:V ...]

starts one run per framework and variant (run id ``F-V``), all at once, each under the base
code: its model's first turn asks for ``post_effect(label, note)``, which POSTs the effect to
the receiver (tests/crash_agent.py, which counts what it applies, by label and key) with the
call's key, then waits until every run has posted; then the process SIGKILLs itself. Each
run is left with its irreversible call started, applied at the receiver, never completed.
The test resumes each run in its own process under the variant's code (:func:`resume`).
The models count each time they are asked (``Asked``): a recorded turn is never asked again.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

from agentjournal.bridge import CodeChanged
from agentjournal.demo.ledger import http_json

from .receiver_lookup import lookup_at

FRAMEWORKS = ("pydantic_ai", "openai_agents")
VARIANTS = ("instructions", "tool_added", "tool_removed", "tool_renamed", "args_changed",
            "identity_changed", "effect_changed", "model_switched")
TASK = "Post the effect, then say what was posted."
INSTRUCTIONS = "You post effects at the receiver."


@dataclass
class Asked:
    """How often this process asked a model (a recorded turn served is not asked)."""

    turns: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Code:
    """What the variant's code declares for the posting tool."""

    name: str = "post_effect"
    present: bool = True
    effect: str = "irreversible"
    identity: tuple[str, ...] = ("label",)
    currency: bool = False  # a new required argument
    extra_tool: bool = False
    instructions: str = INSTRUCTIONS
    model: str = "scripted-1"


def code_of(variant: str) -> Code:
    return {
        "base": Code(),
        "instructions": Code(instructions=INSTRUCTIONS + " Be brief."),
        "tool_added": Code(extra_tool=True),
        "tool_removed": Code(present=False, extra_tool=True),
        "tool_renamed": Code(name="post_effect_v2"),
        "args_changed": Code(currency=True),
        "identity_changed": Code(identity=("label", "note")),
        "effect_changed": Code(effect="idempotent"),
        "model_switched": Code(model="scripted-2"),
    }[variant]


def post(url: str, label: str, posted: threading.Barrier | None) -> dict[str, Any]:
    """POST the effect with the call's key; with ``posted``, then wait for every run to
    have posted, and the last one SIGKILLs the process."""
    from agentjournal import current_call

    ctx = current_call()
    assert ctx is not None, "a journaled call knows its key"
    status, answer = http_json("POST", f"{url}/effects", {"label": label},
                               {"Idempotency-Key": ctx.key})
    if status >= 400:
        raise RuntimeError(f"receiver answered {status}: {answer}")
    if posted is not None:
        if posted.wait(timeout=120) == 0:
            os.kill(os.getpid(), signal.SIGKILL)
        threading.Event().wait()  # killed with the others
    return {"label": answer["label"], "status": answer["status"]}


# --- Pydantic AI ------------------------------------------------------------------------


def pydantic_agent(variant: str, url: str, label: str, store_url: str, run_id: str,
                   asked: Asked, posted: threading.Barrier | None = None) -> Any:
    from pydantic_ai import Agent, DeferredToolRequests, Tool
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from agentjournal.integrations.pydantic_ai import JournalDurability

    code = code_of(variant)

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        asked.turns.append(f"pydantic_ai:{variant}:{len(messages)}")
        if len(messages) == 1:
            return ModelResponse(parts=[ToolCallPart(
                "post_effect", {"label": label, "note": "first"}, tool_call_id=f"call-{label}")])
        return ModelResponse(parts=[TextPart(f"posted {label}")])

    declared = {"effect": code.effect, "identity": list(code.identity),
                "lookup": lookup_at(url)}
    if code.currency:
        def post_with_currency(label: str, note: str, currency: str) -> dict[str, Any]:
            """Apply the effect named `label` once at the receiver, in `currency`."""
            return post(url, label, posted)
        body: Any = post_with_currency
    else:
        def post_effect(label: str, note: str) -> dict[str, Any]:
            """Apply the effect named `label` once at the receiver."""
            return post(url, label, posted)
        body = post_effect

    def peek(name: str) -> str:
        """Read the fact `name` (read-only)."""
        return name

    tools: list[Any] = []
    if code.present:
        tools.append(Tool(body, name=code.name, metadata={"agentjournal": declared}))
    if code.extra_tool:
        tools.append(Tool(peek, metadata={"agentjournal": {"effect": "read_only"}}))
    return Agent(FunctionModel(model, model_name=code.model), name="poster", tools=tools,
                 instructions=code.instructions, output_type=[str, DeferredToolRequests],
                 capabilities=[JournalDurability(store_url, run_id)])


def run_pydantic(variant: str, url: str, label: str, store_url: str, run_id: str,
                 asked: Asked, posted: threading.Barrier | None = None) -> str:
    agent = pydantic_agent(variant, url, label, store_url, run_id, asked, posted)
    return str(agent.run_sync(TASK).output)


# --- the OpenAI Agents SDK -----------------------------------------------------------------


def sdk_agent(variant: str, url: str, label: str, asked: Asked,
              posted: threading.Barrier | None = None, *, lookup: bool = True,
              lost: bool = False) -> tuple[Any, dict[str, Any]]:
    """The SDK agent and its policies as the variant's code defines them. ``lookup``:
    the receiver's lookup settles an open call; ``lost``: the connection drops after
    each POST (the call is left uncertain, the run waits for a person)."""
    from agents import Agent, function_tool
    from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call

    from agentjournal.integrations.openai_agents import ToolPolicy

    code = code_of(variant)

    def answer(call: Any) -> Any:
        done = [i for i in call.input if isinstance(i, dict)
                and i.get("type") == "function_call_output"]
        asked.turns.append(f"openai_agents:{variant}:{len(done)}")
        if not done:
            return [function_call("post_effect", {"label": label, "note": "first"},
                                  call_id=f"call-{label}")]
        return [assistant_message(f"posted {label}")]

    class Scripted(ScriptedModel):
        model = code.model  # its identity: part of the agent's version

    if code.currency:
        def post_with_currency(label: str, note: str, currency: str) -> str:
            """Apply the effect named `label` once at the receiver, in `currency`."""
            return str(post(url, label, posted))
        body: Any = post_with_currency
    else:
        def post_effect(label: str, note: str) -> str:
            """Apply the effect named `label` once at the receiver."""
            answer = str(post(url, label, posted))
            if lost:
                raise ConnectionResetError("the connection dropped after the POST")
            return answer
        body = post_effect

    def peek(name: str) -> str:
        """Read the fact `name` (read-only)."""
        return name

    tools: list[Any] = []
    if code.present:
        tools.append(function_tool(body, name_override=code.name,
                                   failure_error_function=None))
    if code.extra_tool:
        tools.append(function_tool(peek))
    agent = Agent(name="poster", instructions=code.instructions, tools=tools,
                  model=Scripted([ModelStep.respond(answer) for _ in range(4)]))
    policies = {code.name: ToolPolicy(effect=code.effect, identity=list(code.identity),
                                      lookup=lookup_at(url) if lookup else None),
                "peek": "read_only"}
    return agent, policies


def run_sdk(variant: str, url: str, label: str, store_url: str, run_id: str, asked: Asked,
            posted: threading.Barrier | None = None) -> str:
    from agentjournal import open_store
    from agentjournal.integrations.openai_agents import JournalRunner

    agent, policies = sdk_agent(variant, url, label, asked, posted)
    store = open_store(store_url)
    try:
        result = asyncio.run(JournalRunner.run(agent, TASK, store=store, run_id=run_id,
                                               policies=policies))
    finally:
        store.close()
    return str(result.final_output)


RUNNERS = {"pydantic_ai": run_pydantic, "openai_agents": run_sdk}


def resume(framework: str, variant: str, url: str, label: str, store_url: str,
           run_id: str) -> dict[str, Any]:
    """Resume run ``run_id`` under the variant's code, here; what it did."""
    asked = Asked()
    try:
        output: str | None = RUNNERS[framework](variant, url, label, store_url, run_id, asked)
        stopped = None
    except CodeChanged as needs:
        output, stopped = None, needs.reason
    return {"output": output, "stopped": stopped, "asked": asked.turns}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.deploy_bridge_agents")
    parser.add_argument("--store", required=True)
    parser.add_argument("--receiver", required=True)
    parser.add_argument("--prefix", default="")
    args = parser.parse_args(argv)
    import agents  # noqa: F401  (imported before the threads: the SDK's import is slow)

    runs = [(f, v) for f in FRAMEWORKS for v in VARIANTS]
    posted = threading.Barrier(len(runs))
    failed: list[BaseException] = []

    def start(framework: str, variant: str) -> None:
        label = f"{args.prefix}{framework}-{variant}"
        try:
            RUNNERS[framework]("base", args.receiver, label, args.store,
                               f"{framework}-{variant}", Asked(), posted)
        except BaseException as exc:  # the test reads it: the process was not killed
            failed.append(exc)
            posted.abort()

    threads = [threading.Thread(target=start, args=run, daemon=True) for run in runs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(f"not killed: {failed!r}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
