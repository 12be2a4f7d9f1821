"""Provider adapters: recorded responses in, ModelResponse out; history in, request out;
SDK errors in, ModelError out. Offline: a duck-typed fake client returns the SDKs'
own types, validated from hand-written fixtures that follow the real shapes."""

from __future__ import annotations

import asyncio
import email.utils
import importlib
import json
import re
import sys
import time
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anthropic
import httpx2
import openai
import pytest
from anthropic.types import Message as AnthropicMessage
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

import agentjournal.providers
from agentjournal.errors import MissingExtraError
from agentjournal.models import ModelError, ModelRequest, Price, cost_of, stop_kind
from agentjournal.providers import AnthropicModel, OpenAIChatModel, OpenAIResponsesModel
from agentjournal.providers._common import NO_RESULT, retry_after
from agentjournal.state import Message, ToolCall, Usage

FIXTURES = Path(__file__).parent / "fixtures" / "providers"


def load(name: str, model: Any, request_id: str | None = "req_fixture") -> Any:
    obj = model.model_validate(json.loads((FIXTURES / f"{name}.json").read_text()))
    obj._request_id = request_id  # what the SDK sets from the x-request-id header
    return obj


class FakeClient:
    """Answers every SDK method with the next scripted object (or raises it)."""

    def __init__(self, *script: Any) -> None:
        self.script = list(script)
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self.options: list[dict[str, Any]] = []
        self.chat = SimpleNamespace(completions=SimpleNamespace(
            create=partial(self._answer, "chat.completions.create")))
        self.responses = SimpleNamespace(create=partial(self._answer, "responses.create"),
                                         retrieve=partial(self._answer, "responses.retrieve"))
        self.messages = SimpleNamespace(create=partial(self._answer, "messages.create"))

    def with_options(self, **options: Any) -> FakeClient:
        self.options.append(options)
        return self

    def _answer(self, method: str, *args: Any, **kwargs: Any) -> Any:
        # As the SDK sends it: extra_body is merged into the body, over the typed values.
        extra = kwargs.pop("extra_body", None) or {}
        kwargs = {**kwargs, **extra}
        self.calls.append((method, args, kwargs))
        out = self.script.pop(0)
        if isinstance(out, BaseException):
            raise out
        return out

    @property
    def sent(self) -> dict[str, Any]:
        return self.calls[-1][2]


