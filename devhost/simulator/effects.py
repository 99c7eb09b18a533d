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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from enum import Enum
from pathlib import Path
from typing import Any

Clock = Callable[[], datetime]

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
    first_call_at TEXT,
    applied_at TEXT,
    abandoned INTEGER NOT NULL DEFAULT 0,
    undoes TEXT,
    undone INTEGER,
    arrived_late INTEGER NOT NULL DEFAULT 0,
    UNIQUE (service, idempotency_key)
);
CREATE INDEX IF NOT EXISTS effects_order ON effects (order_id);
"""

_ADDED_COLUMNS = (
    ("traceparents", "TEXT NOT NULL DEFAULT '[]'"),
    ("first_call_at", "TEXT"),
    ("applied_at", "TEXT"),
    ("abandoned", "INTEGER NOT NULL DEFAULT 0"),
    ("undoes", "TEXT"),
    ("undone", "INTEGER"),
    ("arrived_late", "INTEGER NOT NULL DEFAULT 0"),
)
"""Columns a ledger file from an older simulator may lack, added when it is opened."""

_COLUMNS = (
    "service, idempotency_key, operation, order_id, calls, applied, outcome, response,"
    " traceparents, first_call_at, applied_at, abandoned, undoes, undone, arrived_late"
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
    undone: bool | None = None
    """For a compensation: whether it undid an applied do (False: nothing to undo)."""


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
    first_call_at: datetime | None = None
    """None only for a key abandoned before any call, or a row from an older ledger."""
    applied_at: datetime | None = None
    abandoned: bool = False
    undoes: str | None = None
    """For a compensation: the do key it undoes at this service (None for a do)."""
    arrived_late: bool = False
    """The call that settled the key had been held on the network (`lateRate`)."""

    @property
    def undone(self) -> bool | None:
        return None if self.outcome is None else self.outcome.undone

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "service": self.service,
            "operation": self.operation,
            "orderId": self.order_id,
            "idempotencyKey": self.idempotency_key,
            "calls": self.calls,
            "applied": self.applied,
            "traceparents": list(self.traceparents),
            "firstCallAt": iso(self.first_call_at),
            "appliedAt": iso(self.applied_at),
            "abandoned": self.abandoned,
        }
        if self.undoes is not None:
            body |= {"undoes": self.undoes, "undone": self.undone}
        if self.arrived_late:
            body["arrivedLate"] = True
        return body


def iso(moment: datetime | None) -> str | None:
    """ISO-8601 UTC with microseconds and a ``Z``: fixed width, so text order is time order."""
    if moment is None:
        return None
    return moment.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _moment(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)


def utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class KeyConflict:
    """A key already used for another operation or order; the call is refused, not counted."""

    existing: Effect


def _effect(row: sqlite3.Row) -> Effect:
    outcome = None
    if row["outcome"] is not None:
        undone = None if row["undone"] is None else bool(row["undone"])
        outcome = Outcome(OutcomeKind(row["outcome"]), json.loads(row["response"]), undone)
    return Effect(
        service=row["service"],
        idempotency_key=row["idempotency_key"],
        operation=row["operation"],
        order_id=row["order_id"],
        calls=row["calls"],
        applied=row["applied"],
        outcome=outcome,
        traceparents=tuple(json.loads(row["traceparents"])),
        first_call_at=_moment(row["first_call_at"]),
        applied_at=_moment(row["applied_at"]),
        abandoned=bool(row["abandoned"]),
        undoes=row["undoes"],
        arrived_late=bool(row["arrived_late"]),
    )


class EffectLedger:
    """SQLite-backed ledger; ``path=None`` keeps it in memory for throwaway sessions.

    Scoped per service, as each remote service has its own key space.
    """

    def __init__(self, path: str | Path | None = None, clock: Clock = utc_now) -> None:
        self._clock = clock
        self._last_stamp: datetime | None = None
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
        for name, definition in _ADDED_COLUMNS:
            if name not in columns:  # a ledger file from an older simulator
                self._db.execute(f"ALTER TABLE effects ADD COLUMN {name} {definition}")

    def _stamp(self) -> str:
        """The clock's time, nudged to be strictly later than the last stamp, so that
        `appliedAt` order is the order things happened even within a microsecond."""
        now = self._clock()
        if self._last_stamp is not None and now <= self._last_stamp:
            now = self._last_stamp + timedelta(microseconds=1)
        self._last_stamp = now
        stamp = iso(now)
        assert stamp is not None
        return stamp

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
        undoes: str | None = None,
    ) -> Effect | KeyConflict:
        """Count a call against its key, or refuse it if the key belongs to another request.

        An abandoned key is counted and returned as it is (the caller refuses the call),
        whatever request it came with: abandoned is final for the key. ``undoes`` (a
        compensation's do key) is kept from the first call.
        """
        with self._transaction():
            existing = self._get(service, key)
            if existing is not None and existing.abandoned:
                self._db.execute(
                    "UPDATE effects SET calls = calls + 1"
                    " WHERE service = ? AND idempotency_key = ?",
                    (service, key),
                )
                return replace(existing, calls=existing.calls + 1)
            if existing is not None and (
                existing.operation != operation or existing.order_id != order_id
            ):
                return KeyConflict(existing)
            seen = () if existing is None else existing.traceparents
            if traceparent is not None:
                seen = (*seen, traceparent)[-MAX_TRACEPARENTS:]
            if existing is None:
                self._db.execute(
                    "INSERT INTO effects (service, idempotency_key, operation, order_id, calls,"
                    " traceparents, first_call_at, undoes) VALUES (?, ?, ?, ?, 1, ?, ?, ?)",
                    (service, key, operation, order_id, json.dumps(seen), self._stamp(), undoes),
                )
            else:
                self._db.execute(
                    "UPDATE effects SET calls = calls + 1, traceparents = ?,"
                    " first_call_at = COALESCE(first_call_at, ?)"
                    " WHERE service = ? AND idempotency_key = ?",
                    (json.dumps(seen), self._stamp(), service, key),
                )
            effect = self._get(service, key)
        assert effect is not None
        return effect

    def abandon(self, service: str, key: str, operation: str, order_id: str) -> Effect:
        """Settle a key for good as not applied, unless it is applied already.

        ``operation`` and ``order_id`` name the row only when the key was never seen.
        The caller makes sure no call with the key is running.
        """
        with self._transaction():
            self._db.execute(
                "INSERT OR IGNORE INTO effects"
                " (service, idempotency_key, operation, order_id, calls) VALUES (?, ?, ?, ?, 0)",
                (service, key, operation, order_id),
            )
            self._db.execute(
                "UPDATE effects SET abandoned = 1"
                " WHERE service = ? AND idempotency_key = ? AND applied = 0",
                (service, key),
            )
            effect = self._get(service, key)
        assert effect is not None
        return effect

    def settle(
        self,
        service: str,
        key: str,
        operation: str,
        order_id: str,
        outcome: Outcome,
        *,
        late: bool = False,
    ) -> tuple[Outcome, bool]:
        """Record the outcome unless the key already has one.

        Returns the stored outcome and whether this call settled it; a concurrent call
        that lost the race gets the winner's outcome, which is what makes it a repeat.
        `late`: the settling call had been held on the network (kept as `arrivedLate`).
        """
        with self._transaction():
            # The row may have been cleared by DELETE /_sim/effects mid-call.
            stamp = self._stamp()
            self._db.execute(
                "INSERT OR IGNORE INTO effects (service, idempotency_key, operation, order_id,"
                " calls, first_call_at) VALUES (?, ?, ?, ?, 1, ?)",
                (service, key, operation, order_id, stamp),
            )
            applied = outcome.kind is OutcomeKind.APPLIED
            undone = None if outcome.undone is None else int(outcome.undone)
            cursor = self._db.execute(
                "UPDATE effects SET outcome = ?, response = ?, applied = applied + ?,"
                " applied_at = ?, undone = ?, arrived_late = ?"
                " WHERE service = ? AND idempotency_key = ? AND outcome IS NULL"
                " AND abandoned = 0",
                (
                    outcome.kind.value,
                    json.dumps(outcome.body),
                    1 if applied else 0,
                    stamp if applied else None,
                    undone,
                    int(late),
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
