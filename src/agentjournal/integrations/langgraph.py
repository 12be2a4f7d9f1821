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
"""

from __future__ import annotations

import asyncio
import builtins
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ArchivedRunError, FencedError, MissingExtraError
from ..events import Event, EventType, now
from ..journal import RunJournal, default_owner, take_lease
from ..state import RunState, apply
from ..store import Store
from ..store.base import Tombstone, records_digest
from ._graphlog import (
    CHUNK,
    DELETED,
    DELTAS,
    Blobs,
    CheckpointRecord,
    GraphIndex,
    Typed,
    b64,
    pack_chunk,
    thread_run_id,
)

try:
    from langchain_core.runnables import RunnableConfig
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
except ImportError as exc:  # pragma: no cover - exercised by the packaging test
    raise MissingExtraError("langgraph", "langgraph") from exc

__all__ = ["DELETED", "JournalSaver", "Thread", "ainvoke", "invoke", "thread_run_id"]

AGENT = "langgraph"


@dataclass
class ListValue:
    """A list value as last stored: its version, its chunks (serialized items and name:
    an unchanged chunk is neither compressed nor hashed again) and how many references
    since the last that named every chunk."""

    version: Any
    chunks: list[tuple[tuple[Typed, ...], str]]
    deltas: int


class Thread:
    """One thread as a saver knows it: its run, the index of its log, the run's state
    and, while this saver holds the thread's lease, its journal (the single writer)."""

    def __init__(self, thread_id: str, run_id: str) -> None:
        self.thread_id, self.run_id = thread_id, run_id
        self.index = GraphIndex()
        self.state = RunState()
        self.journal: RunJournal | None = None
        self.lock = threading.RLock()
        # Per (namespace, channel): the last list value this saver stored.
        self.lists: dict[tuple[str, str], ListValue] = {}

    def absorb(self, events: Sequence[Event]) -> None:
        for event in events:
            if event.seq <= self.index.last_seq:
                continue
            apply(self.state, event)  # (a held thread's journal folds its own appends)
            self.index.apply(event)


def _conf(config: RunnableConfig) -> tuple[str, str]:
    conf = config["configurable"]
    return str(conf["thread_id"]), str(conf.get("checkpoint_ns", ""))


