"""Child process for tests/test_bridge.py: a small foreign loop driving a bridged run.

    python -m tests.bridge_agent --store URL --run-id ID --receiver URL --mode lookup|none
                                 [--prefix P]

It plays a framework with a loop of its own: a scripted model (a model step whose
body counts how often it runs in this process) asks for two calls, ``post_effect(Pa)``
then ``post_effect(Pb)`` (P: the prefix), each an irreversible POST to the receiver
(tests/crash_agent.py) with the call's idempotency key; a second model step answers
with the results. Mode ``lookup`` gives the calls the receiver's lookup; ``none``
gives them none, so an uncertain call needs a person. Prints one JSON line: status,
outcome, how many times the model body ran here, and the key of a call that needs a
person. Run from the repository root; ``AGENTJOURNAL_FAULT`` kills it in a window
(agentjournal.faults). A test resumes the run in its own process with :func:`drive`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from typing import Any

from agentjournal import (
    NeedsPerson,
    ToolContext,
    ToolFailed,
    Turn,
    open_run,
    open_store,
)
from agentjournal.demo.ledger import FENCING_HEADER, http_json

from .receiver_lookup import lookup_at

LABELS = ("a", "b")


def fingerprint(history: list[Any]) -> str:
    return hashlib.sha256(json.dumps(history, sort_keys=True).encode()).hexdigest()[:16]


def summary(value: dict[str, Any]) -> Turn:
    return Turn(text=value.get("text", ""), tool_calls=value.get("calls", []),
                usage={"input_tokens": 10, "output_tokens": 5, "cost_usd": None},
                model="scripted")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bridge_agent")
    parser.add_argument("--store", required=True)
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--receiver", required=True)
    parser.add_argument("--mode", choices=["lookup", "none"], required=True)
    parser.add_argument("--prefix", default="")
    args = parser.parse_args(argv)
    print(json.dumps(drive(args.store, args.run_id, args.receiver, args.mode, args.prefix)))
    return 0


def drive(store_url: str, run_id: str, url: str, mode: str, prefix: str = "") -> dict[str, Any]:
    """Run (or resume) the run once; what it did."""
    labels = [prefix + label for label in LABELS]
    asked = 0

    def model(history: list[Any]) -> dict[str, Any]:
        nonlocal asked
        asked += 1
        if len(history) == 1:
            return {"text": "", "calls": [{"id": f"call-{label}", "name": "post_effect",
                                           "args": {"label": label}} for label in labels]}
        applied = ", ".join(f"{r['label']} ({r['status']})" for r in history[1:])
        return {"text": f"posted {applied}"}

    def post(label: str) -> Any:
        def body(ctx: ToolContext) -> Any:
            status, answer = http_json("POST", f"{url}/effects", {"label": label},
                                       {"Idempotency-Key": ctx.key,
                                        FENCING_HEADER: str(ctx.epoch)})
            if status >= 400:
                raise ToolFailed(f"receiver answered {status}")
            return {"label": answer["label"], "status": answer["status"]}
        return body

    lookup = lookup_at(url)

    store = open_store(store_url)
    out: dict[str, Any] = {"needs_person": None, "outcome": None}
    try:
        run = open_run(store, run_id, agent="tests.bridge_agent", input={"labels": labels})
        try:
            with run:
                history: list[Any] = [{"labels": labels}]
                while True:
                    turn = run.step("model.request", fingerprint(history),
                                    lambda: model(history), turn=summary)
                    if not turn.get("calls"):
                        run.finish(turn["text"])
                        out["outcome"] = turn["text"]
                        break
                    for call in turn["calls"]:
                        history.append(run.call(
                            "post_effect", call["args"], call_id=call["id"],
                            identity=["label"], effect="irreversible",
                            body=post(call["args"]["label"]),
                            lookup=lookup if mode == "lookup" else None))
        except NeedsPerson as exc:
            out["needs_person"] = exc.key
        out.update(status=run.state.status, model_calls=asked)
    finally:
        store.close()
    return out


if __name__ == "__main__":
    sys.exit(main())
