"""The durable loop over the real OpenAI and Anthropic SDK clients, pointed at the
loopback stub (agentjournal.testing.llm_stub): multi-turn runs with tools, bad arguments, turns cut
short, retries and their recorded failures, background mode, parallel tool calls, and
sync and async clients under ``run`` and ``arun``. The stub rejects what the real APIs
reject (400), so ``stub.rejections == []`` means every context sent was well formed."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import msgspec
import openai
import pytest
from click.testing import CliRunner

from agentjournal import EventType, open_store
from agentjournal.agent import Agent, RunResult
from agentjournal.cli import cli
from agentjournal.events import Event
from agentjournal.journal import open_journal
from agentjournal.providers import AnthropicModel, OpenAIChatModel, OpenAIResponsesModel
from agentjournal.store import Store
from agentjournal.testing.llm_stub import Drop, Fail, Hang, Reply, StubServer
from agentjournal.testing.llm_stub import Usage as StubUsage
from agentjournal.tools import Tool, ToolContext, tool

E = EventType

PROVIDERS = ("openai-chat", "openai-responses", "anthropic")
OPENAI = ("openai-chat", "openai-responses")
#: What each adapter records as the turn's provider, and the model it is asked for.
RECORDED = {"openai-chat": "openai.chat", "openai-responses": "openai.responses",
            "anthropic": "anthropic"}
MODEL = {"openai-chat": "gpt-4o", "openai-responses": "gpt-4o", "anthropic": "claude-haiku-4-5"}
ENDPOINT = {"openai-chat": "/v1/chat/completions", "openai-responses": "/v1/responses",
            "anthropic": "/v1/messages"}
INSTRUCTIONS = "You are a careful clerk. Answer briefly."

providers = pytest.mark.parametrize("provider", PROVIDERS)


# --- clients, adapters, runs -----------------------------------------------------------


def make_client(provider: str, stub: StubServer, *, aio: bool = False) -> Any:
    if provider.startswith("openai"):
        cls: Any = openai.AsyncOpenAI if aio else openai.OpenAI
        return cls(base_url=stub.url + "/v1", api_key="test")
    cls = anthropic.AsyncAnthropic if aio else anthropic.Anthropic
    return cls(base_url=stub.url, api_key="test")


def make_adapter(provider: str, client: Any, **kw: Any) -> Any:
    if provider == "openai-chat":
        return OpenAIChatModel(client, MODEL[provider], **kw)
    if provider == "openai-responses":
        return OpenAIResponsesModel(client, MODEL[provider], **kw)
    return AnthropicModel(client, MODEL[provider], **kw)


def drive(provider: str, stub: StubServer, store: Store, tools: list[Tool], *,
          mode: str = "run", run_id: str = "r1", task: str | None = "do the work",
          adapter_kw: dict[str, Any] | None = None, **agent_kw: Any) -> RunResult:
    """One ``run`` (sync client) or ``arun`` (async client; ``arun-sync``: a sync client,
    so the adapter runs in a thread) of an Agent over the real SDK client."""
    agent_kw.setdefault("model_backoff", 0.01)

    def agent(client: Any) -> Agent:
        return Agent(make_adapter(provider, client, **(adapter_kw or {})), tools, **agent_kw)

    if mode == "run":
        with make_client(provider, stub) as client:
            return agent(client).run(store, run_id, task)

    async def go() -> RunResult:
        if mode == "arun-sync":
            with make_client(provider, stub) as client:
                return await agent(client).arun(store, run_id, task)
        async with make_client(provider, stub, aio=True) as client:
            return await agent(client).arun(store, run_id, task)

    return asyncio.run(go())


@pytest.fixture
def stub() -> Iterator[StubServer]:
    with StubServer() as server:
        yield server


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/j.db"


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    opened = open_store(store_url)
    yield opened
    opened.close()


# --- the world the tools act on ----------------------------------------------------------


class Receiver:
    """Effects applied, counted per idempotency key; lookups counted per city."""

    def __init__(self) -> None:
        self.effects: Counter[str] = Counter()
        self.lookups: Counter[str] = Counter()

    def tools(self) -> list[Tool]:
        receiver = self

        @tool(effect="read_only")
        def lookup(city: str) -> dict[str, Any]:
            """The weather in a city."""
            receiver.lookups[city] += 1
            return {"city": city, "celsius": 21}

        @tool(effect="irreversible", identity=["order_id"])
        def place_order(ctx: ToolContext, order_id: str, qty: int) -> dict[str, Any]:
            """Place an order (once per order id)."""
            receiver.effects[ctx.key] += 1
            return {"order_id": order_id, "qty": qty, "placed": True}

        return [lookup, place_order]


def read_log(store: Store, run_id: str = "r1") -> list[Event]:
    return list(store.read(run_id))


def of(events: list[Event], kind: EventType) -> list[dict[str, Any]]:
    return [e.payload for e in events if e.type is kind]


def seqs(events: list[Event], kind: EventType) -> list[int]:
    return [e.seq for e in events if e.type is kind]


def model_bodies(stub: StubServer, provider: str) -> list[dict[str, Any]]:
    """The model requests the stub received (not background retrieves)."""
    return [body for path, body, _ in stub.requests if path == ENDPOINT[provider]]


def tool_results(provider: str, body: dict[str, Any]) -> dict[str, str]:
    """call id -> the tool result content sent to the model, in each provider's form."""
    if provider == "openai-chat":
        return {m["tool_call_id"]: m["content"] for m in body["messages"] if m["role"] == "tool"}
    if provider == "openai-responses":
        return {i["call_id"]: i["output"] for i in body["input"]
                if i.get("type") == "function_call_output"}
    return {b["tool_use_id"]: b["content"] for m in body["messages"] if m["role"] == "user"
            and isinstance(m["content"], list) for b in m["content"]
            if b.get("type") == "tool_result"}


