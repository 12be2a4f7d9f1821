"""A LangGraph thread as a run's log: the events the checkpoint saver appends, and the
pure fold that indexes them. No LangGraph import: the CLI reads threads without it.

A thread is one run (``thread_run_id``). Three record-only event types hold it:

- ``graph_input``: an invocation's input, recorded before the graph runs, so a crash
  before LangGraph's first checkpoint does not lose it.
- ``graph_checkpoint``: one ``put``. Only the channels in ``new_versions`` get a value
  reference; the others are found by (namespace, channel, version) in earlier events.
- ``graph_writes``: one ``put_writes``: a task's writes against one checkpoint.

Values are LangGraph's serializer output (``(type, bytes)``), kept in *chunks* named by
the sha256 of their stored bytes. A chunk's bytes are in the first event that needs
them (``blobs``) and only referred to after: a value is stored once per thread, and the
log alone (archived, restored, forked) holds everything. A list (a message history) is
cut into chunks of ``CHUNK`` items, so a step that appends a message writes the last
chunk again, not the list. A value under ``INLINE`` bytes sits in its reference.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import zlib
from collections.abc import Callable, Collection, Container, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from ..errors import CorruptLogError, InvalidRunIdError
from ..events import Event, EventType
from ..store import Store

#: Items per chunk of a list value: a step rewrites at most this many.
CHUNK = 16
#: A list value's reference names only the chunks changed since the channel's last
#: version, except every DELTAS-th, which names them all (bounding a read's walk back).
DELTAS = 64
#: A value (or write) whose stored bytes are fewer sits in its reference, not a chunk.
INLINE = 96
_LEVEL = 6
_ZLIB = 0x78

Typed = tuple[str, bytes]  # what a LangGraph serializer's dumps_typed returns
#: A list value's items as one msgpack array (LangGraph's serializer reads it in one
#: call); per chunk, where its items start in it, and how many items come before it
#: (one more entry each: where the last ends, how many in all).
Joined = tuple[bytes | memoryview, list[int], list[int]]


def thread_run_id(thread_id: str, generation: int = 1) -> str:
    """The run holding ``thread_id``: thread ids are any strings, run ids are not. A
    thread deleted (``delete_thread``) starts again in the next generation."""
    digest = hashlib.sha256(thread_id.encode()).hexdigest()[:24]
    return f"lg-{digest}" if generation == 1 else f"lg-{digest}.g{generation}"


#: What the tombstone of a thread removed by ``delete_thread`` names as its archive:
#: none. The thread id starts again in the run of the next generation.
DELETED = "langgraph:delete_thread"


def thread_run(store: Store, name: str) -> str | None:
    """The run ``name`` names: a run id, or else a LangGraph thread id (its current
    generation); None when neither holds events."""
    with contextlib.suppress(InvalidRunIdError):
        if store.last_seq(name):
            return name
    generation = 1
    while True:
        run_id = thread_run_id(name, generation)
        stone = store.tombstone(run_id)
        if stone is None or stone.archive != DELETED:
            return run_id if store.last_seq(run_id) or stone is not None else None
        generation += 1


def thread_view(events: Sequence[Event]) -> dict[str, Any] | None:
    """What ``agentjournal show`` says of a thread (None: the run is not one)."""
    if not events or thread_of(events[0]) is None:
        return None
    index = GraphIndex()
    index.apply_all(events)
    records = sorted((r for cps in index.checkpoints.values() for r in cps.values()),
                     key=lambda r: r.seq)
    latest = records[-1] if records else None
    return {
        "thread_id": index.thread_id,
        "checkpoints": len(records),
        "namespaces": sorted(index.checkpoints),
        "writes": sum(len(w) for w in index.writes.values()),
        "latest": None if latest is None else {
            "id": latest.id, "ns": latest.ns, "step": latest.step, "source": latest.source,
            "seq": latest.seq, "pending_writes": sorted(
                w.channel for w in index.writes.get((latest.ns, latest.id), {}).values())},
        "input_not_yet_checkpointed": index.pending_input is not None,
        "stored_value_bytes": sum(len(b) * 3 // 4 for b in index.cache.values()),
    }


def join_chunks(chunks: Sequence[Sequence[Typed]]) -> Joined | None:
    """A list's chunks' items as one msgpack array, and where each chunk's items start
    (None: an item is not msgpack)."""
    parts, offsets, counts = [], [5], [0]
    for items in chunks:
        for kind, data in items:
            if kind != "msgpack":
                return None
            parts.append(data)
        offsets.append(offsets[-1] + sum(len(data) for _, data in items))
        counts.append(counts[-1] + len(items))
    return _array(counts[-1], parts), offsets, counts


def _array(count: int, parts: Sequence[bytes | memoryview]) -> bytes:
    return b"".join([b"\xdd", count.to_bytes(4, "big"), *parts])  # msgpack array 32


def _shared(a: Sequence[str], b: Sequence[str]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _raw(stored: str | bytes) -> bytes:
    return stored if isinstance(stored, bytes) else unb64(stored)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unb64(text: str) -> bytes:
    return binascii.a2b_base64(text)  # (base64.b64decode checks its input in Python: slow)


def pack_chunk(items: Sequence[Typed]) -> bytes:
    """Serialized items as stored: msgpack, zlib-compressed when that is smaller."""
    raw = msgspec.msgpack.encode([[t, data] for t, data in items])
    packed = zlib.compress(raw, _LEVEL)
    return packed if len(packed) < len(raw) else raw


def unpack_chunk(stored: bytes) -> list[Typed]:
    raw = zlib.decompress(stored) if stored[:1] == bytes([_ZLIB]) else stored
    return [(t, bytes(data)) for t, data in msgspec.msgpack.decode(raw)]


def chunk_name(stored: bytes | memoryview) -> str:
    return hashlib.sha256(stored).hexdigest()[:32]


class Blobs:
    """The chunks a batch of events adds: ``add`` returns a chunk's reference, and
    keeps its bytes only if the thread's log does not hold them yet."""

    def __init__(self, known: Container[str]) -> None:
        self.known, self.new = known, {}  # type: Container[str], dict[str, str]

    def add(self, stored: bytes) -> str:
        name = chunk_name(stored)
        if name not in self.known and name not in self.new:
            self.new[name] = b64(stored)
        return name

    def value(self, items: Sequence[Typed]) -> dict[str, Any]:
        """The reference of one value (a single item)."""
        stored = pack_chunk(items)
        if len(stored) < INLINE:
            return {"i": b64(stored)}
        return {"c": [self.add(stored)]}


