"""Child processes for tests/test_openai_agents_*.py, killed with SIGKILL by the tests.

    python -m tests.openai_agents_child session-writer --store URL --session ID --batch N

``session-writer`` adds batches to a ``JournalSession`` until it is killed: batch ``b`` is
``N`` items, tool calls and their outputs in pairs, each tagged with ``b``; after each
``add_items`` returns it prints ``added b`` (so the test knows which batches were
acknowledged). Run from the repository root.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from agentjournal import open_store
from agentjournal.integrations.openai_agents import JournalSession


def batch_items(batch: int, size: int) -> list[dict[str, Any]]:
    """``size`` items (an even number): a call and its output per pair, tagged ``batch``."""
    items: list[dict[str, Any]] = []
    for pair in range(size // 2):
        call_id = f"call_{batch}_{pair}"
        items.append({"type": "function_call", "call_id": call_id, "name": "post_effect",
                      "arguments": f'{{"batch": {batch}}}'})
        items.append({"type": "function_call_output", "call_id": call_id,
                      "output": f"batch {batch} pair {pair}"})
    return items


async def write_sessions(store_url: str, session_id: str, size: int) -> None:
    store = open_store(store_url)
    session = JournalSession(store, session_id)
    batch = 0
    while True:
        await session.add_items(batch_items(batch, size))  # type: ignore[arg-type]
        print(f"added {batch}", flush=True)
        batch += 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.openai_agents_child")
    sub = parser.add_subparsers(dest="command", required=True)
    writer = sub.add_parser("session-writer")
    writer.add_argument("--store", required=True)
    writer.add_argument("--session", required=True)
    writer.add_argument("--batch", type=int, default=40)
    args = parser.parse_args(argv)
    asyncio.run(write_sessions(args.store, args.session, args.batch))
    return 0


if __name__ == "__main__":
    sys.exit(main())
