"""Size limits on what a call carries: arguments over ``max_args_bytes`` never reach a tool
(the model is told, the run goes on); a result over ``max_result_bytes`` comes after the
effect, so its call is recorded completed with its key, never made again, and only what
the result was (its size and digest) is kept. Nothing big is stored, nothing is dropped
without a record."""

from __future__ import annotations

import hashlib
import time
from typing import Any

import msgspec
import pytest

from agentjournal import (
    Agent,
    EventType,
    ModelRequest,
    ModelResponse,
    Rules,
    ScriptedModel,
    calls,
    decide_approval,
    fold,
    open_store,
    reply,
    tool,
)
from agentjournal.forks import fork
from agentjournal.state import ToolCall
from agentjournal.tools import Found

from .conftest import backend_params

E = EventType
LIMIT = 10_000
BIG = "0123456789" * 5_000  # 50,000 characters: five times the limit
PIECE = ("0123456789" * 50).encode()  # what any stored copy of BIG would contain


def stored(store: Any, run_id: str) -> bytes:
    """Every byte the run's log holds, and its snapshots' bodies."""
    return b"".join(store.records(run_id)) + b"".join(s.body for s in store.snapshots(run_id))


def seen_by(requests: list[ModelRequest], response: ModelResponse) -> Any:
    def turn(request: ModelRequest) -> ModelResponse:
        requests.append(request)
        return response
    return turn


def big_call(call_id: str = "c1") -> ModelResponse:
    """A turn asking to save BIG, with the provider items that repeat its arguments (an
    Anthropic tool_use block, an OpenAI Responses function_call item)."""
    args = {"data": BIG}
    return ModelResponse(
        tool_calls=[ToolCall(id=call_id, name="save", args=args),
                    ToolCall(id="c2", name="save", args={"data": "small"})],
        items=[{"type": "thinking", "thinking": "save it", "signature": "sig"},
               {"type": "tool_use", "id": call_id, "name": "save", "input": args},
               {"type": "function_call", "call_id": call_id, "name": "save",
                "arguments": msgspec.json.encode(args).decode()},
               {"type": "tool_use", "id": "c2", "name": "save", "input": {"data": "small"}}],
        provider="anthropic")


@backend_params()
def test_arguments_over_the_limit_never_reach_the_tool_and_the_model_is_told(
        store_url: str) -> None:
    saved: list[str] = []

    @tool(effect="idempotent")
    def save(data: str) -> str:
        saved.append(data)
        return "saved"

    requests: list[ModelRequest] = []
    agent = Agent(ScriptedModel([big_call(), seen_by(requests, reply("done"))]), [save],
                  max_args_bytes=LIMIT)
    with open_store(store_url) as store:
        result = agent.run(store, "r1", "save it")
        assert result.status == "finished"  # the run goes on
        assert saved == ["small"]  # the other call of the turn ran; the big one never did
        messages = requests[0].messages
        turn = next(m for m in messages if m.role == "assistant")
        big = turn.tool_calls[0]
        assert big.args == {} and big.too_large == 50_011  # b'{"data":"..."}'
        assert turn.tool_calls[1].args == {"data": "small"}
        # The provider's items hold the stand-in too; the rest is untouched.
        assert turn.items[0] == {"type": "thinking", "thinking": "save it", "signature": "sig"}
        assert turn.items[1]["input"] == {} and turn.items[2]["arguments"] == "{}"
        assert turn.items[3]["input"] == {"data": "small"}
        denial = next(m for m in messages if m.tool_call_id == "c1")
        assert denial.is_error
        assert "50,011 bytes, over the limit of 10,000 bytes (max_args_bytes)" in denial.content
        assert "the call was not made" in denial.content
        assert "pass a reference" in denial.content
        # Stored nowhere: not in the turn, not in a start, not in a snapshot.
        assert PIECE not in stored(store, "r1")
        log = list(store.read("r1"))
        assert [e.payload["call_id"] for e in log if e.type is E.TOOL_CALL_STARTED] == ["c2"]
        assert fold(log).messages == result.state.messages


@backend_params()
def test_a_call_whose_arguments_were_not_kept_is_denied_after_a_resume(
        store_url: str) -> None:
    """A log that ends at the turn (a fork there) holds the stand-in: the resumed run
    denies the call, never makes it with the empty arguments it recorded."""
    saved: list[str] = []

    @tool(effect="idempotent")
    def save(data: str = "") -> str:
        saved.append(data)
        return "saved"

    agent = Agent(ScriptedModel([big_call(), reply("done")]), [save], max_args_bytes=LIMIT)
    with open_store(store_url) as store:
        agent.run(store, "r1", "save it")
        turn = next(e.seq for e in store.read("r1") if e.type is E.MODEL_TURN)
        forked = fork(store, "r1", turn, "r1-fork")
        saved.clear()
        assert agent.run(store, forked).status == "finished"
        assert saved == []  # "small" was served from the scope; the big call denied
        denied = [e.payload for e in store.read(forked) if e.type is E.TOOL_CALL_DENIED]
        assert [d["call_id"] for d in denied] == ["c1"]
        assert "over the limit" in denied[0]["reason"]