def instructions_sent(provider: str, body: dict[str, Any]) -> Any:
    if provider == "openai-chat":
        first = body["messages"][0]
        return first["content"] if first["role"] == "system" else None
    return body.get("instructions" if provider == "openai-responses" else "system")


def stamped(times: list[float], item: Any) -> Callable[[dict[str, Any]], Any]:
    """A script item that notes when the stub consumed it."""

    def at(body: dict[str, Any]) -> Any:
        times.append(time.monotonic())
        return item

    return at


def show(store_url: str, run_id: str = "r1") -> str:
    result = CliRunner().invoke(cli, ["show", run_id, "--store", store_url],
                                env={"COLUMNS": "1000", "AGENTJOURNAL_STORE": ""})
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())


# --- 1. a multi-turn run with tools --------------------------------------------------------

FINISH = {"openai-chat": ["tool_calls", "tool_calls", "stop"],
          "openai-responses": ["tool_calls", "tool_calls", "stop"],
          "anthropic": ["tool_use", "tool_use", "end_turn"]}
RESPONSE_ID = {"openai-chat": "chatcmpl-", "openai-responses": "resp_", "anthropic": "msg_"}
NATIVE = {"openai-responses": "reasoning", "anthropic": "thinking"}


@pytest.mark.parametrize("mode", ["run", "arun"])
@providers
def test_multi_turn_run_with_tools(provider: str, mode: str, stub: StubServer,
                                   store: Store) -> None:
    receiver = Receiver()
    usage = StubUsage(input=20, output=7, cached=5, cache_write=2, reasoning=3)
    stub.script([
        Reply(calls=[("lookup", {"city": "Oslo"}), ("place_order", {"order_id": "o-1", "qty": 2})],
              reasoning=True, thinking=True, usage=usage),
        Reply(calls=[("lookup", {"city": "Rome"})], reasoning=True, thinking=True),
        Reply(text="Ordered 2; Oslo and Rome are mild.", reasoning=True, thinking=True),
    ])
    result = drive(provider, stub, store, receiver.tools(), mode=mode,
                   instructions=INSTRUCTIONS)

    assert result.status == "finished"
    assert result.outcome == "Ordered 2; Oslo and Rome are mild."
    assert stub.rejections == [] and stub.counts["rejected"] == 0
    log = read_log(store)
    (placed,) = [p for p in of(log, E.TOOL_CALL_STARTED) if p["tool"] == "place_order"]
    assert receiver.effects == {placed["key"]: 1}
    assert receiver.lookups == {"Oslo": 1, "Rome": 1}
    assert of(log, E.RUN_STARTED)[0]["instructions"] == INSTRUCTIONS

    bodies = model_bodies(stub, provider)
    assert len(bodies) == 3
    assert [instructions_sent(provider, b) for b in bodies] == [INSTRUCTIONS] * 3
    turns = of(log, E.MODEL_TURN)
    assert [t["finish_reason"] for t in turns] == FINISH[provider]
    for turn in turns:
        assert turn["provider"] == RECORDED[provider] and turn["model"] == MODEL[provider]
        assert turn["response_id"].startswith(RESPONSE_ID[provider])
        assert turn["request_id"].startswith("req_")
        assert isinstance(turn["latency_ms"], float) and turn["latency_ms"] > 0
        kinds = [i["type"] for i in turn.get("items", [])]
        if provider in NATIVE:
            assert kinds[0] == NATIVE[provider], kinds
        else:
            assert kinds == []  # Chat Completions has nothing to echo
    # Usage by one convention: input includes cache reads and writes.
    first = turns[0]["usage"]
    cache_write = 2 if provider == "anthropic" else 0  # OpenAI reports no cache writes
    assert first["input_tokens"] == 20 + (7 if provider == "anthropic" else 0)
    assert (first["cached_input_tokens"], first["cache_write_tokens"]) == (5, cache_write)
    assert first["output_tokens"] == 7 and first["cost_usd"] > 0
    if provider != "anthropic":
        assert first["reasoning_tokens"] == 3

    # The second request carries both results, paired with turn 1's calls, and the
    # provider-native reasoning / thinking of turn 1, as it was returned.
    calls = [c["id"] for c in turns[0]["tool_calls"]]
    assert sorted(tool_results(provider, bodies[1])) == sorted(calls)
    if provider == "openai-responses":
        echoed = [i for i in bodies[1]["input"] if i.get("type") == "reasoning"]
        assert echoed == [turns[0]["items"][0]]
    elif provider == "anthropic":
        echoed = [b for m in bodies[1]["messages"] if m["role"] == "assistant"
                  for b in m["content"] if b["type"] == "thinking"]
        assert echoed == [turns[0]["items"][0]]


