"""Request checks the real APIs make; each returns the rejection reason, or None if accepted.

Messages follow the real APIs' wording where known, so tests can match on them.
"""

from __future__ import annotations

import re
from typing import Any

from .wire import Json, Memory


def check_chat(body: Json) -> str | None:
    if not body.get("model"):
        return "you must provide a model parameter"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "Invalid 'messages': empty array. Expected an array with minimum length 1."
    pending: list[str] = []  # tool_call ids of the last assistant message, still unanswered
    answered: dict[str, int] = {}  # tool_call id -> the tool message that answered it
    for i, msg in enumerate(messages):
        role = msg.get("role") if isinstance(msg, dict) else None
        if role not in ("system", "developer", "user", "assistant", "tool"):
            return f"Invalid value for 'messages[{i}].role': {role!r}."
        if role == "tool":
            call_id = msg.get("tool_call_id")
            if call_id in answered:
                return (
                    f"Invalid parameter: Duplicate value for 'tool_call_id' of '{call_id}' in "
                    f"messages[{answered[call_id]}] and messages[{i}]."
                )
            answered[str(call_id)] = i
            if call_id not in pending:
                return (
                    f"Invalid parameter: messages[{i}] with role 'tool' must be a response to a "
                    f"preceding message with 'tool_calls' (orphan tool_call_id {call_id!r})."
                )
            pending.remove(call_id)
            continue
        if pending:
            return _unanswered_chat(pending)
        if role == "assistant":
            pending = [c.get("id") for c in msg.get("tool_calls") or []]
            answered = {}
    return _unanswered_chat(pending) if pending else None


def _unanswered_chat(pending: list[str]) -> str:
    return (
        "An assistant message with 'tool_calls' must be followed by tool messages responding "
        f"to each 'tool_call_id'. The following tool_call_ids did not have response messages: "
        f"{', '.join(pending)}"
    )


def check_responses(body: Json, mem: Memory) -> str | None:
    if not body.get("model"):
        return "Missing required parameter: 'model'."
    if body.get("background") and body.get("store") is False:
        return "Background mode requires store=true."
    prev_id = body.get("previous_response_id")
    chain = mem.chains.get(prev_id) if prev_id else None
    if prev_id and chain is None:
        return f"Previous response with id '{prev_id}' not found."
    items = body.get("input", [])
    if isinstance(items, str):
        items = []
    if not isinstance(items, list):
        return "Invalid type for 'input': expected a string or an array of input items."
    open_calls = dict.fromkeys(chain.open) if chain else {}
    # Without a stored chain, reasoning that preceded an echoed call must travel with it.
    need_reasoning = body.get("store") is False or not prev_id
    seen_reasoning: set[str] = set()
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            return f"Invalid type for 'input[{i}]': expected an object."
        kind = item.get("type")
        if kind == "reasoning":
            err = _check_reasoning_item(item, body, mem)
            seen_reasoning.add(item.get("id", ""))
        elif kind == "function_call":
            err = _check_call_item(item, mem, need_reasoning, seen_reasoning)
            open_calls[str(item.get("call_id"))] = None
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if call_id not in open_calls:
                return f"No tool call found for function call output with call_id {call_id}."
            del open_calls[call_id]
            err = None
        else:
            err = None
        if err:
            return err
    if open_calls:
        return f"No tool output found for function call {next(iter(open_calls))}."
    return None


def _check_reasoning_item(item: Json, body: Json, mem: Memory) -> str | None:
    rs_id, encrypted = item.get("id"), item.get("encrypted_content")
    if rs_id not in mem.reasoning:
        return f"Item with id '{rs_id}' not found."
    if encrypted is None and body.get("store") is False:
        return f"Reasoning item '{rs_id}' needs its encrypted_content when store is false."
    if encrypted is not None and encrypted != mem.reasoning[rs_id]:
        return f"The encrypted content for item {rs_id} could not be verified."
    return None


