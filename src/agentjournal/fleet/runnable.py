"""What a worker can drive besides an agentjournal ``Agent``: a :class:`Runnable`.

An integration (a Pydantic AI agent made durable by ``JournalDurability``, an OpenAI
Agents SDK runner) drives a run with a loop that is not agentjournal's. To put such an
agent in the fleet, its ref names a ``Runnable`` (or a trusted factory of one, annotated
to return its class); the worker claims a run, then calls

    stopped = runnable.run_claimed(store, run_id, task, agent_ref=ref, owner=worker_id,
                                   ttl=ttl, stop=draining)

which must start or resume ``run_id`` on ``store`` holding the lease as ``owner`` (the
worker claimed it under that name: the run renews the claimed epoch, and a stale one is
fenced), keep the lease when it returns (the worker hands the run back, releasing the
lease in the same transaction), record ``agent_ref`` as the run's agent, and return
where the run stopped: its status, the seq of its last event and its lease epoch. It may
return early, the run still running, once ``stop`` is set (a draining worker); one that
cannot stop mid-run finishes first.

The trust rules are the same as for an Agent (fleet/trust.py): the ref is checked as text
before anything is imported, and a factory must be a function of the trusted modules,
taking no arguments, annotated to return an Agent or a Runnable class.
"""

from __future__ import annotations

import threading
from typing import NamedTuple, Protocol, runtime_checkable

from ..store import Store


class Stopped(NamedTuple):
    """Where a run a Runnable drove stopped: its status (as ``RunState.status``), the seq
    of its last event, and the lease epoch it held."""

    status: str
    last_seq: int
    epoch: int


@runtime_checkable
class Runnable(Protocol):
    """An agent of another framework that a worker can drive (see the module docstring)."""

    def run_claimed(self, store: Store, run_id: str, task: str | None, *, agent_ref: str,
                    owner: str, ttl: float, stop: threading.Event) -> Stopped: ...
