"""The archiver: finished orders past their retention go to the archive, then leave the
state table. Paced, bounded per run, resumable after a kill, never touching an order
that is not final.

One run:

1. Takes the cursor row (ArchiveStore.put_cursor, conditional on the ETag read) until
   its deadline plus `GRACE`; another run holding it makes this one a no-op. The host's
   timer lock is per process, and the local runtime or a scaled-out app has several.
2. Finishes the page a killed run left in flight, if any.
3. Page by page, until `max_orders`, the deadline or no candidates: reads candidates
   (server-filtered on state and last change), keeps those the policy says are due,
   records the page (its name and orders with their ETags) in the cursor, which also
   renews the hold, then finishes it and clears it from the cursor.

Finishing a page, per day it spans: when its blob is missing, each order is read again
and kept only if it is still at the ETag recorded and still due; the kept ones, with
their whole history, are written as the blob. When the blob exists (a killed run wrote
it), its content is what was archived and is never rewritten. Then, per order in the
blob: the pointer row first, then the purge (the state row replaced by the order's mark
If-Match that ETag, so its id stays taken: shared/domain/archive.py `ArchivedMark`),
then its rest entry (a kill before that is finished by the next run, which purges
again). A purge refused because the order changed drops the pointer and leaves the
order whole; its line in that blob is stale and readers go by the pointer.

Where a kill lands: before the blob, the next run writes it under the same name; after
the blob, the next run reads it and deletes what is left; nothing is in two blobs and
nothing is deleted before its copy is written.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import date, datetime, timedelta
from typing import Final, TypeVar

from shared.domain import continuation as tokens
from shared.domain.archive import (
    ArchiveCursor,
    ArchivedEntry,
    ArchivedMark,
    ArchivedOrder,
    ArchiveRun,
    PageEntry,
    RetentionPolicy,
    archive_day,
    blob_name,
    by_day,
    page_id,
)
from shared.ports import ArchiveBlobs, ArchiveStore, Clock, ConcurrencyConflict, OrdersAtRest
from shared.telemetry.logsafe import app_logger
from shared.usecases.operations.bulk_pace import Pacer

log = app_logger("orders.archive")
T = TypeVar("T")

PAGE_SIZE: Final = 100
ORDERS_PER_SECOND: Final = 50.0
"""Each order costs a read, its history query, a pointer write and two or three deletes:
at 50 a second the archive adds a few hundred table operations a second at most, far
under a storage account's 20,000 and out of the orders' own way."""
RUN_BUDGET: Final = timedelta(minutes=4)
MAX_ORDERS_PER_RUN: Final = 10_000
CONCURRENCY: Final = 8
"""Orders of a page read, or purged, at once."""
GRACE: Final = timedelta(seconds=30)
"""The hold outlives the run's deadline: an order begun just before it is finished
before another run may take the cursor."""


class ArchiveInterrupted(Exception):
    """Another run took the cursor (this one's hold expired): stop at once."""


@dataclass
class Archiver:
    store: OrdersAtRest
    archive: ArchiveStore
    blobs: ArchiveBlobs
    clock: Clock
    instance: str
    policy: RetentionPolicy = field(default_factory=RetentionPolicy)
    page_size: int = PAGE_SIZE
    per_second: float = ORDERS_PER_SECOND
    budget: timedelta = RUN_BUDGET
    max_orders: int = MAX_ORDERS_PER_RUN

    async def run(self) -> ArchiveRun:
        started = self.clock.now()
        deadline = started + self.budget
        run = ArchiveRun(self.instance, started, started)
        seen = await self.archive.cursor()
        if seen is not None and not seen.free(started):
            log.debug("archive: %s holds the cursor until %s", seen.holder, seen.until)
            return replace(run, skipped=True)
        holder = f"{self.instance}:{uuid.uuid4().hex[:8]}"
        kept = seen or ArchiveCursor(holder, deadline)
        try:
            cursor = await self.archive.put_cursor(
                replace(kept, holder=holder, until=deadline + GRACE), seen
            )
        except ConcurrencyConflict:
            return replace(run, skipped=True)
        tally = _Tally(pacer=Pacer(self.clock, self.per_second, deadline))
        try:
            if cursor.page is not None:
                tally.resumed = True
                cursor = await self._finish(cursor, tally)
            while tally.archived + tally.kept < self.max_orders:
                left = self.max_orders - tally.archived - tally.kept
                room = min(self.page_size, tally.pacer.room(), left)
                if room <= 0:
                    break
                now = self.clock.now()
                found = await self.archive.candidates(self.policy.cutoffs(now), room)
                due = [p for p in found if p.etag and self.policy.is_due(p.state, now)]
                if not due:
                    break
                entries = tuple(
                    PageEntry(p.order_id, str(p.etag), archive_day(p.state.updated_at)) for p in due
                )
                cursor = await self._put(
                    replace(cursor, page=page_id(entries), entries=entries), cursor
                )
                cursor = await self._finish(cursor, tally)
        except ArchiveInterrupted:
            log.warning("archive: %s lost the cursor to another run", holder)
            return self._done(run, tally)
        with contextlib.suppress(ConcurrencyConflict):  # taken already: not ours to free
            await self.archive.put_cursor(replace(cursor, until=self.clock.now()), cursor)
        return self._done(run, tally)

    def _done(self, run: ArchiveRun, tally: _Tally) -> ArchiveRun:
        finished = replace(
            run,
            finished_at=self.clock.now(),
            archived=tally.archived,
            pages=tally.pages,
            kept=tally.kept,
            resumed=tally.resumed,
        )
        if finished.archived or finished.kept:
            log.info(
                "archive: %d orders archived in %d pages, %d left (changed or no longer due)",
                finished.archived,
                finished.pages,
                finished.kept,
            )
        return finished

    async def _put(self, cursor: ArchiveCursor, seen: ArchiveCursor) -> ArchiveCursor:
        try:
            return await self.archive.put_cursor(cursor, seen)
        except ConcurrencyConflict:
            raise ArchiveInterrupted from None

    async def _finish(self, cursor: ArchiveCursor, tally: _Tally) -> ArchiveCursor:
        """Write the page's blobs (those missing), then delete what they hold; the page
        leaves the cursor only once every order of it is archived or left alone."""
        assert cursor.page is not None
        now = self.clock.now()
        for day, group in by_day(cursor.entries).items():
            name = blob_name(cursor.page, day)
            archived = await self.blobs.read(name)
            if not archived:
                archived = tuple(await self._copies(group, now))
                tally.kept += len(group) - len(archived)
                if not archived:
                    continue
                await self.blobs.write(name, archived)
            await self._purge_all(archived, name, {e.order_id: e.etag for e in group}, tally)
        tally.pages += 1
        return await self._put(replace(cursor, page=None, entries=()), cursor)

    async def _purge_all(
        self,
        archived: tuple[ArchivedOrder, ...],
        name: str,
        etags: dict[str, str],
        tally: _Tally,
    ) -> None:
        async def purge(order: ArchivedOrder) -> None:
            await self._purge(order, name, etags, tally)

        await _each(archived, purge)

    async def _purge(
        self, order: ArchivedOrder, name: str, etags: dict[str, str], tally: _Tally
    ) -> None:
        """The pointer first, so an order is never gone without a way to find its copy."""
        await tally.turn()
        state = order.process.state
        entry = ArchivedEntry(
            order.order_id, state.process_state, state.updated_at, order.archived_at, name
        )
        await self.archive.point(entry)
        if await self.archive.purge(ArchivedMark.of(order), etags[order.order_id]):
            # After the rows, so a kill between is finished by the next run's purge.
            await self.store.drop_rest(state.process_state, order.order_id, state.created_at)
            tally.archived += 1
        else:
            tally.kept += 1
            await self.archive.drop_pointer(order.order_id)

    async def _copies(self, group: list[PageEntry], now: datetime) -> list[ArchivedOrder]:
        """The orders as they are now, only those still at the ETag the page recorded and
        still due: whatever changed since waits for a later page."""
        found: dict[str, ArchivedOrder] = {}

        async def copy(entry: PageEntry) -> None:
            process = await self.store.load(entry.order_id)
            if process is None or process.etag != entry.etag:
                return
            if not self.policy.is_due(process.state, now):
                return
            history = await self.store.history(entry.order_id)
            found[entry.order_id] = ArchivedOrder(replace(process, history=history), now)

        await _each(group, copy)
        return [found[e.order_id] for e in group if e.order_id in found]


@dataclass
class _Tally:
    pacer: Pacer
    archived: int = 0
    kept: int = 0
    pages: int = 0
    resumed: bool = False
    _turns: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def turn(self) -> None:
        """One order's turn at the pace; the orders of a page run `CONCURRENCY` at once,
        and the pace holds across them."""
        async with self._turns:
            await self.pacer.turn()


async def _each(items: Iterable[T], act: Callable[[T], Awaitable[None]]) -> None:
    """`act` on every item, `CONCURRENCY` at once: each order costs several sequential
    round trips, so one at a time the archive ran at about 24 orders a second on Azurite
    (bench/archive.py). A failure (a kill) stops the page; the cursor still holds it."""
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(item: T) -> None:
        async with gate:
            await act(item)

    await asyncio.gather(*(one(i) for i in items))


def orders_per_second(run: ArchiveRun) -> float:
    seconds = (run.finished_at - run.started_at).total_seconds()
    return run.archived / seconds if seconds > 0 else math.inf


async def archived_order(
    archive: ArchiveStore, blobs: ArchiveBlobs, order_id: str
) -> ArchivedOrder | None:
    """An order no longer in the table, from its archive copy: the pointer names the
    blob (one point read), the blob holds the line. A stale line of an order that was
    archived again elsewhere is never taken: the pointer names the newer blob."""
    name = await archive.pointer(order_id)
    if name is None:
        return None
    return next((o for o in await blobs.read(name) if o.order_id == order_id), None)


async def was_archived(archive: ArchiveStore | None, order_id: str) -> bool:
    """Whether an order that is not in the table has an archive copy: one point read
    of its pointer, never of the blob. None: no archive here, so nothing was archived."""
    return archive is not None and await archive.pointer(order_id) is not None


@dataclass(frozen=True)
class DayListing:
    entries: tuple[ArchivedEntry, ...]
    continuation: str | None


async def archived_on(
    blobs: ArchiveBlobs | None, day: date, pages: int, continuation: str | None
) -> DayListing:
    """The orders archived under one day, `pages` blobs at a time: a day of 100,000
    orders is a thousand pages, read as the caller pages on. The continuation is the
    API's token for this day (InvalidContinuation for any other), checked even where
    there is no archive (`blobs` None): nothing there ever handed one out."""
    listing = f"archive:{day.isoformat()}"
    marker = tokens.unwrap(continuation, listing)
    if blobs is None:
        return DayListing((), None)
    names, more = await blobs.pages(day, pages, marker)
    entries = []
    for name in names:
        for order in await blobs.read(name):
            state = order.process.state
            entries.append(
                ArchivedEntry(
                    order.order_id, state.process_state, state.updated_at, order.archived_at, name
                )
            )
    return DayListing(tuple(entries), tokens.wrap(listing, more))
