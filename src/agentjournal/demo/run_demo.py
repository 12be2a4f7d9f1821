"""``agentjournal demo``: the quarterly reconciliation, killed and resumed, end to end.

Everything is real. The ledger service is its own process with its own SQLite
file; the agent runs in a child process (``python -m agentjournal.demo.reconcile``)
that is killed with SIGKILL in the chosen window, or at a seeded random moment;
a new child process resumes it from the journal. The verdict comes from the
receiver's own count of applied effects, never from the journal.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal, get_args

import msgspec

from ..events import Event, EventType
from ..faults import ENV_VAR as FAULT_ENV
from ..state import RunState, fold
from ..store import Store, open_store
from .ledger import LedgerService
from .reconcile import LEDGERS, correction_id

E = EventType
KillAt = Literal["model", "tool", "after-effect", "random"]
KILL_AT: tuple[str, ...] = get_args(KillAt)
RUN_ID = "q3-reconciliation"

#: The fault armed in the child per window. The three ledger reads are tool calls
#: 1-3, so the 4th tool call is the first correction.
FAULTS: dict[str, str] = {
    "model": "model_call:2",
    "tool": "before_effect:4",
    "after-effect": "after_effect:4",
}
WINDOWS: dict[str, str] = {
    "model": "while the model was thinking",
    "tool": "after the correction's start was recorded, before it was sent",
    "after-effect": "after the ledger applied the correction, before its completion was recorded",
    "random": "at a random moment",
}
VERDICTS: dict[str, str] = {
    "found": "found at the ledger: recorded as done, not posted again",
    "absent": "proven absent at the ledger: posted again with the same key",
    "retry": "retried with the same idempotency key",
    "conflict": "a different correction was found: escalated to a person",
    "unknown": "could not tell: left for a person",
    "unresolved": "still open: a person must decide",
}
#: The scripted model thinks this long per turn, so a random kill has a run to land in.
MODEL_DELAY = "0.01"
CHILD_TIMEOUT = 60.0
MAX_RESUMES = 3


class DemoError(Exception):
    """The demo could not run (a busy directory, a child that crashed on its own)."""


class UncertainCall(msgspec.Struct, frozen=True, kw_only=True):
    """An uncertain call met on resume, and how it was settled."""

    key: str
    tool: str
    args: dict[str, Any]
    verdict: str
    seq: int | None  # the TOOL_CALL_RECONCILED event; None while unresolved


class Step(msgspec.Struct, frozen=True, kw_only=True):
    """One line of the demo's timeline. ``seq`` is None for the kill, which no log records."""

    seq: int | None
    kind: str
    detail: str


class DemoResult(msgspec.Struct, frozen=True, kw_only=True):
    ok: bool  # the run finished and the ledger applied every correction exactly once
    status: str
    kills: int
    effects: dict[str, int]  # correction id -> times the ledger applied it
    tickets: dict[str, int]
    uncertain: list[UncertainCall]
    store: str
    run_id: str
    directory: str
    kill_at: str
    seed: int | None
    killed_after_seq: int | None
    timeline: list[Step]


Progress = Callable[[str], None]


def run_demo(
    directory: Path | None = None,
    *,
    kill_at: KillAt = "after-effect",
    seed: int | None = None,
    progress: Progress | None = None,
) -> DemoResult:
    """Run the reconciliation in ``directory`` (default: a fresh temporary one), kill it
    in the ``kill_at`` window, resume it in a new process, and report what happened."""
    if kill_at not in KILL_AT:
        raise ValueError(f"kill_at must be one of {', '.join(KILL_AT)}, not {kill_at!r}")
    say = progress or (lambda _message: None)
    root = _prepare(directory)
    store_url = f"sqlite:///{root / 'journal.db'}"
    if kill_at == "random" and seed is None:
        seed = random.SystemRandom().randrange(2**31)
    # Created (and migrated) here, before any child opens it.
    store = open_store(store_url)
    try:
        with LedgerService(root / "ledger.db") as ledger:
            say(f"ledger service listening on {ledger.url}")
            cmd = _agent_cmd(store_url, ledger.url)
            say(f"agent running; it will be killed {WINDOWS[kill_at]}")
            if kill_at == "random":
                kills = kill_at_random(cmd, store, random.Random(seed))
            else:
                kills = _kill_in_window(cmd, FAULTS[kill_at])
            killed_after = store.last_seq(RUN_ID) if kills else None
            if kills:
                say(f"killed after seq {killed_after}; resuming in a new process")
                _resume(cmd)
            say("asking the ledger what it applied")
            effects = ledger.effects()
        return _result(store, effects, root=root, kill_at=kill_at, seed=seed, kills=kills,
                       killed_after=killed_after)
    finally:
        store.close()


