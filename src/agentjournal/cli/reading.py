"""Reading runs: runs, show, events, state, verify. Reading never writes.

Everything printed for people goes through ``_safe`` (``visible``, ``cells``,
``echo``; JSON through its ``emit_json``): a run's content is shown, never executed.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
import msgspec
from rich.console import Console
from rich.text import Text

from .. import (
    CorruptLogError,
    Event,
    JournalError,
    RunNotFoundError,
    RunState,
    encode,
)
from ..continuation import Continuation, was_interrupted
from ..events import now
from ..fleet import QueuedRun
from ..integrations._graphlog import thread_run, thread_view
from ..integrations._graphviews import check_thread_index, rebuild_thread_index
from ..snapshots import VerifyReport
from ..snapshots import verify as verify_run
from ..store import RunInfo, Store, mask_secrets
from ..store.base import missing_run
from ..summaries import (
    calls_line,
    count,
    is_stalled,
    latest_version,
    request_changes,
    span,
    status_said,
    status_word,
    summaries,
    version_line,
)
from ._base import (
    RUN_STATUSES,
    CliError,
    _fail,
    _report_unreadable,
    advise_if_unprojected,
    age,
    cli,
    continuation_of,
    exit_code_for,
    human_age,
    json_option,
    load,
    local_time,
    note,
    opened,
    out,
    print_fitted,
    queue_place,
    queued_runs,
    short,
    store_hint,
    store_option,
    table,
)
from ._safe import cells, echo, emit_json, json_text, visible
from ._usage import (
    cost_text,
    run_usage,
    seconds_between,
    totals,
    usage_line,
)
from .sagas import saga_lines, saga_of

# --- inspection ------------------------------------------------------------------------


def run_row(info: RunInfo, state: RunState, queued: QueuedRun | None, *,
            stalled: bool = False) -> dict[str, Any]:
    return {
        "run_id": info.run_id, "status": state.status, "events": info.last_seq,
        "started": info.created_at, "last_activity": info.updated_at,
        "uncertain": len(state.pending), "approvals": len(state.approvals),
        "agent": state.agent, "versions": list(state.versions),
        "pause_reason": state.pause_reason,
        "interrupted": was_interrupted(state), "stalled": stalled,
        "queue": queue_place(queued),
        **totals(state, seconds_between(info.created_at, info.updated_at)),
    }


def shown_status(row: dict[str, Any]) -> str:
    """A `runs` row's status, as ``status_word`` says it."""
    return status_word(str(row["status"]), interrupted=row["interrupted"],
                       stalled=row["stalled"])


def queued_row(entry: QueuedRun) -> dict[str, Any]:
    """A run in the queue that has no events yet: its status is its state there."""
    return {
        "run_id": entry.run_id, "status": entry.state, "events": 0, "started": None,
        "last_activity": datetime.fromtimestamp(entry.changed_at, UTC), "uncertain": 0,
        "approvals": 0, "agent": entry.agent, "versions": [], "pause_reason": None,
        "interrupted": False,
        "stalled": False,
        "queue": queue_place(entry), **totals(RunState(), None),
    }


class Listing(msgspec.Struct):
    """The runs `runs` shows, newest first, and what it left out."""

    rows: list[dict[str, Any]]
    errors: list[JournalError]  # runs that could not be read
    total: int  # every run in the store, shown or not
    more: bool  # runs past the limit were not looked at


#: Runs whose outlines one read asks for when `runs --status` filters (the rows that
#: match are not known before their outlines are read).
PAGE = 1000


def newest_runs(store: Store, status: str | None, limit: int | None) -> Listing:
    """Up to ``limit`` runs with ``status``, newest first: the runs with events and the
    submitted ones that have none yet. Each row is read from the run's outline, one
    read of the store for the runs shown (no log is folded where outlines are kept), so
    listing the newest of many is as fast as listing a few."""
    queued = queued_runs(store)
    infos = store.list_runs()
    have_events = {i.run_id for i in infos}
    waiting = [q for q in queued.values() if q.run_id not in have_events]
    candidates: list[RunInfo | QueuedRun] = [*infos, *waiting]
    candidates.sort(key=_last_activity, reverse=True)
    listing = Listing(rows=[], errors=[], total=len(candidates), more=False)
    size = len(candidates) if limit is None else limit if status is None else max(limit, PAGE)
    for start in range(0, len(candidates), max(size, 1)):
        page = candidates[start:start + size]
        found = store.outlines([c.run_id for c in page if not isinstance(c, QueuedRun)])
        for candidate in page:
            if limit is not None and len(listing.rows) == limit:
                listing.more = True
                return listing
            row = _row(store, candidate, found, queued)
            if isinstance(row, JournalError):
                listing.errors.append(row)
            elif row is not None and (status is None or row["status"] == status):
                listing.rows.append(row)
    return listing


