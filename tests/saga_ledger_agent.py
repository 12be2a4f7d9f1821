"""An agent for `agentjournal run` / `agentjournal compensate` in tests/test_saga_cli.py:
three corrections posted to the demo's ledger service (a real process), each undone by a
reversing correction sent with the undo's own key.

``agent`` is a zero-argument factory (``tests.saga_ledger_agent:agent``) configured by
the environment: SAGA_LEDGER (the service's URL); SAGA_LOSE_UNDO=N (the first N
reversals are applied, then reported lost: an uncertain undo); SAGA_LOOKUP=unknown (the
lookup cannot tell); SAGA_APPROVE_LAST=1 (the last correction waits for a person's
approval). Run from the repository root.
"""

from __future__ import annotations

import os
from typing import Any

from agentjournal import (
    Absent,
    Agent,
    Found,
    Rules,
    ScriptedModel,
    ToolContext,
    ToolFailed,
    Undo,
    Unknown,
    calls,
    reply,
    tool,
)
from agentjournal.demo.ledger import http_json

CORRECTIONS = [("c1", "ledger-a", -1_000), ("c2", "ledger-b", 300), ("c3", "ledger-a", -250)]


def _post(url: str, body: dict[str, Any], key: str) -> dict[str, Any]:
    status, answer = http_json("POST", f"{url}/corrections", body, {"Idempotency-Key": key})
    if status >= 400:
        raise ToolFailed(f"ledger answered {status}: {answer}")
    return dict(answer)


def agent() -> Agent:
    url = os.environ["SAGA_LEDGER"]
    lose = [int(os.environ.get("SAGA_LOSE_UNDO", "0"))]

    def reverse(undo: Undo) -> dict[str, Any]:
        a = undo.args
        applied = _post(url, {"correction_id": f"rev-{a['correction_id']}",
                              "ledger": a["ledger"], "amount": -a["amount"]}, undo.key)
        if lose[0]:
            lose[0] -= 1
            raise TimeoutError("the ledger's answer to the reversal was lost")
        return applied

    def reversed_already(undo: Undo) -> Found | Absent | Unknown:
        if os.environ.get("SAGA_LOOKUP") == "unknown":
            return Unknown("the ledger's search is down")
        status, found = http_json("GET", f"{url}/corrections/rev-{undo.args['correction_id']}")
        return Found(found) if status == 200 else Absent()

    @tool(effect="reversible", identity=["correction_id"], compensate=reverse,
          compensation_lookup=reversed_already)
    def post_correction(ctx: ToolContext, correction_id: str, ledger: str,
                        amount: int) -> dict[str, Any]:
        """Post a correction of `amount` cents to `ledger`."""
        return _post(url, {"correction_id": correction_id, "ledger": ledger, "amount": amount},
                     ctx.key)

    turns = [calls(("post_correction", {"correction_id": cid, "ledger": ledger,
                                        "amount": amount}))
             for cid, ledger, amount in CORRECTIONS]
    last = CORRECTIONS[-1][0]
    policy = Rules(approve_if={"post_correction": lambda c: c.args["correction_id"] == last}
                   if os.environ.get("SAGA_APPROVE_LAST") else None)
    return Agent(ScriptedModel([*turns, reply("posted")]), [post_correction], policy=policy)
