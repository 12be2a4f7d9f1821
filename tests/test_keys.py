from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentjournal import EncodingError, canonical_args, idempotency_key, operation_scope, run_scope

json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**12), 10**12), st.text(max_size=8),
    st.floats(allow_nan=False, allow_infinity=False),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                max_size=3),
    max_leaves=10,
)
arg_dicts = st.dictionaries(st.text(min_size=1, max_size=6), json_values, max_size=6)


def shuffled(d: dict[str, Any], seed: int) -> dict[str, Any]:
    items = list(d.items())
    random.Random(seed).shuffle(items)
    return {k: shuffled(v, seed) if isinstance(v, dict) else v for k, v in items}


def test_the_seeds_example_gives_one_key() -> None:
    scope = run_scope("run-1")
    a = idempotency_key(scope, "post", {"amount": 10, "acct": "x"})
    b = idempotency_key(scope, "post", {"acct": "x", "amount": 10})
    assert a == b and len(a) == 64


@given(arg_dicts, st.integers())
def test_argument_order_never_changes_the_key(args: dict[str, Any], seed: int) -> None:
    scope = run_scope("r")
    assert idempotency_key(scope, "t", args) == idempotency_key(scope, "t", shuffled(args, seed))
    assert canonical_args(args) == canonical_args(shuffled(args, seed))


@given(st.integers(-(10**15), 10**15))
def test_one_number_form(n: int) -> None:
    scope = run_scope("r")
    assert idempotency_key(scope, "t", {"amount": n}) == idempotency_key(
        scope, "t", {"amount": float(n)}
    )


@given(arg_dicts, arg_dicts)
def test_different_arguments_give_different_keys(a: dict[str, Any], b: dict[str, Any]) -> None:
    scope = run_scope("r")
    if canonical_args(a) != canonical_args(b):
        assert idempotency_key(scope, "t", a) != idempotency_key(scope, "t", b)


@given(arg_dicts)
def test_scope_and_tool_are_part_of_the_key(args: dict[str, Any]) -> None:
    key = idempotency_key(run_scope("r1"), "t", args)
    assert key != idempotency_key(run_scope("r2"), "t", args)
    assert key != idempotency_key(run_scope("r1"), "u", args)


def test_operation_scope_survives_runs() -> None:
    # The same business operation accepted in two runs is one action.
    scope = operation_scope("acme", "op-7")
    assert idempotency_key(scope, "pay", {"amt": 5}) == idempotency_key(scope, "pay", {"amt": 5})
    assert scope != operation_scope("acme", "op-8")


@given(st.text(min_size=1, max_size=8), st.text(max_size=8), st.text(max_size=8))
def test_identity_fields_tell_intentional_repeats_apart(
    correction: str, memo_a: str, memo_b: str
) -> None:
    scope, ids = run_scope("r"), ["correction_id"]
    one = idempotency_key(scope, "post", {"correction_id": correction, "memo": memo_a}, ids)
    same = idempotency_key(scope, "post", {"correction_id": correction, "memo": memo_b}, ids)
    other = idempotency_key(scope, "post", {"correction_id": correction + "!", "memo": memo_a},
                            ids)
    assert one == same and one != other


def test_missing_identity_field_is_an_error() -> None:
    with pytest.raises(ValueError, match="correction_id"):
        idempotency_key(run_scope("r"), "post", {"memo": "x"}, ["correction_id"])


def test_non_finite_arguments_are_refused() -> None:
    with pytest.raises(EncodingError):
        idempotency_key(run_scope("r"), "post", {"amount": float("nan")})