def _row(store: Store, candidate: RunInfo | QueuedRun,
         found: dict[str, RunState | JournalError], queued: dict[str, QueuedRun]
         ) -> dict[str, Any] | JournalError | None:
    """``runs``' row for ``candidate`` from its outline in ``found``: the error when its
    log cannot be read, None when it went since it was listed."""
    if isinstance(candidate, QueuedRun):
        return queued_row(candidate)
    state = found.get(candidate.run_id)
    if state is None or isinstance(state, JournalError):
        return state
    entry = queued.get(candidate.run_id)
    stalled = is_stalled(store, candidate.run_id, state, entry)
    return run_row(candidate, state, entry, stalled=stalled)


def _last_activity(run: RunInfo | QueuedRun) -> datetime:
    if isinstance(run, QueuedRun):
        return datetime.fromtimestamp(run.changed_at, UTC)
    return run.updated_at or datetime.min.replace(tzinfo=UTC)


#: How many runs `runs` shows unless told otherwise (newest first).
DEFAULT_LIMIT = 50
#: Columns `runs` leaves out on a narrow terminal, first to last: what needs a person
#: (open approvals and uncertain calls) goes last, after what only describes a run.
RUNS_DROP = ("started", "events", "tokens in/out", "duration", "cost", "last activity",
             "approvals", "uncertain")


@cli.command()
@click.option("--status", type=click.Choice(RUN_STATUSES),
              help="Only runs with this status (queued: submitted, not started yet).")
@click.option("--limit", type=click.IntRange(min=1), default=DEFAULT_LIMIT, show_default=True,
              metavar="N", help="Show the newest N runs.")
@click.option("--all", "all_runs", is_flag=True, help="Show every run (no --limit).")
@json_option
@store_option
@click.pass_context
def runs(ctx: click.Context, status: str | None, limit: int, all_runs: bool, as_json: bool,
         store_url: str) -> None:
    """List runs, newest first: status, events, start, last activity, open uncertain
    calls and approvals, tokens, cost and duration. Runs submitted to the queue are
    listed before a worker starts them (status queued). A narrow terminal shows fewer
    columns; --json has every field.

    \b
    Example:
      agentjournal runs --status paused --limit 20 --store sqlite:///runs.db
    """
    with opened(store_url) as store:
        advise_if_unprojected(store, store_url)
        listing = newest_runs(store, status, None if all_runs else limit)
    rows = listing.rows
    if as_json:
        emit_json(rows)
    elif not rows:
        note(f"no runs{f' with status {status}' if status else ''} in {store_url}")
    else:
        # The version a run goes on under: a column only once some run recorded one.
        versioned = any(r["versions"] for r in rows)
        print_fitted(out(), (
            "run", "status", "events", "started", "last activity", "uncertain", "approvals",
            "tokens in/out", "cost", "duration", *(("version",) if versioned else ())), cells(
            (r["run_id"], shown_status(r),
             str(r["events"]), local_time(r["started"]),
             human_age(age(r["last_activity"])) + " ago", str(r["uncertain"]),
             str(r["approvals"]), f"{count(r['input_tokens'])}/{count(r['output_tokens'])}",
             cost_text(r["turns"], r["cost_usd"], r["unpriced_turns"]),
             span(r["duration_s"]), *((latest_version(r["versions"]),) if versioned else ()))
            for r in rows), drop=(("version",) if versioned else ()) + RUNS_DROP,
            keep=("run",))
    if listing.more:
        shown = (f"the newest {len(rows)} runs with status {status} (of {listing.total} in "
                 "all; more may match)" if status else
                 f"the newest {len(rows)} of {listing.total} runs")
        note(f"{shown}; more with --limit N or --all")
    _report_unreadable(ctx, listing.errors)


@cli.command()
@click.argument("run_id", metavar="RUN")
@click.option("--at", type=click.IntRange(min=1), metavar="SEQ",
              help="Show the folded state as of this event (time travel).")
