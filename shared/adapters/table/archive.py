"""The archiver's side of the state table: candidates, its cursor, pointers, purges.

Candidates come from the rest index (shared/domain/rest_index.py): per archivable state,
one range of its partition from the oldest created day to the cutoff's, filtered
server-side to the orders come to rest before the cutoff, then one point read of each
found order's state row for its ETag. So a run costs what it archives, not the size of
the table (issue 26). An order at rest without its entry (for the moment between its save
and the entry, or stored before the index and not yet backfilled: `python -m
shared.cli.rest_backfill`) is not a candidate until it has one. The purge of an order
drops its rest entry after its rows (shared/usecases/history/archive.py).

The cursor is one row, `~archive` / `~cursor`: the holder of the run and until when, and
the page in flight (its name and its orders with the ETags read), each write
conditional on the ETag read, as the bulk runners' lease.

A pointer is one small row per archived order in `~archived-NN` (16 shards by the crc32
of the id, as the watch list), RowKey the order id: a `GET /api/orders/{id}` that finds
no state row makes one point read here and one blob read, instead of listing days. The
price is a row of about 200 bytes per archived order left in the table, against the
state entity and history rows (a few KB) it replaces.

A purge replaces the state row by the order's mark first (shared/domain/archive.py
`ArchivedMark`), If-Match the ETag the page was read at: a changed order is left whole.
The mark keeps the id taken for good, so the intake's create collides with it as with a
live order, atomically, at no cost to a new order (issue 37, H). The order's other rows
(history rows, rows of older layouts) and its watch entry follow; a purge killed after
the mark is finished by the next run, which finds the page still in flight in the
cursor and the mark in place.
"""

from __future__ import annotations

import base64
import json
import zlib
from collections.abc import Mapping
from dataclasses import replace
from datetime import date, datetime
from typing import Any, Final

from azure.core import MatchConditions
from azure.core.exceptions import (
    ResourceNotFoundError,
)
from azure.data.tables import TableTransactionError, UpdateMode

from shared.adapters.readable import at_rest_before
from shared.adapters.table import rows
from shared.adapters.table.conditional import put_row
from shared.adapters.table.errors import refused_status, translated_errors
from shared.adapters.table.store import TableStateStore
from shared.domain.archive import ArchiveCursor, ArchivedEntry, ArchivedMark, PageEntry
from shared.domain.model import OrderProcess, ProcessState
from shared.ports import ConcurrencyConflict

ARCHIVE_PARTITION: Final = "~archive"
CURSOR_ROW: Final = "~cursor"
POINTER_SHARDS: Final = 16
_BATCH: Final = 100
"""Operations in one entity-group transaction, the service's limit."""


def pointer_partition(order_id: str) -> str:
    return pointer_partition_at(zlib.crc32(order_id.encode()) % POINTER_SHARDS)


def pointer_partition_at(shard: int) -> str:
    return f"~archived-{shard % POINTER_SHARDS:02d}"


def _pointer(entity: Mapping[str, Any]) -> ArchivedEntry:
    return ArchivedEntry(
        str(entity["RowKey"]),
        ProcessState(entity["ProcessState"]),
        rows.utc(entity["FinishedAt"]),
        rows.utc(entity["ArchivedAt"]),
        str(entity["Blob"]),
    )


def _encode(token: Any) -> str | None:
    return base64.urlsafe_b64encode(json.dumps(token).encode()).decode() if token else None


def _decode(token: str | None) -> Any:
    return json.loads(base64.urlsafe_b64decode(token.encode())) if token else None


