"""Many runs on one event loop: appends never block it, and concurrent runs' appends are
committed together, each checked on its own (issue 31)."""

from __future__ import annotations

import asyncio
import gc
import threading
from pathlib import Path

import pytest

from agentjournal import open_store
from agentjournal.bench.density import density_agent, run_many
from agentjournal.errors import ConflictError, FencedError
from agentjournal.events import EventType, make_events
from agentjournal.store import Store

from .conftest import backend_params

RUNS = 300
PROBE_EVERY = 0.010
LATE = 0.050


def queued_seconds() -> float:
    """Seconds this thread has waited for a CPU, runnable, since it started (Linux
    schedstat; 0 where there is none): time the machine's other work took, not ours."""
    stat = Path(f"/proc/self/task/{threading.get_native_id()}/schedstat")
    try:
        return int(stat.read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


class Probe:
    """A task that asks to wake every 10 ms and records how late each wake was, against
    the time it asked for (its own schedule), less the time the loop's thread waited
    for a CPU meanwhile (a machine loaded by others delays any process; that is not the
    loop being blocked): what a loop blocked by an append shows."""

    def __init__(self) -> None:
        self.lateness: list[float] = []

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due, queued = loop.time() + PROBE_EVERY, queued_seconds()
            await asyncio.sleep(PROBE_EVERY)
            self.lateness.append(loop.time() - due - (queued_seconds() - queued))


@backend_params()
def test_arun_never_blocks_the_loop_while_300_runs_append(store_url: str) -> None:
    store = open_store(store_url)
    probe = Probe()
    # The cyclic collector stops every thread of any Python process (a collection of
    # 300 runs' objects takes tens of ms): off, so what is measured is the store.
    gc.collect()
    gc.disable()
    try:
        # A short model wait, so the runs' answers come together and their appends meet.
        statuses = asyncio.run(run_many(density_agent(0.02, 2), store, RUNS, "probe",
                                        probe.run))
        gc.enable()
        assert statuses == ["finished"] * RUNS
        runs = store.list_runs(limit=None)
        assert len(runs) == RUNS
        # Every run: started + task, (turn, start, completion), final turn + finished.
        assert {len(list(store.read(r.run_id))) for r in runs[:20]} == {7}
    finally:
        gc.enable()
        store.close()
    worst = max(probe.lateness)
    print(f"\nprobe: {len(probe.lateness)} wakes, lateness median "
          f"{sorted(probe.lateness)[len(probe.lateness) // 2] * 1e3:.1f} ms, "
          f"worst {worst * 1e3:.1f} ms")
    assert len(probe.lateness) > 10
    assert worst <= LATE, f"the loop was blocked {worst * 1e3:.0f} ms"
