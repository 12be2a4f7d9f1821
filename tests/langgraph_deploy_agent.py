"""A LangGraph agent in two releases, for tests/test_deploys_langgraph.py: a thread is
started by release 1 in a child process and SIGKILLed after its irreversible call
reached the receiver process (tests/crash_agent.py), then resumed by a release that
changed one thing (``CHANGES``), in the test's process or in another child.

The model node asks LangChain's GenericFakeChatModel, scripted by turn, and appends one
line per question to ``--model-log``: the test counts the model's calls from it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import Command

from agentjournal import Absent, Found, Unknown, open_store
from agentjournal.demo.ledger import http_json
from agentjournal.integrations.langgraph import ToolEffect, current_call, exactly_once, invoke

LABEL = "refund-42"
TASK = "Refund order 42 once."
FINAL = "Refunded order 42."


@dataclass(frozen=True)
class Release:
    """What one release of the agent's code says."""

    prompt: str = "You refund orders."
    model: str = "fake-model-1"
    tool: str | None = "post_effect"  # the effect tool's name (None: removed)
    identity: tuple[str, ...] = ("label",)
    effect: str = "irreversible"
    currency: bool = False  # the tool takes a new required argument
    look_up: bool = False  # a read-only tool added
    mapped: bool = False  # exactly_once(renamed=) maps the old name to the renamed tool
    audit: bool = False  # a node added between the tools and the model


FIRST = Release()
#: Release 2, by the one thing it changed.
CHANGES = {
    "none": FIRST,
    "prompt": replace(FIRST, prompt="You refund orders. Say what you did in one line."),
    "model": replace(FIRST, model="fake-model-2"),
    "tool_added": replace(FIRST, look_up=True),
    "tool_removed": replace(FIRST, tool=None, look_up=True),
    "tool_renamed": replace(FIRST, tool="post_correction"),
    "tool_renamed_mapped": replace(FIRST, tool="post_correction", mapped=True),
    "identity": replace(FIRST, identity=("label", "amount")),
    "arguments": replace(FIRST, currency=True),
    "effect": replace(FIRST, effect="idempotent"),
    "node_added": replace(FIRST, audit=True),
    # Started by READ (the tool declared read-only), the tool then removed.
    "read_removed": replace(FIRST, tool=None, look_up=True, effect="read_only"),
}
#: A release 1 whose tool is declared read-only (its call made nothing to double).
READ = replace(FIRST, effect="read_only")
#: The release each change is started by, when not FIRST.
STARTED_BY = {"read_removed": "read"}


#: Where the child waits to be killed (``--block``): read from the environment, so the
#: graph's code, and so its derived version, is the same in the child and the resume.
BLOCK = "AGENTJOURNAL_TEST_BLOCK"


def window(name: str) -> None:
    """Tell the test where we are, then wait there to be killed."""
    print(f"WINDOW {name}", flush=True)
    threading.Event().wait()


def build(release: Release, saver: Any, receiver: str, *, model_log: str) -> Any:
    """The agent's graph as ``release`` writes it, checkpointed by ``saver``."""
    name = release.tool or "post_effect"

    def model(state: MessagesState) -> dict[str, Any]:
        answered = sum(isinstance(m, AIMessage) for m in state["messages"])
        with Path(model_log).open("a") as log:
            log.write(f"{release.model} {answered}\n")
        script = [AIMessage("", tool_calls=[{"id": "call-refund-42", "name": name,
                                             "args": {"label": LABEL, "amount": 42}}]),
                  AIMessage(FINAL)]
        chat = GenericFakeChatModel(messages=iter([script[min(answered, 1)]]))
        return {"messages": [chat.invoke([SystemMessage(release.prompt),
                                          *state["messages"]])]}

    def post(label: str, amount: int) -> str:
        status, answer = http_json("POST", f"{receiver}/effects", {"label": label},
                                   {"Idempotency-Key": current_call().key})
        if status >= 400:
            raise RuntimeError(f"receiver answered {status}: {answer}")
        if os.environ.get(BLOCK) == "after":
            window("after")
        return json.dumps(answer)

    tools = []
    renamed = {}
    if release.tool is not None:
        tools.append(_effect_tool(release, post))
        if release.mapped:
            renamed["post_effect"] = tools[-1]
    if release.look_up:
        @tool
        def look_up(order: int) -> str:
            """Read an order's refunds (changes nothing)."""
            return "no refunds yet"
        tools.append(look_up)
    effects = {name: ToolEffect(release.effect, identity=release.identity,
                                lookup=applied_at(receiver))}
    calls = exactly_once(saver, effects, default=ToolEffect("read_only"), renamed=renamed)
    builder = StateGraph(MessagesState)
    builder.add_node("model", model)
    builder.add_node("tools", ToolNode(tools, wrap_tool_call=calls,
                                       awrap_tool_call=calls.awrap))
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", tools_condition, ["tools", END])
    if release.audit:
        builder.add_node("audit", lambda state: {})
        builder.add_edge("tools", "audit")
        builder.add_edge("audit", "model")
    else:
        builder.add_edge("tools", "model")
    return builder.compile(checkpointer=saver)


