"""Runs for the viewer's tests (tests/test_ui_*.py), made by real agents on a store:
one waiting for an approval, one with a call whose effect is unknown, one whose tool
returned markup, and a long one to page through."""

from __future__ import annotations

import contextlib
from typing import Any

from agentjournal import Agent, Rules, ScriptedModel, Store, ToolUncertain, calls, reply, tool

HOSTILE = "<script>document.title='pwned'</script><img src=x onerror=alert(1)>"


@tool(effect="irreversible", identity=["to"])
def pay(to: str, amount: int) -> dict[str, Any]:
    """Pay someone."""
    return {"paid": amount, "to": to}


@tool(effect="irreversible", identity=["ref"])
def wire(ref: str) -> dict[str, Any]:
    """A transfer whose answer is lost: its effect is unknown."""
    raise ToolUncertain("the bank timed out after the request left")


@tool(effect="read_only")
def fetch_page(url: str) -> str:
    """A page from the web: untrusted text."""
    return HOSTILE


def approval_run(store: Store, run_id: str, agent_ref: str | None = None) -> None:
    """Stops waiting for a person's approval of pay(to=bob, amount=500); ``agent_ref``:
    the MODULE:OBJECT it records (`agentjournal resume` continues it)."""
    agent = Agent(ScriptedModel([calls(("pay", {"to": "bob", "amount": 500})),
                                 reply("paid")]), [pay],
                  policy=Rules(require_approval=["pay"]))
    agent.run(store, run_id, "pay bob 500", agent_ref=agent_ref)


def uncertain_run(store: Store, run_id: str) -> None:
    """Stops with wire(ref=...) uncertain: no reconcile, so a person must say."""
    agent = Agent(ScriptedModel([calls(("wire", {"ref": "w-1"})), reply("sent")]), [wire])
    agent.run(store, run_id, "wire w-1")


def markup_run(store: Store, run_id: str) -> None:
    """Finishes; its tool result and the model's text carry markup that must stay text."""
    agent = Agent(ScriptedModel([calls(("fetch_page", {"url": "http://x"})),
                                 reply(f"summary: {HOSTILE}")]), [fetch_page])
    agent.run(store, run_id, f"read {HOSTILE}")


def long_run(store: Store, run_id: str, turns: int) -> None:
    """A finished run of about 3 events a turn."""
    script = [calls(("fetch_page", {"url": f"http://x/{n}"})) for n in range(turns)]
    Agent(ScriptedModel([*script, reply("done")]), [fetch_page]).run(store, run_id, "read")


@tool(effect="read_only")
def dump(name: str) -> str:
    """A tool whose result is megabytes long."""
    return name * (3 * 1024 * 1024 // len(name))


def big_result_run(store: Store, run_id: str) -> None:
    """Finishes; its one call returned 3 MiB (under the 4 MiB default limit)."""
    Agent(ScriptedModel([calls(("dump", {"name": "ab"})), reply("dumped")]), [dump]).run(
        store, run_id, "dump")


class Interrupted(BaseException):
    """Stands for Ctrl-C in the middle of a run."""


def interrupted_run(store: Store, run_id: str) -> None:
    """Stops after its first call's start (the loop lets its lease go): status running,
    and nobody holds it."""
    def stop(event: Any, state: Any) -> None:
        if event.seq == 3:
            raise Interrupted()

    agent = Agent(ScriptedModel([calls(("fetch_page", {"url": "http://x"})), reply("done")]),
                  [fetch_page])
    with contextlib.suppress(Interrupted):
        agent.run(store, run_id, "read", observer=stop)
