"""Permanent fixtures: logs written by every released schema version must replay, at
every prefix, to the state recorded when they were written. They are never changed."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from agentjournal import (
    SCHEMA_VERSION,
    EventType,
    UnsupportedVersionError,
    apply,
    decode,
)
from agentjournal.events import SEALED_SINCE
from agentjournal.state import RunState, durable_fields
from agentjournal.store.base import decode_record

FIXTURES = Path(__file__).parent / "fixtures"
MANIFEST = FIXTURES / "MANIFEST.sha256"
EVENT_LOGS = sorted(FIXTURES.glob("v*/*.events.jsonl"))


def manifest() -> dict[str, str]:
    return {rel: digest for digest, rel in
            (line.split("  ") for line in MANIFEST.read_text().splitlines() if line)}


def test_every_released_version_has_fixtures() -> None:
    versions = {p.parent.name for p in EVENT_LOGS}
    assert versions == {f"v{n}" for n in range(1, SCHEMA_VERSION + 1)}


@pytest.mark.parametrize("log_file", EVENT_LOGS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_prefix_replays_to_the_recorded_state(log_file: Path) -> None:
    events = [decode(line) for line in log_file.read_bytes().splitlines()]
    recorded = [json.loads(line) for line in
                log_file.with_name(log_file.name.replace(".events.", ".states.")).open()]
    assert [r["seq"] for r in recorded] == [e.seq for e in events]
    state = RunState()
    for event, expected in zip(events, recorded, strict=True):
        apply(state, event)
        got: dict[str, Any] = json.loads(json.dumps(durable_fields(state), sort_keys=True))
        # A later release may add durable fields; every recorded one must hold.
        assert {k: got.get(k) for k in expected["state"]} == expected["state"], (
            f"{log_file.name}: state differs at seq {event.seq}")


@pytest.mark.parametrize("log_file", EVENT_LOGS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_fixture_reads_through_the_digest_chain(log_file: Path) -> None:
    # v4 logs are sealed, each record chained to the one before; older logs are not, and
    # read as they always did. Either way the store's read path accepts them unchanged.
    prev = ""
    for seq, line in enumerate(log_file.read_bytes().splitlines(), start=1):
        event, prev = decode_record(event_run(line), seq, line, prev)
        assert event == decode(line)
    assert (prev != "") == (int(log_file.parent.name[1:]) >= SEALED_SINCE)


def event_run(line: bytes) -> str:
    return str(json.loads(line)["run_id"])


def test_fixture_files_are_never_modified_or_deleted() -> None:
    listed = manifest()
    on_disk = {p.relative_to(FIXTURES).as_posix() for p in FIXTURES.glob("v*/*.jsonl")}
    assert set(listed) == on_disk, "a fixture was added without the manifest, or deleted"
    for rel, digest in listed.items():
        assert hashlib.sha256((FIXTURES / rel).read_bytes()).hexdigest() == digest, (
            f"fixture {rel} was modified; fixtures are permanent")


def test_git_history_never_modified_or_deleted_a_fixture() -> None:
    # The manifest itself could be edited; history cannot be argued with.
    if shutil.which("git") is None or not (FIXTURES.parents[1] / ".git").exists():
        pytest.skip("not a git checkout")
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=FIXTURES.parents[1], capture_output=True,
                              text=True, check=True).stdout

    changed = git("log", "--format=%h %s", "--diff-filter=MDR", "--", "tests/fixtures/v*/")
    assert changed == "", f"commits changed or removed fixtures:\n{changed}"
    history = git("log", "-p", "--format=", "--", "tests/fixtures/MANIFEST.sha256")
    removed = [ln for ln in history.splitlines() if ln.startswith("-") and not ln.startswith("---")]
    assert removed == [], f"the manifest only ever grows; removed: {removed}"


def test_a_newer_schema_version_is_refused() -> None:
    line = EVENT_LOGS[0].read_bytes().splitlines()[0]
    future = line.replace(b'"v":1', f'"v":{SCHEMA_VERSION + 1}'.encode())
    with pytest.raises(UnsupportedVersionError, match=r"(?i)upgrade agentjournal"):
        decode(future)


def test_the_newest_fixtures_hold_every_event_type() -> None:
    newest = FIXTURES / f"v{SCHEMA_VERSION}"
    seen = {decode(line).type for log in newest.glob("*.events.jsonl")
            for line in log.read_bytes().splitlines()}
    assert seen == set(EventType)
