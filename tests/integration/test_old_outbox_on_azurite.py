"""An outbox stored before messages named a destination, on real Azurite: an older
version wrote each message with its queue name only. Such a row is read back and its
messages are sent again to the queues it named, here by the intake's answer to a
client's retry of an order never claimed, which sends the stored outbox."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest
from azure.data.tables import UpdateMode
from azure.data.tables.aio import TableServiceClient

from shared.adapters.clock import FakeClock
from shared.adapters.memory.store import InMemoryBus
from shared.adapters.table.rows import STATE_ROW
from shared.adapters.table.store import TableStateStore
from shared.settings import azurite_connection_string
from shared.usecases.flow.deps import ProcessDeps
from shared.usecases.flow.submission import submit_order
from tests.builders import a_policy, an_order
from tests.workflows import CATALOGUE, ORDER_FULFILMENT

pytestmark = pytest.mark.azurite


@pytest.fixture
async def store(azurite_table_port: int) -> AsyncIterator[TableStateStore]:
    connection = azurite_connection_string(azurite_table_port)
    made = TableStateStore(
        TableServiceClient.from_connection_string(connection), f"o{uuid.uuid4().hex[:20]}"
    )
    await made.ensure_table()
    try:
        yield made
    finally:
        await made.close()


async def test_an_outbox_stored_with_queue_names_is_sent_to_those_queues(
    store: TableStateStore,
) -> None:
    clock = FakeClock()
    order = replace(an_order(f"old-{uuid.uuid4().hex[:8]}"), reply_to="shop-replies")
    deps = ProcessDeps(store, InMemoryBus(), clock, a_policy(), catalogue=CATALOGUE)
    await submit_order(deps, order, workflow=ORDER_FULFILMENT)
    row = await store.table.get_entity(order.order_id, STATE_ROW)
    written = json.loads(row["Outbox"])
    assert [m["queue"] for m in written] == [
        "shop-replies",
        "agent-inventory",
        "shop-replies",
    ], "as it is written (claimed at intake)"
    old = [
        {k: m[k] for k in ("queue", "messageId", "body", "deliverAt") if k in m} for m in written
    ]
    row["Outbox"] = json.dumps(old)
    await store.table.update_entity(row, mode=UpdateMode.REPLACE)

    again = InMemoryBus()
    await submit_order(replace(deps, bus=again), order, workflow=ORDER_FULFILMENT)

    assert [(m.queue, m.message_id) for m in again.sent] == [
        (m["queue"], m["messageId"]) for m in written
    ]
