"""The broker's SQLite store copies its WAL back into the database from a thread of its
own, so the reactor thread that commits never waits for a checkpoint's sync."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from devhost.broker.store import SqliteStore, StoredMessage


def _messages(count: int, size: int) -> list[StoredMessage]:
    return [StoredMessage("q", i, False, b"x" * size, f"m-{i}", 0, 0, 0) for i in range(count)]


def test_the_wal_is_checkpointed_by_the_store_thread_and_not_in_the_commit(
    tmp_path: Path,
) -> None:
    path = tmp_path / "broker.sqlite3"
    store = SqliteStore(str(path), checkpoint_seconds=0.05)
    try:
        initial = path.stat().st_size
        for message in _messages(100, 2000):  # ~200 KB: far below SQLite's own 1,000 pages
            store.save(message)
        store.flush(now_ms=1)
        deadline = time.monotonic() + 10
        while path.stat().st_size < initial + 150_000 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert path.stat().st_size >= initial + 150_000  # copied into the database file
        # The committing connection never checkpoints on its own.
        (autocheckpoint,) = store._db.execute("PRAGMA wal_autocheckpoint").fetchone()
        assert autocheckpoint == 0
    finally:
        store.close()
    reopened = sqlite3.connect(path)
    try:
        assert reopened.execute("SELECT count(*) FROM messages").fetchone() == (100,)
    finally:
        reopened.close()


def test_a_reopened_store_loads_what_was_flushed_before_close(tmp_path: Path) -> None:
    path = str(tmp_path / "broker.sqlite3")
    store = SqliteStore(path, checkpoint_seconds=3600)  # only close's final checkpoint
    for message in _messages(5, 10):
        store.save(message)
    store.flush(now_ms=1)
    store.close()
    again = SqliteStore(path)
    try:
        loaded = again.load(now_ms=2)
        assert [m.seq for m in loaded.messages] == [0, 1, 2, 3, 4]
    finally:
        again.close()