class FakeAsyncClient(FakeClient):
    async def __aenter__(self) -> FakeAsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def _answer(self, method: str, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        return FakeClient._answer(self, method, *args, **kwargs)


def request(messages: list[Message] | None = None, *, instructions: str | None = None,
            tools: list[dict[str, Any]] | None = None) -> ModelRequest:
    return ModelRequest(run_id="r1", turn=0, messages=messages or [user("hi", 1)],
                        tools=tools or [], instructions=instructions)


def user(text: str, seq: int) -> Message:
    return Message(role="user", content=text, trust="user", seq=seq)


def result(call_id: str, text: str, seq: int, *, is_error: bool = False) -> Message:
    return Message(role="tool", content=text, trust="tool", seq=seq, tool_call_id=call_id,
                   name="read_file", is_error=is_error)


READ = {"name": "read_file", "description": "Read a file",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}


# --- recorded responses -> ModelResponse ---------------------------------------------


def test_openai_chat_parallel_tool_calls() -> None:
    client = FakeClient(load("openai_chat_tool_calls", ChatCompletion, "req_chat1"))
    out = OpenAIChatModel(client, "gpt-4o", temperature=0).complete(
        request(instructions="Be brief.", tools=[READ]))
    assert client.options == [{"max_retries": 0}]
    assert client.sent["temperature"] == 0 and client.sent["model"] == "gpt-4o"
    assert out.tool_calls == [ToolCall(id="call_read_a", name="read_file", args={"path": "a.txt"}),
                              ToolCall(id="call_read_b", name="read_file",
                                       args={"path": "b.txt", "lines": [1, 2]})]
    assert (out.text, out.finish_reason, out.provider) == ("", "tool_calls", "openai.chat")
    assert (out.model, out.response_id, out.request_id) == (
        "gpt-4o-2024-08-06", "chatcmpl-Bx7tools", "req_chat1")
    assert out.items == []
    assert out.usage == Usage(input_tokens=1200, output_tokens=60, cached_input_tokens=1024,
                              cost_usd=(176 * 2.50 + 1024 * 1.25 + 60 * 10.00) / 1e6)
    assert stop_kind(out) == "done"


def test_openai_chat_price_override() -> None:
    client = FakeClient(load("openai_chat_tool_calls", ChatCompletion))
    out = OpenAIChatModel(client, "gpt-4o", prices={"gpt-4o-2024-08-06": Price(1.0, 2.0)}
                          ).complete(request())
    assert out.usage.cost_usd == pytest.approx((1200 * 1.0 + 60 * 2.0) / 1e6)


def test_openai_chat_invalid_arguments_keep_raw() -> None:
    client = FakeClient(load("openai_chat_invalid_args", ChatCompletion))
    out = OpenAIChatModel(client, "gpt-4o-mini").complete(request())
    assert out.text == "Let me look."
    assert out.tool_calls == [
        ToolCall(id="call_broken", name="read_file", args={},
                 raw_arguments='{"path": "a.txt"'),
        ToolCall(id="call_list", name="read_file", args={}, raw_arguments='["a.txt"]'),
        ToolCall(id="call_empty", name="now", args={}),
    ]
    assert out.usage.cost_usd == pytest.approx((300 * 0.15 + 40 * 0.60) / 1e6)


def test_openai_chat_length_stop_pauses() -> None:
    client = FakeClient(load("openai_chat_length", ChatCompletion))
    out = OpenAIChatModel(client, "gpt-4.1").complete(request())
    assert (out.text, out.finish_reason, stop_kind(out)) == (
        "The report begins with", "length", "pause")
    # gpt-4.1 has no cache-write price: written tokens bill as input.
    assert out.usage == Usage(input_tokens=500, output_tokens=16, cache_write_tokens=256,
                              cost_usd=(500 * 2.00 + 16 * 8.00) / 1e6)


def test_openai_chat_refusal() -> None:
    out = OpenAIChatModel(FakeClient(load("openai_chat_refusal", ChatCompletion)),
                          "gpt-4o").complete(request())
    assert (out.text, out.finish_reason, stop_kind(out)) == (
        "I can't help with that.", "refusal", "pause")


REASONING_ITEMS = [
    {"id": "rs_68a1aaa", "type": "reasoning", "encrypted_content": "gAAAAABoENCRYPTEDreasoning==",
     "summary": [{"type": "summary_text", "text": "Need both files."}]},
    {"id": "fc_68a1bbb", "type": "function_call", "status": "completed", "call_id": "call_r1",
     "name": "read_file", "arguments": '{"path": "a.txt"}'},
    {"id": "fc_68a1ccc", "type": "function_call", "status": "completed", "call_id": "call_r2",
     "name": "read_file", "arguments": '{"path": "b.txt"}'},
]


def test_openai_responses_reasoning_and_function_calls() -> None:
    client = FakeClient(load("openai_responses_reasoning", Response, "req_resp1"))
    out = OpenAIResponsesModel(client, "o4-mini", reasoning={"effort": "medium"}).complete(
        request(instructions="You are careful.", tools=[READ]))
    assert client.options == [{"max_retries": 0}]
    sent = client.sent
    assert (sent["instructions"], sent["store"], sent["include"], sent["reasoning"]) == (
        "You are careful.", False, ["reasoning.encrypted_content"], {"effort": "medium"})
    assert sent["tools"] == [{"type": "function", **READ, "strict": False}]
    assert "background" not in sent
    assert out.items == REASONING_ITEMS
    assert out.tool_calls == [ToolCall(id="call_r1", name="read_file", args={"path": "a.txt"}),
                              ToolCall(id="call_r2", name="read_file", args={"path": "b.txt"})]
    assert (out.text, out.finish_reason, out.provider, out.model) == (
        "", "tool_calls", "openai.responses", "o4-mini-2025-04-16")
    assert (out.response_id, out.request_id) == ("resp_68a1reasoning", "req_resp1")
    assert out.usage == Usage(input_tokens=2000, output_tokens=400, cached_input_tokens=1536,
                              cache_write_tokens=128, reasoning_tokens=320,
                              cost_usd=(336 * 1.10 + 1536 * 0.275 + 128 * 1.10
                                        + 400 * 4.40) / 1e6)


def test_openai_responses_incomplete_max_output_tokens() -> None:
    client = FakeClient(load("openai_responses_incomplete", Response))
    out = OpenAIResponsesModel(client, "gpt-5", store=True).complete(request())
    assert "include" not in client.sent and client.sent["store"] is True
    assert (out.text, out.finish_reason, stop_kind(out)) == (
        "The answer is", "max_output_tokens", "pause")
    assert [i["type"] for i in out.items] == ["reasoning", "message"]
    assert out.usage.reasoning_tokens == 60
    assert out.usage.cost_usd == pytest.approx((100 * 1.25 + 64 * 10.00) / 1e6)


@pytest.mark.parametrize(("status", "extra", "finish"), [
    ("completed", [{"id": "msg_1", "type": "message", "status": "completed",
                    "role": "assistant", "content": [{"type": "refusal",
                                                      "refusal": "No."}]}], "refusal"),
    ("completed", [{"id": "msg_1", "type": "message", "status": "completed",
                    "role": "assistant", "content": [{"type": "output_text", "text": "Hi",
                                                      "annotations": []}]}], "stop"),
    ("failed", [], "failed"),
    ("cancelled", [], "cancelled"),
], ids=["openai-responses-refusal", "openai-responses-stop", "openai-responses-failed",
        "openai-responses-cancelled"])
def test_openai_responses_finish_reasons(status: str, extra: list[Any], finish: str) -> None:
    raw = responses_raw(status, extra)
    out = OpenAIResponsesModel(FakeClient(raw), "gpt-5").complete(request())
    assert out.finish_reason == finish


def responses_raw(status: str, output: list[Any] | None = None,
                  rid: str = "resp_bg1") -> Response:
    data = json.loads((FIXTURES / "openai_responses_incomplete.json").read_text())
    data.update(id=rid, status=status, incomplete_details=None, output=output or [])
    if status == "failed":
        data["error"] = {"code": "server_error", "message": "The model failed."}
    return Response.model_validate(data)


THINKING_ITEMS = [
    {"type": "thinking", "thinking": "I should read both files.",
     "signature": "EqQBCkYIBxgCKkBsignature=="},
    {"type": "redacted_thinking", "data": "EmwKAhgBEgy3redacted=="},
    {"type": "text", "text": "Reading both files."},
    {"type": "tool_use", "id": "toolu_01A", "name": "read_file", "input": {"path": "a.txt"}},
    {"type": "tool_use", "id": "toolu_01B", "name": "read_file", "input": {"path": "b.txt"}},
]


def test_anthropic_thinking_tool_use_and_cache_usage() -> None:
    client = FakeClient(load("anthropic_thinking_tools", AnthropicMessage, "req_ant1"))
    model = AnthropicModel(client, "claude-sonnet-4-5", thinking={"type": "enabled",
                                                                   "budget_tokens": 1024})
    out = model.complete(request(instructions="Be brief.", tools=[READ]))
    assert client.options == [{"max_retries": 0}]
    sent = client.sent
    assert (sent["system"], sent["max_tokens"], sent["thinking"]["type"]) == (
        "Be brief.", 4096, "enabled")
    assert sent["tools"] == [{"name": "read_file", "description": "Read a file",
                              "input_schema": READ["parameters"]}]
    assert out.items == THINKING_ITEMS
    assert out.tool_calls == [ToolCall(id="toolu_01A", name="read_file", args={"path": "a.txt"}),
                              ToolCall(id="toolu_01B", name="read_file", args={"path": "b.txt"})]
    assert (out.text, out.finish_reason, out.provider, out.model) == (
        "Reading both files.", "tool_use", "anthropic", "claude-sonnet-4-5-20250929")
    assert (out.response_id, out.request_id) == ("msg_01ThinkTools", "req_ant1")
    # Anthropic's input_tokens (50) excludes the cache; ours includes reads and writes.
    assert out.usage == Usage(input_tokens=4050, output_tokens=200, cached_input_tokens=3000,
                              cache_write_tokens=1000,
                              cost_usd=(50 * 3.00 + 3000 * 0.30 + 1000 * 3.75
                                        + 200 * 15.00) / 1e6)
    assert out.usage.cost_usd == pytest.approx(cost_of(out.usage, "claude-sonnet-4-5"))


def test_anthropic_max_tokens_pauses_and_price_override() -> None:
    client = FakeClient(load("anthropic_max_tokens", AnthropicMessage))
    out = AnthropicModel(client, "claude-haiku-4-5", max_tokens=32,
                         prices={"claude-haiku-4-5": Price(2.0, 4.0)}).complete(request())
    assert client.sent["max_tokens"] == 32 and "system" not in client.sent
    assert "tools" not in client.sent
    assert (out.text, out.finish_reason, stop_kind(out)) == (
        "The first part of the", "max_tokens", "pause")
    assert out.usage.cost_usd == pytest.approx((120 * 2.0 + 32 * 4.0) / 1e6)


# --- history -> request ----------------------------------------------------------------


def history(provider: str, items: list[dict[str, Any]]) -> list[Message]:
    """user -> assistant with 2 calls (one with broken arguments) and opaque items ->
    2 results -> assistant text -> user."""
    calls = [ToolCall(id="call_1", name="read_file", args={"path": "a.txt"}),
             ToolCall(id="call_2", name="read_file", args={}, raw_arguments='{"path": "b'),]
    return [
        user("Compare a and b", 1),
        Message(role="assistant", content="", trust="assistant", seq=2, tool_calls=calls,
                provider=provider, items=items),
        result("call_1", "A", 3),
        result("call_2", "denied: invalid arguments", 4, is_error=True),
        Message(role="assistant", content="They differ.", trust="assistant", seq=5,
                provider=provider),
        user("Why?", 6),
    ]


def test_openai_chat_history_to_messages() -> None:
    client = FakeClient(load("openai_chat_length", ChatCompletion))
    OpenAIChatModel(client, "gpt-4.1", instructions_role="developer").complete(
        request(history("openai.chat", []), instructions="Be brief.", tools=[READ]))
    assert client.sent["messages"] == [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": "Compare a and b"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "read_file", "arguments": '{"path":"a.txt"}'}},
            {"id": "call_2", "type": "function",
             "function": {"name": "read_file", "arguments": '{"path": "b'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "A"},
        {"role": "tool", "tool_call_id": "call_2", "content": "denied: invalid arguments"},
        {"role": "assistant", "content": "They differ."},
        {"role": "user", "content": "Why?"},
    ]
    assert client.sent["tools"] == [{"type": "function", "function": READ}]


def test_openai_chat_instructions_default_to_system_role() -> None:
    client = FakeClient(load("openai_chat_length", ChatCompletion))
    OpenAIChatModel(client, "gpt-4.1").complete(request(instructions="Be brief."))
    assert client.sent["messages"][0] == {"role": "system", "content": "Be brief."}
    assert "tools" not in client.sent


def test_openai_responses_history_echoes_own_items() -> None:
    client = FakeClient(load("openai_responses_incomplete", Response))
    OpenAIResponsesModel(client, "gpt-5").complete(
        request(history("openai.responses", REASONING_ITEMS)))
    assert client.sent["input"] == [
        {"role": "user", "content": "Compare a and b"},
        # Verbatim, but for the call ids: those the loop recorded, which the results carry.
        REASONING_ITEMS[0], {**REASONING_ITEMS[1], "call_id": "call_1"},
        {**REASONING_ITEMS[2], "call_id": "call_2"},
        {"type": "function_call_output", "call_id": "call_1", "output": "A"},
        {"type": "function_call_output", "call_id": "call_2",
         "output": "denied: invalid arguments"},
        {"role": "assistant", "content": "They differ."},
        {"role": "user", "content": "Why?"},
    ]
    assert "instructions" not in client.sent


def test_openai_responses_history_rebuilds_other_providers_turns() -> None:
    client = FakeClient(load("openai_responses_incomplete", Response))
    OpenAIResponsesModel(client, "gpt-5").complete(
        request(history("anthropic", THINKING_ITEMS)))
    assert client.sent["input"][1:3] == [
        {"type": "function_call", "call_id": "call_1", "name": "read_file",
         "arguments": '{"path":"a.txt"}'},
        {"type": "function_call", "call_id": "call_2", "name": "read_file",
         "arguments": '{"path": "b'},
    ]


def test_anthropic_history_echoes_own_blocks() -> None:
    client = FakeClient(load("anthropic_max_tokens", AnthropicMessage))
    AnthropicModel(client, "claude-haiku-4-5").complete(
        request(history("anthropic", THINKING_ITEMS)))
    assert client.sent["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Compare a and b"}]},
        {"role": "assistant", "content": [  # verbatim, but for the ids the loop recorded
            *THINKING_ITEMS[:3], {**THINKING_ITEMS[3], "id": "call_1"},
            {**THINKING_ITEMS[4], "id": "call_2"}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "call_1", "content": "A", "is_error": False},
            {"type": "tool_result", "tool_use_id": "call_2",
             "content": "denied: invalid arguments", "is_error": True}]},
        {"role": "assistant", "content": [{"type": "text", "text": "They differ."}]},
        {"role": "user", "content": [{"type": "text", "text": "Why?"}]},
    ]


