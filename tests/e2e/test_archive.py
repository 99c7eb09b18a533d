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
from shared.contract import Queue, Route, Setting
from shared.settings import azurite_connection_string
from tests.cli.conftest import cli
from tests.e2e.conftest import System, e2e_settings, running_system
from tests.e2e.test_poison import dead_letters, send
from tests.waiting import eventually

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


def an_order_body(order_id: str, customer: str, sku: str, workflow: str) -> dict[str, Any]:
    return {
        "orderId": order_id,
        "customerId": customer,
        "items": [{"sku": sku, "quantity": 1, "unitPrice": 5.0}],
        "workflow": workflow,
    }


async def test_an_archived_orders_id_stays_taken_and_its_keys_are_never_sent_again(
    archiving: System,
) -> None:
    """Issue 37, H, as a hostile client found it: after `mo-A-1` was archived, the same
    id with another body was a 202, and the new order sent the archived one's keys, which
    the provider answered with their old results (never charged). Now another body is a
    409 over HTTP and a dead letter `order-conflict` on the queue; the same body is the
    duplicate's answer (202, the order as it finished); the provider sees no call."""
    system = archiving
    first = an_order_body("mo-A-1", "cust-A", "SKU-A", "order-fulfilment")
    other = an_order_body("mo-A-1", "cust-B", "SKU-B", "express-delivery")
    status, answer = await system.app.submit(first)
    assert status == 202, answer
    await system.wait_for("mo-A-1", {"Processed"})
    await wait_archived(system, "mo-A-1")
    effects = await system.effects("mo-A-1")
    assert {e["operation"] for e in effects} >= {"charge-payment"}, effects

    status, conflict = await system.app.submit(other)
    assert status == 409, conflict
    assert conflict["title"] == "Order exists" and "mo-A-1" in conflict["detail"]
    status, same = await system.app.submit(first)
    assert status == 202, same
    assert same["orderId"] == "mo-A-1" and same["processState"] == "Processed"
    assert same["statusUrl"].endswith("/api/orders/mo-A-1")
    delivered = system.broker.stats()[Queue.ORDERS]["delivered"]
    await send(system, Queue.ORDERS, json.dumps(other).encode(), "mo-A-1-other")
    await send(system, Queue.ORDERS, json.dumps(first).encode(), "mo-A-1-same")

    def settled() -> bool:
        queue = system.broker.stats()[Queue.ORDERS]
        idle = queue["active"] == queue["locked"] == queue["scheduled"] == 0
        return idle and queue["delivered"] >= delivered + 2

    await eventually("both queued resends taken and settled", settled, timeout=60)
    (parked,) = await dead_letters(system, Queue.ORDERS, 1)
    assert parked["props"]["poisonReason"] == "order-conflict", parked
    assert parked["props"]["poisonCopyOf"] == "mo-A-1-other"
    # An order sent after the resends runs to its end: had any of them started an order
    # under the id, its steps would have gone out by then.
    await system.submit("mo-A-after")
    await system.wait_for("mo-A-after", {"Processed"})
    view = await system.order("mo-A-1")
    assert view["archived"] is True and view["customerId"] == "cust-A", view
    assert view["processState"] == "Processed"
    assert await system.effects("mo-A-1") == effects, "no key of it reached a provider again"
    assert await rows_of(system, "mo-A-1") == ["state"], "its mark alone"