# --- 2. arguments that are not JSON --------------------------------------------------------


@pytest.mark.parametrize("provider", OPENAI)
def test_invalid_json_arguments_are_denied_and_shown_to_the_model(
        provider: str, stub: StubServer, store: Store) -> None:
    receiver = Receiver()
    raw = '{"order_id": "o-1", "qty": 2'
    stub.script([Reply(calls=[("place_order", raw)]), Reply(text="sorry, fixed")])
    result = drive(provider, stub, store, receiver.tools())

    assert result.status == "finished" and result.outcome == "sorry, fixed"
    assert stub.rejections == []
    assert receiver.effects == {}
    log = read_log(store)
    assert of(log, E.TOOL_CALL_STARTED) == []
    (denied,) = of(log, E.TOOL_CALL_DENIED)
    try:
        msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        parse_error = str(exc)
    assert parse_error in denied["reason"] and "not valid JSON" in denied["reason"]
    (turn, _) = of(log, E.MODEL_TURN)
    assert turn["tool_calls"][0]["raw_arguments"] == raw
    # The model is asked again and reads the denial as the call's result.
    bodies = model_bodies(stub, provider)
    assert len(bodies) == 2
    sent = tool_results(provider, bodies[1])
    assert list(sent) == [denied["call_id"]]
    assert "not valid JSON" in sent[denied["call_id"]]


# --- 3. a turn cut short -------------------------------------------------------------------

LENGTH_WORD = {"openai-chat": "length", "openai-responses": "max_output_tokens",
               "anthropic": "max_tokens"}


