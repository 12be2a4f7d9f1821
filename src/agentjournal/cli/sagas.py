"""Stopping and undoing a run: cancel, compensate."""

from __future__ import annotations

import click
import msgspec

from ..saga import SagaResult, cancel, compensate
from ..state import RunState
from ..store import Store
from ..tools import Tool
from ._base import (
    CliError,
    F,
    by_option,
    cli,
    exit_for_status,
    json_option,
    load,
    note,
    opened,
    short,
    store_hint,
    store_option,
)
from ._safe import echo, emit_json
from .running import load_agent


def saga_options(f: F) -> F:
    """--reason, --by and --agent: who undoes a run, why, with which agent's tools."""
    f = click.option("--agent", "agent_ref", metavar="MODULE:OBJECT",
                     help="The agent whose tools undo the effects (default: the one the "
                          "run recorded).")(f)
    return click.option("--reason", default="", help="Why (recorded in the run's log).")(
        by_option(f))


@cli.command(name="compensate")
@click.argument("run_id", metavar="RUN")
@click.option("--through", type=click.IntRange(min=0), default=0, metavar="SEQ",
              help="Undo only the effects completed after this seq (default 0: all).")
@saga_options
@json_option
@store_option
@click.pass_context
def compensate_cmd(ctx: click.Context, run_id: str, through: int, reason: str, by: str,
                   agent_ref: str | None, as_json: bool, store_url: str) -> None:
    """Undo a run's completed effects, newest first, each with its tool's compensate.

    The first call records the plan; calling it again (after a crash, or after you
    settled an uncertain undo with `agentjournal resolve`) goes on with that plan and
    never undoes an effect twice. An effect that cannot be undone stops the saga
    before it. Exit 0 when the saga is done, 4 when it stopped for a person.

    \b
    Example:
      agentjournal compensate q3 --reason "posted to the wrong quarter"
    """
    with opened(store_url) as store:
        result = compensate(store, run_id, _tools(store, run_id, agent_ref).values(),
                            through_seq=through, reason=reason, by=by)
    _report(ctx, result, store_url, as_json)


@cli.command(name="cancel")
@click.argument("run_id", metavar="RUN")
@click.option("--compensate", "and_compensate", is_flag=True,
              help="Then undo its completed effects, as `agentjournal compensate` does.")
@saga_options
@json_option
@store_option
@click.pass_context
def cancel_cmd(ctx: click.Context, run_id: str, and_compensate: bool, reason: str, by: str,
               agent_ref: str | None, as_json: bool, store_url: str) -> None:
    """Stop a run for good: no worker or resume drives it again. With --compensate,
    then undo its effects (exit 4 if the saga stopped for a person).

    
    Example:
      agentjournal cancel q3 --compensate --reason "the customer withdrew the order"
    """
    with opened(store_url) as store:
        tools = _tools(store, run_id, agent_ref) if and_compensate else None
        result = cancel(store, run_id, by=by, reason=reason,
                        compensate_with=None if tools is None else tools.values())
    if result is not None:
        _report(ctx, result, store_url, as_json)
    elif as_json:
        emit_json({"run_id": run_id, "status": "cancelled"})
    else:
        echo(f"run {run_id}: cancelled")


def _tools(store: Store, run_id: str, agent_ref: str | None) -> dict[str, Tool]:
    _, folded = load(store, run_id)
    ref = agent_ref or folded.agent
    if ref is None:
        raise CliError(f"run {run_id!r} recorded no agent: name the one whose tools undo "
                       "its effects with --agent MODULE:OBJECT")
    return load_agent(ref).tools


def _report(ctx: click.Context, result: SagaResult, store_url: str, as_json: bool) -> None:
    if as_json:
        emit_json(msgspec.to_builtins(result))
    else:
        print_saga(result)
        for line in saga_next_steps(result, store_hint(store_url)):
            note(line)
    exit_for_status(ctx, result.status)


def print_saga(result: SagaResult) -> None:
    echo(f"run {result.run_id}: {result.status}; undone {len(result.undone)}, "
         f"left {len(result.remaining)}")
    for line in saga_lines(result):
        echo(line)


def saga_lines(result: SagaResult) -> list[str]:
    """What a saga undid, what waits and what failed, a line each."""
    lines = [f"undone: {key[:16]}" for key in result.undone]
    lines += [f"left to undo: {key[:16]}" for key in result.remaining]
    lines += [f"uncertain undo: {key[:16]}" for key in result.uncertain]
    lines += [f"failed undo: {key[:16]}: {short(error, 100)}"
              for key, error in result.failures.items() if key in result.remaining]
    if result.blocked:
        b = result.blocked
        lines.append(f"cannot be undone: {b['tool']} at seq {b['effect_seq']} ({b['why']})")
    if result.escalation:
        lines.append(f"escalated: {short(result.escalation.get('reason', ''), 200)}")
    return lines


def saga_of(state: RunState) -> SagaResult | None:
    return SagaResult.of(state) if state.saga is not None else None


def saga_next_steps(result: SagaResult, hint: str) -> list[str]:
    rid = result.run_id
    if result.status == "compensated":
        return []
    again = f"  agentjournal compensate {rid}{hint}"
    if result.uncertain:
        return ["next: find out whether each uncertain undo took effect, record it, go on:",
                *(f"  agentjournal resolve {rid} {key[:16]} --happened | --did-not-happen"
                  f"{hint}" for key in result.uncertain), again]
    if result.blocked and not result.remaining:
        return [f"next: undo {result.blocked['tool']} by hand or decide it stays; then this "
                "records that it stands and finishes the saga:", again]
    return [f"next: see why (agentjournal show {rid}{hint}), act on it, then go on:", again]
