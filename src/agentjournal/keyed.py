"""A run's keyed maps (completed calls, attempts) as a resumed run holds them: the
segments its snapshot names wait undecoded until a key may be in one.

A run of 100k events keeps some 30k completed calls, and decoding them all is most of
a resume that snapshots otherwise bound. So each stored segment has a Bloom filter of
its keys, and every ``BLOCK`` segments share one more, over all their keys: a lookup
tests one filter per block (and one per segment after the last full block), then the
filters of a block that may hold the key, and decodes only the segments that may. A
key the run never saw, the common case, decodes nothing with odds of about 1 in 2,000
per filter tested (16 to 32 bits a key, 11 probes). Walking the whole map decodes it
all, as a plain load does.

Only a journal's own load is lazy (``load_state(lazy=True)``): its maps read the
journal's store. ``Agent.run`` settles them into plain dicts before it returns (unless
told not to), so a result that outlives the store never reads it.

The viewer's time travel also leaves a long run's messages in their segments
(``Segmented``): a page shows the last few hundred of them, and the largest seq of each
segment, kept in the snapshot's body, says which segments hold those.
"""

from __future__ import annotations

import functools
import hashlib
import struct
from collections.abc import Callable, Iterable, Iterator, MutableMapping, MutableSequence
from typing import Any, TypeVar, overload

V = TypeVar("V")

#: Segments under one block filter.
BLOCK = 16
_BITS_PER_KEY = 16
_PROBES = 11


