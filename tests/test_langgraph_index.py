"""A LangGraph thread's head view (``_graphviews``): what a fresh handle reads equals a
full fold of the log, on every backend; a head behind the log is not served, the log
is read instead; a hand-edited one is reported by ``check_thread_index`` and repaired
by ``rebuild_thread_index``."""

from __future__ import annotations

import operator
import random
from collections.abc import Callable, Iterator
from typing import Annotated, Any, TypedDict

import msgspec
import pytest

pytest.importorskip("langgraph")

from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from agentjournal import open_store
from agentjournal.events import Event, EventType, now
from agentjournal.integrations._graphlog import thread_run_id
from agentjournal.integrations._graphviews import (
    FORMAT,
    HEAD,
    check_thread_index,
    decode_index,
    encode_index,
    fold,
    head_of,
    rebuild_thread_index,
)
from agentjournal.integrations.langgraph import JournalSaver
from agentjournal.store import Store

from .conftest import backend_params

THREAD = "indexed"
RUN = thread_run_id(THREAD)


class Note(TypedDict):
    note: str


class Talk(Note):
    messages: Annotated[list[dict[str, Any]], operator.add]


def _graph(saver: JournalSaver, turns: int, asks: bool = False,
           probe: Callable[[], None] = lambda: None) -> Any:
    """A model node and a tool node taking turns (a message each, so the history grows
    past a chunk), a subgraph as a node (a second namespace), and, ``asks``, a node that
    stops for a person (a pending interrupt write on the newest checkpoint). ``probe``
    runs in each tool step, while the writer holds the thread."""
    def model(state: Talk) -> dict[str, Any]:
        n = len(state["messages"])
        asked = [m["role"] for m in state["messages"]][::-1].index("user")
        return {"messages": [{"role": "assistant", "content": f"turn {n}",
                              "call": asked // 2 < turns}]}

    def tools(state: Talk) -> dict[str, Any]:
        probe()
        return {"messages": [{"role": "tool", "content": f"result {len(state['messages'])}"}]}

    def noted(state: Note) -> dict[str, Any]:
        return {"note": state["note"] + "."}

    def person(state: Talk) -> dict[str, Any]:
        answer = interrupt({"question": "ship it?"})
        return {"messages": [{"role": "user", "content": f"person says {answer}"}]}

    inner = StateGraph(Note)
    inner.add_node("noted", noted)
    inner.add_edge(START, "noted")
    inner.add_edge("noted", END)
    builder = StateGraph(Talk)
    builder.add_node("model", model)
    builder.add_node("tools", tools)
    builder.add_node("inner", inner.compile())
    builder.add_node("person", person)
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", lambda s: "tools" if s["messages"][-1]["call"]
                                  else ("person" if asks else END))
    builder.add_edge("tools", "inner")
    builder.add_edge("inner", "model")
    builder.add_edge("person", END)
    return builder.compile(checkpointer=saver)


def _config(**extra: Any) -> Any:
    return {"configurable": {"thread_id": THREAD, **extra}, "recursion_limit": 500}


def _run(store: Store, turns: int, *, asks: bool = False, text: str = "start",
         probe: Callable[[], None] = lambda: None) -> None:
    saver = JournalSaver(store)
    _graph(saver, turns, asks, probe).invoke({"messages": [{"role": "user", "content": text,
                                                     "call": False}], "note": ""},
                                      _config(), durability="sync")
    saver.close()


def _read(store: Store) -> dict[str, Any]:
    """What a fresh handle reads of the thread: the newest checkpoint, one older by id,
    the whole list, and the list of a namespace filtered and limited."""
    saver = JournalSaver(store)
    latest = saver.get_tuple(_config(checkpoint_ns=""))
    assert latest is not None
    listed = list(saver.list(_config()))
    older = listed[len(listed) // 2]
    got = {"latest": latest, "older": saver.get_tuple(older.config), "listed": listed,
           "limited": list(saver.list(_config(checkpoint_ns=""), limit=3,
                                      filter={"source": "loop"}))}
    saver.close()
    return got


def _blank_views(store: Store) -> None:
    """A head that does not decode: a reader folds the whole log instead."""
    store.put_view(RUN, HEAD, store.last_seq(RUN), b"")


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    s = open_store(store_url)
    yield s
    s.close()


@backend_params()
def test_a_fresh_handle_reads_what_a_fold_of_the_whole_log_reads(store: Store) -> None:
    _run(store, 30, asks=True)
    assert store.view(RUN, HEAD) is not None
    assert check_thread_index(store, RUN) == []
    from_views = _read(store)
    assert from_views["latest"].pending_writes  # (the interrupt, read from the head)
    assert len(from_views["latest"].checkpoint["channel_values"]["messages"]) == 62
    assert {t.config["configurable"]["checkpoint_ns"] for t in from_views["listed"]} > {""}
    _blank_views(store)
    assert _read(store) == from_views


@backend_params()
def test_each_stored_view_equals_a_fresh_fold_of_the_log_to_its_seq(store: Store) -> None:
    rng = random.Random(44)
    found: list[list[str]] = []
    seen = set()

    def probe() -> None:  # (mid-run: the head the last writer left, behind the log)
        found.append(check_thread_index(store, RUN))
        seen.add(store.view(RUN, HEAD)[0] if store.view(RUN, HEAD) else 0)

    for n in range(4):  # heads stored at uneven points, by four writers in turn
        _run(store, rng.randint(5, 15), text=f"turn {n}", probe=probe)
        found.append(check_thread_index(store, RUN))
    assert found == [[]] * len(found)
    assert len(seen) == 4 and len(found) > 20
    last = store.last_seq(RUN)
    for upto in [*sorted(rng.sample(range(1, last + 1), 12)), last]:
        fresh = fold(store, RUN, upto=upto)
        assert decode_index(encode_index(fresh)) == fresh
        head = head_of(fresh)
        if head is not None:
            assert decode_index(encode_index(head)) == head


@backend_params()
def test_a_view_behind_the_log_is_caught_up_not_served(store: Store) -> None:
    _run(store, 20)
    behind = store.view(RUN, HEAD)
    assert behind is not None
    before = _read(store)
    _run(store, 5, text="more")  # appended, and then the head put back as it was
    store.put_view(RUN, HEAD, *behind)
    after = _read(store)
    messages = after["latest"].checkpoint["channel_values"]["messages"]
    assert messages[-1]["content"] == f"turn {len(messages) - 1}"  # (the newest answer)
    assert len(messages) > len(before["latest"].checkpoint["channel_values"]["messages"])
    assert len(after["listed"]) > len(before["listed"])
    _blank_views(store)
    assert _read(store) == after


@backend_params()
def test_a_hand_edited_view_is_reported_and_rebuilt(store: Store) -> None:
    _run(store, 10, asks=True)
    seq, body = store.view(RUN, HEAD)  # type: ignore[misc]
    head = decode_index(body)
    record = next(iter(head.checkpoints[""].values()))
    record.seq += 1
    store.put_view(RUN, HEAD, seq, encode_index(head))

    found = check_thread_index(store, RUN)
    assert len(found) == 1, found
    assert found[0].startswith(f"{HEAD} (seq {seq}): checkpoint ('', '{record.id}')")
    assert f"seq={record.seq}" in found[0] and f"seq={record.seq - 1}" in found[0]
    rebuild_thread_index(store, RUN)
    assert check_thread_index(store, RUN) == []
    assert store.view(RUN, HEAD)[0] == store.last_seq(RUN)  # type: ignore[index]
    assert _read(store)["latest"].checkpoint["id"] == record.id


@backend_params()
def test_a_view_past_the_end_of_the_log_or_not_decoding_is_reported(store: Store) -> None:
    _run(store, 3)
    last = store.last_seq(RUN)
    store.put_view(RUN, HEAD, last + 5, store.view(RUN, HEAD)[1])  # type: ignore[index]
    assert check_thread_index(store, RUN) == [
        f"{HEAD}: folded to seq {last + 5}, but the log ends at {last}"]
    got = _read(store)  # (not used: the log is folded)
    assert len(got["latest"].checkpoint["channel_values"]["messages"]) == 8
    store.put_view(RUN, HEAD, last, b"\x93not a view")
    found = check_thread_index(store, RUN)
    assert len(found) == 1 and found[0].startswith(f"{HEAD}: not a LangGraph index: ")
    assert _read(store) == got
    rebuild_thread_index(store, RUN)
    body = store.view(RUN, HEAD)[1]  # type: ignore[index]
    assert body[:2] == bytes([0x9F, FORMAT])  # (an array of 15 fields, the first its format)
    store.put_view(RUN, HEAD, last, body[:1] + bytes([FORMAT - 1]) + body[2:])
    assert check_thread_index(store, RUN) == [
        f"{HEAD}: a LangGraph index of format {FORMAT - 1}, not {FORMAT}"]
    assert _read(store) == got  # (a head of another release's format: not read)
    rebuild_thread_index(store, RUN)
    assert check_thread_index(store, RUN) == []


def test_a_head_names_the_chunks_its_lists_share_once(tmp_path: Any) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'shared.db'}")
    _run(store, 40)
    body = store.view(RUN, HEAD)[1]  # type: ignore[index]
    fields = msgspec.msgpack.decode(body)
    rows, joined = fields[9], fields[14]
    lists = [ref for _, _, _, ref in rows if "l" in ref]
    assert len(lists) > 5 and "b" not in lists[0] and all("b" in ref for ref in lists[1:])
    head = decode_index(body)
    full = [ref["l"] for ref in head.values.values() if "l" in ref]
    assert sum(len(ref["l"]) for ref in lists) * 3 < sum(len(names) for names in full)
    assert all(isinstance(array, bytes) for array in joined.values())  # (skipped whole)
    based = next(n for n, (_, _, _, ref) in enumerate(rows) if "b" in ref)
    for wrong in ([based, 1], 7, [0, 10**6]):  # (itself, no pair, more than there is)
        rows[based][3]["b"] = wrong
        with pytest.raises(ValueError, match="not a LangGraph index: value"):
            decode_index(msgspec.msgpack.encode(fields))
    older = [FORMAT - 1, *fields[1:14], {key: [1, 2] for key in joined}]  # (arrays, then)
    with pytest.raises(ValueError, match=f"index of format {FORMAT - 1}, not {FORMAT}"):
        decode_index(msgspec.msgpack.encode(older))
    store.close()


def test_a_run_that_is_no_thread_has_no_views_to_check_or_rebuild(tmp_path: Any) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'plain.db'}")
    lease = store.acquire("plain-run", "me", 30)
    store.append("plain-run", [Event(run_id="plain-run", seq=1, type=EventType.RUN_STARTED,
                                     ts=now(), epoch=lease.epoch,
                                     payload={"agent": "x", "input": "hi"})],
                 expected_seq=0, epoch=lease.epoch)
    rebuild_thread_index(store, "plain-run")
    assert store.view("plain-run", HEAD) is None
    assert check_thread_index(store, "plain-run") == []
    store.close()


def test_resume_with_command_reads_its_interrupt_from_a_fresh_handle(tmp_path: Any) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'ask.db'}")
    _run(store, 2, asks=True)
    saver = JournalSaver(store)
    out = _graph(saver, 2, asks=True).invoke(Command(resume="yes"), _config(),
                                            durability="sync")
    saver.close()
    assert out["messages"][-1]["content"] == "person says yes"
    assert check_thread_index(store, RUN) == []
    store.close()


