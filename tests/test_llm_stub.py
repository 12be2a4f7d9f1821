"""The loopback LLM stub, exercised through the real openai and anthropic SDK clients."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from agentjournal.testing.llm_stub import Drop, Fail, Hang, Reply, StubServer, Usage, serve
from agentjournal.testing.llm_stub.wire import item_from_json

USER = {"role": "user", "content": "add 1 and 2"}
MAX = 256
Ask = Callable[[str], Any]


@pytest.fixture
def stub() -> Iterator[StubServer]:
    yield from serve()


@pytest.fixture
def oai(stub: StubServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=stub.url + "/v1", api_key="test", max_retries=0) as client:
        yield client


@pytest.fixture
def claude(stub: StubServer) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=stub.url, api_key="test", max_retries=0) as client:
        yield client


def dumped(items: Any) -> list[dict[str, Any]]:
    """SDK output objects as the plain dicts a client echoes back."""
    return [item.model_dump(exclude_none=True) for item in items]


# --- OpenAI Chat Completions ---------------------------------------------------------------


def test_openai_chat_tool_call_parses(stub: StubServer, oai: openai.OpenAI) -> None:
    usage = Usage(input=30, output=9, cached=10, reasoning=4)
    stub.script([Reply(calls=[("add", {"a": 1}), ("add", '{"a": 1')], usage=usage)])
    out = oai.chat.completions.create(model="m", messages=[USER])
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    calls = choice.message.tool_calls or []
    assert [c.function.arguments for c in calls] == ['{"a": 1}', '{"a": 1']  # type: ignore[union-attr]
    assert len({c.id for c in calls}) == 2
    assert out.usage is not None and out.usage.total_tokens == 39
    assert out.usage.prompt_tokens_details.cached_tokens == 10  # type: ignore[union-attr]
    assert out.usage.completion_tokens_details.reasoning_tokens == 4  # type: ignore[union-attr]
    assert out._request_id and out._request_id.startswith("req_")


@pytest.mark.parametrize(
    ("stop", "finish"), [("length", "length"), ("content_filter", "content_filter")]
)
def test_openai_chat_stops(stub: StubServer, oai: openai.OpenAI, stop: str, finish: str) -> None:
    stub.script([Reply(text="partial", stop=stop)])
    out = oai.chat.completions.create(model="m", messages=[USER])
    assert out.choices[0].finish_reason == finish


def test_openai_chat_refusal(stub: StubServer, oai: openai.OpenAI) -> None:
    stub.script([Reply(text="I can't help with that.", stop="refusal")])
    message = oai.chat.completions.create(model="m", messages=[USER]).choices[0].message
    assert (message.content, message.refusal) == (None, "I can't help with that.")


def chat_call_turn(oai: openai.OpenAI) -> tuple[dict[str, Any], str]:
    first = oai.chat.completions.create(model="m", messages=[USER]).choices[0].message
    call_id = first.tool_calls[0].id  # type: ignore[index]
    return first.model_dump(exclude_none=True), call_id


def test_openai_chat_two_turns_accepted(stub: StubServer, oai: openai.OpenAI) -> None:
    stub.script([Reply(calls=[("add", {"a": 1, "b": 2})]), Reply(text="3")])
    assistant, call_id = chat_call_turn(oai)
    result = {"role": "tool", "tool_call_id": call_id, "content": "3"}
    system = {"role": "system", "content": "be brief"}
    out = oai.chat.completions.create(model="m", messages=[system, USER, assistant, result])
    assert out.choices[0].message.content == "3"
    assert out.choices[0].finish_reason == "stop"
    assert stub.rejections == []
    assert stub.counts["chat"] == 2
    assert [path for path, _, _ in stub.requests] == ["/v1/chat/completions"] * 2
    assert stub.requests[0][2]["authorization"] == "Bearer test"


def test_openai_chat_missing_tool_result_rejected(stub: StubServer, oai: openai.OpenAI) -> None:
    stub.script([Reply(calls=[("add", {}), ("add", {})]), Reply(text="never")])
    assistant, call_id = chat_call_turn(oai)
    result = {"role": "tool", "tool_call_id": call_id, "content": "3"}
    with pytest.raises(openai.BadRequestError) as err:
        oai.chat.completions.create(model="m", messages=[USER, assistant, result, USER])
    assert err.value.status_code == 400
    assert "did not have response messages" in stub.rejections[-1].reason
    # A rejected request consumes no script item.
    out = oai.chat.completions.create(model="m", messages=[USER])
    assert out.choices[0].message.content == "never"


def test_openai_chat_orphan_tool_result_rejected(stub: StubServer, oai: openai.OpenAI) -> None:
    orphan = {"role": "tool", "tool_call_id": "call_nope", "content": "3"}
    with pytest.raises(openai.BadRequestError) as err:
        oai.chat.completions.create(model="m", messages=[USER, orphan])
    assert err.value.body["type"] == "invalid_request_error"  # type: ignore[index]
    assert stub.rejections[-1].path == "/v1/chat/completions"
    assert "orphan" in stub.rejections[-1].reason
    assert stub.counts["rejected"] == 1


def test_openai_chat_scripted_call_ids_and_duplicate_results(
    stub: StubServer, oai: openai.OpenAI
) -> None:
    # As some OpenAI-compatible servers answer: every call of the turn with one id.
    stub.script([Reply(calls=[("add", {"a": 1}), ("add", {"a": 2})], call_ids=["", ""])])
    assistant, _ = chat_call_turn(oai)
    assert [c["id"] for c in assistant["tool_calls"]] == ["", ""]
    results = [{"role": "tool", "tool_call_id": "", "content": str(n)} for n in (1, 2)]
    with pytest.raises(openai.BadRequestError):
        oai.chat.completions.create(model="m", messages=[USER, assistant, *results])
    assert "Duplicate value for 'tool_call_id'" in stub.rejections[-1].reason


# --- OpenAI Responses ----------------------------------------------------------------------


def test_openai_responses_tool_call_parses(stub: StubServer, oai: openai.OpenAI) -> None:
    stub.script([Reply(calls=[("add", {"a": 1})], reasoning="adding", usage=Usage(reasoning=3))])
    out = oai.responses.create(model="m", input="add", instructions="be brief")
    assert out.status == "completed" and out.incomplete_details is None
    reasoning, call = out.output
    assert reasoning.type == "reasoning" and reasoning.encrypted_content
    assert reasoning.summary[0].text == "adding"
    assert call.type == "function_call" and call.arguments == '{"a": 1}'
    assert call.call_id.startswith("call_") and call.id.startswith("fc_")  # type: ignore[union-attr]
    assert out.usage is not None and out.usage.output_tokens_details.reasoning_tokens == 3
    assert out.instructions == "be brief"
    assert out._request_id and out._request_id.startswith("req_")


def test_openai_responses_length_is_incomplete(stub: StubServer, oai: openai.OpenAI) -> None:
    stub.script([Reply(text="partial", stop="length")])
    out = oai.responses.create(model="m", input="add")
    assert out.status == "incomplete"
    assert out.incomplete_details and out.incomplete_details.reason == "max_output_tokens"
    assert out.output_text == "partial"


def test_openai_responses_stream_as_the_client_reads_it(
        stub: StubServer, oai: openai.OpenAI) -> None:
    stub.script([Reply(calls=[("add", {"a": 1})]), Reply(text="three")])
    with oai.responses.create(model="m", input="add", stream=True) as stream:
        events = list(stream)
    assert [e.type for e in events] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done", "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    (call,) = events[-1].response.output  # type: ignore[union-attr]
    assert call.type == "function_call" and call.arguments == '{"a": 1}'
    with oai.responses.create(model="m", input="add", stream=True) as stream:
        texts = [e.delta for e in stream if e.type == "response.output_text.delta"]
    assert texts == ["three"] and stub.counts["responses_create"] == 2


def test_streaming_chat_or_messages_is_refused(stub: StubServer, oai: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="streaming is supported for /v1/responses"):
        oai.chat.completions.create(model="m", messages=[USER], stream=True)
    assert stub.counts["rejected"] == 1


def responses_call_turn(oai: openai.OpenAI) -> tuple[list[dict[str, Any]], str]:
    out = oai.responses.create(model="m", input=[USER], store=False)
    call_id = out.output[-1].call_id  # type: ignore[union-attr]
    return dumped(out.output), call_id


def test_openai_responses_two_turns_stateless_accepted(
    stub: StubServer, oai: openai.OpenAI
) -> None:
    stub.script([Reply(calls=[("add", {})], reasoning=True), Reply(text="3")])
    echoed, call_id = responses_call_turn(oai)
    result = {"type": "function_call_output", "call_id": call_id, "output": "3"}
    out = oai.responses.create(model="m", input=[USER, *echoed, result], store=False)
    assert out.output_text == "3"
    assert stub.rejections == []


def test_openai_responses_previous_response_id_accepted(
    stub: StubServer, oai: openai.OpenAI
) -> None:
    stub.script([Reply(calls=[("add", {})], reasoning=True), Reply(text="3")])
    first = oai.responses.create(model="m", input="add")
    call_id = first.output[-1].call_id  # type: ignore[union-attr]
    result = {"type": "function_call_output", "call_id": call_id, "output": "3"}
    out = oai.responses.create(model="m", input=[result], previous_response_id=first.id)
    assert out.output_text == "3"
    with pytest.raises(openai.BadRequestError):  # the call stays answered once
        oai.responses.create(model="m", input=[result], previous_response_id=out.id)
    assert "No tool call found" in stub.rejections[-1].reason


def test_openai_responses_missing_reasoning_rejected(stub: StubServer, oai: openai.OpenAI) -> None:
    stub.script([Reply(calls=[("add", {})], reasoning=True)])
    echoed, call_id = responses_call_turn(oai)
    result = {"type": "function_call_output", "call_id": call_id, "output": "3"}
    with pytest.raises(openai.BadRequestError):
        oai.responses.create(model="m", input=[USER, echoed[1], result], store=False)
    assert "reasoning item missing" in stub.rejections[-1].reason
    tampered = {**echoed[0], "encrypted_content": "gAAAAB-forged"}
    with pytest.raises(openai.BadRequestError):
        oai.responses.create(model="m", input=[USER, tampered, echoed[1], result], store=False)
    assert "could not be verified" in stub.rejections[-1].reason


def test_openai_responses_missing_and_orphan_outputs_rejected(
    stub: StubServer, oai: openai.OpenAI
) -> None:
    stub.script([Reply(calls=[("add", {})])])
    echoed, _ = responses_call_turn(oai)
    with pytest.raises(openai.BadRequestError):
        oai.responses.create(model="m", input=[USER, *echoed], store=False)
    assert "No tool output found" in stub.rejections[-1].reason
    orphan = {"type": "function_call_output", "call_id": "call_nope", "output": "3"}
    with pytest.raises(openai.BadRequestError):
        oai.responses.create(model="m", input=[USER, orphan], store=False)
    assert "No tool call found" in stub.rejections[-1].reason


def test_openai_responses_background(stub: StubServer, oai: openai.OpenAI) -> None:
    stub.script([Reply(text="late", delay=0.15)])
    created = oai.responses.create(model="m", input="add", background=True)
    assert (created.status, created.output, created.background) == ("queued", [], True)
    assert oai.responses.retrieve(created.id).status == "in_progress"
    time.sleep(0.2)
    done = oai.responses.retrieve(created.id)
    assert (done.status, done.output_text) == ("completed", "late")
    assert stub.counts["created"] == 1
    assert stub.counts["responses_create"] == 1 and stub.counts["responses_retrieve"] == 2
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve("resp_unknown")


def test_openai_responses_background_without_retrieve() -> None:
    # As several OpenAI-compatible servers: the answer comes with the create call.
    with StubServer([Reply(text="at once")], retrieve=False) as stub, openai.OpenAI(
            base_url=stub.url + "/v1", api_key="test", max_retries=0) as oai:
        created = oai.responses.create(model="m", input="add", background=True)
        assert (created.status, created.output_text) == ("completed", "at once")
        with pytest.raises(openai.NotFoundError):
            oai.responses.retrieve(created.id)
        with pytest.raises(openai.NotFoundError):
            oai.responses.cancel(created.id)
        assert stub.counts["created"] == 1 and stub.counts["responses_retrieve"] == 0


def test_openai_responses_background_cancel(stub: StubServer, oai: openai.OpenAI) -> None:
    stub.script([Reply(text="never", delay=30)])
    created = oai.responses.create(model="m", input="add", background=True)
    assert oai.responses.cancel(created.id).status == "cancelled"
    assert oai.responses.retrieve(created.id).status == "cancelled"


# --- Anthropic Messages --------------------------------------------------------------------


def test_anthropic_tool_use_parses(stub: StubServer, claude: anthropic.Anthropic) -> None:
    usage = Usage(input=20, output=5, cached=8, cache_write=2)
    stub.script([Reply(text="adding", calls=[("add", {"a": 1})], thinking="hmm", usage=usage)])
    out = claude.messages.create(model="m", max_tokens=MAX, messages=[USER])
    thinking, text, use = out.content
    assert thinking.type == "thinking" and thinking.signature and thinking.thinking == "hmm"
    assert text.type == "text" and text.text == "adding"
    assert use.type == "tool_use" and use.input == {"a": 1} and use.id.startswith("toolu_")
    assert out.stop_reason == "tool_use"
    assert (out.usage.input_tokens, out.usage.output_tokens) == (20, 5)
    assert out.usage.cache_read_input_tokens == 8
    assert out.usage.cache_creation_input_tokens == 2
    assert out._request_id and out._request_id.startswith("req_")


@pytest.mark.parametrize(
    ("stop", "reason"),
    [(None, "end_turn"), ("length", "max_tokens"), ("pause_turn", "pause_turn")],
)
def test_anthropic_stops(
    stub: StubServer, claude: anthropic.Anthropic, stop: str | None, reason: str
) -> None:
    stub.script([Reply(text="x", stop=stop)])
    assert claude.messages.create(model="m", max_tokens=MAX, messages=[USER]).stop_reason == reason


def anthropic_call_turn(claude: anthropic.Anthropic) -> tuple[dict[str, Any], str]:
    out = claude.messages.create(model="m", max_tokens=MAX, messages=[USER])
    use_id = out.content[-1].id  # type: ignore[union-attr]
    return {"role": "assistant", "content": dumped(out.content)}, use_id


def test_anthropic_two_turns_accepted(stub: StubServer, claude: anthropic.Anthropic) -> None:
    stub.script([Reply(calls=[("add", {})], thinking=True, redacted_thinking=True), Reply("3")])
    assistant, use_id = anthropic_call_turn(claude)
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use_id}]}
    system = [{"type": "text", "text": "be brief"}]
    out = claude.messages.create(
        model="m", max_tokens=MAX, system=system, messages=[USER, assistant, result]
    )
    assert out.content[0].text == "3"  # type: ignore[union-attr]
    assert stub.rejections == [] and stub.counts["messages"] == 2


def test_anthropic_missing_and_orphan_results_rejected(
    stub: StubServer, claude: anthropic.Anthropic
) -> None:
    stub.script([Reply(calls=[("add", {}), ("add", {})])])
    assistant, use_id = anthropic_call_turn(claude)
    one = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use_id}]}
    with pytest.raises(anthropic.BadRequestError) as err:
        claude.messages.create(model="m", max_tokens=MAX, messages=[USER, assistant, one])
    assert err.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert "without `tool_result` blocks" in stub.rejections[-1].reason
    orphan = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x"}]}
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.create(model="m", max_tokens=MAX, messages=[orphan])
    assert "unexpected `tool_use_id`" in stub.rejections[-1].reason


def test_anthropic_tool_use_ids_checked(stub: StubServer, claude: anthropic.Anthropic) -> None:
    stub.script([Reply(calls=[("add", {}), ("add", {})], call_ids=["", ""])])
    out = claude.messages.create(model="m", max_tokens=MAX, messages=[USER])
    assert [b.id for b in out.content if b.type == "tool_use"] == ["", ""]

    def turn(*ids: str) -> list[dict[str, Any]]:
        uses = [{"type": "tool_use", "id": i, "name": "add", "input": {}} for i in ids]
        results = [{"type": "tool_result", "tool_use_id": i} for i in ids]
        return [USER, {"role": "assistant", "content": uses}, {"role": "user", "content": results}]

    for ids, reason in [(("",), "should match pattern"), (("call:0",), "should match pattern"),
                        (("a", "a"), "ids must be unique")]:
        with pytest.raises(anthropic.BadRequestError):
            claude.messages.create(model="m", max_tokens=MAX, messages=turn(*ids))
        assert reason in stub.rejections[-1].reason
    # Unique across the request, not only within a turn.
    again = [*turn("a"), {"role": "assistant", "content": turn("a")[1]["content"]},
             turn("a")[2]]
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.create(model="m", max_tokens=MAX, messages=again)
    assert "ids must be unique" in stub.rejections[-1].reason


def test_anthropic_tampered_thinking_rejected(
    stub: StubServer, claude: anthropic.Anthropic
) -> None:
    stub.script([Reply(calls=[("add", {})], thinking=True)])
    assistant, use_id = anthropic_call_turn(claude)
    assistant["content"][0]["thinking"] += " (edited)"
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use_id}]}
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.create(model="m", max_tokens=MAX, messages=[USER, assistant, result])
    assert "signature" in stub.rejections[-1].reason


def test_anthropic_roles_and_max_tokens_checked(
    stub: StubServer, claude: anthropic.Anthropic
) -> None:
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.create(model="m", max_tokens=MAX, messages=[USER, USER])
    assert "alternate" in stub.rejections[-1].reason
    body = json.dumps({"model": "m", "messages": [USER]}).encode()
    request = urllib.request.Request(stub.url + "/v1/messages", data=body, method="POST")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(request, timeout=5)
    assert err.value.code == 400
    assert json.loads(err.value.read())["error"]["message"] == "max_tokens: Field required"


# --- Failures, on both providers -----------------------------------------------------------


@pytest.fixture
def ask(oai: openai.OpenAI, claude: anthropic.Anthropic) -> Callable[[str], Any]:
    """One request through the named provider's real client."""

    def ask(provider: str) -> Any:
        if provider == "openai":
            return oai.chat.completions.create(model="m", messages=[USER], timeout=0.2)
        return claude.messages.create(model="m", max_tokens=MAX, messages=[USER], timeout=0.2)

    return ask


