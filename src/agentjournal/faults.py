"""Named fault points, for crash tests that kill a real process at a chosen instant.

The loop calls ``fault_point(name)`` at each dangerous window. Normally it does
nothing. With ``AGENTJOURNAL_FAULT=name[:n]`` in the environment, the n-th
time (default the first) the process sends itself SIGKILL there: no cleanup,
no flush, no atexit, exactly like an eviction.

Points: ``model_call`` (while waiting for the model), ``before_effect`` (the
start is durable, the tool has not run), ``after_effect`` (the tool returned,
its completion is not yet durable).
"""

from __future__ import annotations

import os
import signal

ENV_VAR = "AGENTJOURNAL_FAULT"
POINTS = ("model_call", "before_effect", "after_effect")

_armed: tuple[str, int] | None = None
_seen: dict[str, int] = {}


def arm(spec: str | None) -> None:
    """Arm ``"name[:n]"`` (or disarm with None). Read from the environment at import."""
    global _armed
    _seen.clear()
    if not spec:
        _armed = None
        return
    name, _, nth = spec.partition(":")
    if name not in POINTS:
        raise ValueError(f"unknown fault point {name!r}; choose from {', '.join(POINTS)}")
    _armed = (name, int(nth or 1))


def fault_point(name: str) -> None:
    if _armed is None or _armed[0] != name:
        return
    _seen[name] = _seen.get(name, 0) + 1
    if _seen[name] == _armed[1]:
        os.kill(os.getpid(), signal.SIGKILL)


arm(os.environ.get(ENV_VAR))