class JournalSaver(BaseCheckpointSaver[str]):
    """A LangGraph checkpoint saver on an agentjournal ``Store`` (sqlite, postgres,
    jsonl): sync methods, and their ``a*`` twins run in a thread.

    ``owner``: who holds the threads' leases (default: this process). ``ttl``: the
    lease's time to live; a heartbeat renews it every ttl/3 while it is held.
    """

    def __init__(self, store: Store, *, serde: SerializerProtocol | None = None,
                 owner: str | None = None, ttl: float = 30.0) -> None:
        super().__init__(serde=serde)
        self.store = store
        self.owner = owner or default_owner()
        self.ttl = ttl
        self._threads: dict[str, Thread] = {}
        self._lock = threading.Lock()

    # --- threads and their leases ----------------------------------------------------

    def thread(self, thread_id: str) -> Thread:
        """The thread's current run, its log read up to now. ``ArchivedRunError`` when gc
        archived it (``agentjournal restore`` brings it back)."""
        with self._lock:
            t = self._threads.get(thread_id)
            if t is None:
                t = self._threads[thread_id] = Thread(thread_id, self._current_run(thread_id))
        with t.lock:
            if t.journal is None:
                t.absorb(list(self.store.read(t.run_id, after_seq=t.index.last_seq)))
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

    def hold(self, thread_id: str) -> RunJournal:
        """Take the thread's lease (if this saver does not hold it yet) and return its
        journal. ``LeaseHeldError`` when another process holds it."""
        t = self.thread(thread_id)
        with t.lock:
            if t.journal is None:
                lease = take_lease(self.store, t.run_id, self.owner, self.ttl)
                try:  # the log as it is now that nobody else may write it
                    t.absorb(list(self.store.read(t.run_id, after_seq=t.index.last_seq)))
                except BaseException:
                    self.store.release(lease)
                    raise
                t.journal = RunJournal(self.store, lease, t.state, ttl=self.ttl)
                t.journal.keep_alive()
            return t.journal

    def release(self, thread_id: str) -> None:
        """Release the thread's lease, if this saver holds it."""
        t = self._threads.get(thread_id)
        if t is not None:
            with t.lock:
                self._drop(t)

    def _drop(self, t: Thread) -> None:
        if t.journal is not None:
            t.journal.close()
            t.journal = None

    def close(self) -> None:
        """Release every lease this saver holds (the store stays open: it is the caller's)."""
        for t in list(self._threads.values()):
            with t.lock:
                self._drop(t)

    def __enter__(self) -> JournalSaver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def append(self, thread_id: str, facts: list[tuple[EventType, dict[str, Any]]], *,
               input: list[str] | None = None) -> None:
        """Append ``facts`` to the thread's run in one atomic batch under its lease; the
        run is started (with ``input``) or resumed (after a finish) in the same batch."""
        t = self.thread(thread_id)
        with t.lock:
            journal = self.hold(thread_id)
            first: list[tuple[EventType, dict[str, Any]]] = []
            if t.index.last_seq == 0:
                start = {"agent": AGENT, "task": "", "thread_id": thread_id}
                first.append((EventType.RUN_STARTED, {**start, **({"input": input} if input
                                                                  else {})}))
                input = None
            elif t.index.finished:
                first.append((EventType.RUN_RESUMED, {}))
            if input is not None:
                first.append((EventType.GRAPH_INPUT, {"input": input}))
            facts = [*first, *facts]
            try:
                events = journal.record_all(facts, redact=False)
            except FencedError:
                self._drop(t)  # another process took the thread over: let go of it
                raise
            t.index.apply_all(events)

    # --- BaseCheckpointSaver ----------------------------------------------------------

    def put(self, config: RunnableConfig, checkpoint: Checkpoint,
            metadata: CheckpointMetadata, new_versions: ChannelVersions) -> RunnableConfig:
        thread_id, ns = _conf(config)
        t = self.thread(thread_id)
        with t.lock:
            self.hold(thread_id)
            values = checkpoint["channel_values"]
            blobs = Blobs(t.index.blobs)
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
        version (an unchanged chunk is not even compressed again), every DELTAS-th all."""
        if type(value) is not list or not value:
            return blobs.value([self.serde.dumps_typed(value)])
        last = t.lists.get((ns, channel))
        chunks: list[tuple[tuple[Typed, ...], str]] = []
        for k, start in enumerate(range(0, len(value), CHUNK)):
            items = tuple(self.serde.dumps_typed(v) for v in value[start:start + CHUNK])
            if last is not None and k < len(last.chunks) and last.chunks[k][0] == items and (
                    last.chunks[k][1] in t.index.blobs or last.chunks[k][1] in blobs.new):
                chunks.append(last.chunks[k])
            else:
                chunks.append((items, blobs.add(pack_chunk(items))))
        names = [name for _, name in chunks]
        based = last is not None and last.deltas < DELTAS and (
            (ns, channel, last.version) in t.index.values)
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
            blobs = Blobs(t.index.blobs)
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
        t = self.thread(thread_id)
        with t.lock:
            ours = t.index.checkpoints.get(ns, {})
            wanted = get_checkpoint_id(config)
            if wanted is None:
                wanted = max(ours, default=None)
            record = ours.get(wanted) if wanted is not None else None
            return None if record is None else self._tuple(t, record)

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
            t = self.thread(thread_id)
            with t.lock:
                records = sorted((r for space, cps in t.index.checkpoints.items()
                                  if ns is None or space == ns for r in cps.values()),
                                 key=lambda r: r.id, reverse=True)
                found: list[CheckpointTuple] = []
                for r in records:
                    if limit is not None and len(found) >= limit:
                        break
                    if (wanted and r.id != wanted) or (before_id and r.id >= before_id):
                        continue
                    if filter:
                        meta = self.serde.loads_typed(r.metadata)
                        if any(meta.get(k) != v for k, v in filter.items()):
                            continue
                    found.append(self._tuple(t, r))
            if limit is not None:
                limit -= len(found)
            yield from found
            if limit is not None and limit <= 0:
                return

    def _thread_ids(self) -> builtins.list[str]:
        """Every thread in the store (its run's ``run_started`` names it)."""
        ids = []
        for info in self.store.list_runs():
            if info.run_id.startswith("lg-"):
                first = next(iter(self.store.read(info.run_id)), None)
                if first is not None and first.payload.get("agent") == AGENT:
                    ids.append(str(first.payload["thread_id"]))
        return sorted(set(ids))

    def _tuple(self, t: Thread, r: CheckpointRecord) -> CheckpointTuple:
        checkpoint = self.serde.loads_typed(r.checkpoint)
        checkpoint["channel_values"] = self._values(t, r.ns, checkpoint["channel_versions"])
        writes = t.index.writes.get((r.ns, r.id), {})
        ordered = sorted(writes.items(),
                         key=lambda kv: writes_sort_key(kv[1].task_path, kv[0][0], kv[0][1]))
        pending = []
        for _, w in ordered:
            items = t.index.read_value(w.ref)
            assert items is not None  # a write always has a value
            pending.append((w.task_id, w.channel, self.serde.loads_typed(items[0])))
        conf = {"thread_id": t.thread_id, "checkpoint_ns": r.ns}
        return CheckpointTuple(
            config={"configurable": {**conf, "checkpoint_id": r.id}},
            checkpoint=checkpoint,
            metadata=self.serde.loads_typed(r.metadata),
            parent_config=({"configurable": {**conf, "checkpoint_id": r.parent_id}}
                           if r.parent_id else None),
            pending_writes=pending,
        )

    def _values(self, t: Thread, ns: str, versions: ChannelVersions) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for channel, version in versions.items():
            ref = t.index.values.get((ns, channel, version))
            if ref is None:
                continue
            if "l" in ref or "d" in ref:
                items = t.index.read_list(ns, channel, ref)
                values[channel] = [self.serde.loads_typed(item) for item in items]
            elif (one := t.index.read_value(ref)) is not None:
                values[channel] = self.serde.loads_typed(one[0])
        return values

    def delete_thread(self, thread_id: str) -> None:
        """Delete the thread's log: its run is replaced by a tombstone naming no archive
        (``DELETED``), and the thread id starts again in a new run. An archived thread
        is ``ArchivedRunError``: restore it first."""
        t = self.thread(thread_id)
        with t.lock:
            if not self.store.last_seq(t.run_id):
                return
            journal = self.hold(thread_id)
            records = self.store.records(t.run_id)
            stone = Tombstone(run_id=t.run_id, last_seq=len(records),
                              digest=records_digest(records), archive=DELETED,
                              deleted_at=now())
            self.store.delete_run(stone, epoch=journal.lease.epoch)
            self._drop(t)
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

    def record_input(self, config: RunnableConfig, input: Any) -> Any:
        """Hold the thread and record ``input`` durably before the graph runs, so a crash
        before LangGraph's first checkpoint loses nothing; returns the input to run with.
        ``None`` (a resume) returns the input recorded by an invocation that crashed
        before its input checkpoint, else None (LangGraph resumes from its checkpoint).
        A ``Command`` is not recorded: it acts on a checkpoint, which holds its effects."""
        thread_id, _ = _conf(config)
        self.hold(thread_id)
        t = self.thread(thread_id)
        if input is None:
            pending = t.index.pending_input
            return None if pending is None else self.serde.loads_typed(pending)
        if type(input).__name__ != "Command":
            self.append(thread_id, [], input=_typed(self.serde.dumps_typed(input)))
        return input

    def finish(self, config: RunnableConfig, outcome: str = "done") -> None:
        """Record that the thread's graph ran to its end (``run_finished``): gc may then
        archive the thread; a later invocation resumes the run."""
        thread_id, _ = _conf(config)
        t = self.thread(thread_id)
        if not t.index.finished and t.index.last_seq:
            self.append(thread_id, [(EventType.RUN_FINISHED, {"outcome": outcome})])


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
           release: bool = True, **kwargs: Any) -> Any:
    """Run ``graph`` on a thread durably: hold the thread's lease for the whole
    invocation (``LeaseHeldError`` if another process holds it), record the input
    before the graph runs (``input=None`` resumes, with the input of an invocation
    that crashed before its first checkpoint if there is one), and record the finish
    when the graph ends. ``durability`` defaults to LangGraph's ``"sync"``."""
    saver = _saver_of(graph)
    thread_id, _ = _conf(config)
    try:
        given = saver.record_input(config, input)
        result = graph.invoke(given, config, durability=durability, **kwargs)
        if _ended(graph, config):
            saver.finish(config)
        return result
    finally:
        if release:
            saver.release(thread_id)


async def ainvoke(graph: Any, input: Any, config: RunnableConfig, *,
                  durability: str = "sync", release: bool = True, **kwargs: Any) -> Any:
    """``invoke`` for async code."""
    saver = _saver_of(graph)
    thread_id, _ = _conf(config)
    try:
        given = await asyncio.to_thread(saver.record_input, config, input)
        result = await graph.ainvoke(given, config, durability=durability, **kwargs)
        if await asyncio.to_thread(_ended, graph, config):
            await asyncio.to_thread(saver.finish, config)
        return result
    finally:
        if release:
            await asyncio.to_thread(saver.release, thread_id)