SDKS = {"openai": openai, "anthropic": anthropic}


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_fail_statuses_map_to_sdk_errors(stub: StubServer, ask: Ask, provider: str) -> None:
    sdk: Any = SDKS[provider]
    stub.script([Fail(429, retry_after=7, retry_after_ms=7000), Fail(500), Fail(401)])
    with pytest.raises(sdk.RateLimitError) as limited:
        ask(provider)
    assert limited.value.response.headers["retry-after"] == "7"
    assert limited.value.response.headers["retry-after-ms"] == "7000"
    with pytest.raises(sdk.InternalServerError):
        ask(provider)
    with pytest.raises(sdk.AuthenticationError):
        ask(provider)
    assert stub.counts["failed"] == 3


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_drop_and_hang_are_connection_errors(stub: StubServer, ask: Ask, provider: str) -> None:
    sdk: Any = SDKS[provider]
    stub.script([Drop(), Hang(5)])
    with pytest.raises(sdk.APIConnectionError):
        ask(provider)
    with pytest.raises(sdk.APITimeoutError):  # the client gives up after 0.2 s
        ask(provider)
    assert ask(provider) is not None  # the stub still answers afterwards


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_callable_sees_request_body_and_exhaustion_says_done(
    stub: StubServer, ask: Ask, provider: str
) -> None:
    seen: list[dict[str, Any]] = []

    def decide(body: dict[str, Any]) -> Reply:
        seen.append(body)
        return Reply(text=f"{len(body['messages'])} message(s)")

    stub.script([decide])
    first, second = ask(provider), ask(provider)
    texts = [
        out.choices[0].message.content if provider == "openai" else out.content[0].text
        for out in (first, second)
    ]
    assert texts == ["1 message(s)", "done"]
    assert seen[0]["messages"] == [USER]


