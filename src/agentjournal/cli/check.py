"""check: before a deploy, what a resume under the current code would do to each open run."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

from .. import RunMismatchError
from ..check import Checked, inspect_runs, load_trusted
from ..deploys import Forecast
from ..errors import AgentRefError
from ..state import RunState
from ..store import mask_secrets, open_store
from ._base import (
    EXIT_NEEDS_A_PERSON,
    CliError,
    _check_target,
    _report_unreadable,
    cli,
    json_option,
    note,
    out,
    print_fitted,
    store_option,
)
from ._safe import cells, emit_json
from .fleet import _set_import_path

#: `check`'s own code: a run a resume under this code would refuse (its agent or run is
#: strict and its version changed). Above EXIT_NEEDS_A_PERSON (4), which a pause gives.
EXIT_WOULD_REFUSE = 5

CHECK_EXIT_CODES = """\b
check's verdict, for CI to gate a deploy on:
  0  every unfinished run would continue (or there is none)
  4  some run would pause for a person (a call made unusable by the change)
  5  some run would be refused (strict mode, its version changed); this
     wins over 4
  2  the agent ref is refused (not MODULE:OBJECT, a private name, not an
     Agent, a Runnable or a factory of one), or a RUN records another
     agent or does not exist
  3  a run could not be read (the others are still reported)"""

#: What a person reads for each action, in the table and the summary.
SAID = {"continue": "continue", "pause": "pause for a person", "refuse": "refused (strict)",
        "done": "done"}


@contextmanager
def _import_path(dirs: tuple[str, ...]) -> Iterator[None]:
    """The import path a worker given ``--import-path dirs`` has (its working directory
    left off), restored afterwards."""
    saved = sys.path[:]
    try:
        _set_import_path(dirs)
        yield
    finally:
        sys.path[:] = saved


@cli.command(name="check", epilog=CHECK_EXIT_CODES)
@click.argument("run_ids", metavar="[RUN]...", nargs=-1)
@click.option("--agent", "agent_ref", required=True, metavar="MODULE:OBJECT",
              help="The agent as the code to deploy defines it: an Agent, a Pydantic AI or "
              "Agents SDK agent, a compiled LangGraph graph (read, never called), a Runnable, "
              "or a function annotated -> Agent; the runs checked are those recording this "
              "ref (or --recorded-as).")
@click.option("--trust", "trusted", metavar="PREFIX,...",
              help="The modules it may be imported from, as `worker --agents` takes them "
              "(default: the ref's own module).")
@click.option("--import-path", "import_path", multiple=True, metavar="DIR",
              type=click.Path(exists=True, file_okay=False),
              help="A directory to import the agent from (repeatable); as for a worker, the "
              "working directory is not on the import path unless given here.")
@click.option("--recorded-as", "recorded_as", metavar="NAME",
              help="The agent name the runs record, when it is not MODULE:OBJECT: a "
              "framework's agent run outside a worker records its own (pydantic_ai:NAME, "
              "openai-agents:NAME, langgraph; `agentjournal runs --json` shows it).")
@click.option("--strict", is_flag=True, default=None,
              help="Judge each run as a strict resume would (`run(..., strict=True)`): a "
              "changed version is refused. Default: the agent's own strict setting.")
@json_option
@store_option
@click.pass_context
def check(ctx: click.Context, run_ids: tuple[str, ...], agent_ref: str, trusted: str | None,
          import_path: tuple[str, ...], recorded_as: str | None, strict: bool | None,
          as_json: bool, store_url: str) -> None:
    """Say, for every unfinished run of --agent (or each RUN), what resuming it under
    the code now would do: continue (and what changed since the run's version), pause
    for a person (which call, and why), or be refused in strict mode.

    Nothing is written: the store is opened read-only, no lease is taken, no model or
    tool is called, so it is safe against a live store. The agent is imported under a
    worker's trust rules (the ref checked as text first, then only from --trust's
    modules). Finished runs and runs of other agents are counted, not listed.

    \b
    Example (in CI, before deploying):
      agentjournal check --agent myapp.agents:reconciler --import-path . \\
          --store postgresql://reader@db/agents --json | jq '.runs[] | .sentence'
    """
    _check_target(store_url, create=False)
    trust = [p.strip() for p in trusted.split(",")] if trusted else None
    if trust is not None and not all(trust):
        raise click.BadParameter("give module prefixes or whole refs, comma-separated",
                                 param_hint="--trust")
    with _import_path(import_path):
        try:
            agent = load_trusted(agent_ref, trust)
        except ValueError as exc:  # (AgentRefError, or a malformed --trust prefix)
            raise CliError(str(exc), 2) from None
    store = open_store(store_url, readonly=True)
    try:
        checked = inspect_runs(store, agent_ref, agent, run_ids=run_ids or None,
                               strict=strict, recorded_as=recorded_as)
    except (RunMismatchError, AgentRefError) as exc:  # another agent's run; no describer
        raise CliError(str(exc), 2) from None
    finally:
        store.close()
    if as_json:
        emit_json(as_document(checked, store_url))
    else:
        _print(checked, bool(run_ids))
    _report_unreadable(ctx, checked.unreadable)
    ctx.exit(verdict(checked.forecasts))


def verdict(forecasts: list[Forecast]) -> int:
    """The exit code: refused wins over a pause, a pause over going on."""
    actions = {f.action for f in forecasts}
    if "refuse" in actions:
        return EXIT_WOULD_REFUSE
    return EXIT_NEEDS_A_PERSON if "pause" in actions else 0


def run_json(state: RunState, f: Forecast) -> dict[str, Any]:
    return {"run_id": f.run_id, "action": f.action, "status": state.status,
            "versions": list(state.versions), "changes": list(f.changes),
            "calls": [{"call_id": c, "tool": t, "why": why} for c, t, why in f.calls],
            "sentence": f.sentence}


def as_document(checked: Checked, store_url: str) -> dict[str, Any]:
    counts = {action: 0 for action in ("continue", "pause", "refuse")}
    for f in checked.forecasts:
        counts[f.action] = counts.get(f.action, 0) + 1
    return {"agent": checked.agent_ref, "version": checked.shape.version,
            "store": mask_secrets(store_url), "runs": [run_json(s, f) for s, f in checked.runs],
            "counts": counts, "finished": checked.finished,
            "other_agents": checked.other_agents,
            "unreadable": [str(exc) for exc in checked.unreadable],
            "exit_code": 3 if checked.unreadable else verdict(checked.forecasts)}


def _why(f: Forecast) -> str:
    """What a person needs of a forecast in one cell: the calls a person must settle,
    else what changed (a refusal says both what and why in its sentence)."""
    if f.calls:
        return "; ".join(f"{tool}: {why}" for _, tool, why in f.calls)
    if f.action == "continue":
        return f"changed: {'; '.join(f.changes)}" if f.changes else "nothing changed"
    return f.sentence


def _print(checked: Checked, named: bool) -> None:
    rows = [(f.run_id, state.status, SAID.get(f.action, f.action), _why(f))
            for state, f in checked.runs]
    if rows:
        print_fitted(out(), ("run", "status", "would", "why"), cells(rows), drop=("status",),
                     keep=("run",))
    said = ", ".join(f"{n} {SAID[a]}" for a in ("continue", "pause", "refuse")
                     if (n := sum(f.action == a for f in checked.forecasts)))
    aside = "" if named else "".join(
        f"; {n} {what} not checked" for n, what in (
            (checked.finished, "finished"), (checked.other_agents, "of other agents"))
        if n)
    note(f"{len(checked.runs)} {'run' if named else 'unfinished run'}(s) of "
         f"{checked.agent_ref} under version {checked.shape.version}"
         f"{': ' + said if said else ''}{aside}")
