"""The fleet: submit, worker, queue, workers, requeue."""

from __future__ import annotations

import importlib
import logging
import os
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

import click
import msgspec

from .. import RunMismatchError
from ..agent import new_run_id, require_run_id
from ..errors import AgentRefError, NoQueueError
from ..fleet import QUEUE_STATES, Queue, queue_of
from ..fleet import requeue as requeue_run
from ..fleet.trust import AgentTrust, ref_problem
from ..fleet.worker import Worker
from ..metrics import serve
from ..redaction import Redaction
from ..store import open_store
from ._base import (
    CliError,
    _check_target,
    by_option,
    cli,
    human_age,
    json_option,
    note,
    out,
    store_hint,
    store_option,
    table,
)
from ._safe import cells, echo, emit_json, visible


@contextmanager
def queue_at(url: str, *, create: bool = False, readonly: bool = False) -> Iterator[Queue]:
    """The queue of the store at ``url``, closed afterwards. A JSONL store has none
    (NoQueueError, exit 1), refused before anything is created."""
    if url.strip().lower().startswith("jsonl:"):
        raise NoQueueError(url)
    _check_target(url, create=create)
    store = open_store(url, readonly=readonly)
    try:
        queue = queue_of(store)
        try:
            yield queue
        finally:
            queue.close()
    finally:
        store.close()


@cli.command(name="submit")
@click.option("--agent", "agent_ref", required=True, metavar="MODULE:OBJECT",
              help="The agent a worker runs it with (an Agent, or a function annotated "
              "-> Agent); workers run only the agents they trust (worker --agents).")
@click.option("--task", required=True, help="The run's task.")
@click.option("--run-id", help="The run's id (default: a new one, printed). Submitting the "
              "same id with the same agent and task again changes nothing.")
@click.option("--queue", "queue_name", default="default", show_default=True,
              help="The queue it waits in (workers name the queues they drain).")
@click.option("--priority", type=int, default=0, show_default=True,
              help="Higher is claimed first.")
@click.option("--pin-version", "pin_version", metavar="VERSION",
              help="Run it with this version of the agent only, for its whole life: only "
              "a worker serving that version claims it (see `agentjournal workers`); until "
              "one is live it stays queued, the reason in `agentjournal queue`. Default: "
              "unpinned, run with the newest version of the worker that claims it.")
@json_option
@store_option
def submit_cmd(agent_ref: str, task: str, run_id: str | None, queue_name: str,
               priority: int, pin_version: str | None, as_json: bool, store_url: str) -> None:
    """Put a run in the queue for a worker; prints its run id.

    Idempotent: the same --run-id with the same agent, task and --pin-version is the
    same run (exit 0, "already submitted"); another one under that id is refused
    (exit 2), never a second run.

    \b
    Example:
      agentjournal submit --agent myapp.agents:reconciler --task "Reconcile Q3" \\
          --run-id q3 --store sqlite:///runs.db
    """
    if problem := ref_problem(agent_ref):
        raise CliError(f"--agent {agent_ref!r}: {problem}", 2)
    if pin_version is not None and not pin_version.strip():
        raise CliError("--pin-version is empty: give the version to pin the run to", 2)
    import_args, unimportable = _worker_import_args(agent_ref)
    # As fleet.submit does, keeping whether the run was created.
    submitted = new_run_id() if run_id is None else require_run_id(run_id)
    with queue_at(store_url, create=True) as queue:
        try:
            created = queue.submit(submitted, agent_ref, Redaction().scrub(task),
                                   queue=queue_name, priority=priority,
                                   pin_version=pin_version)
        except RunMismatchError as exc:
            raise CliError(str(exc), 2) from None
    if as_json:
        emit_json({"run_id": submitted, "created": created})
        return
    click.echo(submitted)
    if not created:
        note(f"run {submitted} was already submitted with this agent and task: nothing changed")
    elif unimportable is not None:
        note(f"submitted {submitted} to queue {queue_name!r}; a worker started here would "
             f"park it: {unimportable}. Its workers trust it with --agents "
             f"{agent_ref.partition(':')[0]}")
    else:
        pinned = "" if pin_version is None else f" pinned to version {pin_version}"
        note(f"submitted {submitted}{pinned} to queue {queue_name!r}; start workers with: "
             f"agentjournal worker --agents {agent_ref.partition(':')[0]}{import_args}"
             f"{store_hint(store_url)}")


