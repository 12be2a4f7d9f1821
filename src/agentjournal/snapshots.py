"""Snapshots: a cached partial fold, and the gate that proves the cache tells the truth.

Loading a run is ``fold(snapshot_state, events_after_it)``. A snapshot is used
only if its versions match this release, its digest matches its body, the
body (and every segment it names) decodes to the state at its seq, and the log
continues right after it; anything else is a miss (counted) and the next older
snapshot is tried, then a full replay from event 1. Deleting every snapshot
never prevents recovery.

A snapshot's long parts, the messages, the completed calls and the attempts per key,
are stored in segments of ``SEGMENT`` items, each the zlib-compressed msgpack of its
items, named by the sha256 of those stored bytes (hashing the compressed bytes costs an
eighth of hashing the msgpack; a segment named by its msgpack, as earlier releases
named them, is accepted too), and written
once: a snapshot writes the segments the store does not hold yet, then its body
(the rest of the state, the digests of its full segments, and the items after
them), so what it writes does not grow with the run. Segments no snapshot names
any more are collected after each write. The body also keeps the largest seq of each
full message segment, so a reader that shows only the latest messages (the viewer's
time travel) decodes only the segments that hold them (keyed.py's ``Segmented``).

``verify`` reads the whole log (which checks every event's digest chain),
folds it twice in lockstep (determinism at every prefix) and checks every
stored snapshot, plus its tail, against the full replay on every durable
field (and the largest seqs it keeps against its message segments); a mismatch
quarantines that fold version so its snapshots are never loaded again. A damaged
log is reported with the first seq that does not check out, and then proves nothing
about snapshots, so none is judged.
"""

from __future__ import annotations

import gc
import hashlib
import itertools
import logging
import operator
import re
import time
import zlib
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Set
from contextlib import contextmanager
from typing import Any

import msgspec

from .errors import CorruptLogError, JournalError, SnapshotSegmentError
from .events import SCHEMA_VERSION, Event, now
from .keyed import BLOCK, Group, Head, Keyed, Segmented, key_filter
from .metrics import METRICS
from .projections import differences, outline
from .state import FOLD_VERSION, CompletedCall, Message, RunState, apply, durable_fields
from .store import Store
from .store.base import Snapshot

log = logging.getLogger("agentjournal")

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(RunState)

# Bodies and segments are msgpack compressed with zlib: 7-8x smaller (a run's state
# repeats its keys and much of its text). Level 6 writes 9% fewer bytes than level 1 (53
# against 59 a snapshotted event) for ~2 ms more a snapshot at 10,000 events (12 against
# 10 ms, medians); inflating costs the same at every level.
# Bodies written before compression are plain msgpack (a map, or an array for a _Form,
# whose first byte is never zlib's 0x78) and load as they are.
_LEVEL = 6
_ZLIB = b"\x78"  # zlib's first header byte (deflate, 32 KiB window), at every level


@contextmanager
def gc_paused() -> Iterator[None]:
    """Hold the cyclic GC off during a bulk fold: it rescans a growing heap for nothing."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


#: Items (messages, completed calls, attempts) per segment: 256 keeps a segment of the
#: bench's workload over SQLite's 4 KiB page (a row just over a page wastes most of two).
SEGMENT = 256

# A keyed part's pairs as stored, each key text or bytes (see _packed; msgspec decodes
# no union of the two but Any, which msgpack's str and bin types tell apart).
Completed = list[tuple[Any, CompletedCall]]
Attempts = list[tuple[Any, int]]
Decode = Callable[[bytes], list[Any]]


class _Form(msgspec.Struct, array_like=True):
    """A snapshot body: the state without the parts that grow with the run, and each of
    those as the digests of its full segments plus the items after them; for the keyed
    parts, a filter of each segment's keys too (see keyed.py). (An array: its msgpack
    starts 0x9N, a whole state's a map, so the two are told apart.)"""

    head: RunState
    messages: list[str]
    messages_after: list[Message]
    completed: list[str]
    completed_after: Completed
    attempts: list[str]
    attempts_after: Attempts
    #: The keyed parts' filters (keyed.py): a block object per ``BLOCK`` full segments
    #: (by digest), and the filter of each segment after those. Absent from bodies
    #: written before filters, whose segments are all decoded at load.
    completed_blocks: list[str] = []
    completed_filters: list[bytes] = []
    attempts_blocks: list[str] = []
    attempts_filters: list[bytes] = []
    #: The largest seq of a message in each full message segment (``SEGMENT`` each).
    #: Absent from bodies written before it, whose message segments are all decoded.
    #: (A reader takes each segment to hold ``SEGMENT`` messages, checked when decoded:
    #: a release that changes ``SEGMENT`` writes these under another name.)
    messages_tops: list[int] = []