class CheckpointRecord(msgspec.Struct, array_like=True):
    """One ``put``, as the index keeps it (values stay references until read)."""

    ns: str
    id: str
    parent_id: str | None
    seq: int
    checkpoint_b64: list[str]  # (type, base64): the checkpoint without its channel values
    metadata_b64: list[str]  # (type, base64); decoded when read, not at every replay
    source: str | None
    step: int | None
    #: The channels this put gave a value: channel -> [version, reference].
    values: dict[str, Any] = msgspec.field(default_factory=dict)

    @property
    def checkpoint(self) -> Typed:
        return self.checkpoint_b64[0], unb64(self.checkpoint_b64[1])

    @property
    def metadata(self) -> Typed:
        return self.metadata_b64[0], unb64(self.metadata_b64[1])


class WriteRecord(msgspec.Struct, array_like=True):
    task_id: str
    channel: str
    ref: dict[str, Any]
    task_path: str
    seq: int


@dataclass
class GraphIndex:
    """The fold of a thread's log: what get_tuple and list read. Pure: the same events
    give the same index, so every process reading the log agrees."""

    last_seq: int = 0
    run_id: str = ""
    thread_id: str | None = None
    finished: bool = False
    #: The graph versions that started the thread and then continued it (each once in a
    #: row), as the run's state folds them (``RunState.versions``).
    versions: list[str] = field(default_factory=list)
    #: The input of the newest invocation whose input checkpoint is not in the log yet.
    pending_input: Typed | None = None
    #: Chunk name -> the seq of the event that holds its bytes (read when needed).
    chunks: dict[str, int] = field(default_factory=dict)
    checkpoints: dict[str, dict[str, CheckpointRecord]] = field(default_factory=dict)
    #: (namespace, channel, version) -> the reference first stored under it.
    values: dict[tuple[str, str, Any], dict[str, Any]] = field(default_factory=dict)
    #: The versions stored again with another value (a time-travel fork gives a channel
    #: a version another branch used): each checkpoint's is found through its parents.
    clashes: set[tuple[str, str, Any]] = field(default_factory=set)
    writes: dict[tuple[str, str], dict[tuple[str, int], WriteRecord]] = field(
        default_factory=dict)
    #: Chunk bytes at hand (base64 as an event holds them, or bytes): what this process
    #: folded or read. Not part of the fold: ``load`` reads the others when needed.
    cache: dict[str, str | bytes] = field(default_factory=dict, compare=False, repr=False)
    #: A head's: how many checkpoints each namespace holds in the log (a head keeps the
    #: newest few; empty in a whole index).
    sizes: dict[str, int] = field(default_factory=dict)
    #: List values at hand, joined (a head view's), by their chunks' names.
    joined: dict[tuple[str, ...], Joined] = field(default_factory=dict, compare=False,
                                                  repr=False)
    #: Reads the events at the given seqs of the thread's log (None: nothing more to read).
    load: Callable[[Collection[int]], Iterable[Event]] | None = field(
        default=None, compare=False, repr=False)

    def apply(self, event: Event) -> None:
        rule = _RULES.get(event.type)
        if rule is not None:
            rule(self, event)
        self.run_id, self.last_seq = event.run_id, event.seq

    def apply_all(self, events: Iterable[Event]) -> None:
        for event in events:
            self.apply(event)

    def checkpoint_count(self) -> int:
        return sum(len(cps) for cps in self.checkpoints.values())

    def read_value(self, ref: dict[str, Any]) -> list[Typed] | None:
        """The items a reference names (None: the channel was empty at that version):
        ``{"e": 1}`` empty, ``{"i": b64}`` one value inline, ``{"c": [name]}`` one value
        in a chunk, ``{"l": [names]}`` a list's items in chunks."""
        if "e" in ref:
            return None
        if "i" in ref:
            return unpack_chunk(unb64(ref["i"]))
        items: list[Typed] = []
        for stored in self.chunk_bytes(ref["c"]):
            items.extend(unpack_chunk(stored))
        return items

    def list_array(self, names: Sequence[str]) -> bytes | memoryview | None:
        """A list value's items as one msgpack array (None: an item is not msgpack)."""
        done = self.join_list(names)
        return None if done is None else done[0]

    def join_list(self, names: Sequence[str]) -> Joined | None:
        """A list value joined (None: an item is not msgpack): the chunks it shares
        with a joined list at hand taken from that one's bytes, the others unpacked."""
        start, offsets, counts = 0, [5], [0]
        data: bytes | memoryview = b""
        for key, (whole, at, before) in self.joined.items():
            shared = _shared(key, names)
            if shared == len(key) == len(names):
                return whole, at, before  # (this very list)
            if shared > start:
                start, data, offsets, counts = shared, whole, at, before
        rest = join_chunks([unpack_chunk(stored) for stored in self.chunk_bytes(names[start:])])
        if rest is None:
            return None
        tail, at, before = rest
        shift = offsets[start] - 5
        return (_array(counts[start] + before[-1], [data[5:offsets[start]], tail[5:]]),
                offsets[:start] + [shift + x for x in at],
                counts[:start] + [counts[start] + n for n in before])

    def chunk_bytes(self, names: Sequence[str]) -> list[bytes]:
        """The stored bytes of the named chunks, the missing ones read from the log (one
        read per run of consecutive seqs)."""
        missing = {self._seq_of(name) for name in names if name not in self.cache}
        if missing:
            if self.load is None:
                raise CorruptLogError(self.run_id, min(missing), "a chunk's event is not read")
            for event in self.load(sorted(missing)):
                for name, text in event.payload.get("blobs", {}).items():
                    self.cache.setdefault(name, text)
        return [_raw(self._cached(name)) for name in names]

    def _seq_of(self, name: str) -> int:
        seq = self.chunks.get(name)
        if seq is None:
            raise CorruptLogError(self.run_id, self.last_seq, f"no event holds chunk {name}")
        return seq

    def _cached(self, name: str) -> str | bytes:
        text = self.cache.get(name)
        if text is None:
            raise CorruptLogError(self.run_id, self.chunks[name], (
                f"event {self.chunks[name]} does not hold chunk {name}"))
        return text

    def sole(self, ns: str, channel: str, version: Any) -> bool:
        """Whether one value was stored under the version (a change may be based on it)."""
        key = (ns, channel, version)
        return key in self.values and key not in self.clashes

    def ref_of(self, record: CheckpointRecord, channel: str,
               version: Any) -> dict[str, Any] | None:
        """The reference of ``channel``'s value at ``version`` in ``record``: the one
        stored under the version, or, when several were, the one the checkpoint put or
        inherited from its parents."""
        key = (record.ns, channel, version)
        if key in self.clashes and (own := self._inherited(record, channel, version)):
            return own
        return self.values.get(key)

    def _inherited(self, record: CheckpointRecord, channel: str,
                   version: Any) -> dict[str, Any] | None:
        seen: set[str] = set()
        node: CheckpointRecord | None = record
        while node is not None and node.id not in seen:  # (a parent cycle ends the walk)
            seen.add(node.id)
            if channel in node.values:
                given, ref = node.values[channel]
                return ref if given == version else None
            node = self.checkpoints[node.ns].get(node.parent_id or "")
        return None

    def list_names(self, record: CheckpointRecord, channel: str,
                   ref: dict[str, Any]) -> list[str]:
        """The chunk names of a list value: ``{"l": names}``, or ``{"d": [base, keep,
        added]}``, the first ``keep`` names of the same channel's value first stored
        under version ``base``, and then ``added`` (the writer sends a whole list every
        DELTAS, and bases a change only on a version that names one value)."""
        chain = []
        bases: set[Any] = set()
        while "d" in ref:
            base, keep, added = ref["d"]
            if base in bases:  # never written so: a read must end, not grow forever
                raise CorruptLogError(self.run_id, record.seq, (
                    f"channel {channel!r}'s value at version {base!r} is built on itself"))
            bases.add(base)
            chain.append((keep, added))
            ref = self.values[(record.ns, channel, base)]
        names: list[str] = list(ref["l"])
        for keep, added in reversed(chain):
            names = names[:keep] + added
        return names

    def read_list(self, record: CheckpointRecord, channel: str,
                  ref: dict[str, Any]) -> list[Typed]:
        return self.read_value({"c": self.list_names(record, channel, ref)}) or []


