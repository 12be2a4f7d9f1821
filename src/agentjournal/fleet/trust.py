"""Which agents a worker runs: only those it was told to trust.

A queued run names its agent as text (``module:object``), and whoever can write to
the queue chooses that text; importing and calling whatever it names would let them
choose code for every worker (``os:fork``, ``os:abort``, a module left in the
worker's working directory). So a worker is given the agents it trusts, as either

- prefixes (``agentjournal worker --agents myapp.agents,...``): a ref is trusted
  when its module is a prefix or inside one (``myapp.agents`` trusts
  ``myapp.agents:x`` and ``myapp.agents.billing:y``, never ``myapp.agentsx:z``), or
  when it is given whole (``myapp.agents:reconciler`` trusts that ref only); or
- a registry (``Worker(agents={"myapp.agents:reconciler": reconciler})``): those
  refs, each mapped to an Agent (or a Runnable) or a factory of one; nothing is
  imported.

A ref is checked as text first, before anything is imported: dotted identifiers,
no private names, trusted. What a trusted ref names must then be an Agent, a
Runnable (an agent of another framework an integration drives: fleet/runnable.py),
a :class:`Versions` of them (several versions served during a rollout:
fleet/versions.py), or a factory of one: a function of the trusted modules, taking no arguments,
annotated to return an Agent, a Runnable class or Versions; it is called, and what it
returns must be one. Anything else (a builtin such as ``os.abort`` reached through
a trusted module, a function imported from elsewhere, a Tool) is refused without
being called. Refusals are AgentRefError, saying why.

Nothing here changes the import path: the CLI worker removes its working directory
from it and adds only the directories given with ``--import-path``.
"""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..agent import Agent, resolve_ref
from ..errors import AgentRefError
from .runnable import Runnable
from .versions import Versions

#: What a worker drives: agentjournal's own Agent, or another framework's (a Runnable).
Driven = Agent | Runnable
#: What a trusted ref names, once made: one agent, or the versions of one (a rollout).
Loaded = Driven | Versions
AgentFactory = Callable[[], Loaded]
#: What a worker is told to trust: prefixes (or whole refs), or a registry.
Trusted = Sequence[str] | Mapping[str, Loaded | AgentFactory]

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_DOTTED = rf"{_NAME}(?:\.{_NAME})*"
_REF = re.compile(rf"({_DOTTED}):({_DOTTED})")
_PREFIX = re.compile(rf"{_DOTTED}(?::{_DOTTED})?")
_FACTORY = ("a function of the trusted modules, taking no arguments, annotated -> Agent, "
            "-> a Runnable class or -> Versions")


def ref_problem(ref: str) -> str | None:
    """Why ``ref`` is not a well-formed ``module:object`` (None when it is)."""
    if _REF.fullmatch(ref) is None:
        return "it is not MODULE:OBJECT (dotted names, e.g. myagents:reconciler)"
    return None


