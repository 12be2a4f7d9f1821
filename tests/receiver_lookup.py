"""The reconcile lookup the bridge's and Pydantic AI's crash children share: what the
receiver process (tests/crash_agent.py) holds under a call's idempotency key."""

from __future__ import annotations

from typing import Any

from agentjournal import Absent, Conflict, Found, PendingCall, Unknown
from agentjournal.demo.ledger import http_json


def lookup_at(url: str) -> Any:
    def applied(call: PendingCall) -> Found | Absent | Conflict | Unknown:
        status, found = http_json("GET", f"{url}/effects/{call.key}")
        if status == 404:
            return Absent(final=True)
        if status != 200:
            return Unknown(f"lookup answered {status}")
        if found["label"] != call.args["label"]:
            return Conflict(found)
        return Found({"label": found["label"], "status": found["status"]})
    return applied
