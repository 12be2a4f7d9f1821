"""Deploys: what new agent code does to a run recorded under the old code.

History is history: a run's state is a fold of recorded facts, so a resume under
changed code continues from them (recorded turns are never asked again; the next
turn is asked with the new instructions, tools and model). Only a recorded fact the
change makes unusable stops a run, and then for a person, never a crash loop or a
silent second effect:

    a call started and never completed (uncertain), or waiting for approval, whose
    tool is gone (removed, or renamed without ``renamed=``)   -> a person
    ... whose tool's identity fields or effect class changed  -> a person
    ... whose recorded arguments the tool no longer accepts   -> a person
    anything else (instructions, a tool added, another model) -> continue

An agent's :class:`AgentShape` is what a deploy can change; :func:`forecast` judges
one run's state against it. It is pure (no I/O, nothing appended): ``agentjournal
check`` calls it over a store before a deploy, and the native loop calls it on every
resume, so the two never disagree. Integrations append a describer to
:data:`DESCRIBERS` for their agent objects.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from .keys import idempotency_key
from .redaction import was_redacted

if TYPE_CHECKING:
    from .state import RunState
    from .tools import Tool

__all__ = ["DESCRIBERS", "AgentShape", "Forecast", "ToolShape", "agent_shape", "describe",
           "digest", "forecast", "instructions_digest", "tool_shape"]

#: Checks a call's recorded arguments against a tool's schema now: None when they
#: validate, else why not (in words a person can act on).
ArgsCheck = Callable[[Mapping[str, Any]], "str | None"]


@dataclass(frozen=True)
class ToolShape:
    """What a deploy may change about one tool. ``identity``: the argument names its
    idempotency key is derived from (None: all of them). ``check_args`` (not compared):
    validates recorded arguments against the schema now, when the describer can."""

    name: str
    effect: str
    identity: tuple[str, ...] | None
    schema_digest: str
    check_args: ArgsCheck | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class AgentShape:
    """What a deploy may change about an agent. ``version``: given by the user, or a
    digest of the rest. ``renamed``: old tool name -> new, for calls recorded under a
    name the agent no longer has (settled under the new tool with their old key)."""

    version: str
    instructions_digest: str
    model: str | None
    tools: Mapping[str, ToolShape]
    strict: bool = False
    renamed: Mapping[str, str] = field(default_factory=dict)

    def tool(self, recorded_name: str) -> ToolShape | None:
        """The tool that now serves calls recorded under ``recorded_name``."""
        found = self.tools.get(recorded_name)
        if found is None and recorded_name in self.renamed:
            found = self.tools.get(self.renamed[recorded_name])
        return found


Action = Literal["continue", "pause", "refuse", "done"]


@dataclass(frozen=True)
class Forecast:
    """What a resume of ``run_id`` under ``shape`` does. ``changes``: what changed since
    the run's version, as far as its record shows; ``calls``: (call id, tool, why a
    person is needed) for each recorded call the change made unusable."""

    run_id: str
    action: Action
    changes: tuple[str, ...]
    calls: tuple[tuple[str, str, str], ...]
    sentence: str


# --- shapes ----------------------------------------------------------------------------


def digest(value: Any) -> str:
    """A short stable digest of JSON-able ``value``: "sha256:" and 12 hex digits."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=repr)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:12]


def instructions_digest(instructions: str | None) -> str:
    return digest(["instructions", instructions])


def tool_shape(tool: Tool) -> ToolShape:
    """A native tool's shape: its schema digest covers name, description, parameters."""
    def check(args: Mapping[str, Any]) -> str | None:
        try:
            tool.check_args(dict(args))
        except msgspec.ValidationError as exc:
            return str(exc)
        return None

    return ToolShape(name=tool.name, effect=str(tool.effect), identity=tool.identity or None,
                     schema_digest=digest(tool.spec()), check_args=check)


def model_identity(model: object) -> str:
    """A model's class, and its model name when it has one (``model`` or ``model_name``)."""
    kind = f"{type(model).__module__}.{type(model).__qualname__}"
    name = next((v for a in ("model", "model_name")
                 if isinstance(v := getattr(model, a, None), str)), None)
    return f"{kind}:{name}" if name else kind


