"""Serve the stub until killed (SIGTERM or Ctrl-C); ``--help`` gives the script format."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
from pathlib import Path

from .server import StubServer
from .wire import SCRIPT_FORMAT, item_from_json

USAGE = f"""\
Answers each request to POST /v1/chat/completions, /v1/responses or /v1/messages
with the script's next item, in order, whichever endpoint asks (GET
/v1/responses/ID and POST /v1/responses/ID/cancel serve background responses).
A request the real API would reject is answered 400 and consumes nothing.

{SCRIPT_FORMAT}
example:
  echo '[{{"calls": [["add", {{"a": 1, "b": 2}}]]}}, {{"text": "3"}}]' > turns.json
  python -m agentjournal.testing.llm_stub --script turns.json --port 8765 &
  OPENAI_BASE_URL=http://127.0.0.1:8765/v1 OPENAI_API_KEY=stub python my_agent.py
"""


def parser() -> argparse.ArgumentParser:
    cli = argparse.ArgumentParser(
        prog="python -m agentjournal.testing.llm_stub",
        description="A loopback stub of the OpenAI (Chat Completions, Responses) and "
                    "Anthropic Messages APIs, scripted turn by turn.",
        epilog=USAGE, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_argument("--script", type=Path, metavar="FILE",
                     help="JSON list of script items, one per request (default: none, so "
                          'every answer is the text "done")')
    cli.add_argument("--port", type=int, default=0,
                     help="port on 127.0.0.1 (default: a free one, printed on stderr)")
    cli.add_argument("--port-file", type=Path, metavar="FILE",
                     help="also write the port to FILE once listening (for scripts and tests)")
    cli.add_argument("--no-retrieve", action="store_true",
                     help="complete background responses inside create and answer 404 to "
                          "retrieve, as several OpenAI-compatible servers do")
    return cli


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    items = json.loads(args.script.read_text()) if args.script else []
    if not isinstance(items, list):
        sys.exit(f"{args.script}: the script is a JSON list of items, not {type(items).__name__}")
    try:
        script = [item_from_json(item) for item in items]
    except ValueError as exc:
        sys.exit(f"{args.script}: {exc}")
    # SIGTERM should leave through the context manager, closing the socket.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with StubServer(script, port=args.port, retrieve=not args.no_retrieve) as stub:
        if args.port_file is not None:
            # Written then renamed, so a poller never reads a half-written port.
            tmp = args.port_file.with_suffix(".tmp")
            tmp.write_text(str(stub.port))
            os.replace(tmp, args.port_file)
        # On stderr, as a server's log: a caller's stdout (a JSON document) stays its own.
        print(f"serving {stub.url} (OpenAI base URL {stub.url}/v1)", file=sys.stderr,
              flush=True)
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: leave quietly
            threading.Event().wait()


if __name__ == "__main__":
    main()
