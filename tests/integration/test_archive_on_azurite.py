"""The archiver on real Azurite (table and blob): finished orders past their retention
are copied to gzip JSON-lines blobs by day, then their rows go; nothing in flight, in
Error or within its retention is touched; a run killed between the blob and the deletes
(or before the blob) is finished by the next one, nothing lost and nothing twice."""

from __future__ import annotations

import gzip
import json
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from azure.data.tables.aio import TableServiceClient
from azure.storage.blob.aio import BlobServiceClient

from shared.adapters.blob_archive import BlobArchive
from shared.adapters.clock import FakeClock
from shared.adapters.memory.store import InMemoryBus
from shared.adapters.table import rest
from shared.adapters.table.archive import TableArchiveStore
from shared.adapters.table.store import TableStateStore
from shared.contract import Queue
from shared.domain.archive import (
    ArchivedEntry,
    ArchivedMark,
    ArchivedOrder,
    RetentionPolicy,
    day_prefix,
)
from shared.domain.machine.forward import start
from shared.domain.model import HistoryEntry, ProcessState, StepStatus
from shared.domain.rest_index import REST_STATES, RestRange, rest_entry
from shared.ports import AlreadyExists
from shared.settings import azurite_connection_string
from shared.usecases.flow.deps import ProcessDeps
from shared.usecases.flow.submission import OrderConflict, submit_order
from shared.usecases.history.archive import GRACE, Archiver, archived_order
from shared.usecases.history.archive_marks import backfill_marks
from tests.builders import a_policy, an_order
from tests.workflows import CATALOGUE, ORDER_FULFILMENT

pytestmark = pytest.mark.azurite

NOW = datetime(2026, 12, 31, 12, 0, tzinfo=UTC)
OLD = NOW - timedelta(days=40)
DAY = timedelta(days=1)


@dataclass
class Parts:
    store: TableStateStore
    archive: TableArchiveStore
    blobs: BlobArchive
    clock: FakeClock

    def archiver(self, archive: Any = None, blobs: Any = None, **kw: Any) -> Archiver:
        return Archiver(
            self.store,
            archive or self.archive,
            blobs or self.blobs,
            self.clock,
            "test",
            RetentionPolicy(),
            **kw,
        )

    async def partition(self, order_id: str) -> list[str]:
        return [
            e["RowKey"]
            async for e in self.store.table.query_entities(
                "PartitionKey eq @pk", parameters={"pk": order_id}
            )
        ]

    async def all_lines(self) -> list[str]:
        """Every order id in every blob of the container (stale lines included)."""
        found = []
        container = self.blobs._container
        async for blob in container.list_blobs():
            data = await (await container.download_blob(blob.name, decompress=False)).readall()
            found += [json.loads(line)["orderId"] for line in gzip.decompress(data).splitlines()]
        return found


@pytest.fixture
async def parts(azurite_table_port: int, azurite_blob_port: int) -> AsyncIterator[Parts]:
    connection = azurite_connection_string(azurite_table_port, blob_port=azurite_blob_port)
    store = TableStateStore(
        TableServiceClient.from_connection_string(connection), f"a{uuid.uuid4().hex[:20]}"
    )
    blobs = BlobArchive(
        BlobServiceClient.from_connection_string(connection), f"a{uuid.uuid4().hex[:20]}"
    )
    try:
        yield Parts(store, TableArchiveStore(store), blobs, FakeClock(NOW))
    finally:
        await store.close()
        await blobs.close()


def history(at: datetime, n: int) -> list[HistoryEntry]:
    return [HistoryEntry(at, f"event-{i}", "d", ProcessState.PENDING, 0, 0) for i in range(n)]


async def put(
    store: TableStateStore, order_id: str, state: ProcessState, at: datetime, entries: int = 3
) -> None:
    """An order as it stands after `entries` history entries; past 40 they are rows."""
    process = start(an_order(order_id), ORDER_FULFILMENT, at).process
    steps = tuple(replace(s, agent="inventory", status=StepStatus.COMPLETED) for s in process.steps)
    record = replace(process.state, process_state=state, updated_at=at)
    stored = replace(process, steps=steps, state=record)
    await store.create(stored, history(at, entries))
    if state.is_at_rest:
        await store.put_rest(rest_entry(stored, ORDER_FULFILMENT))  # as its rest writes it
        return
    await store.watch(order_id, at, replace=True)


