"""Customers sharing the system on the real stack (the ledger on Azurite's tables, the
promotions through the broker): a customer's burst runs two at a time, another
customer's order does not wait for it, every order ends, and the ledger empties."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import datetime

import pytest

from devhost.broker import Broker
from devhost.simulator import SimulatorServer
from shared.contract import Route, Setting
from tests.e2e.conftest import System, e2e_settings, running_system

BURST = 10
SHARE = 2


@pytest.fixture
async def fair(
    azurite_table_port: int,
    broker: Broker,
    simulator: SimulatorServer,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[System]:
    settings = {
        **e2e_settings(azurite_table_port, broker, simulator.url),
        Setting.FAIR_SHARE_RUNNING_PER_CUSTOMER: str(SHARE),
        Setting.INTAKE_MAX_PENDING_PER_CUSTOMER: str(BURST),
    }
    async with running_system(settings, broker, simulator, monkeypatch) as started:
        yield started


async def ledger_emptied(system: System, timeout: float = 20) -> bool:
    """The last order's leave follows its terminal save: poll, bounded, for it."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        async with system.session.get(system.app.url(Route.OPS_DATA)) as response:
            top = (await response.json())["customers"]["top"]
        if top == [] or asyncio.get_running_loop().time() > deadline:
            return bool(top == [])
        await asyncio.sleep(0.2)


def ended(view: dict[str, object]) -> datetime:
    return datetime.fromisoformat(str(view["updatedAt"]).replace("Z", "+00:00"))


async def test_a_burst_runs_its_share_at_a_time_and_another_customer_goes_between(
    fair: System,
) -> None:
    for service in ("inventory", "payment", "shipping"):
        await fair.faults(service, latencyMs=150)
    ids = [f"fa-{i}" for i in range(BURST)]
    await asyncio.gather(
        *(
            fair.app.submit_order(
                order_id, customer_id="A", priority="high" if order_id == "fa-9" else None
            )
            for order_id in ids
        )
    )
    one = [{"sku": "SKU-1", "quantity": 1, "unitPrice": 1.0}]
    status, refused = await fair.app.submit({"orderId": "fa-x", "customerId": "A", "items": one})
    assert status == 429, refused
    await fair.app.submit_order("fb-0", customer_id="B")
    b = await fair.wait_for("fb-0", timeout=60)
    views = [await fair.wait_for(order_id, timeout=90) for order_id in ids]
    assert {v["processState"] for v in [b, *views]} == {"Processed"}
    assert ended(b) < max(ended(v) for v in views)  # B did not wait for all of A
    waited = [v for v in views if any(h["event"] == "waiting-for-fair-share" for h in v["history"])]
    assert len(waited) >= BURST - SHARE - 1  # all but the first ones waited in line
    assert await ledger_emptied(fair)  # every order left the ledger (after its save)
    again = await fair.app.submit_order("fa-0", customer_id="A")  # a repeat: the stored order
    assert again["processState"] == "Processed"
