"""A resumed run's lazy map (keyed.py) answers as the dict it stands for, whatever is
asked of it, and decodes a segment only when its filters admit the key asked for."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from agentjournal.keyed import Group, Head, Keyed, _admits, _words, key_filter

KEYS = st.text("abcdef0123456789", min_size=1, max_size=6)


def a_map(segments: list[list[tuple[str, int]]], rest: dict[str, int], block: int
          ) -> tuple[Keyed[int], list[Head]]:
    """``segments`` as heads, the first ones under block filters of ``block`` heads,
    each loaded from its items (recorded in the list returned)."""
    stored = {f"d{i}": items for i, items in enumerate(segments)}
    heads = [Head(digest, key_filter(k for k, _ in items)) for digest, items in stored.items()]
    full = len(heads) // block * block
    groups = [Group(key_filter(k for items in segments[i:i + block] for k, _ in items),
                    heads[i:i + block]) for i in range(0, full, block)]
    groups += [Group(head.filter, [head]) for head in heads[full:]]
    loaded: list[Head] = []

    def load(head: Head) -> list[tuple[str, int]]:
        loaded.append(head)
        return list(stored[head.digest])

    return Keyed(groups, dict(rest), load), loaded


@st.composite
def maps(draw: st.DrawFn) -> tuple[list[list[tuple[str, int]]], dict[str, int], int]:
    keys = draw(st.lists(KEYS, unique=True, max_size=40))
    size = draw(st.integers(1, 5))
    full = len(keys) // size * size
    segments = [[(k, n) for n, k in enumerate(keys[i:i + size], start=i)]
                for i in range(0, full, size)]
    return segments, {k: -1 for k in keys[full:]}, draw(st.integers(1, 4))


Op = tuple[str, str, int]
OPS = st.lists(st.tuples(st.sampled_from(["get", "in", "set", "del", "iter", "len"]),
                         KEYS, st.integers()), max_size=30)


@given(parts=maps(), ops=OPS)
def test_a_lazy_map_answers_as_the_dict_it_stands_for(
    parts: tuple[list[list[tuple[str, int]]], dict[str, int], int], ops: list[Op]
) -> None:
    segments, rest, block = parts
    lazy, _ = a_map(segments, rest, block)
    model: dict[str, Any] = {k: v for items in segments for k, v in items} | rest
    for op, key, value in ops:
        if op == "get":
            assert lazy.get(key, "none") == model.get(key, "none")
        elif op == "in":
            assert (key in lazy) == (key in model)
        elif op == "set":
            lazy[key] = value
            model[key] = value
        elif op == "del" and key in model:
            del lazy[key]
            del model[key]
        elif op == "iter":
            assert list(lazy) == list(model) and dict(lazy.items()) == model
        elif op == "len":
            assert len(lazy) == len(model)
    assert lazy.as_dict() == model and list(lazy.as_dict()) == list(model)


@given(parts=maps(), asked=st.lists(KEYS, max_size=10))
def test_a_lookup_decodes_only_segments_whose_filters_admit_the_key(
    parts: tuple[list[list[tuple[str, int]]], dict[str, int], int], asked: list[str]
) -> None:
    segments, rest, block = parts
    lazy, loaded = a_map(segments, rest, block)
    for key in asked:
        before = len(loaded)
        holder = next((i for i, items in enumerate(segments) if key in dict(items)), None)
        lazy.get(key)
        for head in loaded[before:]:
            assert head.keys is not None
        if holder is not None:
            assert lazy.heads[holder].keys is not None  # decoded: never a false "absent"
    assert len(loaded) == len({id(h) for h in loaded})  # none decoded twice


def test_filters_say_no_to_almost_every_key_they_were_not_built_from() -> None:
    built = key_filter(f"{n:064x}" for n in range(256))
    assert len(built) == 512  # 16 bits a key
    assert all(_admits(built, _words(f"{n:064x}")) for n in range(256))
    admitted = sum(_admits(built, _words(f"{n:064x}")) for n in range(10_000, 30_000))
    assert admitted < 40  # about 1 in 2,000: 10 expected
