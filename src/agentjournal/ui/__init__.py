"""``agentjournal ui``: the operator's window over a store (the ``[ui]`` extra).

It leads with what needs a person (pending approvals, uncertain calls, escalations,
oldest first), then lists runs and shows each run's timeline, its state at any seq,
and a live tail. Every page answers as JSON too. It reads through the store (each
run's outline, its events, its snapshots, checked as ``load_state`` checks them) and
``fold``, never folding every run, and decides through the same functions as the
CLI (``record_approval``, ``record_resolution``, ``fork``, ``cancel``), only when
started with ``--allow-decisions``. See docs/ui.md.
"""

from __future__ import annotations

from ..errors import MissingExtraError

try:
    import jinja2  # noqa: F401
    import starlette  # noqa: F401
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise MissingExtraError("ui", exc.name or "starlette") from None

from .app import create_app, is_loopback
from .server import Viewer, open_viewer

__all__ = ["Viewer", "create_app", "is_loopback", "open_viewer"]
