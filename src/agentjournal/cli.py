"""``agentjournal``: the command line, a thin layer over the public API.

    runs | show RUN [--at SEQ] | events RUN | state RUN    inspect runs (reading never writes)
    verify RUN | --all                                     snapshots against a full replay
    approvals | approve | deny | uncertain | resolve       a person's decisions
    run MODULE:OBJECT TASK | resume RUN | fork RUN         drive runs
    demo                                                   the crash-and-resume story, end to end

Exit codes: 0 ok; 1 usage or user error; 2 run or store not found, or refused (a
lease, a fence, nothing pending by that id); 3 the store's data cannot be read
(corrupt, not a store, or written by a newer release). Errors are one line on
stderr; ``--json`` output is the only thing on stdout.
"""

from __future__ import annotations

import getpass
import importlib
import inspect
import json
import os
import sqlite3
import sys
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast, get_args
from urllib.parse import unquote, urlsplit

import click
import msgspec
from rich.console import Console
from rich.table import Column, Table
from rich.text import Text

from . import (
    DEFAULT_URL,
    Agent,
    ConflictError,
    CorruptLogError,
    Event,
    EventType,
    FencedError,
    InvalidRunIdError,
    JournalError,
    LeaseHeldError,
    NotAStoreError,
    NotPendingError,
    RunNotFoundError,
    RunResult,
    RunState,
    Store,
    UnknownEventTypeError,
    UnsupportedVersionError,
    decide_approval,
    encode,
    fold,
    fork,
    open_store,
    resolve_uncertain,
)
from .decisions import Outcome, find_uncertain
from .state import Status
from .store import ENV_VAR, RunInfo, validate_run_id

if TYPE_CHECKING:
    from .demo.run_demo import DemoResult

E = EventType
F = TypeVar("F", bound=Callable[..., Any])
STATUSES: tuple[str, ...] = get_args(Status)

# --- errors and exit codes ------------------------------------------------------------

EXIT_CODES: tuple[tuple[type[JournalError], int], ...] = (
    (CorruptLogError, 3), (NotAStoreError, 3), (UnknownEventTypeError, 3),
    (UnsupportedVersionError, 3),
    (RunNotFoundError, 2), (NotPendingError, 2), (LeaseHeldError, 2), (FencedError, 2),
    (ConflictError, 2), (InvalidRunIdError, 2),
)