@json_option
@store_option
def show(run_id: str, at: int | None, as_json: bool, store_url: str) -> None:
    """Show a run's timeline, one event a line; with --at, its state as of that event.
    RUN may be a LangGraph thread id: its run's checkpoints and writes are shown too.

    \b
    Example:
      agentjournal show q3 --at 12    # what the run knew (and the model saw) at seq 12
    """
    with opened(store_url) as store:
        queued = queued_runs(store).get(run_id)
        if queued is not None and not store.last_seq(run_id):
            # submitted, not started yet
            print_queued(queued, store_url, as_json, continuation_of(
                store, RunState(run_id=run_id, agent=queued.agent), None, queued, store_url))
            return
        run_id = thread_run(store, run_id) or run_id
        events, state = load(store, run_id, at)
        stalled = at is None and is_stalled(store, run_id, state, queued)
        how = None if at is not None else _next(store, events, state, queued, stalled,
                                                store_url)
    saga = saga_of(state)
    thread = thread_view(events)
    if as_json:
        emit_json({"run_id": run_id, "at": at, "state": state, "saga": saga, "thread": thread,
                   "versions": {"started_by": state.versions[0] if state.versions else None,
                                "continued_by": state.versions[1:]},
                   "request_changes": request_changes(events),
                   "queue": queue_place(queued), "usage": run_usage(state, events),
                   "interrupted": was_interrupted(state), "stalled": stalled, "next": how,
                   "events": [{**msgspec.to_builtins(e), "summary": line}
                              for e, line in zip(events, summaries(events), strict=True)]})
    elif at is None:
        print_timeline(run_id, events, state, stalled=stalled)
        if thread is not None:
            print_thread(thread)
        if queued is not None:
            echo(f"in queue {queued.queue!r}: {queued.state}{_held_by(queued)}")
        if how is not None:
            echo(f"next: {how.sentence}")
    else:
        print_state(state)


def _next(store: Store, events: list[Event], state: RunState, queued: QueuedRun | None,
          stalled: bool, store_url: str) -> Continuation | None:
    """How the run goes on, when that is the next step: None for a run that ended, that
    a live process drives now (recorded as running, its lease held, outside a queue),
    or that waits for a person's decision first (its timeline shows on what)."""
    driven = state.status in ("running", "new") and not stalled and (
        queued is None or queued.state == "done")
    asks = (state.status == "waiting_approval" or bool(state.approvals)
            or state.waits_for_a_person  # (an escalation a person decided on goes on)
            or any(p.last_error is not None for p in state.pending.values()))  # uncertain
    how = continuation_of(store, state, events[0].payload, queued, store_url)
    return None if driven or asks or how.kind == "done" else how


def print_thread(thread: dict[str, Any]) -> None:
    """A LangGraph thread's checkpoints, below its timeline."""
    latest = thread["latest"]
    where = ("no checkpoint yet" if latest is None else
             f"latest checkpoint {latest['id']} (step {latest['step']}, {latest['source']}, "
             f"seq {latest['seq']}), pending writes: {', '.join(latest['pending_writes']) or '-'}")
    lines = [f"LangGraph thread {thread['thread_id']}: {thread['checkpoints']} checkpoint(s) in "
             f"{len(thread['namespaces'])} namespace(s), {thread['writes']} write(s), "
             f"{thread['stored_value_bytes']} bytes of values", f"  {where}"]
    if thread["input_not_yet_checkpointed"]:
        lines.append("  an input is recorded that no checkpoint holds yet: "
                     "resuming the thread runs it")
    for line in lines:
        out().print(Text(visible(line)), no_wrap=True, overflow="ellipsis")


def _held_by(entry: QueuedRun) -> str:
    held = f", held by worker {entry.worker}" if entry.worker else ""
    return f"{held} (why: {entry.reason})" if entry.reason else held


def print_queued(entry: QueuedRun, store_url: str, as_json: bool,
                 how: Continuation) -> None:
    """A submitted run no worker has started: where it waits, for what, and (``how``)
    what continues it."""
    if as_json:
        emit_json({"run_id": entry.run_id, "at": None, "state": None, "saga": None,
                   "queue": {**msgspec.to_builtins(entry), "name": entry.queue},
                   "next": how, "events": []})
        return
    waited = human_age(age(datetime.fromtimestamp(entry.submitted_at, UTC)))
    echo(f"run {entry.run_id}: {entry.state} in queue {entry.queue!r} of "
         f"{mask_secrets(store_url)}, submitted {waited} ago, agent {entry.agent}"
         f"{_held_by(entry)}; no events yet")
    if entry.state == "queued":
        module = entry.agent.partition(":")[0]
        note(f"a worker that trusts its agent starts it: agentjournal worker --agents "
             f"{module} --queue {entry.queue}{store_hint(store_url)}")
    else:  # (held by a worker, or parked: requeue hands it back)
        echo(f"next: {how.sentence}")


