"""What crosses Temporal: the workflow's input, its summary, a person's decisions.

Plain dataclasses with no agentjournal imports, so the workflow sandbox loads this module
as it is. Everything here is small by design: a summary names keys and ids, never the
run's state or results (those stay in the journal), so no payload nears Temporal's limits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: Statuses after which the workflow completes: the run will not go on by itself.
DONE = ("finished", "cancelled", "compensated")


@dataclass(frozen=True)
class Start:
    """The workflow's input. ``agent``: a name the plugin registered; ``heartbeat_timeout``
    (seconds) must equal the agent's ``lease_ttl``: Temporal notices a dead worker after
    the one, agentjournal lets another take the run after the other."""

    agent: str
    run_id: str
    task: str
    heartbeat_timeout: float = 30.0
    run_timeout: float = 24 * 3600.0  # start-to-close of one attempt: the longest run


@dataclass(frozen=True)
class RunSummary:
    """Where the run stopped, as the journal says (a query's and the workflow's result)."""

    run_id: str
    #: A RunState status; "running" while an activity drives the run (the other fields
    #: are then those of the last summary: the journal has the live seq).
    status: str
    last_seq: int = 0
    outcome: Any = None  # None when larger than OUTCOME_LIMIT: read it from the journal
    uncertain: list[str] = field(default_factory=list)  # idempotency keys
    approvals: list[str] = field(default_factory=list)  # approval ids
    reason: str | None = None  # why it paused or escalated, shortened


@dataclass(frozen=True)
class Resolve:
    """A person's verdict on an uncertain call (as `agentjournal resolve`): ``outcome``
    is ``happened``, ``did_not_happen`` or ``conflict``; ``key`` may be a unique prefix."""

    key: str
    outcome: str
    by: str
    reason: str = ""
    result: Any = None


@dataclass(frozen=True)
class Approve:
    """A person's decision on a pending approval (as `agentjournal approve` / `deny`)."""

    approval_id: str
    approved: bool
    by: str
    reason: str = ""


@dataclass(frozen=True)
class Decide:
    """The decide activity's input: one of the two decisions, for one run."""

    run_id: str
    resolve: Resolve | None = None
    approve: Approve | None = None


OUTCOMES = ("happened", "did_not_happen", "conflict")
OUTCOME_LIMIT = 8192  # bytes of JSON a summary carries of the outcome
