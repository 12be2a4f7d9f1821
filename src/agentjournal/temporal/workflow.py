"""``agentjournal.JournalRun``: the small workflow agentjournal owns.

It runs the whole agentjournal run in one heartbeating activity (``run_step``) and
completes when the run is done. When the run stops for a person (an uncertain call, an
approval, an escalation), it waits: an Update (``resolve``, ``approve``) records the
decision in the journal through the ``decide`` activity and wakes it; so does the
``wake`` signal, for a decision made with the CLI. History stays O(1) per run.

Deterministic by construction: no clock, no randomness, no I/O, no agentjournal code
(only the message dataclasses). A change to it goes behind ``workflow.patched`` and is
checked by replaying the histories in ``tests/fixtures/temporal/``.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from .messages import DONE, OUTCOMES, Approve, Decide, Resolve, RunSummary, Start

RUN_STEP = "agentjournal.run_step"
DECIDE = "agentjournal.decide"
#: Errors that no retry can mend: the activity raises them non-retryable, this names them.
FATAL = ["CorruptLogError", "UnsupportedVersionError", "InvalidRunIdError", "StoreUrlError",
         "MissingExtraError", "RunMismatchError", "UnknownEventTypeError", "RunNotFoundError",
         "Misconfigured"]


@workflow.defn(name="agentjournal.JournalRun")
class JournalRun:
    def __init__(self) -> None:
        self._summary: RunSummary | None = None
        self._woken = False

    @workflow.run
    async def run(self, start: Start) -> RunSummary:
        # What the query tells while the run is driven: running, as of the last summary
        # (the journal has the live seq). No command: replays are unchanged.
        self._summary = RunSummary(run_id=start.run_id, status="running")
        while True:
            self._woken = False
            self._summary = await workflow.execute_activity(
                RUN_STEP, start, result_type=RunSummary,
                start_to_close_timeout=timedelta(seconds=start.run_timeout),
                heartbeat_timeout=timedelta(seconds=start.heartbeat_timeout),
                # Retries are for crashes only; the journal, not the attempt count, decides
                # what a retry may do. A crash loop is capped by the agent's max_recoveries.
                retry_policy=RetryPolicy(maximum_interval=timedelta(seconds=30),
                                         non_retryable_error_types=FATAL))
            if self._summary.status in DONE:
                await workflow.wait_condition(workflow.all_handlers_finished)
                return self._summary
            await workflow.wait_condition(lambda: self._woken)
            self._summary = dataclasses.replace(self._summary, status="running")

    @workflow.query(name="status")
    def status(self) -> RunSummary | None:
        return self._summary

    @workflow.signal(name="wake")
    def wake(self) -> None:
        """Run again: a decision was recorded outside Temporal (the CLI)."""
        self._woken = True

    @workflow.update(name="resolve")
    async def resolve(self, decision: Resolve) -> RunSummary:
        return await self._decide(Decide(self._run_id(), resolve=decision))

    @resolve.validator
    def _resolve_shape(self, decision: Resolve) -> None:
        if decision.outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {', '.join(OUTCOMES)}, not "
                             f"{decision.outcome!r}")
        if not decision.key or not decision.by:
            raise ValueError("a resolution names the call's key and who decided")

    @workflow.update(name="approve")
    async def approve(self, decision: Approve) -> RunSummary:
        return await self._decide(Decide(self._run_id(), approve=decision))

    @approve.validator
    def _approve_shape(self, decision: Approve) -> None:
        if not decision.approval_id or not decision.by:
            raise ValueError("a decision names the approval id and who decided")

    def _run_id(self) -> str:
        return workflow.info().workflow_id

    async def _decide(self, decide: Decide) -> RunSummary:
        summary: RunSummary = await workflow.execute_activity(
            DECIDE, decide, result_type=RunSummary,
            start_to_close_timeout=timedelta(seconds=60),
            retry_policy=RetryPolicy(maximum_attempts=5, non_retryable_error_types=[
                *FATAL, "NotPendingError", "AlreadyDecidedError", "AmbiguousKeyError"]))
        self._summary = summary  # the journal's state just after the decision
        self._woken = True
        return summary
