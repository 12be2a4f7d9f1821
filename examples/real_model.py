"""A ledger-correcting agent on a real model, durable across crashes.

    pip install 'agentjournal[openai]'     # or [anthropic]
    export OPENAI_API_KEY=...              # or ANTHROPIC_API_KEY=...
    python examples/real_model.py --run-id q3 --store sqlite:///runs.db

Kill it at any moment (Ctrl-C, kill -9) and run the same command again: the run
resumes where its log ends, and a correction the ledger already applied is found
by its lookup, never posted twice. The ledger is a JSON file beside the store,
standing in for a real service that keeps what it applied by correction id.

The provider is picked from the key that is set (``--provider`` to choose); the
SDKs read ``OPENAI_BASE_URL`` / ``ANTHROPIC_BASE_URL`` too, which is how the
tests run this file against a local stub server. To run it offline, serve a
script of model turns with the bundled stub (docs/llm_stub.md)::

    python -m agentjournal.testing.llm_stub --script turns.json --port 8765 &
    OPENAI_BASE_URL=http://127.0.0.1:8765/v1 OPENAI_API_KEY=stub python examples/real_model.py
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

from agentjournal import Absent, Agent, Found, Model, new_run_id, open_store, tool
from agentjournal.state import PendingCall

INSTRUCTIONS = ("You reconcile ledgers. Read each ledger named in the task, post one "
                "correction per discrepancy (use the ledger name as correction_id), then "
                "answer with a one-line summary.")
BALANCES = {"ledger-a": 1250, "ledger-b": -300, "ledger-c": 4200}  # cents off, per ledger


class Ledger:
    """Applied corrections by id, in a JSON file: the receiver, and what a lookup asks."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = threading.Lock()  # a turn's calls run in parallel threads

    def applied(self) -> dict[str, Any]:
        return json.loads(self.path.read_text()) if self.path.exists() else {}

    def post(self, correction_id: str, cents: int) -> dict[str, Any]:
        with self.lock:
            applied = self.applied()
            applied.setdefault(correction_id, {"correction_id": correction_id, "cents": cents})
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(applied))
            tmp.replace(self.path)
            return applied[correction_id]


def make_tools(ledger: Ledger) -> list[Any]:
    @tool(effect="read_only")
    def read_ledger(name: str) -> dict[str, Any]:
        """Read a ledger: how many cents it is off by."""
        return {"ledger": name, "off_by_cents": BALANCES.get(name, 0)}

    def lookup(call: PendingCall) -> Found | Absent:
        done = ledger.applied().get(call.args["correction_id"])
        return Found(done) if done is not None else Absent()

    @tool(effect="irreversible", identity=["correction_id"], reconcile=lookup)
    def post_correction(correction_id: str, cents: int) -> dict[str, Any]:
        """Post a correction of ``cents`` to the ledger; correction_id names it."""
        return ledger.post(correction_id, cents)

    return [read_ledger, post_correction]


def make_model(provider: str) -> Model:
    """The adapter over the SDK client we build (our keys, base URL and timeouts)."""
    if provider == "anthropic":
        import anthropic

        from agentjournal.providers import AnthropicModel
        return AnthropicModel(anthropic.Anthropic(), os.environ.get("MODEL", "claude-haiku-4-5"))
    import openai

    from agentjournal.providers import OpenAIChatModel, OpenAIResponsesModel
    name = os.environ.get("MODEL", "gpt-4o-mini")
    if provider == "openai-responses":  # background mode: a crash never pays twice
        return OpenAIResponsesModel(openai.OpenAI(), name, background=True)
    return OpenAIChatModel(openai.OpenAI(), name)


def pick_provider(asked: str | None) -> str:
    if asked:
        return asked
    if os.environ.get("OPENAI_API_KEY"):
        return "openai"
    if os.environ.get("ANTHROPIC_API_KEY"):
        return "anthropic"
    sys.exit("set OPENAI_API_KEY or ANTHROPIC_API_KEY (or pass --provider)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", default="sqlite:///runs.db")
    parser.add_argument("--run-id", help="resume this run (default: start a new one)")
    parser.add_argument("--provider", choices=["openai", "openai-responses", "anthropic"])
    parser.add_argument("--ledger", type=Path, default=Path("ledger.json"))
    args = parser.parse_args(argv)

    agent = Agent(make_model(pick_provider(args.provider)), make_tools(Ledger(args.ledger)),
                  instructions=INSTRUCTIONS)
    run_id = args.run_id or new_run_id()
    with open_store(args.store) as store:
        result = agent.run(store, run_id, "Reconcile ledger-a, ledger-b and ledger-c.")
    print(json.dumps({"run_id": run_id, "status": result.status, "outcome": result.outcome,
                      "pause_reason": result.pause_reason,
                      "cost_usd": round(result.state.cost_usd, 6)}))
    return 0 if result.status == "finished" else 1


if __name__ == "__main__":
    sys.exit(main())