def thread_of(started: Event) -> str | None:
    """The thread id a run's ``run_started`` names, if the run is a LangGraph thread."""
    p = started.payload
    given = p.get("input")
    if p.get("agent") != "langgraph" or not isinstance(given, dict):
        return None
    return str(given.get("thread_id"))


def _started(ix: GraphIndex, ev: Event) -> None:
    ix.thread_id = thread_of(ev)
    _versioned(ix, ev)


def _versioned(ix: GraphIndex, ev: Event) -> None:
    version = ev.payload.get("agent_version")
    if version and (not ix.versions or ix.versions[-1] != version):
        ix.versions.append(version)


def _input(ix: GraphIndex, ev: Event) -> None:
    if (given := ev.payload.get("input")) is not None:
        ix.pending_input = (given[0], unb64(given[1]))  # (one per invocation: small)


def _blobs(ix: GraphIndex, ev: Event) -> None:
    for name, text in ev.payload.get("blobs", {}).items():
        ix.chunks.setdefault(name, ev.seq)  # (a chunk stored again: the first holds it)
        ix.cache.setdefault(name, text)


def _checkpoint(ix: GraphIndex, ev: Event) -> None:
    p = ev.payload
    _blobs(ix, ev)
    ns = p["ns"]
    cp, md = p["checkpoint"], p["metadata"]
    values = p.get("values", {})
    ix.checkpoints.setdefault(ns, {})[p["id"]] = CheckpointRecord(
        ns=ns, id=p["id"], parent_id=p.get("parent_id"), seq=ev.seq,
        checkpoint_b64=cp, metadata_b64=md,
        source=p.get("source"), step=p.get("step"), values=values)
    for channel, (version, ref) in values.items():
        key = (ns, channel, version)
        stored = ix.values.setdefault(key, ref)
        if stored is not ref and stored != ref:
            ix.clashes.add(key)  # another value under a stored version: not overwritten
    if p.get("source") == "input":
        ix.pending_input = None
    ix.writes.pop((ns, p["id"]), None)  # a checkpoint put again starts with no writes


