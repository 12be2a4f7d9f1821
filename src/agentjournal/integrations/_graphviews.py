"""A LangGraph thread's head kept beside its log as a view (``store.put_view``), so a
process that has not seen the thread reads its newest checkpoints without folding the
whole log.

The head (``langgraph-head``): the newest checkpoints of each namespace (KEEP of the
root one's: get_tuple's answer and list's first page), their pending writes, their
values' references resolved to their chunks and those chunks' bytes, the newest
message list joined into one msgpack array (LangGraph's serializer reads it in one
call, as SqliteSaver reads its checkpoint), and how many checkpoints each namespace
holds. The writer stores it when it comes to rest (``release``, ``close``): its size
is the thread's state, as one SqliteSaver row is, replaced in place.

A cache: derived from the log only, rebuilt from it at any time
(:func:`rebuild_thread_index`), checked against a fresh fold
(:func:`check_thread_index`). It records the seq it is folded to; a reader folds the
events after it, and when any of them is a checkpoint or a write, does not use it (the
log is folded). A head that does not decode, is past the log's end or holds a chunk its
bytes do not match is not used either. (A whole index kept the same way was tried: its
size grew with every checkpoint, half again the log's bytes per step.)
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any

import msgspec

from ..events import Event, EventType
from ..store import Store
from ._graphlog import (
    CheckpointRecord,
    GraphIndex,
    WriteRecord,
    chunk_name,
    thread_of,
)

HEAD = "langgraph-head"
#: The view's encoding; a view of another format is not used (the log is folded).
FORMAT = 3
#: Checkpoints a head keeps of the root namespace (list's first page), newest first.
KEEP = 10
#: What a head cannot answer from: events that add a checkpoint or a write.
_GRAPH = frozenset({EventType.GRAPH_CHECKPOINT, EventType.GRAPH_WRITES})

Versions = Callable[[CheckpointRecord], Mapping[str, Any] | None]


class _Body(msgspec.Struct, array_like=True):
    format: int
    last_seq: int
    run_id: str
    thread_id: str | None
    finished: bool
    versions: list[str]
    pending_input: tuple[str, bytes] | None
    chunks: dict[str, int]
    checkpoints: list[CheckpointRecord]
    #: A list's chunk names as the longest prefix it shares with an earlier list here,
    #: and the rest (``{"b": [at, shared], "l": rest}``, see _shorter): the newest
    #: checkpoints' message lists differ in their last chunks only.
    values: list[tuple[str, str, Any, dict[str, Any]]]
    clashes: list[tuple[str, str, Any]]
    writes: list[tuple[str, str, list[tuple[int, WriteRecord]]]]
    sizes: dict[str, int]  # (a head's)
    held: dict[str, bytes]  # chunk bytes (the head's), checked against their names on read
    #: The head's list values whose items are all msgpack, each as one msgpack array
    #: (LangGraph's serializer reads it in one call), by the key its reference names
    #: (``{"l": names, "j": key}``, key the sha name of the array). Checked by
    #: check_thread_index, not on every read (megabytes to hash). Stored as bytes, not
    #: as the array itself: a decoder skips bytes by their length, an array item by item.
    joined: dict[str, memoryview]  # (read in place: megabytes, not copied)


class _Format(msgspec.Struct, array_like=True):
    format: int  # (what a body that is not this format's says it is)


_DECODER = msgspec.msgpack.Decoder(_Body)
_FORMAT = msgspec.msgpack.Decoder(_Format)
_ENCODER = msgspec.msgpack.Encoder()


def encode_index(ix: GraphIndex) -> bytes:
    """``ix`` as a view's body, with the chunk bytes and joined lists a head holds."""
    return _ENCODER.encode(_Body(
        format=FORMAT, last_seq=ix.last_seq, run_id=ix.run_id, thread_id=ix.thread_id,
        finished=ix.finished, versions=ix.versions, pending_input=ix.pending_input,
        chunks=ix.chunks,
        checkpoints=[r for cps in ix.checkpoints.values() for r in cps.values()],
        values=_shorter(ix.values),
        clashes=sorted(ix.clashes, key=repr),
        writes=[(ns, cid, [(idx, w) for (_, idx), w in ws.items()])
                for (ns, cid), ws in ix.writes.items()],
        sizes=ix.sizes,
        held={name: raw for name, raw in ix.cache.items() if isinstance(raw, bytes)}
        if ix.sizes else {},
        joined={ref["j"]: memoryview(ix.joined[tuple(ref["l"])][0])
                for ref in ix.values.values() if "j" in ref}))


