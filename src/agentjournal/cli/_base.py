"""What every command shares: exit codes, the store option, output helpers, the group."""

from __future__ import annotations

import getpass
import importlib
import os
import sqlite3
import sys
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, ClassVar, TypeVar, cast, get_args

import click
from rich.cells import cell_len
from rich.console import Console
from rich.table import Column, Table
from rich.text import Text

from .. import (
    DEFAULT_URL,
    ConflictError,
    CorruptLogError,
    Event,
    EventType,
    FencedError,
    InvalidRunIdError,
    JournalError,
    LeaseHeldError,
    NotArchivedError,
    NotAStoreError,
    NotCancellableError,
    NotPendingError,
    RunNotFoundError,
    RunState,
    Store,
    UnknownEventTypeError,
    UnsettledError,
    UnsupportedVersionError,
    fold,
    open_store,
)
from ..continuation import Continuation, continuation
from ..errors import NoQueueError
from ..fleet import QUEUE_STATES, QueuedRun, queue_of
from ..state import Status
from ..store import ENV_VAR, local_path, mask_secrets
from ..store.base import missing_run
from ..store.outlined import projecting
from ..summaries import human_age as human_age  # (the CLI's modules take these from here)
from ..summaries import short as short
from ._safe import visible

E = EventType
F = TypeVar("F", bound=Callable[..., Any])
STATUSES: tuple[str, ...] = get_args(Status)
#: What ``runs --status`` matches: a run's status, or for a run with no events yet (a
#: submitted one) its state in the queue.
RUN_STATUSES: tuple[str, ...] = (*STATUSES, *(s for s in QUEUE_STATES if s not in STATUSES))

# --- errors and exit codes ------------------------------------------------------------

EXIT_CODES: tuple[tuple[type[JournalError], int], ...] = (
    (CorruptLogError, 3), (NotAStoreError, 3), (UnknownEventTypeError, 3),
    (UnsupportedVersionError, 3),
    (RunNotFoundError, 2), (NotPendingError, 2), (LeaseHeldError, 2), (FencedError, 2),
    (ConflictError, 2), (InvalidRunIdError, 2), (NotCancellableError, 2), (UnsettledError, 2),
    (NotArchivedError, 2),
)


#: A run (or a saga) stopped before it was done, for a person to decide: an approval, an
#: uncertain call, an escalation, a pause. The same code for run, resume, compensate and
#: cancel --compensate, so a script tells "done" from "waiting for someone" the same way.
EXIT_NEEDS_A_PERSON = 4

#: Every command's --help ends with this (and `agentjournal --help`).
EXIT_CODES_HELP = """\b
Exit codes (the same for every command):
  0  done: the run finished, the saga compensated, the run cancelled, the
     decision recorded, or the output printed
  1  usage or user error, a bad store URL, or a write the store refused
     (a full disk, a read-only store)
  2  run or store not found, or refused (a lease, a fence, nothing
     pending by that id)
  3  the store's data cannot be read (corrupt or damaged, not a store,
     or written by a newer release)
  4  stopped: a person must decide (an approval, an uncertain call, an
     escalation, a pause, a saga stopped before an effect); the next
     steps are printed on stderr
  130  interrupted"""

DONE_STATUSES = frozenset({"finished", "compensated", "cancelled"})


def exit_for_status(ctx: click.Context, status: str) -> None:
    """Exit 0 when the run is done; ``EXIT_NEEDS_A_PERSON`` when it stopped short."""
    if status not in DONE_STATUSES:
        ctx.exit(EXIT_NEEDS_A_PERSON)


