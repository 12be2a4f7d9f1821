"""The activities behind ``JournalRun``, and the plugin that registers them on a worker.

``run_step`` runs the unchanged ``Agent.run`` against the shared store. Who may write is
decided by agentjournal's lease and epoch, never by Temporal's attempt counter (a reset
sets it back to 1; a timed-out attempt may still be running): a second attempt that
finds the lease held waits, as a retryable error whose delay is the lease's remaining
TTL, and the old attempt's next append is fenced. A heartbeat thread keeps Temporal
told; when the activity is cancelled or the worker shuts down, it sets the run's stop
event, so the run returns at its next step boundary, never mid-append.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import dataclasses
import json
import logging
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import timedelta

from temporalio import activity
from temporalio.exceptions import ApplicationError, CancelledError
from temporalio.plugin import SimplePlugin
from temporalio.worker import WorkerConfig, WorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from ..agent import Agent
from ..decisions import record_approval, record_resolution
from ..errors import (
    CorruptLogError,
    FencedError,
    InvalidRunIdError,
    JournalError,
    LeaseHeldError,
    MissingExtraError,
    RunMismatchError,
    RunNotFoundError,
    StoreUrlError,
    UnknownEventTypeError,
    UnsupportedVersionError,
)
from ..snapshots import load_state
from ..state import RunState
from ..store import Store, open_store
from .messages import OUTCOME_LIMIT, Decide, RunSummary, Start
from .workflow import DECIDE, RUN_STEP, JournalRun

log = logging.getLogger("agentjournal.temporal")

#: Journal errors no retry mends: the workflow fails with them, clearly.
FATAL: tuple[type[JournalError], ...] = (
    CorruptLogError, UnsupportedVersionError, InvalidRunIdError, StoreUrlError,
    MissingExtraError, RunMismatchError, UnknownEventTypeError,
    RunNotFoundError)  # (ArchivedRunError among them)


def summary_of(state: RunState) -> RunSummary:
    outcome = state.outcome
    if len(json.dumps(outcome, default=str)) > OUTCOME_LIMIT:
        outcome = None  # read it from the journal: a payload stays far from Temporal's limits
    reason = state.pause_reason or (state.escalation or {}).get("reason")
    return RunSummary(run_id=state.run_id, status=state.status, last_seq=state.last_seq,
                      outcome=outcome, uncertain=[p.key for p in state.pending.values()],
                      approvals=list(state.approvals),
                      reason=None if reason is None else str(reason)[:1000])


def _as_temporal(exc: JournalError) -> ApplicationError:
    """The error Temporal sees: fatal ones non-retryable, a held lease retried once it
    lapses, anything else (a fence, a lost store) retried by the policy."""
    kind = type(exc).__name__
    if isinstance(exc, FATAL):
        return ApplicationError(str(exc), type=kind, non_retryable=True)
    if isinstance(exc, LeaseHeldError):
        return ApplicationError(str(exc), type=kind,
                                next_retry_delay=timedelta(seconds=exc.expires_in + 0.5))
    return ApplicationError(str(exc), type=kind)


class Activities:
    """``run_step`` and ``decide``, bound to the plugin's agents and store."""

    def __init__(self, agents: Mapping[str, Agent], store_url: str) -> None:
        self.agents = dict(agents)
        self.store_url = store_url
        self._store: Store | None = None
        self._lock = threading.Lock()

    def store(self) -> Store:
        with self._lock:  # one handle per worker, shared by its activity threads
            if self._store is None:
                self._store = open_store(self.store_url)
            return self._store

    def close(self) -> None:
        with self._lock:
            if self._store is not None:
                self._store.close()
                self._store = None

    @activity.defn(name=RUN_STEP, no_thread_cancel_exception=True)
    def run_step(self, start: Start) -> RunSummary:
        agent = self._agent(start)
        info = activity.info()
        if info.workflow_id != start.run_id:
            raise ApplicationError(f"run {start.run_id!r} runs under workflow id "
                                   f"{info.workflow_id!r}; start it with id=run_id, so one "
                                   "run never has two workflows", type="Misconfigured",
                                   non_retryable=True)
        stop = threading.Event()
        with _heartbeating(stop, start.heartbeat_timeout):
            try:
                result = agent.run(self.store(), start.run_id, start.task, stop=stop,
                                   settle=False)  # a summary is all it returns
            except JournalError as exc:
                if isinstance(exc, FencedError):
                    log.warning("run %s: this attempt was fenced by a newer one", start.run_id)
                raise _as_temporal(exc) from exc
        if stop.is_set() and result.status == "running":
            if activity.is_cancelled():
                raise CancelledError("cancelled at a step boundary; the run can be resumed")
            raise ApplicationError("the worker is shutting down; the run stopped at a step "
                                   "boundary and goes on in the next attempt",
                                   type="WorkerShutdown")
        return summary_of(result.state)

    @activity.defn(name=DECIDE)
    def decide(self, decide: Decide) -> RunSummary:
        store = self.store()
        try:
            if decide.resolve is not None:
                r = decide.resolve
                record_resolution(store, decide.run_id, r.key, outcome=r.outcome,  # type: ignore[arg-type]
                                  by=r.by, reason=r.reason, result=r.result)
            elif decide.approve is not None:
                a = decide.approve
                record_approval(store, decide.run_id, a.approval_id, approved=a.approved,
                                by=a.by, reason=a.reason)
            return summary_of(load_state(store, decide.run_id).state)
        except LeaseHeldError as exc:  # the run is being driven: once its lease lapses
            raise _as_temporal(exc) from exc
        except JournalError as exc:
            raise ApplicationError(str(exc), type=type(exc).__name__,
                                   non_retryable=True) from exc

    def _agent(self, start: Start) -> Agent:
        agent = self.agents.get(start.agent)
        if agent is None:
            raise ApplicationError(f"no agent named {start.agent!r} on this worker (it has "
                                   f"{', '.join(sorted(self.agents)) or 'none'})",
                                   type="Misconfigured", non_retryable=True)
        if abs(agent.lease_ttl - start.heartbeat_timeout) > 1e-9:
            raise ApplicationError(
                f"agent {start.agent!r} has lease_ttl {agent.lease_ttl:g}s but the run's "
                f"heartbeat_timeout is {start.heartbeat_timeout:g}s: they must be equal, so "
                "a second attempt can take the run over once Temporal gives up on the first",
                type="Misconfigured", non_retryable=True)
        return agent


