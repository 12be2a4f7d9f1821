"""Real models: a turn's parallel calls, and the loop's overhead with a real adapter.

Parallel: a turn asking for 8 calls of a 100 ms tool, against the same turn with
one call (the floor): concurrent calls make the ratio near 1, not 8.

Adapter: the same run driven by ScriptedModel, and by a real SDK client through
its adapter against the loopback stub server. The loop's part of a step (the
run's time outside the model call) is compared with the scripted run's; the
call's own part is reported with the stub's own time (the same HTTP exchanges
made by a bare ``http.client``, replayed) subtracted.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

from ..agent import Agent
from ..models import Model, ModelRequest, ModelResponse, ScriptedModel, calls, reply
from ..policy import Budget
from ..state import ToolCall
from ..store import open_store
from ..testing.llm_stub import Reply, StubServer
from ..tools import tool
from ._common import Figure, Plan, Say, figure, medians, order_result, store_url

CALL_SECONDS = 0.1
PARALLEL = 8


def _sleeper(is_async: bool) -> Any:
    if is_async:
        @tool(effect="read_only", name="wait")
        async def await_(i: int) -> int:
            await asyncio.sleep(CALL_SECONDS)
            return i
        return await_

    @tool(effect="read_only")
    def wait(i: int) -> int:
        time.sleep(CALL_SECONDS)
        return i
    return wait


def _turn_ms(workdir: Path, n: int, is_async: bool) -> float:
    """The run's wall time (two turns: n calls, then the answer), ms."""
    model = ScriptedModel([calls(*[("wait", {"i": i}) for i in range(n)]), reply("done")])
    agent = Agent(model, [_sleeper(is_async)], snapshot_every=None)
    store = open_store(store_url("sqlite", workdir / f"par-{uuid.uuid4().hex[:8]}"))
    try:
        start = time.perf_counter()
        if is_async:
            asyncio.run(agent.arun(store, "par", "wait"))
        else:
            agent.run(store, "par", "wait")
        return (time.perf_counter() - start) * 1e3
    finally:
        store.close()


def _reps(plan: Plan) -> int:
    return min(plan.reps, 3)  # each round is a few seconds of real time


def parallel_figures(workdir: Path, plan: Plan, say: Say) -> list[Figure]:
    out = []
    for is_async in (False, True):
        mode = "async" if is_async else "sync"
        say(f"parallel calls ({mode}): {PARALLEL} x {CALL_SECONDS * 1e3:.0f} ms, "
            f"x {_reps(plan)}")
        one, many = medians(_reps(plan), [partial(_turn_ms, workdir, 1, is_async),
                                        partial(_turn_ms, workdir, PARALLEL, is_async)])
        out.append(figure(f"parallel_turn.{mode}.{PARALLEL}x100ms", many, "ms", one,
                          f"the same turn with 1 call ({mode})",
                          note=f"{'arun, async def tool' if is_async else 'run, sync tool'}; "
                               "target ≤ 1.5x"))
    return out


# --- the loop's overhead with a real adapter -------------------------------------------


def _order_call(n: int) -> tuple[str, dict[str, Any]]:
    return "lookup", {"order": f"ord-{n:06d}"}


def _lookup() -> Any:
    @tool(effect="read_only")
    def lookup(order: str) -> dict[str, Any]:
        return order_result(int(order[4:]))
    return lookup


class _Scripted:
    def __init__(self, steps: int) -> None:
        self.steps = steps

    def complete(self, request: ModelRequest) -> ModelResponse:
        n = request.turn
        if n >= self.steps:
            return reply("all reconciled")
        name, args = _order_call(n)
        return ModelResponse(text="next", tool_calls=[ToolCall(id=f"c{n}", name=name,
                                                               args=args)])


def _stub_turns(steps: int) -> Callable[[dict[str, Any]], Reply]:
    def answer(body: dict[str, Any]) -> Reply:
        turn = sum(1 for m in body.get("messages", ()) if m.get("role") == "assistant")
        return Reply(text="next", calls=[_order_call(turn)]) if turn < steps else Reply(
            text="all reconciled")
    return answer


class _Timed:
    """A model, and the time spent inside it: the rest of a run is the loop's."""

    def __init__(self, model: Model) -> None:
        self.model = model
        self.seconds = 0.0

    def complete(self, request: ModelRequest) -> ModelResponse:
        start = time.perf_counter()
        try:
            return self.model.complete(request)
        finally:
            self.seconds += time.perf_counter() - start


def _run(workdir: Path, model: Model, steps: int) -> tuple[float, float]:
    """The run's wall time and the part of it spent in the model, seconds."""
    timed = _Timed(model)
    agent = Agent(timed, [_lookup()], snapshot_every=None, budget=Budget.unlimited())
    store = open_store(store_url("sqlite", workdir / f"adapter-{uuid.uuid4().hex[:8]}",
                                 "durability=batched"))
    try:
        start = time.perf_counter()
        result = agent.run(store, "adapter", "look up every order")
        elapsed = time.perf_counter() - start
    finally:
        store.close()
    if result.status != "finished":
        raise RuntimeError(f"the benchmark agent stopped {result.status}: {result.pause_reason}")
    return elapsed, timed.seconds