def test_anthropic_history_rebuilds_other_providers_turns() -> None:
    client = FakeClient(load("anthropic_max_tokens", AnthropicMessage))
    AnthropicModel(client, "claude-haiku-4-5").complete(
        request(history("openai.responses", REASONING_ITEMS)))
    assert client.sent["messages"][1] == {"role": "assistant", "content": [
        {"type": "tool_use", "id": "call_1", "name": "read_file", "input": {"path": "a.txt"}},
        {"type": "tool_use", "id": "call_2", "name": "read_file", "input": {}}]}


def test_anthropic_sends_ids_it_would_refuse_as_ids_it_takes() -> None:
    # A run recorded on an OpenAI-compatible server whose ids Anthropic's pattern refuses.
    calls = [ToolCall(id="functions.read_file:0", name="read_file", args={"path": "a"})]
    turn = Message(role="assistant", content="", trust="assistant", seq=2, tool_calls=calls,
                   provider="openai.chat")
    client = FakeClient(load("anthropic_max_tokens", AnthropicMessage))
    AnthropicModel(client, "claude-haiku-4-5").complete(
        request([user("task", 1), turn, result("functions.read_file:0", "A", 3)]))
    (use,) = client.sent["messages"][1]["content"]
    (answer,) = client.sent["messages"][2]["content"]
    assert re.fullmatch(r"[a-zA-Z0-9_-]+", use["id"]) and answer["tool_use_id"] == use["id"]


