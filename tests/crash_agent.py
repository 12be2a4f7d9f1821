"""Child processes for tests/test_crash_models.py: an agent on a real provider SDK, and the
receiver that counts its effects.

    python -m tests.crash_agent run --store URL --run-id ID --provider NAME --base-url URL
                                    --receiver URL [--background] [--block-before L,..]
                                    [--block-after L,..]
    python -m tests.crash_agent receiver

``run`` runs (or resumes) the agent once and prints the result as one JSON line: its
status, outcome, last seq and ``durable_fields`` of the live final state. Its one tool,
``post_effect(label)``, POSTs to the receiver with the call's idempotency key; labels in
``--block-before`` block forever before the request leaves, labels in ``--block-after``
block forever after the receiver answered (a test kills the process there).

``receiver`` serves on a free loopback port, prints ``listening on URL`` and counts every
POST it is sent, by key and label, deduping nothing; ``PUT``/``GET /facts/{name}`` hold a
value the read-only tool (``read_fact``) reads, counting every read. ``GET
/effects/{key}`` is the lookup (404: never applied), ``GET /effects`` the counts. Run
from the repository root.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import msgspec

from agentjournal import Agent, open_store
from agentjournal.demo.ledger import FENCING_HEADER, http_json
from agentjournal.models import Model
from agentjournal.state import PendingCall, durable_fields
from agentjournal.tools import Absent, Conflict, Found, Tool, ToolContext, ToolFailed, Unknown, tool

TASK = "Post the effects you are asked for, then say you are done."
READY = "listening on "

# --- the agent -----------------------------------------------------------------------------


def make_model(provider: str, base_url: str, *, background: bool) -> Model:
    """The adapter over the real SDK client, pointed at the stub (only that SDK is imported)."""
    if provider == "anthropic":
        import anthropic

        from agentjournal.providers.anthropic import AnthropicModel

        return AnthropicModel(anthropic.Anthropic(base_url=base_url, api_key="test",
                                                  max_retries=0), "claude-stub")
    import openai

    from agentjournal.providers.openai import OpenAIChatModel, OpenAIResponsesModel

    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="test", max_retries=0)
    if provider == "openai-chat":
        return OpenAIChatModel(client, "gpt-stub")
    if provider == "openai-responses":
        return OpenAIResponsesModel(client, "gpt-stub", background=background,
                                    poll_interval=0.02)
    raise SystemExit(f"unknown provider {provider!r}")


def effect_tool(url: str, block_before: set[str], block_after: set[str]) -> Tool:
    def applied(call: PendingCall) -> Found | Absent | Conflict | Unknown:
        try:
            status, found = http_json("GET", f"{url}/effects/{call.key}")
        except OSError as exc:
            return Unknown(f"receiver unreachable: {exc}")
        if status == 404:
            return Absent(final=True)  # the receiver applies synchronously: no late commit
        if status != 200:
            return Unknown(f"lookup answered {status}")
        return Found(found) if found["label"] == call.args["label"] else Conflict(found)

    @tool(effect="irreversible", identity=["label"], reconcile=applied)
    def post_effect(ctx: ToolContext, label: str) -> dict[str, Any]:
        """Apply the effect named `label` once at the receiver."""
        if label in block_before:
            threading.Event().wait()  # never reaches the receiver: the test kills us here
        status, answer = http_json("POST", f"{url}/effects", {"label": label},
                                   {"Idempotency-Key": ctx.key, FENCING_HEADER: str(ctx.epoch)})
        if status >= 400:
            raise ToolFailed(f"receiver answered {status}: {answer}")
        if label in block_after:
            threading.Event().wait()  # applied, its completion never recorded
        return answer

    return post_effect


def read_tool(url: str) -> Tool:
    @tool(effect="read_only")
    def read_fact(name: str) -> Any:
        """Read the fact `name` at the receiver (it counts each read)."""
        status, fact = http_json("GET", f"{url}/facts/{name}")
        if status != 200:
            raise ToolFailed(f"receiver answered {status}: {fact}")
        return fact

    return read_fact


def run(args: argparse.Namespace) -> int:
    model = make_model(args.provider, args.base_url, background=args.background)
    before = set(filter(None, args.block_before.split(",")))
    after = set(filter(None, args.block_after.split(",")))
    agent = Agent(model, [effect_tool(args.receiver, before, after), read_tool(args.receiver)])
    store = open_store(args.store)
    try:
        result = agent.run(store, args.run_id, TASK)
    finally:
        store.close()
    print(json.dumps({"status": result.status, "outcome": result.outcome,
                      "last_seq": result.last_seq,
                      "durable": msgspec.to_builtins(durable_fields(result.state))}))
    return 0


# --- the receiver --------------------------------------------------------------------------


class _Receiver(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.lock = threading.Lock()
        self.applied: list[dict[str, Any]] = []  # every POST, in arrival order
        self.facts: dict[str, Any] = {}  # PUT /facts/{name}: what a read-only tool reads
        self.reads: Counter[str] = Counter()  # GET /facts/{name}, by name


class _Handler(BaseHTTPRequestHandler):
    server: _Receiver

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, status: int, body: Any) -> None:
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        key = self.headers.get("Idempotency-Key")
        if self.path != "/effects" or not key or not isinstance(body.get("label"), str):
            self._send(400, {"error": "POST /effects {label} with an Idempotency-Key"})
            return
        effect = {"label": body["label"], "key": key, "status": "applied"}
        with self.server.lock:
            self.server.applied.append(effect)
        self._send(201, effect)

    def do_PUT(self) -> None:
        parts = self.path.strip("/").split("/")
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        if len(parts) != 2 or parts[0] != "facts":
            self._send(404, {"error": f"no route {self.path}"})
            return
        with self.server.lock:
            self.server.facts[parts[1]] = body
        self._send(200, body)

    def do_GET(self) -> None:
        parts = self.path.strip("/").split("/")
        with self.server.lock:
            applied = list(self.server.applied)
            if len(parts) == 2 and parts[0] == "facts":
                self.server.reads[parts[1]] += 1
                fact = self.server.facts.get(parts[1])
            reads = dict(self.server.reads)
        if len(parts) == 2 and parts[0] == "facts":
            self._send(200, fact) if fact is not None else self._send(404, {"error": "none"})
        elif parts == ["effects"]:
            self._send(200, {"by_label": Counter(e["label"] for e in applied),
                             "by_key": Counter(e["key"] for e in applied), "reads": reads})
        elif len(parts) == 2 and parts[0] == "effects":
            found = [e for e in applied if e["key"] == parts[1]]
            self._send(200, found[0]) if found else self._send(404, {"error": "not applied"})
        else:
            self._send(404, {"error": f"no route {self.path}"})


def receiver() -> int:
    server = _Receiver()
    print(f"{READY}http://127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever(poll_interval=0.05)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.crash_agent")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("receiver")
    p = sub.add_parser("run")
    p.add_argument("--store", required=True)
    p.add_argument("--run-id", required=True)
    p.add_argument("--provider", required=True,
                   choices=["openai-chat", "openai-responses", "anthropic"])
    p.add_argument("--base-url", required=True, help="the stub server's URL")
    p.add_argument("--receiver", required=True, help="the receiver's URL")
    p.add_argument("--background", action="store_true")
    p.add_argument("--block-before", default="")
    p.add_argument("--block-after", default="")
    args = parser.parse_args(argv)
    return receiver() if args.command == "receiver" else run(args)


if __name__ == "__main__":
    sys.exit(main())