def agent_shape(*, instructions: str | None, tools: Iterable[ToolShape], model: str | None,
                version: str | None = None, strict: bool = False,
                renamed: Mapping[str, str] | None = None) -> AgentShape:
    """An agent's shape; ``version`` derived from the rest when not given."""
    by_name = {t.name: t for t in tools}
    idigest = instructions_digest(instructions)
    if version is None:
        version = digest([idigest, model, [
            [t.name, t.effect, list(t.identity) if t.identity else None, t.schema_digest]
            for t in sorted(by_name.values(), key=lambda t: t.name)]])
    return AgentShape(version=version, instructions_digest=idigest, model=model,
                      tools=by_name, strict=strict, renamed=dict(renamed or {}))


def _describe_native(obj: object) -> AgentShape | None:
    from .agent import Agent  # the agent module imports this one
    return obj.shape if isinstance(obj, Agent) else None


#: Functions that describe an agent object, or return None for one they do not know;
#: the first answer wins. Integration modules append theirs.
DESCRIBERS: list[Callable[[object], AgentShape | None]] = [_describe_native]


def describe(obj: object) -> AgentShape | None:
    """The shape of agent ``obj`` (native, or one an integration describes), or None."""
    for describer in DESCRIBERS:
        shape = describer(obj)
        if shape is not None:
            return shape
    return None


# --- the judgement -----------------------------------------------------------------------


def forecast(state: RunState, shape: AgentShape, *, strict: bool | None = None,
             accept: bool = False) -> Forecast:
    """What a resume of the run in ``state`` under ``shape`` does. ``strict`` overrides
    ``shape.strict`` (a per-run choice); ``accept``: the resume says it accepts a change
    (``change_instructions=True``), which strict mode then lets through. No I/O."""
    strict = shape.strict if strict is None else strict
    if state.status in ("finished", "cancelled") or state.saga is not None:
        why = ("it is being compensated (agentjournal compensate goes on with it)"
               if state.saga is not None and state.status != "cancelled" else
               f"it is {state.status}")
        return Forecast(state.run_id, "done", (), (), f"run {state.run_id}: nothing to resume: "
                        f"{why}")
    recorded = state.versions[-1] if state.versions else None
    if recorded == shape.version:
        # The code that continued it last. Its open calls are judged all the same: that
        # resume may have paused for them (the change came with it).
        calls = calls_for_a_person(state, shape)
        if calls:
            return Forecast(state.run_id, "pause", what_changed(state, shape), calls,
                            pause_reason(state, shape, calls))
        return Forecast(state.run_id, "continue", (), (),
                        f"run {state.run_id}: continues; the agent did not change "
                        f"({shape.version})")
    changes = what_changed(state, shape)
    changed = recorded is not None or "instructions" in changes
    if strict and changed and not accept:
        return Forecast(state.run_id, "refuse", changes, (), (
            f"run {state.run_id}: refused in strict mode: the agent changed since "
            f"{recorded or 'the run started'} ({'; '.join(changes) or 'version'}); resume it "
            "with the code that recorded it, accept the change (Agent.run(..., "
            "change_instructions=True)), or resume without strict mode to continue from "
            "its history"))
    calls = calls_for_a_person(state, shape)
    if calls:
        return Forecast(state.run_id, "pause", changes, calls, pause_reason(state, shape, calls))
    since = f" since {recorded}" if recorded else ""
    return Forecast(state.run_id, "continue", changes, (),
                    f"run {state.run_id}: continues under {shape.version}"
                    + (f"; changed{since}: {'; '.join(changes)}" if changes else ""))


def what_changed(state: RunState, shape: AgentShape) -> tuple[str, ...]:
    """What changed since the run's version, as far as its record shows: the version,
    the instructions, tools it called that are gone or renamed, and the effect class of
    tools its open calls were started with. (Tools added or a model switched change the
    version; the record names neither.)"""
    out: list[str] = []
    recorded = state.versions[-1] if state.versions else None
    if recorded is not None and recorded != shape.version:
        out.append(f"version {recorded} -> {shape.version}")
    if instructions_digest(state.instructions) != shape.instructions_digest:
        out.append("instructions")
    used = tools_used(state)
    renamed = sorted(f"{n} -> {shape.renamed[n]}" for n in used
                     if n not in shape.tools and n in shape.renamed)
    gone = sorted(n for n in used if shape.tool(n) is None)
    if gone:
        out.append(f"tools removed: {', '.join(gone)}")
    if renamed:
        out.append(f"tools renamed: {', '.join(renamed)}")
    effects = sorted({f"{p.tool}: {p.effect} -> {t.effect}" for p in state.pending.values()
                      if (t := shape.tool(p.tool)) is not None and t.effect != p.effect})
    if effects:
        out.append(f"effect changed: {', '.join(effects)}")
    return tuple(out)


