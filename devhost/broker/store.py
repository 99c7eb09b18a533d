"""Persistence of queued messages so a broker restart keeps them.

The engine keeps all state in memory and tells the store what changed; the store coalesces
those changes per message (a message sent and completed within one batch is never written) and
writes them in one SQLite transaction when the server flushes, which it does before it
acknowledges a send. Locks are deliberately not stored: after a restart every message that was
locked is available again, as it would be once its lock expired.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from typing import Protocol

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS messages (
    queue TEXT NOT NULL,
    seq INTEGER NOT NULL,
    dead_letter INTEGER NOT NULL,
    payload BLOB NOT NULL,
    message_id TEXT,
    enqueued_ms INTEGER NOT NULL,
    visible_ms INTEGER NOT NULL,
    delivery_count INTEGER NOT NULL,
    PRIMARY KEY (queue, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS sequences (
    queue TEXT PRIMARY KEY,
    last_seq INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS message_ids (
    queue TEXT NOT NULL,
    message_id TEXT NOT NULL,
    expires_ms INTEGER NOT NULL,
    PRIMARY KEY (queue, message_id)
) WITHOUT ROWID;
"""


@dataclass(slots=True)
class StoredMessage:
    """One row: ``queue`` is the base queue; dead-lettered messages keep their sequence number."""

    queue: str
    seq: int
    dead_letter: bool
    payload: bytes
    message_id: str | None
    enqueued_ms: int
    visible_ms: int
    delivery_count: int


@dataclass(slots=True)
class Snapshot:
    messages: list[StoredMessage] = field(default_factory=list)
    last_sequence: dict[str, int] = field(default_factory=dict)
    message_ids: list[tuple[str, str, int]] = field(default_factory=list)


class Store(Protocol):
    @property
    def durable(self) -> bool: ...

    def load(self, now_ms: int) -> Snapshot: ...

    def save(self, message: StoredMessage) -> None: ...

    def delete(self, queue: str, seq: int) -> None: ...

    def remember_id(self, queue: str, message_id: str, expires_ms: int) -> None: ...

    def set_last_sequence(self, queue: str, seq: int) -> None: ...

    @property
    def pending(self) -> bool: ...

    def flush(self, now_ms: int) -> None: ...

    def close(self) -> None: ...


class MemoryStore:
    """No persistence: the engine's memory is the only copy (fast tests)."""

    @property
    def durable(self) -> bool:
        return False

    def load(self, now_ms: int) -> Snapshot:
        return Snapshot()

    def save(self, message: StoredMessage) -> None:
        pass

    def delete(self, queue: str, seq: int) -> None:
        pass

    def remember_id(self, queue: str, message_id: str, expires_ms: int) -> None:
        pass

    def set_last_sequence(self, queue: str, seq: int) -> None:
        pass

    @property
    def pending(self) -> bool:
        return False

    def flush(self, now_ms: int) -> None:
        pass

    def close(self) -> None:
        pass


