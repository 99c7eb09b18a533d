"""A bulk migrate on real Azurite: the dry run counts the compatible orders and refuses
the others, the durable job (its record in `~bulk` with ToVersion) moves exactly the
compatible ones, and a moved running order finishes on the new version."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from azure.data.tables.aio import TableServiceClient

from shared.adapters.clock import FakeClock
from shared.adapters.memory.store import InMemoryBus
from shared.adapters.table.bulk import TableBulkStore
from shared.adapters.table.store import TableStateStore
from shared.contract import Queue, agent_queue
from shared.domain.bulk import JobState
from shared.domain.bulk_request import BulkAction, BulkRequest
from shared.domain.model import ProcessState, StepStatus
from shared.settings import azurite_connection_string
from shared.usecases.flow import scheduler
from shared.usecases.flow.deps import ProcessDeps
from shared.usecases.operations.bulk import BulkDeps, job_status, preview, start_job, work_jobs
from tests.builders import a_policy, a_reply
from tests.unit.test_migrate import MIGRATE, V2, V3, charging, submitted
from tests.workflows import running

pytestmark = pytest.mark.azurite


@pytest.fixture
async def table(azurite_table_port: int) -> AsyncIterator[TableStateStore]:
    connection = azurite_connection_string(azurite_table_port)
    store = TableStateStore(
        TableServiceClient.from_connection_string(connection), f"m{uuid.uuid4().hex[:20]}"
    )
    await store.ensure_table()
    try:
        yield store
    finally:
        await store.close()


async def test_a_bulk_migrate_moves_only_compatible_orders_and_they_finish_on_the_target(
    table: TableStateStore,
) -> None:
    bus = InMemoryBus()
    deps = ProcessDeps(
        table, bus, FakeClock(), a_policy(), "scheduler-1", catalogue=running(V2, V3)
    )
    for i in range(3):
        await charging(deps, bus, f"c-{i}")
    for i in range(2):
        await submitted(deps, f"n-{i}")
    bulk = BulkDeps(deps, TableBulkStore(table), 50)
    request = BulkRequest(BulkAction.MIGRATE, MIGRATE, True, to_version=3)

    dry = await preview(bulk, request)
    assert (dry.matched, dry.refused) == (2, 3)
    assert {r["orderId"] for r in dry.refusals} == {"c-0", "c-1", "c-2"}
    assert (
        await preview(bulk, BulkRequest(BulkAction.MIGRATE, MIGRATE, True, None, 2))
    ).matched == 5

    to_v3 = await start_job(bulk, BulkRequest(BulkAction.MIGRATE, MIGRATE, to_version=3), "ops")
    await work_jobs(bulk, budget=timedelta(minutes=5))
    done = await job_status(bulk, to_v3.bulk_id)
    assert (done.state, done.to_version, done.done, done.skipped) == (JobState.DONE, 3, 2, 0)

    # The running orders are refused by v3 but fit v2: a second job moves them there.
    to_v2 = await start_job(bulk, BulkRequest(BulkAction.MIGRATE, MIGRATE, to_version=2), "ops")
    assert to_v2.matched == 3
    await work_jobs(bulk, budget=timedelta(minutes=5))
    assert (await job_status(bulk, to_v2.bulk_id)).done == 3

    versions = {}
    for order_id in ("c-0", "c-1", "c-2", "n-0", "n-1"):
        process = await table.load(order_id)
        assert process is not None
        versions[order_id] = process.state.workflow_version
    assert versions == {"c-0": 2, "c-1": 2, "c-2": 2, "n-0": 3, "n-1": 3}
    history = await table.history("c-0")
    assert [h.detail for h in history if h.event == "migrated"] == [
        f"from v1 to v2 by bulk:{to_v2.bulk_id}"
    ]

    # c-0's charge answers; it then ships and notifies: v2's steps, to the end.
    for charge in bus.take(agent_queue("payment")):
        if charge.body["orderId"] == "c-0":
            await scheduler.on_reply(deps, a_reply(charge))
    for queue in ("shipping", "notifications"):
        for nudge in bus.take(Queue.SCHEDULER):
            if nudge.body["orderId"] == "c-0":
                await scheduler.on_nudge(deps, "c-0")
        (request_c0,) = [m for m in bus.take(agent_queue(queue)) if m.body["orderId"] == "c-0"]
        await scheduler.on_reply(
            deps, a_reply(request_c0, result={"trackingNumber": "TRK-1", "shipmentId": "s-1"})
        )
    finished = await table.load("c-0")
    assert finished is not None and finished.state.process_state is ProcessState.PROCESSED
    assert [s.status for s in finished.steps] == [StepStatus.COMPLETED] * 4