@contextlib.contextmanager
def _stub_process(workdir: Path, steps: int) -> Iterator[str]:
    """The stub in a process of its own (in a thread it would take the GIL from the
    loop it is measured against), scripted for ``steps`` tool turns; its base URL."""
    tag = uuid.uuid4().hex[:8]
    script, port_file = workdir / f"script-{tag}.json", workdir / f"port-{tag}"
    turns = [{"type": "reply", "text": "next", "calls": [list(_order_call(n))]}
             for n in range(steps)]
    script.write_text(json.dumps([*turns, {"type": "reply", "text": "all reconciled"}]))
    proc = subprocess.Popen([sys.executable, "-m", "agentjournal.testing.llm_stub",
                             "--port-file", str(port_file), "--script", str(script)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not port_file.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the stub server did not start")
            time.sleep(0.01)
        yield f"http://127.0.0.1:{port_file.read_text()}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


class _Recorded(NamedTuple):
    bodies: list[dict[str, Any]]  # the requests the adapter made
    responses: list[ModelResponse]  # what it returned, turn by turn


def _record(steps: int) -> _Recorded:
    """One run through the adapter on an in-process stub, capturing both sides."""
    import openai

    from ..providers import OpenAIChatModel
    responses: list[ModelResponse] = []

    class Capture:
        def __init__(self, model: Model) -> None:
            self.model = model

        def complete(self, request: ModelRequest) -> ModelResponse:
            responses.append(self.model.complete(request))
            return responses[-1]

    with StubServer([_stub_turns(steps)] * (steps + 1)) as stub:
        client = openai.OpenAI(base_url=stub.url + "/v1", api_key="bench")
        with tempfile.TemporaryDirectory() as tmp:
            _run(Path(tmp), Capture(OpenAIChatModel(client, "gpt-4o-mini")), steps)
        bodies = [body for path, body, _ in stub.requests if path.endswith("/chat/completions")]
    return _Recorded(bodies, responses)


class _Replayed:
    """The adapter's own responses, served again without the SDK."""

    def __init__(self, responses: list[ModelResponse]) -> None:
        self.responses = responses

    def complete(self, request: ModelRequest) -> ModelResponse:
        return self.responses[request.turn]


def _replay_s(url: str, bodies: list[dict[str, Any]]) -> float:
    """The stub's own time: the same requests, by a bare HTTP client, on one connection."""
    conn = http.client.HTTPConnection(url.removeprefix("http://"))
    payloads = [json.dumps(body) for body in bodies]
    start = time.perf_counter()
    for payload in payloads:
        conn.request("POST", "/v1/chat/completions", payload,
                     {"Content-Type": "application/json", "Authorization": "Bearer bench"})
        conn.getresponse().read()
    elapsed = time.perf_counter() - start
    conn.close()
    return elapsed


class _Sample(NamedTuple):
    loop_us: float  # per step, outside the model call
    call_us: float  # per call, inside it, minus the stub's own time


def _loop_of(workdir: Path, model: Model, steps: int) -> _Sample:
    elapsed, in_model = _run(workdir, model, steps)
    return _Sample((elapsed - in_model) / steps * 1e6, in_model / steps * 1e6)


def _adapter(workdir: Path, steps: int, bodies: list[dict[str, Any]]) -> _Sample:
    import openai

    from ..providers import OpenAIChatModel
    with _stub_process(workdir, steps) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="bench")
        elapsed, in_model = _run(workdir, OpenAIChatModel(client, "gpt-4o-mini"), steps)
    with _stub_process(workdir, steps) as url:
        own = _replay_s(url, bodies)
    return _Sample((elapsed - in_model) / steps * 1e6, (in_model - own) / (steps + 1) * 1e6)


def adapter_figures(workdir: Path, plan: Plan, say: Say) -> list[Figure]:
    steps = plan.agent_steps[0]
    if importlib.util.find_spec("openai") is None:
        return [figure("model_step.loop.openai_chat", None, "µs/step",
                       note="not measured: pip install 'agentjournal[openai]'")]
    say(f"adapter overhead: {steps} steps, ScriptedModel vs OpenAIChatModel on the stub, "
        f"x {_reps(plan)}")
    recorded = _record(steps)
    rounds = [(_loop_of(workdir, _Scripted(steps), steps),
               _loop_of(workdir, _Replayed(recorded.responses), steps),
               _adapter(workdir, steps, recorded.bodies)) for _ in range(_reps(plan))]
    floor, replayed, live = (statistics.median(r[i].loop_us for r in rounds) for i in range(3))
    call = statistics.median(r[2].call_us for r in rounds)
    return [
        figure("model_step.loop.openai_chat", replayed, "µs/step", floor,
               "the loop's part with ScriptedModel",
               note="the loop's part of a step (outside the model call) on the adapter's own "
                    "responses (ids, usage, finish reasons), replayed; target ≤ 1.2x"),
        figure("model_step.loop.openai_chat_live", live, "µs/step", floor,
               "the loop's part with ScriptedModel",
               note="the same, live: the real openai client + adapter on the loopback stub "
                    "(a process of its own); includes what sharing the CPU's caches and the "
                    "heap with the SDK costs the loop"),
        figure("model_call.openai_chat_minus_stub", call, "µs/call",
               note=f"inside the call: adapter + SDK (HTTP, parsing), the stub's own time "
                    f"(a bare http.client replay) subtracted; context grows to {steps} turns"),
    ]


def model_figures(workdir: Path, plan: Plan, say: Say) -> list[Figure]:
    return [*parallel_figures(workdir, plan, say), *adapter_figures(workdir, plan, say)]