@providers
def test_length_stop_pauses_and_show_prints_why(provider: str, stub: StubServer, store: Store,
                                                store_url: str) -> None:
    stub.script([Reply(text="partial", stop="length")])
    result = drive(provider, stub, store, Receiver().tools())

    assert result.status == "paused"
    assert result.outcome != "partial" and result.outcome is None
    assert result.pause_reason is not None and LENGTH_WORD[provider] in result.pause_reason
    log = read_log(store)
    assert of(log, E.RUN_FINISHED) == []
    (turn,) = of(log, E.MODEL_TURN)
    assert turn["finish_reason"] == LENGTH_WORD[provider] and turn["text"] == "partial"
    assert [e.type for e in log[-2:]] == [E.MODEL_TURN, E.RUN_PAUSED]
    printed = show(store_url)
    assert "paused" in printed and " ".join(result.pause_reason.split()) in printed


@pytest.mark.parametrize("provider", ["anthropic"])
def test_pause_turn_is_continued_not_answered(provider: str, stub: StubServer,
                                               store: Store) -> None:
    stub.script([Reply(text="searching", stop="pause_turn"), Reply(text="found it")])
    result = drive(provider, stub, store, Receiver().tools())

    assert (result.status, result.outcome) == ("finished", "found it")
    turns = of(read_log(store), E.MODEL_TURN)
    assert [t["finish_reason"] for t in turns] == ["pause_turn", "end_turn"]
    # The paused turn went back as it was, last, for the model to continue.
    last = model_bodies(stub, provider)[-1]["messages"][-1]
    assert last["role"] == "assistant" and last["content"] == turns[0]["items"]
    assert not stub.rejections


@providers
def test_length_stop_then_resume_asks_again(provider: str, stub: StubServer,
                                            store: Store) -> None:
    """The partial turn (with its reasoning / thinking) stays in the context, and the
    resumed run's request is one the provider accepts."""
    stub.script([Reply(text="partial", stop="length", reasoning=True, thinking=True),
                 Reply(text="whole")])
    assert drive(provider, stub, store, Receiver().tools()).status == "paused"
    result = drive(provider, stub, store, Receiver().tools(), task=None)

    assert result.status == "finished" and result.outcome == "whole"
    assert stub.rejections == [] and len(model_bodies(stub, provider)) == 2
    assert [e.type for e in read_log(store)][-3:] == [E.RUN_RESUMED, E.MODEL_TURN,
                                                     E.RUN_FINISHED]


# --- 4. retryable failures -----------------------------------------------------------------


@providers
def test_429_retry_after_is_honoured_and_recorded(provider: str, stub: StubServer,
                                                  store: Store) -> None:
    times: list[float] = []
    stub.script([stamped(times, Fail(429, retry_after_ms=300)), stamped(times, Reply(text="ok"))])
    result = drive(provider, stub, store, Receiver().tools())

    assert result.status == "finished" and result.outcome == "ok"
    (failed,) = of(read_log(store), E.MODEL_CALL_FAILED)
    assert failed["status"] == 429 and failed["retryable"] is True
    assert failed["retry_after"] == pytest.approx(0.3, abs=0.01)
    assert failed["attempt"] == 1 and "429" in failed["error"]
    assert len(times) == 2 and times[1] - times[0] >= 0.3


@pytest.mark.parametrize("failure", ["500", "drop"])
@providers
def test_server_error_or_dropped_connection_is_retried(provider: str, failure: str,
                                                       stub: StubServer, store: Store) -> None:
    stub.script([Fail(500) if failure == "500" else Drop(), Reply(text="ok")])
    result = drive(provider, stub, store, Receiver().tools())

    assert result.status == "finished" and result.outcome == "ok"
    log = read_log(store)
    (failed,) = of(log, E.MODEL_CALL_FAILED)
    assert failed["retryable"] is True and failed["lost"] is False
    if failure == "500":
        assert failed["status"] == 500
    else:
        assert "status" not in failed and "connection error" in failed["error"]
    assert seqs(log, E.MODEL_CALL_FAILED)[0] < seqs(log, E.MODEL_TURN)[0]
    assert len(model_bodies(stub, provider)) == 2


@providers
def test_client_timeout_is_retried(provider: str, stub: StubServer, store: Store) -> None:
    stub.script([Hang(2), Reply(text="ok")])
    if provider.startswith("openai"):
        client: Any = openai.OpenAI(base_url=stub.url + "/v1", api_key="test", timeout=0.2)
    else:
        client = anthropic.Anthropic(base_url=stub.url, api_key="test", timeout=0.2)
    with client:
        agent = Agent(make_adapter(provider, client), [], model_backoff=0.01)
        result = agent.run(store, "r1", "t")

    assert result.status == "finished" and result.outcome == "ok"
    (failed,) = of(read_log(store), E.MODEL_CALL_FAILED)
    assert failed["retryable"] is True and "status" not in failed