def _worker_import_args(agent_ref: str) -> tuple[str, str | None]:
    """What a worker started in this directory needs, besides ``--agents MODULE``, to
    run ``agent_ref``: ``""`` when it imports it as installed, ``" --import-path ."``
    when only from this directory (a worker leaves its working directory off the import
    path). Imports its module as the worker would, and calls nothing. A ref that imports
    and is no agent (``os:fork``) would be parked by any worker: CliError (exit 2). One
    whose module does not import here: ``("", why)``, its workers may be elsewhere."""
    here, saved = os.getcwd(), sys.path[:]
    module = agent_ref.partition(":")[0]
    trust = AgentTrust([module])
    refusal: AgentRefError | None = None
    try:
        trust.check(agent_ref)  # as text (a private name): refused before any import
    except AgentRefError as exc:
        raise CliError(f"a worker would refuse {exc}", 2) from None
    try:
        for import_args, dirs in (("", ()), (" --import-path .", (here,))):
            sys.path[:] = saved
            _set_import_path(dirs)  # as `worker` sets it, with or without --import-path
            importlib.invalidate_caches()
            try:
                trust.resolve(agent_ref)
                return import_args, None
            except AgentRefError as exc:
                refusal = exc
    finally:
        sys.path[:] = saved
    assert refusal is not None
    if module in sys.modules:  # it imported: what it names is no agent
        raise CliError(f"a worker would refuse {refusal}", 2)
    return "", str(refusal)


def _trusted(_ctx: click.Context, _param: click.Parameter,
             given: tuple[str, ...]) -> list[str]:
    prefixes = [p.strip() for value in given for p in value.split(",")]
    if not prefixes or not all(prefixes):
        raise click.BadParameter("give module prefixes or whole refs, comma-separated "
                                 "(e.g. myapp.agents,reports.agents:weekly)")
    return prefixes