class CliError(Exception):
    """A failure the user can act on, with its exit code."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def exit_code_for(exc: JournalError) -> int:
    return next((code for kind, code in EXIT_CODES if isinstance(exc, kind)), 1)


def _fail(message: str, code: int) -> int:
    click.echo(f"error: {message}", err=True)
    return code


def _usage_message(exc: click.UsageError) -> str:
    hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
    return exc.format_message().rstrip(".") + hint


class JournalGroup(click.Group):
    """Translates every failure into one ``error:`` line and a meaningful exit code."""

    def main(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> int:
        code = self._run(args, prog_name, complete_var, **extra)
        if standalone_mode:
            sys.exit(code)
        return code

    def _run(self, args: Sequence[str] | None, prog_name: str | None,
             complete_var: str | None, **extra: Any) -> int:
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.UsageError as exc:  # click's default is 2; ours is 1
            return _fail(_usage_message(exc), 1)
        except CliError as exc:
            return _fail(str(exc), exc.code)
        except click.ClickException as exc:
            return _fail(exc.format_message(), exc.exit_code)
        except JournalError as exc:
            return _fail(str(exc), exit_code_for(exc))
        except sqlite3.DatabaseError as exc:  # damage SQLite found below the store's checks
            damaged = not isinstance(exc, sqlite3.OperationalError)
            return _fail(f"the SQLite store failed: {exc}", 3 if damaged else 1)
        except click.Abort:
            return _fail("aborted", 130)
        return rv if type(rv) is int else 0


# --- the store option, and opening a store without creating one ------------------------


def store_option(f: F) -> F:
    return click.option(
        "--store", "store_url", envvar=ENV_VAR, default=DEFAULT_URL, show_default=True,
        metavar="URL", help=f"Where runs live (env {ENV_VAR}): sqlite:///file.db, "
        "jsonl:///directory or postgresql://user@host/db.",
    )(f)


def json_option(f: F) -> F:
    return click.option("--json", "as_json", is_flag=True,
                        help="Print JSON to stdout (and nothing else).")(f)


def _local_path(url: str) -> tuple[str, Path] | None:
    """(scheme, path) of a file-backed store URL, parsed as open_store parses it."""
    parts = urlsplit(url)
    path = unquote(parts.path[1:] if parts.path.startswith("/") else parts.path)
    if parts.scheme in ("sqlite", "jsonl") and path:
        return parts.scheme, Path(path)
    return None


def _check_target(url: str, *, create: bool) -> None:
    """Refuse a missing store (unless creating) and a file that is not a store."""
    local = _local_path(url)
    if local is None:
        return  # Postgres, or a URL open_store will reject with its own message
    scheme, path = local
    if not path.exists():
        if not create:
            raise CliError(f"no store at {path} (from {url}). Check --store or ${ENV_VAR}; "
                           "`agentjournal run` creates a store.", 2)
        if not path.absolute().parent.is_dir():
            raise CliError(f"cannot create a store at {path}: the directory "
                           f"{path.absolute().parent} does not exist")
        return
    if scheme == "sqlite" and path.is_file() and path.stat().st_size:
        with path.open("rb") as f:
            if f.read(16) != b"SQLite format 3\x00":
                raise CliError(f"{path} is not an agentjournal store: it is not an SQLite "
                               "database. Check --store.", 3)
    if scheme == "jsonl" and not path.is_dir():
        raise CliError(f"{path} is not an agentjournal store: a jsonl store is a directory, "
                       "this is a file. Check --store.", 3)


@contextmanager
def opened(url: str, *, create: bool = False) -> Iterator[Store]:
    """The store at ``url``, closed afterwards. Only ``create`` may make a new one."""
    _check_target(url, create=create)
    store = open_store(url)
    try:
        yield store
    finally:
        store.close()


def load(store: Store, run_id: str, at: int | None = None) -> tuple[list[Event], RunState]:
    """The run's events (up to ``at``) and the state they fold to."""
    events = list(store.read(run_id))
    if not events:
        raise RunNotFoundError(run_id)
    if at is not None:
        if at > len(events):
            raise CliError(f"run {run_id!r} has events 1..{len(events)}; --at must be one "
                           "of them")
        events = events[:at]
    return events, fold(events)


def fold_all(store: Store) -> tuple[list[tuple[RunInfo, RunState]], list[JournalError]]:
    """Every run's state; runs that cannot be read are returned as errors, not skipped."""
    states, errors = [], []
    for info in store.list_runs():
        try:
            states.append((info, fold(store.read(info.run_id))))
        except JournalError as exc:
            errors.append(exc)
    return states, errors


def _report_unreadable(ctx: click.Context, errors: list[JournalError]) -> None:
    for exc in errors:
        _fail(str(exc), exit_code_for(exc))
    if errors:
        ctx.exit(max(exit_code_for(exc) for exc in errors))


# --- output helpers --------------------------------------------------------------------


def emit_json(value: Any) -> None:
    click.echo(msgspec.json.format(msgspec.json.encode(value), indent=2).decode())


def out() -> Console:
    # Piped output is not cut at 80 columns: it is read by grep as often as by people.
    wide = not sys.stdout.isatty() and "COLUMNS" not in os.environ
    return Console(highlight=False, width=160 if wide else None)


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], *, keep: Iterable[str] = (),
          title: str | None = None, styles: Sequence[str | None] = ()) -> Table:
    """A table of plain text (never markup); ``keep`` columns (ids, times) are never
    wrapped or cut, so they can be copied from the screen."""
    rows, kept = list(rows), set(keep)
    columns = [Column(h, no_wrap=h in kept,
                      min_width=max((len(r[i]) for r in rows), default=0) if h in kept else None)
               for i, h in enumerate(headers)]
    grid = Table(*columns, title=title, title_justify="left")
    for i, row in enumerate(rows):
        grid.add_row(*(Text(cell) for cell in row), style=styles[i] if styles else None)
    return grid


def note(message: str) -> None:
    """Progress and advice: stderr, so stdout stays data."""
    click.echo(message, err=True)


def short(value: Any, width: int = 80) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def age(since: datetime | None) -> float:
    return round((datetime.now(UTC) - since).total_seconds(), 3) if since else 0.0


def human_age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def local_time(ts: datetime | None, fmt: str = "%Y-%m-%d %H:%M:%S") -> str:
    return ts.astimezone().strftime(fmt) if ts else "-"


