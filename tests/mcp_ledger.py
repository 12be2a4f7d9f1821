"""An MCP server over stdio for tests/test_openai_agents_runner.py: a ledger with a
read-only tool and an irreversible one, as their annotations say, counting every call
it serves in a file (``python -m tests.mcp_ledger COUNT_FILE``)."""

from __future__ import annotations

import sys
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

ledger = MCPServer("ledger")
COUNTS = Path(sys.argv[1]) if len(sys.argv) > 1 else None


def served(name: str) -> None:
    if COUNTS is not None:
        with COUNTS.open("a") as counts:
            counts.write(f"{name}\n")


@ledger.tool(annotations=ToolAnnotations(readOnlyHint=True))
def balance(account: str) -> int:
    """The balance of `account`, in cents."""
    served("balance")
    return 1200


@ledger.tool(annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=True))
def transfer(account: str, cents: int) -> str:
    """Move `cents` out of `account`."""
    served("transfer")
    return f"moved {cents} from {account}"


if __name__ == "__main__":
    ledger.run("stdio")
