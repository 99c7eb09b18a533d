"""A kill -9 of the runtime while the ArchiveSchedule timer is archiving: after a restart
every finished order is in the archive exactly once, none is lost, and the orders the
policy keeps (in flight, Error) are untouched.

The finished orders are written straight to the state table, an hour old, so the first
timer run finds them all due and the kill lands in its first pages. A killed run's hold
on the archiver lasts its 4-minute budget plus 30 s; the test ends that hold through the
archive store, as the passing of those minutes would, instead of waiting them out."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from azure.data.tables.aio import TableServiceClient

from devhost.broker import Broker
from devhost.harness.clients import AppClient
from devhost.harness.ports import LOOPBACK, free_port
from devhost.harness.process import Child
from devhost.harness.services import runtime_command
from devhost.simulator import SimulatorServer
from shared.adapters.table.archive import TableArchiveStore
from shared.adapters.table.store import TableStateStore
from shared.contract import Route, Setting
from shared.domain.archive import archive_day
from shared.domain.machine.forward import start
from shared.domain.model import (
    HistoryEntry,
    Order,
    OrderLine,
    Priority,
    ProcessState,
    StepStatus,
)
from shared.domain.rest_index import rest_entry
from shared.settings import azurite_connection_string
from tests.e2e.conftest import e2e_settings, until
from tests.workflows import CATALOGUE

pytestmark = [pytest.mark.e2e, pytest.mark.azurite, pytest.mark.broker, pytest.mark.slow]

FINISHED = 300
"""Three pages of 100 at the archiver's pace of 50 a second: about 6 s of archiving."""
KEPT = {ProcessState.PROCESSING: 3, ProcessState.PENDING: 2, ProcessState.ERROR: 3}
RETENTION_DAYS = "0.01"
"""About 14 minutes: the seeded orders, an hour old, are past it."""


async def seed(store: TableStateStore, tag: str, at: datetime) -> dict[str, ProcessState]:
    """Orders finished (or stopped) at `at`, with a fault-free order's history and, at
    rest, their rest entries; no watch entries, so nothing but the archiver looks at
    them."""
    workflow = CATALOGUE.default_workflow()
    states = [ProcessState.PROCESSED] * (FINISHED - 20)
    states += [ProcessState.CANCELLED] * 10 + [ProcessState.COMPENSATED] * 10
    for state, count in KEPT.items():
        states += [state] * count
    seeded = {f"{tag}-{i:03d}": state for i, state in enumerate(states)}
    gate = asyncio.Semaphore(16)

    async def one(order_id: str, state: ProcessState) -> None:
        order = Order(
            order_id, "kill-c", (OrderLine("SKU", 1, 5.0),), Priority.NORMAL, None, "fp", at
        )
        process = start(order, workflow, at).process
        if state.is_final:
            steps = tuple(replace(s, agent="a", status=StepStatus.COMPLETED) for s in process.steps)
            process = replace(process, steps=steps)
        process = replace(process, state=replace(process.state, process_state=state, updated_at=at))
        history = [HistoryEntry(at, f"e{j}", "", ProcessState.PROCESSING, 0, 1) for j in range(11)]
        async with gate:
            await store.create(process, history)
            if state.is_at_rest:
                await store.put_rest(rest_entry(process, workflow))

    await asyncio.gather(*(one(o, s) for o, s in seeded.items()))
    return seeded


async def state_rows(store: TableStateStore, ids: set[str]) -> set[str]:
    """The seeded orders that still have a state row."""
    found = store.table.query_entities(
        "RowKey eq 'state' and CustomerId eq 'kill-c'", select=["PartitionKey"]
    )
    return {e["PartitionKey"] async for e in found} & ids


async def archive_listing(session: aiohttp.ClientSession, api: str, day: str) -> list[Any]:
    """Every line of the day's blobs, as the archive's own reader lists them."""
    items: list[Any] = []
    continuation: str | None = None
    while True:
        params = {"pages": "100", **({"continuation": continuation} if continuation else {})}
        url = f"{api}/{Route.ARCHIVE_DAY.replace('{day}', day)}"
        async with session.get(url, params=params) as response:
            assert response.status == 200, await response.text()
            page = await response.json()
        items += page["items"]
        continuation = page["continuation"]
        if not continuation:
            return items


async def test_a_kill_during_archival_loses_nothing_and_duplicates_nothing(
    azurite_table_port: int, azurite_blob_port: int, broker: Broker, tmp_path: Path
) -> None:
    with SimulatorServer(port=0, seed=11) as simulator:
        settings = e2e_settings(azurite_table_port, broker, simulator.url)
        connection = azurite_connection_string(azurite_table_port, blob_port=azurite_blob_port)
        settings |= {
            Setting.STORAGE: connection,
            Setting.ARCHIVE_SCHEDULE: "*/1 * * * * *",
            Setting.RETENTION_PROCESSED_DAYS: RETENTION_DAYS,
            Setting.RETENTION_CANCELLED_DAYS: RETENTION_DAYS,
            Setting.RETENTION_COMPENSATED_DAYS: RETENTION_DAYS,
        }
        store = TableStateStore(
            TableServiceClient.from_connection_string(connection), settings[Setting.STATE_TABLE]
        )
        archive = TableArchiveStore(store)
        finished_at = datetime.now(UTC) - timedelta(hours=1)
        seeded = await seed(store, f"kill-{uuid.uuid4().hex[:6]}", finished_at)
        ids = set(seeded)
        finished = {o for o, s in seeded.items() if s.is_final}
        kept = ids - finished
        port = free_port()
        command = runtime_command(port=port, state_dir=tmp_path / "devhost")
        runtime = Child("runtime", command, tmp_path / "runtime.log", env=settings)
        api = f"http://{LOOPBACK}:{port}/api"
        runtime.start()
        try:

            async def mid_page() -> bool:
                left = await state_rows(store, ids)
                cursor = await archive.cursor()
                in_flight = cursor is not None and cursor.page is not None
                return in_flight and kept < left and len(left) < len(ids)

            await until("the archiver mid-page", mid_page, 90, runtime)
            runtime.kill()
            left_at_kill = await state_rows(store, ids) - kept
            assert 0 < len(left_at_kill) < len(finished), "killed too early or too late"
            cursor = await archive.cursor()
            assert cursor is not None and not cursor.free(datetime.now(UTC))
            await archive.put_cursor(replace(cursor, until=datetime.now(UTC)), cursor)

            runtime.start()
            async with aiohttp.ClientSession() as session:
                app = AppClient(session, api)
                await app.wait_healthy(30, runtime)

                async def only_kept_left() -> bool:
                    return await state_rows(store, ids) == kept

                await until("every finished order archived", only_kept_left, 120, runtime)

                for order_id in sorted(finished):
                    view = await app.order(order_id)
                    assert view["archived"] is True, view
                    assert view["processState"] == seeded[order_id].value
                    assert len(view["history"]) == 11, "its whole history, once"
                for order_id in sorted(kept):
                    view = await app.order(order_id)
                    assert view["archived"] is False and view["processState"] == (
                        seeded[order_id].value
                    )
                    assert len(view["history"]) == 11

                day = archive_day(finished_at).isoformat()
                lines = Counter(
                    item["orderId"]
                    for item in await archive_listing(session, api, day)
                    if item["orderId"] in ids
                )
                assert set(lines) == finished, "every finished order archived, nothing else"
                assert [o for o, n in lines.items() if n > 1] == [], "an order in two lines"
        finally:
            runtime.stop()
            await store.close()