def decode_index(body: bytes) -> GraphIndex:
    """A view's body as the index it holds (``ValueError``: not a body this release
    wrote, or one whose held chunks do not match their names)."""
    try:
        b = _DECODER.decode(body)
        values = _longer(b.values)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ValueError(_not_ours(body, exc)) from None
    if b.format != FORMAT:
        raise ValueError(f"a LangGraph index of format {b.format}, not {FORMAT}")
    for name, stored in b.held.items():
        if chunk_name(stored) != name:
            raise ValueError(f"chunk {name} does not hold its bytes")
    ix = GraphIndex(last_seq=b.last_seq, run_id=b.run_id, thread_id=b.thread_id,
                    finished=b.finished, versions=b.versions,
                    pending_input=b.pending_input, chunks=b.chunks, sizes=b.sizes)
    for r in b.checkpoints:
        ix.checkpoints.setdefault(r.ns, {})[r.id] = r
    ix.values = values
    ix.clashes = {(ns, ch, v) for ns, ch, v in b.clashes}
    ix.writes = {(ns, cid): {(w.task_id, idx): w for idx, w in ws} for ns, cid, ws in b.writes}
    ix.cache.update(b.held)
    for ref in ix.values.values():
        if "j" in ref and ref["j"] in b.joined:
            ix.joined[tuple(ref["l"])] = (b.joined[ref["j"]], ref["o"], ref["n"])
    return ix


def _not_ours(body: bytes, exc: Exception) -> str:
    try:
        found = _FORMAT.decode(body).format  # (a body's first field, whatever its release)
    except (msgspec.DecodeError, msgspec.ValidationError):
        found = FORMAT
    if found != FORMAT:
        return f"a LangGraph index of format {found}, not {FORMAT}"
    return f"not a LangGraph index: {exc}"


def _shorter(values: Mapping[tuple[str, str, Any], dict[str, Any]]
             ) -> list[tuple[str, str, Any, dict[str, Any]]]:
    """``values`` as a body holds them: each list's names after the first as the
    longest prefix they share with an earlier list's, and the rest (a head's KEEP
    message lists would otherwise name the same chunks KEEP times: a tenth of its
    bytes, and most of its decoding, at 10,000 steps)."""
    rows: list[tuple[str, str, Any, dict[str, Any]]] = []
    lists: list[tuple[int, list[str]]] = []  # (row, names) of the lists before
    for (ns, ch, v), ref in values.items():
        if "l" in ref:
            names = ref["l"]
            at, shared = max(((row, _common(prev, names)) for row, prev in lists),
                             key=lambda found: found[1], default=(0, 0))
            lists.append((len(rows), names))
            if shared:
                ref = {**ref, "b": [at, shared], "l": names[shared:]}
        rows.append((ns, ch, v, ref))
    return rows


def _longer(rows: list[tuple[str, str, Any, dict[str, Any]]]
            ) -> dict[tuple[str, str, Any], dict[str, Any]]:
    """The values a body's rows hold (see _shorter); ValidationError for a list
    named on a row that is not an earlier list's."""
    values = {}
    for n, (ns, ch, v, ref) in enumerate(rows):
        if "b" in ref:
            found = ref.pop("b")
            at, shared = found if isinstance(found, list) and len(found) == 2 else (-1, 0)
            base = rows[at][3].get("l") if isinstance(at, int) and 0 <= at < n else None
            rest = ref.get("l")
            if not (isinstance(base, list) and isinstance(rest, list)
                    and isinstance(shared, int) and 0 < shared <= len(base)):
                raise msgspec.ValidationError(f"value {n} is based on no list: {at!r}")
            ref["l"] = base[:shared] + rest
        values[(ns, ch, v)] = ref
    return values


