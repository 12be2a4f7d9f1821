"""Serve until killed:

    python -m agentjournal.testing.llm_stub --port-file PATH [--script JSON_FILE] [--no-retrieve]

The script file holds a JSON list of ``{"type": "reply"|"fail"|"drop"|"hang", ...kwargs}``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from pathlib import Path

from .server import StubServer
from .wire import item_from_json


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m agentjournal.testing.llm_stub")
    parser.add_argument("--port-file", required=True, type=Path)
    parser.add_argument("--script", type=Path, help="JSON list of script items")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--no-retrieve", action="store_true",
                        help="complete background responses inside create and answer 404 to "
                             "retrieve, as several OpenAI-compatible servers do")
    args = parser.parse_args(argv)
    items = json.loads(args.script.read_text()) if args.script else []
    # SIGTERM should leave through the context manager, closing the socket.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    script = [item_from_json(i) for i in items]
    with StubServer(script, port=args.port, retrieve=not args.no_retrieve) as stub:
        # Written then renamed, so a poller never reads a half-written port.
        tmp = args.port_file.with_suffix(".tmp")
        tmp.write_text(str(stub.port))
        os.replace(tmp, args.port_file)
        threading.Event().wait()


if __name__ == "__main__":
    main()
