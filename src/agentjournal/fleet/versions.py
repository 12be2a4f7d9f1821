"""Which versions of an agent a worker serves, for rollouts (issue 43, point 5).

An agent carries a version (``Agent(..., version="v2")``, or a digest of what it is);
a worker serves, for each agent ref it has loaded, the version(s) of what the ref
names. During a rollout a release may keep serving the runs pinned to the version
before it: its ref then names a :class:`Versions`, the newest first::

    support = Versions(support_v2, support_v1)   # myapp/agents.py, during the rollout

A run submitted unpinned is claimed by any worker serving its ref and runs with the
newest version that worker has (it moves to it, and its ``run_resumed`` says so); a
run submitted with ``pin_version`` is claimed only by a worker serving that version,
and runs with it (fleet/queue.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..deploys import describe

if TYPE_CHECKING:
    from .trust import Driven


def version_of(agent: object) -> str | None:
    """The version ``agent`` (an Agent, or an integration's agent) carries, as
    ``deploys.describe`` reads it, else its ``version`` attribute; None if it has none."""
    shape = describe(agent)
    version = shape.version if shape is not None else getattr(agent, "version", None)
    return str(version) if version else None


class Versions:
    """Several versions of one agent, served by one worker during a rollout, the newest
    first: unpinned runs run with the newest, a run pinned to an older one with it.

    Each must carry a distinct version (``Agent(..., version=...)``, or the digest an
    agent is given without one); ValueError otherwise.
    """

    def __init__(self, newest: Driven, *older: Driven) -> None:
        self.agents: list[Driven] = [newest, *older]
        self.versions: list[str] = []
        for agent in self.agents:
            version = version_of(agent)
            if version is None:
                raise ValueError(f"Versions: {type(agent).__name__} {agent!r} carries no "
                                 "version: give each one (Agent(..., version='v2'))")
            if version in self.versions:
                raise ValueError(f"Versions: version {version!r} given twice: each agent "
                                 "of a rollout carries its own")
            self.versions.append(version)

    @property
    def newest(self) -> Driven:
        return self.agents[0]

    def get(self, version: str | None) -> Driven | None:
        """The agent of ``version`` (the newest for None); None if not served here."""
        if version is None:
            return self.newest
        found = [a for a, v in zip(self.agents, self.versions, strict=True) if v == version]
        return found[0] if found else None

    def __repr__(self) -> str:
        return f"Versions({', '.join(self.versions)})"


def served_by(loaded: object) -> list[str]:
    """The versions a loaded ref (an agent, or a Versions) serves, newest first."""
    if isinstance(loaded, Versions):
        return list(loaded.versions)
    version = version_of(loaded)
    return [version] if version else []


def pick(loaded: Driven | Versions, pin_version: str | None) -> Driven | None:
    """The agent of a loaded ref to run a run pinned to ``pin_version`` with (None: the
    newest); None when it does not serve that version."""
    if isinstance(loaded, Versions):
        return loaded.get(pin_version)
    if pin_version is None or version_of(loaded) == pin_version:
        return loaded
    return None