def store_hint(url: str) -> str:
    """`--store URL`, when a follow-up command would not find the store without it."""
    return "" if url == (os.environ.get(ENV_VAR) or DEFAULT_URL) else f" --store {url}"


@contextmanager
def progress(message: str) -> Iterator[Callable[[str], None]]:
    """A spinner on stderr when it is a terminal; silent otherwise."""
    console = Console(stderr=True)
    if not console.is_terminal:
        yield lambda _message: None
        return
    with console.status(message) as status:
        yield lambda update: status.update(update)


def _os_user() -> str:
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no login name, as in some containers
        return "unknown"


# --- the group -------------------------------------------------------------------------


@click.group(name="agentjournal", cls=JournalGroup,
             context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="agentjournal")
def cli() -> None:
    """Durable, crash-resumable runs for LLM agents: inspect runs, decide what a
    person must decide, and start, resume or fork runs.

    Every command takes --store URL (or $AGENTJOURNAL_STORE; default
    sqlite:///./agentjournal.db).

    \b
    Example:
      agentjournal demo                      # kill a real agent mid-effect, resume it
      agentjournal runs --store sqlite:///runs.db
    """


main = cli.main


# --- inspection ------------------------------------------------------------------------


def run_row(info: RunInfo, state: RunState) -> dict[str, Any]:
    return {
        "run_id": info.run_id, "status": state.status, "events": info.last_seq,
        "started": info.created_at, "last_activity": info.updated_at,
        "uncertain": len(state.pending), "approvals": len(state.approvals),
        "agent": state.agent, "pause_reason": state.pause_reason,
    }


@cli.command()
@click.option("--status", type=click.Choice(STATUSES), help="Only runs with this status.")
@json_option
@store_option
@click.pass_context
def runs(ctx: click.Context, status: str | None, as_json: bool, store_url: str) -> None:
    """List runs: status, events, start, last activity, open uncertain calls and approvals.

    \b
    Example:
      agentjournal runs --status paused --store sqlite:///runs.db
    """
    with opened(store_url) as store:
        states, errors = fold_all(store)
    rows = [run_row(i, s) for i, s in states if status is None or s.status == status]
    if as_json:
        emit_json(rows)
    elif not rows:
        note(f"no runs{f' with status {status}' if status else ''} in {store_url}")
    else:
        out().print(table(
            ("run", "status", "events", "started", "last activity", "uncertain", "approvals"),
            [(r["run_id"], r["status"], str(r["events"]), local_time(r["started"]),
              human_age(age(r["last_activity"])) + " ago", str(r["uncertain"]),
              str(r["approvals"])) for r in rows],
            keep=("run", "status", "started")))
    _report_unreadable(ctx, errors)


def _calls(calls: Iterable[dict[str, Any]]) -> str:
    return ", ".join(f"{c.get('name')}({short(c.get('args', {}), 60)})" for c in calls)


def summary(event: Event) -> str:
    """One short line saying what ``event`` records."""
    p = event.payload
    match event.type:
        case E.RUN_STARTED:
            origin = p.get("origin")
            fork_note = f" [fork of {origin['run_id']}@{origin['at_seq']}]" if origin else ""
            return f"{short(p.get('task', ''))}{fork_note}"
        case E.USER_MESSAGE:
            return short(p.get("content", ""))
        case E.MODEL_TURN:
            asks = _calls(p.get("tool_calls", []))
            return " → ".join(filter(None, [short(p.get("text", ""), 60), asks]))
        case E.TOOL_CALL_STARTED:
            return (f"{p['tool']} {p['key'][:12]} {short(p.get('args', {}), 60)} "
                    f"({p.get('effect')}, attempt {p.get('attempt', 1)})")
        case E.TOOL_CALL_COMPLETED:
            how = "error" if p.get("is_error") else p.get("source", "tool")
            shown = p["content"] if "content" in p else p.get("result")
            return f"{p.get('tool')} [{how}] {short(shown, 60)}"
        case E.TOOL_CALL_UNCERTAIN:
            return f"{p['key'][:12]} {short(p.get('error', ''))}"
        case E.TOOL_CALL_RECONCILED:
            why = f": {short(p['reason'], 60)}" if p.get("reason") else ""
            return f"{p['tool']} {p['key'][:12]} → {p['verdict']} (by {p.get('by')}){why}"
        case E.TOOL_RESULT_SERVED:
            return f"{p.get('tool')} served from seq {p.get('served_from_seq')}"
        case E.TOOL_CALL_DENIED:
            return f"{p.get('tool')}: {short(p.get('reason', ''))}"
        case E.APPROVAL_REQUESTED:
            return f"{p['approval_id']} {p['tool']} {short(p.get('args', {}), 60)}"
        case E.APPROVAL_DECIDED:
            verdict = "approved" if p.get("approved") else "denied"
            why = f": {short(p['reason'])}" if p.get("reason") else ""
            return f"{p['approval_id']} {verdict} by {p.get('by')}{why}"
        case E.BUDGET_EXCEEDED:
            return f"{p.get('budget')}: {p.get('used')} of {p.get('limit')}"
        case E.RUN_FINISHED:
            return short(p.get("outcome", ""))
    return short(p.get("reason") or p.get("name") or p.get("key") or "")


