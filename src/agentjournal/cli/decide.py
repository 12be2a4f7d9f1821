"""A person's decisions: approvals, approve, deny, uncertain, resolve."""

from __future__ import annotations

import json
from typing import Any, cast

import click
import msgspec

from ..continuation import Continuation
from ..decisions import Decision, Outcome, record_approval, record_resolution
from ..summaries import summary
from ._base import (
    ARGS_SHOWN,
    _report_unreadable,
    advise_if_unprojected,
    age,
    by_option,
    cli,
    fits,
    how_it_goes_on,
    human_age,
    json_option,
    note,
    opened,
    out,
    outlines_of,
    print_fitted,
    short,
    store_option,
)
from ._safe import cells, echo, emit_json

# --- decisions -------------------------------------------------------------------------


def print_decision(decision: Decision, after: Continuation, as_json: bool) -> None:
    """The events that record the decision; a repeat says it already stood; then how
    the run goes on (``after``). With --json, the events either way, so a retried script
    reads what the first attempt printed."""
    if as_json:
        emit_json([msgspec.to_builtins(e) for e in decision.events])
        return
    if not decision.appended:
        for e in decision.events:
            echo(f"already decided the same way: seq {e.seq} {e.type.value}: {summary(e)}")
        echo("nothing was appended")
        return
    for e in decision.events:
        echo(f"appended seq {e.seq} {e.type.value}: {summary(e)}")
    echo(f"next: {after.sentence}")


@cli.command()
@json_option
@store_option
@click.pass_context
def approvals(ctx: click.Context, as_json: bool, store_url: str) -> None:
    """List pending approvals across runs, oldest first.

    \b
    Example:
      agentjournal approvals --json | jq '.[] | select(.age_s > 3600)'
    """
    with opened(store_url) as store:
        advise_if_unprojected(store, store_url)
        states, errors = outlines_of(store, attention=True)  # (the runs with one open)
    rows: list[dict[str, Any]] = sorted(({
        "run_id": s.run_id, "approval_id": a.approval_id, "tool": a.tool, "args": a.args,
        "reason": a.reason, "requested_seq": a.requested_seq, "requested_at": a.requested_at,
        "age_s": age(a.requested_at),
    } for s in states.values() for a in s.approvals.values()), key=lambda r: -r["age_s"])
    if as_json:
        emit_json(rows)
    elif not rows:
        note("no pending approvals")
    else:
        print_approvals(rows)
        note("decide with: agentjournal approve RUN APPROVAL_ID  (or deny ... --reason TEXT)")
    _report_unreadable(ctx, errors)


def print_approvals(rows: list[dict[str, Any]]) -> None:
    """A table when it fits whole; else one block per approval, its arguments on a line of
    their own: what a person approves is never cut to fit a narrow terminal."""
    headers = ("run", "approval", "tool", "args", "reason", "age")
    shown = cells((r["run_id"], r["approval_id"], r["tool"], short(r["args"], ARGS_SHOWN),
                   r["reason"], human_age(r["age_s"])) for r in rows)
    if fits(out(), headers, shown):
        print_fitted(out(), headers, shown, drop=())
        return
    for run_id, approval_id, tool, args, reason, waited in shown:
        echo(f"{run_id}  {approval_id}  {tool}  (waiting {waited})")
        echo(f"  args: {args}")
        echo(f"  reason: {reason}")


def _decide(run_id: str, approval_id: str, *, approved: bool, by: str, reason: str,
            store_url: str, as_json: bool) -> None:
    with opened(store_url) as store:
        decision = record_approval(store, run_id, approval_id, approved=approved, by=by,
                                   reason=reason)
        after = how_it_goes_on(store, run_id, store_url)
    print_decision(decision, after, as_json)


@cli.command()
@click.argument("run_id", metavar="RUN")
@click.argument("approval_id")
@by_option
@click.option("--reason", default="", help="Why (recorded in the event).")
@json_option
@store_option
def approve(run_id: str, approval_id: str, by: str, reason: str, as_json: bool,
            store_url: str) -> None:
    """Approve a pending call; the run makes it when resumed.

    \b
    Example:
      agentjournal approve q3 approval-1f2e3d4c5b6a7980 --reason "checked the amount"
    """
    _decide(run_id, approval_id, approved=True, by=by, reason=reason, store_url=store_url,
            as_json=as_json)


