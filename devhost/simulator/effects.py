"""The effect ledger: what the remote services really did, one row per idempotency key.

It is what makes the simulator a fair judge of the pattern: an effect is applied at
most once per key, repeats are counted, and permanent rejections are remembered, like a
payment API. It lives in SQLite so that it survives a crash of the local runtime (the
real services would), and each operation is one small synchronous statement batch,
cheap enough to run on the event loop.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

_SCHEMA = """
CREATE TABLE IF NOT EXISTS effects (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    service TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    operation TEXT NOT NULL,
    order_id TEXT NOT NULL,
    calls INTEGER NOT NULL DEFAULT 0,
    applied INTEGER NOT NULL DEFAULT 0,
    outcome TEXT,
    response TEXT,
    traceparents TEXT NOT NULL DEFAULT '[]',
    UNIQUE (service, idempotency_key)
);
CREATE INDEX IF NOT EXISTS effects_order ON effects (order_id);
"""

_COLUMNS = (
    "service, idempotency_key, operation, order_id, calls, applied, outcome, response, traceparents"
)

MAX_TRACEPARENTS = 10
"""The most recent ``traceparent`` headers kept per key: enough to follow the retries of
one step, bounded so a key retried for hours stays one small row."""


class OutcomeKind(Enum):
    APPLIED = "applied"
    REJECTED = "rejected"


@dataclass(frozen=True)
class Outcome:
    """The settled answer for a key: the result, or the permanent-failure problem body."""

    kind: OutcomeKind
    body: dict[str, Any]


@dataclass(frozen=True)
class Effect:
    service: str
    idempotency_key: str
    operation: str
    order_id: str
    calls: int
    applied: int
    outcome: Outcome | None
    traceparents: tuple[str, ...] = ()
    """``traceparent`` headers of the calls that carried one, most recent last."""

    def to_json(self) -> dict[str, Any]:
        return {
            "service": self.service,
            "operation": self.operation,
            "orderId": self.order_id,
            "idempotencyKey": self.idempotency_key,
            "calls": self.calls,
            "applied": self.applied,
            "traceparents": list(self.traceparents),
        }


@dataclass(frozen=True)
class KeyConflict:
    """A key already used for another operation or order; the call is refused, not counted."""

    existing: Effect


def _effect(row: sqlite3.Row) -> Effect:
    outcome = None
    if row["outcome"] is not None:
        outcome = Outcome(OutcomeKind(row["outcome"]), json.loads(row["response"]))
    return Effect(
        service=row["service"],
        idempotency_key=row["idempotency_key"],
        operation=row["operation"],
        order_id=row["order_id"],
        calls=row["calls"],
        applied=row["applied"],
        outcome=outcome,
        traceparents=tuple(json.loads(row["traceparents"])),
    )


class EffectLedger:
    """SQLite-backed ledger; ``path=None`` keeps it in memory for throwaway sessions.

    Scoped per service, as each remote service has its own key space.
    """

    def __init__(self, path: str | Path | None = None) -> None:
        # Opened by the creator but used on the server's loop thread; access is never
        # concurrent, hence no same-thread check.
        self._db = sqlite3.connect(
            ":memory:" if path is None else str(path),
            isolation_level=None,
            check_same_thread=False,
        )
        self._db.row_factory = sqlite3.Row
        if path is not None:
            # WAL + NORMAL: commits survive a process crash and never wait on a reader.
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        columns = {row["name"] for row in self._db.execute("PRAGMA table_info(effects)")}
        if "traceparents" not in columns:  # a ledger file from before traceparents
            self._db.execute(
                "ALTER TABLE effects ADD COLUMN traceparents TEXT NOT NULL DEFAULT '[]'"
            )

    def get(self, service: str, key: str) -> Effect | None:
        """One key's row by the unique index: what an outcome query reads."""
        return self._get(service, key)

    def _get(self, service: str, key: str) -> Effect | None:
        row = self._db.execute(
            f"SELECT {_COLUMNS} FROM effects WHERE service = ? AND idempotency_key = ?",
            (service, key),
        ).fetchone()
        return None if row is None else _effect(row)

    def register_call(
        self,
        service: str,
        key: str,
        operation: str,
        order_id: str,
        traceparent: str | None = None,
    ) -> Effect | KeyConflict:
        """Count a call against its key, or refuse it if the key belongs to another request."""
        with self._transaction():
            existing = self._get(service, key)
            if existing is not None and (
                existing.operation != operation or existing.order_id != order_id
            ):
                return KeyConflict(existing)
            seen = () if existing is None else existing.traceparents
            if traceparent is not None:
                seen = (*seen, traceparent)[-MAX_TRACEPARENTS:]
            if existing is None:
                self._db.execute(
                    "INSERT INTO effects"
                    " (service, idempotency_key, operation, order_id, calls, traceparents)"
                    " VALUES (?, ?, ?, ?, 1, ?)",
                    (service, key, operation, order_id, json.dumps(seen)),
                )
            else:
                self._db.execute(
                    "UPDATE effects SET calls = calls + 1, traceparents = ?"
                    " WHERE service = ? AND idempotency_key = ?",
                    (json.dumps(seen), service, key),
                )
            effect = self._get(service, key)
        assert effect is not None
        return effect

    def settle(
        self, service: str, key: str, operation: str, order_id: str, outcome: Outcome
    ) -> tuple[Outcome, bool]:
        """Record the outcome unless the key already has one.

        Returns the stored outcome and whether this call settled it; a concurrent call
        that lost the race gets the winner's outcome, which is what makes it a repeat.
        """
        with self._transaction():
            # The row may have been cleared by DELETE /_sim/effects mid-call.
            self._db.execute(
                "INSERT OR IGNORE INTO effects"
                " (service, idempotency_key, operation, order_id, calls) VALUES (?, ?, ?, ?, 1)",
                (service, key, operation, order_id),
            )
            cursor = self._db.execute(
                "UPDATE effects SET outcome = ?, response = ?, applied = applied + ?"
                " WHERE service = ? AND idempotency_key = ? AND outcome IS NULL",
                (
                    outcome.kind.value,
                    json.dumps(outcome.body),
                    1 if outcome.kind is OutcomeKind.APPLIED else 0,
                    service,
                    key,
                ),
            )
            if cursor.rowcount == 1:
                return outcome, True
            stored = self._get(service, key)
        assert stored is not None and stored.outcome is not None
        return stored.outcome, False

    def list(self, *, order_id: str | None = None, service: str | None = None) -> list[Effect]:
        clauses: list[str] = []
        params: list[str] = []
        if order_id is not None:
            clauses.append("order_id = ?")
            params.append(order_id)
        if service is not None:
            clauses.append("service = ?")
            params.append(service)
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        rows = self._db.execute(
            f"SELECT {_COLUMNS} FROM effects{where} ORDER BY seq", params
        ).fetchall()
        return [_effect(row) for row in rows]

    def clear(self) -> None:
        self._db.execute("DELETE FROM effects")

    def forget(self, service: str, key: str) -> bool:
        """Drop one key's row, as if the service had lost its record of the request."""
        cursor = self._db.execute(
            "DELETE FROM effects WHERE service = ? AND idempotency_key = ?", (service, key)
        )
        return cursor.rowcount > 0

    def close(self) -> None:
        self._db.close()

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        """BEGIN IMMEDIATE, so a read-then-write stays atomic even if another process
        opens the same file."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")