def orphans() -> list[Message]:
    """After a compaction: a result whose call was compacted away; a call never
    answered; a user message between a call and its result."""
    calls = [ToolCall(id="call_1", name="read_file", args={"path": "a"}),
             ToolCall(id="call_2", name="read_file", args={"path": "b"})]
    return [
        user("task", 1),
        Message(role="user", content="summary", trust="untrusted", seq=9),
        result("call_0", "old", 10),
        Message(role="assistant", content="", trust="assistant", seq=11, tool_calls=calls),
        user("hurry", 12),
        result("call_2", "B", 13),
    ]


def test_openai_chat_closes_orphans() -> None:
    client = FakeClient(load("openai_chat_length", ChatCompletion))
    OpenAIChatModel(client, "gpt-4.1").complete(request(orphans()))
    assert client.sent["messages"][2:] == [
        {"role": "user", "content": "[result of read_file call call_0]: old"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "read_file", "arguments": '{"path":"a"}'}},
            {"id": "call_2", "type": "function",
             "function": {"name": "read_file", "arguments": '{"path":"b"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": NO_RESULT},
        {"role": "tool", "tool_call_id": "call_2", "content": "B"},
        {"role": "user", "content": "hurry"},
    ]


def test_openai_responses_closes_orphans() -> None:
    client = FakeClient(load("openai_responses_incomplete", Response))
    OpenAIResponsesModel(client, "gpt-5").complete(request(orphans()))
    assert client.sent["input"][2:] == [
        {"role": "user", "content": "[result of read_file call call_0]: old"},
        {"type": "function_call", "call_id": "call_1", "name": "read_file",
         "arguments": '{"path":"a"}'},
        {"type": "function_call", "call_id": "call_2", "name": "read_file",
         "arguments": '{"path":"b"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": NO_RESULT},
        {"type": "function_call_output", "call_id": "call_2", "output": "B"},
        {"role": "user", "content": "hurry"},
    ]


def test_anthropic_closes_orphans_and_merges_roles() -> None:
    client = FakeClient(load("anthropic_max_tokens", AnthropicMessage))
    AnthropicModel(client, "claude-haiku-4-5").complete(request(orphans()))
    assert client.sent["messages"] == [
        {"role": "user", "content": [
            {"type": "text", "text": "task"}, {"type": "text", "text": "summary"},
            {"type": "text", "text": "[result of read_file call call_0]: old"}]},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "call_1", "name": "read_file", "input": {"path": "a"}},
            {"type": "tool_use", "id": "call_2", "name": "read_file", "input": {"path": "b"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "call_1", "content": NO_RESULT,
             "is_error": True},
            {"type": "tool_result", "tool_use_id": "call_2", "content": "B", "is_error": False},
            {"type": "text", "text": "hurry"}]},
    ]


