"""The quarterly reconciliation: a scripted agent whose tools change a real ledger service.

The agent reads every ledger, posts one correction per discrepancy (one per
turn), files an exception ticket for the largest, and writes a summary. The
turns after the first are computed from the tool results in the journal, so a
resumed run continues with exactly the figures the live run saw.

    python -m agentjournal.demo.reconcile --store URL --run-id ID --ledger URL

runs (or resumes) the reconciliation once and prints the result as JSON; it
is what the crash tests and ``agentjournal demo`` start and kill.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any, Literal

import msgspec

from ..agent import Agent, RunResult
from ..errors import JournalError
from ..models import ModelRequest, ModelResponse, ScriptedModel, calls, reply
from ..policy import Budget
from ..state import PendingCall
from ..store import open_store
from ..tools import Absent, Conflict, Found, Tool, ToolContext, ToolFailed, Unknown, tool
from .ledger import FENCING_HEADER, http_json

LEDGERS = ("ledger-a", "ledger-b", "ledger-c")
TASK = "Reconcile Q3: read every ledger, correct each discrepancy, file an exception, summarise."
Mode = Literal["lookup", "idempotent", "none"]


def correction_id(ledger: str, part: int = 1, parts: int = 1) -> str:
    return f"q3-{ledger}" if parts == 1 else f"q3-{ledger}-{part}of{parts}"


def _post(url: str, path: str, body: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    # The key lets the ledger dedupe a retry; the epoch lets it refuse a stale worker
    # whose request leaves after a successor has acted (see README, "Fencing effects").
    headers = {"Idempotency-Key": ctx.key, FENCING_HEADER: str(ctx.epoch)}
    status, answer = http_json("POST", f"{url}{path}", body, headers)
    if status >= 400:  # the service refused: provably nothing was applied
        raise ToolFailed(f"{path} answered {status}: {answer.get('error', answer)}")
    return answer


def ledger_tools(url: str, mode: Mode = "lookup") -> list[Tool]:
    """The three tools. ``mode`` picks how an uncertain correction is settled:
    a lookup at the ledger, the ledger's idempotency keys, or neither (a person)."""

    @tool(effect="read_only")
    def read_ledger(name: str) -> dict[str, Any]:
        """Read one ledger: its entries and its discrepancy in cents."""
        status, body = http_json("GET", f"{url}/ledgers/{name}")
        if status != 200:
            raise ToolFailed(f"ledger {name!r}: {body.get('error')}")
        return body

    def find_correction(call: PendingCall) -> Found | Absent | Conflict | Unknown:
        try:
            status, found = http_json("GET", f"{url}/corrections/{call.args['correction_id']}")
        except OSError as exc:
            return Unknown(f"ledger unreachable: {exc}")
        if status == 404:
            return Absent(final=True)  # the ledger applies synchronously: no late commit
        if status != 200:
            return Unknown(f"lookup answered {status}")
        same = all(found.get(f) == call.args[f] for f in ("ledger", "amount"))
        return Found(found) if same else Conflict(found)

    effect = {"lookup": "irreversible", "idempotent": "idempotent", "none": "irreversible"}

    @tool(effect=effect[mode], identity=["correction_id"],
          reconcile=find_correction if mode == "lookup" else None)
    def post_correction(ctx: ToolContext, correction_id: str, ledger: str, amount: int,
                        memo: str = "") -> dict[str, Any]:
        """Post a correction of `amount` cents to a ledger."""
        body = {"correction_id": correction_id, "ledger": ledger, "amount": amount, "memo": memo}
        return _post(url, "/corrections", body, ctx)

    @tool(effect="idempotent", identity=["ticket_id"])
    def file_ticket(ctx: ToolContext, ticket_id: str, title: str, body: str) -> dict[str, Any]:
        """File an exception ticket for a person to review."""
        return _post(url, "/tickets", {"ticket_id": ticket_id, "title": title, "body": body},
                     ctx)

    return [read_ledger, post_correction, file_ticket]


def _discrepancies(request: ModelRequest) -> dict[str, int]:
    return {r["ledger"]: r["discrepancy"] for r in request.results("read_ledger")}


