"""Named fault points, for crash tests that kill a real process at a chosen instant.

The loop calls ``fault_point(name)`` at each dangerous window. Normally it does
nothing. With ``AGENTJOURNAL_FAULT=name[:n[:action]]`` in the environment, the
n-th time (default the first) the process sends itself SIGKILL there (no
cleanup, no flush, no atexit, exactly like an eviction) or, with action
``stop``, SIGSTOP: a worker frozen mid-call, as in a long GC pause, that a test
can wake with SIGCONT after its lease was taken over.

Points: ``model_call`` (while waiting for the model), ``turn_staged`` (the
model answered with calls; its turn is folded but not yet durable: it is stored
with the calls' starts), ``before_effect`` (the
start is durable, the tool has not run), ``lease_checked`` (a tool with an
effect: the lease was just found valid, the request has not left: the window
only a receiver that checks the epoch can close), ``after_effect`` (the tool
returned, its completion is not yet durable); ``before_undo`` and ``after_undo``,
the same two windows for a saga's compensation; ``before_checkpoint`` (a workspace
run: the turn's calls returned and changed the files, their results and the workspace
version are not yet durable); ``gc_archived`` (gc wrote and verified a run's archive
file, the run is not yet deleted) and ``gc_deleted`` (deleted, its lease not released).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

ENV_VAR = "AGENTJOURNAL_FAULT"
POINTS = ("model_call", "turn_staged", "model_started", "before_effect", "lease_checked",
          "after_effect", "before_undo", "after_undo", "before_checkpoint", "gc_archived",
          "gc_deleted")

_armed: tuple[str, int, signal.Signals] | None = None
_ACTIONS = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP}
_seen: dict[str, int] = {}


def arm(spec: str | None) -> None:
    """Arm ``"name[:n]"`` (or disarm with None). Read from the environment at import."""
    global _armed
    _seen.clear()
    if not spec:
        _armed = None
        return
    name, nth, action = [*spec.split(":"), "", ""][:3]
    if name not in POINTS:
        raise ValueError(f"unknown fault point {name!r}; choose from {', '.join(POINTS)}")
    if (action or "kill") not in _ACTIONS:
        raise ValueError(f"unknown fault action {action!r}; choose kill or stop")
    _armed = (name, int(nth or 1), _ACTIONS[action or "kill"])


def fault_point(name: str) -> None:
    if _armed is None or _armed[0] != name:
        return
    _seen[name] = _seen.get(name, 0) + 1
    if _seen[name] == _armed[1]:
        # Sent to this thread, which takes it on its way out of the call: sent to the
        # process, another thread could take it and this one run on a moment (past a
        # lease check, say) until the stop reached it. Both stop the whole process.
        signal.pthread_kill(threading.get_ident(), _armed[2])
        # Only a stop returns here: say when it was woken, for the test's log.
        print(f"agentjournal fault: stopped at {name}, continued at {time.time():.3f}",
              file=sys.stderr, flush=True)


arm(os.environ.get(ENV_VAR))