def _prepare(directory: Path | None) -> Path:
    if directory is None:
        return Path(tempfile.mkdtemp(prefix="agentjournal-demo-")).resolve()
    root = directory.resolve()
    root.mkdir(parents=True, exist_ok=True)
    # A second run would post the same corrections again under a new run's keys.
    used = [name for name in ("journal.db", "ledger.db") if (root / name).exists()]
    if used:
        raise DemoError(f"{root} already holds a demo ({', '.join(used)}); "
                        "give an empty directory, or omit --dir for a fresh one")
    return root


def _agent_cmd(store_url: str, ledger_url: str) -> list[str]:
    return [sys.executable, "-m", "agentjournal.demo.reconcile", "--store", store_url,
            "--run-id", RUN_ID, "--ledger", ledger_url, "--mode", "lookup",
            "--model-delay", MODEL_DELAY]


def _child_env(fault: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != FAULT_ENV}
    if fault:
        env[FAULT_ENV] = fault
    # The child must import this same package, installed or not.
    src = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    return env


def _check_exit(code: int, stdout: str, stderr: str) -> None:
    """Accept a clean exit or our SIGKILL; anything else is the child's own failure."""
    if code in (0, -signal.SIGKILL):
        return
    try:
        detail = json.loads(stdout)["message"]
    except (ValueError, KeyError, TypeError):
        detail = (stderr.strip().splitlines() or ["no output"])[-1]
    raise DemoError(f"the agent process exited with {code}: {detail}")


def _kill_in_window(cmd: list[str], fault: str) -> int:
    """Run the agent with ``fault`` armed; 1 if it was killed there, 0 if it finished first."""
    done = subprocess.run(cmd, env=_child_env(fault), capture_output=True, text=True,
                          timeout=CHILD_TIMEOUT, check=False)
    _check_exit(done.returncode, done.stdout, done.stderr)
    return int(done.returncode == -signal.SIGKILL)