async def test_finished_orders_past_retention_are_archived_then_deleted(parts: Parts) -> None:
    await put(parts.store, "p-old", ProcessState.PROCESSED, OLD, entries=45)
    await put(parts.store, "p-older", ProcessState.PROCESSED, OLD - DAY)
    await put(parts.store, "c-old", ProcessState.CANCELLED, NOW - 91 * DAY)
    await put(parts.store, "c-young", ProcessState.CANCELLED, OLD)
    await put(parts.store, "p-young", ProcessState.PROCESSED, NOW - 29 * DAY)
    await put(parts.store, "e-old", ProcessState.ERROR, NOW - 900 * DAY)
    await put(parts.store, "run-old", ProcessState.PROCESSING, NOW - 900 * DAY)
    await put(parts.store, "sus-old", ProcessState.SUSPENDED, NOW - 900 * DAY)
    untouched = ("c-young", "p-young", "e-old", "run-old", "sus-old")
    before = {o: await parts.store.load(o) for o in untouched}
    assert len(await parts.partition("p-old")) > 1, "its history moved to rows"

    run = await parts.archiver().run()

    assert (run.archived, run.kept, run.skipped) == (3, 0, False)
    for order_id in ("p-old", "p-older", "c-old"):
        assert await parts.partition(order_id) == ["state"], "its mark alone is left"
        assert await parts.store.load(order_id) is None
    for order_id, process in before.items():
        assert await parts.store.load(order_id) == process, order_id
    assert (await parts.store.watch("run-old", NOW, replace=False)) is None, "still watched"
    assert await filed(parts.store) == ["c-young", "e-old", "p-young", "sus-old"]

    assert sorted(await parts.all_lines()) == ["c-old", "p-old", "p-older"]
    name = await parts.archive.pointer("p-old")
    assert name is not None and name.startswith(day_prefix(OLD.date()))
    assert name.endswith(".jsonl.gz")
    (copy,) = [o for o in await parts.blobs.read(name) if o.order_id == "p-old"]
    assert copy.process.state.process_state is ProcessState.PROCESSED
    assert copy.process.steps[0].agent == "inventory"
    assert [h.event for h in copy.process.history] == [f"event-{i}" for i in range(45)]
    assert copy.archived_at == NOW
    assert await parts.archive.pointer("p-young") is None

    parts.clock.advance(GRACE.total_seconds())
    again = await parts.archiver().run()
    assert (again.archived, again.pages) == (0, 0), "nothing left that is due"


async def test_candidates_come_from_the_rest_index_and_cost_what_they_find(
    parts: Parts,
) -> None:
    """The oldest created days of each state's entries, to the cutoff: the recent
    finished orders around them are neither read nor archived, and an order at rest
    without its entry waits for it (a backfill or the Supervisor's heal)."""
    await put(parts.store, "p-due", ProcessState.PROCESSED, OLD)
    for i in range(30):
        await put(parts.store, f"p-recent-{i:02d}", ProcessState.PROCESSED, NOW - DAY)
    late = start(an_order("p-late"), ORDER_FULFILMENT, OLD).process
    done = replace(late.state, process_state=ProcessState.PROCESSED, updated_at=NOW - DAY)
    await parts.store.create(replace(late, state=done), [])
    await parts.store.put_rest(rest_entry(replace(late, state=done), ORDER_FULFILMENT))
    unfiled = start(an_order("p-unfiled"), ORDER_FULFILMENT, OLD).process
    await parts.store.create(
        replace(unfiled, state=replace(unfiled.state, process_state=ProcessState.PROCESSED)), []
    )
    parts.store.operations.clear()

    found = await parts.archive.candidates(RetentionPolicy().cutoffs(NOW), 100)

    assert [p.order_id for p in found] == ["p-due"], "created long ago, finished lately: kept"
    assert found[0].etag
    ranges = 3 * len(rest.partitions(ProcessState.PROCESSED))  # a query per shard
    assert parts.store.operations == {"query": ranges, "read": 1}, "a range per state, a read each"

    await put(parts.store, "p-unfiled-entry", ProcessState.PROCESSED, OLD)
    stored = await parts.store.load("p-unfiled")
    assert stored is not None
    await parts.store.put_rest(rest_entry(stored, ORDER_FULFILMENT))
    again = await parts.archive.candidates(RetentionPolicy().cutoffs(NOW), 100)
    assert sorted(p.order_id for p in again) == ["p-due", "p-unfiled", "p-unfiled-entry"]


async def filed(store: TableStateStore) -> list[str]:
    """The orders with a rest entry, in any rest state."""
    pages = [await store.rest_entries(RestRange(s), 100, None) for s in REST_STATES]
    return sorted(e.order_id for p in pages for e in p.items)


class KilledAfter(Exception):
    pass


class Killing:
    """The archive store or the blobs with one call that dies as a `kill -9` would: it
    raises after letting `allowed` calls through."""

    def __init__(self, inner: Any, method: str, allowed: int) -> None:
        self._inner, self._method, self._allowed = inner, method, allowed

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name != self._method:
            return attr

        async def dying(*args: Any, **kwargs: Any) -> Any:
            if self._allowed <= 0:
                raise KilledAfter(name)
            self._allowed -= 1
            return await attr(*args, **kwargs)

        return dying