def _effect_tool(release: Release, post: Any) -> Any:
    """The irreversible tool, under its release's name and arguments."""
    doc = "Apply the refund named `label` once at the receiver."
    if release.currency:
        def with_currency(label: str, amount: int, currency: str) -> str:
            return str(post(label, amount))
        with_currency.__doc__ = doc
        return tool(release.tool)(with_currency)

    def plain(label: str, amount: int) -> str:
        return str(post(label, amount))
    plain.__doc__ = doc
    return tool(release.tool)(plain)


def applied_at(receiver: str) -> Any:
    """The reconcile lookup: what the receiver holds under the call's key."""
    def lookup(call: Any) -> Any:
        try:
            status, found = http_json("GET", f"{receiver}/effects/{call.key}")
        except OSError as exc:
            return Unknown(f"receiver unreachable: {exc}")
        if status == 404:
            return Absent(final=True)
        return Found(found) if status == 200 else Unknown(f"lookup answered {status}")
    return lookup


def run(store_url: str, thread: str, receiver: str, *, change: str = "none",
        model_log: str, resume: bool = False, decide: str | None = None,
        ask: str = TASK, how: str = "invoke", strict: bool = False) -> dict[str, Any]:
    """Run (or resume) the thread under release ``CHANGES[change]`` (``how``: by invoke
    or by ainvoke, the graph's async path); its messages and the interrupts it stopped
    at."""
    from agentjournal.integrations.langgraph import JournalSaver, ainvoke

    config = {"configurable": {"thread_id": thread}}
    given: Any = None if resume else {"messages": [HumanMessage(ask)]}
    if decide:
        given = Command(resume={"verdict": decide, "by": "test", "reason": "checked"})
    store = open_store(store_url)
    try:
        with JournalSaver(store) as saver:
            graph = build(release_of(change), saver, receiver, model_log=model_log)
            out = (invoke(graph, given, config, strict=strict) if how == "invoke" else
                   asyncio.run(ainvoke(graph, given, config, strict=strict)))
    finally:
        store.close()
    return {"messages": [[type(m).__name__, m.content] for m in out.get("messages", [])],
            "interrupts": [i.value for i in out.get("__interrupt__", [])]}


def release_of(name: str) -> Release:
    return READ if name == "read" else CHANGES[name]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.langgraph_deploy_agent")
    p.add_argument("--store", required=True)
    p.add_argument("--thread", required=True)
    p.add_argument("--receiver", required=True)
    p.add_argument("--model-log", required=True)
    p.add_argument("--change", default="none", choices=sorted([*CHANGES, "read"]))
    p.add_argument("--block", choices=["after"])
    p.add_argument("--resume", action="store_true")
    p.add_argument("--decide", help="resume with Command(resume={'verdict': ...})")
    a = p.parse_args(argv)
    if a.block:
        os.environ[BLOCK] = a.block
    out = run(a.store, a.thread, a.receiver, change=a.change, model_log=a.model_log,
              resume=a.resume, decide=a.decide)
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