def _common(a: list[str], b: list[str]) -> int:
    """How many names ``a`` and ``b`` start with in common (compared a slice at a
    time: a list names a thousand chunks at 10,000 steps)."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        mid = (low + high + 1) // 2
        if a[:mid] == b[:mid]:
            low = mid
        else:
            high = mid - 1
    return low


# --- the head: what get_tuple of the newest checkpoint reads ----------------------------

_PLAIN = msgspec.msgpack.Decoder(ext_hook=lambda code, data: None)


def plain_versions(record: CheckpointRecord) -> Mapping[str, Any] | None:
    """A checkpoint's ``channel_versions`` read without its serializer, for a checkpoint
    LangGraph's default serializer wrote (msgpack, or json); None for any other
    (an encrypted one): such a thread has no head."""
    kind, data = record.checkpoint
    try:
        if kind == "msgpack":
            found = _PLAIN.decode(data).get("channel_versions")
        elif kind == "json":
            found = json.loads(data).get("channel_versions")
        else:
            return None
    except (msgspec.DecodeError, ValueError, AttributeError):
        return None
    return found if isinstance(found, dict) else None


def head_of(ix: GraphIndex, versions: Versions = plain_versions) -> GraphIndex | None:
    """The head of ``ix``: the newest checkpoints (by id, as get_tuple and list order
    them) of each namespace, KEEP of the root one's and one of every other's, each
    with its writes and its values' references resolved (a list's chunks named in full,
    a fork's value as the checkpoint sees it), and how many each namespace holds
    (``sizes``). The newest list of msgpack items of a namespace is also joined
    (``{"l": names, "j": key, "o": offsets, "n": counts}``; the array's bytes in the
    body under ``key``, their sha name); the others' chunks are held but the ones they
    share with it. None when a checkpoint's versions cannot be read without its
    serializer."""
    head = GraphIndex(last_seq=ix.last_seq, run_id=ix.run_id, thread_id=ix.thread_id,
                      finished=ix.finished, versions=list(ix.versions),
                      pending_input=ix.pending_input)
    for ns, cps in ix.checkpoints.items():
        head.sizes[ns] = len(cps)
        for n, cid in enumerate(sorted(cps, reverse=True)[:KEEP if ns == "" else 1]):
            refs = _refs(ix, cps[cid], versions, join=n == 0)
            if refs is None:
                return None
            if any(not _same(head.values.get(key, ref), ref) for key, ref in refs.items()):
                break  # (a version with another value here: a fork; keep the newer)
            _keep(ix, head, cps[cid], refs)
    covered = {name for names in head.joined for name in names}
    held = [name for name in head.chunks if name not in covered]
    head.cache.update(zip(held, ix.chunk_bytes(held), strict=True))
    ix.joined = dict(head.joined)  # (the next head's lists start from these)
    return head


def _refs(ix: GraphIndex, record: CheckpointRecord, versions: Versions,
          join: bool) -> dict[tuple[str, str, Any], dict[str, Any]] | None:
    found = versions(record)
    if found is None:
        return None
    refs = {}
    for channel, version in found.items():
        ref = ix.ref_of(record, channel, version)
        if ref is not None and ("l" in ref or "d" in ref):
            ref = {"l": ix.list_names(record, channel, ref)}
        if ref is not None:
            refs[(record.ns, channel, version)] = ref
    if join:  # (the first list of msgpack items: a message history)
        for ref in refs.values():
            if "l" in ref and _joined(ix, ref):
                break
    return refs


def _joined(ix: GraphIndex, ref: dict[str, Any]) -> bool:
    """Join the list ``ref`` names into ``ref`` (False: not all msgpack)."""
    done = ix.join_list(ref["l"])
    if done is None:
        return False
    whole, ref["o"], ref["n"] = done
    ref["j"] = chunk_name(whole)
    ix.joined[tuple(ref["l"])] = done
    return True


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a.get("l") == b.get("l") if "l" in a else a == b


def _keep(ix: GraphIndex, head: GraphIndex, record: CheckpointRecord,
          refs: dict[tuple[str, str, Any], dict[str, Any]]) -> None:
    head.checkpoints.setdefault(record.ns, {})[record.id] = record
    for key, ref in refs.items():
        head.values.setdefault(key, ref)
        if "j" in ref:
            head.joined[tuple(ref["l"])] = ix.joined[tuple(ref["l"])]
    writes = ix.writes.get((record.ns, record.id))
    if writes is not None:
        head.writes[(record.ns, record.id)] = writes
    named = [n for ref in refs.values() for n in ref.get("l", ref.get("c", ()))]
    named += [n for w in (writes or {}).values() for n in w.ref.get("c", ())]
    for name in named:
        head.chunks[name] = ix.chunks[name]


# --- stored, read, checked, rebuilt -------------------------------------------------------


def store_head(store: Store, head: GraphIndex) -> None:
    """Store ``head`` as the thread's head view, at its seq."""
    store.put_view(head.run_id, HEAD, head.last_seq, encode_index(head))


def reader(store: Store, run_id: str) -> Callable[[Collection[int]], Iterator[Event]]:
    """What an index reads chunk-holding events with: one read per run of seqs."""
    def load(seqs: Collection[int]) -> Iterator[Event]:
        ordered = sorted(seqs)
        start = 0
        while start < len(ordered):
            end = start
            while end + 1 < len(ordered) and ordered[end + 1] == ordered[end] + 1:
                end += 1
            yield from store.read(run_id, ordered[start] - 1, upto=ordered[end])
            start = end + 1
    return load


def _view(store: Store, run_id: str, name: str, last_seq: int) -> GraphIndex | None:
    stored = store.view(run_id, name)
    if stored is None or not 0 < stored[0] <= last_seq:
        return None
    try:
        ix = decode_index(stored[1])
    except ValueError:
        return None
    if ix.last_seq != stored[0] or ix.run_id != run_id:
        return None
    ix.load = reader(store, run_id)
    return ix