@cli.command()
@click.argument("run_id", metavar="RUN")
@click.option("--at", type=click.IntRange(min=1), metavar="SEQ",
              help="Show the folded state as of this event (time travel).")
@json_option
@store_option
def show(run_id: str, at: int | None, as_json: bool, store_url: str) -> None:
    """Show a run's timeline, one event a line; with --at, its state as of that event.

    \b
    Example:
      agentjournal show q3 --at 12    # what the run knew (and the model saw) at seq 12
    """
    with opened(store_url) as store:
        events, state = load(store, run_id, at)
    if as_json:
        emit_json({"run_id": run_id, "at": at, "state": state,
                   "events": [{**msgspec.to_builtins(e), "summary": summary(e)} for e in events]})
    elif at is None:
        print_timeline(run_id, events, state)
    else:
        print_state(state)


def print_timeline(run_id: str, events: list[Event], state: RunState) -> None:
    # Plain lines, cut at the terminal's width: one event is always one line.
    console = out()
    console.print(Text(f"run {run_id}: {state.status}, {len(events)} events", style="bold"))
    width = max(len(e.type.value) for e in events)
    for e in events:
        line = (f"{e.seq:>5}  {local_time(e.ts, '%H:%M:%S.%f')[:-3]}  "
                f"{e.type.value:<{width}}  {summary(e)}")
        console.print(Text(line), no_wrap=True, overflow="ellipsis")


def print_state(state: RunState) -> None:
    console = out()
    console.print(Text(f"run {state.run_id} as of seq {state.last_seq}: {state.status}"
                       + (f" ({state.pause_reason})" if state.pause_reason else "")))
    console.print(Text(f"task: {state.task}"))
    if state.escalation:
        console.print(Text(f"escalated: {short(state.escalation, 200)}"))
    _print_rows(console, "messages (the model's context)", ("seq", "role", "trust", "content"),
                [(str(m.seq), m.role, m.trust,
                  " → ".join(filter(None, [short(m.content),
                                           _calls(msgspec.to_builtins(m.tool_calls))])))
                 for m in state.messages])
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
    console.print(table(header, rows, keep=("key", "approval", "role", "trust"), title=title))


@cli.command()
@click.argument("run_id", metavar="RUN")
@click.option("--after", type=click.IntRange(min=0), default=0, metavar="SEQ",
              help="Only events after this seq.")
@store_option
def events(run_id: str, after: int, store_url: str) -> None:
    """Print a run's events as JSON Lines, one canonical event a line.

    \b
    Example:
      agentjournal events q3 | jq -c 'select(.type == "tool_call_reconciled")'
    """
    with opened(store_url) as store:
        printed = 0
        for event in store.read(run_id, after_seq=after):
            click.echo(encode(event))  # bytes: written as they are, plus a newline
            printed += 1
        if not printed and store.last_seq(run_id) == 0:
            raise RunNotFoundError(run_id)


@cli.command()
@click.argument("run_id", metavar="RUN")
@click.option("--at", type=click.IntRange(min=1), metavar="SEQ",
              help="Fold only the events up to this seq.")
@click.option("--json", "as_json", is_flag=True, default=True,
              help="Print JSON (the default; state is always JSON).")
@store_option
def state(run_id: str, at: int | None, as_json: bool, store_url: str) -> None:
    """Print a run's folded state as JSON.

    \b
    Example:
      agentjournal state q3 --at 12 --json | jq .pending
    """
    with opened(store_url) as store:
        _, folded = load(store, run_id, at)
    emit_json(folded)


