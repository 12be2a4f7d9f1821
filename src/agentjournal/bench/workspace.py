"""11. Workspace checkpoints: a turn that changed 3 files of a 1,000-file workspace.

Ours: ``Workspace.checkpoint`` into its shadow store (guards, add, write-tree, commit-tree,
update-ref, the changed paths). Floor: the same 3-file change committed by plain git in
an ordinary repository of the same 1,000 files (``git add -A`` + ``git commit``),
measured in the same rounds. Both should cost what 3 files cost, not what 1,000 do.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from ..workspace import Workspace
from ._common import Figure, Plan, Say, figure, medians

FILES, CHANGED = 1_000, 3
_ENV = {"GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "bench@localhost",
        "GIT_COMMITTER_NAME": "bench", "GIT_COMMITTER_EMAIL": "bench@localhost",
        "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}


def _fill(root: Path) -> None:
    root.mkdir(parents=True)
    for i in range(FILES):
        sub = root / f"dir{i % 20:02d}"
        sub.mkdir(exist_ok=True)
        (sub / f"file{i:04d}.txt").write_text(f"line of file {i}\n" * 20)


def _touch(root: Path, round_: int) -> None:
    for i in range(CHANGED):
        path = root / f"dir{i:02d}" / f"file{i:04d}.txt"
        path.write_text(f"round {round_}\n" + path.read_text())


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=root, check=True, capture_output=True,
                   env={**{k: v for k, v in os.environ.items() if not k.startswith("GIT_")},
                        **_ENV})


class _Rounds:
    def __init__(self, workdir: Path) -> None:
        self.ours, self.plain = workdir / "ws-ours", workdir / "ws-plain"
        for root in (self.ours, self.plain):
            shutil.rmtree(root, ignore_errors=True)
            _fill(root)
        self.ws = Workspace(self.ours, shadow=workdir / "ws-shadow.git")
        self.ws.checkpoint("bench", "start")
        _git(self.plain, "init", "-q")
        _git(self.plain, "add", "-A")
        _git(self.plain, "commit", "-qm", "start")
        self.round = 0

    def ours_ms(self) -> float:
        self.round += 1
        _touch(self.ours, self.round)
        start = time.perf_counter()
        made = self.ws.checkpoint("bench", f"round {self.round}")
        elapsed = time.perf_counter() - start
        if made.count != CHANGED:
            raise RuntimeError(f"the checkpoint saw {made.count} changed files")
        return elapsed * 1e3

    def plain_ms(self) -> float:
        _touch(self.plain, self.round + 1000)
        start = time.perf_counter()
        _git(self.plain, "add", "-A")
        _git(self.plain, "commit", "-qm", "round")
        return (time.perf_counter() - start) * 1e3


def workspace_figures(workdir: Path, plan: Plan, say: Say) -> list[Figure]:
    if shutil.which("git") is None:
        return [figure("workspace.checkpoint", None, "ms/turn", note="skipped: no git")]
    reps = max(plan.reps, 5)
    say(f"workspace: a checkpoint of {CHANGED} changed files in {FILES:,}, x {reps}")
    rounds = _Rounds(workdir)
    ours, floor = medians(reps, [rounds.ours_ms, rounds.plain_ms])
    return [figure("workspace.checkpoint", ours, "ms/turn", floor,
                   "git add -A + git commit of the same change, ordinary repository",
                   f"{CHANGED} of {FILES:,} files changed; shadow store, guards on")]