def _writes(ix: GraphIndex, ev: Event) -> None:
    p = ev.payload
    _blobs(ix, ev)
    stored = ix.writes.setdefault((p["ns"], p["checkpoint_id"]), {})
    for idx, channel, ref in p["writes"]:
        key = (p["task_id"], idx)
        if idx >= 0 and key in stored:
            continue  # LangGraph's rule: an ordinary write is kept once, a special replaced
        stored[key] = WriteRecord(p["task_id"], channel, ref, p.get("task_path", ""), ev.seq)


def _finished(ix: GraphIndex, ev: Event) -> None:
    ix.finished = True


def _resumed(ix: GraphIndex, ev: Event) -> None:
    _versioned(ix, ev)
    if ev.payload.get("reopened"):
        ix.finished = False


_RULES = {
    EventType.RUN_STARTED: _started,
    EventType.GRAPH_INPUT: _input,
    EventType.GRAPH_CHECKPOINT: _checkpoint,
    EventType.GRAPH_WRITES: _writes,
    EventType.RUN_FINISHED: _finished,
    EventType.RUN_RESUMED: _resumed,
}


def summary(event: Event) -> str:
    """One line for a graph event, for ``agentjournal events`` and ``show``: never the
    values' bytes."""
    p = event.payload
    ns = f" ns={p['ns']!r}" if p.get("ns") else ""
    if event.type is EventType.GRAPH_CHECKPOINT:
        channels = ",".join(sorted(p.get("values", {}))) or "-"
        return (f"checkpoint {p['id']}{ns} source={p.get('source')} step={p.get('step')} "
                f"updated={channels} new_bytes={_blob_bytes(p)}")
    if event.type is EventType.GRAPH_WRITES:
        channels = ",".join(w[1] for w in p["writes"])
        return (f"writes task={p['task_id']}{ns} on {p['checkpoint_id']} channels={channels} "
                f"new_bytes={_blob_bytes(p)}")
    if event.type is EventType.GRAPH_INPUT:
        return f"input ({p['input'][0]}, {len(unb64(p['input'][1]))} bytes)"
    return str(event.type)


def _blob_bytes(payload: dict[str, Any]) -> int:
    return sum(len(text) * 3 // 4 for text in payload.get("blobs", {}).values())
