"""Retention through the local runtime: the ArchiveSchedule timer archives finished
orders past a short retention and deletes their rows, leaves an in-flight order beside
them alone, and GET /api/orders/{id} still answers an archived order, marked so; the
CLI lists a day and shows one."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from azure.data.tables.aio import TableServiceClient

from devhost.broker import Broker
from devhost.simulator import SimulatorServer
from shared.cli.errors import Exit
from shared.contract import Route, Setting
from shared.settings import azurite_connection_string
from tests.cli.conftest import cli
from tests.e2e.conftest import System, e2e_settings, running_system

pytestmark = [pytest.mark.e2e, pytest.mark.azurite, pytest.mark.broker]

RETENTION_DAYS = "0.00003"
"""About 2.6 s: long enough that an order is seen Processed first, short for a test."""


@pytest.fixture
async def archiving(
    azurite_table_port: int,
    azurite_blob_port: int,
    broker: Broker,
    simulator: SimulatorServer,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[System]:
    settings = e2e_settings(azurite_table_port, broker, simulator.url)
    settings |= {
        Setting.STORAGE: azurite_connection_string(azurite_table_port, blob_port=azurite_blob_port),
        Setting.ARCHIVE_SCHEDULE: "*/1 * * * * *",
        Setting.RETENTION_PROCESSED_DAYS: RETENTION_DAYS,
        Setting.RETENTION_CANCELLED_DAYS: RETENTION_DAYS,
        Setting.RETENTION_COMPENSATED_DAYS: RETENTION_DAYS,
    }
    async with running_system(settings, broker, simulator, monkeypatch) as system:
        yield system


async def rows_of(system: System, order_id: str) -> list[str]:
    async with TableServiceClient.from_connection_string(system.settings[Setting.STORAGE]) as svc:
        table = svc.get_table_client(system.settings[Setting.STATE_TABLE])
        return [
            e["RowKey"]
            async for e in table.query_entities("PartitionKey eq @pk", parameters={"pk": order_id})
        ]


async def wait_archived(system: System, order_id: str, timeout: float = 60) -> dict[str, Any]:
    for _ in range(int(timeout / 0.25)):
        view = await system.order(order_id)
        if view.get("archived"):
            return view
        await asyncio.sleep(0.25)
    raise TimeoutError(f"{order_id} was not archived: {view}")


async def test_finished_orders_are_archived_and_purged_an_in_flight_one_is_not(
    archiving: System,
) -> None:
    system = archiving
    done = [f"arch-{i}" for i in range(3)]
    for order_id in done:
        await system.submit(order_id)
    for order_id in done:
        await system.wait_for(order_id, {"Processed"})
    await system.faults("payment", hangRate=1.0, hangSeconds=30)
    await system.submit("arch-live")
    await system.wait_for("arch-live", {"Processing"}, currentStep=1)

    views = [await wait_archived(system, order_id) for order_id in done]

    for order_id, view in zip(done, views, strict=True):
        assert view["processState"] == "Processed" and view["archived"] is True
        assert view["orderId"] == order_id and view["archivedAt"]
        assert len(view["steps"]) > 0 and len(view["history"]) > 0
        assert await rows_of(system, order_id) == ["state"], "every row but its mark is gone"
    live = await system.order("arch-live")
    assert live["archived"] is False and live["processState"] == "Processing"
    assert "state" in await rows_of(system, "arch-live")

    day = str(views[0]["updatedAt"])[:10]
    async with system.session.get(
        system.app.url(Route.ARCHIVE_DAY.replace("{day}", day))
    ) as response:
        listing = await response.json()
    assert response.status == 200, listing
    listed = [item["orderId"] for item in listing["items"]]
    assert sorted(o for o in listed if o in done) == done
    assert "arch-live" not in listed

    env = {"ORDERS_API_URL": system.api, "ORDERS_OPERATOR": "cli-test"}
    by_cli = await cli("archive", "list", day, "--all", "--json", env=env)
    assert by_cli.code == Exit.OK, by_cli.err
    assert set(done) <= {i["orderId"] for i in json.loads(by_cli.out)["items"]}
    table = await cli("archive", "list", day, env=env)
    assert table.out.splitlines()[0].split()[:2] == ["ORDER", "STATE"]
    shown = await cli("archive", "show", "arch-0", env=env)
    assert shown.code == Exit.OK, shown.err
    assert "Processed" in shown.out and "archived at" in shown.out
    live_shown = await cli("archive", "show", "arch-live", env=env)
    assert "not archived" in live_shown.out
    bad = await cli("archive", "list", "2026-3-3", env=env)
    assert bad.code != Exit.OK and "yyyy-mm-dd" in bad.err
    await system.clear_faults()
