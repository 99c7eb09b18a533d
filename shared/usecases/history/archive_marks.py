"""The one-off backfill of marks: orders archived before the purge left a mark have none,
so their ids are free, and a new order under one would send the archived order's
idempotency keys again (issue 37, H; shared/domain/archive.py `ArchivedMark`).

Run once after the deploy that brings marks, beside live traffic: it walks every
archived order's pointer a page at a time, and for each without a mark reads its copy
(each blob once per page) and writes the mark where no row holds the key. Safe to repeat
and to go on from its last continuation. An id that a live order holds now, started
after its order was archived, is named, not touched: its providers may have answered it
with the archived order's results, so it is for an operator to look at.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.domain.archive import ArchivedEntry, ArchivedMark, ArchivedOrder
from shared.ports import ArchiveBlobs, ArchiveStore, OrderRows
from shared.telemetry.logsafe import app_logger

log = app_logger("orders.archive")


@dataclass(frozen=True)
class MarksBackfilled:
    scanned: int
    written: int
    reused: tuple[str, ...]
    """Archived ids a different order holds now (created after the archived one)."""
    continuation: str | None
    """Where the next call goes on; None: done."""


async def backfill_marks(
    store: OrderRows,
    archive: ArchiveStore,
    blobs: ArchiveBlobs,
    page_size: int,
    continuation: str | None,
) -> MarksBackfilled:
    entries, more = await archive.pointers(page_size, continuation)
    copies: dict[str, dict[str, ArchivedOrder]] = {}
    written, reused = 0, []
    for entry in entries:
        if await store.archived(entry.order_id) is not None:
            continue
        if entry.blob not in copies:
            copies[entry.blob] = {o.order_id: o for o in await blobs.read(entry.blob)}
        copy = copies[entry.blob].get(entry.order_id)
        if copy is None:
            log.warning("archive: %s has a pointer but no copy in %s", entry.order_id, entry.blob)
            continue
        if await archive.mark(ArchivedMark.of(copy)):
            written += 1
        elif await _taken_by_another(store, entry, copy):
            reused.append(entry.order_id)
    return MarksBackfilled(len(entries), written, tuple(reused), more)


async def _taken_by_another(store: OrderRows, entry: ArchivedEntry, copy: ArchivedOrder) -> bool:
    """The key holds a row that is not the mark: the archived order itself (mid-purge, or
    its purge refused), or an order started under its id since."""
    live = await store.load(entry.order_id)
    return live is not None and live.state.created_at != copy.process.state.created_at