class _Block(msgspec.Struct, array_like=True):
    """Stored as a segment: the filter of ``BLOCK`` segments' keys, and each one's."""

    filter: bytes
    filters: list[bytes]


_form_decoder = msgspec.msgpack.Decoder(_Form)
_messages_decoder = msgspec.msgpack.Decoder(list[Message])
_completed_decoder = msgspec.msgpack.Decoder(Completed)
_attempts_decoder = msgspec.msgpack.Decoder(Attempts)
_block_decoder = msgspec.msgpack.Decoder(_Block)

# An idempotency key (keys.py): a sha256 in lowercase hex.
_HEX_KEY = re.compile(r"[0-9a-f]{64}")


def _packed(pairs: list[tuple[str, Any]]) -> list[tuple[str | bytes, Any]]:
    """A keyed part's pairs as stored: a key of 64 lowercase hex digits (every
    idempotency key) as its 32 bytes, which take 34 in a segment where the hex, random
    to zlib, takes about 39; any other key as it is. Half of what snapshots add is
    keys."""
    return [(bytes.fromhex(k) if _HEX_KEY.fullmatch(k) else k, v) for k, v in pairs]


def _unpacked(pairs: list[tuple[str | bytes, Any]]) -> list[tuple[str, Any]]:
    """The pairs ``_packed`` stored (or pairs stored before it, all keys text)."""
    return [(k.hex() if isinstance(k, bytes) else k, v) for k, v in pairs]


def _completed(raw: bytes) -> list[Any]:
    return _unpacked(_completed_decoder.decode(raw))


def _attempts(raw: bytes) -> list[Any]:
    return _unpacked(_attempts_decoder.decode(raw))


class Segments:
    """A writer's memory of the segments it stored or loaded: for each part and index,
    the objects the segment held, its digest and (for a keyed part) its filter. A
    segment whose objects are the very same is neither encoded, nor hashed, nor written
    again, so a snapshot costs what changed. (The fold replaces a message or a completed
    call, never changes one in place, so the same objects hold the same content.)"""

    def __init__(self) -> None:
        self._known: dict[tuple[str, int], tuple[list[Any], str, bytes | None]] = {}
        #: The largest seq in each message segment, by digest (a digest names its
        #: content, so this is never stale): each is computed once, not per snapshot.
        self.tops: dict[str, int] = {}

    def known(self, part: str, index: int, objects: list[Any]
              ) -> tuple[str, bytes | None] | None:
        """The digest and filter of the segment that held ``objects``, if remembered."""
        hit = self._known.get((part, index))
        if hit is None or len(hit[0]) != len(objects):
            return None
        return (hit[1], hit[2]) if all(map(operator.is_, hit[0], objects)) else None

    def digest(self, part: str, index: int, objects: list[Any]) -> str | None:
        hit = self.known(part, index, objects)
        return None if hit is None else hit[0]

    def remember(self, part: str, index: int, objects: list[Any], digest: str,
                 filter_: bytes | None = None) -> None:
        self._known[(part, index)] = (objects, digest, filter_)

    def digests(self) -> set[str]:
        return {digest for _, digest, _ in self._known.values()}

    def keep(self, named: Set[str]) -> bool:
        """Forget the segments not in ``named``; whether any was."""
        gone = [k for k, (_, digest, _) in self._known.items() if digest not in named]
        for key in gone:
            del self._known[key]
        self.tops = {digest: top for digest, top in self.tops.items() if digest in named}
        return bool(gone)


def _objects(items: list[Any]) -> list[Any]:
    """What a segment is known by: its items, or for a mapping's pairs, their keys and
    values (a pair is a new tuple each time; its key and value are not)."""
    if items and isinstance(items[0], tuple):
        return [o for pair in items for o in pair]
    return items


#: A full segment to store: its items, or a head of a resumed run's map not decoded yet
#: (so unchanged: a write into it decodes it first).
Chunk = list[Any] | Head


