"""The CLI's listings read outlines (projections.py), not logs: `runs`, `approvals` and
`uncertain` on a store of 2,000 runs read no log, and say for every run what a fold of its
log says (status, counts, tokens, cost), for native runs of every status. On a store an
older release wrote, they still work (the store folds) and say once how to speed up."""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args

import pytest
from click.testing import CliRunner, Result

from agentjournal import decode, fold, open_store
from agentjournal.cli import cli
from agentjournal.cli._base import outlines_of
from agentjournal.cli._usage import run_cost
from agentjournal.cli.reading import newest_runs
from agentjournal.events import Event, make_events
from agentjournal.prometheus import store_counts
from agentjournal.state import RunState, Status
from agentjournal.store import sqlite as sqlite_module
from agentjournal.store.sqlite import SQLiteStore

from .conftest import BACKENDS

FIXTURES = Path(__file__).parent / "fixtures" / "v8"
#: Logs of integrations (a bridge, LangGraph, the Agents SDK): not native runs.
NOT_NATIVE = ("bridged", "langgraph_thread", "openai_agents")
RUNS = 2000


def native_prefixes() -> list[tuple[str, list[Event]]]:
    """Every prefix of every native v8 fixture log: runs stopped at every status."""
    out = []
    for path in sorted(FIXTURES.glob("*.events.jsonl")):
        name = path.name.split(".")[0]
        if name in NOT_NATIVE:
            continue
        events = [decode(line) for line in path.read_bytes().splitlines()]
        out += [(f"{name}-{n}", events[:n]) for n in range(1, len(events) + 1)]
    return out


def fill(url: str, runs: int) -> dict[str, RunState]:
    """A store of ``runs`` runs, the fixture prefixes over and over; each run's fold."""
    prefixes = native_prefixes()
    folded = {}
    with open_store(url) as store:
        for i in range(runs):
            name, events = prefixes[i % len(prefixes)]
            run_id = f"{name}-{i}"
            facts = [(e.type, e.payload) for e in events]
            store.append(run_id, make_events(run_id, 0, 0, facts), expected_seq=0, epoch=0)
            folded[run_id] = fold(store.read(run_id))
    return folded


class CountingStore(SQLiteStore):
    """A SQLite store that counts the reads of logs made through it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reads = 0

    def read(self, run_id: str, after_seq: int = 0, upto: int | None = None
             ) -> Iterator[Event]:
        self.reads += 1
        return super().read(run_id, after_seq, upto)


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def listed(*args: str) -> tuple[Any, str]:
    """A command's --json output, and its stderr."""
    result = invoke(*args, "--json")
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return json.loads(result.stdout), result.stderr


def what_a_fold_says(state: RunState) -> dict[str, Any]:
    """The fields of a `runs` row a run's folded state gives."""
    return {"status": state.status, "events": state.last_seq,
            "uncertain": len(state.pending), "approvals": len(state.approvals),
            "agent": state.agent, "versions": list(state.versions),
            "pause_reason": state.pause_reason, "turns": state.turns,
            "input_tokens": state.usage.input_tokens,
            "output_tokens": state.usage.output_tokens,
            "cached_input_tokens": state.usage.cached_input_tokens,
            "cost_usd": run_cost(state), "unpriced_turns": state.unpriced_turns}


def assert_listings_equal_the_folds(url: str, folded: dict[str, RunState]) -> str:
    """`runs`, `approvals` and `uncertain` (--json) say what each fold says; their stderr."""
    rows, said = listed("runs", "--all", "--store", url)
    assert {r["run_id"]: {k: r[k] for k in what_a_fold_says(RunState())} for r in rows} == {
        run_id: what_a_fold_says(st) for run_id, st in folded.items()}
    approvals, said_too = listed("approvals", "--store", url)
    assert sorted((r["run_id"], r["approval_id"]) for r in approvals) == sorted(
        (run_id, a) for run_id, st in folded.items() for a in st.approvals)
    calls, said_again = listed("uncertain", "--store", url)
    assert sorted((r["run_id"], r["key"], r["run_status"]) for r in calls) == sorted(
        (run_id, p.key, st.status) for run_id, st in folded.items()
        for p in st.pending.values())
    return said + said_too + said_again


