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

Depth is a limit too (``results.MAX_DEPTH``, measured without recursion): arguments
nested deeper are stood in for and denied as above, before anything is recorded; a
result nested deeper completes its call as not kept, with its size and sha256, taken
from its canonical JSON written without recursion (``deep_json``).
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import msgspec

from .errors import EncodingError
from .models import ModelResponse
from .results import MAX_DEPTH, nested_deeper, to_json
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


class _Text(bytes):
    """JSON text already written (deep_json's work list holds values and these)."""


def deep_json(value: Any) -> bytes:
    """``value`` as canonical JSON (json_size's bytes), written with a work list instead
    of recursion: for a value nested too deep for an encoder. EncodingError when some
    part has no JSON form (a key or a leaf the result rule refuses, a NaN)."""
    out: list[bytes] = []
    todo: list[Any] = [value]
    while todo:
        item = todo.pop()
        if type(item) is _Text:
            out.append(item)
        elif isinstance(item, dict):
            if not all(isinstance(k, str) for k in item):
                raise EncodingError("an object of the value has a key that is not a string")
            keys = sorted(item)
            parts: list[Any] = [_Text(b"{")]
            for i, k in enumerate(keys):
                parts += [_Text((b"," if i else b"") + msgspec.json.encode(k) + b":"), item[k]]
            todo += reversed([*parts, _Text(b"}")])
        elif isinstance(item, list | tuple):
            parts = [_Text(b"[")]
            for i, v in enumerate(item):
                parts += [_Text(b",")] if i else []
                parts.append(v)
            todo += reversed([*parts, _Text(b"]")])
        elif isinstance(item, float) and not math.isfinite(item):
            raise EncodingError("the value holds a NaN or an infinity")
        elif isinstance(item, str | int | float | bool | None):
            out.append(msgspec.json.encode(item))
        else:  # a leaf by the result rule (a date, a Decimal, ...), or refused by it
            out.append(msgspec.json.encode(to_json(item), order="sorted"))
    return b"".join(out)


def args_size(call: ToolCall, deep: bool) -> int:
    """Bytes of the arguments as the log would hold them (the raw text, if not JSON);
    ``deep``: they nest past MAX_DEPTH (the caller measured it: not walked again)."""
    if call.raw_arguments is not None:
        return len(call.raw_arguments.encode())
    try:
        return len(deep_json(call.args)) if deep else json_size(call.args)
    except (TypeError, msgspec.EncodeError, EncodingError):
        return 0  # no JSON form: refused where the turn is encoded, as it always was


def within_args_limit(response: ModelResponse, limit: int | None) -> ModelResponse:
    """``response`` with each call whose arguments are over ``limit`` bytes replaced by a
    stand-in (no arguments, ``too_large`` their size), and the provider items that repeat
    them (Anthropic's ``input``, OpenAI Responses' ``arguments``) emptied the same way, so
    they are neither stored nor sent back. The rest of the items are left as they are."""
    deep = [nested_deeper(c.args) for c in response.tool_calls]
    if limit is None and not any(deep):
        return response
    sizes = [args_size(c, d) for c, d in zip(response.tool_calls, deep, strict=True)]
    kept = [not too_deep and (limit is None or size <= limit)
            for too_deep, size in zip(deep, sizes, strict=True)]
    if all(kept):
        return response
    tool_calls = [c if keep else msgspec.structs.replace(
                      c, args={}, raw_arguments=None, too_large=size)
                  for c, size, keep in zip(response.tool_calls, sizes, kept, strict=True)]
    items = [_without_large_arguments(item, limit) for item in response.items]
    return msgspec.structs.replace(response, tool_calls=tool_calls, items=items)


def _without_large_arguments(item: dict[str, Any], limit: int | None) -> dict[str, Any]:
    out = dict(item)
    for field in ("input", "arguments"):
        value = item.get(field)
        if isinstance(value, dict) and (nested_deeper(value) or (
                limit is not None and json_size(value) > limit)):
            out[field] = {}
        elif isinstance(value, str) and limit is not None and len(value.encode()) > limit:
            out[field] = "{}"
    return out


def args_refused(size: int, limit: int | None) -> str:
    """Why a call whose arguments were not kept is denied, in words the model can act on.
    Arguments within ``limit`` bytes (or with no limit) were stood in for by their depth:
    the turn's stand-in and its denial are made by the same process, with one limit."""
    if limit is None or size <= limit:
        return (f"its arguments ({size:,} bytes) nest lists or objects more than "
                f"{MAX_DEPTH} levels deep: the call was not made and they were not kept; "
                "ask again with flatter arguments")
    return (f"its arguments were {size:,} bytes, over the limit of {limit:,} bytes "
            "(max_args_bytes): the call was not made and they were not kept; ask again "
            "with smaller arguments: split the work into several calls, or pass a reference "
            "(a path, a URL, an id) instead of the content")


def result_too_deep(result: Any) -> tuple[str, dict[str, Any]]:
    """For a result nested past results.MAX_DEPTH: why it is not kept, and its size and
    sha256 (of its canonical JSON, written without recursion) when it has a JSON form."""
    why = (f"it nests lists or objects more than {MAX_DEPTH} levels deep; make the tool "
           "return flatter data (a page, a summary, a reference to where the rest is)")
    try:
        body = deep_json(result)
    except EncodingError as exc:
        return f"{why}; and it has no JSON form: {exc.detail}", {}
    return why, {"result_bytes": len(body), "result_sha256": hashlib.sha256(body).hexdigest()}


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