def _chunks(part: list[Any] | Mapping[str, Any], size: int) -> tuple[list[Chunk], list[Any]]:
    """``part``'s full segments of ``size`` items, and the items after them."""
    chunks: list[Chunk] = []
    if isinstance(part, Keyed):
        chunks += [head if head.keys is None else part.head_items(head) for head in part.heads]
        part = part.rest
    items = list(part.items()) if isinstance(part, Mapping) else part
    full = len(items) // size * size
    chunks += [items[start:start + size] for start in range(0, full, size)]
    return chunks, items[full:]


Seen = list[tuple[str, int, list[Any], str, bytes | None]]


def _split(name: str, part: list[Any] | Mapping[str, Any], size: int | None,
           segments: Segments, new: dict[str, bytes], seen: Seen, held: Set[str]
           ) -> tuple[list[str], list[bytes], list[Any]]:
    """The digests of ``part``'s full segments of ``size``, their key filters (for a
    mapping), and the items after them. A segment ``segments`` does not know is encoded
    and hashed (into ``seen``, to be remembered once stored), and written (into ``new``)
    unless its digest is known."""
    if size is None:
        return [], [], list(part.items()) if isinstance(part, Mapping) else part
    keyed = isinstance(part, Mapping)
    chunks, after = _chunks(part, size)
    digests, filters = [], []
    for index, chunk in enumerate(chunks):
        filter_: bytes | None
        if isinstance(chunk, Head):
            digest, filter_ = chunk.digest, chunk.filter
        else:
            objects = _objects(chunk)
            hit = segments.known(name, index, objects)
            if hit is None or (keyed and hit[1] is None):
                digest = _store(_encoder.encode(_packed(chunk) if keyed else chunk), new,
                                held)
                filter_ = key_filter(key for key, _ in chunk) if keyed else None
                seen.append((name, index, objects, digest, filter_))
            else:
                digest, filter_ = hit
        digests.append(digest)
        if filter_ is not None:
            filters.append(filter_)
    return digests, filters, after


def _store(raw: bytes, new: dict[str, bytes], held: Set[str]) -> str:
    """The digest of the segment ``raw``, to be written (into ``new``) unless the store
    holds it (as far as the writer knows: ``held``)."""
    stored = zlib.compress(raw, _LEVEL)
    digest = hashlib.sha256(stored).hexdigest()
    if digest not in new and digest not in held:
        new[digest] = stored
    return digest


def _blocks(name: str, part: Mapping[str, Any], size: int | None, digests: list[str],
            filters: list[bytes], segments: Segments, new: dict[str, bytes], seen: Seen,
            held: Set[str]) -> tuple[list[str], list[bytes]]:
    """The block objects of a keyed part's full segments (see keyed.py), by digest, and
    the filters of the segments after the last full block."""
    full = len(digests) // BLOCK * BLOCK if size is not None else 0
    blocks = []
    for index, start in enumerate(range(0, full, BLOCK)):
        named = digests[start:start + BLOCK]
        digest = segments.digest(f"{name}.blocks", index, named)
        if digest is None:
            keys = _block_keys(part, size or 0, start)
            digest = _store(_encoder.encode(_Block(key_filter(keys),
                                                   filters[start:start + BLOCK])), new, held)
            seen.append((f"{name}.blocks", index, named, digest, None))
        blocks.append(digest)
    return blocks, filters[full:]


def _block_keys(part: Mapping[str, Any], size: int, start: int) -> list[str]:
    """The keys of the ``BLOCK`` full segments from the ``start``-th on."""
    heads, rest = (part.heads, part.rest) if isinstance(part, Keyed) else ([], part)
    keys: list[str] = []
    for index in range(start, start + BLOCK):
        if index < len(heads):
            assert isinstance(part, Keyed)
            keys += part.decode(heads[index])
        else:
            offset = (index - len(heads)) * size
            keys += list(itertools.islice(rest, offset, offset + size))
    return keys


