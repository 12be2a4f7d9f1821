"""The benchmark command's shape, not its speed: benchmarks are a command, never timed tests.

One run of every section at its smallest sizes (SMOKE: one round) is shared by the tests
that read its output; they check what was measured, never how fast.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
from click.testing import CliRunner

from agentjournal.bench import bench
from agentjournal.bench._common import SMOKE, Figure, figure
from agentjournal.bench.command import document, print_targets, run_bench, write_plot
from agentjournal.bench.fleet import TAKEOVER_TTL
from agentjournal.bench.peers import resume_peer_figures, step_peer_figures
from agentjournal.bench.targets import targets

from .conftest import POSTGRES_URL, postgres_reason

# A hang guard, not a speed limit: whichever test comes first runs the shared SMOKE run,
# which on a machine loaded by others takes minutes.
pytestmark = pytest.mark.timeout(900)

# Families whose every measured figure stands beside a floor, and those that are
# ratios between sizes or plain costs (no physical floor applies).
WITH_FLOOR = {"append", "tool_call", "replay", "recovery", "snapshot_write", "storage",
              "cpu_per_event", "chain", "parallel_turn", "model_step", "fleet",
              "claim", "step", "group_commit", "saga", "workspace", "gc", "temporal",
              "takeover", "ui", "langgraph", "pydantic_ai",
              "openai_agents", "agent_step", "check", "reindex"}
WITHOUT_FLOOR = {"recovery_growth", "storage_growth", "agent_step_growth",
                 "model_call", "snapshot_bytes", "snapshot_bytes_growth", "snapshot_next",
                 "group_commit_ceiling"}


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> list[Figure]:
    """Every section once, at SMOKE sizes (a hang guard of 15 minutes: a loaded machine)."""
    tmp = tmp_path_factory.mktemp("bench")
    return run_bench(quick=True, postgres_url=POSTGRES_URL, workdir=tmp, plan=SMOKE,
                     progress=lambda _: None)


@pytest.fixture(scope="module")
def doc(smoke: list[Figure]) -> dict[str, Any]:
    """The document ``--json`` prints for those figures, as JSON gives it back."""
    parsed: dict[str, Any] = json.loads(msgspec.json.encode(document(smoke, quick=True,
                                                                     peers=False)))
    return parsed


def family(name: str) -> str:
    return name.split(".", 1)[0]


def test_the_document_has_machine_and_mode(doc: dict[str, Any]) -> None:
    assert doc["quick"] is True
    assert {"python", "platform", "cpu_count"} <= doc["machine"].keys()


def test_every_family_is_reported(doc: dict[str, Any]) -> None:
    assert {family(f["name"]) for f in doc["figures"]} == WITH_FLOOR | WITHOUT_FLOOR


def test_each_figure_has_value_unit_floor_and_ratio(doc: dict[str, Any]) -> None:
    for f in doc["figures"]:
        assert {"name", "value", "unit", "floor", "floor_name", "ratio", "note"} <= f.keys(), f
        assert f["unit"], f


def test_floors_are_present_where_they_apply_and_ratios_positive(doc: dict[str, Any]) -> None:
    for f in doc["figures"]:
        if f["value"] is None:  # skipped: the note says why
            assert f["note"].startswith("skipped:"), f
            continue
        assert f["value"] > 0, f
        if family(f["name"]) in WITH_FLOOR:
            assert f["floor"] is not None and f["floor"] > 0 and f["floor_name"], f
            assert f["ratio"] is not None and f["ratio"] > 0, f
        elif f["name"].split(".")[0].endswith("_growth"):
            assert f["unit"] == "x" and f["floor"] is None, f


def test_each_backend_and_size_is_covered(doc: dict[str, Any]) -> None:
    names = {f["name"] for f in doc["figures"]}
    for backend in ("jsonl", "sqlite", "postgres"):
        assert {f"append.{backend}", f"tool_call.{backend}"} <= names
    for n in SMOKE.sizes:
        assert {f"replay.gc_off.{n}", f"replay.vs_kept.{n}", f"replay.gc_on.{n}"} <= names
        for backend in ("sqlite", "jsonl"):
            assert {f"recovery.{backend}.snapshots.{n}", f"recovery.{backend}.full.{n}",
                    f"snapshot_write.{backend}.{n}", f"snapshot_bytes.{backend}.{n}",
                    f"snapshot_next.{backend}.{n}"} <= names
    for steps in SMOKE.steps:
        for backend in ("sqlite", "jsonl", "postgres"):
            assert {f"storage.{backend}.step.{steps}",
                    f"storage.{backend}+snapshots.step.{steps}"} <= names
        assert {f"storage.sqlite.event.{steps}", f"storage.jsonl.event.{steps}"} <= names
    small, large = SMOKE.agent_steps
    assert {f"agent_step.scripted.{small}", f"agent_step.scripted.{large}",
            "agent_step_growth.scripted", f"step.sqlite.{small}", f"step.sqlite.{large}"} <= names


def test_langgraph_is_measured_beside_its_own_savers(doc: dict[str, Any]) -> None:
    pytest.importorskip("langgraph.checkpoint.sqlite")
    figures = {f["name"]: f for f in doc["figures"] if f["name"].startswith("langgraph.")}
    assert {"langgraph.bytes_per_step.sqlite.40", "langgraph.bytes_per_step.postgres.40",
            "langgraph.growth.journal.40", "langgraph.growth.sqlitesaver.40",
            "langgraph.step_sync.sqlite.40", "langgraph.resume.100"} <= figures.keys()
    assert "SqliteSaver" in figures["langgraph.bytes_per_step.sqlite.40"]["floor_name"]
    assert "PostgresSaver" in figures["langgraph.bytes_per_step.postgres.40"]["floor_name"]


def test_the_openai_agents_sdk_is_measured_beside_its_own_runner_and_session(
        doc: dict[str, Any]) -> None:
    by_name = {f["name"]: f for f in doc["figures"]}
    runner = by_name["openai_agents.turn.journal_runner"]
    session = by_name["openai_agents.turn.journal_session"]
    assert runner["floor_name"] == "the SDK's Runner, no session"
    assert session["floor_name"] == "the SDK's SQLiteSession (a file)"
    assert all(f["unit"] == "ms/turn" and f["ratio"] > 0 for f in (runner, session))


def test_the_chain_is_costed_against_plain_encode_and_decode(doc: dict[str, Any]) -> None:
    chain = {f["name"]: f for f in doc["figures"] if family(f["name"]) == "chain"}
    assert set(chain) == {"chain.seal", "chain.check"}
    assert chain["chain.seal"]["floor_name"].startswith("encode")
    assert chain["chain.check"]["floor_name"].startswith("decode")
    for f in chain.values():
        assert f["unit"] == "µs/event" and f["ratio"] > 0, f


def test_postgres_is_measured_when_reachable(doc: dict[str, Any]) -> None:
    append = next(f for f in doc["figures"] if f["name"] == "append.postgres")
    if postgres_reason() is None:  # under CI=true an unreachable server fails here
        assert append["value"] is not None, append
    else:
        assert append["value"] is None and "skipped" in append["note"]


def test_plot_is_a_png(smoke: list[Figure], tmp_path: Path) -> None:
    # matplotlib comes with the dev install (the plot extra), so the plot is always drawn here.
    write_plot(smoke, tmp_path / "recovery.png")
    assert (tmp_path / "recovery.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_takeover_is_measured_against_ttl_plus_a_second(doc: dict[str, Any]) -> None:
    """What a takeover measured: runs a killed worker held, continued by a successor,
    beside the lease TTL; the target bounds p99 by TTL + 1 s (met or not: speed is the
    bench's to judge, not a test's)."""
    figures = {f["name"]: f for f in doc["figures"]}
    (target,) = [t for t in doc["targets"] if t["name"] == "takeover.p99"]
    if postgres_reason() is not None:
        assert figures["takeover.p99"]["value"] is None and target["met"] is None
        return
    p50, p99 = figures["takeover.p50"], figures["takeover.p99"]
    assert p50["floor"] == p99["floor"] == TAKEOVER_TTL and p99["unit"] == "s"
    assert "SIGKILLed" in p99["note"]
    assert 0 < p50["value"] <= p99["value"]
    assert (target["limit"], target["on"], target["direction"]) == (TAKEOVER_TTL + 1, "value",
                                                                   "max")
    assert target["ratio"] == pytest.approx(p99["value"] / TAKEOVER_TTL)


def test_plot_without_matplotlib_fails_before_measuring(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes the import fail
    result = CliRunner().invoke(bench, ["--quick", "--plot", str(tmp_path / "p.png")])
    assert result.exit_code == 1
    assert result.stderr.strip() == ("error: --plot needs matplotlib: "
                                     "pip install 'agentjournal[plot]'")
    assert result.stdout == ""


STEP_TARGETS = {f"step_us.sqlite.{n}" for n in SMOKE.agent_steps}
TARGETS = {"cpu_per_event.jsonl",
           "cpu_per_event.sqlite", "resume_growth.sqlite", "resume_growth.jsonl",
           "resume_growth.postgres", "resume_vs_langgraph.10k", "bytes_per_step.sqlite",
           "bytes_per_step.jsonl", "bytes_per_step.postgres", "bytes_per_step_growth.sqlite",
           "bytes_per_step_growth.jsonl", "bytes_per_step_growth.postgres", "postgres_append",
           "replay.1000", "replay.10000",
           "group_commit.sqlite", "saga.sqlite", "saga.jsonl", "saga.postgres",
           "takeover.p99", "ui.runs_page_cold", "ui.run_page_cold", "ui.needs_person_cold",
           "ui.time_travel_cold", "ui.call_page_cold", "ui.tail",
           "agent_step.fixed_model.2000", "density.sqlite.1000", "density.postgres.1000",
           "density.commits_per_step", "langgraph.get_tuple", "langgraph.list",
           "reindex.sqlite", "reindex.jsonl"}


def test_every_target_has_value_floor_ratio_and_met(doc: dict[str, Any]) -> None:
    by_name = {t["name"]: t for t in doc["targets"]}
    replays = {f"replay.{n}" for n in SMOKE.sizes}
    assert set(by_name) == TARGETS - {"replay.1000", "replay.10000"} | replays | STEP_TARGETS
    for t in doc["targets"]:
        assert {"value", "floor", "ratio", "limit", "direction", "met", "note"} <= t.keys(), t
        assert t["direction"] in ("max", "min") and t["limit"] > 0, t
        if t["met"] is None:  # not measured: the note says why
            assert t["value"] is None and t["note"], t
        else:
            bounded = t["ratio"] if t["on"] == "ratio" else t["value"]
            assert t["met"] == (bounded <= t["limit"] if t["direction"] == "max"
                                else bounded >= t["limit"]), t
    # Without --peers the peer comparison says how to get it.
    assert by_name["resume_vs_langgraph.10k"]["note"] == "measured only with --peers"


def test_peers_run_the_same_workload_beside_the_floor(tmp_path: Path) -> None:
    figures = [*step_peer_figures(tmp_path, (5,), lambda _: None),
               *resume_peer_figures(tmp_path, lambda _: None, sizes=(20,))]
    by_name = {f.name: f for f in figures}
    assert set(by_name) == {"peers.step.agentjournal.5", "peers.step.langgraph.5",
                            "peers.step.eventsourcing.5", "peers.resume.agentjournal.20",
                            "peers.resume.langgraph.20"}
    for f in figures:
        assert f.value is not None and f.value > 0 and f.floor is not None and f.floor > 0, f


def test_peers_without_the_extra_fail_before_measuring(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "eventsourcing.domain", None)  # makes the import fail
    result = CliRunner().invoke(bench, ["--quick", "--peers"])
    assert result.exit_code == 1
    assert result.stderr.strip() == "error: --peers needs the peers extra: " \
        "pip install 'agentjournal[peers]'"


def test_only_runs_the_sections_named(tmp_path: Path) -> None:
    args = ["--quick", "--rounds", "1", "--json", "--only", "cpu,group-commit",
            "--store-dir", str(tmp_path), "--postgres", POSTGRES_URL]
    result = CliRunner().invoke(bench, args, catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert {family(f["name"]) for f in doc["figures"]} == {"cpu_per_event", "group_commit",
                                                           "group_commit_ceiling"}
    by_name = {t["name"]: t for t in doc["targets"]}
    # Every target, those of the other sections not measured (replay's are one per size
    # measured: none here; the synced step's, those of the default sizes).
    assert set(by_name) == TARGETS - {"replay.1000", "replay.10000"} | {
        "step_us.sqlite.200", "step_us.sqlite.2000"}
    measured = {name for name, t in by_name.items() if t["met"] is not None}
    assert measured == {"cpu_per_event.jsonl", "cpu_per_event.sqlite", "group_commit.sqlite"}


def test_only_refuses_a_section_it_does_not_have() -> None:
    from agentjournal.cli import cli

    result = CliRunner().invoke(cli, ["bench", "--only", "cpu,nope"])
    assert result.exit_code == 1 and result.stdout == ""
    assert "no section 'nope'; choose from appends, log," in result.stderr


def test_help_shows_an_example() -> None:
    result = CliRunner().invoke(bench, ["--help"])
    assert result.exit_code == 0
    assert "agentjournal bench --quick" in result.stdout


def test_ci_refuses_to_skip_postgres(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CI", "true")
    result = CliRunner().invoke(bench, ["--quick", "--postgres", "", "--store-dir", str(tmp_path)])
    assert result.exit_code == 1
    assert result.stderr.startswith("error: CI=true, so Postgres must be measured")


def test_targets_piped_keep_each_name_on_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    results = targets([], peers=False)  # every target, unmeasured, with its note
    print_targets(results)
    out = capsys.readouterr().out
    assert all(f"│ {t.name} " in out for t in results), out


def test_a_missed_target_names_the_ceiling_the_run_measured_below_it() -> None:
    def replay_and_group(kept: float, one_thread: float) -> dict[str, str]:
        figures = [figure("replay.gc_off.10000", 200_000, "events/s", 500_000, "decode"),
                   figure("replay.vs_kept.10000", 200_000, "events/s", kept, "kept"),
                   figure("group_commit.sqlite", 10_000, "events/s", 3_000, "commits"),
                   figure("group_commit_ceiling.sqlite", one_thread, "events/s")]
        return {t.name: t.note for t in targets(figures, peers=False)
                if t.name in ("replay.10000", "group_commit.sqlite")}

    below = replay_and_group(kept=215_000, one_thread=12_000)
    assert below["replay.10000"].endswith(
        "; out of reach here: decoding into a kept list alone is 0.43x")
    assert below["group_commit.sqlite"].endswith(
        "; out of reach here: one thread, syncing off, makes the same appends at 12,000/s")
    # A ceiling above the limit says nothing: the target may yet be met here.
    above = replay_and_group(kept=400_000, one_thread=30_000)
    assert "out of reach" not in above["replay.10000"] + above["group_commit.sqlite"]


def test_json_on_stdout_is_the_document_alone_even_from_subprocesses(tmp_path: Path) -> None:
    """The models section starts the stub server as a process of its own: whatever it
    prints must not land in the JSON on stdout (a real process: CliRunner sees only
    this one's output)."""
    import subprocess

    done = subprocess.run([sys.executable, "-m", "agentjournal", "bench", "--quick", "--rounds",
                           "1", "--only", "models", "--json", "--store-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert {family(f["name"]) for f in doc["figures"]} == {"parallel_turn", "model_step",
                                                           "model_call"}