class _VisibleFormatter(logging.Formatter):
    """Log lines for a terminal or a file: escapes from a run's content are shown, and a
    message is one line (a traceback, at DEBUG, keeps its own lines)."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return visible(super().formatMessage(record))

    def formatException(self, ei: Any) -> str:
        return visible(super().formatException(ei), multiline=True)


def _log_to_stderr(verbose: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_VisibleFormatter("%(asctime)s %(levelname)s %(message)s"))
    library = logging.getLogger("agentjournal")  # the worker's lines, and the library's
    library.addHandler(handler)
    library.setLevel(logging.DEBUG if verbose else logging.INFO)


def _set_import_path(dirs: tuple[str, ...]) -> None:
    """Import agents only from where the worker was told to: ``python -m`` puts the
    working directory first on sys.path, where anyone who can write a file there would
    choose the code a trusted module name imports."""
    here = os.getcwd()
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    sys.path[:0] = [os.path.abspath(d) for d in dirs]


@cli.command()
@click.option("--agents", "agents", multiple=True, required=True, callback=_trusted,
              metavar="PREFIX,...",
              help="The agents this worker runs (required): module prefixes "
              "(myapp.agents trusts myapp.agents:x and myapp.agents.sub:y) or whole refs, "
              "comma-separated or repeated. A run naming any other agent is parked at "
              "once, nothing it names imported. Whole refs are loaded at start, and the "
              "versions they serve logged.")
@click.option("--import-path", "import_path", multiple=True, metavar="DIR",
              type=click.Path(exists=True, file_okay=False),
              help="A directory to import agents from (repeatable). The working "
              "directory is not on the import path unless given here.")
@click.option("--queue", "queues", multiple=True, metavar="Q",
              help="A queue to drain (repeatable; default: default).")
@click.option("--concurrency", type=click.IntRange(min=1), default=1, show_default=True,
              help="Runs held at once, each in its own thread (or, with --on-loop, "
                   "each a task on one event loop).")
@click.option("--on-loop", is_flag=True,
              help="Hold the runs as tasks on one event loop (Agent.arun): for hundreds or "
                   "thousands of runs at once, which wait on their models, in one process.")
@click.option("--ttl", type=click.FloatRange(min=0.1), default=30.0, show_default=True,
              help="Lease TTL in seconds: the takeover time after this worker dies "
              "without draining.")
@click.option("--grace", type=click.FloatRange(min=0), default=30.0, show_default=True,
              help="On SIGTERM, seconds to let runs reach their next step boundary.")
@click.option("--max-crashes", type=click.IntRange(min=1), default=3, show_default=True,
              help="Park (and escalate) a run claimed after this many crashes.")
@click.option("--compensate-parked", is_flag=True,
              help="A run parked as poison has failed: undo its completed effects "
              "(a saga with its agent's tools); compensated, it is done. An undo cannot "
              "be withdrawn, so the run is held one more --ttl first: a worker only "
              "paused past its lease that comes back in that time takes its stop back "
              "and the run goes on instead.")
@click.option("--poll", type=click.FloatRange(min=0.01), default=1.0, show_default=True,
              help="Seconds between looks for work when idle (PostgreSQL also wakes "
              "on NOTIFY).")
@click.option("--metrics-port", type=click.IntRange(min=0, max=65535), metavar="PORT",
              help="Serve Prometheus metrics at http://HOST:PORT/metrics (recovery, "
              "snapshots, uncertain calls, this worker's claims); off unless given.")
@click.option("--metrics-host", default="127.0.0.1", show_default=True, metavar="HOST",
              help="Address for --metrics-port (0.0.0.0 to let a scraper on another "
              "host in).")
@click.option("--verbose", "-v", is_flag=True,
              help="Log at DEBUG too: a crashed run's traceback.")
@store_option
@click.pass_context
def worker(ctx: click.Context, agents: list[str], import_path: tuple[str, ...],
           queues: tuple[str, ...], concurrency: int, on_loop: bool, ttl: float,
           grace: float, max_crashes: int, compensate_parked: bool, poll: float,
           metrics_port: int | None, metrics_host: str, verbose: bool,
           store_url: str) -> None:
    """Claim runnable runs and run them until SIGTERM or SIGINT, which drains:
    nothing more is claimed, each run stops at its next step boundary and is handed
    back queued, so other workers continue it at once; then it exits 0.

    It runs only the agents --agents names: a run naming another one (or anything
    but an Agent or a function annotated -> Agent) is parked at once with the reason,
    and what it names is never imported or called.

    Versions (rollouts): it serves, for each agent ref, the version of the agent its
    code has (Agent(..., version="v2"), or a digest of it): logged at start and listed
    by `agentjournal workers`. To serve several versions of one ref during a rollout,
    the ref names agentjournal.fleet.Versions(agent_v2, agent_v1), newest first.
    An unpinned run is run with the newest version; a run submitted with
    --pin-version only by a worker serving that version. Old and new workers may
    drain one store side by side. A run that killed its worker
    --max-crashes times is parked and escalated (see `agentjournal queue`;
    `agentjournal requeue RUN` after fixing it). Needs a SQLite (one host) or
    PostgreSQL (many hosts) store; JSONL has no queue. Logs one line per event on
    stderr (time, level, the worker id), escapes shown, never executed.

    \b
    Example:
      agentjournal worker --agents myapp.agents --store postgresql://worker@db/agents \\
          --concurrency 4 --grace 60
      agentjournal worker --agents myapp.agents --store postgresql://worker@db/agents \
          --concurrency 1000 --on-loop
    """
    if store_url.strip().lower().startswith("jsonl:"):
        raise NoQueueError(store_url)
    _check_target(store_url, create=True)
    try:
        w = Worker(store_url, agents=agents, queues=queues or ("default",),
                   concurrency=concurrency, ttl=ttl, poll=poll, grace=grace,
                   max_crashes=max_crashes, compensate_parked=compensate_parked,
                   on_loop=on_loop)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--agents") from None
    _set_import_path(import_path)
    _log_to_stderr(verbose)

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        if not w.draining:
            w.log(f"{signal.Signals(signum).name}: draining")
        w.drain()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if metrics_port is not None:
        try:
            server = serve(metrics_host, metrics_port)
        except OSError as exc:
            raise click.ClickException(f"cannot serve metrics on {metrics_host}:{metrics_port}: "
                                   f"{exc.strerror or exc}") from None
        port = server.server_address[1]
        w.log(f"metrics at http://{metrics_host}:{port}/metrics")
    ctx.exit(w.run())


def _queue_summary(queue: Queue) -> dict[str, Any]:
    now = time.time()
    runs = queue.runs()
    by_queue: dict[str, dict[str, int]] = {}
    for r in runs:
        counts = by_queue.setdefault(r.queue, dict.fromkeys(QUEUE_STATES, 0))
        counts[r.state] += 1
    totals = {state: sum(c[state] for c in by_queue.values()) for state in QUEUE_STATES}
    queued = [r for r in runs if r.state == "queued"]
    oldest = min(queued, key=lambda r: r.submitted_at) if queued else None
    return {
        "total": totals,
        "queues": by_queue,
        # (A pinned run no live worker serves is no worker's to take now.)
        "runnable": sum(r.runnable and r.waiting_for is None for r in runs),
        "oldest_queued": None if oldest is None else {
            "run_id": oldest.run_id, "queue": oldest.queue,
            "age_s": round(max(0.0, now - oldest.submitted_at), 3)},
        "poison": [{"run_id": r.run_id, "queue": r.queue, "agent": r.agent,
                    "crashes": r.crashes, "claims": r.claims,
                    "parked_age_s": round(max(0.0, now - r.changed_at), 3),
                    "runnable": r.runnable, "reason": r.reason, "stops": r.stops}
                   for r in runs if r.state == "parked"],
        # Pinned runs no live worker serves: they wait (never parked) for one that does.
        "unserved": [{"run_id": r.run_id, "queue": r.queue, "state": r.state,
                      "agent": r.agent, "pin_version": r.pin_version,
                      "reason": r.waiting_for}
                     for r in runs if r.waiting_for is not None],
    }


@cli.command(name="queue")
@json_option
@store_option
def queue_cmd(as_json: bool, store_url: str) -> None:
    """Counts of runs per state and queue, the oldest queued run, how many are
    runnable now, the poison (parked) runs, and the runs pinned to a version no live
    worker serves (they wait for one). Reading never writes.

    \b
    Example:
      agentjournal queue --store sqlite:///runs.db --json | jq .total
    """
    with queue_at(store_url, readonly=True) as queue:
        summary = _queue_summary(queue)
    if as_json:
        emit_json(summary)
        return
    console = out()
    rows = [(name, *(str(counts[s]) for s in QUEUE_STATES))
            for name, counts in sorted(summary["queues"].items())]
    rows.append(("all", *(str(summary["total"][s]) for s in QUEUE_STATES)))
    console.print(table(("queue", *QUEUE_STATES), rows, keep=("queue",)))
    echo(f"runnable now: {summary['runnable']}")
    oldest = summary["oldest_queued"]
    if oldest is not None:
        echo(f"oldest queued: {oldest['run_id']} ({oldest['queue']}), "
             f"{human_age(oldest['age_s'])} old")
    if summary["poison"]:
        console.print(table(("poison run", "queue", "crashes", "agent", "parked"), cells(
            (p["run_id"], p["queue"], str(p["crashes"]), p["agent"],
             human_age(p["parked_age_s"]) + " ago") for p in summary["poison"]),
            keep=("poison run",)))
        for p in summary["poison"]:
            if p["reason"]:
                _echo_reason(p["run_id"], p["reason"], p["stops"])
        note(f"see why: agentjournal show RUN{store_hint(store_url)}; after fixing the "
             f"cause: agentjournal requeue RUN{store_hint(store_url)}")
    for u in summary["unserved"]:
        echo(f"{u['run_id']}: {u['reason']}")


def _echo_reason(run_id: str, reason: str, stops: list[str]) -> None:
    """Why a run is parked, each stop counted on a line of its own."""
    found = reason.find(stops[0]) if stops else -1
    echo(f"{run_id}: {reason[:found].rstrip() if found > 0 else reason}")
    for stop in stops if found > 0 else ():
        echo(f"  {stop}")


@cli.command()
@json_option
@store_option
def workers(as_json: bool, store_url: str) -> None:
    """The workers that sent a heartbeat: id, host, pid, the versions of each agent
    they serve, the runs they hold, the age of their last heartbeat, and whether they
    drain. A worker that exited cleanly removed its row; one that died keeps it,
    ageing. Reading never writes.

    \b
    Example:
      agentjournal workers --store postgresql://worker@db/agents --json
    """
    with queue_at(store_url, readonly=True) as queue:
        found = queue.workers()
    now = time.time()
    rows = [{**msgspec.to_builtins(w), "heartbeat_age_s": round(max(0.0, now - w.heartbeat_at), 3)}
            for w in found]
    if as_json:
        emit_json(rows)
        return
    if not rows:
        note("no workers")
        return
    out().print(table(
        ("worker", "host", "pid", "serves", "runs", "heartbeat", "draining"), cells(
            (r["worker_id"], r["host"], str(r["pid"]), _serves(r["versions"]),
             ", ".join(r["runs"]) or "-", human_age(r["heartbeat_age_s"]) + " ago",
             "yes" if r["draining"] else "no")
            for r in rows), keep=("worker",)))


def _serves(versions: dict[str, list[str]]) -> str:
    """``ref v2, v1; ref2 -`` (``-``: its agent carries no version)."""
    return "; ".join(f"{ref} {', '.join(v) or '-'}" for ref, v in sorted(versions.items())) or "-"


@cli.command()
@click.argument("run_id", metavar="RUN")
@by_option
@click.option("--reason", default="", help="Why it may run again (recorded in its log).")
@store_option
def requeue(run_id: str, by: str, reason: str, store_url: str) -> None:
    """Send a parked (poison) or waiting run back to the workers, its crash count reset.

    An escalated run waits for a person: the requeue is that person's decision, and
    is recorded in its log (with --by and --reason) before a worker takes it.

    \b
    Example:
      agentjournal requeue q3 --reason "fixed the parser it crashed in" --store sqlite:///runs.db
    """
    with queue_at(store_url) as queue:
        if not requeue_run(queue.store, run_id, by=by, reason=reason):
            state = next((r.state for r in queue.runs() if r.run_id == run_id), None)
            if state is None:
                raise CliError(f"run {run_id!r} is not in the queue", 2)
            raise CliError(f"run {run_id!r} is {state}, not parked or waiting: nothing to "
                           "requeue", 2)
    echo(f"requeued {run_id}: a worker will claim it")
