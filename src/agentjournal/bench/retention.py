"""12. Retention: gc archiving finished runs, and what the archive costs per event.

Each round a fresh store holds ``RUNS`` finished runs of ``STEPS`` steps, 40 days old
(written, not timed); ``gc`` then archives them all (timed): per run its lease, its
records read and checked, the archive file written, synced and read back, the run
deleted behind a tombstone. The floor, measured in the same rounds: writing each run's
records to a file with fsync, rename and a synced directory, the least a durable
archive can cost. Throughputs, so ratio = ours / floor (higher is better).

Bytes: the archive's (gzip) per event beside the hot store's records per event.
"""

from __future__ import annotations

import itertools
import os
import shutil
import time
from contextlib import closing
from datetime import timedelta
from pathlib import Path

import msgspec

from ..events import EventType, make_events, now
from ..retention import RetentionPolicy, gc
from ..store import open_store
from ._common import Figure, Plan, Say, figure, medians, run_facts, store_url

RUNS, STEPS = 100, 10
BACKENDS = ("sqlite", "jsonl")


def _fill(url: str) -> list[list[bytes]]:
    """``RUNS`` finished runs, 40 days old; their stored records."""
    at = now() - timedelta(days=40)
    with closing(open_store(url)) as store:
        for r in range(RUNS):
            run_id = f"bench-{r:04d}"
            facts = [*itertools.islice(run_facts(run_id), 2 + 3 * STEPS),
                     (EventType.RUN_FINISHED, {"outcome": "done"})]
            events = [msgspec.structs.replace(e, ts=at) for e in
                      make_events(run_id, 0, 0, facts)]
            store.append(run_id, events, expected_seq=0, epoch=0)
        return [store.records(info.run_id) for info in store.list_runs()]


class _Rounds:
    def __init__(self, workdir: Path, backend: str) -> None:
        self.workdir, self.backend, self.round = workdir / f"gc-{backend}", backend, 0
        self.archive_bytes = self.record_bytes = self.events = 0

    def _fresh(self) -> tuple[str, Path, list[list[bytes]]]:
        self.round += 1
        shutil.rmtree(self.workdir, ignore_errors=True)
        self.workdir.mkdir(parents=True)
        url = store_url(self.backend, self.workdir / "store")
        return url, self.workdir / "archive", _fill(url)

    def ours(self) -> float:
        url, archive, logs = self._fresh()
        policy = RetentionPolicy(finished_older_than=timedelta(days=30),
                                 archive=f"file://{archive}")
        with closing(open_store(url)) as store:
            start = time.perf_counter()
            report = gc(store, policy)
            elapsed = time.perf_counter() - start
        if report.archived != RUNS:
            raise RuntimeError(f"gc archived {report.archived} of {RUNS} runs")
        self.archive_bytes, self.events = report.archive_bytes, report.events_archived
        self.record_bytes = sum(len(r) for log in logs for r in log)
        return RUNS / elapsed

    def floor(self) -> float:
        _, archive, logs = self._fresh()
        archive.mkdir()
        start = time.perf_counter()
        for i, log in enumerate(logs):
            path = archive / f"{i}.jsonl"
            with open(path.with_suffix(".tmp"), "wb") as f:
                f.write(b"\n".join(log) + b"\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(path.with_suffix(".tmp"), path)
            fd = os.open(archive, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
        return RUNS / (time.perf_counter() - start)


def retention_figures(workdir: Path, plan: Plan, say: Say) -> list[Figure]:
    found: list[Figure] = []
    for backend in BACKENDS:
        say(f"gc: archive {RUNS} finished runs of {STEPS} steps ({backend}), x {plan.reps}")
        rounds = _Rounds(workdir, backend)
        ours, floor = medians(plan.reps, [rounds.ours, rounds.floor])
        found += [
            figure(f"gc.archive.{backend}", ours, "runs/s", floor,
                   "each run's records written to a file, fsync + rename + synced directory",
                   f"{RUNS} runs of {STEPS} steps ({rounds.events // RUNS} events); lease, "
                   "check, write, read back, delete behind a tombstone"),
            figure(f"gc.archive_bytes_per_event.{backend}", rounds.archive_bytes / rounds.events,
                   "B/event", rounds.record_bytes / rounds.events,
                   "the hot store's records per event", "gzip of the records, header included"),
        ]
        shutil.rmtree(rounds.workdir, ignore_errors=True)
    return found
