"""The one rule for what a tool returns, and what ``ctx.remember`` keeps.

A value is stored as JSON, faithfully or not at all:

- JSON types as they are (str, int, finite float, bool, None, lists, dicts);
- datetime / date / time as ISO 8601 strings; Decimal as its exact string
  ("1.10"); UUID as its string; bytes as base64;
- tuples as lists; sets and frozensets as sorted lists (the order of a set is
  not stable between processes);
- enums as their value; dataclasses, msgspec structs and attrs classes as
  objects of their fields; Pydantic models (anything with ``model_dump``,
  duck-typed: pydantic is not a dependency) as ``model_dump(mode="json")``;
- dict keys that are not strings (ints, enums, ...) as strings, as JSON does.

NaN and infinities are refused, and so is anything else (a generator, an open
file, an arbitrary object): :class:`EncodingError`, naming where in the value
and its type, never its ``repr`` (which may hold a secret). So is a value whose
lists and objects nest more than :data:`MAX_DEPTH` deep (:class:`TooDeep`),
measured level by level, never by recursion: a value 20,000 deep is measured
like any other, where encoding it would exhaust Python's stack. A tool result that
is refused makes its completion an encoding error (the effect happened; its result
was not kept); a memory value that is refused is refused to the tool.

Every shell follows this rule: a shell whose framework encodes a call's value itself
raises :class:`ResultNotEncodable` from the call's body when that fails, and the
call completes as "result not kept" (its effect happened), never uncertain.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import msgspec

from .errors import EncodingError
from .events import canonical_copy


def _hook(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)
    if callable(dump) and not isinstance(value, type):
        return dump(mode="json")
    raise TypeError(type(value).__name__)


#: How deep lists and objects may nest in a value: far more than data has (a config, a
#: tree of a few dozen levels), far less than what exhausts the recursion of an encoder,
#: the redaction walk or a display (Python's stack holds about 1,000 frames).
MAX_DEPTH = 100
_NESTS = (dict, list, tuple, set, frozenset)


class TooDeep(EncodingError):
    """A value whose lists and objects nest more than MAX_DEPTH deep."""


class ResultNotEncodable(EncodingError):
    """Raised by a shell from a call's body when the framework could not encode the value
    the call returned: the call was made; its result is not kept (see the module doc)."""


@dataclass(frozen=True)
class NotKept:
    """What a call's body returns for a value that has no JSON form: the call was made,
    ``why`` its result is not kept (the completion records it so)."""

    why: str


def nested_deeper(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether ``value`` holds lists or objects (dicts, tuples, sets) nested more than
    ``limit`` deep. Measured a level at a time, with no recursion, so it holds for any
    depth; it stops at the first level past ``limit``."""
    level = [value]
    for _ in range(limit + 1):
        nests = [v for v in level if isinstance(v, _NESTS)]
        if not nests:
            return False
        level = [x for v in nests for x in (v.values() if isinstance(v, dict) else v)]
    return True  # lists or objects at level ``limit``: ``limit + 1`` deep


def holds_non_finite(value: Any) -> bool:
    """Whether ``value`` (plain data: lists, dicts, tuples, sets) holds a NaN or an
    infinity anywhere; walked without recursion."""
    todo = [value]
    while todo:
        v = todo.pop()
        if isinstance(v, float) and not math.isfinite(v):
            return True
        if isinstance(v, dict):
            todo.extend(v.values())
        elif isinstance(v, _NESTS):
            todo.extend(v)
    return False


def too_deep(where: str) -> TooDeep:
    return TooDeep(f"{where} nests lists or objects more than {MAX_DEPTH} levels deep; "
                   "return flatter data (a page, a summary, a reference to the rest)")


def to_json(value: Any, where: str = "result") -> Any:
    """``value`` as plain JSON data by the rule above; EncodingError if it has none
    (TooDeep if it nests too deep)."""
    if nested_deeper(value):
        raise too_deep(where)
    try:
        plain = msgspec.to_builtins(value, str_keys=True, enc_hook=_hook, order="deterministic")
    except RecursionError:  # objects (not lists or dicts) nested past what Python recurses
        raise too_deep(where) from None
    except (TypeError, ValueError, msgspec.EncodeError):
        _refuse(value, where)
        raise EncodingError(f"{where} has no JSON form") from None  # not reached
    # Through the codec and back: exactly what a replay decodes (tuples as lists), and a
    # NaN, an infinity or a lone surrogate refused here, naming where, not later when the
    # completion that holds it is stored.
    return canonical_copy(plain, where)


_LEAF = (str, int, float, bool, type(None))


def _refuse(value: Any, where: str) -> None:
    """Raise EncodingError naming the first part of ``value`` with no JSON form."""
    if isinstance(value, dict):
        for k, v in value.items():
            _refuse(v, f"{where}.{k}")
    elif isinstance(value, list | tuple | set | frozenset):
        for i, v in enumerate(value):
            _refuse(v, f"{where}[{i}]")
    elif not isinstance(value, _LEAF):
        try:
            msgspec.to_builtins(value, str_keys=True, enc_hook=_hook, order="deterministic")
        except (TypeError, ValueError, msgspec.EncodeError):
            raise EncodingError(
                f"{where} is a {type(value).__qualname__!s}, which has no JSON form; return "
                "JSON data, or a type the result rule lists (see agentjournal.results)"
            ) from None
