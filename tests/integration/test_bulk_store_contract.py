"""The bulk job record and the scan of orders a job pages through, on the in-memory twin
and real Azurite: field for field, ETag-conditional, and the scan's pages in key order."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from azure.data.tables.aio import TableServiceClient

from shared.adapters.memory.store import InMemoryBulkStore, InMemoryStateStore
from shared.adapters.table.bulk import TableBulkStore
from shared.adapters.table.store import TableStateStore
from shared.domain.bulk import BulkJob, Cursor, JobState, Lease
from shared.domain.bulk_request import BulkAction, BulkFilter
from shared.domain.machine.forward import start
from shared.domain.model import ProcessState
from shared.domain.rest_index import rest_entry
from shared.ports import AlreadyExists, BulkStore, ConcurrencyConflict, StateStore
from shared.settings import azurite_connection_string
from shared.usecases.operations import bulk_lease
from tests.builders import an_order
from tests.workflows import ORDER_FULFILMENT

T0 = datetime(2026, 11, 24, 9, 0, 0, 250000, tzinfo=UTC)


@pytest.fixture(params=["memory", pytest.param("table", marks=pytest.mark.azurite)])
async def stores(request: pytest.FixtureRequest) -> AsyncIterator[tuple[StateStore, BulkStore]]:
    if request.param == "memory":
        memory = InMemoryStateStore()
        yield memory, InMemoryBulkStore(memory)
        return
    port = request.getfixturevalue("azurite_table_port")
    service = TableServiceClient.from_connection_string(azurite_connection_string(port))
    table = TableStateStore(service, f"b{uuid.uuid4().hex[:20]}")
    try:
        yield table, TableBulkStore(table)
    finally:
        await table.close()


def a_job(bulk_id: str = "a" * 32, **changes: object) -> BulkJob:
    job = BulkJob(
        bulk_id=bulk_id,
        action=BulkAction.CANCEL,
        filter=BulkFilter(
            state=ProcessState.ERROR,
            step="charge-payment",
            error_code="timeout",
            customer_id="c-1",
            created_from=T0,
            created_to=T0.replace(year=2027),
        ),
        matched=100_000,
        created_at=T0,
        updated_at=T0,
        operator="ops-1",
    )
    return replace(job, **changes)  # type: ignore[arg-type]


async def test_a_job_reads_back_field_for_field(stores: tuple[StateStore, BulkStore]) -> None:
    _, jobs = stores
    await jobs.create_job(a_job())
    loaded = await jobs.load_job("a" * 32)
    assert loaded is not None and loaded.etag
    assert replace(loaded, etag=None) == a_job()
    assert await jobs.load_job("b" * 32) is None
    with pytest.raises(AlreadyExists):
        await jobs.create_job(a_job())


async def test_progress_is_saved_only_against_the_etag_read(
    stores: tuple[StateStore, BulkStore],
) -> None:
    _, jobs = stores
    await jobs.create_job(a_job())
    first = await jobs.load_job("a" * 32)
    assert first is not None
    claimed = replace(
        first,
        in_flight=("o-1", "o-2"),
        next_cursor=Cursor(1, "token"),
        done=5,
        skipped=1,
        failed=2,
    )
    etag = await jobs.save_job(claimed)
    with pytest.raises(ConcurrencyConflict):
        await jobs.save_job(replace(first, done=99))
    again = await jobs.load_job("a" * 32)
    assert again is not None and again.etag == etag
    assert replace(again, etag=None) == replace(claimed, etag=None)
    await jobs.save_job(replace(again, state=JobState.DONE, in_flight=(), next_cursor=None))
    assert await jobs.jobs(JobState.RUNNING) == ()
    (done,) = await jobs.jobs(JobState.DONE)
    assert done.bulk_id == "a" * 32 and done.in_flight == ()


async def test_the_scan_pages_one_state_in_key_order_with_whole_orders(
    stores: tuple[StateStore, BulkStore],
) -> None:
    store, jobs = stores
    for i in range(7):
        order = an_order(f"s-{i}")
        started = start(order, ORDER_FULFILMENT, T0)
        await store.watch(order.order_id, T0, replace=True)  # as the intake does
        await store.create(started.process, started.history)
    seen: list[str] = []
    continuation: str | None = None
    pages = 0
    while True:
        page = await jobs.orders(ProcessState.PENDING, 3, continuation)
        pages += 1
        assert len(page.items) <= 3
        seen += [p.order_id for p in page.items]
        assert all(p.order.customer_id == "cust-1" and len(p.steps) == 3 for p in page.items)
        continuation = page.continuation
        if continuation is None:
            break
    assert sorted(seen) == [f"s-{i}" for i in range(7)] and pages >= 3
    assert (await jobs.orders(ProcessState.ERROR, 3, None)).items == ()
    with pytest.raises(ValueError):
        await jobs.orders(ProcessState.PENDING, 3, "not-a-token")


async def test_a_rest_state_is_read_from_its_entries_narrowed_by_customer_and_day(
    stores: tuple[StateStore, BulkStore],
) -> None:
    store, jobs = stores
    for i, (customer, days) in enumerate([("ann", 0), ("bob", 0), ("ann", 1), ("ann", 3)]):
        at = T0 + timedelta(days=days)
        order = replace(an_order(f"e-{i}"), customer_id=customer, created_at=at)
        started = start(order, ORDER_FULFILMENT, at)
        errored = replace(
            started.process,
            state=replace(started.process.state, process_state=ProcessState.ERROR),
        )
        await store.create(errored, started.history)
        await store.put_rest(rest_entry(errored, ORDER_FULFILMENT))
    moved_on = await store.load("e-3")
    assert moved_on is not None
    pending = replace(moved_on.state, process_state=ProcessState.PENDING)
    await store.save(replace(moved_on, state=pending), ())  # its entry not yet dropped

    async def found(flt: BulkFilter) -> list[str]:
        page = await jobs.orders(ProcessState.ERROR, 10, None, flt)
        assert all(len(p.steps) == 3 for p in page.items)
        return [p.order_id for p in page.items]

    assert await found(BulkFilter()) == ["e-0", "e-1", "e-2"]
    assert await found(BulkFilter(customer_id="ann")) == ["e-0", "e-2"]
    day_two = BulkFilter(created_from=T0 + timedelta(days=1), created_to=T0 + timedelta(days=2))
    assert await found(day_two) == ["e-2"]
    shown = await jobs.orders(ProcessState.ERROR, 10, None, BulkFilter(), whole=False)
    assert [(p.order_id, p.steps) for p in shown.items] == [(f"e-{i}", ()) for i in range(4)], (
        "as the entries show them, the one not yet dropped too"
    )
    assert shown.items[0].order.customer_id == "ann"
    first = await jobs.orders(ProcessState.ERROR, 2, None)
    rest = await jobs.orders(ProcessState.ERROR, 2, first.continuation)
    assert [p.order_id for p in (*first.items, *rest.items)] == ["e-0", "e-1", "e-2"]


async def test_the_lease_is_written_only_against_the_etag_read(
    stores: tuple[StateStore, BulkStore],
) -> None:
    _, jobs = stores
    assert await jobs.lease() is None
    first = await jobs.put_lease(Lease("a", T0), None)
    with pytest.raises(ConcurrencyConflict):
        await jobs.put_lease(Lease("b", T0), None)  # it exists now
    renewed = await jobs.put_lease(first, first)
    assert renewed.etag != first.etag
    with pytest.raises(ConcurrencyConflict):
        await jobs.put_lease(Lease("b", T0), first)  # read before the renewal
    assert await jobs.lease() == renewed
    assert (await jobs.jobs(JobState.RUNNING), await jobs.jobs(JobState.DONE)) == ((), ())


async def test_of_eight_runs_taking_the_lease_at_once_one_holds_it(
    stores: tuple[StateStore, BulkStore],
) -> None:
    """Concurrent requests on real ETags: all eight read the lease free, one write wins.
    Then it is held until released, or until it expires."""
    _, jobs = stores
    now = T0
    for round_ in range(4):
        until = now + timedelta(seconds=50)
        taken = await asyncio.gather(
            *(bulk_lease.take(jobs, f"i-{n}", now, until) for n in range(8))
        )
        (held,) = [t for t in taken if t is not None]
        assert await jobs.lease() == held.lease
        assert await bulk_lease.take(jobs, "late", now + timedelta(seconds=49), until) is None
        if round_ % 2:
            now += timedelta(seconds=50)  # expired: anyone may take it
        else:
            await held.release(now)
            assert not await held.renew()  # released, as if taken: it stops
            now += timedelta(seconds=1)


async def test_a_migrate_job_keeps_its_target_version(stores: tuple[StateStore, BulkStore]) -> None:
    _, jobs = stores
    job = a_job(
        "c" * 32,
        action=BulkAction.MIGRATE,
        filter=BulkFilter(workflow="order-fulfilment", workflow_version=1),
        to_version=2,
    )
    await jobs.create_job(job)
    loaded = await jobs.load_job("c" * 32)
    assert loaded is not None and replace(loaded, etag=None) == job
    # A job stored before migrate existed has no target version.
    await jobs.create_job(a_job("d" * 32))
    older = await jobs.load_job("d" * 32)
    assert older is not None and older.to_version is None
