"""``agentjournal ui``: the operator's window in a browser (the ``[ui]`` extra)."""

from __future__ import annotations

import secrets
import signal

import click

from ..errors import MissingExtraError
from ..store import mask_secrets
from ._base import CliError, _os_user, cli, note, store_option


@cli.command()
@store_option
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind. Anything but loopback needs a token.")
@click.option("--port", type=click.IntRange(0, 65535), default=8321, show_default=True)
@click.option("--allow-decisions", is_flag=True,
              help="Let the viewer approve, deny, resolve, fork and cancel (off: read only).")
@click.option("--token", envvar="AGENTJOURNAL_UI_TOKEN", metavar="TEXT",
              help="Require this token on every request (required off loopback; "
              "'generate' makes one). Env: AGENTJOURNAL_UI_TOKEN.")
@click.option("--by", default=_os_user, show_default="your OS user",
              help="Who decides, unless the form names someone (recorded in each event).")
def ui(store_url: str, host: str, port: int, allow_decisions: bool, token: str | None,
       by: str) -> None:
    """Serve the operator's window: what needs a person first (approvals, uncertain
    calls, escalations), then runs, each run's timeline with its gaps, time travel and a
    live tail; /metrics for Prometheus. Every page also answers as JSON (?format=json).

    \b
    Examples:
      agentjournal ui --store sqlite:///runs.db
      agentjournal ui --allow-decisions --by alice
      agentjournal ui --host 0.0.0.0 --token generate   # reachable from other machines
    """
    try:
        import uvicorn

        from ..ui import Viewer, is_loopback
    except (ImportError, MissingExtraError) as exc:
        raise CliError(str(MissingExtraError("ui", getattr(exc, "name", None) or "starlette")),
                       1) from None
    if token == "generate":
        token = secrets.token_urlsafe(24)
    if not is_loopback(host) and not token:
        raise click.UsageError(f"--host {host} serves other machines: give --token TEXT (or "
                               "--token generate), or bind 127.0.0.1")
    viewer = Viewer(store_url, allow_decisions=allow_decisions, token=token, host=host, by=by)
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{port}/" + (f"?token={token}" if token else "")
    note(f"agentjournal ui on {url} over {mask_secrets(store_url)}"
         f"{' (decisions on)' if allow_decisions else ' (read only)'}; Ctrl-C stops it")
    # uvicorn stops gracefully on SIGTERM, then raises it again: its default action would
    # end the process before the store is closed, leaving the -wal and -shm files a
    # read-only SQLite handle makes while open. Raised as an exit, it closes first.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        uvicorn.run(viewer.app, host=host, port=port, log_level="warning",
                    proxy_headers=False, server_header=False,
                    timeout_graceful_shutdown=2)  # live tails never end by themselves
    finally:
        viewer.close()


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)