def load_index(store: Store, run_id: str) -> GraphIndex:
    """The thread's index as of now: a fold of its log, with the values its head holds
    at hand (chunks checked against their names: valid whatever the head's seq)."""
    ix = GraphIndex(load=reader(store, run_id))
    if (head := _view(store, run_id, HEAD, store.last_seq(run_id))) is not None:
        ix.cache.update(head.cache)
        ix.joined.update(head.joined)
    ix.apply_all(store.read(run_id))
    return ix


def load_head(store: Store, run_id: str) -> GraphIndex | None:
    """The thread's head as of now, or None when it has none, the log ends before it,
    or the log holds a checkpoint or a write after it (the head would be stale: the
    index answers)."""
    last = store.last_seq(run_id)
    head = _view(store, run_id, HEAD, last)
    if head is None or head.last_seq == last:
        return head  # (a head at the log's end: nothing after it to read)
    for event in store.read(run_id, after_seq=head.last_seq):
        if event.type in _GRAPH:
            return None
        head.apply(event)
    return head


def fold(store: Store, run_id: str, upto: int | None = None) -> GraphIndex:
    """A fresh fold of the thread's log (to ``upto``)."""
    ix = GraphIndex(load=reader(store, run_id))
    ix.apply_all(store.read(run_id, upto=upto) if upto is not None else store.read(run_id))
    return ix


def rebuild_thread_index(store: Store, run_id: str) -> None:
    """Fold the thread's log and store its views afresh (nothing for a run that is no
    LangGraph thread, or holds no events)."""
    first = next(iter(store.read(run_id, upto=1)), None) if store.last_seq(run_id) else None
    if first is None or thread_of(first) is None:
        return  # (read no further than the first event of a run that is no thread)
    ix = fold(store, run_id)
    head = head_of(ix)
    if head is None:  # (a head that cannot be rebuilt is never served again)
        store.put_view(run_id, HEAD, ix.last_seq, b"")
    else:
        store_head(store, head)


def check_thread_index(store: Store, run_id: str) -> list[str]:
    """How the thread's stored head differs from a fresh fold of its log, one line per
    difference (empty: they agree, or there is none)."""
    stored = store.view(run_id, HEAD)
    if stored is None or not stored[1]:  # (none, or put aside by a rebuild)
        return []
    seq, body = stored
    last = store.last_seq(run_id)
    if not 0 < seq <= last:
        return [f"{HEAD}: folded to seq {seq}, but the log ends at {last}"]
    try:
        got = decode_index(body)
    except ValueError as exc:
        return [f"{HEAD}: {exc}"]
    want = head_of(fold(store, run_id, upto=seq))
    if want is None:  # (checkpoints a serializer other than LangGraph's wrote)
        return [f"{HEAD}: its checkpoints cannot be read here; rebuild it"]
    return [f"{HEAD} (seq {seq}): {d}" for d in differences(got, want)]


def differences(got: GraphIndex, want: GraphIndex) -> list[str]:
    """What ``got`` says that ``want`` does not, field by field (for people)."""
    found = []
    for field in ("last_seq", "run_id", "thread_id", "finished", "versions",
                  "pending_input", "clashes", "sizes"):
        if getattr(got, field) != getattr(want, field):
            found.append(f"{field} is {getattr(got, field)!r}, the log says "
                         f"{getattr(want, field)!r}")
    found += _keyed("chunk", got.chunks, want.chunks)
    found += _keyed("value", got.values, want.values)
    found += _keyed("writes of", got.writes, want.writes)
    mine = {(ns, cid): r for ns, cps in got.checkpoints.items() for cid, r in cps.items()}
    theirs = {(ns, cid): r for ns, cps in want.checkpoints.items() for cid, r in cps.items()}
    found += _keyed("checkpoint", mine, theirs)
    for names, (whole, _, _) in got.joined.items():
        key = next((ref["j"] for ref in got.values.values() if ref.get("l") == list(names)
                    and "j" in ref), None)
        if key is not None and chunk_name(whole) != key:
            found.append(f"joined list {key} does not hold its bytes")
    return found


def _keyed(what: str, got: Mapping[Any, Any], want: Mapping[Any, Any]) -> list[str]:
    found = []
    for key in sorted(got.keys() | want.keys(), key=repr):
        if key not in want:
            found.append(f"{what} {key!r} is not in the log")
        elif key not in got:
            found.append(f"{what} {key!r} is missing")
        elif got[key] != want[key]:
            found.append(f"{what} {key!r} is {_short(got[key])}, the log says "
                         f"{_short(want[key])}")
    return found


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."