@backend_params()
def test_a_result_over_the_limit_is_completed_with_its_key_and_never_made_again(
        store_url: str) -> None:
    made: list[str] = []

    @tool(effect="irreversible", identity=["ref"])
    def export(ref: str) -> dict[str, Any]:
        made.append(ref)
        return {"ref": ref, "rows": BIG}

    requests: list[ModelRequest] = []
    script = [calls(("export", {"ref": "e1"})), seen_by(requests, calls(("export", {"ref": "e1"}))),
              seen_by(requests, reply("done"))]
    agent = Agent(ScriptedModel(script), [export], max_result_bytes=LIMIT)
    with open_store(store_url) as store:
        assert agent.run(store, "r1", "export").status == "finished"
        assert made == ["e1"]  # made once; the repeat is served, never made again
        done = next(e.payload for e in store.read("r1") if e.type is E.TOOL_CALL_COMPLETED)
        assert done["idempotency_key"] and done["result"] is None and done["is_error"]
        body = msgspec.json.encode({"ref": "e1", "rows": BIG})
        assert done["result_bytes"] == len(body) == 50_022
        assert done["result_sha256"] == hashlib.sha256(body).hexdigest()
        told = next(m for m in requests[0].messages if m.role == "tool").content
        assert told.startswith("error: the call was made, but its result was not kept")
        assert "50,022 bytes, over the limit of 10,000 bytes (max_result_bytes)" in told
        served = next(e for e in store.read("r1") if e.type is E.TOOL_RESULT_SERVED)
        assert fold(list(store.read("r1"))).messages[-2].content == told  # served so
        assert served.payload["served_from_seq"] == next(
            e.seq for e in store.read("r1") if e.type is E.TOOL_CALL_COMPLETED)
        assert PIECE not in stored(store, "r1")
        assert agent.run(store, "r1").status == "finished" and made == ["e1"]


def test_the_limits_are_on_by_default_and_checked() -> None:
    agent = Agent(ScriptedModel([]), [])
    assert (agent.max_args_bytes, agent.max_result_bytes) == (1_048_576, 4_194_304)
    for bad in (0, -1, 1.5):
        with pytest.raises(ValueError, match="max_args_bytes"):
            Agent(ScriptedModel([]), [], max_args_bytes=bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="max_result_bytes"):
            Agent(ScriptedModel([]), [], max_result_bytes=bad)  # type: ignore[arg-type]
    unlimited = Agent(ScriptedModel([]), [], max_args_bytes=None, max_result_bytes=None)
    assert (unlimited.max_args_bytes, unlimited.max_result_bytes) == (None, None)


def test_arguments_that_are_not_json_count_too(tmp_path: Any) -> None:
    saved: list[str] = []

    @tool(effect="idempotent")
    def save(data: str) -> str:
        saved.append(data)
        return "saved"

    raw = ModelResponse(tool_calls=[ToolCall(id="c1", name="save", raw_arguments=BIG + "{")])
    agent = Agent(ScriptedModel([raw, reply("done")]), [save], max_args_bytes=LIMIT)
    with open_store(f"sqlite:///{tmp_path / 'j.db'}") as store:
        result = agent.run(store, "r1", "save it")
        assert result.status == "finished" and saved == []
        call = next(m for m in result.state.messages if m.role == "assistant").tool_calls[0]
        assert call.raw_arguments is None and call.too_large == 50_001
        assert PIECE not in stored(store, "r1")


def test_a_re_read_result_over_the_limit_is_marked_stale(tmp_path: Any) -> None:
    rows = {"rows": "small"}

    @tool(effect="read_only", fresh_for=0.2)
    def table(name: str) -> dict[str, str]:
        return dict(rows)

    @tool(effect="irreversible", identity=["ref"])
    def post(ref: str) -> str:
        return ref

    requests: list[ModelRequest] = []
    agent = Agent(ScriptedModel([calls(("table", {"name": "t"})), calls(("post", {"ref": "p"})),
                                 seen_by(requests, reply("done"))]),
                  [table, post], policy=Rules(require_approval={"post"}),
                  max_result_bytes=LIMIT)
    with open_store(f"sqlite:///{tmp_path / 'j.db'}") as store:
        assert agent.run(store, "r1", "read").status == "waiting_approval"
        approval = next(iter(fold(list(store.read("r1"))).approvals))
        decide_approval(store, "r1", approval, approved=True, by="ana")
        rows["rows"] = BIG
        time.sleep(0.3)  # past the table's freshness
        assert agent.run(store, "r1").status == "finished"
        item = next(e for e in store.read("r1")
                    if e.type is E.OBSERVATIONS_CHECKED).payload["items"][0]
        assert item["verdict"] == "stale" and "over the limit of 10,000" in item["why"]
        note = requests[0].messages[-1].content
        assert "may no longer hold: the re-read result was not kept: it was 50,011 bytes" in note
        assert PIECE not in stored(store, "r1")


