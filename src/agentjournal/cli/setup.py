"""Creating a store: ``agentjournal init``. Reading commands never create one."""

from __future__ import annotations

from ..store import local_path, open_store
from ._base import _check_target, cli, note, store_option


def describe(url: str) -> str:
    """Where ``url`` points, for people: a file store's absolute path, else the URL
    as the store reports it (a Postgres password left out)."""
    local = local_path(url)
    return f"{local[1].absolute()} ({local[0]})" if local else url


@cli.command()
@store_option
def init(store_url: str) -> None:
    """Create an empty store at --store (or make sure one is there, up to date).

    A file or schema that is not an agentjournal store is refused and left as it was
    (exit 3). `agentjournal run` creates a store too; reading commands never do.

    \b
    Example:
      agentjournal init --store sqlite:////var/lib/agentjournal/runs.db
    """
    _check_target(store_url, create=True)
    local = local_path(store_url)
    existed = local is not None and local[1].exists() and local[1].stat().st_size > 0
    store = open_store(store_url)
    try:
        store.list_runs()  # an existing store must read: damage is reported, not "ready"
        where = describe(store_url) if local else store.url
    finally:
        store.close()
    note(f"{'store ready' if existed else 'created a store'} at {where}")