@cli.command()
@click.argument("run_id", metavar="RUN", required=False)
@click.option("--all", "all_runs", is_flag=True, help="Verify every run in the store.")
@json_option
@store_option
@click.pass_context
def verify(ctx: click.Context, run_id: str | None, all_runs: bool, as_json: bool,
           store_url: str) -> None:
    """Check that the fold is deterministic at every prefix and that every snapshot plus
    its tail equals a full replay; a mismatch quarantines that fold version (exit 3).

    \b
    Example:
      agentjournal verify --all --store sqlite:///runs.db
    """
    from .snapshots import verify as verify_run

    if (run_id is None) == (not all_runs):
        raise click.UsageError("give either a RUN or --all")
    with opened(store_url) as store:
        ids = [run_id] if run_id is not None else [i.run_id for i in store.list_runs()]
        reports = [verify_run(store, rid) for rid in ids]
    for report in reports:
        if not report.events:
            raise RunNotFoundError(report.run_id)
    if not reports:
        note(f"no runs in {store_url}")
    if as_json:
        emit_json([{**msgspec.to_builtins(r), "ok": r.ok} for r in reports])
    else:
        for r in reports:
            verdict = "ok" if r.ok else f"{len(r.mismatches)} MISMATCHES"
            click.echo(f"{r.run_id}: {verdict} ({r.events} events, "
                       f"{r.snapshots_checked} snapshots)")
            for m in r.mismatches:
                click.echo(f"  {m.check} at seq {m.seq}: {', '.join(m.fields)}")
    failed = [r.run_id for r in reports if not r.ok]
    if failed:
        ctx.exit(_fail(f"{', '.join(failed)}: a snapshot plus its tail differs from a full "
                       "replay. That fold version is quarantined, so its snapshots are never "
                       "loaded again; runs replay from the log.", 3))


# --- decisions -------------------------------------------------------------------------


def by_option(f: F) -> F:
    return click.option("--by", default=_os_user, show_default="your OS user",
                        help="Who decides (recorded in the event).")(f)


def print_appended(appended: list[Event], run_id: str, store_url: str, as_json: bool) -> None:
    if as_json:
        emit_json([msgspec.to_builtins(e) for e in appended])
        return
    for e in appended:
        click.echo(f"appended seq {e.seq} {e.type.value}: {summary(e)}")
    click.echo(f"next: resume the run to act on it: agentjournal resume {run_id}"
               f"{store_hint(store_url)}")


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
        states, errors = fold_all(store)
    rows: list[dict[str, Any]] = sorted(({
        "run_id": s.run_id, "approval_id": a.approval_id, "tool": a.tool, "args": a.args,
        "reason": a.reason, "requested_seq": a.requested_seq, "requested_at": a.requested_at,
        "age_s": age(a.requested_at),
    } for _, s in states for a in s.approvals.values()), key=lambda r: -r["age_s"])
    if as_json:
        emit_json(rows)
    elif not rows:
        note("no pending approvals")
    else:
        out().print(table(
            ("run", "approval", "tool", "args", "reason", "age"),
            [(r["run_id"], r["approval_id"], r["tool"], short(r["args"], 50), r["reason"],
              human_age(r["age_s"])) for r in rows],
            keep=("run", "approval")))
        note("decide with: agentjournal approve RUN APPROVAL_ID  (or deny ... --reason TEXT)")
    _report_unreadable(ctx, errors)


