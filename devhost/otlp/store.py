"""Spans in SQLite, bounded: the oldest traces go first once a bound is passed.

One connection, used only by the receiver's event loop, is the one writer; WAL lets a
developer read the file with ``sqlite3`` while the receiver writes. Whole traces are
evicted, never single spans, so a trace the query answers is never missing a part
because of the bound.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devhost.otlp.decode import SpanRecord

MAX_SPANS = 200_000
MAX_AGE_SECONDS = 24 * 3600.0
ORDER_ID_ATTRIBUTE = "order.id"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS spans (
    trace_id TEXT NOT NULL,
    span_id TEXT NOT NULL,
    parent_span_id TEXT,
    name TEXT NOT NULL,
    kind TEXT NOT NULL,
    start_ns INTEGER NOT NULL,
    end_ns INTEGER NOT NULL,
    service TEXT,
    detail TEXT NOT NULL,
    PRIMARY KEY (trace_id, span_id)
);
CREATE TABLE IF NOT EXISTS traces (
    trace_id TEXT PRIMARY KEY,
    first_seen REAL NOT NULL,
    last_seen REAL NOT NULL,
    spans INTEGER NOT NULL,
    start_ns INTEGER NOT NULL,
    end_ns INTEGER NOT NULL,
    root_name TEXT,
    order_id TEXT
);
CREATE INDEX IF NOT EXISTS traces_first_seen ON traces (first_seen);
CREATE INDEX IF NOT EXISTS traces_order ON traces (order_id);
"""


@dataclass(frozen=True)
class TraceSummary:
    trace_id: str
    spans: int
    start_ns: int
    end_ns: int
    root_name: str | None
    order_id: str | None


class SpanStore:
    """``max_spans`` and ``max_age`` bound the file; eviction runs after each write."""

    def __init__(
        self,
        path: Path | str | None,
        *,
        max_spans: int = MAX_SPANS,
        max_age: float = MAX_AGE_SECONDS,
        clock: Any = time.time,
    ) -> None:
        self.max_spans = max_spans
        self.max_age = max_age
        self._clock = clock
        self._db = sqlite3.connect(str(path) if path is not None else ":memory:")
        if path is not None:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        self._count = self._recount()

    @property
    def span_count(self) -> int:
        return self._count

    def add(self, spans: Sequence[SpanRecord]) -> int:
        """Store the spans (a span sent twice replaces itself); returns how many were evicted."""
        now = self._clock()
        with self._db:
            for span in spans:
                self._add_one(span, now)
        self._count = self._recount()
        return self._evict(now)

    def _add_one(self, span: SpanRecord, now: float) -> None:
        detail = json.dumps(
            {
                "attributes": span.attributes,
                "status": span.status,
                "events": span.events,
                "links": span.links,
            }
        )
        self._db.execute(
            "INSERT OR REPLACE INTO spans VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                span.trace_id,
                span.span_id,
                span.parent_span_id,
                span.name,
                span.kind,
                span.start_ns,
                span.end_ns,
                span.service,
                detail,
            ),
        )
        order_id = span.attributes.get(ORDER_ID_ATTRIBUTE)
        root = span.name if span.parent_span_id is None else None
        self._db.execute(
            """
            INSERT INTO traces VALUES (?, ?, ?, 1, ?, ?, ?, ?)
            ON CONFLICT (trace_id) DO UPDATE SET
                last_seen = excluded.last_seen,
                spans = (SELECT COUNT(*) FROM spans WHERE trace_id = excluded.trace_id),
                start_ns = MIN(start_ns, excluded.start_ns),
                end_ns = MAX(end_ns, excluded.end_ns),
                root_name = COALESCE(excluded.root_name, root_name),
                order_id = COALESCE(order_id, excluded.order_id)
            """,
            (
                span.trace_id,
                now,
                now,
                span.start_ns,
                span.end_ns,
                root,
                str(order_id) if order_id is not None else None,
            ),
        )

    def _evict(self, now: float) -> int:
        doomed: list[str] = [
            row[0]
            for row in self._db.execute(
                "SELECT trace_id FROM traces WHERE last_seen < ?", (now - self.max_age,)
            )
        ]
        excess = self._count - self.max_spans
        if excess > 0:
            # Evict down to 90% of the bound so a full store does not evict on every write.
            excess += self.max_spans // 10
            for trace_id, spans in self._db.execute(
                "SELECT trace_id, spans FROM traces ORDER BY first_seen, trace_id"
            ):
                if excess <= 0:
                    break
                if trace_id not in doomed:
                    doomed.append(trace_id)
                    excess -= spans
        if not doomed:
            return 0
        before = self._count
        with self._db:
            self._db.executemany("DELETE FROM spans WHERE trace_id = ?", [(t,) for t in doomed])
            self._db.executemany("DELETE FROM traces WHERE trace_id = ?", [(t,) for t in doomed])
        self._count = self._recount()
        return before - self._count

    def _recount(self) -> int:
        return int(self._db.execute("SELECT COUNT(*) FROM spans").fetchone()[0])

    def trace(self, trace_id: str) -> list[dict[str, Any]]:
        """The trace's spans in start order, as the trace query answers them."""
        rows = self._db.execute(
            "SELECT trace_id, span_id, parent_span_id, name, kind, start_ns, end_ns, service,"
            " detail FROM spans WHERE trace_id = ? ORDER BY start_ns, span_id",
            (trace_id.lower(),),
        ).fetchall()
        return [_span_json(row) for row in rows]

    def recent(self, limit: int, order_id: str | None = None) -> list[TraceSummary]:
        """The most recently started traces, or those of one order (``order.id``)."""
        where, args = ("WHERE order_id = ?", (order_id,)) if order_id else ("", ())
        rows = self._db.execute(
            "SELECT trace_id, spans, start_ns, end_ns, root_name, order_id FROM traces "
            f"{where} ORDER BY start_ns DESC LIMIT ?",
            (*args, limit),
        ).fetchall()
        return [TraceSummary(*row) for row in rows]

    def close(self) -> None:
        self._db.close()


def iso_ns(ns: int) -> str:
    """ISO 8601 UTC with microseconds, the precision the page's time axis needs."""
    seconds, rest = divmod(ns, 1_000_000_000)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
    return f"{stamp}.{rest // 1000:06d}Z"


def _span_json(row: tuple[Any, ...]) -> dict[str, Any]:
    trace_id, span_id, parent, name, kind, start_ns, end_ns, service, detail = row
    extra = json.loads(detail)
    return {
        "traceId": trace_id,
        "spanId": span_id,
        "parentSpanId": parent,
        "name": name,
        "start": iso_ns(start_ns),
        "end": iso_ns(end_ns),
        "attributes": extra["attributes"],
        "kind": kind,
        "status": extra["status"],
        "events": [
            {"name": e["name"], "time": iso_ns(e["timeNs"]), "attributes": e["attributes"]}
            for e in extra["events"]
        ],
        "links": extra["links"],
        "service": service,
    }