def test_openai_broken_callable_is_a_500(stub: StubServer, oai: openai.OpenAI) -> None:
    stub.script([lambda body: body["no such key"], lambda body: "not a reply"])
    for _ in range(2):
        with pytest.raises(openai.InternalServerError):
            oai.chat.completions.create(model="m", messages=[USER])
    assert "KeyError" in stub.errors[0] and "TypeError" in stub.errors[1]


def test_openai_cli_serves_from_script_file(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"type": "reply", "text": "from file"}]))
    port_file = tmp_path / "port"
    root = Path(__file__).resolve().parent.parent
    args = ["--port-file", str(port_file), "--script", str(script)]
    proc = subprocess.Popen([sys.executable, "-m", "agentjournal.testing.llm_stub", *args],
                            cwd=root)
    try:
        deadline = time.monotonic() + 120  # a hang guard
        while not port_file.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        url = f"http://127.0.0.1:{port_file.read_text()}/v1"
        with openai.OpenAI(base_url=url, api_key="t", max_retries=0) as oai:
            out = oai.chat.completions.create(model="m", messages=[USER])
        assert out.choices[0].message.content == "from file"
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_cli_help_gives_the_script_format() -> None:
    done = subprocess.run([sys.executable, "-m", "agentjournal.testing.llm_stub", "--help"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    for item in ('{"type": "reply"', '{"type": "fail"', '{"type": "drop"}', '{"type": "hang"'):
        assert item in done.stdout, done.stdout
    assert "--port-file" in done.stdout and "example:" in done.stdout


@pytest.mark.parametrize(("item", "says"), [
    ({"type": "nope"}, "type must be one of reply, fail, drop, hang"),
    ({"text": "hi", "colour": "red"}, "unexpected keyword argument 'colour'"),
    ("hi", "a script item is a JSON object"),
])
def test_cli_refuses_a_bad_script_item_naming_it(tmp_path: Path, item: object,
                                                 says: str) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"text": "fine"}, item]))
    done = subprocess.run([sys.executable, "-m", "agentjournal.testing.llm_stub", "--script",
                           str(script)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and says in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_a_fail_item_from_json_may_name_its_error_type() -> None:
    fail = item_from_json({"type": "fail", "status": 429, "type_name": "rate_limit_error"})
    assert fail == Fail(429, type="rate_limit_error")
