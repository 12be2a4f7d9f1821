"""One documented rule for what a tool returns (and what ctx.remember keeps): common
types get a faithful JSON form; NaN, infinities and anything else are never coerced to a
string. A result that cannot be kept makes its completion an encoding error, with the key,
so the effect (which happened) is never repeated."""

from __future__ import annotations

import dataclasses
import enum
import math
import re
import uuid
from collections.abc import Iterator
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import msgspec
import pytest

from agentjournal import (
    Agent,
    EncodingError,
    EventType,
    ScriptedModel,
    calls,
    fold,
    open_store,
    reply,
)
from agentjournal.results import to_json
from agentjournal.store import Store
from agentjournal.tools import ToolContext, tool

E = EventType


class Color(enum.Enum):
    RED = "red"


@dataclasses.dataclass
class Point:
    x: int
    y: int


class Money(msgspec.Struct):
    cents: int
    currency: str


class FakePydantic:
    """Duck-typed like a Pydantic v2 model (pydantic is not a dependency)."""

    def model_dump(self, mode: str = "python") -> dict[str, Any]:
        assert mode == "json"
        return {"id": 7, "when": "2026-01-01T00:00:00Z"}


class Opaque:
    def __repr__(self) -> str:
        return "Opaque(secret='sk-live-should-never-be-stored')"


def gen() -> Iterator[int]:
    yield 1


@pytest.mark.parametrize(("value", "expected"), [
    (datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC), "2026-01-02T03:04:05Z"),
    (date(2026, 1, 2), "2026-01-02"),
    (Decimal("1.10"), "1.10"),
    (uuid.UUID(int=1), "00000000-0000-0000-0000-000000000001"),
    (b"hi", "aGk="),
    ({3, 1, 2}, [1, 2, 3]),
    (frozenset({"b", "a"}), ["a", "b"]),
    ((1, "a"), [1, "a"]),
    (Color.RED, "red"),
    (Point(1, 2), {"x": 1, "y": 2}),
    (Money(cents=5, currency="EUR"), {"cents": 5, "currency": "EUR"}),
    (FakePydantic(), {"id": 7, "when": "2026-01-01T00:00:00Z"}),
    ({"nested": [Point(0, 1), {Color.RED}]}, {"nested": [{"x": 0, "y": 1}, ["red"]]}),
    (None, None), ("text", "text"), (1.5, 1.5),
])
def test_common_types_have_a_faithful_json_form(value: Any, expected: Any) -> None:
    assert to_json(value) == expected


@pytest.mark.parametrize(("value", "says"), [
    (math.nan, "NaN"), ({"x": [math.inf]}, "result.x[0]"), (-math.inf, "infinit"),
    ({"x": "\udc80"}, "lone surrogate"),
    (Opaque(), "Opaque"), (gen(), "generator"), (object(), "object"),
    ({"fn": print}, "result.fn"),
])
def test_anything_else_is_refused_never_stringified(value: Any, says: str) -> None:
    with pytest.raises(EncodingError, match=re.escape(says)) as info:
        to_json(value)
    assert "sk-live" not in str(info.value)  # the value's repr is never in the message


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return open_store(f"sqlite:///{tmp_path / 'j.db'}")


@pytest.mark.parametrize("bad", [math.nan, Opaque(), gen(), {"text": "bad \udc80 bytes"}],
                         ids=["nan", "object", "generator", "lone-surrogate"])
def test_an_unkeepable_result_is_an_encoding_error_with_the_key(store: Store, bad: Any) -> None:
    applied: list[int] = []

    @tool(effect="irreversible")
    def post(n: int) -> Any:
        applied.append(n)
        return bad

    model = ScriptedModel([calls(("post", {"n": 1})), calls(("post", {"n": 1})), reply("ok")])
    result = Agent(model, [post]).run(store, "r1", "t")
    assert result.status == "finished" and applied == [1]  # the effect is never repeated
    done = next(e.payload for e in store.read("r1") if e.type is E.TOOL_CALL_COMPLETED)
    assert done["idempotency_key"] and done["is_error"] and done["result"] is None
    assert "encoding_error" in done and "not kept" in done["content"]
    assert done.get("result") != "nan" and "Opaque(" not in str(done)
    state = fold(store.read("r1"))
    tool_messages = [m for m in state.messages if m.role == "tool"]
    assert all("not kept" in m.content for m in tool_messages)


def test_memory_values_follow_the_same_rule(store: Store) -> None:
    outcome: list[str] = []

    @tool(effect="read_only")
    def note(ctx: ToolContext) -> str:
        ctx.remember("when", date(2026, 1, 2))
        try:
            ctx.remember("bad", math.nan)
        except EncodingError as exc:
            outcome.append(str(exc))
        return "ok"

    Agent(ScriptedModel([calls(("note", {})), reply("ok")]), [note]).run(store, "r1", "t")
    assert fold(store.read("r1")).memory == {"when": "2026-01-02"}
    assert outcome and "NaN" in outcome[0]