# --- 5. an error not worth retrying -------------------------------------------------------


@providers
def test_401_pauses_at_once(provider: str, stub: StubServer, store: Store,
                            store_url: str) -> None:
    message = "Incorrect API key provided: test."
    stub.script([Fail(401, message=message), Reply(text="never")])
    result = drive(provider, stub, store, Receiver().tools())

    assert result.status == "paused"
    assert len(stub.requests) == 1  # no retry
    assert result.pause_reason is not None
    assert message in result.pause_reason and "401" in result.pause_reason
    log = read_log(store)
    (failed,) = of(log, E.MODEL_CALL_FAILED)
    assert failed["status"] == 401 and failed["retryable"] is False
    assert of(log, E.MODEL_TURN) == [] and of(log, E.RUN_FINISHED) == []
    printed = show(store_url)
    assert message in printed and "401" in printed


# --- 6. Responses background mode ---------------------------------------------------------


@pytest.mark.parametrize("mode", ["run", "arun", "arun-sync"])
@pytest.mark.parametrize("provider", ["openai-responses"])
def test_background_run(provider: str, mode: str, stub: StubServer, store: Store) -> None:
    receiver = Receiver()
    stub.script([Reply(calls=[("lookup", {"city": "Oslo"})], reasoning=True, delay=0.05),
                 Reply(text="mild", delay=0.05)])
    result = drive(provider, stub, store, receiver.tools(), mode=mode,
                   adapter_kw={"background": True, "poll_interval": 0.02})

    assert result.status == "finished" and result.outcome == "mild"
    assert stub.rejections == []
    log = read_log(store)
    turns = [e for e in log if e.type is E.MODEL_TURN]
    assert stub.counts["created"] == len(turns) == 2
    assert stub.counts["responses_retrieve"] >= 2
    for turn in turns:
        before = [e for e in log[: turn.seq - 1] if e.type is E.MODEL_CALL_STARTED
                  and e.payload["handle"] == turn.payload["response_id"]]
        assert len(before) == 1, "each turn's call id is durable before its answer"
    assert all(b["background"] is True and b["store"] is True
               for b in model_bodies(stub, provider))
    assert receiver.lookups == {"Oslo": 1}


def begun_and_lost(store: Store) -> None:
    """A run whose process began a background call, recorded its id, and died."""
    with open_journal(store, "r1") as j:
        j.record_all([(E.RUN_STARTED, {"task": "t", "scope": "run:r1", "agent": None,
                                       "instructions": None}),
                      (E.USER_MESSAGE, {"content": "t"}),
                      (E.MODEL_CALL_STARTED, {"handle": "resp_gone", "turn": 0})])


@pytest.mark.parametrize("provider", ["openai-responses"])
def test_background_lost_call_is_asked_anew(provider: str, stub: StubServer,
                                            store: Store) -> None:
    # As if a process began a call, recorded its id, and died; the provider has lost it.
    begun_and_lost(store)
    stub.script([Reply(text="asked again")])
    result = drive(provider, stub, store, Receiver().tools(), task=None,
                   adapter_kw={"background": True, "poll_interval": 0.02})

    assert result.status == "finished" and result.outcome == "asked again"
    log = read_log(store)
    (failed,) = of(log, E.MODEL_CALL_FAILED)
    assert failed["lost"] is True and failed["status"] == 404
    started = of(log, E.MODEL_CALL_STARTED)
    assert len(started) == 2 and started[0]["handle"] == "resp_gone"
    (turn,) = of(log, E.MODEL_TURN)
    assert turn["response_id"] == started[1]["handle"]
    assert seqs(log, E.MODEL_CALL_FAILED) < seqs(log, E.MODEL_CALL_STARTED)[1:]
    assert stub.counts["created"] == 1