def print_timeline(run_id: str, events: list[Event], state: RunState, *,
                   stalled: bool = False) -> None:
    # Plain lines, cut at the terminal's width: one event is always one line (a newline
    # in content is made visible, so it cannot start another).
    console = out()
    # (a run from before versions were recorded says nothing of them)
    versions = f"; {version_line(state.versions)}" if state.versions else ""
    console.print(Text(visible(f"run {run_id}: {status_said(state, stalled=stalled)}, "
                               f"{len(events)} events{versions}"),
                       style="bold"))
    console.print(Text(usage_line(state, events)), no_wrap=True, overflow="ellipsis")
    width = max(len(e.type.value) for e in events)
    for e, said in zip(events, summaries(events), strict=True):
        line = (f"{e.seq:>5}  {local_time(e.ts, '%H:%M:%S.%f')[:-3]}  "
                f"{e.type.value:<{width}}  {said}")
        console.print(Text(visible(line)), no_wrap=True, overflow="ellipsis")
    _print_saga(console, state)


def _print_saga(console: Console, state: RunState) -> None:
    saga = saga_of(state)
    if saga is not None:
        console.print(Text(visible(f"saga: {saga.status}, undone {len(saga.undone)}, "
                                   f"left {len(saga.remaining)}"), style="bold"))
        for line in saga_lines(saga):
            console.print(Text(visible(f"  {line}")), no_wrap=True, overflow="ellipsis")


def print_state(state: RunState) -> None:
    console = out()
    console.print(Text(visible(f"run {state.run_id} as of seq {state.last_seq}: "
                               f"{state.status}"
                               + (f" ({state.pause_reason})" if state.pause_reason else ""))))
    console.print(Text(visible(f"task: {state.task}", multiline=True)))
    if state.escalation:
        console.print(Text(visible(f"escalated: {short(state.escalation, 200)}")))
    _print_rows(console, "messages (the model's context)", ("seq", "role", "trust", "content"),
                [(str(m.seq), m.role, m.trust,
                  " → ".join(filter(None, [short(m.content),
                                           calls_line(msgspec.to_builtins(m.tool_calls))])))
                 for m in state.messages])
    _print_saga(console, state)
    _print_rows(console, "completed calls", ("key", "seq", "source"),
                [(k[:16], str(c.seq), c.source) for k, c in state.completed.items()])
    _print_rows(console, "uncertain calls", ("key", "tool", "args", "effect", "last error"),
                [(p.key[:16], p.tool, short(p.args, 50), p.effect, p.last_error or "-")
                 for p in state.pending.values()])
    _print_rows(console, "pending approvals", ("approval", "tool", "args", "reason"),
                [(a.approval_id, a.tool, short(a.args, 50), a.reason)
                 for a in state.approvals.values()])


def _print_rows(console: Console, title: str, header: Sequence[str],
                rows: list[tuple[str, ...]]) -> None:
    if not rows:
        console.print(f"{title}: none")
        return
    console.print(table(header, cells(rows), keep=("key", "approval", "role", "trust"),
                        title=title))


@cli.command()
@click.argument("run_id", metavar="RUN")
@click.option("--after", type=click.IntRange(min=0), default=0, metavar="SEQ",
              help="Only events after this seq.")
@store_option
def events(run_id: str, after: int, store_url: str) -> None:
    """Print a run's events as JSON Lines, one canonical event a line. RUN may be a
    LangGraph thread id.

    \b
    Example:
      agentjournal events q3 | jq -c 'select(.type == "tool_call_reconciled")'
    """
    with opened(store_url) as store:
        run_id = thread_run(store, run_id) or run_id
        printed = 0
        for event in store.read(run_id, after_seq=after):
            # The canonical line, with characters a terminal would act on spelt \uXXXX
            # (the same JSON value): `events` is often read on a terminal too.
            click.echo(json_text(encode(event)))
            printed += 1
        if not printed and store.last_seq(run_id) == 0:
            raise missing_run(store, run_id)


@cli.command()
@click.argument("run_id", metavar="RUN")
@click.option("--at", type=click.IntRange(min=1), metavar="SEQ",
              help="Fold only the events up to this seq.")