class CliError(Exception):
    """A failure the user can act on, with its exit code."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def exit_code_for(exc: JournalError) -> int:
    return next((code for kind, code in EXIT_CODES if isinstance(exc, kind)), 1)


def _fail(message: str, code: int) -> int:
    click.echo(visible(f"error: {mask_secrets(message)}", multiline=True), err=True)
    return code


def _usage_message(exc: click.UsageError) -> str:
    hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
    return exc.format_message().rstrip(".") + hint


class JournalGroup(click.Group):
    """Translates every failure into one ``error:`` line and a meaningful exit code.

    Commands in ``LAZY`` are imported only when named (or listed by ``--help``): every
    other command starts without loading them."""

    LAZY: ClassVar[dict[str, str]] = {"bench": "agentjournal.bench:bench"}

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        cmd.epilog = "\n\n".join(filter(None, [cmd.epilog, EXIT_CODES_HELP]))
        super().add_command(cmd, name)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.LAZY})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        found = super().get_command(ctx, cmd_name)
        if found is None and cmd_name in self.LAZY:
            module, name = self.LAZY[cmd_name].split(":")
            found = cast(click.Command, getattr(importlib.import_module(module), name))
            self.add_command(found, cmd_name)
        return found

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
        except click.exceptions.NoArgsIsHelpError as exc:  # bare `agentjournal`: not an error
            click.echo(exc.ctx.get_help() if exc.ctx is not None else "")
            return 0
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
        except OSError as exc:  # a last resort: the stores translate the ones they expect
            return _fail(f"the operating system refused: {exc}. Check the store's disk and "
                         "permissions", 1)
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


def by_option(f: F) -> F:
    return click.option("--by", default=_os_user, show_default="your OS user",
                        help="Who decides (recorded in the event).")(f)


def json_option(f: F) -> F:
    return click.option("--json", "as_json", is_flag=True,
                        help="Print JSON to stdout (and nothing else).")(f)


def _check_target(url: str, *, create: bool) -> None:
    """Refuse a missing store unless creating, naming the absolute path it looked at.
    (What is there is judged by the store itself, which refuses what is not a store.)"""
    local = local_path(url)
    if local is None:
        return  # Postgres, or a URL open_store will reject with its own message
    path = local[1].absolute()
    if not path.exists():
        if not create:
            raise CliError(f"no store at {path} (from {url}). Check --store or ${ENV_VAR} "
                           "(sqlite:///rel.db is relative to the working directory, "
                           "sqlite:////abs.db absolute); `agentjournal init` or "
                           "`agentjournal run` creates a store.", 2)
        if not path.parent.is_dir():
            raise CliError(f"cannot create a store at {path}: the directory "
                           f"{path.parent} does not exist")


_WRITES = frozenset({"append", "acquire", "renew", "release", "put_snapshot",
                     "delete_snapshots", "quarantine", "delete_run", "restore_run",
                     "prune_snapshots", "put_outline", "put_view"})


class _ReadFirst:
    """A store opened read-only, reopened for writing at the first write a command makes.

    Reading never writes: a command that only inspects (runs, show, events, state,
    approvals, uncertain, and verify unless it must quarantine) never holds a writable
    handle, so it creates, migrates and changes nothing and works on a read-only copy.
    A command that decides or drives a run writes through a normal handle, opened only
    once the read-only one has shown the store is an agentjournal store.
    """

    def __init__(self, url: str) -> None:
        self._url = url
        self._reader = open_store(url, readonly=True)
        self._writer: Store | None = None

    @property
    def reader(self) -> Store:
        return self._reader

    @property
    def current(self) -> Store:
        """The open handle: the writer once the command wrote, else the reader."""
        return self._writer or self._reader

    @property
    def writable(self) -> Store:
        """The store it writes through, opened now if not yet (``fleet.queue_of``: the
        queue of a store a command writes to, as a decision keeping a run waiting)."""
        if self._writer is None:
            self._reader.close()  # (SQLite: a reader's read-only -shm mapping would be shared)
            with projection_shown():
                self._writer = open_store(self._url)
        return self._writer

    def __getattr__(self, name: str) -> Any:
        return getattr(self.writable if name in _WRITES else self._writer or self._reader,
                       name)

    def close(self) -> None:
        (self._writer or self._reader).close()  # (the reader was closed when the writer came)


@contextmanager
def opened(url: str, *, create: bool = False) -> Iterator[Store]:
    """The store at ``url``, closed afterwards: read-only until a command writes to it
    (see :class:`_ReadFirst`). Only ``create`` may make a new one."""
    _check_target(url, create=create)
    store = open_store(url) if create else cast(Store, _ReadFirst(url))
    if getattr(store, "unfinished", False) and (local := local_path(url)) is not None:
        note(f"{local[1].absolute()} is empty (0 bytes): a store whose creation did not "
             "finish (a process stopped while creating it), so it holds no runs yet; the "
             "next `agentjournal run` or `agentjournal init` completes it. (If it held runs, "
             "it was truncated: restore it from a backup.)")
    try:
        yield store
    finally:
        store.close()


def load(store: Store, run_id: str, at: int | None = None) -> tuple[list[Event], RunState]:
    """The run's events (up to ``at``) and the state they fold to."""
    events = list(store.read(run_id))
    if not events:
        raise missing_run(store, run_id)
    if at is not None:
        if at > len(events):
            raise CliError(f"run {run_id!r} has events 1..{len(events)}; --at must be one "
                           "of them")
        events = events[:at]
    return events, fold(events)