def key_filter(keys: Iterable[str]) -> bytes:
    """The Bloom filter of ``keys``: a power of two bits, at least 16 a key."""
    keys = list(keys)
    bits = max(64, 1 << (_BITS_PER_KEY * len(keys) - 1).bit_length())
    filter_, mask = bytearray(bits // 8), bits - 1
    for key in keys:
        for word in _words(key):  # (the arithmetic inline: through a helper, 45% slower)
            position = word & mask
            filter_[position >> 3] |= 1 << (position & 7)
    return bytes(filter_)


_WORDS = struct.Struct(f"<{_PROBES}I")


def _words(key: str) -> tuple[int, ...]:
    """One 32-bit word of ``key``'s hash per probe: cut to a filter's size, each is the
    bit it sets there."""
    return _WORDS.unpack_from(hashlib.blake2b(key.encode(), digest_size=64).digest())


#: A lookup's hash, kept a while: a key is looked up in both maps, a few times a step,
#: and each lookup tests filters of several sizes (one hash serves them all).
_hashed = functools.lru_cache(maxsize=256)(_words)


def forget_probes() -> None:
    """Empty the hashes kept: a benchmark resuming a run again and again in one process
    would otherwise find those of the last resume, as a new process would not."""
    _hashed.cache_clear()


class Head:
    """One of the full segments a snapshot named: its digest and filter, and its keys
    once decoded (None until then)."""

    __slots__ = ("digest", "filter", "keys")

    def __init__(self, digest: str, filter_: bytes) -> None:
        self.digest = digest
        self.filter = filter_
        self.keys: list[str] | None = None


class Group:
    """Heads under one filter: a block's, or a lone segment's own."""

    __slots__ = ("filter", "heads")

    def __init__(self, filter_: bytes, heads: list[Head]) -> None:
        self.filter = filter_
        self.heads = heads


def _admits(filter_: bytes, words: tuple[int, ...]) -> bool:
    """Whether the filter may hold the key hashed to ``words``. A bit is cut from its
    word only when tested: half a filter's bits are set, so most keys fail within two.
    (A loop, not all(): a generator costs more than the test.)"""
    mask = (len(filter_) << 3) - 1
    for word in words:
        position = word & mask
        if not filter_[position >> 3] & (1 << (position & 7)):
            return False
    return True


_MISSING: Any = object()


class Keyed(MutableMapping[str, V]):
    """A map whose first items are in the ``groups``' heads, decoded by ``load`` when a
    lookup's key may be in one, and the rest in ``rest`` (in the order they came).

    A key set again keeps its place: in the head that holds it (decoded first, so the
    next snapshot writes that segment anew), else in ``rest``. A key is in one segment
    only, so no decode can bring back a value set since."""

    __slots__ = ("_absent", "_decoded", "_heads", "_lazy", "_load", "_rest")

    def __init__(self, groups: list[Group], rest: dict[str, V],
                 load: Callable[[Head], list[tuple[str, V]]]) -> None:
        self._heads = [head for group in groups for head in group.heads]
        self._lazy = list(groups)  # those with a head not decoded yet
        self._decoded: dict[str, V] = {}  # the items of decoded heads
        self._absent: set[str] = set()  # keys the filters said no heads hold
        self._rest = rest
        self._load = load

    @property
    def heads(self) -> list[Head]:
        return self._heads

    @property
    def rest(self) -> dict[str, V]:
        return self._rest

    def decode(self, head: Head) -> list[str]:
        """``head``'s keys, decoding it if it is not yet."""
        if head.keys is None:
            items = self._load(head)
            head.keys = [key for key, _ in items]
            self._decoded.update(items)
            self._lazy = [g for g in self._lazy if any(h.keys is None for h in g.heads)]
        return head.keys

    def _find(self, key: str) -> V:
        value = self._rest.get(key, _MISSING)
        if value is _MISSING and self._heads:
            value = self._decoded.get(key, _MISSING)
            if value is _MISSING and self._lazy and key not in self._absent:
                words = _hashed(key)
                for group in [g for g in self._lazy if _admits(g.filter, words)]:
                    for head in group.heads:  # (a lone segment's filter is its group's)
                        if head.keys is None and (head.filter is group.filter
                                                  or _admits(head.filter, words)):
                            self.decode(head)
                value = self._decoded.get(key, _MISSING)
                if value is _MISSING:
                    self._absent.add(key)  # the heads never change: asked again, no scan
        return value  # type: ignore[no-any-return]

    def __getitem__(self, key: str) -> V:
        value = self._find(key)
        if value is _MISSING:
            raise KeyError(key)
        return value

    def get(self, key: str, default: Any = None) -> Any:
        value = self._find(key)
        return default if value is _MISSING else value

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self._find(key) is not _MISSING

    def __setitem__(self, key: str, value: V) -> None:
        if key not in self._rest and self._heads and self._find(key) is not _MISSING:
            self._decoded[key] = value  # it lives in a head
        else:
            self._rest[key] = value

    def __delitem__(self, key: str) -> None:
        if key in self._rest:
            del self._rest[key]
            return
        self[key]  # decodes its head, or raises KeyError
        del self._decoded[key]
        for head in self._heads:
            if head.keys is not None and key in head.keys:
                head.keys.remove(key)

    def decode_all(self) -> None:
        for head in self._heads:
            self.decode(head)

    def head_items(self, head: Head) -> list[tuple[str, V]]:
        """A head's items, as they stand (decoding it if it is not yet)."""
        return [(key, self._decoded[key]) for key in self.decode(head)]

    def __iter__(self) -> Iterator[str]:
        self.decode_all()
        for head in self._heads:
            assert head.keys is not None
            yield from head.keys
        yield from self._rest

    def __len__(self) -> int:
        self.decode_all()
        return len(self._decoded) + len(self._rest)

    def as_dict(self) -> dict[str, V]:
        self.decode_all()
        return {**{key: self._decoded[key] for head in self._heads
                   for key in head.keys or ()}, **self._rest}  # (no key is in both)

    def __repr__(self) -> str:
        lazy = sum(head.keys is None for head in self._heads)
        return (f"Keyed({lazy} of {len(self._heads)} segments undecoded, "
                f"{len(self._rest)} items after)")


class Segmented(MutableSequence[V]):
    """A list whose first items are in segments of ``size`` items, each decoded by
    ``load`` (given its index) when an item in it is read, and the rest in ``rest``.
    ``tops``: each segment's largest ``order`` of an item, so ``since`` decodes only the
    segments that hold an item past a bound.

    An item set in place is set in its (decoded) segment; an insertion or a deletion
    before the end decodes every segment first and goes on as a plain list."""

    __slots__ = ("_load", "_loaded", "_order", "_rest", "_size", "_tops")

    def __init__(self, size: int, tops: list[int], rest: list[V],
                 load: Callable[[int], list[V]], order: Callable[[V], int]) -> None:
        self._size = size
        self._tops = tops
        self._loaded: list[list[V] | None] = [None] * len(tops)
        self._rest = rest
        self._load = load
        self._order = order

    def _segment(self, index: int) -> list[V]:
        loaded = self._loaded[index]
        if loaded is None:
            loaded = self._loaded[index] = self._load(index)
        return loaded

    def _where(self, index: int) -> tuple[list[V], int]:
        """The list holding item ``index`` (negative from the end), and its place there."""
        length = len(self)
        at = index + length if index < 0 else index
        if not 0 <= at < length:
            raise IndexError("list index out of range")
        heads = len(self._loaded) * self._size
        if at >= heads:
            return self._rest, at - heads
        return self._segment(at // self._size), at % self._size

    def _flatten(self) -> list[V]:
        """Every item in ``rest``, the segments decoded: a plain list from now on."""
        if self._loaded:
            self._rest = list(self)
            self._loaded, self._tops = [], []
        return self._rest

    def __len__(self) -> int:
        return len(self._loaded) * self._size + len(self._rest)

    @overload
    def __getitem__(self, index: int) -> V: ...

    @overload
    def __getitem__(self, index: slice) -> list[V]: ...

    def __getitem__(self, index: int | slice) -> V | list[V]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        items, at = self._where(index)
        return items[at]

    @overload
    def __setitem__(self, index: int, value: V) -> None: ...

    @overload
    def __setitem__(self, index: slice, value: Iterable[V]) -> None: ...

    def __setitem__(self, index: int | slice, value: Any) -> None:
        if isinstance(index, slice):
            self._flatten()[index] = value
            return
        items, at = self._where(index)
        items[at] = value

    def __delitem__(self, index: int | slice) -> None:
        del self._flatten()[index]

    def insert(self, index: int, value: V) -> None:
        if index >= len(self):
            self._rest.append(value)
        else:
            self._flatten().insert(index, value)

    def __iter__(self) -> Iterator[V]:
        for index in range(len(self._loaded)):
            yield from self._segment(index)
        yield from self._rest

    def since(self, bound: int) -> list[V]:
        """The items whose ``order`` is over ``bound``, in their order: a segment not
        decoded yet is decoded only if its top is over it."""
        found: list[V] = []
        for index, top in enumerate(self._tops):
            if self._loaded[index] is not None or top > bound:
                found += [item for item in self._segment(index) if self._order(item) > bound]
        found += [item for item in self._rest if self._order(item) > bound]
        return found

    def __repr__(self) -> str:
        lazy = sum(loaded is None for loaded in self._loaded)
        return (f"Segmented({lazy} of {len(self._loaded)} segments undecoded, "
                f"{len(self._rest)} items after)")
