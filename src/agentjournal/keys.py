"""Idempotency keys: a stable name for one logical action.

key = sha256(canonical JSON of [scope, tool name, identity]), where identity is
the call's arguments or, when the tool declares identity fields, only those.
The model's call id is never part of a key: it is fresh on every turn, and a
retry of the same action must compute the same key.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from .events import encode_value


def run_scope(run_id: str) -> str:
    """The default scope: one run (and every fork of it)."""
    return f"run:{run_id}"


def operation_scope(tenant: str, operation_id: str) -> str:
    """A scope that outlives runs: the same business operation in any run gets one key."""
    return f"op:{tenant}:{operation_id}"


def _canonical_numbers(value: Any) -> Any:
    # One number form: 10 and 10.0 name the same amount.
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, Mapping):
        return {str(k): _canonical_numbers(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_canonical_numbers(v) for v in value]
    return value


def canonical_args(args: Mapping[str, Any]) -> bytes:
    """Arguments as canonical JSON: sorted keys, one number form, UTF-8."""
    return encode_value(_canonical_numbers(dict(args)))


def identity_of(args: Mapping[str, Any], identity_fields: Sequence[str] | None) -> dict[str, Any]:
    """The part of ``args`` that names the action: all of it, or the declared fields."""
    if not identity_fields:
        return dict(args)
    missing = [f for f in identity_fields if f not in args]
    if missing:
        raise ValueError(
            f"identity field(s) {missing} missing from the call's arguments "
            f"{sorted(args)}; the tool declares them as its identity"
        )
    return {f: args[f] for f in identity_fields}


def idempotency_key(
    scope: str,
    tool: str,
    args: Mapping[str, Any],
    identity_fields: Sequence[str] | None = None,
) -> str:
    """The key for calling ``tool`` with ``args`` within ``scope`` (64 hex chars)."""
    identity = _canonical_numbers(identity_of(args, identity_fields))
    return hashlib.sha256(encode_value([scope, tool, identity])).hexdigest()