def outlines_of(store: Store, run_ids: Collection[str] | None = None, *,
                attention: bool = False) -> tuple[dict[str, RunState], list[JournalError]]:
    """Each run's outline (projections.py: its summary, with no messages or completed
    calls), in one read of the store: of ``run_ids`` or of every run; ``attention``: only
    the runs a person may be asked about. Runs that cannot be read come back as errors,
    not skipped."""
    states: dict[str, RunState] = {}
    errors: list[JournalError] = []
    for run_id, found in store.outlines(run_ids, attention=attention).items():
        if isinstance(found, JournalError):
            errors.append(found)
        else:
            states[run_id] = found
    return states, errors


def outline_of(store: Store, run_id: str) -> RunState:
    """One run's outline (an empty state for a run with no events, as a fold of none)."""
    found = store.outlines([run_id]).get(run_id)
    if isinstance(found, JournalError):
        raise found
    return RunState() if found is None else found


def advise_if_unprojected(store: Store, store_url: str) -> None:
    """Say once, on stderr, how to speed reads up on a store that keeps no outlines yet
    (one an older release wrote): a read-only command then folds every run's log."""
    if not store.projected:
        note(f"{store_url} keeps no run outlines yet, so this read folds the log of every "
             f"run it lists. To build them once: agentjournal reindex{store_hint(store_url)}"
             " (or any command that writes to the store: run, resume, a decision)")


def queued_runs(store: Store) -> dict[str, QueuedRun]:
    """The runs in the store's queue, by id (none for a store without one, JSONL): a
    submitted run has no events until a worker starts it, and must not look absent."""
    try:
        queue = queue_of(store.current if isinstance(store, _ReadFirst) else store)
    except NoQueueError:
        return {}
    try:
        return {r.run_id: r for r in queue.runs()}
    except sqlite3.OperationalError as exc:
        if "no such table: queue" in str(exc):  # read-only, from before the queue: none
            return {}
        raise
    finally:
        queue.close()


def queue_place(entry: QueuedRun | None) -> dict[str, Any] | None:
    """Where a run is in the queue, for --json."""
    if entry is None:
        return None
    return {"name": entry.queue, "state": entry.state, "worker": entry.worker,
            "reason": entry.reason, "pin_version": entry.pin_version,
            "waiting_for": entry.waiting_for}


#: How many parents up a child run's hint is looked for (a parent's parent ...).
MAX_NESTING = 8


def how_it_goes_on(store: Store, run_id: str, store_url: str, *,
                   nesting: int = 0) -> Continuation:
    """How the run continues now (continuation.py): its state, its first event's
    payload and its place in the queue, read from the store."""
    events = store.read(run_id)
    try:
        first = next(events, None)
    finally:
        close = getattr(events, "close", None)
        if close is not None:  # a generator holding a cursor: done with it
            close()
    # The queue before the state: a worker that finishes the run in between leaves a
    # finished state ("nothing to continue"), never a "done" queue entry beside a state
    # from before (which would read as a run outside the queue).
    queued = queued_runs(store).get(run_id)
    state = outline_of(store, run_id)  # (what a continuation reads, an outline holds)
    return continuation_of(store, state, None if first is None else first.payload, queued,
                           store_url, nesting=nesting)


def continuation_of(store: Store, state: RunState, started: Mapping[str, Any] | None,
                    queued: QueuedRun | None, store_url: str, *,
                    nesting: int = 0) -> Continuation:
    """How the run whose folded state is ``state`` continues (``started``: its
    run_started payload; ``queued``: its place in the queue, if any). A child run's is
    its parent's (read from the store too): the parent's call resumes it."""
    link = (started or {}).get("parent")
    parent_id = link.get("run_id") if isinstance(link, Mapping) else None
    parent = None
    if (isinstance(parent_id, str) and nesting < MAX_NESTING and parent_id != state.run_id
            and store.last_seq(parent_id)):
        parent = how_it_goes_on(store, parent_id, store_url, nesting=nesting + 1)
    return continuation(state, started=started,
                        queue_state=None if queued is None else queued.state,
                        runnable=queued is not None and queued.runnable,
                        store_hint=store_hint(store_url), parent=parent,
                        waiting_for=None if queued is None else queued.waiting_for)


def _report_unreadable(ctx: click.Context, errors: list[JournalError]) -> None:
    for exc in errors:
        _fail(str(exc), exit_code_for(exc))
    if errors:
        ctx.exit(max(exit_code_for(exc) for exc in errors))


# --- output helpers --------------------------------------------------------------------


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
        grid.add_row(*(Text(visible(cell)) for cell in row),
                     style=styles[i] if styles else None)
    return grid