@pytest.mark.parametrize(
    ("method", "allowed"),
    [
        ("purge", 0),  # the blob is written, no row deleted
        ("purge", 2),  # part of the page deleted
        ("point", 1),  # between a pointer and its purge
        ("write", 0),  # the page is in the cursor, its blob not written
    ],
)
async def test_a_run_killed_mid_page_is_finished_by_the_next_nothing_lost_nothing_twice(
    parts: Parts, method: str, allowed: int
) -> None:
    ids = [f"o-{i}" for i in range(5)]
    for i, order_id in enumerate(ids):
        await put(parts.store, order_id, ProcessState.PROCESSED, OLD - (i % 2) * DAY)
    await put(parts.store, "live", ProcessState.PROCESSING, OLD)
    target = "blobs" if method == "write" else "archive"
    killing = Killing(getattr(parts, target), method, allowed)

    with pytest.raises(KilledAfter):
        await parts.archiver(**{target: killing}).run()
    cursor = await parts.archive.cursor()
    assert cursor is not None and cursor.page is not None, "the page stays in flight"
    left = [o for o in ids if await parts.store.load(o) is not None]
    assert left, "killed before the page was done"
    assert (await parts.archiver().run()).skipped, "the killed run's hold still lasts"

    parts.clock.advance((timedelta(minutes=5) + GRACE).total_seconds())
    run = await parts.archiver().run()

    assert run.resumed and not run.skipped
    for order_id in ids:
        assert await parts.partition(order_id) == ["state"], order_id
        assert await parts.store.archived(order_id) is not None, order_id
    assert Counter(await parts.all_lines()) == Counter(ids), "each order in exactly one blob"
    for order_id in ids:
        name = await parts.archive.pointer(order_id)
        assert name is not None
        assert order_id in [o.order_id for o in await parts.blobs.read(name)]
    assert await parts.store.load("live") is not None
    assert await filed(parts.store) == [], "each purge dropped its rest entry"
    cursor = await parts.archive.cursor()
    assert cursor is not None and cursor.page is None


async def test_an_order_that_changed_since_its_page_was_read_is_left_whole(parts: Parts) -> None:
    """A final order never changes in this app; an operator's hand edit can. Its copy
    must not replace it: the state row is deleted only at the ETag the page read."""
    await put(parts.store, "edited", ProcessState.PROCESSED, OLD)
    await put(parts.store, "other", ProcessState.PROCESSED, OLD)

    class EditFirst:
        def __init__(self, inner: TableArchiveStore) -> None:
            self._inner = inner

        def __getattr__(self, name: str) -> Any:
            return getattr(self._inner, name)

        async def point(self, entry: ArchivedEntry) -> None:
            if entry.order_id == "edited":
                process = await parts.store.load("edited")
                assert process is not None
                await parts.store.save(process, ())
            await self._inner.point(entry)

    run = await parts.archiver(archive=EditFirst(parts.archive), max_orders=2).run()

    assert (run.archived, run.kept, run.pages) == (1, 1, 1)
    assert await parts.store.load("edited") is not None
    assert await parts.archive.pointer("edited") is None, "readers must not take the stale copy"
    assert await parts.store.load("other") is None


async def test_a_day_lists_its_pages(parts: Parts) -> None:
    for i in range(3):
        await put(parts.store, f"d-{i}", ProcessState.COMPENSATED, NOW - 100 * DAY)
    await parts.archiver(page_size=2).run()
    names, more = await parts.blobs.pages((NOW - 100 * DAY).date(), 10, None)
    assert len(names) == 2 and more is None
    found: list[ArchivedOrder] = []
    for name in names:
        found += await parts.blobs.read(name)
    assert sorted(o.order_id for o in found) == ["d-0", "d-1", "d-2"]
    one, more = await parts.blobs.pages((NOW - 100 * DAY).date(), 1, None)
    assert len(one) == 1 and more is not None
    assert await parts.blobs.pages(NOW.date(), 10, None) == ((), None)


