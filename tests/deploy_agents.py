"""Child processes for tests/test_deploys_native.py: one native agent, in the code it had
before a deploy (``base``) and in each code a deploy may bring (the variants).

    python -m tests.deploy_agents --store URL --run-id ID --receiver URL --turns FILE
                                  --variant NAME

runs (or resumes) the run once and prints one JSON line: status, pause reason, last seq.
The model is scripted: turn 0 posts effect A, turn 1 effect B, turn 2 answers "done" (with
``--read-first``, a turn calling the read-only ``note`` comes first); each
time it is asked it appends its turn number to ``--turns`` (the test counts the asks).
``post_effect`` posts to the receiver of tests/crash_agent.py (which counts every POST by
label and key) with the call's key, and looks the key up there to settle an open call.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentjournal import Agent, open_store
from agentjournal.demo.ledger import http_json
from agentjournal.models import ModelRequest, ModelResponse, ScriptedModel, calls
from agentjournal.state import PendingCall, ToolCall
from agentjournal.tools import Absent, Conflict, Found, Tool, ToolContext, ToolFailed, Unknown, tool

TASK = "Post effect A, then effect B, then say done."
INSTRUCTIONS = "You post effects at the receiver."
VARIANTS = ("base", "instructions", "tool_added", "tool_removed", "tool_renamed",
            "tool_renamed_mapped", "args_changed", "identity_changed", "effect_changed",
            "model_switched", "note_removed")


class CountingModel(ScriptedModel):
    """Posts A, then B, then says done; every ask is counted in ``turns_file``."""

    def __init__(self, turns_file: Path, model: str, *, read_first: bool = False) -> None:
        first = [calls(("note", {"text": "starting"}))] if read_first else []
        super().__init__([*first, self._post("A"), self._post("B")])
        self.turns_file = turns_file
        self.model = model  # its identity: part of the agent's version

    @staticmethod
    def _post(label: str) -> Callable[[ModelRequest], ModelResponse]:
        def turn(request: ModelRequest) -> ModelResponse:
            # The posting tool under whatever name this code gives it.
            spec = next((t for t in request.tools if t["name"].startswith("post_effect")),
                        None)
            if spec is None:  # this code has no posting tool: nothing more to post
                return ModelResponse(text="done (no tool to post with)")
            args: dict[str, Any] = {"label": label, "amount": 1}
            if "currency" in spec["parameters"].get("properties", {}):
                args["currency"] = "EUR"
            return ModelResponse(text="", tool_calls=[ToolCall(id="", name=spec["name"],
                                                               args=args)])
        return turn

    def complete(self, request: ModelRequest) -> ModelResponse:
        with self.turns_file.open("a") as f:
            f.write(f"{request.turn}\n")
        return super().complete(request)


def lookup(url: str) -> Callable[[PendingCall], Found | Absent | Conflict | Unknown]:
    def applied(call: PendingCall) -> Found | Absent | Conflict | Unknown:
        try:
            status, found = http_json("GET", f"{url}/effects/{call.key}")
        except OSError as exc:
            return Unknown(f"receiver unreachable: {exc}")
        if status == 404:
            return Absent(final=True)  # the receiver applies synchronously
        if status != 200:
            return Unknown(f"lookup answered {status}")
        return Found(found) if found["label"] == call.args.get("label") else Conflict(found)
    return applied


def post(ctx: ToolContext, url: str, label: str) -> dict[str, Any]:
    status, answer = http_json("POST", f"{url}/effects", {"label": label},
                               {"Idempotency-Key": ctx.key})
    if status >= 400:
        raise ToolFailed(f"receiver answered {status}: {answer}")
    return dict(answer)


def post_tool(url: str, variant: str) -> Tool:
    """``post_effect`` as the variant's code defines it."""
    name = "post_effect_v2" if variant.startswith("tool_renamed") else "post_effect"
    effect = "idempotent" if variant == "effect_changed" else "irreversible"
    identity = ["label", "amount"] if variant == "identity_changed" else ["label"]
    doc = "Apply the effect named `label` once at the receiver."
    if variant == "args_changed":
        def with_currency(ctx: ToolContext, label: str, currency: str,
                          amount: int = 1) -> dict[str, Any]:
            return post(ctx, url, label)
        fn: Callable[..., Any] = with_currency
    else:
        def plain(ctx: ToolContext, label: str, amount: int = 1) -> dict[str, Any]:
            return post(ctx, url, label)
        fn = plain
    fn.__doc__ = doc
    # The idempotent variant drops the lookup (the receiver "dedupes now"): recovery
    # would retry the open call with its key.
    made: Tool = tool(name=name, effect=effect, identity=identity,
                      reconcile=None if variant == "effect_changed" else lookup(url))(fn)
    return made


def read_tool(url: str) -> Tool:
    @tool(effect="read_only")
    def read_fact(name: str) -> Any:
        """Read the fact `name` at the receiver."""
        status, fact = http_json("GET", f"{url}/facts/{name}")
        return fact if status == 200 else None
    return read_fact


def note_tool() -> Tool:
    @tool(effect="read_only")
    def note(text: str) -> str:
        """Keep a note (the agent's other tool)."""
        return text
    return note


def agent_for(variant: str, receiver: str, turns_file: Path, *,
              read_first: bool = False) -> Agent:
    """The agent as the code of ``variant`` defines it (``base``: before the deploy)."""
    if variant not in VARIANTS:
        raise SystemExit(f"unknown variant {variant!r}; choose from {', '.join(VARIANTS)}")
    tools = [] if variant == "note_removed" else [note_tool()]
    if variant != "tool_removed":
        tools.append(post_tool(receiver, variant))
    if variant == "tool_added":
        tools.append(read_tool(receiver))
    instructions = INSTRUCTIONS + (" Be brief." if variant == "instructions" else "")
    model = CountingModel(turns_file, "scripted-2" if variant == "model_switched"
                          else "scripted-1", read_first=read_first)
    renamed = {"post_effect": "post_effect_v2"} if variant == "tool_renamed_mapped" else None
    return Agent(model, tools, instructions=instructions,
                 **({"renamed": renamed} if renamed else {}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    for flag in ("--store", "--run-id", "--receiver", "--turns", "--variant"):
        parser.add_argument(flag, required=True)
    parser.add_argument("--read-first", action="store_true",
                        help="turn 0 calls the read-only tool `note` before posting")
    args = parser.parse_args(argv)
    agent = agent_for(args.variant, args.receiver, Path(args.turns),
                      read_first=args.read_first)
    store = open_store(args.store)
    try:
        result = agent.run(store, args.run_id, TASK)
    finally:
        store.close()
    print(json.dumps({"status": result.status, "pause_reason": result.pause_reason,
                      "last_seq": result.last_seq,
                      "version": getattr(agent, "version", None),
                      "versions": getattr(result.state, "versions", None)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
