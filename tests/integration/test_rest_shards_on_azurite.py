"""The sharded rest index on real Azurite (shared/adapters/table/rest.py): a state's
entries spread over its shards and read back as one range in key order; entries written
before the shards, in one partition per state, are still read and dropped; and the move
(shared/usecases/history/rest_shards.py) takes them to their shards, beside an operator
moving the same orders on."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from azure.data.tables.aio import TableServiceClient

from shared.adapters.table import rest
from shared.adapters.table.store import TableStateStore
from shared.domain.model import ProcessState
from shared.domain.rest_index import RestEntry, RestRange
from shared.settings import azurite_connection_string
from shared.usecases.history.rest_shards import Moved, move_all, move_page
from shared.usecases.operations.operator import resubmit_order
from tests.integration.test_rest_index_contract import a_world, errored, filed, processed
from tests.workflows import CATALOGUE

pytestmark = pytest.mark.azurite

DAY = datetime(2026, 3, 1, 12, tzinfo=UTC)


@pytest.fixture
async def store(azurite_table_port: int) -> AsyncIterator[TableStateStore]:
    service = TableServiceClient.from_connection_string(
        azurite_connection_string(azurite_table_port)
    )
    table = TableStateStore(service, f"t{uuid.uuid4().hex[:20]}")
    await table.ensure_table()
    try:
        yield table
    finally:
        await table.close()


async def in_partition(store: TableStateStore, pk: str) -> list[str]:
    found = store.table.query_entities("PartitionKey eq @pk", parameters={"pk": pk})
    return [str(e["OrderID"]) async for e in found]


async def unshard(store: TableStateStore, state: ProcessState, order_id: str) -> None:
    """Put the order's entry where the version before the shards wrote it: the same
    properties under `~rest-{state}`, written with the SDK as that version did; the
    sharded copy goes."""
    (entry,) = [e for e in await entries(store, state) if e.order_id == order_id]
    old: dict[str, Any] = {
        "PartitionKey": f"~rest-{state.value}",
        "RowKey": f"{entry.created_at:%Y%m%d}|{order_id}",
        "OrderID": order_id,
        "Version": entry.version,
        "CreatedAt": entry.created_at,
        "UpdatedAt": entry.updated_at,
        "Customer": entry.customer_id,
        "Workflow": entry.workflow,
        "WorkflowVersion": entry.workflow_version,
        "CurrentStep": entry.current_step,
        "FailureCount": entry.failure_count,
        "Phase": entry.phase.value,
        "Attempt": entry.attempt,
    }
    if entry.last_error is not None:
        old["LastError"] = entry.last_error
    await store.table.create_entity(old)
    await store.table.delete_entity(rest.partition(state, order_id), entry.key)


async def entries(store: TableStateStore, state: ProcessState) -> list[RestEntry]:
    return list((await store.rest_entries(RestRange(state), 100, None)).items)


async def paged(store: TableStateStore, state: ProcessState, size: int) -> list[list[str]]:
    pages: list[list[str]] = []
    continuation: str | None = None
    while True:
        page = await store.rest_entries(RestRange(state), size, continuation)
        pages.append([e.order_id for e in page.items])
        continuation = page.continuation
        if continuation is None:
            return pages


async def test_a_states_entries_spread_over_its_shards_and_read_as_one_range(
    store: TableStateStore,
) -> None:
    ids = [f"o-{n:02d}" for n in range(12)]
    for n, order_id in enumerate(ids):
        at = DAY + timedelta(hours=n)
        await store.put_rest(
            RestEntry(order_id, ProcessState.PROCESSED, 3, at, at, "ann", "w", 1, 2)
        )
    shards = rest.partitions(ProcessState.PROCESSED)[: rest.REST_SHARDS]
    held = {pk: await in_partition(store, pk) for pk in shards}
    assert sorted(i for found in held.values() for i in found) == ids
    assert all(held.values()), held  # 12 ids over 4 shards: none left empty
    for pk, found in held.items():
        assert all(rest.partition(ProcessState.PROCESSED, i) == pk for i in found)
    assert await in_partition(store, rest.legacy(ProcessState.PROCESSED)) == []

    pages = await paged(store, ProcessState.PROCESSED, 5)
    assert pages == [ids[:5], ids[5:10], ids[10:]]


async def test_an_entry_written_before_the_shards_is_read_dropped_and_moved(
    store: TableStateStore,
) -> None:
    world = a_world(store)
    for order_id in ("d-1", "d-2", "d-3"):
        await processed(world, order_id)
    await errored(world, "a-1")
    for state, order_id in (
        (ProcessState.PROCESSED, "d-1"),
        (ProcessState.PROCESSED, "d-3"),
        (ProcessState.ERROR, "a-1"),
    ):
        await unshard(store, state, order_id)
    legacy = rest.legacy(ProcessState.PROCESSED)
    assert await in_partition(store, legacy) == ["d-1", "d-3"]

    assert await paged(store, ProcessState.PROCESSED, 1) == [["d-1"], ["d-2"], ["d-3"]]
    (a_1,) = await entries(store, ProcessState.ERROR)
    assert (a_1.order_id, a_1.customer_id) == ("a-1", "cust-1") and a_1.last_error

    await resubmit_order(world.deps(), "a-1", "ops")  # off its rest: the old entry goes
    assert await filed(store, ProcessState.ERROR) == []
    assert await in_partition(store, rest.legacy(ProcessState.ERROR)) == []

    said: list[Moved] = []
    assert await move_all(store, CATALOGUE, 1, lambda moved, total: said.append(moved)) == 2
    assert await in_partition(store, legacy) == []
    assert await filed(store, ProcessState.PROCESSED) == ["d-1", "d-2", "d-3"]
    assert {
        i for pk in rest.partitions(ProcessState.PROCESSED) for i in await in_partition(store, pk)
    } == {"d-1", "d-2", "d-3"}
    assert [(m.state, m.moved, m.done) for m in said if m.moved] == [
        (ProcessState.PROCESSED, 1, False),
        (ProcessState.PROCESSED, 1, True),
    ]
    assert await move_all(store, CATALOGUE, 10) == 0  # a repeat finds nothing left


class Meanwhile:
    """Delegates to the store; before the named call reaches it, another instance's
    change runs to its end (once): the move's worst interleavings, on real requests."""

    def __init__(self, inner: TableStateStore) -> None:
        self._inner = inner
        self.before: dict[str, Callable[[], Awaitable[object]]] = {}

    def __getattr__(self, name: str) -> Any:
        call = getattr(self._inner, name)
        if name not in self.before:
            return call

        async def first_the_other(*args: Any, **kwargs: Any) -> Any:
            if name in self.before:
                await self.before.pop(name)()
            return await call(*args, **kwargs)

        return first_the_other