def _take(state: RunState, size: int | None, segments: Segments | None = None
          ) -> tuple[Snapshot, dict[str, bytes], Seen]:
    """A snapshot of ``state``, the segments to write first, and those to remember."""
    known = Segments() if segments is None else segments
    new: dict[str, bytes] = {}
    seen: Seen = []
    held = known.digests()

    def keyed(name: str, part: Mapping[str, Any]) -> dict[str, Any]:
        """A keyed part's fields of the body: its segments, the items after them, its
        block objects and the filters of the segments after those."""
        digests, filters, after = _split(name, part, size, known, new, seen, held)
        blocks, trailing = _blocks(name, part, size, digests, filters, known, new, seen, held)
        return {name: digests, f"{name}_after": _packed(after), f"{name}_blocks": blocks,
                f"{name}_filters": trailing}

    messages, _, messages_after = _split("messages", state.messages, size, known, new, seen,
                                         held)
    head = msgspec.structs.replace(state, messages=[], completed={}, attempts={})
    body = zlib.compress(_encoder.encode(_Form(
        head=head, messages=messages, messages_after=messages_after,
        messages_tops=_tops(state.messages, messages, size or 0, known),
        **keyed("completed", state.completed), **keyed("attempts", state.attempts))), _LEVEL)
    return Snapshot(
        run_id=state.run_id, seq=state.last_seq, schema_version=SCHEMA_VERSION,
        fold_version=FOLD_VERSION, digest=hashlib.sha256(body).hexdigest(), body=body,
        created_at=now(),
    ), new, seen


_SEQ = operator.attrgetter("seq")


def _tops(messages: list[Message], digests: list[str], size: int, known: Segments
          ) -> list[int]:
    """The largest seq in each full message segment (named by ``digests``)."""
    tops = []
    for index, digest in enumerate(digests):
        top = known.tops.get(digest)
        if top is None:
            top = known.tops[digest] = max(map(_SEQ, messages[index * size:(index + 1) * size]))
        tops.append(top)
    return tops


def take(state: RunState) -> Snapshot:
    """A snapshot of ``state`` that names no segment: all of it in its body."""
    return _take(state, None)[0]


def write_snapshot(store: Store, state: RunState, *, keep: int = 2,
                   segments: Segments | None = None) -> Snapshot | None:
    """Publish a snapshot of ``state``; None if this fold version is quarantined.

    ``segments``: what the writer knows of the run's stored segments (kept across its
    snapshots and updated here); the others are written first. A snapshot is only a
    cache: failing to write one is logged, never fatal.
    """
    started = time.perf_counter()
    known = Segments() if segments is None else segments
    try:
        if FOLD_VERSION in store.quarantined():
            return None
        snapshot, new, seen = _take(state, SEGMENT, known)
        if new:
            store.put_segments(state.run_id, new)
        for part, index, objects, digest, filter_ in seen:
            known.remember(part, index, objects, digest, filter_)
        store.put_snapshot(snapshot, keep=keep)
        collect_segments(store, state.run_id, known)
    except (JournalError, OSError, OverflowError, msgspec.EncodeError) as exc:
        # (OverflowError: JSON holds any integer, msgpack none past 64 bits.)
        log.warning("snapshot of run %s at seq %d not written: %s",
                    state.run_id, state.last_seq, exc)
        return None
    METRICS.time("snapshot_write_ms", (time.perf_counter() - started) * 1000,
                 schema_version=SCHEMA_VERSION)
    return snapshot


def named_segments_of(store: Store, run_id: str) -> set[str] | None:
    """The digests the run's snapshots name; None when a body cannot be read (what it
    names is then unknown)."""
    named: set[str] = set()
    for snapshot in store.snapshots(run_id):
        try:
            form = _form_of(snapshot.body)
        except (msgspec.DecodeError, msgspec.ValidationError, zlib.error):
            return None
        if form is not None:
            named.update(_names(form))
    return named


def collect_segments(store: Store, run_id: str, known: Segments | None = None) -> int:
    """Delete the run's segments that none of its snapshots names; how many went. Not
    while a snapshot's body cannot be read. With ``known`` (a writer's own, see
    write_snapshot), only when one of those is no longer named: others' leftovers are
    gc's to collect."""
    named = named_segments_of(store, run_id)
    if named is None or (known is not None and not known.keep(named)):
        return 0
    return store.prune_segments(run_id, named)