def _decide(run_id: str, approval_id: str, *, approved: bool, by: str, reason: str,
            store_url: str, as_json: bool) -> None:
    with opened(store_url) as store:
        event = decide_approval(store, run_id, approval_id, approved=approved, by=by,
                                reason=reason)
    print_appended([event], run_id, store_url, as_json)


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

    \b
    Example:
      agentjournal uncertain --json | jq '.[] | select(.risk == "irreversible")'
    """
    with opened(store_url) as store:
        states, errors = fold_all(store)
    rows: list[dict[str, Any]] = sorted(({
        "run_id": s.run_id, "run_status": s.status, "tool": p.tool, "key": p.key,
        "args": p.args, "risk": p.effect, "attempt": p.attempt, "started_seq": p.started_seq,
        "started_at": p.started_at, "age_s": age(p.started_at), "last_error": p.last_error,
    } for _, s in states for p in s.pending.values()), key=lambda r: -r["age_s"])
    if as_json:
        emit_json(rows)
    elif not rows:
        note("no uncertain calls")
    else:
        out().print(table(
            ("run", "tool", "key", "age", "risk", "last error"),
            [(r["run_id"], r["tool"], r["key"][:16], human_age(r["age_s"]), r["risk"],
              short(r["last_error"] or "-", 60)) for r in rows],
            keep=("run", "key", "risk")))
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


def _check_prefix(store: Store, run_id: str, key: str) -> None:
    """An ambiguous key prefix is a usage error, named as such."""
    _, folded = load(store, run_id)
    calls = list(folded.pending.values())
    hits = [p.key for p in calls if p.key.startswith(key)]
    if len(hits) > 1 and find_uncertain(calls, key) is None:
        raise CliError(f"key prefix {key!r} matches {len(hits)} uncertain calls in run "
                       f"{run_id!r} ({', '.join(h[:16] for h in hits)}); give more characters")


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
        _check_prefix(store, run_id, key)
        appended = resolve_uncertain(store, run_id, key, outcome=outcome, by=by,
                                     reason=reason, result=value)
    print_appended(appended, run_id, store_url, as_json)


# --- running ---------------------------------------------------------------------------


def load_agent(ref: str) -> Agent:
    """The Agent named by ``MODULE:OBJECT``: an Agent, or a zero-argument factory of one."""
    module_name, _, attr = ref.partition(":")
    if not module_name or not attr:
        raise CliError(f"{ref!r} is not MODULE:OBJECT (e.g. myagents:reconciler)")
    if os.getcwd() not in sys.path:  # as `python -m` would
        sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise CliError(f"cannot import module {module_name!r} ({exc}); run from the directory "
                       "that holds it, or install it") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise CliError(f"module {module_name!r} has no {attr!r}")
        obj = getattr(obj, part)
    if not isinstance(obj, Agent) and callable(obj) and _takes_no_args(obj):
        obj = obj()
    if not isinstance(obj, Agent):
        raise CliError(f"{ref} is a {type(obj).__name__}, not an Agent or a zero-argument "
                       "callable returning one")
    return obj


def _takes_no_args(fn: Callable[..., Any]) -> bool:
    try:
        inspect.signature(fn).bind()
    except (TypeError, ValueError):
        return False
    return True


def drive(store: Store, agent: Agent, run_id: str, task: str | None, ref: str) -> RunResult:
    """Start or resume the run, with a spinner naming the last event on a terminal."""
    with progress(f"{run_id}: opening") as update:
        return agent.run(store, run_id, task, agent_ref=ref,
                         observer=lambda e, _s: update(f"{run_id}: seq {e.seq} {e.type.value}"))


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
        click.echo(f"run {result.run_id}: {result.status} at seq {result.last_seq}"
                   + (f" ({result.pause_reason})" if result.pause_reason else ""))
        if result.status == "finished":
            click.echo(f"outcome: {short(result.outcome, 200)}")
        for p in result.uncertain:
            click.echo(f"uncertain: {p.tool} key {p.key[:16]} {short(p.args, 60)} "
                       f"({p.effect}; last error: {p.last_error or '-'})")
        for a in result.approvals:
            click.echo(f"awaiting approval: {a.approval_id} {a.tool} {short(a.args, 60)}")
        if result.escalation:
            click.echo(f"escalated: {short(result.escalation.get('reason', ''), 200)}")
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
@click.option("--run-id", help="The run's id (default: a new one). The same id resumes.")
@json_option
@store_option
def run(ref: str, task: str, run_id: str | None, as_json: bool, store_url: str) -> None:
    """Start a run of the agent MODULE:OBJECT, or resume it if --run-id exists.

    OBJECT is an Agent, or a zero-argument callable returning one; MODULE is
    imported with the current directory on the path, as `python -m` does.

    \b
    Example:
      agentjournal run myagents:reconciler "Reconcile Q3" --run-id q3
    """
    run_id = validate_run_id(run_id or f"run-{uuid.uuid4().hex[:12]}")
    with opened(store_url, create=True) as store:
        result = drive(store, load_agent(ref), run_id, task, ref)
    print_result(result, store_url, as_json)


@cli.command()
@click.argument("run_id", metavar="RUN")
@json_option
@store_option
def resume(run_id: str, as_json: bool, store_url: str) -> None:
    """Resume a run with the agent it recorded (its MODULE:OBJECT).

    \b
    Example:
      agentjournal resume q3 --store sqlite:///runs.db
    """
    with opened(store_url) as store:
        _, folded = load(store, run_id)
        if folded.agent is None:
            raise CliError(
                f"run {run_id!r} recorded no agent (it was started without agent_ref). "
                f"Resume it with: agentjournal run MODULE:OBJECT TASK --run-id {run_id}")
        result = drive(store, load_agent(folded.agent), run_id, None, folded.agent)
    print_result(result, store_url, as_json)


@cli.command(name="fork")
@click.argument("run_id", metavar="RUN")
@click.option("--at", type=click.IntRange(min=1), required=True, metavar="SEQ",
              help="Copy events 1..SEQ into the new run.")
@click.option("--new-id", help="The new run's id (default: RUN.fork-XXXXXXXX).")
@store_option
def fork_cmd(run_id: str, at: int, new_id: str | None, store_url: str) -> None:
    """Start a new run from the first SEQ events of RUN; prints the new run's id.

    The fork keeps the origin's idempotency scope: it never repeats an effect
    its prefix recorded.

    \b
    Example:
      agentjournal fork q3 --at 12 --new-id q3-retry && agentjournal resume q3-retry
    """
    with opened(store_url) as store:
        if new_id is not None and store.last_seq(validate_run_id(new_id)):
            raise CliError(f"run {new_id!r} already exists; choose another --new-id")
        try:
            new = fork(store, run_id, at, new_id)
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
    from .demo.run_demo import DemoError, KillAt, run_demo

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


# --- snapshots and benchmarks ----------------------------------------------------------


@cli.command(name="plan-snapshots")
@click.option("--events", type=click.IntRange(min=1), help="Events per run (default: the "
              "store's largest run).")
@click.option("--replay-ms", type=click.FloatRange(min=0, min_open=True),
              help="Replay cost per event, ms (default: measured on the store).")
@click.option("--snapshot-ms", type=click.FloatRange(min=0),
              help="Snapshot write cost, ms (default: measured on the store).")
@click.option("--recoveries", type=click.FloatRange(min=0), default=1.0, show_default=True,
              help="Expected recoveries per run.")
@click.option("--objective-ms", type=click.FloatRange(min=0), default=1000.0,
              show_default=True, help="Worst-case recovery time allowed, ms.")
@click.option("--interval", type=click.IntRange(min=1), help="Evaluate this interval instead "
              "of choosing one.")
@json_option
@store_option
def plan_snapshots(events: int | None, replay_ms: float | None, snapshot_ms: float | None,
                   recoveries: float, objective_ms: float, interval: int | None,
                   as_json: bool, store_url: str) -> None:
    """Choose a snapshot interval from replay cost, snapshot cost, recoveries per run and
    the worst-case recovery objective, and show the arithmetic. Costs not given are
    measured on the store's largest run (which also leaves a snapshot of it).

    \b
    Example (the worked example: 4,000 events, 2 ms each, 120 ms snapshots, 6 recoveries):
      agentjournal plan-snapshots --events 4000 --replay-ms 2 --snapshot-ms 120 \\
          --recoveries 6 --objective-ms 300
    """
    from .planner import measure, plan

    if events is None or replay_ms is None or snapshot_ms is None:
        with opened(store_url) as store:
            runs = store.list_runs()
            if not runs:
                raise CliError(f"no runs in {store_url} to measure; give --events, "
                               "--replay-ms and --snapshot-ms", 2)
            largest = max(runs, key=lambda r: r.last_seq)
            measured = measure(store, largest.run_id)
        note(f"measured on run {measured.run_id} ({measured.events} events): "
             f"{measured.replay_ms_per_event:.4f} ms/event replay, "
             f"{measured.snapshot_ms:.2f} ms per snapshot")
        events = events or measured.events
        replay_ms = replay_ms or measured.replay_ms_per_event
        snapshot_ms = snapshot_ms if snapshot_ms is not None else measured.snapshot_ms
    result = plan(events, replay_ms, snapshot_ms, recoveries, objective_ms, interval)
    if as_json:
        emit_json(result)
        return
    for line in result.arithmetic:
        click.echo(line)
    verdict = "meets" if result.meets_objective else "MISSES"
    click.echo(f"interval: snapshot every {result.interval} events ({verdict} the "
               f"{objective_ms:g} ms objective)")


def _register_bench() -> None:
    from .bench import bench

    cli.add_command(bench)


_register_bench()
