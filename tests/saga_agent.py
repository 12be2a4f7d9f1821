"""Child processes for tests/test_saga_crash.py: an agent whose effects can be undone, and
its saga, against the receiver of tests/crash_agent.py (which counts every POST, deduping
nothing, so an undo sent twice shows as two).

    python -m tests.saga_agent run --store URL --run-id ID --receiver URL --effects N
    python -m tests.saga_agent compensate --store URL --run-id ID --receiver URL

``run`` makes N effects (labels ``<run>-e<i>``); ``compensate`` undoes them (labels
``undo:<label>``, each POSTed with the undo's own key; the lookup is ``GET
/effects/{key}``) and prints one JSON line: the saga's status and the durable fields of
the live final state. Run from the repository root.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import msgspec

from agentjournal import (
    Absent,
    Agent,
    Found,
    ScriptedModel,
    ToolContext,
    ToolFailed,
    Undo,
    Unknown,
    calls,
    compensate,
    open_store,
    reply,
    tool,
)
from agentjournal.demo.ledger import http_json
from agentjournal.state import RunState, durable_fields


def make_agent(receiver: str, run_id: str, effects: int) -> Agent:
    def post(label: str, key: str) -> dict[str, Any]:
        status, answer = http_json("POST", f"{receiver}/effects", {"label": label},
                                   {"Idempotency-Key": key})
        if status >= 400:
            raise ToolFailed(f"receiver answered {status}: {answer}")
        return dict(answer)

    def undo(u: Undo) -> dict[str, Any]:
        return post(f"undo:{u.args['label']}", u.key)

    def undone(u: Undo) -> Found | Absent | Unknown:
        try:
            status, found = http_json("GET", f"{receiver}/effects/{u.key}")
        except OSError as exc:
            return Unknown(f"receiver unreachable: {exc}")
        if status == 404:
            return Absent()  # the receiver applies synchronously: no late commit
        return Found(found) if status == 200 else Unknown(f"lookup answered {status}")

    @tool(effect="reversible", identity=["label"], compensate=undo, compensation_lookup=undone)
    def post_effect(ctx: ToolContext, label: str) -> dict[str, Any]:
        """Apply the effect named `label` at the receiver."""
        return post(label, ctx.key)

    turns = [calls(("post_effect", {"label": f"{run_id}-e{i}"})) for i in range(effects)]
    return Agent(ScriptedModel([*turns, reply("done")]), [post_effect])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.saga_agent")
    parser.add_argument("command", choices=["run", "compensate"])
    parser.add_argument("--store", required=True)
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--receiver", required=True)
    parser.add_argument("--effects", type=int, default=4)
    args = parser.parse_args(argv)
    agent = make_agent(args.receiver, args.run_id, args.effects)
    seen: list[RunState] = []
    with open_store(args.store) as store:
        if args.command == "run":
            status = agent.run(store, args.run_id, "make the effects").status
        else:
            status = compensate(store, args.run_id, agent.tools, reason="crash test",
                                observer=lambda _event, state: seen[:1].clear() or seen.append(
                                    state)).status
    live = msgspec.to_builtins(durable_fields(seen[-1])) if seen else None
    print(json.dumps({"status": status, "durable": live}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