def test_anthropic_context_opens_with_a_user_turn() -> None:
    client = FakeClient(load("anthropic_max_tokens", AnthropicMessage))
    first = Message(role="assistant", content="Earlier answer.", trust="assistant", seq=1)
    AnthropicModel(client, "claude-haiku-4-5").complete(request([first, user("go on", 2)]))
    assert [m["role"] for m in client.sent["messages"]] == ["user", "assistant", "user"]


# --- errors -------------------------------------------------------------------------

OPENAI_URL = "https://api.openai.com/v1/chat/completions"
ANTHROPIC_URL = "https://api.anthropic.com/v1/messages"


def http_response(url: str, status: int, body: dict[str, Any],
                  headers: dict[str, str]) -> httpx2.Response:
    return httpx2.Response(status, headers=headers, json=body,
                           request=httpx2.Request("POST", url))


def openai_error(cls: type[openai.APIStatusError], status: int, *, kind: str, message: str,
                 **headers: str) -> openai.APIStatusError:
    body = {"message": message, "type": kind, "param": None, "code": None}
    response = http_response(OPENAI_URL, status, {"error": body},
                             {"x-request-id": "req_123", **headers})
    return cls(f"Error code: {status} - {message}", response=response, body=body)


def anthropic_error(cls: type[anthropic.APIStatusError], status: int, *, kind: str,
                    message: str, **headers: str) -> anthropic.APIStatusError:
    body = {"type": "error", "error": {"type": kind, "message": message}}
    response = http_response(ANTHROPIC_URL, status, body, {"request-id": "req_ant", **headers})
    return cls(f"Error code: {status} - {message}", response=response, body=body)


