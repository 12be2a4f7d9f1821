"""Loopback stub of the OpenAI (Chat Completions, Responses) and Anthropic Messages APIs.

Point the real SDK clients at it::

    with StubServer([Reply(calls=[("add", {"a": 1})]), Reply(text="3")]) as stub:
        client = openai.OpenAI(base_url=stub.url + "/v1", api_key="test", max_retries=0)
"""

from __future__ import annotations

from collections.abc import Iterator

from .server import Rejection, StubServer
from .wire import Drop, Fail, Hang, Reply, ScriptItem, Usage

__all__ = [
    "Drop",
    "Fail",
    "Hang",
    "Rejection",
    "Reply",
    "ScriptItem",
    "StubServer",
    "Usage",
    "serve",
]


def serve(*items: ScriptItem) -> Iterator[StubServer]:
    """For fixtures: ``yield from serve()`` runs a stub for the test and closes it after."""
    with StubServer(items) as stub:
        yield stub