def refusal(snapshot: Snapshot, quarantined: dict[int, str]) -> str | None:
    """Why ``snapshot`` is never loaded (so is dead weight), or None."""
    if snapshot.fold_version in quarantined:
        return f"fold version {snapshot.fold_version} is quarantined"
    if (snapshot.schema_version, snapshot.fold_version) != (SCHEMA_VERSION, FOLD_VERSION):
        return (f"written by schema v{snapshot.schema_version} / fold v{snapshot.fold_version}; "
                f"this release is v{SCHEMA_VERSION} / v{FOLD_VERSION}")
    if hashlib.sha256(snapshot.body).hexdigest() != snapshot.digest:
        return "digest does not match the body"
    return None


def _is_form(raw: bytes) -> bool:
    return 0x90 <= raw[0] <= 0x9F  # a msgpack array of up to 15 (a state is a map)


def _inflate(body: bytes) -> bytes:
    return zlib.decompress(body) if body[:1] == _ZLIB else body


def _form_of(body: bytes) -> _Form | None:
    """The segmented form of a body; None for a whole state (an older release's)."""
    raw = _inflate(body)
    return _form_decoder.decode(raw) if _is_form(raw) else None


def _names(form: _Form) -> list[str]:
    return [*form.messages, *form.completed, *form.attempts, *form.completed_blocks,
            *form.attempts_blocks]


def named_segments(body: bytes) -> list[str]:
    """The digests of the segments a snapshot body names."""
    form = _form_of(body)
    return [] if form is None else _names(form)


Fetch = Callable[[list[str]], Mapping[str, bytes]]


class _Later:
    """Where a lazy load leaves the keyed parts' segments, to be fetched when a lookup
    needs one (see keyed.py). They are not even checked to be there: that would read
    a page per segment. Their filters are (in the body and the block objects, read and
    checked at load), so a key is never wrongly found absent; a segment found missing
    or damaged when needed raises, and sets the run's snapshots aside so that opening
    it again folds it from its log."""

    def __init__(self, store: Store, run_id: str, known: Segments,
                 messages: bool = False) -> None:
        self.store, self.run_id, self.known = store, run_id, known
        #: Whether the messages are left in their segments too (``listed``).
        self.messages = messages

    def _raw(self, digest: str) -> bytes:
        """The segment ``digest``, fetched now; missing or damaged, it raises, and sets
        the run's snapshots aside."""
        try:
            return _segment(self.store.segments(self.run_id, [digest]), digest)
        except SegmentError as exc:
            self.store.delete_snapshots(self.run_id)
            raise SnapshotSegmentError(self.run_id, digest, str(exc)) from exc

    def keyed(self, name: str, digests: list[str], blocks: list[_Block],
              filters: list[bytes], after: list[tuple[str, Any]], decode: Decode
              ) -> Keyed[Any]:
        """The part as a lazy map: ``digests`` under ``blocks`` then each its own filter."""
        heads = [Head(digest, filter_) for digest, filter_ in zip(
            digests, [f for block in blocks for f in block.filters] + filters, strict=True)]
        groups = [Group(block.filter, heads[i * BLOCK:(i + 1) * BLOCK])
                  for i, block in enumerate(blocks)]
        groups += [Group(head.filter, [head]) for head in heads[len(blocks) * BLOCK:]]

        def load(head: Head) -> list[tuple[str, Any]]:
            chunk: list[tuple[str, Any]] = decode(self._raw(head.digest))
            self.known.remember(name, heads.index(head), _objects(chunk), head.digest,
                                head.filter)
            return chunk

        return Keyed(groups, dict(after), load)

    def listed(self, digests: list[str], tops: list[int], after: list[Message]
               ) -> Segmented[Message]:
        """The messages as a lazy list: ``digests``' segments, then ``after``."""

        def load(index: int) -> list[Message]:
            digest = digests[index]
            chunk = _messages_decoder.decode(self._raw(digest))
            if len(chunk) != SEGMENT:  # (written by a release of another SEGMENT)
                raise SnapshotSegmentError(self.run_id, digest,
                                           f"holds {len(chunk)} messages, not {SEGMENT}")
            self.known.remember("messages", index, chunk, digest)
            return chunk

        return Segmented(SEGMENT, tops, after, load, _SEQ)


def state_of(body: bytes, segments: Mapping[str, bytes] | None = None,
             known: Segments | None = None) -> RunState:
    """The state a snapshot body holds, with the ``segments`` it names (by digest); each
    segment it decodes goes into ``known``. Raises msgspec.DecodeError or zlib.error if
    it holds none, and SegmentError if a segment is missing or not the one named."""
    return _state_of(body, lambda _: segments or {}, known)


