"""Driving runs: run, resume, fork, and the demo."""

from __future__ import annotations

import contextlib
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import click
import msgspec
from rich.text import Text

from .. import (
    Agent,
    JournalError,
    RunMismatchError,
    RunResult,
    Store,
    fork,
    new_run_id,
)
from ..agent import load_agent as load_agent_ref
from ..agent import require_run_id
from ..continuation import INTERRUPTED
from ..errors import AgentRefError
from ..events import EventType
from ..journal import open_journal, stateless
from ..store import validate_run_id
from ..workspace import WorkspaceError
from ._base import (
    ARGS_SHOWN,
    CliError,
    cli,
    exit_for_status,
    how_it_goes_on,
    json_option,
    load,
    note,
    opened,
    out,
    outline_of,
    progress,
    short,
    store_hint,
    store_option,
    table,
)
from ._safe import echo, emit_json

if TYPE_CHECKING:
    from ..demo.run_demo import DemoResult


# --- running ---------------------------------------------------------------------------


def load_agent(ref: str) -> Agent:
    """The Agent named by ``MODULE:OBJECT``, or a CliError saying what is wrong."""
    try:
        return load_agent_ref(ref)
    except AgentRefError as exc:
        raise CliError(str(exc)) from None


def drive(store: Store, agent: Agent, run_id: str, task: str | None, ref: str,
          store_url: str) -> RunResult:
    """Start or resume the run, with a spinner naming the last event on a terminal.
    Ctrl-C stops it paused as interrupted, and says how to resume it."""
    with progress(f"{run_id}: opening") as update:
        try:
            return agent.run(store, run_id, task, agent_ref=ref, observer=stateless(
                lambda e, _s: update(f"{run_id}: seq {e.seq} {e.type.value}")))
        except RunMismatchError as exc:  # refused, like an unknown or leased run
            raise CliError(str(exc), 2) from None
        except KeyboardInterrupt:
            pass
    raise CliError(interrupted(store, run_id, store_url), 130)


def interrupted(store: Store, run_id: str, store_url: str) -> str:
    """Record that Ctrl-C stopped the run (paused: nobody drives it now, and `runs` must
    not say "running"); what to tell the person. The loop let its lease go as it
    unwound; a process that took the run over since is left alone."""
    # (suppressed: another process took the run over, or the store went away)
    with contextlib.suppress(JournalError), open_journal(store, run_id) as journal:
        if journal.state.status == "running":
            journal.record(EventType.RUN_PAUSED, reason=INTERRUPTED)
    state = outline_of(store, run_id)
    in_flight = ", ".join(sorted({p.tool for p in state.pending.values()}))
    settled = (f" (the call in flight, {in_flight}, is settled by its effect's rules when "
               "it resumes)" if in_flight else "")
    return (f"run {run_id} was interrupted at seq {state.last_seq}{settled}; "
            f"{how_it_goes_on(store, run_id, store_url).sentence}")


def result_json(result: RunResult) -> dict[str, Any]:
    return {"run_id": result.run_id, "status": result.status, "last_seq": result.last_seq,
            "outcome": result.outcome, "pause_reason": result.pause_reason,
            "escalation": result.escalation,
            "uncertain": msgspec.to_builtins(result.uncertain),
            "approvals": msgspec.to_builtins(result.approvals)}


def print_result(result: RunResult, store_url: str, as_json: bool) -> None:
    if as_json:
        emit_json(result_json(result))
    else:
        echo(f"run {result.run_id}: {result.status} at seq {result.last_seq}"
             + (f" ({result.pause_reason})" if result.pause_reason else ""))
        if result.status == "finished":
            echo(f"outcome: {short(result.outcome, 200)}")
        for p in result.uncertain:
            echo(f"uncertain: {p.tool} key {p.key[:16]} {short(p.args, 60)} "
                 f"({p.effect}; last error: {p.last_error or '-'})")
        for a in result.approvals:
            echo(f"awaiting approval: {a.approval_id} {a.tool} {short(a.args, ARGS_SHOWN)}")
        if result.escalation:
            echo(f"escalated: {short(result.escalation.get('reason', ''), 200)}")
    for line in next_steps(result, store_hint(store_url)):
        note(line)


def next_steps(result: RunResult, hint: str) -> list[str]:
    """What a person must do before the run can go on."""
    rid = result.run_id
    resume = f"  agentjournal resume {rid}{hint}"
    if result.status == "waiting_approval":
        return ["next: decide, then resume:",
                *(f"  agentjournal approve {rid} {a.approval_id}{hint}   (or deny ... "
                  "--reason TEXT)" for a in result.approvals), resume]
    if result.uncertain:
        return ["next: find out whether each uncertain call took effect, record it, resume:",
                *(f"  agentjournal resolve {rid} {p.key[:16]} --happened | --did-not-happen"
                  f" | --conflict{hint}" for p in result.uncertain), resume]
    if result.status in ("paused", "escalated"):
        return [f"next: see why (agentjournal show {rid}{hint}), fix the cause, then:", resume]
    return []


@cli.command()
@click.argument("ref", metavar="MODULE:OBJECT")
@click.argument("task")
@click.option("--run-id", help="The run's id; the same id (with the same TASK) resumes it. "
              "Omitted: a new run, whose id is printed. An empty id is refused.")