@cli.command()
@click.argument("run_id", metavar="RUN")
@click.argument("approval_id")
@click.option("--reason", required=True, help="Why (the model sees it).")
@by_option
@json_option
@store_option
def deny(run_id: str, approval_id: str, reason: str, by: str, as_json: bool,
         store_url: str) -> None:
    """Deny a pending call; the model is told why when the run resumes.

    \b
    Example:
      agentjournal deny q3 approval-1f2e3d4c5b6a7980 --reason "over the limit"
    """
    _decide(run_id, approval_id, approved=False, by=by, reason=reason, store_url=store_url,
            as_json=as_json)


@cli.command()
@json_option
@store_option
@click.pass_context
def uncertain(ctx: click.Context, as_json: bool, store_url: str) -> None:
    """List open uncertain calls across runs: started, never completed, effect unknown.
    Undos of a saga whose outcome is unknown are listed beside them (kind "compensation").

    \b
    Example:
      agentjournal uncertain --json | jq '.[] | select(.risk == "irreversible")'
    """
    with opened(store_url) as store:
        advise_if_unprojected(store, store_url)
        states, errors = outlines_of(store, attention=True)  # (the runs with one open)
    rows: list[dict[str, Any]] = sorted(({
        "run_id": s.run_id, "run_status": s.status, "tool": p.tool, "key": p.key,
        "kind": "compensation" if p.effect == "compensation" else "call",
        "args": p.args, "risk": p.effect, "attempt": p.attempt, "started_seq": p.started_seq,
        "started_at": p.started_at, "age_s": age(p.started_at), "last_error": p.last_error,
    } for s in states.values() for p in s.pending.values()), key=lambda r: -r["age_s"])
    if as_json:
        emit_json(rows)
    elif not rows:
        note("no uncertain calls")
    else:
        print_fitted(out(), ("run", "kind", "tool", "key", "age", "risk", "last error"),
                     cells((r["run_id"], r["kind"], r["tool"], r["key"][:16],
                            human_age(r["age_s"]), r["risk"], short(r["last_error"] or "-", 60))
                           for r in rows),
                     drop=("last error", "age", "kind"), keep=("run", "key", "risk"))
        oldest: dict[str, float] = {}
        for r in rows:  # rows are oldest first
            oldest.setdefault(r["risk"], r["age_s"])
        echo(f"{len(rows)} open; oldest by risk class: " + ", ".join(
            f"{risk} {human_age(a)}" for risk, a in sorted(oldest.items())), err=True)
        note("settle with: agentjournal resolve RUN KEY --happened | --did-not-happen | "
             "--conflict")
    _report_unreadable(ctx, errors)


def parse_result(text: str | None) -> Any:
    if text is None:
        return None

    def refuse(constant: str) -> Any:
        raise ValueError(f"{constant} is not JSON")

    try:
        return json.loads(text, parse_constant=refuse)
    except ValueError as exc:
        raise click.UsageError(f"--result is not valid JSON ({exc}); "
                               """e.g. --result '{"applied_id": 7}'""") from None


def _outcome(happened: bool, did_not_happen: bool, conflict: bool) -> Outcome:
    chosen = [name for name, flag in (("happened", happened),
                                      ("did_not_happen", did_not_happen),
                                      ("conflict", conflict)) if flag]
    if len(chosen) != 1:
        raise click.UsageError("give exactly one of --happened, --did-not-happen, --conflict")
    return cast(Outcome, chosen[0])


@cli.command()
@click.argument("run_id", metavar="RUN")
@click.argument("key")
@click.option("--happened", is_flag=True, help="The effect took place.")
@click.option("--result", metavar="JSON", help="With --happened: what the call returned.")
@click.option("--did-not-happen", is_flag=True, help="It did not: retry with the same key.")
@click.option("--conflict", is_flag=True, help="Something else happened: escalate.")
@by_option
@click.option("--reason", default="", help="How you know (recorded in the event).")
@json_option
@store_option
def resolve(run_id: str, key: str, happened: bool, result: str | None, did_not_happen: bool,
            conflict: bool, by: str, reason: str, as_json: bool, store_url: str) -> None:
    """Record what a person established about an uncertain call (KEY or a prefix of it).

    \b
    Example:
      agentjournal resolve q3 1a2b3c4d --happened --result '{"applied_id": 7}' \\
          --reason "found it in the ledger UI"
    """
    if not key:
        raise click.UsageError("KEY must not be empty: give the call's key or a prefix of it")
    outcome = _outcome(happened, did_not_happen, conflict)
    if result is not None and outcome != "happened":
        raise click.UsageError("--result goes with --happened only")
    value = parse_result(result)
    with opened(store_url) as store:
        decision = record_resolution(store, run_id, key, outcome=outcome, by=by,
                                     reason=reason, result=value)
        after = how_it_goes_on(store, run_id, store_url)
    print_decision(decision, after, as_json)


