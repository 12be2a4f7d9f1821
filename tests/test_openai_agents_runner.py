"""JournalRunner: an SDK agent (``agents.testing.ScriptedModel``) whose tool POSTs to a
receiver process, run in a child process that is SIGKILLed in each window and resumed:
the receiver's own counts say each effect happened once. Approvals, uncertain calls that
become SDK interruptions, replay, and the trace kept for ``agentjournal show``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from agents import Runner, SQLiteSession
from mcp.types import ToolAnnotations

from agentjournal import (
    Effect,
    EventType,
    JournalError,
    NondeterminismError,
    decide_approval,
    fold,
    open_store,
    resolve_uncertain,
)
from agentjournal.demo.ledger import LedgerService
from agentjournal.integrations.openai_agents import (
    JournalRunner,
    JournalSession,
    ToolPolicy,
    mcp_effect,
)
from agentjournal.store import Store
from tests.conftest import backend_params
from tests.openai_agents_child import (
    RUN,
    TASK,
    delegator,
    poster,
    run_delegator_until_blocked,
    run_plain_until_blocked,
    run_poster,
    run_until_blocked,
    spawn,
)

E = EventType
ROOT = Path(__file__).resolve().parents[1]
HANG = 120.0  # a hang guard for a child to reach its window, not a speed limit


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    opened = open_store(store_url)
    yield opened
    opened.close()


@pytest.fixture(scope="module")
def module_receiver() -> Iterator[Any]:
    """One receiver process for the file: each test posts labels of its own prefix."""
    from tests.test_crash_models import Receiver

    started = Receiver()
    yield started
    started.close()


class Posting:
    """One test's poster: its labels carry the test's own prefix, and so do its counts."""

    def __init__(self, receiver: Any, prefix: str) -> None:
        self.receiver, self.prefix = receiver, prefix

    def agent(self, **options: Any) -> tuple[Any, dict[str, Any]]:
        return poster(self.receiver.url, prefix=self.prefix, **options)

    def kill_at(self, window: str, store_url: str, **options: Any) -> None:
        """Run the poster in a child until it blocks at ``window``, then SIGKILL it."""
        process, told = spawn(run_until_blocked, store_url, self.receiver.url, window,
                              prefix=self.prefix, **options)
        try:
            assert told.poll(HANG), "the child never reached its window"
            assert told.recv() == window
        finally:
            process.kill()
            process.join()
        assert process.exitcode == -9

    def resume(self, store: Store, *, streamed: bool = False, **options: Any) -> Any:
        agent, policies = self.agent(**options)
        return run_poster(agent, store, policies, streamed=streamed)

    def counts(self) -> dict[str, int]:
        """Effects the receiver applied for this test, by label (without the prefix)."""
        return {label.removeprefix(self.prefix): n
                for label, n in self.receiver.by_label().items()
                if label.startswith(self.prefix)}


@pytest.fixture
def posting(request: pytest.FixtureRequest, module_receiver: Any) -> Posting:
    return Posting(module_receiver, f"{request.node.name}-")  # unique in the file


def types(store: Store) -> list[EventType]:
    return [e.type for e in store.read(RUN)]


def slow_or(request: pytest.FixtureRequest, default: set[tuple[str, str]], *key: str) -> None:
    """Each case runs on one backend by default (all three with --slow)."""
    backend = request.node.callspec.params["store_url"]
    if (*key, backend) not in default and not request.config.getoption("--slow"):
        pytest.skip("this case runs on another backend by default (--slow: all)")


#: Each window on one backend by default (streamed: on another); every one with --slow.
WINDOWS = {("model", "run", "jsonl"), ("before", "run", "postgres"), ("after", "run", "sqlite"),
           ("model", "streamed", "sqlite"), ("before", "streamed", "jsonl"),
           ("after", "streamed", "postgres")}


@backend_params()
@pytest.mark.parametrize("window", ["model", "before", "after"])
@pytest.mark.parametrize("how", ["run", "streamed"])
def test_killed_in_each_window_every_effect_lands_once(
        request: pytest.FixtureRequest, store_url: str, store: Store, posting: Posting,
        window: str, how: str) -> None:
    slow_or(request, WINDOWS, window, how)
    streamed = how == "streamed"  # (killed and resumed through run_streamed)
    posting.kill_at(window, store_url, streamed=streamed)
    result = posting.resume(store, streamed=streamed)
    assert result.final_output == "posted 2" and not result.interruptions
    assert posting.counts() == {"a": 1, "b": 1}
    log = list(store.read(RUN))
    starts = [e.payload["call_id"] for e in log if e.type is E.TOOL_CALL_STARTED]
    assert starts[:2] == ["call_a", "call_b"]  # a turn's starts in the model's order
    (key_b,) = {e.payload["key"] for e in log if e.type is E.TOOL_CALL_STARTED
                and e.payload["call_id"] == "call_b"}
    verdicts = [e.payload["verdict"] for e in log if e.type is E.TOOL_CALL_RECONCILED
                and e.payload["key"] == key_b]  # (a may have been in flight too)
    assert verdicts == {"model": [], "before": ["absent"], "after": ["found"]}[window]
    assert log[-1].type is E.RUN_FINISHED


# --- an agent used as a tool (Agent.as_tool) --------------------------------------------


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[LedgerService]:
    """The demo ledger, a process of its own that honours idempotency keys."""
    with LedgerService(tmp_path / "ledger.db") as service:
        yield service


@backend_params()
@pytest.mark.parametrize("how", ["run", "streamed", "child streamed"])
def test_each_call_of_an_agent_used_as_a_tool_has_a_key_of_its_own(
        store: Store, ledger: LedgerService, how: str) -> None:
    # The child posts two different corrections inside the parent's one call: with the
    # parent call's key on both, the ledger answered the second from the first (422)
    # and the run finished with C-2 never applied.
    agent, policies, config = delegator(ledger.url, on_stream=how == "child streamed")
    result = run_poster(agent, store, policies, streamed=how == "streamed", run_config=config)
    assert result.final_output == "delegated"
    effects = ledger.effects()
    assert effects["corrections"] == {"C-1": 1, "C-2": 1} and effects["replays"] == 0


@backend_params()
def test_a_child_asking_the_run_configs_model_is_not_journaled_as_the_parents_turns(
        store: Store, ledger: LedgerService) -> None:
    # The run config's model answers the child too (as_tool hands it the parent's run
    # config). Its turns were recorded as the parent's, so the finished run's replay
    # (the child not run again) met the child's first turn where the parent's second
    # was: NondeterminismError.
    agent, policies, config = delegator(ledger.url, shared_model=True)
    for _ in range(2):  # run, then replayed from its log
        result = run_poster(agent, store, policies, streamed=False, run_config=config)
        assert result.final_output == "delegated"
    assert types(store).count(E.MODEL_TURN) == 2  # the parent's two turns
    assert ledger.effects()["corrections"] == {"C-1": 1, "C-2": 1}


@backend_params()
def test_a_tool_running_an_agent_with_journal_runner_makes_it_a_run_of_its_own(
        store_url: str, store: Store, ledger: LedgerService) -> None:
    agent, policies, _ = delegator(ledger.url, own_run=store_url)
    for _ in range(2):  # run, then replayed from its log
        result = run_poster(agent, store, policies, streamed=False)
        assert result.final_output == "delegated"
    assert ledger.effects()["corrections"] == {"C-1": 1, "C-2": 1}
    (child,) = [r.run_id for r in store.list_runs() if r.run_id.startswith("child-")]
    child_log = list(store.read(child))
    assert [e.type for e in child_log].count(E.MODEL_TURN) == 3  # the child's own turns
    assert types(store).count(E.MODEL_TURN) == 2
    keys = {e.payload["key"] for e in child_log if e.type is E.TOOL_CALL_STARTED}
    assert len(keys) == 2  # each correction its own key, in the child's run


@backend_params()
@pytest.mark.parametrize("how", ["run", "caught", "streamed", "nested"])
def test_an_agent_run_by_the_sdks_own_runner_inside_a_call_is_refused_the_calls_key(
        store: Store, ledger: LedgerService, how: str) -> None:
    # A plain function tool runs the child with Runner.run: its tools are not journaled,
    # and each read the outer call's key: the ledger answered C-2 from C-1 (422) and the
    # run finished with C-2 never applied. Refused now, before either correction is sent,
    # saying what to do, even where a tool answers the refusal itself (caught, streamed),
    # and in a tool of an agent used as a tool (nested: that tool's own key refused).
    agent, policies, _ = delegator(ledger.url, plain=how)
    with pytest.raises(JournalError) as refused:
        run_poster(agent, store, policies, streamed=False)
    message = str(refused.value)
    call_id = "call_1/call_1" if how == "nested" else "call_1"
    assert f"tool of agent 'corrector', run with the SDK's own Runner inside tool call " \
        f"'corrector' ({call_id})" in message
    assert "JournalRunner under a run id of its own" in message and "as_tool" in message
    effects = ledger.effects()
    assert effects["corrections"] == {} and effects["replays"] == 0
    log = list(store.read(RUN))
    errors = [e.payload["error"] for e in log if e.type is E.TOOL_CALL_UNCERTAIN]
    assert len(errors) == 3 and all("of its own" in e for e in errors)  # idempotent: retried
    assert not [e for e in log if e.type is E.TOOL_CALL_COMPLETED]
    state = fold(log)  # then left to a person, never completed
    assert state.status == "paused" and [p.tool for p in state.pending.values()] == ["corrector"]

    # Run as a tool (Agent.as_tool), the call made again (nothing was sent) applies both.
    (key,) = [p.key for p in state.pending.values()]
    resolve_uncertain(store, RUN, key, outcome="did_not_happen", by="ana")
    agent, policies, _ = delegator(ledger.url)
    assert run_poster(agent, store, policies, streamed=False).final_output == "delegated"
    effects = ledger.effects()
    assert effects["corrections"] == {"C-1": 1, "C-2": 1} and effects["replays"] == 0


@backend_params()
def test_a_child_killed_between_its_calls_resends_the_same_keys_when_retried(
        store_url: str, store: Store, ledger: LedgerService) -> None:
    process, told = spawn(run_delegator_until_blocked, store_url, ledger.url, "second")
    try:
        assert told.poll(HANG), "the child never reached its window"
        assert told.recv() == "second"
    finally:
        process.kill()
        process.join()
    assert process.exitcode == -9
    assert ledger.effects()["corrections"] == {"C-1": 1}
    agent, policies, _ = delegator(ledger.url)  # the corrector's call is retried (idempotent)
    result = run_poster(agent, store, policies, streamed=False)
    assert result.final_output == "delegated"
    effects = ledger.effects()
    # C-1 was sent again with its own key, and answered from the first; C-2 applied once.
    assert effects["corrections"] == {"C-1": 1, "C-2": 1} and effects["replays"] == 1


@backend_params()
@pytest.mark.parametrize("window", ["after", "before"])
def test_an_uncertain_call_no_lookup_settles_is_an_interruption_a_person_decides(
        request: pytest.FixtureRequest, store_url: str, store: Store, posting: Posting,
        window: str) -> None:
    slow_or(request, {("after", "sqlite"), ("before", "jsonl")}, window)
    posting.kill_at(window, store_url, lookup=False)
    stopped = posting.resume(store, lookup=False)
    # The SDK's own interruption for post_effect("b") (and for "a" when the kill caught it
    # in flight too); the run is paused for a person, no effect made again.
    called = sorted(i.raw_item.call_id for i in stopped.interruptions)
    assert "call_b" in called and stopped.final_output is None
    assert fold(store.read(RUN)).status == "paused"
    assert posting.resume(store, lookup=False).interruptions  # still undecided
    starts = {e.payload["call_id"]: e.payload["key"] for e in store.read(RUN)
              if e.type is E.TOOL_CALL_STARTED}
    applied = posting.receiver.by_key()
    assert (starts["call_b"] in applied) == (window == "after")
    for call_id in called:  # the person looks at the receiver and says what happened
        happened = starts[call_id] in applied
        resolve_uncertain(store, RUN, starts[call_id], by="ops", reason="seen at the receiver",
                          outcome="happened" if happened else "did_not_happen",
                          result="posted" if happened else None)
    done = posting.resume(store, lookup=False)
    assert done.final_output == "posted 2" and not done.interruptions
    assert posting.counts() == {"a": 1, "b": 1}


def test_a_streamed_answer_passes_on_as_it_comes_and_completes_once_recorded(
        tmp_path: Any, posting: Posting) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'j.db'}")

    async def listen(agent: Any, policies: Any) -> tuple[list[str], list[int]]:
        """The raw events' types, and how many answers the log held at each call's
        output and at the end."""
        stream = JournalRunner.run_streamed(agent, TASK, store=store, run_id=RUN,
                                            policies=policies)
        raw, recorded = [], []
        async for event in stream.stream_events():
            if event.type == "raw_response_event":
                raw.append(event.data.type)
            elif event.type == "run_item_stream_event" and event.name == "tool_output":
                recorded.append(types(store).count(E.MODEL_TURN))
        recorded.append(types(store).count(E.MODEL_TURN))
        assert stream.final_output == "posted 2"
        return raw, recorded

    agent, policies = posting.agent()
    raw, recorded = asyncio.run(listen(agent, policies))
    assert recorded == [1, 1, 2]  # the answer is in the log once its calls were made
    assert {"response.function_call_arguments.delta", "response.output_text.delta"} <= set(raw)
    assert raw.count("response.completed") == 2
    assert posting.counts() == {"a": 1, "b": 1}
    agent, policies = posting.agent()
    raw, recorded = asyncio.run(listen(agent, policies))  # the finished run, replayed
    assert raw == ["response.completed"] * 2 and recorded == [2, 2, 2]
    assert agent.model.calls == ()  # every answer from the log
    assert posting.counts() == {"a": 1, "b": 1}
    store.close()


def test_a_stream_from_the_openai_client_is_journaled_and_replayed_without_asking(
        tmp_path: Any, posting: Posting) -> None:
    # The SDK's own OpenAIResponsesModel and the real openai client, streaming from the
    # loopback stub (server-sent events, as the Responses API sends them).
    from agents import OpenAIResponsesModel
    from openai import AsyncOpenAI

    from agentjournal.testing.llm_stub import Reply, StubServer

    store = open_store(f"sqlite:///{tmp_path / 'j.db'}")
    turns = [Reply(calls=[("post_effect", {"label": f"{posting.prefix}a"})]),
             Reply(text="posted 1")]
    with StubServer(turns) as stub:
        async def listen() -> tuple[Any, list[str]]:
            client = AsyncOpenAI(base_url=f"{stub.url}/v1", api_key="stub", max_retries=0)
            scripted, policies = posting.agent()
            agent = scripted.clone(model=OpenAIResponsesModel("gpt-stub", client))
            stream = JournalRunner.run_streamed(agent, TASK, store=store, run_id=RUN,
                                                policies=policies)
            raw = [e.data.type async for e in stream.stream_events()
                   if e.type == "raw_response_event"]
            await client.close()
            return stream, raw

        stream, raw = asyncio.run(listen())
        assert stream.final_output == "posted 1" and stub.rejections == []
        assert {"response.function_call_arguments.delta", "response.output_text.delta"} <= set(raw)
        assert posting.counts() == {"a": 1}
        stream, raw = asyncio.run(listen())  # the finished run, replayed
        assert stream.final_output == "posted 1" and raw == ["response.completed"] * 2
        assert stub.counts["responses_create"] == 2  # not asked again
    assert posting.counts() == {"a": 1}
    store.close()


def test_a_stream_left_early_stops_the_run_and_it_resumes_from_its_log(
        tmp_path: Any, posting: Posting) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'j.db'}")

    async def listen_then_leave(agent: Any, policies: Any) -> None:
        events = JournalRunner.run_streamed(agent, TASK, store=store, run_id=RUN,
                                            policies=policies).stream_events()
        async with contextlib.aclosing(events) as stream:  # closed: the run is cancelled
            async for event in stream:
                if event.type == "run_item_stream_event":
                    break

    agent, policies = posting.agent()
    asyncio.run(listen_then_leave(agent, policies))
    assert E.RUN_FINISHED not in types(store)
    done = posting.resume(store)  # the lease is free: the run goes on from its log
    assert done.final_output == "posted 2"
    assert posting.counts() == {"a": 1, "b": 1}
    store.close()


def test_a_streamed_run_stops_at_an_uncertain_call_for_a_person(
        tmp_path: Any, posting: Posting) -> None:
    url = f"sqlite:///{tmp_path / 'j.db'}"
    store = open_store(url)
    posting.kill_at("after", url, lookup=False, streamed=True)
    stopped = posting.resume(store, lookup=False, streamed=True)
    called = sorted(i.raw_item.call_id for i in stopped.interruptions)  # (a, if in flight)
    assert "call_b" in called and stopped.final_output is None
    assert fold(store.read(RUN)).status == "paused"
    starts = {e.payload["call_id"]: e.payload["key"] for e in store.read(RUN)
              if e.type is E.TOOL_CALL_STARTED}
    applied = posting.receiver.by_key()
    for call_id in called:  # the person looks at the receiver and says what happened
        happened = starts[call_id] in applied
        resolve_uncertain(store, RUN, starts[call_id], by="ops",
                          outcome="happened" if happened else "did_not_happen",
                          result="posted" if happened else None)
    done = posting.resume(store, lookup=False, streamed=True)
    assert done.final_output == "posted 2" and not done.interruptions
    assert posting.counts() == {"a": 1, "b": 1}
    store.close()


def test_a_call_cut_off_in_a_stream_ends_it_at_an_interruption_shown_once(
        tmp_path: Any) -> None:
    from agents import Agent, function_tool
    from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call

    @function_tool
    def pay(cents: int) -> str:
        """Pay; the answer is lost (a timeout): the effect may have been made."""
        raise TimeoutError("read timed out")

    pays = function_call("pay", {"cents": 5}, call_id="call_pay")
    model = ScriptedModel([ModelStep(output=[pays]), ModelStep(output=[assistant_message("paid")])])
    agent = Agent(name="payer", model=model, tools=[pay])
    store = open_store(f"sqlite:///{tmp_path / 'j.db'}")

    async def listen() -> tuple[Any, list[str]]:
        stream = JournalRunner.run_streamed(agent, "pay 5", store=store, run_id=RUN)
        shown = [e.data.type async for e in stream.stream_events()
                 if e.type == "raw_response_event"]
        return stream, shown

    stream, shown = asyncio.run(listen())
    # The run is opened again for the SDK to meet the call as an interruption; that
    # replay is not streamed: the caller saw the answer once.
    assert shown.count("response.completed") == 1
    assert [i.tool_name for i in stream.interruptions] == ["pay"]
    assert stream.final_output is None and fold(store.read(RUN)).status == "paused"
    store.close()


@backend_params()
def test_an_approval_given_before_a_crash_runs_once_and_is_not_asked_again(
        request: pytest.FixtureRequest, store_url: str, store: Store,
        posting: Posting) -> None:
    slow_or(request, {("postgres",)})
    waiting = posting.resume(store, approval=True)
    assert sorted(i.raw_item.call_id for i in waiting.interruptions) == ["call_a", "call_b"]
    again = posting.resume(store, approval=True)  # nobody decided: it still waits
    assert sorted(i.raw_item.call_id for i in again.interruptions) == ["call_a", "call_b"]
    assert posting.counts() == {}
    requested = [e.payload for e in store.read(RUN) if e.type is E.APPROVAL_REQUESTED]
    for approval in requested:  # as `agentjournal approve RUN APPROVAL_ID` does
        decide_approval(store, RUN, approval["approval_id"], approved=True, by="ops")
    posting.kill_at("after", store_url, approval=True)
    done = posting.resume(store, approval=True)  # the caller kept nothing
    assert done.final_output == "posted 2" and not done.interruptions
    assert posting.counts() == {"a": 1, "b": 1}
    assert types(store).count(E.APPROVAL_REQUESTED) == 2  # never asked again


@dataclass
class Caller:
    user: str


def test_an_approval_on_the_sdk_state_with_a_context_is_honoured(
        tmp_path: Any, posting: Posting) -> None:
    # openai-agents-python#4244: the approval was lost when a context was passed.
    store = open_store(f"sqlite:///{tmp_path / 'j.db'}")
    agent, policies = posting.agent(approval=True)
    run = dict(store=store, run_id=RUN, policies=policies, context=Caller("ana"))
    waiting = JournalRunner.run_sync(agent, TASK, **run)
    state = waiting.to_state()
    for item in waiting.interruptions:
        state.approve(item)
    done = JournalRunner.run_sync(agent, state, **run)
    assert done.final_output == "posted 2"
    assert posting.counts() == {"a": 1, "b": 1}
    decided = [e.payload for e in store.read(RUN) if e.type is E.APPROVAL_DECIDED]
    assert [d["approved"] for d in decided] == [True, True]
    assert {d["by"] for d in decided} == {"openai-agents caller"}
    store.close()


def test_a_finished_run_is_replayed_from_its_log(tmp_path: Any, posting: Posting) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'j.db'}")
    first = posting.resume(store)
    agent, policies = posting.agent()
    again = JournalRunner.run_sync(agent, TASK, store=store, run_id=RUN, policies=policies)
    assert again.final_output == first.final_output == "posted 2"
    assert agent.model.calls == ()  # every answer from the log
    assert posting.counts() == {"a": 1, "b": 1}
    assert types(store).count(E.RUN_FINISHED) == 1
    store.close()


def test_a_model_asked_something_else_on_resume_in_strict_mode_is_refused(
        tmp_path: Any, posting: Posting) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'j.db'}")
    posting.resume(store)
    agent, policies = posting.agent()
    changed = agent.clone(instructions="Post nothing.")
    with pytest.raises(NondeterminismError, match=r"openai_agents\.model\.0"):
        JournalRunner.run_sync(changed, TASK, store=store, run_id=RUN, policies=policies,
                               strict=True)
    assert posting.counts() == {"a": 1, "b": 1}
    store.close()


def test_the_sdk_trace_is_kept_for_show(tmp_path: Any, posting: Posting) -> None:
    from click.testing import CliRunner

    from agentjournal.cli import cli

    url = f"sqlite:///{tmp_path / 'j.db'}"
    store = open_store(url)
    posting.resume(store)
    (trace,) = [e.payload for e in store.read(RUN) if e.type is E.TRACE_RECORDED]
    kinds = [s["kind"] for s in trace["spans"]]
    assert kinds.count("function") == 2 and {"agent", "turn", "task"} <= set(kinds)
    assert all("input" not in s and "output" not in s for s in trace["spans"])
    store.close()
    shown = CliRunner().invoke(cli, ["show", RUN, "--store", url])
    assert shown.exit_code == 0, shown.output
    assert "trace_recorded" in shown.output and "2 function" in shown.output


def test_mcp_annotations_give_the_effect_class() -> None:
    assert mcp_effect(ToolAnnotations(readOnlyHint=True)) is Effect.READ_ONLY
    assert mcp_effect(ToolAnnotations(idempotentHint=True)) is Effect.IDEMPOTENT
    assert mcp_effect(ToolAnnotations(destructiveHint=False)) is Effect.IRREVERSIBLE
    assert mcp_effect(None) is Effect.IRREVERSIBLE
    assert ToolPolicy().effect == Effect.IRREVERSIBLE


def test_a_session_of_a_run_killed_and_resumed_holds_each_item_once(
        tmp_path: Any, posting: Posting) -> None:
    # The resumed run is given the history its first attempt was given (not the one that
    # attempt grew) and does not add again what it added: no nondeterminism, no repeats.
    url = f"sqlite:///{tmp_path / 'j.db'}"
    posting.kill_at("model", url, session="chat")
    store = open_store(url)
    agent, policies = posting.agent()
    for _ in range(2):  # resumed, then replayed once finished
        done = JournalRunner.run_sync(agent, TASK, store=store, run_id=RUN,
                                      policies=policies, session=JournalSession(store, "chat"))
        assert done.final_output == "posted 2"
    items = asyncio.run(JournalSession(store, "chat").get_items())
    assert [i.get("type") or i.get("role") for i in items] == [
        "user", "function_call", "function_call", "function_call_output",
        "function_call_output", "message"]
    assert posting.counts() == {"a": 1, "b": 1}
    store.close()


# --- the same kill without agentjournal ------------------------------------------------------


def test_without_agentjournal_the_same_kill_posts_again(
        tmp_path: Any, posting: Posting) -> None:
    """The comparison: the SDK's Runner with a SQLiteSession, killed after the POST of
    ``b`` and run again as its docs say, makes both effects again."""
    db = str(tmp_path / "session.db")
    process, told = spawn(run_plain_until_blocked, db, posting.receiver.url, "after",
                          prefix=posting.prefix)
    try:
        assert told.poll(HANG) and told.recv() == "after"
    finally:
        process.kill()
        process.join()
    agent, _ = posting.agent(journaled=False)
    Runner.run_sync(agent, TASK, session=SQLiteSession("plain", db))
    posted = posting.counts()
    assert posted["b"] == 2  # ("a" twice too, unless the kill came before its POST)
    assert posted["a"] in (1, 2)



def test_mcp_tools_are_journaled_with_the_effect_their_annotations_declare(
        tmp_path: Any) -> None:
    import sys

    from agents import Agent
    from agents.mcp import MCPServerStdio
    from agents.testing import ScriptedModel, assistant_message, function_call

    counts = tmp_path / "served.txt"
    store = open_store(f"sqlite:///{tmp_path / 'j.db'}")

    async def run_once() -> Any:
        server = MCPServerStdio({"command": sys.executable, "args": [
            "-m", "tests.mcp_ledger", str(counts)], "cwd": str(ROOT)},
            client_session_timeout_seconds=60)
        model = ScriptedModel([
            [function_call("balance", {"account": "acme"}, call_id="call_1"),
             function_call("transfer", {"account": "acme", "cents": 500}, call_id="call_2")],
            [assistant_message("moved")]])
        async with server:
            agent = Agent(name="treasurer", model=model, mcp_servers=[server])
            return await JournalRunner.run(agent, "Move 500 from acme.", store=store,
                                           run_id="mcp")

    for _ in range(2):  # the second run is served from the log
        assert asyncio.run(run_once()).final_output == "moved"
    starts = {e.payload["tool"]: e.payload["effect"] for e in store.read("mcp")
              if e.type is E.TOOL_CALL_STARTED}
    assert starts == {"balance": "read_only", "transfer": "irreversible"}
    assert sorted(counts.read_text().split()) == ["balance", "transfer"]  # each once
    store.close()


def test_a_denied_call_is_not_made_and_the_model_is_told(tmp_path: Any,
                                                          posting: Posting) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'j.db'}")
    posting.resume(store, approval=True)
    asked = {e.payload["args"]["label"].removeprefix(posting.prefix): e.payload["approval_id"]
             for e in store.read(RUN) if e.type is E.APPROVAL_REQUESTED}
    decide_approval(store, RUN, asked["a"], approved=True, by="ops")
    decide_approval(store, RUN, asked["b"], approved=False, by="ops", reason="not b")
    done = posting.resume(store, approval=True)
    assert not done.interruptions
    assert posting.counts() == {"a": 1}
    told = [i for i in done.to_input_list() if i.get("type") == "function_call_output"]
    assert [o["output"] for o in told if o["call_id"] == "call_b"] == ["not b"]
    store.close()
