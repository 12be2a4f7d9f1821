"""A writer for the projection crash test: copies the v8 fixture logs into a store as new
runs, in batches of random sizes from several threads at once (so appends meet in group
commits), continuing each run where its log ends. Killed at random by the test; run to
the end it exits 0.

    python -m tests.projection_writer STORE_URL SEED
"""

from __future__ import annotations

import random
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from agentjournal import decode, open_store
from agentjournal.events import make_events
from agentjournal.store import Store

FIXTURES = sorted((Path(__file__).parent / "fixtures" / "v8").glob("*.events.jsonl"))
THREADS = 4


def logs() -> dict[str, list[tuple[object, dict[str, object]]]]:
    """Run id -> the facts of its log: every v8 fixture, twice."""
    out = {}
    for copy in (1, 2):
        for path in FIXTURES:
            events = [decode(line) for line in path.read_bytes().splitlines()]
            out[f"{path.name.split('.')[0]}-{copy}"] = [(e.type, e.payload) for e in events]
    return out


def write(store: Store, runs: dict[str, list[tuple[object, dict[str, object]]]],
          rng: random.Random) -> None:
    pending = {run_id: at for run_id in runs
               if (at := store.last_seq(run_id)) < len(runs[run_id])}
    while pending:
        run_id = rng.choice(sorted(pending))
        at, facts = pending[run_id], runs[run_id]
        batch = facts[at:at + rng.randint(1, 5)]
        store.append(run_id, make_events(run_id, at, 0, batch),  # type: ignore[arg-type]
                     expected_seq=at, epoch=0)
        pending[run_id] = at + len(batch)
        if pending[run_id] == len(facts):
            del pending[run_id]


def main(url: str, seed: int) -> None:
    store = open_store(url)
    runs = sorted(logs().items())
    parts = [dict(runs[i::THREADS]) for i in range(THREADS)]
    with ThreadPoolExecutor(THREADS) as pool:  # (a thread's error fails the process)
        for done in [pool.submit(write, store, part, random.Random(seed + i))
                     for i, part in enumerate(parts)]:
            done.result()
    store.close()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