@click.option("--json", "as_json", is_flag=True, default=True,
              help="Print JSON (the default; state is always JSON).")
@store_option
def state(run_id: str, at: int | None, as_json: bool, store_url: str) -> None:
    """Print a run's folded state as JSON (with ``saga_status`` once it is compensated:
    the effects undone, left and uncertain, and the undos that failed).

    \b
    Example:
      agentjournal state q3 --at 12 --json | jq .pending
    """
    with opened(store_url) as store:
        _, folded = load(store, run_id, at)
    saga = saga_of(folded)  # what was undone, what is left, what failed: said, not derived
    emit_json(folded if saga is None else {**msgspec.to_builtins(folded), "saga_status": saga})


@cli.command()
@click.argument("run_id", metavar="RUN", required=False)
@click.option("--all", "all_runs", is_flag=True, help="Verify every run in the store.")
@click.option("--heads", "heads_file", type=click.Path(dir_okay=False), metavar="FILE",
              help="Export each run's head (its last seq and digest) to FILE, or, when FILE "
              "exists, check that every run still holds the head FILE recorded.")
@json_option
@store_option
@click.pass_context
def verify(ctx: click.Context, run_id: str | None, all_runs: bool, heads_file: str | None,
           as_json: bool, store_url: str) -> None:
    """Check every event's digest chain and each run's head (the seq and digest its log
    ends with, kept apart from the log), that the fold is deterministic at every
    prefix, and that every snapshot plus its tail equals a full replay. A damaged log
    (exit 3) is reported with the first seq that does not check out; a snapshot
    mismatch quarantines that fold version (exit 3). With --all, every run is checked
    even when one fails.

    The store's own record of its heads is checked too: records written by a release
    that keeps heads, in a store whose heads (or its record of them) were removed, are
    damage (exit 3). Still, someone who rewrites a whole log and its head is caught
    only by a copy of the heads kept elsewhere, the anchor. --heads FILE writes one
    (JSON: run -> {seq, digest}; only when every run checked out is it worth keeping:
    exit 0); given an existing FILE, it checks that the event at each recorded seq
    still has the recorded digest (exit 3 if not; a run archived since is noted, not
    failed). Export on a schedule (cron) to a place the store's writers cannot change,
    checking against the newest copy first (docs/architecture.md, "The digest chain").

    \b
    Examples:
      agentjournal verify --all --store sqlite:///runs.db
      agentjournal verify --all --heads /audit/heads-2026-12-03T09.json  # the last copy
      agentjournal verify --all --heads /audit/heads-$(date -u +%Y-%m-%dT%H).json
    """
    if (run_id is None) == (not all_runs):
        raise click.UsageError("give either a RUN or --all")
    reports: list[VerifyReport] = []
    errors: list[JournalError] = []  # runs that could not be checked at all (--all only)
    heads: dict[str, str | None] = {}  # run -> what is wrong with its head (None: fine)
    views: dict[str, list[str]] = {}  # run -> how its views differ from its log
    with opened(store_url) as store:
        if run_id is not None:  # a LangGraph thread id too, as show and events take it
            with contextlib.suppress(CorruptLogError):  # (a damaged run: reported below)
                run_id = thread_run(store, run_id) or run_id
        ids = [run_id] if run_id is not None else [i.run_id for i in store.list_runs()]
        for rid in ids:
            try:
                reports.append(verify_run(store, rid))
                if found := check_thread_index(store, rid):  # a LangGraph thread's head
                    views[rid] = found
                    rebuild_thread_index(store, rid)  # (never served again)
            except JournalError as exc:
                if run_id is not None:
                    raise
                errors.append(exc)
        if heads_file is not None:
            heads = _export_or_check_heads(store, Path(heads_file), run_id)
    for report in reports:
        if not report.events and report.corrupt_seq is None:
            raise RunNotFoundError(report.run_id)
    if not reports and not errors:
        note(f"no runs in {store_url}")
    if as_json:
        emit_json([{**msgspec.to_builtins(r),
                    "ok": r.ok and not heads.get(r.run_id) and r.run_id not in views,
                    **({"head": heads.get(r.run_id) or "ok"} if r.run_id in heads else {}),
                    **({"views": views[r.run_id]} if r.run_id in views else {})}
                   for r in reports]
                  + [{"run_id": e.run_id, "ok": False, "error": str(e)} for e in errors]
                  + [{"run_id": rid, "ok": False, "head": problem} for rid, problem
                     in heads.items() if problem and rid not in {r.run_id for r in reports}])
    else:
        _print_verdicts(reports)
    codes = _verify_failures(reports, errors)
    codes += [_fail(f"{rid}: {problem}", 3) for rid, problem in heads.items() if problem]
    codes += [_fail(f"{rid}: {line}; the view was rebuilt from the log", 3)
              for rid, lines in views.items() for line in lines]
    if codes:
        ctx.exit(max(codes))


