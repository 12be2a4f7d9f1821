"""Store failures a user can meet, each as its own error, with nothing changed on disk."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from agentjournal import (
    CorruptLogError,
    EventType,
    NotAStoreError,
    StoreUrlError,
    make_events,
    open_store,
)
from agentjournal.store.sqlite import SQLiteStore


def test_a_text_file_is_not_a_store(tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("shopping list\n" * 100)
    with pytest.raises(NotAStoreError, match="not an agentjournal store"):
        open_store(f"sqlite:///{notes}")
    assert notes.read_text() == "shopping list\n" * 100
    with pytest.raises(NotAStoreError, match="directory"):
        open_store(f"jsonl:///{notes}")


def test_unknown_scheme_is_a_url_error() -> None:
    with pytest.raises(StoreUrlError, match="unknown scheme 'mysql'"):
        open_store("mysql://localhost/x")
    with pytest.raises(StoreUrlError, match="durability"):
        open_store("sqlite:///x.db?durability=sometimes")


def test_sqlite_record_that_does_not_decode_is_corruption(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    store = open_store(f"sqlite:///{path}")
    facts = [(EventType.USER_MESSAGE, {"content": str(i)}) for i in range(3)]
    store.append("r1", make_events("r1", 0, 0, facts), expected_seq=0, epoch=0)
    store.close()
    with sqlite3.connect(path) as db:
        db.execute("UPDATE events SET body = X'7B6E6F' WHERE key & 0xFFFFFFFF = 2")
    with pytest.raises(CorruptLogError) as info:
        list(open_store(f"sqlite:///{path}").read("r1"))
    assert (info.value.run_id, info.value.seq) == ("r1", 2)


def test_processes_opening_a_new_sqlite_file_together_all_succeed(tmp_path: Path) -> None:
    # Regression: switching a fresh file to WAL could fail at once with "database
    # is locked" when several openers raced, before the busy timeout applied.
    errors: list[Exception] = []

    def open_one(path: Path, barrier: threading.Barrier) -> None:
        barrier.wait()
        try:
            SQLiteStore(path).close()
        except Exception as exc:
            errors.append(exc)

    for round_ in range(20):
        barrier = threading.Barrier(4)
        threads = [threading.Thread(target=open_one, args=(tmp_path / f"{round_}.db", barrier))
                   for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []


@pytest.mark.parametrize("url, message", [
    ("sqlite:///a%00b.db", "NUL byte"),
    ("postgresql://[::1/db", "does not parse"),
    ("postgresql://u:secret@host:70000/db", "does not parse"),
    ("postgresql://u@host/db?schema=", "schema ''"),
])
def test_bad_urls_are_store_url_errors_not_raw_exceptions(url: str, message: str) -> None:
    with pytest.raises(StoreUrlError, match=message) as info:
        open_store(url)
    assert "secret" not in str(info.value)


def test_an_empty_url_is_not_a_store() -> None:
    with pytest.raises(NotAStoreError, match="empty"):
        open_store("")


def test_mask_secrets_hides_url_and_keyword_passwords() -> None:
    from agentjournal.store import mask_secrets

    assert mask_secrets("see postgresql://me:p%40ss@h:5432/db?x=1 now") == (
        "see postgresql://me:***@h:5432/db?x=1 now")
    assert mask_secrets("host=h password=s3cret user=me") == "host=h password=*** user=me"
    assert mask_secrets("postgresql://me@h/db?password=s3cret&x=1") == (
        "postgresql://me@h/db?password=***&x=1")
    assert mask_secrets("sqlite:///runs.db") == "sqlite:///runs.db"