async def test_an_archived_orders_id_stays_taken_by_its_mark(parts: Parts) -> None:
    """Issue 37, H: the purge leaves the order's mark under its key, so a create under
    the id collides with it as with a live order; the views skip it, and the intake
    answers a resend from it (another body: conflict; the same: nothing started)."""
    await put(parts.store, "mo-A-1", ProcessState.PROCESSED, OLD, entries=45)
    await put(parts.store, "mo-A-2", ProcessState.PROCESSED, NOW - DAY)

    assert (await parts.archiver().run()).archived == 1

    assert await parts.partition("mo-A-1") == ["state"]
    mark = await parts.store.archived("mo-A-1")
    assert mark == ArchivedMark("mo-A-1", "fp", ProcessState.PROCESSED, NOW)
    assert await parts.store.archived("mo-A-2") is None, "a live order has no mark"
    other = start(an_order("mo-A-1", fingerprint="other"), ORDER_FULFILMENT, NOW)
    with pytest.raises(AlreadyExists):
        await parts.store.create(other.process, other.history)
    assert await parts.store.load("mo-A-1") is None
    assert [s.order_id for s in (await parts.store.list_by_state(None, 100, None)).items] == [
        "mo-A-2"
    ]
    assert [s.order_id for s in await parts.store.states(["mo-A-1", "mo-A-2"])] == ["mo-A-2"]
    assert await parts.store.history("mo-A-1") == ()

    bus = InMemoryBus()
    deps = ProcessDeps(parts.store, bus, parts.clock, a_policy(), catalogue=CATALOGUE)
    with pytest.raises(OrderConflict):
        await submit_order(deps, an_order("mo-A-1", fingerprint="other"))
    same = await submit_order(deps, an_order("mo-A-1"))
    assert not same.created and same.process_state is ProcessState.PROCESSED
    assert bus.on(Queue.SCHEDULER) == [], "nothing started: no key of it is sent again"
    assert [e.order_id for e in (await parts.store.watch_list(100, None)).items] == []
    assert await parts.partition("mo-A-1") == ["state"]

    copy = await archived_order(parts.archive, parts.blobs, "mo-A-1")
    assert copy is not None and len(copy.process.history) == 45


async def test_a_purge_again_finds_its_mark_and_a_changed_order_is_left(parts: Parts) -> None:
    """A page resumed after a kill purges its orders again; an order purged whole by a
    run before marks were kept gets its mark then; a changed one is left as it is."""
    mark = ArchivedMark("twice", "fp", ProcessState.PROCESSED, NOW)
    await put(parts.store, "twice", ProcessState.PROCESSED, OLD, entries=45)
    read = await parts.store.load("twice")
    assert read is not None and read.etag is not None
    assert await parts.archive.purge(mark, read.etag)
    assert await parts.archive.purge(mark, read.etag), "the killed run's page, done again"
    assert await parts.partition("twice") == ["state"]
    assert await parts.store.archived("twice") == mark

    await put(parts.store, "before-marks", ProcessState.PROCESSED, OLD)
    read = await parts.store.load("before-marks")
    assert read is not None and read.etag is not None
    await parts.store.table.delete_entity("before-marks", "state")
    early = replace(mark, order_id="before-marks")
    assert await parts.archive.purge(early, read.etag)
    assert await parts.store.archived("before-marks") == early
    assert await parts.partition("before-marks") == ["state"]

    await put(parts.store, "changed", ProcessState.PROCESSED, OLD)
    read = await parts.store.load("changed")
    assert read is not None and read.etag is not None
    await parts.store.save(read, ())
    assert not await parts.archive.purge(replace(mark, order_id="changed"), read.etag)
    assert await parts.store.archived("changed") is None
    assert await parts.store.load("changed") is not None


async def test_the_backfill_marks_orders_archived_before_marks(parts: Parts) -> None:
    """Pointers paged over their 16 shards; a mark written where the key is free, from
    the blob's copy; an id a newer order took is named and left; safe to repeat."""
    ids = [f"old-{i}" for i in range(5)]
    for order_id in ids:
        await put(parts.store, order_id, ProcessState.PROCESSED, OLD)
    assert (await parts.archiver().run()).archived == 5
    for order_id in ids:  # as a purge before marks left them
        await parts.store.table.delete_entity(order_id, "state")
    reborn = start(an_order("old-4", fingerprint="other"), ORDER_FULFILMENT, NOW)
    await parts.store.create(reborn.process, reborn.history)

    pages, written, continuation = 0, 0, None
    reused: list[str] = []
    while True:
        page = await backfill_marks(parts.store, parts.archive, parts.blobs, 2, continuation)
        pages, written = pages + 1, written + page.written
        reused += page.reused
        continuation = page.continuation
        if continuation is None:
            break

    assert (written, reused) == (4, ["old-4"]) and pages >= 3
    for order_id in ids[:4]:
        assert await parts.store.archived(order_id) == ArchivedMark(
            order_id, "fp", ProcessState.PROCESSED, NOW
        )
    loaded = await parts.store.load("old-4")
    assert loaded is not None and loaded.order.fingerprint == "other", "left as it is"
    again = await backfill_marks(parts.store, parts.archive, parts.blobs, 100, None)
    assert (again.scanned, again.written, again.reused) == (5, 0, ("old-4",))
