"""How a stopped run goes on: the one answer the CLI and the viewer both give.

A run is continued by whatever drove it. A native ``Agent`` run that recorded its
``MODULE:OBJECT`` is resumed by ``agentjournal resume RUN``; a run in the fleet's queue
by a worker; a run made by an integration only by that framework's own call, made again
with the same run (a Pydantic AI agent with ``JournalDurability(run_id=...)``, LangGraph's
``invoke(graph, None, thread)``, the Agents SDK's ``JournalRunner.run(..., run_id=...)``):
``agentjournal resume`` cannot import those (their recorded agent is
``pydantic_ai:NAME``, ``langgraph`` or ``openai-agents:NAME``), so it is never offered
for them.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from .errors import RunMismatchError
from .state import RunState

if TYPE_CHECKING:
    from .fleet.queue import Queue

#: What continues the run:
#:  ``resume``        ``agentjournal resume RUN`` (a native agent that recorded its ref)
#:  ``run``           ``agentjournal run MODULE:OBJECT TASK --run-id RUN`` (it recorded none)
#:  ``worker``        nothing to do: a worker of the queue takes it up
#:  ``decide``        a queued run that still waits for a person's other decisions
#:  ``requeue``       ``agentjournal requeue RUN`` (a worker parked it)
#:  ``compensate``    ``agentjournal compensate RUN`` (its saga stopped before its end)
#:  ``pydantic_ai``   the Pydantic AI agent run again with the same prompt and run id
#:  ``langgraph``     ``invoke(graph, None, thread)`` with the same thread id
#:  ``openai_agents`` ``JournalRunner.run(agent, None, store=..., run_id=RUN)``
#:  ``parent``        a child run (opened inside a call of another run): continuing
#:                    that parent run resumes it (its own continuation not known here)
#:  ``done``          nothing: the run ended (finished, cancelled, compensated)
#: A child run whose parent's continuation is known takes the parent's kind and command.
Kind = Literal["resume", "run", "worker", "decide", "requeue", "compensate", "pydantic_ai",
               "langgraph", "openai_agents", "parent", "done"]

#: Statuses after which nothing continues the run.
ENDED = ("finished", "cancelled", "compensated")

#: The reason a run is paused with when a person stopped the process driving it
#: (Ctrl-C on `agentjournal run` / `resume`): nothing is wrong with it, it just stopped.
INTERRUPTED = "interrupted (Ctrl-C): the process driving it was stopped"


def was_interrupted(state: RunState) -> bool:
    """The run is paused because a person interrupted the process driving it."""
    return state.status == "paused" and state.pause_reason == INTERRUPTED


class Continuation(msgspec.Struct, frozen=True, kw_only=True):
    """How run ``run_id`` goes on.

    ``sentence`` is the whole hint for a person ("continue it with: ..."); ``command``
    is the text to copy (a shell command, or a line of Python for an integration's
    call), empty when there is nothing to type (``worker``, ``done``); ``shell`` says
    whether ``command`` is a shell command (True) or Python (False)."""

    kind: Kind
    run_id: str
    sentence: str
    command: str = ""
    shell: bool = True


def continuation(state: RunState, *, started: Mapping[str, Any] | None = None,
                 queue_state: str | None = None, runnable: bool | None = None,
                 store_hint: str = "", parent: Continuation | None = None,
                 waiting_for: str | None = None) -> Continuation:
    """How to continue the run whose folded state is ``state``.

    ``started``: the payload of its ``run_started`` event, when the caller has it (a
    LangGraph thread's id is read from its ``input``; without it, from the task; a run
    opened by an integration under a worker's ``MODULE:OBJECT`` is told apart from a
    native agent's by it).
    ``queue_state``: its state in the fleet's queue (``QueuedRun.state``), None when it
    is not in one; ``runnable``: ``QueuedRun.runnable`` (a worker's claim would take it
    now, e.g. a waiting run a person's last decision made runnable; False for a waiting
    run says the person's other decisions come first; None, not known: a waiting run is
    taken to be runnable). ``store_hint``:
    appended to shell commands (e.g. `` --store URL``). ``parent``: for a child run
    (``started`` names the call of another run that opened it), how that parent run
    continues: the child's hint is the parent's, since the parent's call, made again,
    resumes the child (run alone, it would lose its link to that call).
    ``waiting_for``: ``QueuedRun.waiting_for``, why a queued run pinned to a version no
    live worker serves is not taken up (then said instead of "a worker will take it up").

    Native agent with a recorded ``MODULE:OBJECT``: ``agentjournal resume RUN``;
    queued: "a worker will take it up" (waiting in the queue: the person's other
    decisions first); Pydantic AI / LangGraph / Agents SDK: the call that continues
    that run; interrupted (``was_interrupted``): resumed like any other.
    """
    rid = state.run_id
    if state.status in ENDED:
        return Continuation(kind="done", run_id=rid,
                            sentence=f"run {rid} is {state.status}: nothing to continue")
    if queue_state == "waiting" and runnable is not False:
        queue_state = "queued"  # a decision made it runnable: the fleet takes it up
    queued = _in_queue(rid, "queued" if runnable else queue_state, store_hint, waiting_for)
    if queued is not None:
        return queued
    if state.status == "compensating":  # the loop never drives it again: its saga does
        command = f"agentjournal compensate {shlex.quote(rid)}{store_hint}"
        return Continuation(kind="compensate", run_id=rid, command=command, sentence=(
            f"run {rid} is being compensated: go on with its saga (its plan is kept, no "
            f"effect is undone twice) with: {command}"))
    link = (started or {}).get("parent")
    if isinstance(link, Mapping) and isinstance(link.get("run_id"), str):
        return _child(rid, link, parent, store_hint)
    agent = state.agent or ""
    if agent.startswith("pydantic_ai:"):
        return _pydantic_ai(state, agent.partition(":")[2])
    if agent == "langgraph":
        return _langgraph(state, started)
    if agent.startswith("openai-agents:"):
        return _openai_agents(state, agent.partition(":")[2])
    if started is not None and "input" in started:  # opened through the bridge
        return _runnable(rid, agent, store_hint)
    if not agent:
        command = (f"agentjournal run MODULE:OBJECT {shlex.quote(state.task)} "
                   f"--run-id {shlex.quote(rid)}{store_hint}")
        return Continuation(kind="run", run_id=rid, command=command, sentence=(
            f"run {rid} recorded no agent: continue it by running its agent with the "
            f"same task and run id: {command}"))
    command = f"agentjournal resume {shlex.quote(rid)}{store_hint}"
    return Continuation(kind="resume", run_id=rid, command=command,
                        sentence=f"continue it with: {command}")


def _in_queue(rid: str, queue_state: str | None, store_hint: str,
              waiting_for: str | None = None) -> Continuation | None:
    if queue_state == "queued":
        return Continuation(kind="worker", run_id=rid, sentence=f"run {rid} is in the queue: "
                            f"{waiting_for or 'a worker will take it up'}")
    if queue_state == "waiting":  # (a decision that leaves others open keeps it waiting)
        command = f"agentjournal show {shlex.quote(rid)}{store_hint}"
        return Continuation(kind="decide", run_id=rid, command=command, sentence=(
            f"run {rid} still waits for a person: decide its other open approvals and "
            f"uncertain calls ({command}); then a worker will take it up"))
    if queue_state == "running":
        return Continuation(kind="worker", run_id=rid,
                            sentence=f"run {rid} is held by a worker, which goes on with it")
    if queue_state == "parked":
        command = f"agentjournal requeue {shlex.quote(rid)}{store_hint}"
        return Continuation(kind="requeue", run_id=rid, command=command, sentence=(
            f"a worker parked run {rid}; once its cause is fixed, hand it back to the "
            f"workers with: {command}"))
    return None  # not in a queue, or done there: what drove it continues it


def _child(rid: str, link: Mapping[str, Any], parent: Continuation | None,
           store_hint: str) -> Continuation:
    """A run opened inside a call of another run: that run's call resumes it."""
    pid = str(link["run_id"])
    inside = (f"run {rid} runs inside call {link.get('call_id') or link.get('key')} of run "
              f"{pid}, whose call, made again, resumes it")
    if parent is None:
        command = f"agentjournal show {shlex.quote(pid)}{store_hint}"
        return Continuation(kind="parent", run_id=rid, command=command, sentence=(
            f"{inside}: continue run {pid} ({command} says how)"))
    return Continuation(kind=parent.kind, run_id=rid, command=parent.command,
                        shell=parent.shell, sentence=f"{inside}: {parent.sentence}")


def _runnable(rid: str, agent: str, store_hint: str) -> Continuation:
    """A run an integration opened under a worker's ``MODULE:OBJECT`` (a Runnable, which
    ``agentjournal resume`` cannot drive): the fleet continues it."""
    command = f"agentjournal requeue {shlex.quote(rid)}{store_hint}"
    return Continuation(kind="requeue", run_id=rid, command=command, sentence=(
        f"run {rid} is driven by a worker through {agent}: hand it back to the workers "
        f"with: {command}"))


def _pydantic_ai(state: RunState, name: str) -> Continuation:
    rid = state.run_id
    command = f"agent.run_sync({state.task!r})"
    return Continuation(kind="pydantic_ai", run_id=rid, shell=False, command=command,
                        sentence=(
        f"run {rid} is a Pydantic AI run (agent {name!r}): continue it by running that "
        f"agent again with the same prompt, its JournalDurability given run_id={rid!r} "
        f"and the same store: {command}"))


def _langgraph(state: RunState, started: Mapping[str, Any] | None) -> Continuation:
    thread = _thread_id(state, started)
    config = {"configurable": {"thread_id": thread}}
    command = f"invoke(graph, None, {config!r})"
    return Continuation(kind="langgraph", run_id=state.run_id, shell=False, command=command,
                        sentence=(
        f"run {state.run_id} is LangGraph thread {thread!r}: continue it with "
        "agentjournal.integrations.langgraph's invoke on the graph compiled with a "
        f"JournalSaver of the same store: {command}"))


def _thread_id(state: RunState, started: Mapping[str, Any] | None) -> str:
    given = (started or {}).get("input")
    if isinstance(given, Mapping) and isinstance(given.get("thread_id"), str):
        return str(given["thread_id"])
    prefix = "LangGraph thread "  # the task the saver records
    return state.task[len(prefix):] if state.task.startswith(prefix) else "THREAD_ID"


def _openai_agents(state: RunState, name: str) -> Continuation:
    rid = state.run_id
    command = f"JournalRunner.run_sync(agent, None, store=store, run_id={rid!r})"
    return Continuation(kind="openai_agents", run_id=rid, shell=False, command=command,
                        sentence=(
        f"run {rid} is an OpenAI Agents SDK run (agent {name!r}): continue it with "
        f"JournalRunner on that agent and the same store (input None resumes with the "
        f"recorded one): {command}"))


def check_resubmission(queue: Queue, run_id: str, recorded: tuple[str, str],
                       given: tuple[str, str]) -> None:
    """A second submit of ``run_id`` (``given``: its agent and task) is the request
    ``recorded`` again (nothing changes), or refused, never a second run. The refusal
    names what continues the run submitted first: its place in ``queue`` and its log
    decide (a worker takes it up, ``requeue`` hands a parked one back, it ended), never
    ``agentjournal resume``, which cannot drive a worker's run. Call it outside the
    submit's transaction: a refusal reads the queue and the run."""
    for field, was, now in zip(("agent", "task"), recorded, given, strict=True):
        if was != now:
            how = _submitted(queue, run_id, recorded[0])
            raise RunMismatchError(run_id, field, was, now, advice=(
                f"{how.sentence}; other work goes under a new run id (submit it without "
                "a run id, or with new_run_id())"))


def _submitted(queue: Queue, run_id: str, agent: str) -> Continuation:
    from .snapshots import load_state  # (imported here: the fleet imports this module)

    entry = next((r for r in queue.runs() if r.run_id == run_id), None)
    store = queue.store
    state = (load_state(store, run_id).state if store.last_seq(run_id)
             else RunState(run_id=run_id, agent=agent))
    return continuation(state, queue_state=None if entry is None else entry.state,
                        runnable=None if entry is None else entry.runnable,
                        waiting_for=None if entry is None else entry.waiting_for)
