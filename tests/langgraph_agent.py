"""A LangGraph agent run in a child process by tests/test_langgraph_crash.py: a model node
(LangChain's GenericFakeChatModel, scripted by turn) -> a ToolNode whose one tool POSTs an
irreversible effect to the receiver process (tests/crash_agent.py). The test SIGKILLs it
in a window (``--block``: it prints ``WINDOW <name>`` and waits there) and resumes it in
a new process. (``--block opened``: as soon as the thread's run is opened, before the
graph runs.)

``--saver journal``: JournalSaver on ``--store`` and the ToolNode wrapped by
``exactly_once`` (agentjournal's call protocol), run by ``invoke`` (``--stream``: by
``stream``). ``--saver stock``: LangGraph's SqliteSaver on ``--db`` and a plain ToolNode.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import threading
import time
from pathlib import Path
from typing import Annotated, Any

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import InjectedToolCallId, tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import Command

from agentjournal import open_store
from agentjournal.demo.ledger import http_json

LABEL = "refund-42"
TASK = "Refund order 42 once."
#: What the model answers, by how many answers it gave before.
SCRIPT = [
    AIMessage("", tool_calls=[{"id": "call-refund-42", "name": "post_effect",
                               "args": {"label": LABEL}}]),
    AIMessage("Refunded order 42."),
]


def window(name: str, gate: str | None) -> None:
    """Tell the test where we are, then wait: for ``gate`` to exist, or forever."""
    print(f"WINDOW {name}", flush=True)
    while gate is None or not Path(gate).exists():
        time.sleep(0.02) if gate else threading.Event().wait()


def build(args: argparse.Namespace, checkpointer: Any) -> Any:
    def model(state: MessagesState) -> dict[str, Any]:
        answered = sum(isinstance(m, AIMessage) for m in state["messages"])
        if args.block == "model" and answered == 0:
            window("model", args.gate)
        chat = GenericFakeChatModel(messages=iter([SCRIPT[answered]]))
        return {"messages": [chat.invoke(state["messages"])]}

    def key_of(call_id: str) -> str:
        if args.saver == "journal":
            from agentjournal.integrations.langgraph import current_call

            return current_call().key
        return call_id  # the stock ToolNode has only the model's call id

    @tool
    def post_effect(label: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> str:
        """Apply the effect named `label` once at the receiver."""
        if args.block == "before":
            window("before", args.gate)
        status, answer = http_json("POST", f"{args.receiver}/effects", {"label": label},
                                   {"Idempotency-Key": key_of(tool_call_id)})
        if status >= 400:
            raise RuntimeError(f"receiver answered {status}: {answer}")
        if args.block == "after":
            window("after", args.gate)
        return json.dumps(answer)

    if args.saver == "journal":
        from agentjournal.integrations.langgraph import ToolEffect, exactly_once

        lookup = applied_at(args.receiver) if args.lookup else None
        wrapper = exactly_once(checkpointer, {"post_effect": ToolEffect(
            "irreversible", identity=("label",), lookup=lookup)})
        tools = ToolNode([post_effect], wrap_tool_call=wrapper, awrap_tool_call=wrapper.awrap)
    else:
        tools = ToolNode([post_effect])
    builder = StateGraph(MessagesState)
    builder.add_node("model", model)
    builder.add_node("tools", tools)
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", tools_condition, ["tools", END])
    builder.add_edge("tools", "model")
    return builder.compile(checkpointer=checkpointer)


def applied_at(receiver: str) -> Any:
    """The reconcile lookup: what the receiver holds under the call's key."""
    from agentjournal import Absent, Found, Unknown

    def lookup(call: Any) -> Any:  # a PendingCall: its key and arguments
        try:
            status, found = http_json("GET", f"{receiver}/effects/{call.key}")
        except OSError as exc:
            return Unknown(f"receiver unreachable: {exc}")
        if status == 404:
            return Absent(final=True)
        return Found(found) if status == 200 else Unknown(f"lookup answered {status}")

    return lookup


def run(args: argparse.Namespace) -> dict[str, Any]:
    config = {"configurable": {"thread_id": args.thread}}
    given: Any = None if args.resume else {"messages": [HumanMessage(args.ask)]}
    if args.decide:
        given = Command(resume={"verdict": args.decide, "by": "test", "reason": "checked"})
    if args.saver == "stock":
        from langgraph.checkpoint.sqlite import SqliteSaver

        conn = sqlite3.connect(args.db, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        out = build(args, SqliteSaver(conn)).invoke(given, config,
                                                      durability=args.durability)
        return result(out)
    from agentjournal.integrations.langgraph import invoke, stream

    store = open_store(args.store)
    try:
        with journal_saver(args, store) as saver:
            graph = build(args, saver)
            if not args.stream:
                out = invoke(graph, given, config, durability=args.durability)
            else:  # the state after each step; an interrupt comes as a chunk of its own
                out = {}
                for chunk in stream(graph, given, config, durability=args.durability,
                                    stream_mode="values"):
                    out = {**out, **chunk}
    finally:
        store.close()
    return result(out)


def journal_saver(args: argparse.Namespace, store: Any) -> Any:
    """A JournalSaver; with ``--block opened``, one that stops right after it opened
    the thread's run (its first append is durable; nothing of the graph has run)."""
    from agentjournal.integrations.langgraph import JournalSaver

    class Opened(JournalSaver):
        def hold(self, thread_id: str, **kwargs: Any) -> Any:
            opening = self.thread(thread_id).run is None
            run = super().hold(thread_id, **kwargs)
            if opening:
                window("opened", args.gate)
            return run

    return Opened(store) if args.block == "opened" else JournalSaver(store)


def result(out: Any) -> dict[str, Any]:
    if out is None:
        return {"messages": [], "interrupts": []}
    return {"messages": [[type(m).__name__, m.content] for m in out.get("messages", [])],
            "interrupts": [i.value for i in out.get("__interrupt__", [])]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.langgraph_agent")
    p.add_argument("--saver", choices=["journal", "stock"], required=True)
    p.add_argument("--store", help="JournalSaver's store URL")
    p.add_argument("--db", help="SqliteSaver's database file")
    p.add_argument("--thread", required=True)
    p.add_argument("--receiver", required=True)
    p.add_argument("--block", choices=["opened", "model", "before", "after"])
    p.add_argument("--gate", help="a file whose creation ends the wait of --block")
    p.add_argument("--ask", default=TASK, help="the human message of this invocation")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--decide", help="resume with Command(resume={'verdict': ...})")
    p.add_argument("--lookup", action="store_true", help="the tool has a reconcile lookup")
    p.add_argument("--durability", default="sync", choices=["sync", "async", "exit"])
    p.add_argument("--stream", action="store_true", help="with stream(), not invoke()")
    args = p.parse_args(argv)
    try:
        print(json.dumps(run(args)), flush=True)
    except Exception as exc:  # the test reads what refused us
        print(json.dumps({"error": type(exc).__name__, "message": str(exc)}), flush=True)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
