from __future__ import annotations

from pathlib import Path

import pytest

from agentjournal import Agent, ScriptedModel, calls, open_store, reply, tool
from agentjournal.planner import measure, plan


def test_reproduces_the_seeds_worked_example() -> None:
    # 4,000 events, 2 ms per event, six recoveries, a snapshot every 500 at 120 ms.
    p = plan(4000, 2.0, 120.0, 6, objective_ms=1000, interval=500)
    assert p.full_replay_ms_per_recovery == pytest.approx(4000)  # 4.00 s
    assert p.full_replay_ms_per_run == pytest.approx(24000)  # 24.00 s
    assert (p.snapshot_writes, p.snapshot_write_ms_per_run) == (8, pytest.approx(960))
    assert p.tail_replay_ms_per_recovery == pytest.approx(500)  # 0.50 s
    assert p.with_snapshots_ms_per_run == pytest.approx(3960)  # 3.96 s
    assert p.net_saving_ms_per_run == pytest.approx(20040)  # 20.04 s
    assert p.saving_ms_per_recovery == pytest.approx(3500)  # 3.5 s
    assert p.break_even_recoveries == pytest.approx(0.274, abs=0.001)  # ~0.27
    assert "= 20.04 s" in "\n".join(p.arithmetic)
    assert "= 0.27 recoveries per run" in "\n".join(p.arithmetic)


def test_the_objective_bounds_the_interval() -> None:
    # "At 2 ms per event, a 300 ms replay budget permits at most 150 tail events."
    p = plan(4000, 2.0, 120.0, 6, objective_ms=300)
    assert p.max_tail_events == 150
    assert p.interval == 151 and p.meets_objective
    assert not plan(4000, 2.0, 120.0, 6, objective_ms=300, interval=500).meets_objective


def test_without_a_binding_objective_the_cheapest_interval_wins() -> None:
    p = plan(4000, 2.0, 120.0, 6, objective_ms=10_000)
    assert p.interval == 283  # sqrt(2 * 4000 * 120 / (6 * 2))
    cost = [plan(4000, 2.0, 120.0, 6, 10_000, k).with_snapshots_ms_per_run
            for k in (150, 283, 600)]
    assert cost[1] < cost[0] and cost[1] < cost[2]


def test_measures_on_a_real_store(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'j.db'}")

    @tool(effect="read_only")
    def noop(i: int) -> int:
        return i

    model = ScriptedModel([calls(("noop", {"i": i})) for i in range(30)] + [reply("ok")])
    Agent(model, [noop], snapshot_every=None).run(store, "r1", "go")
    m = measure(store, "r1")
    assert m.events == store.last_seq("r1") and m.replay_ms_per_event > 0 and m.snapshot_ms > 0
    assert store.snapshots("r1")[0].seq == m.events


def test_plan_snapshots_command(tmp_path: Path) -> None:
    import json

    from click.testing import CliRunner

    from agentjournal.cli import cli

    runner = CliRunner()
    args = ["plan-snapshots", "--events", "4000", "--replay-ms", "2", "--snapshot-ms", "120",
            "--recoveries", "6", "--objective-ms", "1000", "--interval", "500"]
    done = runner.invoke(cli, [*args, "--json"])
    assert done.exit_code == 0, done.output
    assert json.loads(done.output)["net_saving_ms_per_run"] == pytest.approx(20040)
    text = runner.invoke(cli, args)
    assert "= 20.04 s" in text.output and "every 500 events" in text.output
    empty = runner.invoke(cli, ["plan-snapshots", "--store", f"sqlite:///{tmp_path / 'x.db'}"])
    assert empty.exit_code == 2 and "no store at" in empty.output