class AgentTrust:
    """The agents a worker runs: :meth:`load` returns the Agent (or Runnable) a ref
    names, or raises AgentRefError saying why it is refused."""

    def __init__(self, agents: Trusted) -> None:
        if isinstance(agents, str):
            agents = agents.split(",")
        self.registry: dict[str, Loaded | AgentFactory] | None = None
        self.prefixes: tuple[str, ...] = ()
        names: Sequence[str]
        if isinstance(agents, Mapping):
            self.registry = dict(agents)
            names = list(self.registry)
            for ref in names:
                if problem := ref_problem(ref):
                    raise ValueError(f"registry key {ref!r}: {problem}")
        else:
            self.prefixes = names = tuple(p.strip() for p in agents)
            for prefix in names:
                if _PREFIX.fullmatch(prefix) is None:
                    raise ValueError(f"{prefix!r} is not a module prefix (myapp.agents) nor "
                                     "a whole agent ref (myapp.agents:reconciler)")
        if not names:
            raise ValueError("give the agents this worker trusts: module prefixes or a "
                             "registry of refs (a worker never runs whatever a queue names)")

    def describe(self) -> str:
        return ", ".join(self.prefixes if self.registry is None else sorted(self.registry))

    def check(self, ref: str) -> None:
        """Refuse ``ref`` as text: malformed, private, or not trusted. Imports nothing."""
        if problem := ref_problem(ref):
            raise AgentRefError(ref, problem)
        if any(part.startswith("_") for part in ref.partition(":")[2].split(".")):
            raise AgentRefError(ref, "it names a private attribute (one starting with _)")
        if not self._trusted(ref):
            raise AgentRefError(ref, f"not among the agents this worker trusts "
                                f"({self.describe()})")

    def load(self, ref: str) -> Driven:
        """The Agent (or Runnable) ``ref`` names, checked before anything is imported or
        called: the newest, if it names Versions of one."""
        loaded = self.load_versions(ref)
        return loaded.newest if isinstance(loaded, Versions) else loaded

    def load_versions(self, ref: str) -> Loaded:
        """What ``ref`` names, made: an Agent, a Runnable, or the Versions of one a
        worker serves during a rollout; checked as :meth:`load` does."""
        return _made(ref, self.resolve(ref))

    def whole_refs(self) -> list[str]:
        """The refs it was given whole (a registry's, or prefixes naming an object): a
        worker loads them at start, to say which versions it serves."""
        if self.registry is not None:
            return sorted(self.registry)
        return [p for p in self.prefixes if ":" in p]

    def resolve(self, ref: str) -> Loaded | AgentFactory:
        """What ``ref`` names, imported, if :meth:`load` would run it: an Agent, a
        Runnable, Versions of them, or a factory it may call (never called here); else
        AgentRefError."""
        self.check(ref)
        if self.registry is not None:
            return self.registry[ref]
        found = _resolve(ref)
        if _loaded(found):
            return typing.cast(Loaded, found)
        if problem := self._not_a_factory(found):
            raise AgentRefError(ref, f"it is {problem}, not an Agent, a Runnable or a "
                                f"factory of one ({_FACTORY})")
        return typing.cast(AgentFactory, found)

    def _trusted(self, ref: str) -> bool:
        if self.registry is not None:
            return ref in self.registry
        module = ref.partition(":")[0]
        return any(ref == p if ":" in p else _inside(module, p) for p in self.prefixes)

    def _not_a_factory(self, found: Any) -> str | None:
        """What ``found`` is, when it is not a factory this worker may call."""
        if not inspect.isfunction(found):
            if inspect.isbuiltin(found):
                return f"a builtin ({found.__module__}.{found.__qualname__})"
            return f"a {type(found).__name__}"
        module = getattr(found, "__module__", "") or ""
        if not any(_inside(module, p.partition(":")[0]) for p in self.prefixes):
            return f"a function defined in {module}, outside the trusted modules"
        try:
            inspect.signature(found).bind()
        except TypeError:
            return "a function that takes arguments"
        if not _returns_an_agent(found):
            return "a function not annotated to return an Agent or a Runnable class"
        return None


def _inside(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _resolve(ref: str) -> object:
    return resolve_ref(ref, "install it, or give the directory that holds it (--import-path)")


def _returns_an_agent(fn: Callable[..., Any]) -> bool:
    """Annotated to return an Agent, or a class with a Runnable's ``run_claimed``."""
    try:
        returned = typing.get_type_hints(fn).get("return")
    except Exception:  # an annotation that does not resolve says nothing we can trust
        return False
    return isinstance(returned, type) and (
        issubclass(returned, (Agent, Versions))
        or callable(getattr(returned, "run_claimed", None)))


def _driven(found: object) -> bool:
    """An Agent, or an instance of a Runnable (never a class or a function: those would
    have a ``run_claimed`` attribute without being one)."""
    return isinstance(found, Agent) or (
        not isinstance(found, type) and not inspect.isroutine(found)
        and isinstance(found, Runnable))


def _loaded(found: object) -> bool:
    """An agent (``_driven``), or Versions of agents."""
    return _driven(found) or isinstance(found, Versions)


def _made(ref: str, factory: Loaded | AgentFactory) -> Loaded:
    agent = factory if _loaded(factory) else typing.cast(AgentFactory, factory)()
    if not _loaded(agent):
        raise AgentRefError(ref, f"its factory returned a {type(agent).__name__}, not an "
                            "Agent or a Runnable (nor Versions of them)")
    if isinstance(agent, Versions):
        for member in agent.agents:
            if not _driven(member):
                raise AgentRefError(ref, f"its Versions hold a {type(member).__name__}, "
                                    "not an Agent or a Runnable")
    return typing.cast(Loaded, agent)
