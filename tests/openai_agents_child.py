"""Child processes for tests/test_openai_agents_*.py, killed with SIGKILL by the tests.

    python -m tests.openai_agents_child session-writer --store URL --session ID --batch N

``session-writer`` adds batches to a ``JournalSession`` until it is killed: batch ``b`` is
``N`` items, tool calls and their outputs in pairs, each tagged with ``b``; after each
``add_items`` returns it prints ``added b`` (so the test knows which batches were
acknowledged). Run from the repository root.

The runner's agent (:func:`poster`) is an SDK agent on the SDK's ``ScriptedModel``: its
first turn asks for ``post_effect`` twice at once (labels ``a`` and ``b``), its second
says how many effects were posted. ``post_effect`` POSTs to the receiver process
(tests/crash_agent.py) with the call's idempotency key. :func:`run_until_blocked` runs
it with ``JournalRunner`` in a process forked by :func:`spawn` (the SDK takes seconds
to import; a fork server imports it once) and blocks at one window, after telling the
test through a pipe, for the test to SIGKILL it there:

- ``model``: in the second model call;
- ``before``: in ``post_effect("b")`` once its start is durable, before the POST;
- ``after``: in ``post_effect("b")`` after the receiver applied it, before the completion.

:func:`delegator` is an agent that runs another as a tool (``Agent.as_tool``), the child
posting two corrections to the demo ledger (which honours idempotency keys);
:func:`run_delegator_until_blocked` runs it until the child blocks before its second.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import sys
import threading
import uuid
from multiprocessing.connection import Connection
from typing import Any

from agentjournal import open_store
from agentjournal.integrations.openai_agents import JournalSession

TASK = "Post effects a and b, then say how many you posted."
RUN = "sdk-run"


def batch_items(batch: int, size: int) -> list[dict[str, Any]]:
    """``size`` items (an even number): a call and its output per pair, tagged ``batch``."""
    items: list[dict[str, Any]] = []
    for pair in range(size // 2):
        call_id = f"call_{batch}_{pair}"
        items.append({"type": "function_call", "call_id": call_id, "name": "post_effect",
                      "arguments": f'{{"batch": {batch}}}'})
        items.append({"type": "function_call_output", "call_id": call_id,
                      "output": f"batch {batch} pair {pair}"})
    return items


async def write_sessions(store_url: str, session_id: str, size: int) -> None:
    store = open_store(store_url)
    session = JournalSession(store, session_id)
    batch = 0
    while True:
        await session.add_items(batch_items(batch, size))  # type: ignore[arg-type]
        print(f"added {batch}", flush=True)
        batch += 1


# --- the runner's agent -------------------------------------------------------------------


def poster(receiver: str, *, block: str = "", tell: Connection | None = None,
           lookup: bool = True, approval: bool = False, journaled: bool = True,
           prefix: str = "") -> tuple[Any, dict[str, Any]]:
    """The agent and the policies to run it with (see the module docstring).
    ``journaled=False``: for the SDK's plain Runner, a new key per POST (as a tool
    without agentjournal would send). ``prefix`` goes before each label (tests sharing
    one receiver count their own effects)."""
    from agents import Agent, function_tool
    from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call

    from agentjournal import Absent, Conflict, Found, Unknown, current_call
    from agentjournal.demo.ledger import FENCING_HEADER, http_json
    from agentjournal.integrations.openai_agents import ToolPolicy
    from agentjournal.state import PendingCall

    def stop_here(where: str) -> None:
        if block == where:
            if tell is not None:
                tell.send(where)
            threading.Event().wait()  # the test kills the process here

    def answer(call: Any) -> Any:
        posted = [i for i in call.input if isinstance(i, dict)
                  and i.get("type") == "function_call_output"]
        if not posted:
            return [function_call("post_effect", {"label": f"{prefix}a"}, call_id="call_a"),
                    function_call("post_effect", {"label": f"{prefix}b"}, call_id="call_b")]
        stop_here("model")
        return [assistant_message(f"posted {len(posted)}")]

    @function_tool(needs_approval=approval)
    def post_effect(label: str) -> str:
        """Apply the effect named `label` once at the receiver."""
        ctx = current_call()
        assert (ctx is not None) == journaled, "journaled calls know their key"
        headers = ({"Idempotency-Key": ctx.key, FENCING_HEADER: str(ctx.epoch)}
                   if ctx is not None else {"Idempotency-Key": uuid.uuid4().hex})
        if label == f"{prefix}b":
            stop_here("before")
        status, applied = http_json("POST", f"{receiver}/effects", {"label": label}, headers)
        assert status == 201, applied
        if label == f"{prefix}b":
            stop_here("after")
        return f"posted {label}"

    def applied(call: PendingCall) -> Found | Absent | Conflict | Unknown:
        status, found = http_json("GET", f"{receiver}/effects/{call.key}")
        if status == 404:
            return Absent(final=True)  # the receiver applies synchronously: no late commit
        return Found(found["status"]) if status == 200 else Unknown(f"answered {status}")

    model = ScriptedModel([ModelStep.respond(answer) for _ in range(6)])
    agent = Agent(name="poster", model=model, tools=[post_effect])
    policy = ToolPolicy(effect="irreversible", identity=["label"],
                        lookup=applied if lookup else None)
    return agent, {"post_effect": policy}


def delegator(ledger: str, *, block: str = "", tell: Connection | None = None,
              on_stream: bool = False, shared_model: bool = False,
              own_run: str | None = None,
              plain: str | None = None) -> tuple[Any, dict[str, Any], Any]:
    """An agent that hands the corrections to another agent used as a tool
    (``Agent.as_tool``): the parent asks ``corrector`` once; the child posts two different
    corrections (C-1, then C-2) to the ledger (``agentjournal.demo.ledger``, which honours
    idempotency keys), each with ``current_call().key``, then says it is done.
    ``block="second"``: the child blocks in C-2 once C-1 was applied (the test kills it
    there). ``on_stream``: the child runs streamed (as_tool's ``on_stream``). The
    corrector's calls are idempotent: retried, the child sends the same keys again.
    Returns the parent, the policies and a run config: with ``shared_model``, one model
    answers both agents, given as the run config's (so the child's run gets it too).
    ``own_run`` (a store URL): ``corrector`` is a function tool that runs the child with
    JournalRunner as a run of its own (``child-`` and the call's key), not ``as_tool``.
    ``plain``: ``corrector`` is a function tool that runs the child with the SDK's own
    Runner, not journaled: ``run``: ``Runner.run``, the child's tool errors raised to
    ``corrector``; ``caught``: the same, ``corrector`` answering the error itself;
    ``streamed``: ``Runner.run_streamed``, the child's tool errors answered to its model;
    ``nested``: as ``run``, in a tool of an agent the parent uses as a tool."""
    from agents import Agent, RunConfig, function_tool
    from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call

    from agentjournal import current_call
    from agentjournal.demo.ledger import FENCING_HEADER, http_json

    # Run plainly, the child's tool errors reach the tool that runs it (``run``, ``caught``)
    # or are answered to the child's model, as the SDK does by default (``streamed``).
    raises = {"failure_error_function": None} if plain in ("run", "caught", "nested") else {}

    @function_tool(**raises)
    def post_correction(correction_id: str, amount: int) -> str:
        """Apply correction `correction_id` of `amount` cents to ledger-a."""
        ctx = current_call()
        assert ctx is not None, "a call under JournalRunner knows its key"
        if correction_id == "C-2" and block == "second" and tell is not None:
            tell.send(block)
            threading.Event().wait()  # the test kills the process here
        body = {"correction_id": correction_id, "ledger": "ledger-a", "amount": amount}
        status, applied = http_json("POST", f"{ledger}/corrections", body,
                                    {"Idempotency-Key": ctx.key,
                                     FENCING_HEADER: str(ctx.epoch)})
        return f"{correction_id}: {status} {applied.get('status') or applied.get('error')}"

    def answer(call: Any) -> Any:
        done = sum(isinstance(i, dict) and i.get("type") == "function_call_output"
                   for i in call.input)
        if call.system_instructions == "Delegate.":
            return [function_call("corrector", {"input": "close ledger-a"}, call_id="call_1")
                    ] if not done else [assistant_message("delegated")]
        if done < 2:
            number = done + 1
            return [function_call("post_correction",
                                  {"correction_id": f"C-{number}", "amount": 100 * number},
                                  call_id=f"call_{number}")]
        return [assistant_message("corrected")]

    def model() -> Any:
        return ScriptedModel([ModelStep.respond(answer) for _ in range(20)])

    child = Agent(name="corrector", instructions="Correct ledger-a.", tools=[post_correction],
                  model=None if shared_model else model())

    async def ignore(event: Any) -> None:
        pass

    tool = child.as_tool("corrector", "Apply the corrections a ledger needs.",
                         on_stream=ignore if on_stream else None)
    if own_run is not None:
        from agentjournal.integrations.openai_agents import JournalRunner

        @function_tool(name_override="corrector")
        async def run_corrector(input: str) -> str:
            """Apply the corrections a ledger needs."""
            ctx = current_call()
            assert ctx is not None
            result = await JournalRunner.run(
                child, input, store=open_store(own_run), run_id=f"child-{ctx.key[:16]}",
                policies={"post_correction": "irreversible"})
            return str(result.final_output)

        tool = run_corrector
    if plain == "nested":
        middle = Agent(name="middle", instructions="Delegate.",
                       tools=[plain_corrector(child, "run")], model=model())
        tool = middle.as_tool("corrector", "Apply the corrections a ledger needs.")
    elif plain is not None:
        tool = plain_corrector(child, plain)
    parent = Agent(name="delegator", instructions="Delegate.", tools=[tool],
                   model=None if shared_model else model())
    policies = {"corrector": "idempotent", "post_correction": "irreversible"}
    return parent, policies, RunConfig(model=model()) if shared_model else None


def plain_corrector(child: Any, how: str) -> Any:
    """A function tool ``corrector`` that runs ``child`` with the SDK's own Runner
    (``how``: see :func:`delegator`'s ``plain``)."""
    from agents import Runner, function_tool

    @function_tool(name_override="corrector")
    async def corrector(input: str) -> str:
        """Apply the corrections a ledger needs."""
        if how == "streamed":
            streamed = Runner.run_streamed(child, input)
            async for _ in streamed.stream_events():
                pass
            return str(streamed.final_output)
        try:
            return str((await Runner.run(child, input)).final_output)
        except Exception as error:
            if how != "caught":
                raise
            return f"the corrector failed: {error}"  # the tool answers the error itself

    return corrector


def run_delegator_until_blocked(store_url: str, ledger: str, block: str, *,
                                tell: Connection) -> None:
    """The delegator with JournalRunner until its child blocks at ``block``."""
    agent, policies, run_config = delegator(ledger, block=block, tell=tell)
    result = run_poster(agent, open_store(store_url), policies, streamed=False,
                        run_config=run_config)
    tell.send(f"ended: {result.final_output!r}")


def run_until_blocked(store_url: str, receiver: str, block: str, *, tell: Connection,
                      session: str | None = None, streamed: bool = False,
                      **options: Any) -> None:
    """Run the poster with JournalRunner until it blocks at ``block`` (then the test
    kills this process); tell the test the outcome if it ends first. ``session``: the
    id of a JournalSession in the same store to keep the conversation in. ``streamed``:
    with ``JournalRunner.run_streamed``, its events read as they come."""
    agent, policies = poster(receiver, block=block, tell=tell, **options)
    store = open_store(store_url)
    memory = JournalSession(store, session) if session is not None else None
    result = run_poster(agent, store, policies, streamed=streamed, session=memory)
    tell.send(f"ended: {result.final_output!r} {len(result.interruptions)} interruption(s)")


def run_poster(agent: Any, store: Any, policies: dict[str, Any], *, streamed: bool,
               **options: Any) -> Any:
    """The poster's run with JournalRunner (``streamed``: its stream read to the end)."""
    from agentjournal.integrations.openai_agents import JournalRunner

    run = dict(store=store, run_id=RUN, policies=policies, **options)
    if not streamed:
        return JournalRunner.run_sync(agent, TASK, **run)

    async def listen() -> Any:
        stream = JournalRunner.run_streamed(agent, TASK, **run)
        async for _ in stream.stream_events():
            pass
        return stream

    return asyncio.run(listen())


def run_plain_until_blocked(db_path: str, receiver: str, block: str, *,
                            tell: Connection, prefix: str = "") -> None:
    """The same agent on the SDK's own Runner with a SQLiteSession (no agentjournal)."""
    from agents import Runner, SQLiteSession

    agent, _ = poster(receiver, block=block, tell=tell, journaled=False, prefix=prefix)
    result = Runner.run_sync(agent, TASK, session=SQLiteSession("plain", db_path))
    tell.send(f"ended: {result.final_output!r}")


def spawn(target: Any, *args: Any,
          **kwargs: Any) -> tuple[multiprocessing.process.BaseProcess, Connection]:
    """``target(*args, tell=..., **kwargs)`` in a process forked from a server that
    imported this module (and the SDK) once; the pipe's end to read what it tells."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["tests.openai_agents_child", "agents"])
    ours, theirs = context.Pipe(duplex=False)
    process = context.Process(target=target, args=args, kwargs={**kwargs, "tell": theirs},
                              daemon=True)
    process.start()
    theirs.close()
    return process, ours


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.openai_agents_child")
    sub = parser.add_subparsers(dest="command", required=True)
    writer = sub.add_parser("session-writer")
    writer.add_argument("--store", required=True)
    writer.add_argument("--session", required=True)
    writer.add_argument("--batch", type=int, default=40)
    args = parser.parse_args(argv)
    asyncio.run(write_sessions(args.store, args.session, args.batch))
    return 0


if __name__ == "__main__":
    sys.exit(main())