@pytest.mark.parametrize("mode", ["run", "arun", "arun-sync"])
@pytest.mark.parametrize("provider", ["openai-responses"])
def test_background_against_a_server_that_answers_in_create(provider: str, mode: str,
                                                            store: Store) -> None:
    """Several OpenAI-compatible servers complete a background response inside the create
    call and have no retrieve endpoint: the answer the create call returned is the turn's."""
    receiver = Receiver()
    with StubServer([Reply(calls=[("lookup", {"city": "Oslo"})]), Reply(text="mild")],
                    retrieve=False) as stub:
        result = drive(provider, stub, store, receiver.tools(), mode=mode,
                       adapter_kw={"background": True, "poll_interval": 0.02})

    assert result.status == "finished" and result.outcome == "mild"
    assert stub.counts["created"] == 2  # one response per turn, each billed once
    assert stub.counts["rejected"] == 0 and len(stub.requests) == 2  # nothing polled
    log = read_log(store)
    assert of(log, E.MODEL_CALL_FAILED) == []
    started = of(log, E.MODEL_CALL_STARTED)
    assert [t["response_id"] for t in of(log, E.MODEL_TURN)] == [s["handle"] for s in started]
    assert receiver.lookups == {"Oslo": 1}


@pytest.mark.parametrize("provider", ["openai-responses"])
def test_a_lost_background_call_waits_like_any_failed_call(provider: str, stub: StubServer,
                                                          store: Store) -> None:
    # A backoff longer than max_retry_wait stops the run instead of asking again at once.
    begun_and_lost(store)
    stub.script([Reply(text="never asked")])
    result = drive(provider, stub, store, [], task=None, model_backoff=60, max_retry_wait=1,
                   adapter_kw={"background": True, "poll_interval": 0.02})

    assert result.status == "paused" and stub.counts["created"] == 0
    (failed,) = of(read_log(store), E.MODEL_CALL_FAILED)
    assert failed["lost"] is True and failed["status"] == 404


@pytest.mark.parametrize("mode", ["run", "arun"])
@pytest.mark.parametrize("provider", ["openai-responses"])
def test_background_cancelled_call_is_asked_anew(provider: str, mode: str, stub: StubServer,
                                                 store_url: str, store: Store) -> None:
    """A call cancelled at the provider while the run waits on it is lost: recorded so,
    and asked anew."""
    # The first answer is far off, so the cancel lands before it however loaded the machine.
    stub.script([Reply(text="slow", delay=120.0), Reply(text="again", delay=0.05)])

    def cancel_the_first_call() -> None:
        watcher = open_store(store_url)
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                events = list(watcher.read("r1")) if watcher.last_seq("r1") else []
                if started := of(events, E.MODEL_CALL_STARTED):
                    with make_client(provider, stub) as client:
                        client.responses.cancel(started[0]["handle"])
                    return
                time.sleep(0.02)
        finally:
            watcher.close()

    canceller = threading.Thread(target=cancel_the_first_call)
    canceller.start()
    result = drive(provider, stub, store, [], mode=mode,
                   adapter_kw={"background": True, "poll_interval": 0.02})
    canceller.join()

    assert result.status == "finished" and result.outcome == "again"
    assert stub.counts["responses_cancel"] == 1 and stub.counts["created"] == 2
    log = read_log(store)
    (failed,) = of(log, E.MODEL_CALL_FAILED)
    assert failed["lost"] is True and "cancelled" in failed["error"]
    first, second = of(log, E.MODEL_CALL_STARTED)
    assert first["handle"] in failed["error"]
    assert of(log, E.MODEL_TURN)[0]["response_id"] == second["handle"] != first["handle"]


# --- 6b. calls that share an id ------------------------------------------------------------


def orders(*ids: str) -> list[tuple[str, dict[str, Any]]]:
    return [("place_order", {"order_id": i, "qty": 1}) for i in ids]