def _state_of(body: bytes, fetch: Fetch, known: Segments | None,
              later: _Later | None = None) -> RunState:
    """``state_of``, the segments got from ``fetch`` (given the names): the body is
    inflated and decoded once. With ``later``, the keyed parts' segments that have
    filters are left to it."""
    raw = _inflate(body)
    if not _is_form(raw):
        return _decoder.decode(raw)  # a whole state, as releases before segments wrote
    form = _form_decoder.decode(raw)
    topped = len(form.messages_tops) == len(form.messages)
    lazy_messages = later is not None and later.messages and topped and bool(form.messages)
    lazy_completed = later is not None and _filtered(form.completed, form.completed_blocks,
                                                     form.completed_filters)
    lazy_attempts = later is not None and _filtered(form.attempts, form.attempts_blocks,
                                                    form.attempts_filters)
    names = [*([] if lazy_messages else form.messages), *form.completed_blocks,
             *form.attempts_blocks,
             *([] if lazy_completed else form.completed),
             *([] if lazy_attempts else form.attempts)]
    parts, known = fetch(names) if names else {}, Segments() if known is None else known
    if topped:
        known.tops.update(zip(form.messages, form.messages_tops, strict=True))

    def part(name: str, digests: list[str], decode: Decode) -> list[Any]:
        items = []
        for index, digest in enumerate(digests):
            chunk = decode(_segment(parts, digest))
            known.remember(name, index, _objects(chunk), digest)
            items += chunk
        return items

    def blocks(name: str, digests: list[str], segments: list[str]) -> list[_Block]:
        found = [_block_decoder.decode(_segment(parts, digest)) for digest in digests]
        for index, digest in enumerate(digests):
            known.remember(f"{name}.blocks", index, segments[index * BLOCK:(index + 1) * BLOCK],
                           digest)
        return found

    def mapping(name: str, lazy: bool, digests: list[str], block_digests: list[str],
                filters: list[bytes], stored_after: list[tuple[str | bytes, Any]],
                decode: Decode) -> MutableMapping[str, Any]:
        found, after = blocks(name, block_digests, digests), _unpacked(stored_after)
        if lazy and later is not None:
            return later.keyed(name, digests, found, filters, after, decode)
        items = dict(part(name, digests, decode))
        items.update(after)
        return items

    state = form.head
    if lazy_messages and later is not None:
        state.messages = later.listed(form.messages, form.messages_tops,  # type: ignore[assignment]
                                      form.messages_after)
    else:
        state.messages = part("messages", form.messages, _messages_decoder.decode)
        state.messages += form.messages_after
    state.completed = mapping("completed", lazy_completed, form.completed,
                              form.completed_blocks, form.completed_filters,
                              form.completed_after, _completed)
    state.attempts = mapping("attempts", lazy_attempts, form.attempts, form.attempts_blocks,
                             form.attempts_filters, form.attempts_after, _attempts)
    return state


def _filtered(digests: list[str], blocks: list[str], filters: list[bytes]) -> bool:
    """Whether a keyed part's segments all have filters (bodies before filters have none)."""
    return bool(digests) and len(blocks) * BLOCK + len(filters) == len(digests)


class SegmentError(ValueError):
    """A segment a snapshot names is missing, or is not the one it names."""


def _segment(parts: Mapping[str, bytes], digest: str) -> bytes:
    body = parts.get(digest)
    if body is None:
        raise SegmentError(f"segment {digest[:12]} is missing")
    if hashlib.sha256(body).hexdigest() == digest:
        return zlib.decompress(body)
    try:  # named by its msgpack, as earlier releases named segments
        raw = zlib.decompress(body)
    except zlib.error:
        raw = b""
    if hashlib.sha256(raw).hexdigest() != digest:
        raise SegmentError(f"segment {digest[:12]} does not match its digest")
    return raw