@json_option
@store_option
@click.pass_context
def run(ctx: click.Context, ref: str, task: str, run_id: str | None, as_json: bool,
        store_url: str) -> None:
    """Start a run of the agent MODULE:OBJECT, or resume it if --run-id exists.

    OBJECT is an Agent, or a zero-argument callable returning one; MODULE is
    imported with the current directory on the path, as `python -m` does.
    Exit 0 when the run finished, 4 when it stopped for a person (what to do
    next is printed on stderr).

    \b
    Example:
      agentjournal run myagents:reconciler "Reconcile Q3" --run-id q3
    """
    # Only an omitted --run-id means "a new run": an empty one (RUN_ID="" from a
    # supervisor that lost it) is refused, or it would start the work over.
    run_id = new_run_id() if run_id is None else require_run_id(run_id)  # printed below
    with opened(store_url, create=True) as store:
        result = drive(store, load_agent(ref), run_id, task, ref, store_url)
    print_result(result, store_url, as_json)
    exit_for_status(ctx, result.status)


@cli.command()
@click.argument("run_id", metavar="RUN")
@json_option
@store_option
@click.pass_context
def resume(ctx: click.Context, run_id: str, as_json: bool, store_url: str) -> None:
    """Resume a run with the agent it recorded (its MODULE:OBJECT). Exit 0 when
    it finished, 4 when it stopped for a person, as `run`.

    \b
    Example:
      agentjournal resume q3 --store sqlite:///runs.db
    """
    with opened(store_url) as store:
        _, folded = load(store, run_id)
        if folded.agent is None:
            raise CliError(
                f"run {run_id!r} recorded no agent (it was started without agent_ref). "
                "Resume it with: agentjournal run MODULE:OBJECT "
                f"{shlex.quote(folded.task)} --run-id {run_id}")
        result = drive(store, load_agent(folded.agent), run_id, None, folded.agent,
                       store_url)
    print_result(result, store_url, as_json)
    exit_for_status(ctx, result.status)


@cli.command(name="fork")
@click.argument("run_id", metavar="RUN")
@click.option("--at", type=click.IntRange(min=1), required=True, metavar="SEQ",
              help="Copy events 1..SEQ into the new run.")
@click.option("--new-id", help="The new run's id (default: RUN.fork- and 8 random hex digits).")
@click.option("--force", is_flag=True, help="Restore the workspace of SEQ even if the "
              "directory holds changes no checkpoint of RUN holds.")
@store_option
def fork_cmd(run_id: str, at: int, new_id: str | None, force: bool, store_url: str) -> None:
    """Start a new run from the first SEQ events of RUN; prints the new run's id.

    The fork keeps the origin's idempotency scope: it never repeats an effect
    its prefix recorded. A run with a workspace: its files are restored to their
    version at SEQ for the fork.

    \b
    Example:
      agentjournal fork q3 --at 12 --new-id q3-retry && agentjournal resume q3-retry
    """
    with opened(store_url) as store:
        if new_id is not None and store.last_seq(validate_run_id(new_id)):
            raise CliError(f"run {new_id!r} already exists; choose another --new-id")
        try:
            new = fork(store, run_id, at, new_id, force=force)
        except WorkspaceError as exc:
            raise CliError(str(exc)) from None
        except JournalError:
            raise  # InvalidRunIdError is a ValueError too: keep its exit code
        except ValueError as exc:  # --at beyond the log
            raise CliError(str(exc)) from None
    click.echo(new)
    note(f"forked {run_id} at seq {at} into {new}; resume it with: agentjournal resume {new}"
         f"{store_hint(store_url)}")


# --- the demo --------------------------------------------------------------------------


@cli.command()
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path),
              help="Where the journal and the ledger live (default: a fresh temp dir).")
@click.option("--kill-at", type=click.Choice(["model", "tool", "after-effect", "random"]),
              default="after-effect", show_default=True,
              help="The window the agent process is killed in.")
@click.option("--seed", type=int, help="Seed for --kill-at random (default: a random one).")
@json_option
@click.pass_context
def demo(ctx: click.Context, directory: Path | None, kill_at: str, seed: int | None,
         as_json: bool) -> None:
    """The quarterly reconciliation: kill the agent with SIGKILL, resume it in a new
    process, and ask the ledger how often it applied each correction (once).

    \b
    Example:
      agentjournal demo --kill-at random --seed 7
    """
    from ..demo.run_demo import DemoError, KillAt, run_demo

    with progress("starting the ledger service") as update:
        try:
            result = run_demo(directory, kill_at=cast(KillAt, kill_at), seed=seed,
                              progress=update)
        except DemoError as exc:
            raise CliError(str(exc)) from None
    if as_json:
        emit_json(result)
    else:
        print_demo(result)
    ctx.exit(0 if result.ok else 1)


def print_demo(result: DemoResult) -> None:
    console = out()
    console.print(Text(f"journal {result.store} (run {result.run_id})"))
    console.print("timeline, read from the journal:")
    console.print(table(
        ("seq", "event", "detail"),
        [("-" if step.seq is None else str(step.seq), step.kind, step.detail)
         for step in result.timeline],
        keep=("seq", "event"),
        styles=["bold red" if step.kind == "killed" else None for step in result.timeline]))
    console.print("the ledger service's own count of applied effects:")
    counts = sorted(result.effects.items())
    console.print(table(("correction", "applied"), [(cid, str(n)) for cid, n in counts],
                        keep=("correction",),
                        styles=[None if n == 1 else "bold red" for _, n in counts]))
    if not result.kills:
        console.print("the agent finished before the kill came (kills=0): nothing to resume. "
                      "Try another --seed.")
    kills = f"{result.kills} kill" + ("" if result.kills == 1 else "s")
    seed = f", seed {result.seed}" if result.seed is not None else ""
    if result.ok:
        console.print(Text(f"verdict: exactly once. {len(result.effects)} corrections, each "
                           f"applied once; run {result.status} after {kills} ({result.kill_at}"
                           f"{seed}).", style="bold green"))
    else:
        console.print(Text(f"verdict: FAILED. run {result.status} after {kills}; applied "
                           f"counts {result.effects}", style="bold red"))
    note(f"inspect it: agentjournal show {result.run_id} --store {result.store}")