def _correct(ledger: str, part: int, parts: int) -> Any:
    def turn(request: ModelRequest) -> ModelResponse:
        total = _discrepancies(request)[ledger]
        amount = total // parts + (total % parts if part == parts else 0)
        return calls(("post_correction", {"correction_id": correction_id(ledger, part, parts),
                                          "ledger": ledger, "amount": amount,
                                          "memo": "Q3 reconciliation"}),
                     text=f"Correcting {ledger} by {amount} cents.")
    return turn


def _ticket(request: ModelRequest) -> ModelResponse:
    ledger, amount = max(_discrepancies(request).items(), key=lambda kv: abs(kv[1]))
    return calls(("file_ticket", {"ticket_id": f"q3-exception-{ledger}",
                                  "title": f"Large Q3 discrepancy in {ledger}",
                                  "body": f"{amount} cents corrected; please review."}))


def _summary(request: ModelRequest) -> ModelResponse:
    found = _discrepancies(request)
    posted = [r["correction_id"] for r in request.results("post_correction")]
    lines = [f"{name}: {cents / 100:+.2f}" for name, cents in sorted(found.items())]
    return reply(f"Reconciled {len(found)} ledgers, posted {len(posted)} corrections. "
                 + "; ".join(lines))


def reconciliation_agent(url: str, *, mode: Mode = "lookup", parts: int = 1,
                         model_delay: float = 0.0, lease_ttl: float = 30.0,
                         snapshot_every: int | None = 1000,
                         max_recoveries: int = 20) -> Agent:
    """The agent; ``parts`` splits each correction into that many (more steps to crash in)."""
    corrections = [_correct(n, p, parts) for n in LEDGERS for p in range(1, parts + 1)]
    script = [calls(*[("read_ledger", {"name": n}) for n in LEDGERS]), *corrections,
              _ticket, _summary]
    # A budget sized to the script (--parts 33 makes more turns than the default 100);
    # tool calls count retries too, and the crash tests kill the run hundreds of times.
    budget = Budget(max_turns=len(script) + 10, max_tool_calls=10 * len(script) + 100)
    return Agent(ScriptedModel(script, delay=model_delay), ledger_tools(url, mode),
                 lease_ttl=lease_ttl, budget=budget, snapshot_every=snapshot_every,
                 max_recoveries=max_recoveries)


def _barrier(ready: Path | None, go: Path | None) -> None:
    """Say we are ready (imports done, store open), then wait for the go: whoever
    controls the go file releases racing workers together, however loaded the machine."""
    if ready is not None:
        ready.touch()
    while go is not None and not go.exists():
        time.sleep(0.001)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run or resume the reconciliation once.")
    parser.add_argument("--store", required=True)
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--ledger", required=True, help="the ledger service's URL")
    parser.add_argument("--mode", choices=["lookup", "idempotent", "none"], default="lookup")
    parser.add_argument("--parts", type=int, default=1)
    parser.add_argument("--model-delay", type=float, default=0.0)
    parser.add_argument("--lease-ttl", type=float, default=30.0)
    parser.add_argument("--snapshot-every", type=int, default=1000,
                        help="write a snapshot every N events (default 1000)")
    parser.add_argument("--max-recoveries", type=int, default=20,
                        help="pause for a person once a call was interrupted N times "
                             "(default 20)")
    parser.add_argument("--ready-file", type=Path,
                        help="create this file once ready to run (a barrier for racing workers)")
    parser.add_argument("--go-file", type=Path,
                        help="wait for this file to exist before running")
    args = parser.parse_args(argv)
    agent = reconciliation_agent(args.ledger, mode=args.mode, parts=args.parts,
                                 model_delay=args.model_delay, lease_ttl=args.lease_ttl,
                                 snapshot_every=args.snapshot_every,
                                 max_recoveries=args.max_recoveries)
    store = open_store(args.store)
    _barrier(args.ready_file, args.go_file)
    try:
        result: RunResult = agent.run(store, args.run_id, TASK)
    except JournalError as exc:
        print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
        return 2
    finally:
        store.close()
    # The live run's own final state, for comparison with a fresh fold of the log.
    digest = hashlib.sha256(msgspec.json.encode(result.state)).hexdigest()
    print(json.dumps({"status": result.status, "last_seq": result.last_seq,
                      "uncertain": [p.key for p in result.uncertain], "state_digest": digest}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
