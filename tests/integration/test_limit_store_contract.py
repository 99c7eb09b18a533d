"""The limit rows' contract, on memory and on Azurite's tables: the rate schedule and the
concurrency leases are written only on what was read, so two instances never both take
one slot or both book one stretch of the schedule."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from azure.data.tables.aio import TableServiceClient

from shared.adapters.memory.limits import InMemoryLimitStore
from shared.adapters.table.limits import TableLimitStore
from shared.ports import ConcurrencyConflict, LimitStore
from shared.settings import azurite_connection_string

T0 = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)


@pytest.fixture(params=["memory", pytest.param("table", marks=pytest.mark.azurite)])
async def stores(request: pytest.FixtureRequest) -> AsyncIterator[list[LimitStore]]:
    """Two instances' views of one store (the memory store is one process's)."""
    if request.param == "memory":
        one = InMemoryLimitStore()
        yield [one, one]
        return
    port = request.getfixturevalue("azurite_table_port")
    service = TableServiceClient.from_connection_string(azurite_connection_string(port))
    name = f"t{uuid.uuid4().hex[:20]}"
    tables = [TableLimitStore(service, name), TableLimitStore(service, name)]
    try:
        yield list(tables)
    finally:
        for table in tables:
            await table.close()
        await service.close()


async def test_the_schedule_is_written_only_on_what_was_read(stores: list[LimitStore]) -> None:
    a, b = stores
    assert await a.schedule("payment") is None
    first = await a.put_schedule("payment", T0, None)
    with pytest.raises(ConcurrencyConflict):
        await b.put_schedule("payment", T0, None)
    later = await b.put_schedule("payment", T0 + timedelta(seconds=1), first)
    with pytest.raises(ConcurrencyConflict):
        await a.put_schedule("payment", T0 + timedelta(seconds=2), first)
    read = await a.schedule("payment")
    assert read is not None and read.next_start == later.next_start
    assert await a.schedule("shipping") is None


async def test_a_slot_has_one_holder_and_goes_back_on_release(stores: list[LimitStore]) -> None:
    a, b = stores
    expires = T0 + timedelta(seconds=30)
    held = await a.take("payment", 0, "instance-a", expires, None)
    with pytest.raises(ConcurrencyConflict):
        await b.take("payment", 0, "instance-b", expires, None)
    other = await b.take("payment", 1, "instance-b", expires, None)
    assert sorted((x.slot, x.holder) for x in await a.leases("payment")) == [
        (0, "instance-a"),
        (1, "instance-b"),
    ]
    assert await a.leases("shipping") == ()
    await a.release("payment", held)
    await b.release("payment", other)
    await b.release("payment", other)
    assert await a.leases("payment") == ()


async def test_an_expired_lease_is_taken_over_on_its_etag(stores: list[LimitStore]) -> None:
    a, b = stores
    stale = await a.take("payment", 0, "instance-a", T0, None)
    (seen,) = await b.leases("payment")
    taken = await b.take("payment", 0, "instance-b", T0 + timedelta(seconds=30), seen)
    await a.release("payment", stale)
    assert [(x.slot, x.holder) for x in await b.leases("payment")] == [(0, "instance-b")]
    with pytest.raises(ConcurrencyConflict):
        await a.take("payment", 0, "instance-a", T0 + timedelta(seconds=60), seen)
    assert taken.holder == "instance-b"


async def test_claimed_slots_are_written_only_on_what_was_read(stores: list[LimitStore]) -> None:
    a, b = stores
    slot = T0 + timedelta(microseconds=123_457)
    assert await a.claims("shipping") is None
    first = await a.put_claims("shipping", (slot,), None)
    with pytest.raises(ConcurrencyConflict):
        await b.put_claims("shipping", (T0,), None)
    read = await b.claims("shipping")
    assert read is not None and read.slots == (slot,), "read back to the microsecond"
    later = await b.put_claims("shipping", (slot, T0 + timedelta(seconds=1)), read)
    with pytest.raises(ConcurrencyConflict):
        await a.put_claims("shipping", (), first)
    again = await a.claims("shipping")
    assert again is not None and again.slots == later.slots
    assert await a.claims("payment") is None