def raise_through(model_cls: Any, exc: BaseException, model: str = "m") -> ModelError:
    with pytest.raises(ModelError) as info:
        model_cls(FakeClient(exc), model).complete(request())
    assert info.value.__cause__ is exc
    return info.value


def test_openai_401_is_final_and_says_why() -> None:
    exc = openai_error(openai.AuthenticationError, 401, kind="invalid_request_error",
                       message="Incorrect API key provided")
    err = raise_through(OpenAIChatModel, exc)
    assert str(err) == ("openai 401 invalid_request_error: Incorrect API key provided "
                        "(request req_123)")
    assert (err.retryable, err.status, err.request_id, err.retry_after, err.lost) == (
        False, 401, "req_123", None, False)


def test_openai_429_retry_after_ms() -> None:
    exc = openai_error(openai.RateLimitError, 429, kind="rate_limit_exceeded",
                       message="Slow down", **{"retry-after-ms": "1500", "retry-after": "9"})
    err = raise_through(OpenAIResponsesModel, exc)
    assert (err.retryable, err.status, err.retry_after) == (True, 429, 1.5)


@pytest.mark.parametrize(("cls", "status", "headers", "retryable"), [
    (openai.BadRequestError, 400, {}, False),
    (openai.PermissionDeniedError, 403, {}, False),
    (openai.NotFoundError, 404, {}, False),
    (openai.UnprocessableEntityError, 422, {}, False),
    (openai.APIStatusError, 408, {}, True),
    (openai.ConflictError, 409, {}, True),
    (openai.InternalServerError, 503, {}, True),
    (openai.InternalServerError, 500, {"x-should-retry": "false"}, False),
    (openai.BadRequestError, 400, {"x-should-retry": "true"}, True),
], ids=lambda v: str(v) if not isinstance(v, type) else "openai-" + v.__name__)
def test_openai_status_retryable(cls: Any, status: int, headers: dict[str, str],
                                 retryable: bool) -> None:
    err = raise_through(OpenAIChatModel, openai_error(cls, status, kind="x", message="m",
                                                      **headers))
    assert (err.retryable, err.status) == (retryable, status)