@contextmanager
def _heartbeating(stop: threading.Event, timeout: float) -> Iterator[None]:
    """Heartbeat from a thread (the run blocks this one); set ``stop`` when Temporal
    cancels the activity or the worker shuts down."""
    done = threading.Event()
    context = contextvars.copy_context()  # the activity's context, for heartbeat()

    def beat() -> None:
        while not done.wait(min(timeout / 3, 5.0)):
            context.run(activity.heartbeat)
            if context.run(activity.is_cancelled) or context.run(activity.is_worker_shutdown):
                stop.set()

    thread = threading.Thread(target=beat, name="agentjournal-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def _passing_agentjournal_through(runner: WorkflowRunner | None) -> WorkflowRunner:
    """The sandbox, told to take agentjournal as it is loaded: the workflow uses only its
    message dataclasses, and re-importing the package per workflow would be slow."""
    if runner is None:
        return SandboxedWorkflowRunner(
            restrictions=SandboxRestrictions.default.with_passthrough_modules("agentjournal"))
    if isinstance(runner, SandboxedWorkflowRunner):
        return dataclasses.replace(
            runner, restrictions=runner.restrictions.with_passthrough_modules("agentjournal"))
    return runner


class AgentJournalPlugin(SimplePlugin):
    """Registers ``JournalRun`` and its activities on a worker.

    ``agents``: stable names (a durable contract: a running workflow names its agent by
    it) for unchanged ``Agent`` objects, whose ``lease_ttl`` must equal the runs'
    ``heartbeat_timeout``. ``store``: a store every worker shares. PostgreSQL in
    production; SQLite or JSONL only when every worker runs on one host (leases of
    those stores are judged by the host's clock): a warning says so unless
    ``single_host=True`` states that they do.
    """

    def __init__(self, agents: Mapping[str, Agent], store: str, *,
                 max_concurrent_runs: int = 8, single_host: bool = False) -> None:
        if not agents:
            raise ValueError("give at least one agent, by a stable name")
        if not single_host and not store.startswith(("postgres://", "postgresql://")):
            log.warning("agentjournal on Temporal with store %s: every worker must run on "
                        "this host. Workers on other hosts would not see this store, and "
                        "leases would not fence them; use PostgreSQL for a fleet.",
                        store.split("?")[0])
        self.activities_ = Activities(agents, store)
        self.max_concurrent_runs = max_concurrent_runs
        super().__init__("agentjournal.AgentJournalPlugin", workflows=[JournalRun],
                         activities=[self.activities_.run_step, self.activities_.decide],
                         workflow_runner=_passing_agentjournal_through)

    def configure_worker(self, config: WorkerConfig) -> WorkerConfig:
        config = super().configure_worker(config)
        if config.get("activity_executor") is None:  # the run blocks its thread
            config["activity_executor"] = concurrent.futures.ThreadPoolExecutor(
                self.max_concurrent_runs, thread_name_prefix="agentjournal-run")
            config["max_concurrent_activities"] = self.max_concurrent_runs
        return config


__all__ = ["Activities", "AgentJournalPlugin", "summary_of"]