def counts_of(folded: dict[str, RunState]) -> dict[str, Any]:
    """What prometheus.store_counts says of these folds."""
    states = folded.values()
    return {"runs": dict(Counter(st.status for st in states)),
            "uncertain": dict(Counter(p.effect for st in states for p in st.pending.values())),
            "approvals": sum(len(st.approvals) for st in states),
            "escalations": sum(st.waits_for_a_person for st in states),
            "events": sum(st.last_seq for st in states), "unreadable": 0}


def test_the_runs_cover_every_status_a_native_run_records() -> None:
    statuses = {fold(events).status for _, events in native_prefixes()}
    assert statuses == set(get_args(Status)) - {"new"}  # (new: before run_started)


def test_runs_on_2000_runs_read_no_log_and_say_what_each_fold_says(tmp_path: Path) -> None:
    path = tmp_path / "r.db"
    url = f"sqlite:///{path}?durability=batched"
    folded = fill(url, RUNS)
    assert invoke("runs", "--store", url).exit_code == 0  # (the table, too)
    assert assert_listings_equal_the_folds(url, folded) == ""  # (no advice: projected)
    with CountingStore(path, readonly=True) as store:
        listing = newest_runs(store, None, None)
        assert len(listing.rows) == RUNS and not listing.errors
        paused = newest_runs(store, "paused", 5)
        assert [r["status"] for r in paused.rows] == ["paused"] * 5 and paused.more
        states, errors = outlines_of(store, attention=True)  # approvals, uncertain
        assert set(states) == {r for r, st in folded.items()
                               if st.approvals or st.pending or st.status == "escalated"}
        assert not errors
        assert store_counts(store) == counts_of(folded)  # (the metrics' gauges)
        assert store.reads == 0


@pytest.mark.parametrize("store_url", BACKENDS, indirect=True)
def test_the_listings_say_what_each_fold_says_on_every_backend(store_url: str) -> None:
    folded = fill(store_url, len(native_prefixes()))
    assert_listings_equal_the_folds(store_url, folded)


@pytest.fixture
def old_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Any]]:
    """A SQLite store a release from before outlines wrote, and its runs' folds."""
    url = f"sqlite:///{tmp_path / 'old.db'}?durability=batched"
    with monkeypatch.context() as m:
        m.setattr(sqlite_module, "MIGRATIONS",
                  sqlite_module.MIGRATIONS[:sqlite_module._OUTLINES - 1])
        folded = fill(url, 60)
    yield url, folded


def test_an_older_store_is_read_by_folding_and_the_advice_is_said_once(
        old_store: tuple[str, dict[str, RunState]]) -> None:
    url, folded = old_store
    with CountingStore(url.split("///")[1].split("?")[0], readonly=True) as store:
        assert not store.projected
        newest_runs(store, None, None)
        assert store.reads == len(folded)  # (each log folded: the counter counts)
    result = invoke("runs", "--store", url)
    assert result.exit_code == 0
    assert result.stderr.count("agentjournal reindex") == 1
    said = assert_listings_equal_the_folds(url, folded)  # --json: stdout stays JSON
    assert said.count("keeps no run outlines yet") == 3  # once for each command
    assert invoke("reindex", "--store", url).exit_code == 0
    assert assert_listings_equal_the_folds(url, folded) == ""


def test_the_metrics_count_a_run_whose_log_cannot_be_read_as_unreadable(
        old_store: tuple[str, dict[str, RunState]]) -> None:
    url, folded = old_store
    path, run_id = url.split("///")[1].split("?")[0], next(iter(folded))
    with sqlite3.connect(path) as db:  # one event of one run edited by hand: damage
        db.execute("UPDATE events SET body = CAST(replace(CAST(body AS TEXT), 'task', 'TASK')"
                   " AS BLOB) WHERE key = (SELECT (run_no << 32) + 1 FROM run_numbers"
                   " WHERE run_id = ?)", (run_id,))
    damaged = folded.pop(run_id)
    expected = counts_of(folded)
    expected["events"] += damaged.last_seq  # (its events are stored all the same)
    with open_store(url, readonly=True) as store:
        assert store_counts(store) == {**expected, "unreadable": 1}