@pytest.mark.parametrize("call_id", ["", "call_0"])
@providers
def test_calls_that_share_an_id_are_each_placed_and_answered_once(
        provider: str, call_id: str, stub: StubServer, store: Store) -> None:
    """A server that sends one id for every call of a turn: each call is made once, and
    the next request pairs each result with its own call, in the form the provider takes."""
    receiver = Receiver()
    stub.script([Reply(calls=orders("g1", "g2", "g3"), call_ids=[call_id] * 3,
                       reasoning=True, thinking=True),
                 Reply(text="placed")])
    result = drive(provider, stub, store, receiver.tools())

    assert result.status == "finished" and result.outcome == "placed"
    assert stub.rejections == []
    log = read_log(store)
    started = of(log, E.TOOL_CALL_STARTED)
    assert sorted(p["args"]["order_id"] for p in started) == ["g1", "g2", "g3"]
    assert receiver.effects == {p["key"]: 1 for p in started}  # counted by the receiver
    turn = of(log, E.MODEL_TURN)[0]
    assert [c["provider_id"] for c in turn["tool_calls"]] == [call_id] * 3
    ids = [c["id"] for c in turn["tool_calls"]]
    assert len(set(ids)) == 3
    sent = tool_results(provider, model_bodies(stub, provider)[1])
    assert {i: msgspec.json.decode(sent[i])["order_id"] for i in ids} == {
        c["id"]: c["args"]["order_id"] for c in turn["tool_calls"]}


@providers
def test_an_id_reused_on_a_later_turn_is_sent_back_as_its_own(
        provider: str, stub: StubServer, store: Store) -> None:
    receiver = Receiver()
    stub.script([Reply(calls=orders("g1"), call_ids=["call_0"]),
                 Reply(calls=orders("g2"), call_ids=["call_0"]), Reply(text="placed")])
    result = drive(provider, stub, store, receiver.tools())

    assert result.status == "finished" and stub.rejections == []
    assert len(receiver.effects) == 2 and set(receiver.effects.values()) == {1}
    last = tool_results(provider, model_bodies(stub, provider)[2])
    assert sorted(last) == ["call_0", "call_1_0"]


# --- 7. a turn's calls run together --------------------------------------------------------


def sleepers(met: list[int], *, aio: bool) -> list[Tool]:
    """Four calls that each wait until all four have started, then count themselves in
    ``met``: they meet only if they run together (if not, the meeting breaks after a
    generous hang guard and the call fails)."""
    if aio:
        gathering = asyncio.Barrier(4)

        @tool(effect="read_only", name="nap")
        async def anap(n: int) -> int:
            """Sleep a little (async)."""
            await asyncio.wait_for(gathering.wait(), 60)
            met.append(n)
            return n

        return [anap]

    meeting = threading.Barrier(4, timeout=60)

    @tool(effect="read_only")
    def nap(n: int) -> int:
        """Sleep a little."""
        meeting.wait()
        met.append(n)
        return n

    return [nap]


def tracers(trace: list[str], *, aio: bool) -> list[Tool]:
    """Calls that note their start and their end, a short nap between: calls that ran
    together would interleave their notes."""
    if aio:
        @tool(effect="read_only", name="nap")
        async def anap(n: int) -> int:
            """Sleep a little (async)."""
            trace.append(f"start {n}")
            await asyncio.sleep(0.05)
            trace.append(f"end {n}")
            return n

        return [anap]

    @tool(effect="read_only")
    def nap(n: int) -> int:
        """Sleep a little."""
        trace.append(f"start {n}")
        time.sleep(0.05)
        trace.append(f"end {n}")
        return n

    return [nap]


def check_one_batch(log: list[Event]) -> None:
    """The 4 starts are one batch (consecutive seqs) before any completion."""
    started, completed = seqs(log, E.TOOL_CALL_STARTED), seqs(log, E.TOOL_CALL_COMPLETED)
    assert len(started) == len(completed) == 4
    assert started == list(range(started[0], started[0] + 4))
    assert max(started) < min(completed)


@pytest.mark.parametrize("mode", ["run-sync-tool", "arun-async-tool", "arun-sync-tool"])
@providers
def test_parallel_calls_overlap(provider: str, mode: str, stub: StubServer,
                                store: Store) -> None:
    met: list[int] = []
    stub.script([Reply(calls=[("nap", {"n": n}) for n in range(4)]), Reply(text="rested")])
    result = drive(provider, stub, store, sleepers(met, aio=mode == "arun-async-tool"),
                   mode="run" if mode == "run-sync-tool" else "arun")

    assert result.status == "finished" and stub.rejections == []
    assert sorted(met) == [0, 1, 2, 3]  # all four were running at once
    check_one_batch(read_log(store))


