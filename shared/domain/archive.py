"""Retention and archival, the pure half: which finished orders are due to leave the
state table, where their archive copy goes, and how a page of them is named.

Only a final order (`ProcessState.is_final`: Processed, Compensated, Cancelled) is ever
due: nothing moves it on, so its copy in the archive stays true. Error is at rest for
supervision but an operator may still resubmit it, so it is never archived by policy;
neither is anything in flight. A state whose retention is None is kept forever.

An order is archived under the day it finished (its `updated_at`, UTC), so an operator
asking "what ended on 3 March" reads one folder, and where an order lands does not
depend on when the archiver happened to run.

A page's name is a hash of what it holds (order ids and the ETags read), fixed before
anything is written and kept in the archiver's cursor: a run killed after writing the
blob and before deleting the rows finishes the same page under the same name, so an
order is never in two pages of one run and never lost between them.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Final

from shared.domain.model import OrderProcess, ProcessState, StateRecord

DEFAULT_RETENTION: Final[Mapping[ProcessState, timedelta | None]] = {
    ProcessState.PROCESSED: timedelta(days=30),
    ProcessState.CANCELLED: timedelta(days=90),
    ProcessState.COMPENSATED: timedelta(days=90),
}
"""Processed orders are rarely looked at after a month; a cancelled or compensated one
may come back as a dispute, so it stays a quarter."""

ARCHIVABLE: Final = tuple(s for s in ProcessState if s.is_final)
"""The only states the archiver ever reads as candidates."""

DAY_FORMAT: Final = "%Y/%m/%d"
_DAY: Final = re.compile(r"^\d{4}-\d{2}-\d{2}$")


@dataclass(frozen=True)
class RetentionPolicy:
    """How long each final state is kept in the table; None: kept forever."""

    processed: timedelta | None = DEFAULT_RETENTION[ProcessState.PROCESSED]
    cancelled: timedelta | None = DEFAULT_RETENTION[ProcessState.CANCELLED]
    compensated: timedelta | None = DEFAULT_RETENTION[ProcessState.COMPENSATED]

    def retention(self, state: ProcessState) -> timedelta | None:
        """None for a state never archived: Error, anything in flight, or a final state
        whose retention is switched off."""
        return {
            ProcessState.PROCESSED: self.processed,
            ProcessState.CANCELLED: self.cancelled,
            ProcessState.COMPENSATED: self.compensated,
        }.get(state)

    def cutoffs(self, now: datetime) -> dict[ProcessState, datetime]:
        """Per archivable state, the last-change time before which an order is due; a
        state that is kept forever is absent, so the candidates' query never asks for it."""
        found: dict[ProcessState, datetime] = {}
        for state in ARCHIVABLE:
            kept = self.retention(state)
            if kept is not None:
                found[state] = now - kept
        return found

    def is_due(self, state: StateRecord, now: datetime) -> bool:
        """The check made again on every order the query returned, and on the order as
        read just before its page is written: a query is only a hint."""
        if not state.process_state.is_final:
            return False
        kept = self.retention(state.process_state)
        return kept is not None and state.updated_at + kept <= now


def archive_day(finished_at: datetime) -> date:
    return finished_at.astimezone(UTC).date()


def day_prefix(day: date) -> str:
    """The blobs of one day: `yyyy/mm/dd/`."""
    return day.strftime(DAY_FORMAT) + "/"


def parse_day(text: str) -> date:
    """`yyyy-mm-dd`, as the CLI and the route take it; ValueError otherwise."""
    if not _DAY.match(text):
        raise ValueError(f"a day is yyyy-mm-dd, got {text[:20]!r}")
    return date.fromisoformat(text)


@dataclass(frozen=True)
class PageEntry:
    """One order of a page in flight, as the candidates' query found it."""

    order_id: str
    etag: str
    day: date


def page_id(entries: Iterable[PageEntry]) -> str:
    """Deterministic: the same orders read at the same ETags name the same page, also
    when two runs raced to it (each then writes the same content under the same name)."""
    digest = hashlib.sha256()
    for entry in sorted(entries, key=lambda e: e.order_id):
        digest.update(f"{entry.order_id}\n{entry.etag}\n".encode())
    return digest.hexdigest()[:24]


def blob_name(page: str, day: date) -> str:
    """`yyyy/mm/dd/<page>.jsonl.gz`: a page split by the day each order finished."""
    return f"{day_prefix(day)}{page}.jsonl.gz"


def by_day(entries: Iterable[PageEntry]) -> dict[date, list[PageEntry]]:
    found: dict[date, list[PageEntry]] = {}
    for entry in entries:
        found.setdefault(entry.day, []).append(entry)
    return found


@dataclass(frozen=True)
class ArchivedOrder:
    """An order as its archive copy holds it: state, steps and the whole history."""

    process: OrderProcess
    archived_at: datetime

    @property
    def order_id(self) -> str:
        return self.process.order_id


@dataclass(frozen=True)
class ArchivedMark:
    """What an archived order leaves under its own key in the state table, in place of
    its state row: its id stays taken. A new order under it would send the archived
    order's idempotency keys (`{orderId}:{operation}`) again, and a provider answers a
    key it has seen with that key's old result, so the new order would end Processed
    without being charged (issue 37, H). The intake's create meets the mark as it meets
    a live order; the fingerprint answers a resend (the same body: the duplicate's
    answer; another: a conflict) without reading the archive."""

    order_id: str
    fingerprint: str
    process_state: ProcessState
    archived_at: datetime

    @classmethod
    def of(cls, order: ArchivedOrder) -> ArchivedMark:
        process = order.process
        return cls(
            process.order_id,
            process.order.fingerprint,
            process.state.process_state,
            order.archived_at,
        )


@dataclass(frozen=True)
class ArchivedEntry:
    """One line of a day's listing: enough to pick an order to fetch."""

    order_id: str
    process_state: ProcessState
    finished_at: datetime
    archived_at: datetime
    blob: str


@dataclass(frozen=True)
class ArchiveCursor:
    """The archiver's one row: who holds the run until when, and the page in flight
    (its name and orders), so a run killed anywhere in a page is finished by the next."""

    holder: str
    until: datetime
    page: str | None = None
    entries: tuple[PageEntry, ...] = ()
    etag: str | None = None

    def free(self, now: datetime) -> bool:
        return self.until <= now


@dataclass(frozen=True)
class ArchiveRun:
    instance: str
    started_at: datetime
    finished_at: datetime
    archived: int = 0
    """Orders whose rows this run deleted after their copy was in a blob."""
    pages: int = 0
    kept: int = 0
    """Orders read as due but changed (or no longer due) by the time their page was
    written or their rows deleted: left in the table for a later run."""
    resumed: bool = False
    """The run began by finishing a page a killed run left in flight."""
    skipped: bool = False
    """Another run held the archiver: this one did nothing."""