def _export_or_check_heads(store: Store, path: Path, run_id: str | None) -> dict[str, str | None]:
    """Write the store's heads to ``path`` (a new file), or check the store against the
    heads ``path`` holds: each run's problem, None where its head checks out."""
    if not path.exists():
        heads = store.heads()
        if run_id is not None:
            heads = {r: h for r, h in heads.items() if r == run_id}
        path.write_text(json.dumps({"store": store.url, "exported_at": now().isoformat(),
                                    "heads": {r: {"seq": seq, "digest": digest}
                                              for r, (seq, digest) in heads.items()}},
                                   indent=2) + "\n")
        note(f"wrote the heads of {len(heads)} runs to {path}")
        return {}
    try:
        recorded = json.loads(path.read_text())["heads"]
        expected = {r: (int(h["seq"]), str(h["digest"])) for r, h in recorded.items()}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CliError(f"{path} is not a heads file written by `verify --heads` ({exc})",
                       2) from None
    if run_id is not None:
        expected = {r: h for r, h in expected.items() if r == run_id}
    problems = {r: _head_problem(store, r, *head) for r, head in expected.items()}
    note(f"{sum(p is None for p in problems.values())} of {len(problems)} runs hold the "
         f"heads {path} recorded")
    return problems


def _head_problem(store: Store, run_id: str, seq: int, digest: str) -> str | None:
    """What is wrong with ``run_id`` against the head (seq, digest) recorded elsewhere:
    the event at ``seq`` must still carry ``digest`` (the log may have grown since)."""
    try:
        event = next(iter(store.read(run_id, after_seq=seq - 1)), None)
    except JournalError as exc:
        return str(exc)
    if event is None:
        stone = store.tombstone(run_id)
        if stone is not None:
            note(f"{run_id}: archived to {stone.archive} since the heads were recorded")
            return None
        return f"the log no longer reaches seq {seq}, where its recorded head is"
    if event.seq != seq or event.digest != digest:
        return (f"the event at seq {seq} has digest {event.digest or '(none)'}, not the "
                f"recorded {digest}: the log was rewritten since the heads were recorded")
    return None


def _print_verdicts(reports: Sequence[VerifyReport]) -> None:
    for r in reports:
        if r.corrupt_seq is not None:
            echo(f"{r.run_id}: CORRUPT at seq {r.corrupt_seq} (snapshots not checked)")
            continue
        verdict = "ok" if r.ok else f"{len(r.mismatches)} MISMATCHES"
        echo(f"{r.run_id}: {verdict} ({r.events} events, {r.snapshots_checked} snapshots)")
        for m in r.mismatches:
            echo(f"  {m.check} at seq {m.seq}: {', '.join(m.fields)}")


def _verify_failures(reports: Sequence[VerifyReport],
                     errors: Sequence[JournalError]) -> list[int]:
    """Print one error line per failure; their exit codes."""
    # (_fail shows what damage quotes of the damaged bytes, never executes it.)
    codes = [_fail(f"{r.run_id}: the log is corrupt at seq {r.corrupt_seq}: {r.corrupt}. "
                   "The log was not changed. Restore it from a backup or inspect it by hand; "
                   "agentjournal will not resume a run from a damaged log.", 3)
             for r in reports if r.corrupt_seq is not None]
    if failed := [r.run_id for r in reports
                  if any(m.check != "outline" for m in r.mismatches)]:
        codes.append(_fail(f"{', '.join(failed)}: a snapshot plus its tail differs from a "
                           "full replay. That fold version is quarantined, so its snapshots "
                           "are never loaded again; runs replay from the log.", 3))
    codes += [_fail(f"{r.run_id}: its outline (the summary runs, the viewer and the metrics "
                    f"read) differs from a fold of its log in {', '.join(m.fields)}. It was "
                    "replaced by the fold's, so it is never served again; if others may be "
                    "wrong too, rebuild them all: agentjournal reindex", 3)
              for r in reports for m in r.mismatches if m.check == "outline"]
    return codes + [_fail(str(exc), exit_code_for(exc)) for exc in errors]