def fits(console: Console, headers: Sequence[str], rows: Sequence[Sequence[str]]) -> bool:
    """Whether a table of these cells fits ``console`` with no cell cut or wrapped."""
    widths = [max([cell_len(h), *(cell_len(visible(r[i])) for r in rows)])
              for i, h in enumerate(headers)]
    return _table_width(widths) <= console.width


def print_fitted(console: Console, headers: Sequence[str], rows: Sequence[Sequence[str]], *,
                 drop: Sequence[str], keep: Iterable[str] = ()) -> None:
    """A table of as many whole columns as fit ``console``: the columns in ``drop`` go,
    first to last, until every column left fits its widest cell, so a narrow terminal
    shows fewer columns, never cut or blank ones."""
    rows = [[visible(cell) for cell in row] for row in rows]
    width = {h: max([cell_len(h), *(cell_len(r[i]) for r in rows)])
             for i, h in enumerate(headers)}
    shown = list(headers)
    for name in drop:
        if _table_width(width[h] for h in shown) <= console.width:
            break
        shown.remove(name)
    index = [headers.index(h) for h in shown]
    if _table_width(width[h] for h in shown) > console.width:  # let rich squeeze the rest
        console.print(table(shown, ([r[i] for i in index] for r in rows), keep=keep))
        return
    # Drawn as rich draws a table, a line at a time: a thousand rows print in a
    # fraction of what rendering each cell costs.
    widths = [width[h] for h in shown]

    def rule(left: str, cross: str, right: str, fill: str) -> str:
        return left + cross.join(fill * (w + 2) for w in widths) + right

    def line(cells: Sequence[str], bar: str) -> str:
        return bar + bar.join(f" {c}{' ' * (w - cell_len(c))} "
                              for c, w in zip(cells, widths, strict=True)) + bar

    console.print(Text(rule("┏", "┳", "┓", "━")), Text(line(shown, "┃"), style="bold"),
                  Text("\n".join([rule("┡", "╇", "┩", "━"),
                                  *(line([r[i] for i in index], "│") for r in rows),
                                  rule("└", "┴", "┘", "─")])),
                  sep="\n", no_wrap=True, crop=False, overflow="ignore")


def _table_width(widths: Iterable[int]) -> int:
    """The width of a table of columns this wide: a space each side, and the borders."""
    widths = list(widths)
    return sum(widths) + 3 * len(widths) + 1


def note(message: str) -> None:
    """Progress and advice: stderr, so stdout stays data (a store URL's password masked)."""
    click.echo(visible(mask_secrets(message), multiline=True), err=True)


#: How much of a call's arguments a person is shown where they decide on it (in full
#: below this; `--json` has them whole).
ARGS_SHOWN = 2000


def age(since: datetime | None) -> float:
    return round((datetime.now(UTC) - since).total_seconds(), 3) if since else 0.0


def local_time(ts: datetime | None, fmt: str = "%Y-%m-%d %H:%M:%S") -> str:
    return ts.astimezone().strftime(fmt) if ts else "-"


def store_hint(url: str) -> str:
    """`--store URL`, when a follow-up command would not find the store without it."""
    same = url == (os.environ.get(ENV_VAR) or DEFAULT_URL)
    return "" if same else f" --store {mask_secrets(url)}"


@contextmanager
def progress(message: str) -> Iterator[Callable[[str], None]]:
    """A spinner on stderr when it is a terminal; silent otherwise."""
    console = Console(stderr=True)
    if not console.is_terminal:
        yield lambda _message: None
        return
    with console.status(message) as status:
        yield lambda update: status.update(update)


@contextmanager
def projection_shown() -> Iterator[None]:
    """While a writer's open projects the runs of a store an older release wrote (once),
    how far it got, on a line of stderr that a terminal redraws; nothing when there is
    nothing to project, or stderr is no terminal (the library logs its start there)."""
    console = Console(stderr=True)
    status = console.status("")  # started by the first run projected

    def told(done: int, total: int) -> None:
        if done == 1:
            status.start()
        status.update(f"projecting the runs of a store an older release wrote (once): "
                      f"{done:,} of {total:,}")

    token = projecting.set(told if console.is_terminal else None)
    try:
        yield
    finally:
        projecting.reset(token)
        status.stop()


def _os_user() -> str:
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no login name, as in some containers
        return "unknown"


# --- the group -------------------------------------------------------------------------


@click.group(name="agentjournal", cls=JournalGroup, epilog=EXIT_CODES_HELP,
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