@pytest.mark.parametrize("between", ["put_rest", "drop_unsharded_rest"])
async def test_an_operator_moving_the_order_on_during_its_move_leaves_no_entry(
    store: TableStateStore, between: str
) -> None:
    """The resubmit lands after the move read the order at rest: before the move writes
    its entry to the shard, or after, before it deletes the old one."""
    world = a_world(store)
    await errored(world, "m-1")
    await unshard(store, ProcessState.ERROR, "m-1")
    moving = Meanwhile(store)
    moving.before[between] = lambda: resubmit_order(world.deps(), "m-1", "ops")
    assert await move_all(moving, CATALOGUE, 5) == 1
    assert not moving.before  # the resubmit ran
    assert await filed(store, ProcessState.ERROR) == []
    assert await in_partition(store, rest.legacy(ProcessState.ERROR)) == []
    row = await store.load("m-1")
    assert row is not None and not row.state.process_state.is_at_rest


async def test_the_move_racing_an_operator_leaves_no_entry_for_an_order_moved_on(
    store: TableStateStore,
) -> None:
    """The move of the Error entries and an operator's resubmits, at once, interleaved
    at every await on real HTTP requests: whatever the order, an order moved off Error
    has no Error entry left, in its shard or the old partition."""
    world = a_world(store)
    ids = [f"r-{n}" for n in range(6)]
    for order_id in ids:
        await errored(world, order_id)
        await unshard(store, ProcessState.ERROR, order_id)
    kept = ids[:2]  # left in Error: moved, and still filed

    async def move_errors() -> None:
        while not (await move_page(store, CATALOGUE, ProcessState.ERROR, 1)).done:
            pass

    await asyncio.gather(
        move_errors(), *(resubmit_order(world.deps(), i, "ops") for i in ids if i not in kept)
    )
    assert await filed(store, ProcessState.ERROR) == kept
    assert await in_partition(store, rest.legacy(ProcessState.ERROR)) == []
    for order_id in ids:
        row = await store.load(order_id)
        assert row is not None
        assert (row.state.process_state is ProcessState.ERROR) == (order_id in kept)