@backend_params()
def test_a_result_found_by_reconciliation_over_the_limit_is_kept_as_its_size(
        store_url: str) -> None:
    """An uncertain call whose lookup finds it done: completed with its key, and neither
    the completion nor the verdict's evidence keeps the big result."""
    made: list[str] = []

    def find(call: Any) -> Found:
        return Found({"ref": "e1", "rows": BIG})

    @tool(effect="irreversible", identity=["ref"], reconcile=find)
    def export(ref: str) -> str:
        made.append(ref)
        raise ConnectionError("the connection dropped after the request was sent")

    agent = Agent(ScriptedModel([calls(("export", {"ref": "e1"})), reply("done")]), [export],
                  max_result_bytes=LIMIT)
    with open_store(store_url) as store:
        assert agent.run(store, "r1", "export").status == "finished"
        assert made == ["e1"]
        log = list(store.read("r1"))
        verdict = next(e.payload for e in log if e.type is E.TOOL_CALL_RECONCILED)
        assert verdict["verdict"] == "found"
        assert "over the limit of 10,000" in verdict["evidence"]["not_kept"]
        assert verdict["evidence"]["bytes"] == 50_022
        done = next(e.payload for e in log if e.type is E.TOOL_CALL_COMPLETED)
        assert done["idempotency_key"] and done["source"] == "reconciliation"
        assert done["result"] is None and done["result_bytes"] == 50_022
        assert PIECE not in stored(store, "r1")


@backend_params()
def test_a_result_not_kept_is_told_so_to_another_run_of_the_scope(store_url: str) -> None:
    """Run B of the same operation is answered from run A's completion: told the result
    was not kept, never given null as a success."""
    made: list[str] = []

    @tool(effect="irreversible", identity=["ref"])
    def export(ref: str) -> dict[str, Any]:
        made.append(ref)
        return {"ref": ref, "rows": BIG}

    requests: list[ModelRequest] = []

    def agent() -> Agent:
        return Agent(ScriptedModel([calls(("export", {"ref": "e1"})),
                                    seen_by(requests, reply("done"))]),
                     [export], max_result_bytes=LIMIT)

    with open_store(store_url) as store:
        agent().run(store, "a", "export", scope="op-1")
        agent().run(store, "b", "export", scope="op-1")
        assert made == ["e1"]
        told = [next(m for m in r.messages if m.role == "tool") for r in requests]
        assert told[1].is_error and told[1].content == told[0].content
        assert "over the limit of 10,000" in told[1].content
        done = next(e.payload for e in store.read("b") if e.type is E.TOOL_CALL_COMPLETED)
        assert done["source"] == "scope" and done["result"] is None
        assert "over the limit" in done["encoding_error"]


# --- through the real provider adapters, against the loopback stub --------------------


@pytest.mark.parametrize("provider", ["openai-chat", "openai-responses", "anthropic"])
def test_a_provider_is_sent_the_stand_in_and_accepts_it(provider: str, tmp_path: Any) -> None:
    """The turn the provider gets back holds the stand-in (its reasoning or thinking
    untouched), the stub accepts every request as the real API would, no order is placed,
    and none of the big arguments is stored."""
    from agentjournal.testing.llm_stub import Reply, StubServer

    from .test_real_models import Receiver, drive, model_bodies, tool_results

    receiver = Receiver()
    with StubServer() as stub, open_store(f"sqlite:///{tmp_path / 'j.db'}") as store:
        stub.script([Reply(calls=[("place_order", {"order_id": BIG, "qty": 1}),
                                  ("lookup", {"city": "Oslo"})],
                           reasoning=True, thinking=True),
                     Reply(text="sorry")])
        result = drive(provider, stub, store, receiver.tools(), max_args_bytes=LIMIT)
        assert result.status == "finished" and stub.rejections == []
        assert receiver.effects == {} and receiver.lookups == {"Oslo": 1}
        again = model_bodies(stub, provider)[1]
        assert BIG not in msgspec.json.encode(again).decode()
        told = list(tool_results(provider, again).values())
        assert any("over the limit of 10,000 bytes" in str(t) for t in told)
        assert PIECE not in stored(store, "r1")
