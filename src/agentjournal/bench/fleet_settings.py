"""The fleet bench's settings: read by the section that measures (bench/fleet.py) and by
the target that judges its takeover (bench/targets.py), so neither imports the other."""

from __future__ import annotations

#: Tool calls per bench run: a run records 2 + 3 x STEPS + 2 events.
STEPS = 3
CONCURRENCY = 4  # runs each worker holds at once
FLOOR_COMMITS = 200
ROUND_TIMEOUT = 120.0
#: The takeover figures: the workers' lease TTL, and the slow runs' steps (each a tool
#: call of TAKEOVER_NAP seconds: a run outlives a kill).
TAKEOVER_TTL = 2.0
TAKEOVER_STEPS, TAKEOVER_NAP = 40, 0.1
