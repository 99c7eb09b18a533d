"""The Table Storage layout on real Azurite: what a load and a save cost, which properties
the state entity carries, and orders written in the earlier row-per-step layout."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import timedelta

import pytest
from azure.data.tables.aio import TableClient, TableServiceClient

from shared.adapters.clock import FakeClock
from shared.adapters.table import store as table_store
from shared.adapters.table.store import TableStateStore
from shared.domain.machine import forward
from shared.domain.model import ErrorInfo, ProcessState, StepRecord, StepStatus
from shared.ports import ConcurrencyConflict
from shared.settings import azurite_connection_string
from tests.builders import a_policy, an_order
from tests.workflows import ORDER_FULFILMENT

pytestmark = pytest.mark.azurite

CONTRACT_FIELDS = {"OrderID", "LockedBy", "CompleteBy", "ProcessState", "FailureCount"}


@pytest.fixture
async def tables(azurite_table_port: int) -> AsyncIterator[tuple[TableStateStore, TableClient]]:
    connection = azurite_connection_string(azurite_table_port)
    name = f"t{uuid.uuid4().hex[:20]}"
    store = TableStateStore(TableServiceClient.from_connection_string(connection), name)
    await store.ensure_table()
    raw = TableServiceClient.from_connection_string(connection)
    client = raw.get_table_client(name)
    try:
        yield store, client
    finally:
        await client.close()
        await raw.close()
        await store.close()


async def test_load_is_one_point_read_and_save_one_write(
    tables: tuple[TableStateStore, TableClient],
) -> None:
    store, client = tables
    clock = FakeClock()
    start = forward.start(an_order("cost-1", clock=clock), ORDER_FULFILMENT, clock.now())
    await store.create(start.process, start.history)
    store.operations.clear()
    loaded = await store.load("cost-1")
    assert loaded is not None
    assert store.operations == {"read": 1}
    claim = forward.claim(loaded, ORDER_FULFILMENT, a_policy(), "s-1", clock.now())
    assert claim is not None
    etag = await store.save(claim.process, claim.history)
    await store.save(replace(claim.process, etag=etag), ())
    assert store.operations == {"read": 1, "write": 2}
    keys = sorted([e["RowKey"] async for e in client.list_entities(select=["RowKey"])])
    assert [k for k in keys if not k.startswith("hist-")] == ["state"]
    state = await client.get_entity("cost-1", "state")
    assert CONTRACT_FIELDS - {"LockedBy"} <= set(state) and state["LockedBy"] == "s-1"
    found = [
        e["OrderID"]
        async for e in client.query_entities(
            "ProcessState eq @s and LockedBy eq @by", parameters={"s": "Processing", "by": "s-1"}
        )
    ]
    assert found == ["cost-1"]


async def test_an_order_in_the_row_per_step_layout_loads_and_moves_on(
    tables: tuple[TableStateStore, TableClient],
) -> None:
    store, client = tables
    clock = FakeClock()
    order = an_order("old-1", skus=("a", "b"), reply_to="client", clock=clock)
    process = forward.start(order, ORDER_FULFILMENT, clock.now()).process
    done = replace(
        process.steps[0],
        status=StepStatus.COMPLETED,
        attempts=1,
        complete_by=clock.now() + timedelta(seconds=30),
        result={"ref": "r-1"},
    )
    failed = replace(process.steps[1], status=StepStatus.FAILED, error=ErrorInfo("x", "y"))
    steps = (done, failed, process.steps[2])
    state = process.state
    await client.create_entity(
        {
            "PartitionKey": "old-1",
            "RowKey": "order",
            "OrderID": "old-1",
            "CustomerId": order.customer_id,
            "Items": json.dumps(
                [
                    {"sku": i.sku, "quantity": i.quantity, "unitPrice": i.unit_price}
                    for i in order.items
                ]
            ),
            "Priority": order.priority.value,
            "ReplyTo": "client",
            "Fingerprint": order.fingerprint,
            "CreatedAt": order.created_at,
        }
    )
    await client.create_entity(
        {
            "PartitionKey": "old-1",
            "RowKey": "state",
            "OrderID": "old-1",
            "ProcessState": state.process_state.value,
            "FailureCount": 0,
            "Attempt": 0,
            "Phase": state.phase.value,
            "CurrentStep": 0,
            "Version": state.version,
            "CreatedAt": state.created_at,
            "UpdatedAt": state.updated_at,
            "Workflow": state.workflow,
            "Outbox": json.dumps([]),
        }
    )
    for i, step in enumerate(steps):
        await client.create_entity(_legacy_step("old-1", i, step))

    loaded = await store.load("old-1")
    assert loaded is not None
    assert loaded.order == order
    assert loaded.state == replace(state, outbox=())
    assert loaded.steps == steps

    claim = forward.claim(loaded, ORDER_FULFILMENT, a_policy(), "s-1", clock.now())
    assert claim is not None
    await store.save(claim.process, claim.history)
    with pytest.raises(ConcurrencyConflict):
        await store.save(claim.process, claim.history)
    moved = await store.load("old-1")
    assert moved is not None
    assert moved.state == claim.process.state
    assert moved.steps == claim.process.steps
    assert moved.order == order


def _legacy_step(order_id: str, index: int, step: StepRecord) -> dict[str, object]:
    entity: dict[str, object] = {
        "PartitionKey": order_id,
        "RowKey": f"step-{index:02d}",
        "OrderID": order_id,
        "Step": step.name,
        "Status": step.status.value,
        "Attempts": step.attempts,
        "CompensationAttempts": step.compensation_attempts,
    }
    if step.complete_by is not None:
        entity["CompleteBy"] = step.complete_by
    if step.result is not None:
        entity["Result"] = json.dumps(dict(step.result))
    if step.error is not None:
        entity["ErrorCode"] = step.error.code
        entity["ErrorMessage"] = step.error.message
    return entity


async def test_a_listing_reads_its_page_in_chunks_and_pages_on_after_them(
    tables: tuple[TableStateStore, TableClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An operator's page of 1,000 is asked for `LIST_CHUNK` rows at a time, so the
    response parsed at once is a chunk's; the page and its continuation are the same."""
    store, _ = tables
    monkeypatch.setattr(table_store, "LIST_CHUNK", 2)
    clock = FakeClock()
    for i in range(5):
        start = forward.start(an_order(f"chunk-{i}", clock=clock), ORDER_FULFILMENT, clock.now())
        await store.create(start.process, start.history)
    store.operations.clear()
    first = await store.list_by_state(ProcessState.PENDING, 3, None)
    assert len(first.items) == 3 and first.continuation is not None
    assert store.operations == {"query": 2}
    rest = await store.list_by_state(ProcessState.PENDING, 3, first.continuation)
    assert rest.continuation is None
    listed = sorted(s.order_id for s in (*first.items, *rest.items))
    assert listed == [f"chunk-{i}" for i in range(5)]