def decode_snapshot(store: Store, snapshot: Snapshot, known: Segments | None = None,
            lazy: bool = False, lazy_messages: bool = False) -> tuple[RunState | None, str]:
    """The state ``snapshot`` holds, with its segments (into ``known``); else None and
    why. ``lazy``: the keyed parts' segments with filters are left undecoded (_Later);
    with ``lazy_messages`` the message segments too, if the body says each one's
    largest seq (for a reader: the messages are then a ``Segmented``, not a list)."""
    later = _Later(store, snapshot.run_id, known or Segments(), lazy_messages) if lazy else None
    try:
        state = _state_of(snapshot.body, lambda names: store.segments(snapshot.run_id, names),
                          known, later)
    except (msgspec.DecodeError, msgspec.ValidationError, zlib.error):
        return None, "body does not decode to the state at its seq"
    except SegmentError as exc:
        return None, str(exc)
    if state.last_seq != snapshot.seq or state.run_id != snapshot.run_id:
        return None, "body does not decode to the state at its seq"
    return state, ""


class Loaded(msgspec.Struct, frozen=True):
    state: RunState
    snapshot_seq: int  # 0 when the whole log was replayed
    replayed: int
    misses: list[str]
    #: The segments of the loaded snapshot (so known to be stored and sound).
    segments: Segments = msgspec.field(default_factory=Segments)


def load_state(store: Store, run_id: str, *, use_snapshots: bool = True,
               lazy: bool = False) -> Loaded:
    """The run's current state: the newest sound snapshot plus its tail, else a full fold.

    ``lazy`` (a journal's load): the completed calls and attempts a snapshot holds in
    segments stay undecoded until a lookup may need one (see keyed.py), so the load's
    cost does not grow with the run; the state must not outlive ``store`` before
    ``settle`` makes its maps plain."""
    with gc_paused():  # decoding and folding allocate many objects and free none
        return _load(store, run_id, use_snapshots, lazy)


def settle(state: RunState) -> None:
    """Decode what a lazy load left in ``state``'s maps, making them plain dicts."""
    if isinstance(state.completed, Keyed):
        state.completed = state.completed.as_dict()
    if isinstance(state.attempts, Keyed):
        state.attempts = state.attempts.as_dict()


def _load(store: Store, run_id: str, use_snapshots: bool, lazy: bool) -> Loaded:
    misses: list[str] = []
    quarantined: dict[int, str] | None = None
    for snapshot in _newest_first(store, run_id) if use_snapshots else ():
        if quarantined is None:
            quarantined = store.quarantined()
        started = time.perf_counter()
        reason = refusal(snapshot, quarantined)
        segments = Segments()
        state, reason = (None, reason) if reason else decode_snapshot(store, snapshot, segments,
                                                                      lazy)
        METRICS.time("snapshot_load_ms", (time.perf_counter() - started) * 1000,
                     schema_version=snapshot.schema_version)
        if state is not None:
            try:
                tail = _fold_tail(store, run_id, state)
            except SnapshotSegmentError as exc:  # (and the snapshots were set aside)
                tail, reason = None, exc.detail
            if tail is not None:
                METRICS.gauge("snapshot_seq_gap", tail, schema_version=SCHEMA_VERSION)
                return Loaded(state, snapshot.seq, tail, misses, segments)
            reason = reason or "the log does not continue right after it"
        misses.append(f"snapshot at seq {snapshot.seq}: {reason}")
        METRICS.count("snapshot_misses", schema_version=snapshot.schema_version)
        log.info("run %s: snapshot at seq %d not used: %s", run_id, snapshot.seq, reason)
    state = RunState()
    replayed = _fold_tail(store, run_id, state)
    assert replayed is not None  # an empty state continues any log
    return Loaded(state, 0, replayed, misses)


def _newest_first(store: Store, run_id: str) -> Iterator[Snapshot]:
    """The run's snapshots, newest first; older bodies are read only if the newest fails."""
    newest = store.snapshots(run_id, limit=1)
    yield from newest
    if newest:
        yield from store.snapshots(run_id)[1:]


def _fold_tail(store: Store, run_id: str, state: RunState) -> int | None:
    """Fold the events after ``state`` into it; None (state untouched) on a gap."""
    started = time.perf_counter()
    after = state.last_seq
    events = list(store.read(run_id, after_seq=after))
    if (events and events[0].seq != after + 1) or (not events and after
                                                   and store.last_seq(run_id) != after):
        return None
    for event in events:  # (load_state holds the GC off)
        apply(state, event)
    METRICS.count("events_replayed", len(events), schema_version=SCHEMA_VERSION)
    METRICS.time("replay_duration_ms", (time.perf_counter() - started) * 1000,
                 schema_version=SCHEMA_VERSION)
    return len(events)