def _listing(store: Store, queries: list[dict[str, Any]]) -> tuple[list[Any], list[bool]]:
    """Each query's answer from a fresh handle, and whether it read the whole index."""
    answers, indexed = [], []
    for q in queries:
        saver = JournalSaver(store)
        configurable = {k: q[k] for k in ("checkpoint_ns", "checkpoint_id") if k in q}
        if "get" in q:
            answers.append(saver.get_tuple(_config(**configurable)))
        else:
            answers.append(list(saver.list(_config(**configurable), limit=q.get("limit"),
                                           filter=q.get("filter"), before=q.get("before"))))
        indexed.append(saver._threads[THREAD].loaded)
        saver.close()
    return answers, indexed


@backend_params()
def test_a_fresh_handles_list_and_get_answer_from_the_head_what_the_log_says(
        store: Store) -> None:
    _run(store, 12, asks=True)
    listed = _read(store)["listed"]
    ids = [t.config["configurable"]["checkpoint_id"] for t in listed
           if t.config["configurable"]["checkpoint_ns"] == ""]
    root = {"checkpoint_ns": ""}
    queries = [{"limit": 1}, {"limit": 2}, {**root, "limit": 10}, {**root, "limit": 11},
               {**root, "limit": 4, "filter": {"source": "loop"}},
               {**root, "limit": 2, "before": _config(checkpoint_id=ids[3])},
               {"limit": 10},  # (the subgraph's namespaces too: the head lacks some)
               {**root, "checkpoint_id": ids[0]}, {**root, "checkpoint_id": ids[-1]}, {},
               {**root, "get": True, "checkpoint_id": ids[5]},
               {**root, "get": True, "checkpoint_id": ids[-1]},
               {"get": True, "checkpoint_ns": "nowhere"}]
    from_views, indexed = _listing(store, queries)
    assert indexed == [False, False, False, True, False, False, True, False, True, True,
                       False, True, False]
    assert [len(a) for a in from_views[:10]] == [1, 2, 10, 11, 4, 2, 10, 1, 1, len(listed)]
    assert from_views[-1] is None and from_views[-2] is not None
    _blank_views(store)
    assert _listing(store, queries)[0] == from_views


def test_verify_reports_a_hand_edited_head_and_rebuilds_it_and_reindex_does_too(
        tmp_path: Any) -> None:
    from click.testing import CliRunner

    from agentjournal.cli import cli

    url = f"sqlite:///{tmp_path / 'threads.db'}"

    def edit() -> int:
        with open_store(url) as store:
            seq, body = store.view(RUN, HEAD)  # type: ignore[misc]
            head = decode_index(body)
            next(iter(head.checkpoints[""].values())).seq += 1
            store.put_view(RUN, HEAD, seq, encode_index(head))
            return seq

    def agentjournal(*args: str) -> Any:
        return CliRunner().invoke(cli, [*args, "--store", url], catch_exceptions=False)

    with open_store(url) as store:
        _run(store, 6)
    seq = edit()
    verified = agentjournal("verify", "--all")
    assert verified.exit_code == 3
    assert f"{RUN}: {HEAD} (seq {seq}): checkpoint" in verified.stderr
    assert agentjournal("verify", "--all").exit_code == 0  # rebuilt: never served again
    edit()
    assert agentjournal("reindex").exit_code == 0
    with open_store(url) as store:
        assert check_thread_index(store, RUN) == []
