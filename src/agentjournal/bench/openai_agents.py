"""14. The OpenAI Agents SDK on agentjournal: what journaling costs a turn.

One SDK agent on the SDK's ``ScriptedModel`` runs N turns, each asking for one
read-only tool call, then answers. In the same rounds it runs four ways: by the SDK's
``Runner`` without a session (the floor); by ``JournalRunner`` on a fresh SQLite store
(every model answer and every call durable before it is used: ms per turn, ratio to the
floor); by ``Runner`` with the SDK's ``SQLiteSession`` in a file (the peer) and with a
``JournalSession`` on a SQLite store (ratio to the peer): conversation memory alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from pathlib import Path
from typing import Any

from ._common import Figure, Plan, Say, figure, medians


def openai_agents_problem() -> str | None:
    try:
        import agents  # noqa: F401
    except ImportError:
        return "skipped: the openai-agents extra is not installed"
    return None


def _agent(turns: int) -> tuple[Any, dict[str, Any]]:
    """An agent that ticks ``turns`` times (one read-only call a turn), then answers."""
    from agents import Agent, function_tool
    from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call

    from ..integrations.openai_agents import ToolPolicy

    @function_tool
    def tick(i: int) -> int:
        """Count turn `i`."""
        return i

    def answer(call: Any) -> Any:
        done = sum(isinstance(i, dict) and i.get("type") == "function_call_output"
                   for i in call.input)
        if done < turns:
            return [function_call("tick", {"i": done}, call_id=f"call_{done}")]
        return [assistant_message(f"ticked {done}")]

    model = ScriptedModel([ModelStep.respond(answer) for _ in range(turns + 1)])
    return (Agent(name="ticker", model=model, tools=[tick]),
            {"tick": ToolPolicy(effect="read_only")})


class _Rounds:
    """Each way of running the agent, timed in ms per turn."""

    def __init__(self, workdir: Path, turns: int) -> None:
        self.workdir, self.turns = workdir, turns

    def _path(self, suffix: str) -> Path:
        return self.workdir / f"sdk-{uuid.uuid4().hex[:8]}.{suffix}"

    def _timed(self, run: Any) -> float:
        start = time.perf_counter()
        result = run()
        elapsed = time.perf_counter() - start
        if result.final_output != f"ticked {self.turns}":
            raise RuntimeError(f"the run ended with {result.final_output!r}")
        return elapsed * 1e3 / self.turns

    def sdk(self) -> float:
        from agents import Runner

        agent, _ = _agent(self.turns)
        return self._timed(lambda: Runner.run_sync(agent, "tick", max_turns=self.turns + 2))

    def journal_runner(self) -> float:
        from ..integrations.openai_agents import JournalRunner
        from ..store import open_store

        agent, policies = _agent(self.turns)
        with contextlib.closing(open_store(f"sqlite:///{self._path('db')}")) as store:
            return self._timed(lambda: JournalRunner.run_sync(
                agent, "tick", store=store, run_id="bench", policies=policies, trace=False,
                max_turns=self.turns + 2))

    def sqlite_session(self) -> float:
        from agents import Runner, SQLiteSession

        agent, _ = _agent(self.turns)
        session = SQLiteSession("bench", self._path("db"))
        try:
            return self._timed(lambda: Runner.run_sync(agent, "tick", session=session,
                                                       max_turns=self.turns + 2))
        finally:
            session.close()

    def journal_session(self) -> float:
        from agents import Runner

        from ..integrations.openai_agents import JournalSession
        from ..store import open_store

        agent, _ = _agent(self.turns)
        with contextlib.closing(open_store(f"sqlite:///{self._path('db')}")) as store:
            session = JournalSession(store, "bench")
            return self._timed(lambda: Runner.run_sync(agent, "tick", session=session,
                                                       max_turns=self.turns + 2))


def openai_agents_figures(workdir: Path, plan: Plan, say: Say) -> list[Figure]:
    turns = plan.sdk_turns
    names = ("openai_agents.turn.journal_runner", "openai_agents.turn.journal_session")
    if problem := openai_agents_problem():
        return [figure(name, None, "ms/turn", note=problem) for name in names]
    say(f"openai-agents: a {turns}-turn SDK run four ways, x {plan.reps}")
    rounds = _Rounds(workdir, turns)
    with contextlib.suppress(RuntimeError):  # a loop left by another section
        asyncio.get_event_loop_policy().set_event_loop(None)
    sdk, journal, peer, session = medians(plan.reps, [
        rounds.sdk, rounds.journal_runner, rounds.sqlite_session, rounds.journal_session])
    return [
        figure(names[0], journal, "ms/turn", sdk, "the SDK's Runner, no session",
               f"{turns} turns (a model answer and one read-only call each), SQLite, synced: "
               "each answer and each call durable before it is used"),
        figure(names[1], session, "ms/turn", peer, "the SDK's SQLiteSession (a file)",
               f"the same {turns}-turn run by the SDK's Runner with a JournalSession on SQLite "
               "(synced, one append per add_items)"),
    ]
