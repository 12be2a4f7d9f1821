"""A run's files: workspace."""

from __future__ import annotations

import click
import msgspec

from ..store.base import missing_run
from ..workspace import WorkspaceError, restore_workspace, version_at, versions
from ._base import CliError, by_option, cli, json_option, note, opened, store_option
from ._safe import echo, emit_json, visible


@cli.command(name="workspace")
@click.argument("run_id", metavar="RUN")
@click.option("--at", type=click.IntRange(min=1), metavar="SEQ",
              help="The version in force at this seq (default: the newest).")
@click.option("--restore", "restore_seq", type=click.IntRange(min=1), metavar="SEQ",
              help="Put the files back as they were at SEQ (recorded in the run's log).")
@click.option("--force", is_flag=True,
              help="With --restore: even if the directory holds changes no checkpoint holds.")
@by_option
@json_option
@store_option
def workspace_cmd(run_id: str, at: int | None, restore_seq: int | None, force: bool, by: str,
                  as_json: bool, store_url: str) -> None:
    """Show the run's workspace version at a seq and its diff against the one before;
    or restore the files of a seq.

    \b
    Examples:
      agentjournal workspace q3 --at 12
      agentjournal workspace q3 --restore 12
    """
    with opened(store_url) as store:
        if restore_seq is not None:
            try:
                restored = restore_workspace(store, run_id, restore_seq, by=by, force=force)
            except WorkspaceError as exc:
                raise CliError(str(exc)) from None
            if as_json:
                emit_json(msgspec.to_builtins(restored))
            else:
                echo(f"restored the files of run {run_id} at seq {restored.seq} "
                     f"(commit {restored.commit})")
            return
        events = list(store.read(run_id))
        if not events:
            raise missing_run(store, run_id)
        ws, found = versions(events)
    version = version_at(found, at)
    if ws is None or version is None:
        raise CliError(f"run {run_id!r} recorded no workspace version"
                       + (f" at or before seq {at}" if at else ""), 2)
    diff = ws.diff(version.previous, version.commit) if version.commit else ""
    if as_json:
        emit_json({**msgspec.to_builtins(version), "directory": str(ws.directory),
                   "shadow": str(ws.shadow), "diff": diff})
        return
    echo(f"run {run_id}: workspace {ws.directory} at seq {version.seq}: "
         + (f"commit {version.commit}" if version.commit else f"not versioned "
            f"({version.skipped})"))
    echo(f"{version.count} file(s) changed since the version before: "
         + ", ".join(version.changed))
    if diff:
        click.echo(visible(diff, multiline=True))
    note(f"shadow store: {ws.shadow}")