def kill_at_random(cmd: list[str], store: Store, rng: random.Random) -> int:
    """SIGKILL the agent once the log has grown by a seeded 3-20 events, plus 0-20 ms.

    The extra delay makes the kill land at an arbitrary instruction: mid model
    call, mid tool call, mid append. Returns 0 if the agent finished first.
    """
    grow, delay = rng.randint(3, 20), rng.uniform(0.0, 0.02)
    child = subprocess.Popen(cmd, env=_child_env(None), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + CHILD_TIMEOUT
        while child.poll() is None and store.last_seq(RUN_ID) < grow:
            if time.monotonic() > deadline:
                raise DemoError("the agent made no progress")
            time.sleep(0.001)
        time.sleep(delay)
        killed = child.poll() is None
        if killed:
            child.send_signal(signal.SIGKILL)
        out, err = child.communicate(timeout=CHILD_TIMEOUT)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    _check_exit(child.returncode, out, err)
    return int(killed and child.returncode == -signal.SIGKILL)


def _resume(cmd: list[str]) -> None:
    """Run the same command again, without a fault, until the process ends on its own."""
    for _ in range(MAX_RESUMES):
        done = subprocess.run(cmd, env=_child_env(None), capture_output=True, text=True,
                              timeout=CHILD_TIMEOUT, check=False)
        _check_exit(done.returncode, done.stdout, done.stderr)
        if done.returncode == 0:
            return
    raise DemoError(f"the agent was killed {MAX_RESUMES} times while resuming")


def _result(store: Store, effects: dict[str, Any], *, root: Path, kill_at: str,
            seed: int | None, kills: int, killed_after: int | None) -> DemoResult:
    events = list(store.read(RUN_ID))
    state = fold(events)
    applied: dict[str, int] = dict(effects.get("corrections", {}))
    counts = {**{correction_id(name): 0 for name in LEDGERS}, **applied}
    return DemoResult(
        ok=state.status == "finished" and all(n == 1 for n in counts.values()),
        status=state.status, kills=kills, effects=counts,
        tickets=dict(effects.get("tickets", {})), uncertain=uncertain_calls(events, state),
        store=store.url, run_id=RUN_ID, directory=str(root), kill_at=kill_at, seed=seed,
        killed_after_seq=killed_after, timeline=timeline(events, killed_after, kill_at),
    )


def uncertain_calls(events: Sequence[Event], state: RunState) -> list[UncertainCall]:
    """Every uncertain call the run met, with its verdict, then any still open."""
    args = _started_args(events)
    met = [
        UncertainCall(key=e.payload["key"], tool=e.payload["tool"],
                      args=args.get(e.payload["started_seq"], {}),
                      verdict=e.payload["verdict"], seq=e.seq)
        for e in events if e.type is E.TOOL_CALL_RECONCILED
    ]
    seen = {u.key for u in met}
    still_open = [
        UncertainCall(key=p.key, tool=p.tool, args=p.args, verdict="unresolved", seq=None)
        for p in state.pending.values() if p.key not in seen
    ]
    return met + still_open


def _started_args(events: Sequence[Event]) -> dict[int, dict[str, Any]]:
    return {e.seq: e.payload.get("args", {}) for e in events if e.type is E.TOOL_CALL_STARTED}


def timeline(events: Sequence[Event], killed_after: int | None, kill_at: str) -> list[Step]:
    """The demo's story, read from the journal, with the kill placed where it happened."""
    steps: list[Step] = []
    last = next((e.type.value for e in events if e.seq == killed_after), "nothing recorded")
    kill = Step(seq=None, kind="killed",
                detail=f"SIGKILL after seq {killed_after} ({last}), {WINDOWS[kill_at]}")
    args = _started_args(events)
    for event in events:
        if killed_after is not None and event.seq == killed_after + 1:
            steps.append(kill)
        step = _step(event, args)
        if step is not None:
            steps.append(step)
    if killed_after is not None and killed_after >= len(events):
        steps.append(kill)
    return steps


def _step(event: Event, args: dict[int, dict[str, Any]]) -> Step | None:
    p, seq = event.payload, event.seq
    match event.type:
        case E.RUN_STARTED:
            return Step(seq=seq, kind="started", detail=p.get("task", ""))
        case E.RUN_RESUMED:
            return Step(seq=seq, kind="resumed", detail="a new process replayed the journal")
        case E.TOOL_CALL_RECONCILED:
            verdict = VERDICTS.get(p["verdict"], p["verdict"])
            what = args.get(p["started_seq"], {}).get("correction_id", p["tool"])
            return Step(seq=seq, kind="uncertain",
                        detail=f"{what} (key {p['key'][:12]}): {verdict}")
        case E.TOOL_CALL_COMPLETED if not p.get("is_error") and p.get("idempotency_key"):
            return _completed(seq, p)
        case E.RUN_PAUSED | E.RUN_ESCALATED:
            return Step(seq=seq, kind=event.type.value.removeprefix("run_"),
                        detail=p.get("reason", ""))
        case E.RUN_FINISHED:
            return Step(seq=seq, kind="finished", detail=str(p.get("outcome", "")))
    return None


def _completed(seq: int, p: dict[str, Any]) -> Step | None:
    result = p["result"] if isinstance(p.get("result"), dict) else {}
    how = {"reconciliation": "already applied (found by the lookup)",
           "person": "recorded by a person"}.get(p.get("source", "tool"))
    if p.get("tool") == "post_correction":
        cents = result.get("amount", 0)
        return Step(seq=seq, kind="correction",
                    detail=f"{result.get('correction_id')} {cents / 100:+.2f} on "
                           f"{result.get('ledger')}: {how or 'posted'}")
    if p.get("tool") == "file_ticket":
        return Step(seq=seq, kind="ticket", detail=f"{result.get('ticket_id')}: {how or 'filed'}")
    return None
