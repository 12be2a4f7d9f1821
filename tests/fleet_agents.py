"""Agents for tests/test_worker.py, run by real worker processes as ``tests.fleet_agents:NAME``.

Their one tool, ``record(label)``, appends ``run_id label key`` to the file named by
``$FLEET_EFFECTS`` (one short O_APPEND write: lines never interleave): the test
judges effects by that file, not by the library's log.
"""

from __future__ import annotations

import os
import time

from agentjournal import Agent, ScriptedModel, calls, reply, tool
from agentjournal.policy import Rules
from agentjournal.tools import Tool, ToolContext, Undo

ENV = "FLEET_EFFECTS"


def _write_line(run_id: str, label: str, key: str) -> None:
    line = f"{run_id} {label} {key}\n".encode()
    fd = os.open(os.environ[ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def _append(ctx: ToolContext, label: str) -> str:
    _write_line(ctx.run_id, label, ctx.key)
    return f"recorded {label}"


def _record(sleep: float = 0.0) -> Tool:
    @tool(effect="irreversible")
    def record(ctx: ToolContext, label: str) -> str:
        """Record that `label` happened, once."""
        if sleep:
            time.sleep(sleep)
        return _append(ctx, label)

    return record


def counter() -> Agent:
    """Two effects, then done."""
    return Agent(ScriptedModel([calls(("record", {"label": "a"})),
                                calls(("record", {"label": "b"})), reply("done")]),
                 [_record()])


def slow() -> Agent:
    """Three turns, each an effect that takes 0.5 s: a drain lands mid-run."""
    return Agent(ScriptedModel([*(calls(("record", {"label": f"s{i}"})) for i in range(3)),
                                reply("done")]), [_record(0.5)])


def needs_approval() -> Agent:
    """An effect a person must approve first."""
    return Agent(ScriptedModel([calls(("record", {"label": "approved"})), reply("done")]),
                 [_record()], policy=Rules(require_approval={"record"}))


@tool(effect="irreversible")
def cut_off(ctx: ToolContext, label: str, lands: bool) -> str:
    """Record ``label``; the first try's answer is lost (a timeout), after the effect
    landed if ``lands``, before it otherwise: an uncertain call either way."""
    tried = f"{os.environ[ENV]}.tried-{ctx.run_id}-{label}"
    if not os.path.exists(tried):
        open(tried, "w").close()
        if lands:
            _append(ctx, label)
        raise TimeoutError(f"recording {label}: read timed out")
    return _append(ctx, label)


def two_uncertain() -> Agent:
    """Two calls of one turn cut off, one after its effect landed: a person resolves both."""
    return Agent(ScriptedModel([calls(("cut_off", {"label": "landed", "lands": True}),
                                      ("cut_off", {"label": "lost", "lands": False})),
                                reply("done")]), [cut_off])


@tool(effect="read_only")
def explode(ctx: ToolContext) -> str:
    """Kill the process running this run (a poison run: retried, it kills again)."""
    _append(ctx, "explode")
    os._exit(1)


def poison() -> Agent:
    return Agent(ScriptedModel([calls(("explode", {})), reply("done")]), [explode])


def _undo(undo: Undo) -> str:
    """Undo one ``hold``: a line ``run_id undo:label key`` in the effects file."""
    _write_line(undo.run_id, f"undo:{undo.args['label']}", undo.key)
    return f"released {undo.args['label']}"


@tool(effect="reversible", identity=["label"], compensate=_undo)
def hold(ctx: ToolContext, label: str) -> str:
    """Hold something that can be released."""
    return _append(ctx, label)


def poison_after_holds() -> Agent:
    """Two holds, then a tool that kills its worker: a run that fails for good."""
    return Agent(ScriptedModel([calls(("hold", {"label": "h1"})), calls(("hold", {"label": "h2"})),
                                calls(("explode", {})), reply("done")]), [hold, explode])


def broken() -> Agent:
    """A factory that raises: each claim of its run crashes."""
    raise RuntimeError("the factory is broken")