class TableArchiveStore:
    """Shares the state store's table client (and its table's creation)."""

    def __init__(self, store: TableStateStore) -> None:
        self._store = store

    @property
    def _table(self) -> Any:
        return self._store.table

    async def candidates(
        self, cutoffs: Mapping[ProcessState, datetime], limit: int
    ) -> tuple[OrderProcess, ...]:
        return await at_rest_before(self._store, cutoffs, limit)

    async def cursor(self) -> ArchiveCursor | None:
        await self._store.ensure_table()
        with translated_errors():
            try:
                entity = await self._table.get_entity(ARCHIVE_PARTITION, CURSOR_ROW)
            except ResourceNotFoundError:
                return None
        entries = json.loads(rows.get_text(entity, "Entries") or "[]")
        return ArchiveCursor(
            holder=str(entity["Holder"]),
            until=rows.utc(entity["Until"]),
            page=entity.get("Page"),
            entries=tuple(
                PageEntry(e["orderId"], e["etag"], date.fromisoformat(e["day"])) for e in entries
            ),
            etag=str(entity.metadata["etag"]),
        )

    async def put_cursor(self, cursor: ArchiveCursor, seen: ArchiveCursor | None) -> ArchiveCursor:
        await self._store.ensure_table()
        entity: dict[str, Any] = {
            "PartitionKey": ARCHIVE_PARTITION,
            "RowKey": CURSOR_ROW,
            "Holder": cursor.holder,
            "Until": cursor.until,
        }
        if cursor.page is not None:
            entity["Page"] = cursor.page
        entries = [
            {"orderId": e.order_id, "etag": e.etag, "day": e.day.isoformat()}
            for e in cursor.entries
        ]
        rows.put_text(entity, "Entries", json.dumps(entries, separators=(",", ":")))
        with translated_errors(
            ConcurrencyConflict("archive cursor"), when=refused_status(404, 409, 412)
        ):
            result = await put_row(self._table, entity, seen.etag if seen else None)
        return replace(cursor, etag=str(result["etag"]))

    async def point(self, entry: ArchivedEntry) -> None:
        entity = {
            "PartitionKey": pointer_partition(entry.order_id),
            "RowKey": entry.order_id,
            "Blob": entry.blob,
            "ProcessState": entry.process_state.value,
            "FinishedAt": entry.finished_at,
            "ArchivedAt": entry.archived_at,
        }
        with translated_errors():
            await self._table.upsert_entity(entity, mode=UpdateMode.REPLACE)

    async def pointer(self, order_id: str) -> str | None:
        await self._store.ensure_table()
        with translated_errors():
            try:
                entity = await self._table.get_entity(
                    pointer_partition(order_id), order_id, select=["Blob"]
                )
            except ResourceNotFoundError:
                return None
        return str(entity["Blob"])

    async def drop_pointer(self, order_id: str) -> None:
        with translated_errors(when=refused_status(404)):
            await self._table.delete_entity(pointer_partition(order_id), order_id)

    async def pointers(
        self, limit: int, continuation: str | None
    ) -> tuple[tuple[ArchivedEntry, ...], str | None]:
        """Its 16 shards in one range of partitions, as the watch list's."""
        await self._store.ensure_table()
        found: list[ArchivedEntry] = []
        with translated_errors():
            pager: Any = self._table.query_entities(
                "PartitionKey ge @first and PartitionKey le @last",
                parameters={"first": pointer_partition_at(0), "last": pointer_partition_at(-1)},
                results_per_page=limit,
            ).by_page(continuation_token=_decode(continuation))
            async for page in pager:
                found += [_pointer(e) async for e in page]
                break
            token = pager.continuation_token
        return tuple(found), _encode(token)

    async def mark(self, mark: ArchivedMark) -> bool:
        with translated_errors(when=refused_status(409)):
            await self._table.create_entity(rows.mark_entity(mark))
            return True
        return False

    async def purge(self, mark: ArchivedMark, etag: str) -> bool:
        order_id = mark.order_id
        if not await self._mark(mark, etag) and await self._store.archived(order_id) is None:
            return False  # the order changed since its page read it, or the id is live again
        with translated_errors():
            rest = [
                e
                async for e in self._table.query_entities(
                    "PartitionKey eq @pk and RowKey ne @state",
                    parameters={"pk": order_id, "state": rows.STATE_ROW},
                    select=["PartitionKey", "RowKey"],
                )
            ]
        for start in range(0, len(rest), _BATCH):
            await self._delete_all(rest[start : start + _BATCH])
        await self._store.unwatch(order_id)
        return True

    async def _mark(self, mark: ArchivedMark, etag: str) -> bool:
        """The state row replaced by the mark, If-Match `etag`: True when this call
        wrote it. A row already gone (purged whole before marks were kept, by a run
        killed before its page was done) gets the mark as a new row."""
        entity = rows.mark_entity(mark)
        with translated_errors(when=refused_status(404, 409, 412)):
            try:
                await self._table.update_entity(
                    entity,
                    mode=UpdateMode.REPLACE,
                    etag=etag,
                    match_condition=MatchConditions.IfNotModified,
                )
                return True
            except ResourceNotFoundError:
                await self._table.create_entity(entity)
                return True
        return False

    async def _delete_all(self, keys: list[Any]) -> None:
        """One transaction; refused (a row went meanwhile), one by one."""
        try:
            await self._table.submit_transaction([("delete", k) for k in keys])
            return
        except TableTransactionError:
            pass
        for key in keys:
            with translated_errors(when=refused_status(404)):
                await self._table.delete_entity(key["PartitionKey"], key["RowKey"])
