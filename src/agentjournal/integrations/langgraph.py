"""LangGraph on agentjournal: ``JournalSaver``, a checkpoint saver over a run's log.

    from agentjournal import open_store
    from agentjournal.integrations.langgraph import JournalSaver, invoke

    saver = JournalSaver(open_store("sqlite:///runs.db"))
    graph = builder.compile(checkpointer=saver)
    invoke(graph, {"messages": [...]}, {"configurable": {"thread_id": "t-1"}})

A thread is a run (``thread_run_id``). Each ``put`` and each ``put_writes`` is one
atomic append fenced by the thread's lease epoch: a node's writes are never stored
without their checkpoint's place in the log or the reverse, and a second process
writing the same thread is refused (``LeaseHeldError`` while this one holds it,
``FencedError`` if it took the thread over meanwhile). The lease is taken at the
thread's first write (or by ``hold`` / ``invoke``, before the graph runs) and held
until ``release`` or ``close``.

Values are stored by ``_graphlog``'s rules: only the channels in ``new_versions``, in
content-addressed chunks in the log itself, a list cut into chunks so that a growing
message history costs a chunk per step, not the history.

Deploys (docs/versioning.md): a thread's run records the graph's version as it starts
and at each resume (``agent_version``: given to the saver, else a digest of the graph's
nodes, edges and tools). A thread resumed under changed code continues from its
checkpoint, its recorded model turns never asked again. A tool call the change left
unusable (uncertain, and its tool removed or renamed, or its identity fields, effect
class or arguments changed) stops the thread at an interrupt for a person, its run paused
with a reason naming the change; ``exactly_once(renamed=)`` maps a renamed tool, and
``JournalSaver(strict=True)`` refuses such a thread instead. ``graph_shape`` describes a
graph for ``agentjournal check --recorded-as langgraph``.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import dataclasses
import enum
import functools
import hashlib
import inspect
import json
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from ..bridge import Answer, BridgedRun, CodeChanged, open_run, reading_checked
from ..bridge import current_call as bridge_current_call
from ..deploys import DESCRIBERS, AgentShape, ToolShape, agent_shape, digest, model_identity
from ..errors import (
    ArchivedRunError,
    CallRefused,
    EncodingError,
    FencedError,
    JournalError,
    LeaseExpiredError,
    LeaseHeldError,
    LeaseReleasedError,
    MissingExtraError,
    NeedsPerson,
    ResultNotKeptError,
    RunMismatchError,
)
from ..events import Event, EventType, now
from ..journal import default_owner
from ..limits import checked_limit
from ..results import ResultNotEncodable, to_json
from ..settle import same_intent
from ..state import PendingCall
from ..steps import not_kept
from ..store import Store
from ..store.base import Tombstone, records_digest
from ..tools import Effect, Reconciler, ToolContext, ToolFailed
from ._graphlog import (
    CHUNK,
    DELETED,
    DELTAS,
    Blobs,
    CheckpointRecord,
    GraphIndex,
    b64,
    pack_chunk,
    thread_of,
    thread_run_id,
    unb64,
)
from ._graphviews import (
    head_of,
    load_head,
    load_index,
    plain_versions,
    store_head,
)

try:
    from langchain_core.messages import ToolMessage
    from langchain_core.messages.tool import ToolOutputMixin
    from langchain_core.runnables import RunnableConfig
    from langchain_core.tools import BaseTool
    from langgraph.checkpoint.base import (
        WRITES_IDX_MAP,
        BaseCheckpointSaver,
        ChannelVersions,
        Checkpoint,
        CheckpointMetadata,
        CheckpointTuple,
        get_checkpoint_id,
        get_checkpoint_metadata,
        writes_sort_key,
    )
    from langgraph.checkpoint.serde.base import SerializerProtocol
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
    from langgraph.config import get_config
    from langgraph.errors import GraphInterrupt
    from langgraph.prebuilt import ToolNode
    from langgraph.prebuilt.tool_node import ToolCallRequest
    from langgraph.pregel import Pregel
    from langgraph.types import Command, interrupt
    from pydantic import BaseModel, ValidationError
except ImportError as exc:  # pragma: no cover - exercised by the packaging test
    raise MissingExtraError("langgraph", "langgraph") from exc

__all__ = ["DELETED", "ExactlyOnce", "JournalSaver", "Thread", "ToolEffect", "agent_version",
           "ainvoke", "astream", "current_call", "exactly_once", "graph_shape", "invoke",
           "stream", "thread_run_id"]

AGENT = "langgraph"
_GRAPH = frozenset({EventType.GRAPH_CHECKPOINT, EventType.GRAPH_WRITES})


@dataclass
class ListValue:
    """A list value as last stored: its version, its chunks (the items, held so their
    identity stands, and the chunk's name) and how many references since the last that
    named every chunk."""

    version: Any
    chunks: list[tuple[tuple[Any, ...], str]]
    deltas: int


class Thread:
    """One thread as a saver knows it: its run id, the index of its log and, while this
    saver holds the thread's lease, its open run (the single writer, shared by the
    checkpoints and the tool calls)."""

    def __init__(self, thread_id: str, run_id: str) -> None:
        self.thread_id, self.run_id = thread_id, run_id
        self.index = GraphIndex()
        self.loaded = False  # whether the index was read (its view and the log after it)
        self.head_due = False  # a checkpoint or a write since the head view was stored
        self.run: BridgedRun | None = None
        self.version: str | None = None  # the graph version its run was opened with
        self.lock = threading.RLock()
        # Per (namespace, channel): the last list value this saver stored.
        self.lists: dict[tuple[str, str], ListValue] = {}

    def absorb(self, events: Sequence[Event]) -> None:
        for event in events:
            if event.seq > self.index.last_seq:
                self.index.apply(event)


@dataclass(frozen=True)
class _Query:
    """What ``list`` asks of a thread."""

    ns: str | None
    wanted: str | None
    before_id: str | None
    filter: dict[str, Any] | None
    limit: int | None


def _complete(index: GraphIndex, q: _Query, found: Sequence[CheckpointRecord]) -> bool:
    """Whether ``found`` is all ``q`` asks for. A whole index holds every checkpoint;
    a head holds the newest of each namespace (``sizes``: how many the log holds), so
    a checkpoint it lacks is older than all it holds: below the last one found, once
    the limit is reached, it cannot be among them."""
    scope = [q.ns] if q.ns is not None else builtins.list(index.sizes)
    lacking = [ns for ns in scope
               if index.sizes.get(ns, 0) > len(index.checkpoints.get(ns, {}))]
    if not index.sizes or not lacking or (q.wanted and q.ns is not None and found):
        return True  # (an id names one checkpoint of a namespace)
    if q.limit is None or len(found) < q.limit:
        return False
    return all(ns in index.checkpoints and min(index.checkpoints[ns]) <= found[-1].id
               for ns in lacking)


def _one_call_reads_many(serde: SerializerProtocol) -> bool:
    """Whether ``serde`` reads a msgpack array as its items read one by one: LangGraph's
    own serializer, its reading not overridden."""
    return isinstance(serde, JsonPlusSerializer) and (
        type(serde).loads_typed is JsonPlusSerializer.loads_typed)


def _same_full_chunk(before: tuple[Any, ...], now: tuple[Any, ...]) -> bool:
    return len(now) == CHUNK == len(before) and all(
        a is b for a, b in zip(before, now, strict=True))


@contextlib.contextmanager
def _naming(thread_id: str) -> Iterator[None]:
    """A lease error names the run (``lg-…``), which the caller never saw: say which
    thread it is, as the caller named it (the error's type and fields unchanged)."""
    try:
        yield
    except (LeaseHeldError, FencedError, LeaseExpiredError, LeaseReleasedError) as exc:
        named = f"LangGraph thread {thread_id!r}: "
        if not str(exc).startswith(named):
            exc.args = (named + str(exc), *exc.args[1:])
        raise


def _conf(config: RunnableConfig) -> tuple[str, str]:
    conf = config["configurable"]
    return str(conf["thread_id"]), str(conf.get("checkpoint_ns", ""))


class JournalSaver(BaseCheckpointSaver[str]):
    """A LangGraph checkpoint saver on an agentjournal ``Store`` (sqlite, postgres,
    jsonl): sync methods, and their ``a*`` twins run in a thread.

    ``owner``: who holds the threads' leases (default: this process). ``ttl``: the
    lease's time to live; a heartbeat renews it every ttl/3 while it is held.
    ``max_result_bytes``: a tool call's result over this many bytes (as the log would
    hold it) completes its call as "result not kept", its size and sha256 kept instead
    (None, the default: no limit). ``agent_version``: the version of the graph's code
    that a thread's run records as it starts, resumes or reopens (``invoke``, ``stream``:
    default derived from the graph, :func:`agent_version`; ``agentjournal show`` says
    which version started a thread and which continued it). ``strict``: an unfinished
    thread last run by another version is refused (``RunMismatchError``, nothing
    appended) instead of continued from its checkpoint (per invocation: ``invoke(...,
    strict=)``).
    """

    def __init__(self, store: Store, *, serde: SerializerProtocol | None = None,
                 owner: str | None = None, ttl: float = 30.0,
                 max_result_bytes: int | None = None,
                 agent_version: str | None = None, strict: bool = False) -> None:
        super().__init__(serde=serde)
        self.store = store
        self.agent_version, self.strict = agent_version, strict
        self.owner = owner or default_owner()
        self.ttl = ttl
        self.max_result_bytes = checked_limit("max_result_bytes", max_result_bytes)
        self._threads: dict[str, Thread] = {}
        self._lock = threading.Lock()

    # --- threads and their leases ----------------------------------------------------

    def thread(self, thread_id: str) -> Thread:
        """The thread's current run, its log read up to now (its index view, then the
        events after it). ``ArchivedRunError`` when gc archived it (``agentjournal
        restore`` brings it back)."""
        t = self._entry(thread_id)
        with t.lock:
            if not t.loaded:
                t.index = load_index(self.store, t.run_id)
                t.loaded = True
            elif t.run is None:
                t.absorb(list(self.store.read(t.run_id, after_seq=t.index.last_seq)))
        return t

    def _entry(self, thread_id: str, run_id: str | None = None) -> Thread:
        """The thread as this saver knows it, its log not read (``run_id``: its current
        run, when the caller knows it)."""
        with self._lock:
            t = self._threads.get(thread_id)
            if t is None:
                t = self._threads[thread_id] = Thread(
                    thread_id, run_id or self._current_run(thread_id))
            return t

    def _current_run(self, thread_id: str) -> str:
        generation = 1
        while True:
            run_id = thread_run_id(thread_id, generation)
            stone = self.store.tombstone(run_id)
            if stone is None:
                return run_id
            if stone.archive != DELETED:
                raise ArchivedRunError(run_id, stone.archive, stone.last_seq)
            generation += 1

    def hold(self, thread_id: str, *,
             opening: Sequence[tuple[EventType, dict[str, Any]]] = (),
             agent_version: str | None = None, strict: bool | None = None) -> BridgedRun:
        """Open the thread's run (if this saver has not): take its lease, start or resume
        it (``agentjournal.bridge.open_run``), and return it. ``LeaseHeldError`` when
        another process holds it. ``opening``: facts stored in the append that opens the
        thread's run, with its start or its resume (``run.opened``; empty when a finished
        thread's run is opened: nothing is appended then). ``agent_version``: the graph's
        version, recorded with the start or resume (default: the saver's). ``strict``
        (default: the saver's): see :class:`JournalSaver`."""
        t = self.thread(thread_id)
        with t.lock:
            if t.run is None:
                t.version = agent_version or self.agent_version
                self._refuse_another_version(t, self.strict if strict is None else strict)
                with _naming(thread_id):
                    run = open_run(self.store, t.run_id, agent=AGENT, owner=self.owner,
                                   ttl=self.ttl, input={"thread_id": thread_id},
                                   task=f"LangGraph thread {thread_id}", opening=opening,
                                   max_result_bytes=self.max_result_bytes,
                                   agent_version=t.version)
                try:  # the log as it is now that nobody else may write it
                    t.absorb(list(self.store.read(t.run_id, after_seq=t.index.last_seq)))
                except BaseException:
                    run.close()
                    raise
                t.run = run
            return t.run

    @staticmethod
    def _refuse_another_version(t: Thread, strict: bool) -> None:
        """Strict mode: an unfinished thread last run by another version is refused
        before anything is appended (the log as read just now)."""
        recorded = t.index.versions[-1] if t.index.versions else None
        if not strict or t.index.finished or None in (recorded, t.version) or (
                recorded == t.version):
            return  # (a version not given nor derived, as by graph.invoke: not judged)
        raise RunMismatchError(t.run_id, "agent version", recorded, t.version, advice=(
            f"LangGraph thread {t.thread_id!r} was last run by graph version {recorded!r} "
            f"and strict mode refuses {t.version!r}: resume it with the code that recorded "
            "it, or without strict mode (history is history: it continues from its "
            "checkpoint, and a call the change made unusable goes to a person)"))

    def release(self, thread_id: str) -> None:
        """Close the thread's run and release its lease, if this saver holds it."""
        t = self._threads.get(thread_id)
        if t is not None:
            with t.lock:
                self._drop(t)

    def _drop(self, t: Thread, *, keep: bool = True) -> None:
        """Close the thread's run (its lease released); then, ``keep``, store its head."""
        if t.run is not None:
            run, t.run = t.run, None
            run.close()
            if keep:
                self._keep_head(t)

    def _keep_head(self, t: Thread) -> None:
        """Store the thread's head view as the writer comes to rest, if a checkpoint or
        a write came since the last: a reader's get_tuple (and list's first page) of
        the newest checkpoints reads only the head."""
        if t.head_due and (head := head_of(t.index, plain_versions)) is not None:
            store_head(self.store, head)
        t.head_due = False

    def close(self) -> None:
        """Release every lease this saver holds (the store stays open: it is the caller's)."""
        for t in list(self._threads.values()):
            with t.lock:
                self._drop(t)

    def __enter__(self) -> JournalSaver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def append(self, thread_id: str, facts: list[tuple[EventType, dict[str, Any]]]) -> None:
        """Append ``facts`` to the thread's run in one atomic batch under its lease (a
        finished thread is reopened in the same batch)."""
        t = self.thread(thread_id)
        with t.lock:
            run = self.hold(thread_id)
            if t.index.finished:
                reopened = {"reopened": True, **(
                    {"agent_version": t.version} if t.version else {})}
                facts = [(EventType.RUN_RESUMED, reopened), *facts]
            try:
                with _naming(thread_id):
                    events = run.record(facts, redact=False)
            except FencedError:
                self._drop(t, keep=False)  # another process took the thread over: let go
                raise
            t.index.apply_all(events)
            t.head_due = t.head_due or any(e.type in _GRAPH for e in events)

    # --- BaseCheckpointSaver ----------------------------------------------------------

    def put(self, config: RunnableConfig, checkpoint: Checkpoint,
            metadata: CheckpointMetadata, new_versions: ChannelVersions) -> RunnableConfig:
        thread_id, ns = _conf(config)
        t = self.thread(thread_id)
        with t.lock:
            self.hold(thread_id)
            values = checkpoint["channel_values"]
            blobs = Blobs(t.index.chunks)
            refs = {channel: [version, self._ref(t, ns, channel, version, values[channel],
                                                 blobs) if channel in values else {"e": 1}]
                    for channel, version in new_versions.items()}
            bare = {k: v for k, v in checkpoint.items() if k != "channel_values"}
            meta = get_checkpoint_metadata(config, metadata)
            step = meta.get("step")
            self.append(thread_id, [(EventType.GRAPH_CHECKPOINT, {
                "ns": ns, "id": checkpoint["id"],
                "parent_id": config["configurable"].get("checkpoint_id"),
                "ts": str(checkpoint.get("ts", "")),
                "source": str(meta.get("source")) if meta.get("source") else None,
                "step": step if isinstance(step, int) else None,
                "checkpoint": _typed(self.serde.dumps_typed(bare)),
                "metadata": _typed(self.serde.dumps_typed(meta)),
                "values": refs, "blobs": blobs.new,
            })])
        return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns,
                                 "checkpoint_id": checkpoint["id"]}}

    def _ref(self, t: Thread, ns: str, channel: str, version: Any, value: Any,
             blobs: Blobs) -> dict[str, Any]:
        """A channel value's reference. A list is cut into chunks of CHUNK items, each
        stored once; its reference names the chunks changed since the channel's last
        version, every DELTAS-th all. A full chunk holding the very objects it held at
        the channel's last version is not serialized again: LangGraph's reducers make a
        new list of the same message objects and never change one in place (a message
        changed in place, in a chunk already stored, is not stored again)."""
        if type(value) is not list or not value:
            return blobs.value([self.serde.dumps_typed(value)])
        last = t.lists.get((ns, channel))
        chunks: list[tuple[tuple[Any, ...], str]] = []
        for k, start in enumerate(range(0, len(value), CHUNK)):
            objects = tuple(value[start:start + CHUNK])
            if last is not None and k < len(last.chunks) and _same_full_chunk(
                    last.chunks[k][0], objects) and (
                    last.chunks[k][1] in t.index.chunks or last.chunks[k][1] in blobs.new):
                chunks.append(last.chunks[k])  # the very same items: not serialized again
            else:
                items = [self.serde.dumps_typed(v) for v in objects]
                chunks.append((objects, blobs.add(pack_chunk(items))))
        names = [name for _, name in chunks]
        # A change is based only on a version naming one value, and only stored under a
        # version not stored before (a fork's own version is stored whole): a read then
        # finds each base as it was written, and a chain of changes always ends.
        based = (last is not None and last.deltas < DELTAS
                 and t.index.sole(ns, channel, last.version)
                 and (ns, channel, version) not in t.index.values)
        if not based:
            t.lists[(ns, channel)] = ListValue(version, chunks, 0)
            return {"l": names}
        assert last is not None
        keep = 0
        while keep < min(len(names), len(last.chunks)) and names[keep] == last.chunks[keep][1]:
            keep += 1
        t.lists[(ns, channel)] = ListValue(version, chunks, last.deltas + 1)
        return {"d": [last.version, keep, names[keep:]]}

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                   task_id: str, task_path: str = "") -> None:
        thread_id, ns = _conf(config)
        checkpoint_id = str(config["configurable"]["checkpoint_id"])
        t = self.thread(thread_id)
        with t.lock:
            self.hold(thread_id)
            stored = t.index.writes.get((ns, checkpoint_id), {})
            blobs = Blobs(t.index.chunks)
            rows = []
            for idx, (channel, value) in enumerate(writes):
                at = WRITES_IDX_MAP.get(channel, idx)
                if at >= 0 and (task_id, at) in stored:
                    continue  # a repeat of an ordinary write: kept once, nothing to append
                rows.append([at, channel, blobs.value([self.serde.dumps_typed(value)])])
            if rows:
                self.append(thread_id, [(EventType.GRAPH_WRITES, {
                    "ns": ns, "checkpoint_id": checkpoint_id, "task_id": task_id,
                    "task_path": task_path, "writes": rows, "blobs": blobs.new})])

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        thread_id, ns = _conf(config)
        wanted = get_checkpoint_id(config)
        head = self._head(thread_id)
        if head is not None:  # (the newest checkpoints; a namespace it lacks has none)
            kept = head.checkpoints.get(ns, {})
            if wanted is None or wanted in kept or len(kept) == head.sizes.get(ns, 0):
                record = kept.get(max(kept, default="") if wanted is None else wanted)
                return None if record is None else self._tuple(thread_id, head, record)
        t = self.thread(thread_id)
        with t.lock:
            ours = t.index.checkpoints.get(ns, {})
            if wanted is None:
                wanted = max(ours, default=None)
            record = ours.get(wanted) if wanted is not None else None
            return None if record is None else self._tuple(thread_id, t.index, record)

    def _head(self, thread_id: str) -> GraphIndex | None:
        """The head view of a thread this saver has not read: its newest checkpoints,
        if no checkpoint or write was appended after it (else None: the index answers)."""
        first = None
        with self._lock:
            if thread_id not in self._threads:
                first = thread_run_id(thread_id)
        if first is not None and (head := load_head(self.store, first)) is not None:
            # (its log holds events, so no tombstone replaced it: the thread's current
            # run, found with no statement asking for its tombstone)
            self._entry(thread_id, first)
            return head
        t = self._entry(thread_id)
        if t.run_id == first:
            return None  # (read just now)
        with t.lock:
            return None if t.loaded else load_head(self.store, t.run_id)

    def list(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
             before: RunnableConfig | None = None, limit: int | None = None
             ) -> Iterator[CheckpointTuple]:
        if config is not None:
            thread_ids = [str(config["configurable"]["thread_id"])]
            ns = config["configurable"].get("checkpoint_ns")
            wanted = get_checkpoint_id(config)
        else:
            thread_ids, ns, wanted = self._thread_ids(), None, None
        before_id = get_checkpoint_id(before) if before else None
        for thread_id in thread_ids:
            found = self._listed(thread_id, _Query(ns, wanted, before_id, filter, limit))
            if limit is not None:
                limit -= len(found)
            yield from found
            if limit is not None and limit <= 0:
                return

    def _listed(self, thread_id: str, query: _Query) -> builtins.list[CheckpointTuple]:
        """One thread's checkpoints ``query`` asks for: from its head view when the
        head holds all of them (a fresh handle's first page), else from its index."""
        head = self._head(thread_id)
        if head is not None and (records := self._chosen(head, query)) is not None:
            return [self._tuple(thread_id, head, r) for r in records]
        t = self.thread(thread_id)
        with t.lock:
            records = self._chosen(t.index, query)
            assert records is not None  # (a whole index holds every checkpoint)
            return [self._tuple(thread_id, t.index, r) for r in records]

    def _chosen(self, index: GraphIndex,
                q: _Query) -> builtins.list[CheckpointRecord] | None:
        """The records ``q`` asks for, newest first; None when ``index`` is a head that
        may lack one (it keeps the newest few of each namespace)."""
        records = sorted((r for space, cps in index.checkpoints.items()
                          if q.ns is None or space == q.ns for r in cps.values()),
                         key=lambda r: r.id, reverse=True)
        found: builtins.list[CheckpointRecord] = []
        for r in records:
            if q.limit is not None and len(found) >= q.limit:
                break
            if (q.wanted and r.id != q.wanted) or (q.before_id and r.id >= q.before_id):
                continue
            if q.filter:
                meta = self.serde.loads_typed(r.metadata)
                if any(meta.get(k) != v for k, v in q.filter.items()):
                    continue
            found.append(r)
        return found if _complete(index, q, found) else None

    def _thread_ids(self) -> builtins.list[str]:
        """Every thread in the store (its run's ``run_started`` names it)."""
        ids = set()
        for info in self.store.list_runs():
            if info.run_id.startswith("lg-"):
                first = next(iter(self.store.read(info.run_id)), None)
                if first is not None and (thread_id := thread_of(first)) is not None:
                    ids.add(thread_id)
        return sorted(ids)

    def _tuple(self, thread_id: str, index: GraphIndex,
               r: CheckpointRecord) -> CheckpointTuple:
        checkpoint = self.serde.loads_typed(r.checkpoint)
        checkpoint["channel_values"] = self._values(index, r, checkpoint["channel_versions"])
        writes = index.writes.get((r.ns, r.id), {})
        ordered = sorted(writes.items(),
                         key=lambda kv: writes_sort_key(kv[1].task_path, kv[0][0], kv[0][1]))
        pending = []
        for _, w in ordered:
            items = index.read_value(w.ref)
            assert items is not None  # a write always has a value
            pending.append((w.task_id, w.channel, self.serde.loads_typed(items[0])))
        conf = {"thread_id": thread_id, "checkpoint_ns": r.ns}
        return CheckpointTuple(
            config={"configurable": {**conf, "checkpoint_id": r.id}},
            checkpoint=checkpoint,
            metadata=self.serde.loads_typed(r.metadata),
            parent_config=({"configurable": {**conf, "checkpoint_id": r.parent_id}}
                           if r.parent_id else None),
            pending_writes=pending,
        )

    def _values(self, index: GraphIndex, r: CheckpointRecord,
                versions: ChannelVersions) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for channel, version in versions.items():
            ref = index.ref_of(r, channel, version)
            if ref is None:
                continue
            if "l" in ref or "d" in ref:
                names = index.list_names(r, channel, ref)
                array = index.list_array(names) if _one_call_reads_many(self.serde) else None
                values[channel] = (self._loads_many(array) if array is not None else [
                    self.serde.loads_typed(item) for item in index.read_value({"c": names})
                    or []])
            elif (one := index.read_value(ref)) is not None:
                values[channel] = self.serde.loads_typed(one[0])
        return values

    def _loads_many(self, array: bytes | memoryview) -> builtins.list[Any]:
        """A msgpack array of values, read by LangGraph's serializer in one call: it
        reads the array's items by the rules it reads each by (a message history, most
        of a read, in one call instead of one per message)."""
        # (a head's list is read in place, a memoryview: LangGraph's reads any buffer)
        found: builtins.list[Any] = self.serde.loads_typed(("msgpack", cast(bytes, array)))
        return found

    def delete_thread(self, thread_id: str) -> None:
        """Delete the thread's log: its run is replaced by a tombstone naming no archive
        (``DELETED``), and the thread id starts again in a new run. An archived thread
        is ``ArchivedRunError``: restore it first."""
        t = self.thread(thread_id)
        with t.lock:
            if not self.store.last_seq(t.run_id):
                return
            run = self.hold(thread_id)
            records = self.store.records(t.run_id)
            stone = Tombstone(run_id=t.run_id, last_seq=len(records),
                              digest=records_digest(records), archive=DELETED,
                              deleted_at=now())
            self.store.delete_run(stone, epoch=run.journal.lease.epoch)
            self._drop(t, keep=False)
        with self._lock:
            self._threads.pop(thread_id, None)

    # --- the async twins: the sync methods in a thread --------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await asyncio.to_thread(self.get_tuple, config)

    async def alist(self, config: RunnableConfig | None, *,
                    filter: dict[str, Any] | None = None, before: RunnableConfig | None = None,
                    limit: int | None = None) -> AsyncIterator[CheckpointTuple]:
        found = await asyncio.to_thread(
            lambda: list(self.list(config, filter=filter, before=before, limit=limit)))
        for item in found:
            yield item

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint,
                   metadata: CheckpointMetadata, new_versions: ChannelVersions
                   ) -> RunnableConfig:
        return await asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                          task_id: str, task_path: str = "") -> None:
        await asyncio.to_thread(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await asyncio.to_thread(self.delete_thread, thread_id)

    # --- an invocation's input, recorded before the graph runs ----------------------

    def record_input(self, config: RunnableConfig, input: Any, *,
                     agent_version: str | None = None, strict: bool | None = None) -> Any:
        """Hold the thread and record ``input`` durably before the graph runs, so a crash
        before LangGraph's first checkpoint loses nothing; returns the input to run with.
        ``None`` (a resume) returns the input recorded by an invocation that crashed
        before its input checkpoint, else None (LangGraph resumes from its checkpoint).
        A ``Command`` is not recorded: it acts on a checkpoint, which holds its effects.
        ``agent_version``: the graph's version, recorded if this opens the thread's run;
        ``strict``: see :class:`JournalSaver`."""
        thread_id, _ = _conf(config)
        t = self.thread(thread_id)
        if input is None or isinstance(input, Command):
            self.hold(thread_id, agent_version=agent_version, strict=strict)
            pending = t.index.pending_input if input is None else None
            return input if pending is None else self.serde.loads_typed(pending)
        fact = (EventType.GRAPH_INPUT, {"input": _typed(self.serde.dumps_typed(input))})
        with t.lock:
            # A thread's run is started or resumed with its input in one append: a crash
            # can never leave a thread opened without the input it was opened for.
            opening = t.run is None
            if not (opening and self.hold(thread_id, opening=[fact], agent_version=agent_version,
                                          strict=strict).opened):
                self.append(thread_id, [fact])
        return input

    def finish(self, config: RunnableConfig, outcome: str = "done") -> None:
        """Record that the thread's graph ran to its end (``run_finished``): gc may then
        archive the thread; a later input reopens it."""
        thread_id, _ = _conf(config)
        t = self.thread(thread_id)
        with t.lock:
            if not t.index.finished and t.index.last_seq:
                self.hold(thread_id).finish(outcome)
                t.absorb(list(self.store.read(t.run_id, after_seq=t.index.last_seq)))


# --- exactly-once tools: a ToolNode wrapper over the call protocol -----------------------


@dataclass(frozen=True)
class ToolEffect:
    """How a tool's calls are made: ``effect`` (``read_only``, ``idempotent``,
    ``reversible``, ``irreversible``: what a retry may do), ``identity`` (the argument
    fields naming the action; default all), ``lookup`` (a reconcile lookup settling an
    uncertain call: ``PendingCall -> Found | Absent | Conflict | Unknown``)."""

    effect: Effect | str = Effect.IRREVERSIBLE
    identity: tuple[str, ...] = ()
    lookup: Reconciler | None = None


class ExactlyOnce:
    """A ``ToolNode`` wrapper (``wrap_tool_call=``; ``.awrap`` for ``awrap_tool_call=``)
    running each tool call through agentjournal's call protocol, on the thread's run:
    ``tool_call_started`` durable before the tool runs, the completion after; a call
    answered before (this very call id) is answered from the log, the tool not run; one
    left uncertain by a crash is settled by its lookup, retried with the same key when
    its effect allows, else handed to a person through LangGraph's own ``interrupt()``
    (the evidence as its value). ``Command(resume={"verdict": "happened" |
    "did_not_happen", "by": ..., "reason": ..., "result": ...})`` answers it, and the
    answer is recorded in the journal. A call to a tool the node does not have (a name
    the model made up) is left to LangGraph, which answers it with its error: nothing of
    it is recorded. Made by :func:`exactly_once`."""

    def __init__(self, saver: JournalSaver, effects: Mapping[str, ToolEffect],
                 default: ToolEffect, renamed: Mapping[str, BaseTool] | None = None) -> None:
        self.saver, self.effects, self.default = saver, dict(effects), default
        self.renamed = dict(renamed or {})

    def spec(self, name: str) -> ToolEffect:
        """How calls of the tool named ``name`` are made (a renamed tool's old name: as
        its new one, unless declared itself)."""
        if name in self.effects:
            return self.effects[name]
        new = self.renamed.get(name)
        return self.effects.get(new.name, self.default) if new is not None else self.default

    def _mapped(self, request: ToolCallRequest) -> ToolCallRequest:
        """A call recorded under a tool's old name, made by the tool it was renamed to
        (``renamed=``): still under its old name, so its key is the recorded one."""
        if request.tool is None and (new := self.renamed.get(request.tool_call["name"])):
            return request.override(tool=new)
        return request

    def __call__(self, request: ToolCallRequest,
                 execute: Callable[[ToolCallRequest], ToolMessage | Command[Any]]
                 ) -> ToolMessage | Command[Any]:
        request = self._mapped(request)
        if request.tool is None:  # a tool the node does not have (see _without_tool)
            answered = self._without_tool(request)
            return execute(request) if answered is None else answered
        call, run, spec = self._begin(request)
        self._still_usable(run, call, request.tool)
        refused: list[JournalError] = []  # the body's reads of current_call() refused
        unkept: list[Any] = []  # what the tool returned, when it is not to be kept
        checked = request.override(tool=_checking(request.tool, unkept))

        def body(ctx: Any) -> Any:
            with reading_checked(_read_in(request, run.run_id, refused)):
                result = execute(checked)
            return self._recorded(_unless_refused(result, refused), unkept)

        with _naming(_thread_id(request)):
            for _ in range(3):  # (a verdict, then the call it settles)
                try:
                    value = run.call(call["name"], dict(call["args"]), call_id=call["id"],
                                     body=body, effect=spec.effect, identity=spec.identity,
                                     lookup=spec.lookup)
                except (ToolFailed, CallRefused) as exc:
                    return _error_message(call, exc)
                except ResultNotKeptError as exc:  # made: the model is told, the graph goes on
                    return _not_kept_message(call, exc)
                except NeedsPerson as need:
                    if refused:  # the caller is told what to change, not asked a verdict
                        raise refused[0] from None
                    self._decide(run, call, need)
                    continue
                return self._decode(value, call)
        raise RuntimeError(f"call {call['id']} was decided but not answered")

    async def awrap(self, request: ToolCallRequest,
                       execute: Callable[[ToolCallRequest],
                                      Awaitable[ToolMessage | Command[Any]]]
                    ) -> ToolMessage | Command[Any]:
        request = self._mapped(request)
        if request.tool is None:  # (its appends, and a verdict's, off the loop)
            answered = await asyncio.to_thread(self._without_tool, request)
            return await execute(request) if answered is None else answered
        call, run, spec = await asyncio.to_thread(self._begin, request)
        await asyncio.to_thread(self._still_usable, run, call, request.tool)
        refused: list[JournalError] = []
        unkept: list[Any] = []
        checked = request.override(tool=_checking(request.tool, unkept))

        async def body(ctx: Any) -> Any:
            with reading_checked(_read_in(request, run.run_id, refused)):
                result = await execute(checked)
            return self._recorded(_unless_refused(result, refused), unkept)

        with _naming(_thread_id(request)):
            for _ in range(3):
                try:
                    value = await run.acall(call["name"], dict(call["args"]),
                                            call_id=call["id"], body=body, effect=spec.effect,
                                            identity=spec.identity, lookup=spec.lookup)
                except (ToolFailed, CallRefused) as exc:
                    return _error_message(call, exc)
                except ResultNotKeptError as exc:  # made: the model is told, the graph goes on
                    return _not_kept_message(call, exc)
                except NeedsPerson as need:
                    if refused:
                        raise refused[0] from None
                    self._decide(run, call, need)
                    continue
                return self._decode(value, call)
        raise RuntimeError(f"call {call['id']} was decided but not answered")

    def _begin(self, request: ToolCallRequest) -> tuple[Any, BridgedRun, ToolEffect]:
        call = request.tool_call
        return call, self.saver.hold(_thread_id(request)), self.spec(call["name"])

    def _without_tool(self, request: ToolCallRequest) -> ToolMessage | Command[Any] | None:
        """A call of a tool the node does not have: a name the model made up, or a tool
        removed or renamed since the thread recorded the call. Answered in the log: that
        answer (history is history; not "not a valid tool" for an effect that happened).
        Started and uncertain: a person decides (the thread stops at an interrupt, its run
        paused with the reason); made again under another tool it could happen twice. A
        read left open made nothing: it is closed as not made, and the model told.
        Otherwise None: LangGraph answers it with its error, and nothing is recorded."""
        call = request.tool_call
        if call["id"] is None:  # not a call the log can hold: LangGraph answers it
            return None
        run = self.saver.hold(_thread_id(request))
        for _ in range(3):  # (a verdict, then the answer it recorded)
            if (found := _made(run, call)) is not None:
                return self._served(found, call)
            pending = _open_call(run, call)
            if pending is None:
                return None
            if pending.effect == Effect.READ_ONLY:
                run.resolve(call["id"], happened=False, by="agentjournal (langgraph)", reason=(
                    f"a read left open, and the graph's ToolNode has no tool "
                    f"{call['name']!r} any more: nothing to double; the model is told"))
                return None
            self._changed(run, call, pending, (
                f"call {call['id']} of tool {pending.tool!r} (key {pending.key[:16]}, "
                f"{pending.effect}) was started and its outcome is unknown, and the graph's "
                f"ToolNode has no tool {call['name']!r} any more (removed or renamed; map a "
                "renamed tool with exactly_once(..., renamed={'old': new_tool}))"))
        raise RuntimeError(f"call {call['id']} was decided but not answered")

    def _still_usable(self, run: BridgedRun, call: Any, tool: BaseTool) -> None:
        """A call with an effect, started and left uncertain, whose recorded arguments the
        tool no longer accepts (its schema changed): a person decides, as for a tool
        removed. (A changed identity or effect class the bridge finds: CodeChanged.)"""
        pending = _open_call(run, call)
        if pending is None or pending.effect == Effect.READ_ONLY:
            return  # (a read is made again, and the model told what the tool says now)
        if (why := _rejects(tool, pending.args)) is None:
            return
        self._changed(run, call, pending, (
            f"call {call['id']} of tool {pending.tool!r} (key {pending.key[:16]}, "
            f"{pending.effect}) was started and its outcome is unknown, and the tool no "
            f"longer accepts the recorded arguments ({why})"))

    def _changed(self, run: BridgedRun, call: Any, pending: PendingCall, what: str) -> None:
        """The code changed under an open call: ask a person (see _decide)."""
        reason = (f"the code changed under an open call: {what}. Settle it with "
                  f"`agentjournal resolve {run.run_id} {pending.key[:16]} --happened | "
                  "--did-not-happen` or Command(resume={'verdict': ...}) on the thread (or "
                  "deploy the tool's old definition again), then run again; or cancel the "
                  f"run (`agentjournal cancel {run.run_id} [--compensate]`)")
        self._decide(run, call, CodeChanged(run.run_id, call["id"], pending.tool, reason,
                                            key=pending.key, pending=pending))

    def _served(self, found: Answer, call: Any) -> ToolMessage | Command[Any]:
        """The message of a call answered in the log, as when it was answered."""
        if found.not_kept is not None:
            why = found.not_kept if found.source == "served" else not_kept(found.not_kept)
            return ToolMessage(content=why, tool_call_id=call["id"], name=call["name"],
                               status="error")
        return self._decode(found.result, call)

    def _decide(self, run: BridgedRun, call: Any, need: NeedsPerson) -> None:
        """Ask the person through LangGraph's interrupt (the first time this raises and
        the graph stops; on ``Command(resume=...)`` it returns the answer), then record
        the answer as the call's verdict. A change of the code under the call
        (:class:`CodeChanged`) is named in the evidence (``change``), and the run is
        paused with it as its reason when the graph stops."""
        pending = need.pending
        evidence = {"agentjournal": "uncertain", "run_id": run.run_id, "tool": call["name"],
                    "call_id": call["id"], "args": call["args"], "key": need.key,
                    "reason": need.reason,
                    "started_at": str(getattr(pending, "started_at", "") or ""),
                    "attempt": getattr(pending, "attempt", None),
                    "last_error": getattr(pending, "last_error", None),
                    "answer_with": {"verdict": "happened | did_not_happen",
                                    "by": "who decided", "reason": "why",
                                    "result": "what it returned (happened only)"}}
        if isinstance(need, CodeChanged):
            evidence["change"] = need.reason
        try:
            answer = interrupt(evidence)
        except GraphInterrupt:
            if isinstance(need, CodeChanged):  # (paused only as it stops: not on resume)
                run.pause(need.reason)
            raise
        verdict = _verdict(answer)
        if verdict is None:
            raise ValueError(f"the answer to call {call['id']!r} ({call['name']}) must say "
                             "whether it happened: Command(resume={'verdict': 'happened'} or "
                             f"{{'verdict': 'did_not_happen'}}), not {answer!r}")
        happened, by, reason, result = verdict
        run.resolve(call["id"], happened=happened, by=by, reason=reason, result=result)

    def _recorded(self, result: ToolMessage | Command[Any], unkept: list[Any]) -> Any:
        """What the call's completion records: the value the tool returned itself when
        it is not kept (the loop's rule then completes the call as "result not kept",
        with its size and sha256 when it nests too deep), else the message or command."""
        if unkept:
            return unkept[0]
        try:
            return self._encode(result)
        except Exception as exc:  # the tool ran: its value has no form the log can hold
            raise ResultNotEncodable(
                f"its result has no JSON form: {type(exc).__name__}: {exc}") from None

    def _encode(self, result: ToolMessage | Command[Any]) -> dict[str, Any]:
        if isinstance(result, ToolMessage):
            return {"tool_message": {"content": result.content, "status": result.status}}
        return {"command": _typed(self.saver.serde.dumps_typed(result))}

    def _decode(self, value: Any, call: Any) -> ToolMessage | Command[Any]:
        if isinstance(value, dict) and "tool_message" in value:
            message = value["tool_message"]
            return ToolMessage(content=message["content"], status=message["status"],
                               tool_call_id=call["id"], name=call["name"])
        if isinstance(value, dict) and "command" in value:
            command: Command[Any] = self.saver.serde.loads_typed(
                (value["command"][0], unb64(value["command"][1])))
            return command
        # A lookup's finding or a person's word: the result as the receiver gave it.
        content = ("The call was made (settled without its result)." if value is None
                   else value if isinstance(value, str) else json.dumps(value, default=str))
        return ToolMessage(content=content, tool_call_id=call["id"], name=call["name"])


def _read_in(request: ToolCallRequest, run_id: str,
             refused: list[JournalError]) -> Callable[[ToolContext], None]:
    """Who may read a call's context (``current_call()``): the call's own tool, in the
    graph's namespace the call runs in. A tool of a graph the tool invoked (its
    namespace under this one) whose ToolNode is not wrapped by ``exactly_once`` is
    refused (kept in ``refused``): its calls are not journaled, so each would send this
    call's key, and a receiver that honours keys would apply only the first of them."""
    call = request.tool_call
    namespace = request.runtime.config.get("configurable", {}).get("checkpoint_ns")

    def check(ctx: ToolContext) -> None:
        try:
            reader = get_config().get("configurable", {}).get("checkpoint_ns")
        except RuntimeError:  # outside any runnable: not inside another graph's step
            return
        if reader == namespace:
            return
        refused.append(JournalError(
            f"current_call() was read in a graph run inside tool call {call['name']!r} "
            f"({call['id']}) of thread run {run_id!r} (namespace {reader!r}), whose tools "
            "are not run by exactly_once: each of its calls would send that one call's "
            "idempotency key, and a receiver that honours keys would apply only the first. "
            "Wrap that graph's ToolNode with exactly_once(saver) too "
            "(wrap_tool_call=, awrap_tool_call=): each of its calls then has a key of its "
            "own.", run_id=run_id))
        raise refused[-1]
    return check


def _unless_refused(result: Any, refused: list[JournalError]) -> Any:
    """The tool's result, unless a read of its call's context was refused inside it (an
    error the tool or its graph answered itself): that is not a result to complete the
    call with, as its inner calls were not made."""
    if refused:
        raise refused[0]
    return result


def exactly_once(saver: JournalSaver, effects: Mapping[str, ToolEffect] | None = None, *,
                 default: ToolEffect | None = None,
                 renamed: Mapping[str, BaseTool] | None = None) -> ExactlyOnce:
    """A ``ToolNode`` wrapper making each tool call by agentjournal's call protocol on the
    thread's run (see :class:`ExactlyOnce`). ``effects``: per tool name; ``default``:
    for the others (irreversible unless given)::

        calls = exactly_once(saver, {"refund": ToolEffect("irreversible",
                                                          identity=("order",),
                                                          lookup=find_refund)})
        ToolNode(tools, wrap_tool_call=calls, awrap_tool_call=calls.awrap)

    A tool reads its call's idempotency key (to send to its receiver) and lease epoch
    with ``current_call()``.

    ``renamed``: a tool's old name -> the tool now (``{"refund": issue_refund}``): a call
    the thread recorded under the old name (its model turn is history) is made, or
    settled when a crash left it uncertain, by the new tool under its old name and key.
    Without it, such a call left uncertain stops the thread for a person."""
    return ExactlyOnce(saver, effects or {}, default or ToolEffect(), renamed)


def current_call() -> ToolContext:
    """The running tool call's context (``key``: the idempotency key to send to the
    receiver; ``epoch``: the lease epoch), inside a tool run by :func:`exactly_once`."""
    ctx = bridge_current_call()
    if ctx is None:
        raise RuntimeError("current_call() is only set inside a tool run by exactly_once")
    return ctx


def _thread_id(request: ToolCallRequest) -> str:
    return str(request.runtime.config["configurable"]["thread_id"])


def _verdict(answer: Any) -> tuple[bool, str, str, Any] | None:
    """(happened, by, reason, result) from a resume value: a dict with ``verdict`` (or
    ``happened``: bool), or the bare verdict; None when it says neither."""
    if isinstance(answer, str | bool):
        answer = {"verdict": answer}
    if not isinstance(answer, dict):
        return None
    said = answer.get("verdict", answer.get("happened"))
    happened = {"happened": True, "did_not_happen": False, True: True, False: False}.get(said)
    if happened is None:
        return None
    return (happened, str(answer.get("by") or "langgraph resume"),
            str(answer.get("reason") or ""), answer.get("result"))


def _checking(tool: BaseTool, unkept: list[Any]) -> BaseTool:
    """A copy of ``tool`` that keeps in ``unkept`` a value it returns that agentjournal
    does not keep (no JSON form, a NaN, nested past results.MAX_DEPTH; results.py), and
    gives LangChain an empty content for it instead. LangChain would make that value the
    message's text itself, as ``str(value)`` (a repr, which may hold a secret), as JSON
    text with NaN in it, or raise RecursionError after the effect happened: under
    LangGraph the call then completes as "result not kept", as under every shell."""
    copy = tool.model_copy()
    for name in ("_run", "_arun"):
        method = getattr(tool, name)
        wrapper = (_checked_async(method, tool, unkept) if name == "_arun"
                   else _checked_sync(method, tool, unkept))
        object.__setattr__(copy, name, wrapper)
    return copy


def _checked_sync(method: Callable[..., Any], tool: BaseTool,
                  unkept: list[Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def run(*args: Any, **kwargs: Any) -> Any:
        return _kept_or_stood_in(method(*args, **kwargs), tool, unkept)
    return run


def _checked_async(method: Callable[..., Any], tool: BaseTool,
                   unkept: list[Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    async def arun(*args: Any, **kwargs: Any) -> Any:
        return _kept_or_stood_in(await method(*args, **kwargs), tool, unkept)
    return arun


def _kept_or_stood_in(response: Any, tool: BaseTool, unkept: list[Any]) -> Any:
    pair = tool.response_format == "content_and_artifact"
    content = response[0] if pair and isinstance(response, tuple) and response else response
    if unkept or _keepable(content):  # (unkept: kept aside already, by the other wrapper)
        return response
    unkept.append(content)
    return ("", None) if pair else ""


def _keepable(content: Any) -> bool:
    """Whether a tool's value is one the log may hold as LangChain renders it: text, a
    message or command, or a value with a JSON form (results.to_json)."""
    if isinstance(content, str | ToolOutputMixin):
        return True
    if isinstance(content, list) and content and all(
            isinstance(item, ToolOutputMixin) for item in content):
        return True
    try:
        to_json(content)
    except EncodingError:
        return False
    return True


def _made(run: BridgedRun, call: Any) -> Answer | None:
    """The recorded result of the call: made, with these arguments, under this call id
    (a failure or a refusal had no effect: LangGraph's own answer is as true)."""
    found = run.answer(call["id"])
    if found is None or found.kind != "result" or found.key is None:
        return None
    made = run.state.completed.get(found.key)
    return found if made is not None and same_intent(made.args, call["args"]) else None


def _open_call(run: BridgedRun, call: Any) -> PendingCall | None:
    """The call as the log holds it open (started, its outcome unknown): the same call id
    and tool name (a graph run inside a tool call may reuse an id for another tool)."""
    return next((p for p in run.state.pending.values()
                 if p.call_id == call["id"] and p.tool == call["name"]), None)


def _rejects(tool: BaseTool, args: Mapping[str, Any]) -> str | None:
    """Why ``tool``'s schema now rejects ``args`` (None: it accepts them, or the tool's
    schema is plain JSON schema, not checked here)."""
    schema = tool.tool_call_schema
    if not (isinstance(schema, type) and issubclass(schema, BaseModel)):
        return None
    try:
        schema.model_validate(dict(args))
    except ValidationError as exc:
        return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}"
                         for e in exc.errors())
    return None


def _not_kept_message(call: Any, exc: ResultNotKeptError) -> ToolMessage:
    return ToolMessage(content=exc.reason, tool_call_id=call["id"], name=call["name"],
                       status="error")


def _error_message(call: Any, exc: Exception) -> ToolMessage:
    return ToolMessage(content=f"Error: {exc}", tool_call_id=call["id"], name=call["name"],
                       status="error")


def _typed(pair: tuple[str, bytes]) -> list[str]:
    return [pair[0], b64(pair[1])]


def _saver_of(graph: Any) -> JournalSaver:
    saver = getattr(graph, "checkpointer", None)
    if not isinstance(saver, JournalSaver):
        raise TypeError("invoke needs a graph compiled with checkpointer=JournalSaver(...)")
    return saver


def _ended(graph: Any, config: RunnableConfig) -> bool:
    snapshot = graph.get_state(config)
    return not snapshot.next and not snapshot.interrupts


def invoke(graph: Any, input: Any, config: RunnableConfig, *, durability: str = "sync",
           release: bool = True, strict: bool | None = None, **kwargs: Any) -> Any:
    """Run ``graph`` on a thread durably: hold the thread's lease for the whole
    invocation (``LeaseHeldError`` if another process holds it), record the input
    before the graph runs (``input=None`` resumes, with the input of an invocation
    that crashed before its first checkpoint if there is one), and record the finish
    when the graph ends. ``durability`` defaults to LangGraph's ``"sync"``.

    The thread's run records the graph's version (:func:`agent_version`) as it starts
    and at each resume. A thread recorded by other code continues from its checkpoint
    (recorded model turns are not asked again), and a call that the change left
    unusable (its tool gone, its identity, effect class or arguments changed while it
    was uncertain) stops at an interrupt for a person. ``strict`` (default: the
    saver's): refuse an unfinished thread last run by another version instead."""
    with _durably(graph, input, config, release, strict) as given:
        return graph.invoke(given, config, durability=durability, **kwargs)


async def ainvoke(graph: Any, input: Any, config: RunnableConfig, *,
                  durability: str = "sync", release: bool = True, strict: bool | None = None,
                  **kwargs: Any) -> Any:
    """``invoke`` for async code."""
    async with _adurably(graph, input, config, release, strict) as given:
        return await graph.ainvoke(given, config, durability=durability, **kwargs)


def stream(graph: Any, input: Any, config: RunnableConfig, *, durability: str = "sync",
           release: bool = True, strict: bool | None = None, **kwargs: Any) -> Iterator[Any]:
    """``invoke``, streamed: ``graph.stream``'s chunks as they come (``stream_mode`` and
    the rest as ``graph.stream`` takes them), under the same lease, with the input
    recorded first and the finish at the end. The lease is taken at the first chunk
    asked for, and released when the iteration ends or is closed."""
    with _durably(graph, input, config, release, strict) as given:
        yield from graph.stream(given, config, durability=durability, **kwargs)


async def astream(graph: Any, input: Any, config: RunnableConfig, *,
                  durability: str = "sync", release: bool = True, strict: bool | None = None,
                  **kwargs: Any) -> AsyncIterator[Any]:
    """``stream`` for async code."""
    async with _adurably(graph, input, config, release, strict) as given:
        async for chunk in graph.astream(given, config, durability=durability, **kwargs):
            yield chunk


@contextlib.contextmanager
def _durably(graph: Any, input: Any, config: RunnableConfig, release: bool,
             strict: bool | None) -> Iterator[Any]:
    """Around one run of ``graph`` on a thread: the input recorded (the lease taken) and
    given to the graph; once the graph returned, its finish recorded if it ended; the
    lease released after, whatever happened, if ``release``."""
    saver = _saver_of(graph)
    thread_id, _ = _conf(config)
    try:
        yield saver.record_input(config, input, agent_version=agent_version(graph),
                                 strict=strict)
        if _ended(graph, config):
            saver.finish(config)
    finally:
        if release:
            saver.release(thread_id)


@contextlib.asynccontextmanager
async def _adurably(graph: Any, input: Any, config: RunnableConfig, release: bool,
                    strict: bool | None) -> AsyncIterator[Any]:
    """``_durably`` for async code: the saver's calls on a thread, off the loop."""
    saver = _saver_of(graph)
    thread_id, _ = _conf(config)
    try:
        yield await asyncio.to_thread(functools.partial(
            saver.record_input, config, input, agent_version=agent_version(graph),
            strict=strict))
        if await asyncio.to_thread(_ended, graph, config):
            await asyncio.to_thread(saver.finish, config)
    finally:
        if release:
            await asyncio.to_thread(saver.release, thread_id)


# --- what a deploy may change: the graph's shape and version ----------------------------


def graph_shape(graph: Any) -> AgentShape:
    """What a deploy may change about a compiled graph, for ``agentjournal check`` and the
    version its threads record: the tools of its ToolNodes (name, description,
    parameters; effect and identity as their ``exactly_once`` declares them; ``renamed=``
    mappings) and its version: ``JournalSaver(agent_version=)`` when given, else a digest
    of its nodes, edges and tools (:func:`agent_version`)."""
    tools: dict[str, ToolShape] = {}
    renamed: dict[str, str] = {}
    for node in _tool_nodes(graph):
        wrapper = node._wrap_tool_call
        calls = wrapper if isinstance(wrapper, ExactlyOnce) else None
        for tool in node.tools_by_name.values():
            spec = calls.spec(tool.name) if calls is not None else ToolEffect()
            tools[tool.name] = ToolShape(
                name=tool.name, effect=str(Effect(spec.effect)),
                identity=tuple(spec.identity) or None,
                schema_digest=digest(_tool_form(tool)),
                check_args=functools.partial(_rejects, tool))
        if calls is not None:
            renamed.update({old: new.name for old, new in calls.renamed.items()})
    saver = getattr(graph, "checkpointer", None)
    given = saver.agent_version if isinstance(saver, JournalSaver) else None
    return agent_shape(instructions=None, tools=tools.values(), model=None,
                       version=given or _derived_version(graph), renamed=renamed)


def agent_version(graph: Any) -> str:
    """The version a thread run by ``graph`` records (``run_started``, each
    ``run_resumed``): ``JournalSaver(agent_version=)`` when given, else derived from the
    graph's code: a digest of its nodes (a function node's code and the plain data it
    reads: a prompt in a constant or a closure, a model's name), edges and tools. The
    same code gives the same version in every process."""
    saver = getattr(graph, "checkpointer", None)
    given = saver.agent_version if isinstance(saver, JournalSaver) else None
    return given or _derived_version(graph)


def _derived_version(graph: Any) -> str:
    return "langgraph-" + digest(_graph_form(graph, 0)).removeprefix("sha256:")


def _describe_graph(obj: object) -> AgentShape | None:
    return graph_shape(obj) if isinstance(obj, Pregel) else None


DESCRIBERS.append(_describe_graph)

#: How deep a graph's code is followed for its version (subgraphs, functions a node's
#: code refers to): deep enough for a prompt one call away, bounded for any code.
_DEPTH = 4


def _builder_nodes(graph: Any) -> dict[str, Any]:
    """A compiled graph's nodes as its builder declared them (the runnables themselves)."""
    builder = getattr(graph, "builder", None)
    nodes = getattr(builder, "nodes", None)
    if isinstance(nodes, Mapping):
        return {name: getattr(spec, "runnable", spec) for name, spec in nodes.items()}
    return {name: getattr(node, "bound", node) for name, node in graph.nodes.items()}


def _tool_nodes(graph: Any, depth: int = 0) -> Iterator[ToolNode]:
    for runnable in _builder_nodes(graph).values():
        if isinstance(runnable, ToolNode):
            yield runnable
        elif isinstance(runnable, Pregel) and depth < _DEPTH:
            yield from _tool_nodes(runnable, depth + 1)


def _graph_form(graph: Any, depth: int) -> Any:
    """The graph as the data its version digests: nodes, edges, branches."""
    builder = getattr(graph, "builder", None)
    edges = sorted(map(str, getattr(builder, "edges", ()) or ()))
    branches = {str(k): sorted(map(str, v)) for k, v in
                (getattr(builder, "branches", None) or {}).items()}
    nodes = {name: _node_form(runnable, depth)
             for name, runnable in sorted(_builder_nodes(graph).items())}
    return {"nodes": nodes, "edges": edges, "branches": branches}


def _node_form(runnable: Any, depth: int) -> Any:
    if isinstance(runnable, ToolNode):
        wrapper = runnable._wrap_tool_call
        calls = wrapper if isinstance(wrapper, ExactlyOnce) else None
        return {"tools": [_tool_form(t, calls) for _, t in
                          sorted(runnable.tools_by_name.items())],
                "renamed": {} if calls is None else {
                    old: new.name for old, new in sorted(calls.renamed.items())}}
    if isinstance(runnable, Pregel):
        return {"graph": _graph_form(runnable, depth + 1) if depth < _DEPTH else "<deep>"}
    func = getattr(runnable, "func", None) or getattr(runnable, "afunc", None)
    if callable(func):
        return {"function": _code_form(func, depth, set())}
    return {"runnable": f"{type(runnable).__module__}.{type(runnable).__qualname__}",
            "config": _plain(getattr(runnable, "to_json", lambda: None)(), depth)}


def _tool_form(tool: BaseTool, calls: ExactlyOnce | None = None) -> Any:
    schema = tool.tool_call_schema
    params = (schema.model_json_schema() if isinstance(schema, type)
              and issubclass(schema, BaseModel) else schema)
    form: dict[str, Any] = {"name": tool.name, "description": tool.description,
                            "parameters": params}
    if calls is not None:
        spec = calls.spec(tool.name)
        form.update(effect=str(Effect(spec.effect)), identity=list(spec.identity))
    return form


def _code_form(fn: Any, depth: int, seen: set[int]) -> Any:
    """A function as its version digests it: its code (bytecode and constants, nested
    functions too) and the plain data it reads (module globals it names, closure cells).
    Never a value's repr, which may hold an address that differs per process."""
    fn = inspect.unwrap(fn)
    if isinstance(fn, functools.partial):
        return {"partial": _code_form(fn.func, depth, seen),
                "args": _plain(list(fn.args), depth), "kwargs": _plain(fn.keywords, depth)}
    code = getattr(fn, "__code__", None)
    if code is None:  # a callable object: its class's __call__
        call = type(fn).__dict__.get("__call__")
        return {"object": f"{type(fn).__module__}.{type(fn).__qualname__}",
                "call": _code_form(call, depth + 1, seen) if inspect.isfunction(call)
                else None, "state": _plain(getattr(fn, "__dict__", None), depth)}
    if id(code) in seen or depth > _DEPTH:
        return f"<{fn.__qualname__}>"
    seen.add(id(code))
    names = getattr(fn, "__globals__", {})
    cells = [c.cell_contents for c in (fn.__closure__ or ()) if _filled(c)]
    return {"name": fn.__qualname__, "code": _bytecode(code),
            "globals": {n: _value_form(names[n], depth, seen) for n in code.co_names
                        if n in names and not inspect.ismodule(names[n])},
            "closure": [_value_form(v, depth, seen) for v in cells]}


def _bytecode(code: Any) -> Any:
    """A code object's bytecode and constants, nested code objects (a lambda, an inner
    function) by the same rule."""
    consts = [_bytecode(c) if inspect.iscode(c) else _plain(c, 0) for c in code.co_consts]
    return [hashlib.sha256(code.co_code).hexdigest()[:16], consts, list(code.co_names)]


def _value_form(value: Any, depth: int, seen: set[int]) -> Any:
    """A value a function reads: plain data as itself, a function by its code, a model
    by its class and name, anything else by its type."""
    if inspect.isfunction(value) or isinstance(value, functools.partial):
        return _code_form(value, depth + 1, seen)
    if isinstance(value, BaseTool):
        return _tool_form(value)
    if isinstance(value, Pregel):
        return {"graph": _graph_form(value, depth + 1) if depth < _DEPTH else "<deep>"}
    plain = _plain(value, depth)
    if isinstance(plain, str) and plain.startswith("<") and (
            isinstance(getattr(value, "model", None), str)
            or isinstance(getattr(value, "model_name", None), str)):
        return model_identity(value)  # a chat model: its class and model name
    return plain


def _plain(value: Any, depth: int) -> Any:
    """``value`` as JSON data when it is plain (text, numbers, lists, dicts, dataclasses
    of those), else named by its type."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if depth > _DEPTH:
        return f"<{type(value).__qualname__}>"
    if isinstance(value, enum.Enum):
        return _plain(value.value, depth + 1)
    if isinstance(value, list | tuple | set | frozenset):
        items = [_plain(v, depth + 1) for v in value]
        return sorted(items, key=repr) if isinstance(value, set | frozenset) else items
    if isinstance(value, Mapping):
        return {str(k): _plain(v, depth + 1) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name), depth + 1)
                for f in dataclasses.fields(value)}
    # By its type's name alone: a module run as __main__ names its types otherwise.
    return f"<{type(value).__qualname__}>"


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises ValueError
    except ValueError:
        return False
    return True
