"""Size limits on what a tool call carries (``Agent(max_args_bytes=, max_result_bytes=)``).

Unbounded, 10 MB of arguments was stored three times (the turn's calls, the provider's
items that repeat them, the call's start), more with each snapshot of the run's tail, and
sent back to the model at every later turn. Sizes are of the JSON the log would hold.

Arguments over the limit come from the model, before anything happened: the turn is
recorded with a stand-in (empty arguments and their size, ``too_large``), the call is
denied with the reason, and the model asks again; the run goes on. A result over the
limit comes after the effect: the call is completed with its key (never made again) and
the completion keeps the result's size and sha256 instead of the result, as a result with
no JSON form is kept (``CompletedCall.error``), and the model is told so. Why not keep it
once: the limit bounds what the log, each snapshot and every later request carry, and a
part of it would be another result; the receiver still has it, and the digest lets a
person match it. Nothing is cut short: what is not kept is recorded as not kept, with
its size.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec

from .models import ModelResponse
from .state import ToolCall

MAX_ARGS_BYTES = 1024 * 1024  # about 250k tokens: more than any model writes in one turn
MAX_RESULT_BYTES = 4 * 1024 * 1024  # about 1M tokens: more than a model's context holds


def checked_limit(name: str, value: int | None) -> int | None:
    """``value`` as a limit in bytes (None: none), or ValueError naming ``name``."""
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                              or value < 1):
        raise ValueError(f"{name} must be a positive number of bytes or None, not {value!r}")
    return value


def json_size(value: Any) -> int:
    """Bytes of ``value`` as the log holds it (canonical JSON: compact, keys sorted)."""
    return len(msgspec.json.encode(value, order="sorted"))


def args_size(call: ToolCall) -> int:
    """Bytes of the arguments as the log would hold them (the raw text, if not JSON)."""
    if call.raw_arguments is not None:
        return len(call.raw_arguments.encode())
    try:
        return json_size(call.args)
    except (TypeError, msgspec.EncodeError):
        return 0  # no JSON form: refused where the turn is encoded, as it always was


def within_args_limit(response: ModelResponse, limit: int | None) -> ModelResponse:
    """``response`` with each call whose arguments are over ``limit`` bytes replaced by a
    stand-in (no arguments, ``too_large`` their size), and the provider items that repeat
    them (Anthropic's ``input``, OpenAI Responses' ``arguments``) emptied the same way, so
    they are neither stored nor sent back. The rest of the items are left as they are."""
    if limit is None:
        return response
    sizes = [args_size(c) for c in response.tool_calls]
    if all(size <= limit for size in sizes):
        return response
    tool_calls = [c if size <= limit else msgspec.structs.replace(
                      c, args={}, raw_arguments=None, too_large=size)
                  for c, size in zip(response.tool_calls, sizes, strict=True)]
    items = [_without_large_arguments(item, limit) for item in response.items]
    return msgspec.structs.replace(response, tool_calls=tool_calls, items=items)


def _without_large_arguments(item: dict[str, Any], limit: int) -> dict[str, Any]:
    out = dict(item)
    for field in ("input", "arguments"):
        value = item.get(field)
        if isinstance(value, dict) and json_size(value) > limit:
            out[field] = {}
        elif isinstance(value, str) and len(value.encode()) > limit:
            out[field] = "{}"
    return out


def args_refused(size: int, limit: int | None) -> str:
    """Why a call whose arguments were not kept is denied, in words the model can act on."""
    over = f", over the limit of {limit:,} bytes (max_args_bytes)" if limit is not None else ""
    return (f"its arguments were {size:,} bytes{over}: the call was not made and they were "
            "not kept; ask again with smaller arguments: split the work into several calls, "
            "or pass a reference (a path, a URL, an id) instead of the content")


def result_over(result: Any, limit: int | None) -> tuple[str, dict[str, Any]] | None:
    """For a result (plain JSON data) over ``limit`` bytes: why it is not kept, and what is
    kept instead (its size and sha256, so a person can match it with the receiver's
    record). None when it may be kept."""
    if limit is None:
        return None
    body = msgspec.json.encode(result, order="sorted")  # canonical: it is plain JSON data
    if len(body) <= limit:
        return None
    why = (f"it was {len(body):,} bytes, over the limit of {limit:,} bytes "
           "(max_result_bytes); make the tool return less (a page, a summary, a reference "
           "to where the rest is)")
    return why, {"result_bytes": len(body), "result_sha256": hashlib.sha256(body).hexdigest()}