def _check_call_item(item: Json, mem: Memory, need: bool, seen: set[str]) -> str | None:
    rs_id = mem.reasoning_for_call.get(item.get("call_id", ""))
    if need and rs_id and rs_id not in seen:
        return (
            f"Item '{item.get('id')}' of type 'function_call' was provided without its "
            f"required 'reasoning' item: '{rs_id}' (reasoning item missing)."
        )
    return None


def check_messages(body: Json, mem: Memory) -> str | None:
    if "max_tokens" not in body:
        return "max_tokens: Field required"
    if not body.get("model"):
        return "model: Field required"
    err = _check_system(body.get("system"))
    messages = body.get("messages")
    if err or not isinstance(messages, list) or not messages:
        return err or "messages: at least one message is required"
    uses: list[str] = []  # tool_use ids of the previous assistant message
    every_use: set[str] = set()  # tool_use ids of the whole request: each once
    for i, msg in enumerate(messages):
        role = msg.get("role") if isinstance(msg, dict) else None
        if role != ("user" if i % 2 == 0 else "assistant"):
            return (
                f'messages.{i}: roles must alternate between "user" and "assistant", '
                'starting with "user"'
            )
        blocks = _blocks(msg.get("content"))
        if role == "user":
            err = _check_results(i, blocks, uses)
            uses = []
        else:
            err = _check_assistant(i, blocks, mem) or _check_use_ids(i, blocks, every_use)
            uses = [str(b.get("id")) for b in blocks if b.get("type") == "tool_use"]
        if err:
            return err
    return _unanswered_uses(len(messages) - 1, uses) if uses else None


def _check_system(system: Any) -> str | None:
    if system is None or isinstance(system, str):
        return None
    if isinstance(system, list) and all(
        isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)
        for b in system
    ):
        return None
    return "system: Input should be a valid string or a list of text blocks"


def _blocks(content: Any) -> list[Json]:
    if isinstance(content, list):
        return [b for b in content if isinstance(b, dict)]
    return []


def _check_results(i: int, blocks: list[Json], uses: list[str]) -> str | None:
    answered = set()
    for j, block in enumerate(blocks):
        if block.get("type") != "tool_result":
            continue
        use_id = block.get("tool_use_id")
        if use_id not in uses:
            return (
                f"messages.{i}.content.{j}: unexpected `tool_use_id` found in `tool_result` "
                f"blocks: {use_id}. Each `tool_result` block must have a corresponding "
                "`tool_use` block in the previous message."
            )
        answered.add(use_id)
    missing = [u for u in uses if u not in answered]
    return _unanswered_uses(i - 1, missing) if missing else None


def _unanswered_uses(i: int, missing: list[str]) -> str:
    return (
        f"messages.{i}: `tool_use` ids were found without `tool_result` blocks immediately "
        f"after: {', '.join(missing)}. Each `tool_use` block must have a corresponding "
        "`tool_result` block in the next message."
    )


USE_ID = re.compile(r"[a-zA-Z0-9_-]+")


def _check_use_ids(i: int, blocks: list[Json], seen: set[str]) -> str | None:
    for j, block in enumerate(blocks):
        if block.get("type") != "tool_use":
            continue
        use_id = block.get("id")
        if not isinstance(use_id, str) or not USE_ID.fullmatch(use_id):
            return (
                f"messages.{i}.content.{j}.tool_use.id: String should match pattern "
                "'^[a-zA-Z0-9_-]+$'"
            )
        if use_id in seen:
            return f"messages.{i}.content.{j}: `tool_use` ids must be unique"
        seen.add(use_id)
    return None


def _check_assistant(i: int, blocks: list[Json], mem: Memory) -> str | None:
    for j, block in enumerate(blocks):
        kind = block.get("type")
        if kind == "thinking":
            text, signature = block.get("thinking", ""), block.get("signature")
            if signature != mem.sign(text):
                return f"messages.{i}.content.{j}: Invalid `signature` in `thinking` block"
        elif kind == "redacted_thinking" and block.get("data") not in mem.redacted:
            return f"messages.{i}.content.{j}: Invalid `data` in `redacted_thinking` block"
    return None
