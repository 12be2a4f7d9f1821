"""Retention: gc (archive finished runs, prune snapshots) and restore."""

from __future__ import annotations

import re
from datetime import timedelta

import click
import msgspec

from ..archive import ArchiveError
from ..retention import RetentionPolicy, gc, restore
from ._base import CliError, cli, human_age, json_option, note, opened, progress, store_option
from ._safe import echo, emit_json

_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw]?)")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


class Duration(click.ParamType):  # type: ignore[type-arg]
    name = "DURATION"

    def convert(self, value: object, param: click.Parameter | None,
                ctx: click.Context | None) -> timedelta:
        if isinstance(value, timedelta):
            return value
        found = _DURATION.fullmatch(str(value).strip())
        if found is None:
            self.fail(f"{value!r} is no duration: give a number and a unit, e.g. 30d, 12h, "
                      "90m or 45s", param, ctx)
        return timedelta(seconds=float(found[1]) * _UNITS[found[2]])


def _size(n: int) -> str:
    size, unit = float(n), "B"
    for bigger in ("KB", "MB", "GB"):
        if size < 1024:
            break
        size, unit = size / 1024, bigger
    return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"


@cli.command(name="gc")
@click.option("--finished-older-than", "older", type=Duration(), metavar="DURATION",
              help="Archive finished runs whose last event is older than this (30d, 12h...), "
                   "then delete them from the store, leaving a tombstone. Needs --archive.")
@click.option("--archive", "archive_url", metavar="URL",
              help="Where archived logs go: file:///directory (one .jsonl.gz per run).")
@click.option("--keep-snapshots", type=click.IntRange(min=0), metavar="N",
              help="Prune every remaining run's snapshots to the newest N.")
@click.option("--dry-run", is_flag=True, help="List what would be done; change nothing.")
@json_option
@store_option
def gc_cmd(older: timedelta | None, archive_url: str | None, keep_snapshots: int | None,
           dry_run: bool, as_json: bool, store_url: str) -> None:
    """Archive finished runs and prune snapshots, never losing evidence.

    A run is archived only if it is finished, idle for longer than
    --finished-older-than, holds no uncertain call, pending approval, waiting
    escalation or unfinished saga, no receiver may still remember its keys, and
    every run of its scope (its forks) qualifies too. Its archive is written,
    synced and read back before the run is deleted.

    \b
    Examples:
      agentjournal gc --finished-older-than 30d --archive file:///var/lib/aj/archive --dry-run
      agentjournal gc --finished-older-than 30d --archive file:///var/lib/aj/archive
      agentjournal gc --keep-snapshots 1
    """
    if older is not None and archive_url is None:
        raise CliError("--finished-older-than needs --archive URL: the logs go there first")
    if archive_url is not None and older is None:
        raise CliError("--archive needs --finished-older-than: which runs to archive")
    if older is None and keep_snapshots is None:
        raise CliError("give --finished-older-than with --archive, --keep-snapshots, or both "
                       "(see 'agentjournal gc --help')")
    policy = RetentionPolicy(finished_older_than=older, archive=archive_url,
                             keep_snapshots=keep_snapshots)
    with opened(store_url) as store, progress("gc: looking at runs") as update:
        try:
            report = gc(store, policy, dry_run=dry_run, progress=update)
        except ArchiveError as exc:
            raise CliError(str(exc), 2 if exc.missing else 1) from None
    if as_json:
        emit_json(msgspec.to_builtins(report))
        return
    archive, prune, free = (("would archive", "would prune", "would free") if dry_run
                            else ("archived", "pruned", "freed"))
    for v in report.verdicts:
        if v.action == "archive" or dry_run:
            size = "" if v.bytes is None else f", {_size(v.bytes)}"
            echo(f"{archive if v.action == 'archive' else 'keep'} {v.run_id} ({v.events} "
                 f"events{size})" + ("" if v.action == "archive" else f": {v.reason}"))
    took = human_age(report.seconds) if report.seconds >= 1 else f"{report.seconds:.2f}s"
    echo(f"{'dry run: ' if dry_run else ''}examined {report.examined} run(s): {archive} "
         f"{report.archived} ({report.events_archived} events), kept {report.kept}; {prune} "
         f"{report.snapshots_pruned} snapshot(s)"
         + (f" and {report.segments_pruned} unnamed segment(s)" if report.segments_pruned
            else "") + f"; {free} {_size(report.bytes_freed)}"
         + (f"; archive files {_size(report.archive_bytes)}" if report.archive_bytes else "")
         + f"; {took}")
    if report.kept and not dry_run:
        note("kept runs and why: agentjournal gc ... --dry-run (or --json)")


@cli.command(name="restore")
@click.argument("run_id", metavar="RUN")
@click.option("--archive", "archive_url", required=True, metavar="URL",
              help="The archive gc wrote the run to (file:///directory).")
@json_option
@store_option
def restore_cmd(run_id: str, archive_url: str, as_json: bool, store_url: str) -> None:
    """Bring a run gc archived back into the store, byte for byte.

    \b
    Example:
      agentjournal restore q3 --archive file:///var/lib/aj/archive
    """
    with opened(store_url) as store:
        try:
            restored = restore(store, run_id, archive_url)
        except ArchiveError as exc:
            raise CliError(str(exc), 2 if exc.missing else 3) from None
    if as_json:
        emit_json(msgspec.to_builtins(restored))
    elif restored.already:
        echo(f"run {run_id} is in the store already, identical to the archive "
             f"({restored.events} events); nothing to do")
    else:
        echo(f"restored run {run_id}: {restored.events} events from {restored.archive} "
             f"(sha256 {restored.digest[:16]})")
