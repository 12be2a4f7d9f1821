"""A stdio MCP server, built with the ``mcp`` package, for tests/test_pydantic_ai.py.

    python tests/mcp_server.py RECEIVER_URL

Three tools, each declaring its effect the MCP way (tool annotations), each telling the
receiver (tests/crash_agent.py) it was called, so the receiver counts the calls:
``read_balance`` (readOnlyHint), ``set_limit`` (idempotentHint) and ``transfer`` (no
hint: irreversible).
"""

from __future__ import annotations

import json
import sys
import urllib.request

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

RECEIVER = sys.argv[1] if len(sys.argv) > 1 else ""
server = MCPServer("bank")


def tell(label: str) -> None:
    request = urllib.request.Request(
        f"{RECEIVER}/effects", data=json.dumps({"label": label}).encode(), method="POST",
        headers={"Content-Type": "application/json", "Idempotency-Key": f"mcp-{label}"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        answer.read()


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def read_balance(account: str) -> str:
    """The balance of `account`."""
    tell(f"read_balance:{account}")
    return f"{account}: 100"


@server.tool(annotations=ToolAnnotations(idempotentHint=True))
def set_limit(account: str, limit: int) -> str:
    """Set the spending limit of `account` (the same limit twice is one change)."""
    tell(f"set_limit:{account}")
    return f"{account} limit {limit}"


@server.tool()
def transfer(account: str, amount: int) -> str:
    """Move `amount` out of `account`."""
    tell(f"transfer:{account}")
    return f"moved {amount} from {account}"


if __name__ == "__main__":
    server.run("stdio")
