"""The archive's in-memory adapters, with the Table and Blob adapters' semantics: the
cursor's ETag, the pointer per order, the purge of an order's rows at the ETag a page
read (its mark left in their place), and the pages by day. The archiver and what meets
it (intake, the operator's routes) are tested on them at full speed."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import date, datetime

from shared.adapters.memory.store import InMemoryStateStore
from shared.adapters.readable import at_rest_before
from shared.domain.archive import (
    ArchiveCursor,
    ArchivedEntry,
    ArchivedMark,
    ArchivedOrder,
    day_prefix,
)
from shared.domain.model import OrderProcess, ProcessState
from shared.ports import ConcurrencyConflict


class InMemoryArchiveStore:
    def __init__(self, store: InMemoryStateStore) -> None:
        self._store = store
        self._cursor: ArchiveCursor | None = None
        self._pointers: dict[str, ArchivedEntry] = {}
        self._etags = itertools.count(1)

    async def candidates(
        self, cutoffs: Mapping[ProcessState, datetime], limit: int
    ) -> tuple[OrderProcess, ...]:
        return await at_rest_before(self._store, cutoffs, limit)

    async def cursor(self) -> ArchiveCursor | None:
        await asyncio.sleep(0)
        return self._cursor

    async def put_cursor(self, cursor: ArchiveCursor, seen: ArchiveCursor | None) -> ArchiveCursor:
        await asyncio.sleep(0)
        current = self._cursor.etag if self._cursor is not None else None
        if current != (seen.etag if seen is not None else None):
            raise ConcurrencyConflict("archive cursor")
        self._cursor = replace(cursor, etag=f'W/"{next(self._etags)}"')
        return self._cursor

    async def point(self, entry: ArchivedEntry) -> None:
        await asyncio.sleep(0)
        self._pointers[entry.order_id] = entry

    async def pointer(self, order_id: str) -> str | None:
        await asyncio.sleep(0)
        found = self._pointers.get(order_id)
        return found.blob if found is not None else None

    async def drop_pointer(self, order_id: str) -> None:
        await asyncio.sleep(0)
        self._pointers.pop(order_id, None)

    async def purge(self, mark: ArchivedMark, etag: str) -> bool:
        return await self._store.purge(mark, etag)

    async def pointers(
        self, limit: int, continuation: str | None
    ) -> tuple[tuple[ArchivedEntry, ...], str | None]:
        await asyncio.sleep(0)
        ids = sorted(i for i in self._pointers if continuation is None or i > continuation)
        chosen = ids[:limit]
        more = chosen[-1] if len(ids) > len(chosen) and chosen else None
        return tuple(self._pointers[i] for i in chosen), more

    async def mark(self, mark: ArchivedMark) -> bool:
        return await self._store.put_mark(mark)


class InMemoryArchiveBlobs:
    def __init__(self) -> None:
        self._pages: dict[str, tuple[ArchivedOrder, ...]] = {}

    async def exists(self, name: str) -> bool:
        await asyncio.sleep(0)
        return name in self._pages

    async def write(self, name: str, orders: Sequence[ArchivedOrder]) -> None:
        await asyncio.sleep(0)
        self._pages[name] = tuple(orders)

    async def read(self, name: str) -> tuple[ArchivedOrder, ...]:
        await asyncio.sleep(0)
        return self._pages.get(name, ())

    async def pages(
        self, day: date, limit: int, continuation: str | None
    ) -> tuple[tuple[str, ...], str | None]:
        await asyncio.sleep(0)
        names = sorted(
            n
            for n in self._pages
            if n.startswith(day_prefix(day)) and (continuation is None or n > continuation)
        )
        chosen = names[:limit]
        return tuple(chosen), chosen[-1] if len(names) > len(chosen) else None
