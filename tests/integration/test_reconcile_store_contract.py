"""Reconciliation's sample of finished orders and its kept runs, on the in-memory twin
and real Azurite: finished states only, within the window, from the start key wrapping
round, at most the limit; runs newest first with their mismatches."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from azure.data.tables.aio import TableServiceClient

from shared.adapters.memory.reconcile import InMemoryReconcileStore
from shared.adapters.memory.store import InMemoryStateStore
from shared.adapters.table import rows
from shared.adapters.table.reconcile import TableReconcileStore
from shared.adapters.table.store import TableStateStore
from shared.domain.machine.forward import start
from shared.domain.model import ProcessState, StepStatus
from shared.domain.reconcile import Mismatch, ReconcileRun
from shared.domain.rest_index import rest_entry
from shared.ports import ReconcileStore, StateStore, UnreadableOrder
from shared.settings import azurite_connection_string
from tests.builders import an_order
from tests.workflows import ORDER_FULFILMENT

T0 = datetime(2026, 11, 24, 9, 0, 0, 250000, tzinfo=UTC)


@pytest.fixture(params=["memory", pytest.param("table", marks=pytest.mark.azurite)])
async def stores(
    request: pytest.FixtureRequest,
) -> AsyncIterator[tuple[StateStore, ReconcileStore]]:
    if request.param == "memory":
        memory = InMemoryStateStore()
        yield memory, InMemoryReconcileStore(memory)
        return
    port = request.getfixturevalue("azurite_table_port")
    service = TableServiceClient.from_connection_string(azurite_connection_string(port))
    table = TableStateStore(service, f"r{uuid.uuid4().hex[:20]}")
    try:
        yield table, TableReconcileStore(table)
    finally:
        await table.close()


async def put(store: StateStore, order_id: str, state: ProcessState, at: datetime) -> None:
    process = start(an_order(order_id), ORDER_FULFILMENT, at).process
    steps = tuple(replace(s, agent="inventory", status=StepStatus.COMPLETED) for s in process.steps)
    state_record = replace(process.state, process_state=state, updated_at=at)
    stored = replace(process, steps=steps, state=state_record)
    await store.create(stored, ())
    if state.is_at_rest:
        await store.put_rest(rest_entry(stored, ORDER_FULFILMENT))  # as its rest writes it


async def test_the_sample_is_recent_orders_at_rest_from_the_start_key(
    stores: tuple[StateStore, ReconcileStore],
) -> None:
    store, reconcile = stores
    await put(store, "a1", ProcessState.PROCESSED, T0)
    await put(store, "b1", ProcessState.COMPENSATED, T0)
    await put(store, "c1", ProcessState.ERROR, T0)
    await put(store, "d1", ProcessState.CANCELLED, T0)
    await put(store, "e1", ProcessState.PROCESSING, T0)
    await put(store, "f1", ProcessState.PROCESSED, T0 - timedelta(days=2))
    since = T0 - timedelta(hours=24)

    everything = await reconcile.finished_sample(since, "b", 50)
    assert [p.order_id for p in everything] == ["b1", "c1", "d1", "a1"]  # c1: held in Error
    assert everything[0].steps[0].agent == "inventory"
    assert everything[0].state.process_state is ProcessState.COMPENSATED

    two = await reconcile.finished_sample(since, "c", 2)
    assert [p.order_id for p in two] == ["c1", "d1"]
    assert await reconcile.finished_sample(since, "", 0) == ()


async def test_runs_are_kept_newest_first_with_their_mismatches(
    stores: tuple[StateStore, ReconcileStore],
) -> None:
    _, reconcile = stores
    assert await reconcile.recent_runs(5) == ()
    mismatch = Mismatch(
        "o-1", ProcessState.CANCELLED, "charge-payment", "payment", "o-1:charge-payment",
        "not applied, or undone", "applied, its undo key o-1:refund-payment never seen",
    )  # fmt: skip
    double = replace(mismatch, state=ProcessState.PROCESSED, reason="applied-at-two-providers")
    first = ReconcileRun("i-1", T0, T0 + timedelta(seconds=2), 3, 7, 1, (mismatch, double))
    second = ReconcileRun("i-2", T0 + timedelta(hours=1), T0 + timedelta(hours=1), 0, 0, 0, ())
    await reconcile.record_run(first)
    await reconcile.record_run(second)
    assert await reconcile.recent_runs(5) == (second, first)
    assert await reconcile.recent_runs(1) == (second,)


@pytest.mark.azurite
async def test_an_order_whose_row_cannot_be_read_is_left_out_of_the_sample(
    azurite_table_port: int, caplog: pytest.LogCaptureFixture
) -> None:
    """One bad row (here steps that are not JSON) used to fail the whole sample, and
    `POST /api/reconcile` with it, with a 500."""
    service = TableServiceClient.from_connection_string(
        azurite_connection_string(azurite_table_port)
    )
    store = TableStateStore(service, f"r{uuid.uuid4().hex[:20]}")
    try:
        await put(store, "a1", ProcessState.PROCESSED, T0)
        await put(store, "b1", ProcessState.PROCESSED, T0)
        await store.table.update_entity(
            {"PartitionKey": "b1", "RowKey": "state", rows.STEPS: "not json"}, mode="merge"
        )
        with pytest.raises(UnreadableOrder, match="b1"):
            await store.load("b1")

        sample = await TableReconcileStore(store).finished_sample(T0 - timedelta(hours=1), "", 10)

        assert [p.order_id for p in sample] == ["a1"]
        assert "b1" in caplog.text and "cannot be read" in caplog.text
    finally:
        await store.close()
