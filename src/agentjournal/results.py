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
and its type, never its ``repr`` (which may hold a secret). A tool result that is
refused makes its completion an encoding error (the effect happened; its result
was not kept); a memory value that is refused is refused to the tool.
"""

from __future__ import annotations

from typing import Any

import msgspec

from .errors import EncodingError
from .events import canonical_copy


def _hook(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)
    if callable(dump) and not isinstance(value, type):
        return dump(mode="json")
    raise TypeError(type(value).__name__)


def to_json(value: Any, where: str = "result") -> Any:
    """``value`` as plain JSON data by the rule above; EncodingError if it has none."""
    try:
        plain = msgspec.to_builtins(value, str_keys=True, enc_hook=_hook, order="deterministic")
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