def test_openai_connection_errors_are_retryable() -> None:
    req = httpx2.Request("POST", OPENAI_URL)
    for exc in (openai.APIConnectionError(request=req), openai.APITimeoutError(req)):
        err = raise_through(OpenAIChatModel, exc)
        assert (err.retryable, err.status) == (True, None)
        assert str(err).startswith("openai connection error")


def test_anthropic_529_overloaded_retry_after_seconds() -> None:
    exc = anthropic_error(anthropic.OverloadedError, 529, kind="overloaded_error",
                          message="Overloaded", **{"retry-after": "7"})
    err = raise_through(AnthropicModel, exc)
    assert str(err) == "anthropic 529 overloaded_error: Overloaded (request req_ant)"
    assert (err.retryable, err.status, err.retry_after, err.request_id) == (
        True, 529, 7.0, "req_ant")


def test_anthropic_400_is_final() -> None:
    exc = anthropic_error(anthropic.BadRequestError, 400, kind="invalid_request_error",
                          message="messages: roles must alternate")
    err = raise_through(AnthropicModel, exc)
    assert (err.retryable, err.status) == (False, 400)
    assert "roles must alternate" in str(err)


def test_anthropic_connection_error_is_retryable() -> None:
    exc = anthropic.APITimeoutError(httpx2.Request("POST", ANTHROPIC_URL))
    assert raise_through(AnthropicModel, exc).retryable


def test_openai_retry_after_http_date_and_garbage() -> None:
    later = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert retry_after({"retry-after": later}) == pytest.approx(30, abs=2)
    assert retry_after({"retry-after": "soon"}) is None
    assert retry_after({"retry-after-ms": "x", "retry-after": "2"}) == 2.0
    assert retry_after({}) is None


# --- sync and async clients -----------------------------------------------------------


def test_openai_chat_async_client_needs_arun() -> None:
    model = OpenAIChatModel(FakeAsyncClient(), "gpt-4o")
    with pytest.raises(TypeError, match="arun"):
        model.complete(request())


def test_openai_chat_acomplete_with_async_client() -> None:
    client = FakeAsyncClient(load("openai_chat_tool_calls", ChatCompletion))
    out = asyncio.run(OpenAIChatModel(client, "gpt-4o").acomplete(request()))
    assert len(out.tool_calls) == 2 and client.options == [{"max_retries": 0}]


def test_anthropic_acomplete_with_sync_client_runs_in_a_thread() -> None:
    client = FakeClient(load("anthropic_max_tokens", AnthropicMessage))
    out = asyncio.run(AnthropicModel(client, "claude-haiku-4-5").acomplete(request()))
    assert out.finish_reason == "max_tokens"


def test_anthropic_async_error_mapping() -> None:
    exc = anthropic_error(anthropic.RateLimitError, 429, kind="rate_limit_error", message="m",
                          **{"retry-after-ms": "250"})
    model = AnthropicModel(FakeAsyncClient(exc), "claude-haiku-4-5")
    with pytest.raises(ModelError) as info:
        asyncio.run(model.acomplete(request()))
    assert (info.value.retryable, info.value.retry_after) == (True, 0.25)


def test_openai_sdk_clients_are_told_apart() -> None:
    assert not OpenAIChatModel(openai.OpenAI(api_key="k"), "gpt-4o").is_async
    assert OpenAIChatModel(openai.AsyncOpenAI(api_key="k"), "gpt-4o").is_async
    assert AnthropicModel(anthropic.AsyncAnthropic(api_key="k"), "claude-haiku-4-5").is_async


# --- background mode --------------------------------------------------------------------


def test_openai_background_begin_then_collect() -> None:
    done = load("openai_responses_reasoning", Response)
    client = FakeClient(responses_raw("queued"), responses_raw("queued"),
                        responses_raw("in_progress"), done)
    model = OpenAIResponsesModel(client, "o4-mini", background=True, poll_interval=0)
    handle = model.begin(request(instructions="You are careful."))
    assert handle == "resp_bg1"
    sent = client.calls[0][2]
    assert (sent["background"], sent["store"], "include" in sent) == (True, True, False)
    out = model.collect(handle, request())
    assert [c[0] for c in client.calls[1:]] == ["responses.retrieve"] * 3
    assert all(c[1] == ("resp_bg1",) for c in client.calls[1:])
    assert out.items == REASONING_ITEMS and out.finish_reason == "tool_calls"