# --- the equivalence gate ----------------------------------------------------------


class Mismatch(msgspec.Struct, frozen=True):
    check: str  # "determinism" | "snapshot" | "outline"
    seq: int
    fields: list[str]
    snapshot_seq: int | None = None


class VerifyReport(msgspec.Struct, frozen=True):
    run_id: str
    events: int
    snapshots_checked: int
    mismatches: list[Mismatch]
    quarantined: list[int]
    corrupt_seq: int | None = None  # the first event that does not check out (digest, bytes)
    corrupt: str | None = None  # what is wrong with it

    @property
    def ok(self) -> bool:
        return not self.mismatches and self.corrupt_seq is None


def _differing(a: dict[str, object], b: dict[str, object]) -> list[str]:
    return sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))


def _read_to_damage(store: Store, run_id: str) -> tuple[list[Event], CorruptLogError | None]:
    """The run's events, up to the first damaged one (some backends stop before reading
    any), and the damage."""
    events: list[Event] = []
    try:
        events.extend(store.read(run_id))
    except CorruptLogError as exc:
        return events, exc
    return events, None


def _check_outline(store: Store, run_id: str, folded: RunState) -> list[Mismatch]:
    """The run's outline as the store serves it against the outline of the full fold; a
    difference is damage, and the outline is replaced by the fold's at once, so it is
    never served again."""
    fresh = outline(folded)
    served = store.outlines([run_id]).get(run_id)
    if isinstance(served, RunState):
        fields = differences(served, fresh)
        if not fields:
            return []
    else:  # unreadable: its bytes do not decode, or the run went missing from them
        fields = ["outline"]
    store.put_outline(run_id, fresh)
    return [Mismatch("outline", folded.last_seq, fields)]


def _wrong_tops(body: bytes, messages: list[Message]) -> list[str]:
    """["messages_tops"] if the body says a message segment's largest seq wrong (a reader
    of the latest messages would pass over some), else []."""
    form = _form_of(body)
    if form is None or not form.messages_tops:
        return []
    tops = [max(map(_SEQ, messages[start:start + SEGMENT]))
            for start in range(0, len(form.messages) * SEGMENT, SEGMENT)]
    return [] if tops == form.messages_tops else ["messages_tops"]


def verify(store: Store, run_id: str) -> VerifyReport:
    """Check the log's digest chain, determinism at every prefix, every snapshot and
    the run's outline against the full replay."""
    events, damage = _read_to_damage(store, run_id)
    # A snapshot checked against a damaged log would be blamed for the log's fault.
    snapshots = store.snapshots(run_id) if damage is None else []
    wanted = {s.seq for s in snapshots}
    first, second = RunState(), RunState()
    at_seq: dict[int, dict[str, object]] = {}
    mismatches: list[Mismatch] = []
    with gc_paused():
        for event in events:
            apply(first, event)
            apply(second, event)
            view = durable_fields(first)
            if fields := _differing(view, durable_fields(second)):
                mismatches.append(Mismatch("determinism", event.seq, fields))
            if event.seq in wanted:
                at_seq[event.seq] = view
    final = durable_fields(first)
    quarantined: set[int] = set()
    for snapshot in snapshots:
        state, _ = decode_snapshot(store, snapshot)
        if state is None or hashlib.sha256(snapshot.body).hexdigest() != snapshot.digest:
            continue  # unreadable snapshots are misses at load time, not wrong folds
        fields = _differing(durable_fields(state), at_seq.get(snapshot.seq, {}))
        fields += _wrong_tops(snapshot.body, state.messages)
        for event in events[snapshot.seq:]:
            apply(state, event)
        fields += [f"final.{f}" for f in _differing(durable_fields(state), final)]
        if fields:
            mismatches.append(Mismatch("snapshot", snapshot.seq, fields, snapshot.seq))
            METRICS.count("full_replay_equivalence_failures",
                          schema_version=snapshot.schema_version)
            store.quarantine(snapshot.fold_version,
                             f"run {run_id} snapshot at seq {snapshot.seq}: {', '.join(fields)}")
            quarantined.add(snapshot.fold_version)
    if damage is None and events:
        mismatches += _check_outline(store, run_id, first)
    return VerifyReport(run_id, len(events), len(snapshots), mismatches, sorted(quarantined),
                        damage.seq if damage else None, damage.detail if damage else None)