@pytest.mark.parametrize("mode", ["run", "arun"])
@providers
def test_parallel_calls_1_runs_them_one_after_another(provider: str, mode: str,
                                                      stub: StubServer, store: Store) -> None:
    trace: list[str] = []
    stub.script([Reply(calls=[("nap", {"n": n}) for n in range(4)]), Reply(text="rested")])
    result = drive(provider, stub, store, tracers(trace, aio=mode == "arun"), mode=mode,
                   parallel_calls=1)

    assert result.status == "finished" and stub.rejections == []
    order = [note.split()[1] for note in trace[::2]]  # in whatever order they ran ...
    assert sorted(order) == ["0", "1", "2", "3"]
    assert trace == [note for n in order for note in (f"start {n}", f"end {n}")]  # ... alone
    check_one_batch(read_log(store))


@providers
def test_same_identity_twice_in_one_turn_runs_once(provider: str, stub: StubServer,
                                                   store: Store) -> None:
    """Two calls of one turn with one idempotency key: the second waits for the first and
    is served its result; both calls are answered in the next request."""
    receiver = Receiver()
    order = ("place_order", {"order_id": "o-1", "qty": 1})
    stub.script([Reply(calls=[order, order], reasoning=True, thinking=True), Reply(text="ok")])
    result = drive(provider, stub, store, receiver.tools())

    assert result.status == "finished" and stub.rejections == []
    assert list(receiver.effects.values()) == [1]
    log = read_log(store)
    (turn, _) = of(log, E.MODEL_TURN)
    (served,) = of(log, E.TOOL_RESULT_SERVED)
    assert served["call_id"] == turn["tool_calls"][1]["id"]
    sent = tool_results(provider, model_bodies(stub, provider)[1])
    assert sorted(sent) == sorted(c["id"] for c in turn["tool_calls"])


# --- 8. sync and async clients under arun --------------------------------------------------


@pytest.mark.parametrize("client", ["async-client", "sync-client"])
@providers
def test_arun_keeps_the_event_loop_free(provider: str, client: str, stub: StubServer,
                                        store: Store) -> None:
    """An async client is awaited; a sync one runs in a thread: either way the loop
    keeps turning while the model takes its time."""
    ticks = [0]
    turned: list[bool] = []  # per request: did the loop turn while the model answered?

    def once_the_loop_turns(item: Reply) -> Callable[[dict[str, Any]], Reply]:
        def answer(body: dict[str, Any]) -> Reply:
            seen = ticks[0]
            deadline = time.monotonic() + 60  # a hang guard: a blocked loop never turns
            while ticks[0] < seen + 3 and time.monotonic() < deadline:
                time.sleep(0.01)
            turned.append(ticks[0] >= seen + 3)
            return item

        return answer

    stub.script([once_the_loop_turns(Reply(calls=[("lookup", {"city": "Oslo"})])),
                 once_the_loop_turns(Reply(text="done"))])
    receiver = Receiver()

    async def go() -> RunResult:
        stop = asyncio.Event()

        async def tick() -> None:
            while not stop.is_set():
                ticks[0] += 1
                await asyncio.sleep(0.01)

        ticker = asyncio.create_task(tick())
        try:
            if client == "sync-client":
                with make_client(provider, stub) as c:
                    agent = Agent(make_adapter(provider, c), receiver.tools(), model_backoff=0.01)
                    result = await agent.arun(store, "r1", "t")
            else:
                async with make_client(provider, stub, aio=True) as c:
                    agent = Agent(make_adapter(provider, c), receiver.tools(), model_backoff=0.01)
                    result = await agent.arun(store, "r1", "t")
        finally:
            stop.set()
            await ticker
        return result

    result = asyncio.run(go())
    assert result.status == "finished" and result.outcome == "done"
    assert stub.rejections == [] and receiver.lookups == {"Oslo": 1}
    turns = of(read_log(store), E.MODEL_TURN)
    assert [t["provider"] for t in turns] == [RECORDED[provider]] * 2
    assert turned == [True, True]  # the loop kept turning while each answer was awaited
