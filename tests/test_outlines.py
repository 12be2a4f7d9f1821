"""Outlines (projections.py): advanced batch by batch, through their stored bytes, an
outline equals the outline of a fresh fold of the same prefix, for every fixture of
every schema version, at every seq."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from agentjournal import decode as decode_event
from agentjournal import fold
from agentjournal.projections import advance, decode, differences, encode, outline

FIXTURES = Path(__file__).parent / "fixtures"
EVENT_LOGS = sorted(FIXTURES.glob("v*/*.events.jsonl"))


@pytest.mark.parametrize("log_file", EVENT_LOGS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_an_outline_advanced_in_batches_equals_the_outline_of_a_fresh_fold(
        log_file: Path) -> None:
    events = [decode_event(line) for line in log_file.read_bytes().splitlines()]
    rng = random.Random(log_file.name)
    stored: bytes | None = None
    at = 0
    while at < len(events):
        batch = events[at:at + rng.randint(1, 4)]
        at += len(batch)
        current = advance(None if stored is None else decode(stored), batch)
        stored = encode(current)
        fresh = outline(fold(events[:at]))
        assert differences(decode(stored), fresh) == [], f"{log_file.name} at seq {at}"
        assert decode(stored).last_seq == at


def test_an_outline_keeps_nothing_that_grows_with_the_run() -> None:
    events = [decode_event(line) for line in
              (FIXTURES / "v8" / "every_event_type.events.jsonl").read_bytes().splitlines()]
    full = fold(events)
    light = advance(None, events)
    assert full.messages and not light.messages
    assert full.completed and not light.completed
    assert (light.status, light.turns, light.tool_calls) == (full.status, full.turns,
                                                              full.tool_calls)