class SqliteStore:
    """SQLite in WAL mode with synchronous=NORMAL: a flushed batch survives a crash of
    the broker (kill -9 included), since a WAL commit is in the OS before the send is
    acknowledged. Not an OS crash or power cut: FULL would fsync every commit, which
    blocked the reactor thread for ~3 ms per commit and most of its time under load,
    a guarantee nothing else in the local stack gives (Azurite's saves and the
    simulator's ledger do not fsync either).

    The WAL is copied back into the database (a checkpoint, which does fsync) by a thread
    of its own: SQLite's automatic checkpoint runs inside the commit that fills the WAL,
    which here is the reactor thread, and every queue stands still while it syncs."""

    _PRUNE_EVERY_MS = 60_000
    SLOW_FLUSH_SECONDS = 0.25

    def __init__(self, path: str, checkpoint_seconds: float = 1.0) -> None:
        # The store is opened by the starting thread and then used only by the reactor thread.
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA wal_autocheckpoint=0")
        self._db.executescript(_SCHEMA)
        self._checkpointer = Checkpointer(path, checkpoint_seconds)
        self._messages: dict[tuple[str, int], StoredMessage | None] = {}
        self._ids: dict[tuple[str, str], int] = {}
        self._sequences: dict[str, int] = {}
        self._next_prune_ms = 0

    @property
    def durable(self) -> bool:
        return True

    def load(self, now_ms: int) -> Snapshot:
        db = self._db
        db.execute("DELETE FROM message_ids WHERE expires_ms < ?", (now_ms,))
        rows = db.execute(
            "SELECT queue, seq, dead_letter, payload, message_id, enqueued_ms, visible_ms,"
            " delivery_count FROM messages ORDER BY queue, seq"
        )
        messages = [
            StoredMessage(q, s, bool(d), bytes(p), m, e, v, c) for q, s, d, p, m, e, v, c in rows
        ]
        last = dict(db.execute("SELECT queue, last_seq FROM sequences").fetchall())
        ids = db.execute("SELECT queue, message_id, expires_ms FROM message_ids").fetchall()
        return Snapshot(messages, last, [(q, m, e) for q, m, e in ids])

    def save(self, message: StoredMessage) -> None:
        self._messages[(message.queue, message.seq)] = message

    def delete(self, queue: str, seq: int) -> None:
        self._messages[(queue, seq)] = None

    def remember_id(self, queue: str, message_id: str, expires_ms: int) -> None:
        self._ids[(queue, message_id)] = expires_ms

    def set_last_sequence(self, queue: str, seq: int) -> None:
        self._sequences[queue] = seq

    @property
    def pending(self) -> bool:
        return bool(self._messages or self._ids or self._sequences)

    def flush(self, now_ms: int) -> None:
        """Write every pending change in one transaction; on error nothing is dropped."""
        if not self.pending and now_ms < self._next_prune_ms:
            return
        began = time.monotonic()
        self._write(now_ms)
        took = time.monotonic() - began
        if took > self.SLOW_FLUSH_SECONDS:
            log.warning("store flush took %.0f ms: every queue waited for it", took * 1000)

    def _write(self, now_ms: int) -> None:
        db = self._db
        deletes = [key for key, row in self._messages.items() if row is None]
        upserts = [
            (r.queue, r.seq, int(r.dead_letter), r.payload, r.message_id, r.enqueued_ms, *rest)
            for r in self._messages.values()
            if r is not None
            for rest in [(r.visible_ms, r.delivery_count)]
        ]
        db.execute("BEGIN")
        try:
            db.executemany("DELETE FROM messages WHERE queue = ? AND seq = ?", deletes)
            db.executemany(
                "INSERT OR REPLACE INTO messages VALUES (?, ?, ?, ?, ?, ?, ?, ?)", upserts
            )
            db.executemany(
                "INSERT OR REPLACE INTO message_ids VALUES (?, ?, ?)",
                [(q, m, e) for (q, m), e in self._ids.items()],
            )
            db.executemany(
                "INSERT OR REPLACE INTO sequences VALUES (?, ?)", list(self._sequences.items())
            )
            if now_ms >= self._next_prune_ms:
                db.execute("DELETE FROM message_ids WHERE expires_ms < ?", (now_ms,))
                self._next_prune_ms = now_ms + self._PRUNE_EVERY_MS
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        self._messages.clear()
        self._ids.clear()
        self._sequences.clear()

    def close(self) -> None:
        self._checkpointer.stop()
        self._db.close()


class Checkpointer:
    """Copies the WAL back into the database every `seconds` on its own connection.

    PASSIVE never waits for the writer, and the sqlite3 module lets go of the GIL while
    SQLite works, so the reactor thread goes on committing meanwhile."""

    def __init__(self, path: str, seconds: float) -> None:
        self._path = path
        self._seconds = seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="broker-checkpoint", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        db = sqlite3.connect(self._path, check_same_thread=False, isolation_level=None)
        try:
            while not self._stop.wait(self._seconds):
                try:
                    db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                except sqlite3.Error as exc:
                    log.warning("checkpoint failed, tried again in %.0f s: %s", self._seconds, exc)
            db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        finally:
            db.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def open_store(path: str | None) -> Store:
    if path is None or path == ":memory:":
        return MemoryStore()
    return SqliteStore(path)
