"""What every command shares: exit codes, the store option, output helpers, the group."""

from __future__ import annotations

import getpass
import importlib
import json
import os
import sqlite3
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, ClassVar, TypeVar, cast, get_args

import click
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
from ..snapshots import load_state
from ..state import Status
from ..store import ENV_VAR, RunInfo, local_path, mask_secrets
from ..store.base import missing_run
from ._safe import visible

E = EventType
F = TypeVar("F", bound=Callable[..., Any])
STATUSES: tuple[str, ...] = get_args(Status)

# --- errors and exit codes ------------------------------------------------------------

EXIT_CODES: tuple[tuple[type[JournalError], int], ...] = (
    (CorruptLogError, 3), (NotAStoreError, 3), (UnknownEventTypeError, 3),
    (UnsupportedVersionError, 3),
    (RunNotFoundError, 2), (NotPendingError, 2), (LeaseHeldError, 2), (FencedError, 2),
    (ConflictError, 2), (InvalidRunIdError, 2), (NotCancellableError, 2), (UnsettledError, 2),
    (NotArchivedError, 2),
)


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
                     "prune_snapshots"})


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

    def __getattr__(self, name: str) -> Any:
        if name in _WRITES and self._writer is None:
            self._reader.close()  # (SQLite: a reader's read-only -shm mapping would be shared)
            self._writer = open_store(self._url)
        return getattr(self._writer or self._reader, name)

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


def fold_all(store: Store) -> tuple[list[tuple[RunInfo, RunState]], list[JournalError]]:
    """Every run's state; runs that cannot be read are returned as errors, not skipped."""
    states, errors = [], []
    for info in store.list_runs():
        try:
            states.append((info, load_state(store, info.run_id).state))  # snapshot + tail
        except JournalError as exc:
            errors.append(exc)
    return states, errors


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


def note(message: str) -> None:
    """Progress and advice: stderr, so stdout stays data (a store URL's password masked)."""
    click.echo(visible(mask_secrets(message), multiline=True), err=True)


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