def test_openai_background_complete_is_begin_and_collect() -> None:
    client = FakeClient(responses_raw("queued"), load("openai_responses_incomplete", Response))
    out = OpenAIResponsesModel(client, "gpt-5", background=True,
                               poll_interval=0).complete(request())
    assert [c[0] for c in client.calls] == ["responses.create", "responses.retrieve"]
    assert out.finish_reason == "max_output_tokens"


@pytest.mark.parametrize("status", ["failed", "cancelled", "expired"],
                         ids=lambda s: f"openai-{s}")
def test_openai_background_lost_status(status: str) -> None:
    raw = responses_raw("failed")
    raw.status = status  # type: ignore[assignment]  # "expired" is newer than the SDK's enum
    model = OpenAIResponsesModel(FakeClient(raw), "gpt-5", background=True)
    with pytest.raises(ModelError) as info:
        model.collect("resp_bg1", request())
    assert info.value.lost and status in str(info.value)


def test_openai_background_404_is_lost() -> None:
    exc = openai_error(openai.NotFoundError, 404, kind="invalid_request_error",
                       message="Response not found")
    model = OpenAIResponsesModel(FakeClient(exc), "gpt-5", background=True)
    with pytest.raises(ModelError) as info:
        model.collect("resp_gone", request())
    assert (info.value.lost, info.value.status) == (True, 404)


def test_openai_background_other_errors_are_not_lost() -> None:
    exc = openai_error(openai.InternalServerError, 500, kind="server_error", message="oops")
    model = OpenAIResponsesModel(FakeClient(exc), "gpt-5", background=True)
    with pytest.raises(ModelError) as info:
        model.collect("resp_bg1", request())
    assert (info.value.lost, info.value.retryable) == (False, True)


def test_openai_background_off_refuses_begin_and_collect() -> None:
    model = OpenAIResponsesModel(FakeClient(), "gpt-5")
    with pytest.raises(TypeError):
        model.begin(request())
    with pytest.raises(TypeError):
        model.collect("resp_1", request())


def test_openai_background_async() -> None:
    client = FakeAsyncClient(responses_raw("queued"), responses_raw("in_progress"),
                             load("openai_responses_incomplete", Response))
    model = OpenAIResponsesModel(client, "gpt-5", background=True, poll_interval=0)

    async def go() -> Any:
        handle = await model.abegin(request())
        return await model.acollect(handle, request())

    assert asyncio.run(go()).finish_reason == "max_output_tokens"
    client.script = [responses_raw("queued"), load("openai_responses_incomplete", Response)]
    assert asyncio.run(model.acomplete(request())).finish_reason == "max_output_tokens"
    assert [c[0] for c in client.calls[-2:]] == ["responses.create", "responses.retrieve"]


def test_openai_background_async_with_sync_client() -> None:
    client = FakeClient(responses_raw("queued"), load("openai_responses_incomplete", Response))
    model = OpenAIResponsesModel(client, "gpt-5", background=True, poll_interval=0)
    assert asyncio.run(model.acomplete(request())).finish_reason == "max_output_tokens"


# --- missing extras -------------------------------------------------------------------


@pytest.mark.parametrize(("sdk", "name"), [("openai", "OpenAIChatModel"),
                                           ("openai", "OpenAIResponsesModel"),
                                           ("anthropic", "AnthropicModel")],
                         ids=["openai-chat", "openai-responses", "anthropic"])
def test_missing_sdk_raises_missing_extra(monkeypatch: pytest.MonkeyPatch, sdk: str,
                                          name: str) -> None:
    monkeypatch.setitem(sys.modules, sdk, None)  # import openai -> ImportError
    monkeypatch.setattr(agentjournal, "providers", agentjournal.providers)  # restored after
    monkeypatch.delitem(sys.modules, f"agentjournal.providers.{sdk}")
    monkeypatch.delitem(sys.modules, "agentjournal.providers")
    providers = importlib.import_module("agentjournal.providers")  # imports without it
    with pytest.raises(MissingExtraError) as info:
        getattr(providers, name)
    assert (info.value.extra, info.value.args[0].count(f"agentjournal[{sdk}]")) == (sdk, 1)


def test_openai_and_anthropic_unknown_attribute() -> None:
    providers = importlib.import_module("agentjournal.providers")
    with pytest.raises(AttributeError):
        _ = providers.LiteLLMModel