def tools_used(state: RunState) -> set[str]:
    """The tool names the run's record holds: calls the model asked for, started calls
    and approvals (a per-resume scan of its messages, never per step)."""
    names = {c.name for m in state.messages for c in m.tool_calls}
    names.update(c.name for c in state.awaiting.values())
    names.update(p.tool for p in state.pending.values())
    names.update(a.tool for a in state.approvals.values())
    return names


def calls_for_a_person(state: RunState, shape: AgentShape) -> tuple[tuple[str, str, str], ...]:
    """(call id, tool, why) for each open call (started, never completed) and each
    pending approval the change made unusable."""
    out: list[tuple[str, str, str]] = []
    for p in state.pending.values():
        if p.effect == READ_ONLY and _still_a_read(shape.tool(p.tool)):
            continue  # a read made nothing: recovery reads again, or tells the model it's gone
        why = _unusable(state, shape, p.tool, p.key, p.args, effect=p.effect)
        if why is not None:
            out.append((p.call_id, p.tool, f"its call {p.call_id} (key {p.key[:16]}) was "
                        f"started and never completed, and {why}"))
    for a in state.approvals.values():
        why = _unusable(state, shape, a.tool, a.key, a.args, effect=None)
        if why is not None:
            call_id = next((c.id for c in state.awaiting.values()
                            if c.name == a.tool and c.args == a.args), a.approval_id)
            out.append((call_id, a.tool, f"its call {call_id} waits for approval "
                        f"{a.approval_id}, and {why}"))
    return tuple(out)


READ_ONLY = "read_only"


def _still_a_read(tool: ToolShape | None) -> bool:
    """Whether an open read-only call is still only a read (or its tool is gone): then
    nothing it did can be doubled, and no person is needed."""
    return tool is None or tool.effect == READ_ONLY


def _unusable(state: RunState, shape: AgentShape, name: str, key: str, args: dict[str, Any],
              *, effect: str | None) -> str | None:
    """Why the recorded call (``name``, ``key``, ``args``) cannot be settled or made by the
    tool that now serves the name, or None."""
    tool = shape.tool(name)
    if tool is None:
        return (f"tool {name!r} is no longer in the agent (removed or renamed; a renamed "
                "tool is mapped with Agent(..., renamed={'old': 'new'}))")
    now = f"tool {name!r}" + (f" (now {tool.name!r})" if tool.name != name else "")
    if effect is not None and effect != tool.effect:
        return (f"{now} changed its effect class from {effect} to {tool.effect}: "
                "it was started under the old one")
    if was_redacted(args):
        return None  # the recorded arguments are not the call's: nothing more to compare
    try:
        # The key as the call's record made it: under the recorded name, the identity now.
        again = idempotency_key(state.scope, name, args, tool.identity)
    except ValueError:
        again = None
    if again != key:
        return (f"{now} changed its identity fields (to "
                f"{', '.join(tool.identity) if tool.identity else 'all arguments'}): the "
                "recorded key no longer names the call")
    if tool.check_args is not None and (bad := tool.check_args(args)) is not None:
        return f"{now} no longer accepts the recorded arguments ({bad})"
    return None


def pause_reason(state: RunState, shape: AgentShape,
                 calls: Iterable[tuple[str, str, str]]) -> str:
    """The run_paused reason: what changed under which calls, and what a person can do."""
    calls = list(calls)
    run = state.run_id
    whys = "; ".join(f"{tool}: {why}" for _, tool, why in calls)
    started = {p.call_id for p in state.pending.values()}
    can = []
    if any(call_id in started for call_id, _, _ in calls):
        can.append(f"settle a started call with `agentjournal resolve {run} KEY --happened` "
                   "or `--did-not-happen`")
    if state.approvals:
        can.append(f"deny an approval with `agentjournal deny {run} APPROVAL_ID`")
    if any(shape.tool(tool) is None for _, tool, _ in calls):
        can.append("map a renamed tool with Agent(..., renamed={'old': 'new'})")
    can.append(f"cancel with compensation (`agentjournal cancel {run} --compensate`)")
    return (f"the agent changed under calls a person must settle: {whys}. A person "
            f"decides: {', '.join(can[:-1])}, or {can[-1]}; then resume the run")
