"""Before a deploy: what a resume under the current code would do to each unfinished run.

``check_runs(store, "myapp.agents:reconciler")`` reads every unfinished run whose recorded
agent is that ref and says, per run (a :class:`~agentjournal.deploys.Forecast`), whether
a resume under the code now would continue (and what changed since the run's version),
pause for a person (which call, why), or be refused (strict mode). The judgement is
``deploys.forecast``, the one the loop itself applies on resume, so ``check`` and a real
resume never disagree.

Reading only: nothing is appended, no lease is taken, no model or tool is called. An
agent named by its ref is imported under the worker's trust rules (fleet/trust.py): the
ref checked as text first, then only from an allow-listed module, and only an Agent, a
Runnable or a factory of one is accepted.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from .deploys import AgentShape, Forecast, describe, forecast
from .errors import AgentRefError, JournalError, RunMismatchError
from .snapshots import load_state
from .state import RunState
from .store import Store
from .store.base import missing_run

_NEVER = datetime.min.replace(tzinfo=UTC)  # (a run with no recorded start sorts first)

#: A run in these states has nothing left to resume.
DONE = frozenset({"finished", "cancelled", "compensated"})


@dataclass
class Checked:
    """What a check found: a forecast per unfinished run of the agent, the runs it read
    and left aside, and the runs it could not read (never taken for "no runs")."""

    agent_ref: str
    shape: AgentShape
    runs: list[tuple[RunState, Forecast]] = field(default_factory=list)
    finished: int = 0  # runs of this agent with nothing left to resume
    other_agents: int = 0  # runs that record another agent (or none)
    unreadable: list[JournalError] = field(default_factory=list)

    @property
    def forecasts(self) -> list[Forecast]:
        return [f for _, f in self.runs]


def check_runs(store: Store, agent_ref: str, agent: object | None = None, *,
               run_ids: Sequence[str] | None = None, trusted: Sequence[str] | None = None,
               strict: bool | None = None, recorded_as: str | None = None) -> list[Forecast]:
    """What a resume under the current code would do to each unfinished run of
    ``agent_ref`` in ``store`` (or to each of ``run_ids``), oldest first.

    ``agent``: the agent as the code defines it now; by default the one ``agent_ref``
    names, imported under the worker's trust rules with ``trusted`` (module prefixes or
    whole refs; default: the ref's own module) as the allow-list. ``strict``: judge each
    run as a resume with ``run(..., strict=)`` would (default: the agent's own).
    ``recorded_as``: the agent name the runs record, when it is not ``agent_ref`` (a
    framework's agent run outside a worker records its own: ``pydantic_ai:NAME``,
    ``openai-agents:NAME``, ``langgraph``). A run named in ``run_ids`` that records
    another agent is RunMismatchError; a run that cannot be read raises its error (a
    check that skipped it would pass a deploy it knows nothing of)."""
    checked = inspect_runs(store, agent_ref, agent, run_ids=run_ids, trusted=trusted,
                           strict=strict, recorded_as=recorded_as)
    if checked.unreadable:
        raise checked.unreadable[0]
    return checked.forecasts


def inspect_runs(store: Store, agent_ref: str, agent: object | None = None, *,
                 run_ids: Sequence[str] | None = None, trusted: Sequence[str] | None = None,
                 strict: bool | None = None, recorded_as: str | None = None) -> Checked:
    """As :func:`check_runs`, keeping what was left aside and what could not be read."""
    shape = shape_of(agent_ref, load_trusted(agent_ref, trusted) if agent is None else agent)
    checked = Checked(agent_ref, shape)
    name = recorded_as or agent_ref
    for run_id, state in _states(store, run_ids, checked):
        if state.agent != name:
            if run_ids is not None:
                raise RunMismatchError(run_id, "agent", state.agent, name, advice=(
                    f"check it with the agent it records: --agent {state.agent}"
                    if state.agent else "it records no agent, so no agent's check covers it"))
            checked.other_agents += 1
        elif state.status in DONE and run_ids is None:
            checked.finished += 1
        else:
            checked.runs.append((state, forecast(state, shape, strict=strict)))
    return checked


def load_trusted(agent_ref: str, trusted: Sequence[str] | None = None) -> object:
    """The agent ``agent_ref`` names, loaded as a worker trusting ``trusted`` (default:
    the ref's module) would: checked as text before any import, then imported. An agent
    object a describer knows (an Agent, a Pydantic AI or Agents SDK agent, a compiled
    LangGraph graph, a Runnable wrapping one) is only read, never called; anything else
    must be what a worker runs (a factory of one is called, under the worker's rules),
    else AgentRefError."""
    from .agent import resolve_ref
    from .fleet.trust import AgentTrust, ref_problem  # (the fleet: only when asked)

    if problem := ref_problem(agent_ref):  # as text, before anything is imported
        raise AgentRefError(agent_ref, problem)
    trust = AgentTrust(list(trusted) if trusted else [agent_ref.partition(":")[0]])
    trust.check(agent_ref)  # trusted, no private name: still nothing imported
    found = resolve_ref(agent_ref, "install it, or give the directory that holds it "
                        "(--import-path)")
    _import_describers()
    if describe(found) is not None:
        return found
    return trust.load(agent_ref)


#: The integration that describes each framework's agents, imported when the framework
#: is (an agent module may use the framework without importing our integration).
_DESCRIBED_BY = {"pydantic_ai": "agentjournal.integrations.pydantic_ai",
                 "agents": "agentjournal.integrations.openai_agents.runner",
                 "langgraph": "agentjournal.integrations.langgraph"}


def _import_describers() -> None:
    for framework, integration in _DESCRIBED_BY.items():
        if framework in sys.modules:
            with contextlib.suppress(ImportError):  # (an integration's extra not installed)
                importlib.import_module(integration)


def shape_of(agent_ref: str, agent: object) -> AgentShape:
    """What ``deploys.describe`` says of ``agent``; AgentRefError when nothing can."""
    shape = describe(agent)
    if shape is None:
        raise AgentRefError(agent_ref, f"it is a {type(agent).__name__}, which no "
                            "describer in agentjournal.deploys knows (an Agent, or an agent "
                            "of an integration whose module is imported)")
    return shape


def _states(store: Store, run_ids: Sequence[str] | None,
            checked: Checked) -> Iterator[tuple[str, RunState]]:
    """Each run's state (snapshot + tail), oldest first; a run named in ``run_ids`` that
    does not exist is RunNotFoundError, one that cannot be read goes to ``unreadable``."""
    if run_ids is None:
        ids = [info.run_id for info in sorted(
            store.list_runs(), key=lambda i: (i.created_at or _NEVER, i.run_id))]
    else:
        ids = list(dict.fromkeys(run_ids))
        for run_id in ids:
            if not store.last_seq(run_id):
                raise missing_run(store, run_id)
    for run_id in ids:
        try:
            yield run_id, load_state(store, run_id).state
        except JournalError as exc:
            checked.unreadable.append(exc)
