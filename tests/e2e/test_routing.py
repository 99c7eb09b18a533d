"""Routing on the real stack: a failing primary payment provider is routed around, with
no operator action, and gets its work back once it recovers; high-priority lanes."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from tests.e2e.conftest import System

pytestmark = [pytest.mark.e2e, pytest.mark.azurite, pytest.mark.broker]


async def charged_by(system: System, order_id: str) -> list[str]:
    return [
        e["service"]
        for e in await system.effects(order_id)
        if e["operation"] == "charge-payment" and e["applied"] == 1
    ]


def dispatches(view: dict[str, Any]) -> list[str]:
    return [h["detail"] for h in view["history"] if h["event"] == "step-dispatched"]


async def resubmit(system: System, order_id: str) -> None:
    async with system.session.post(f"{system.api}/orders/{order_id}/resubmit") as r:
        assert r.status == 202, await r.text()


async def test_payment_fails_over_to_the_secondary_and_moves_back(system: System) -> None:
    await system.faults("payment", transientErrorRate=1.0)
    # The first order trips the primary's breaker. Its charge may have landed there (the
    # simulator applies some calls before failing them), so its retries stay with the
    # primary, where the idempotency key lives, until it is exhausted.
    await system.submit("route-1")
    stuck = await system.wait_for("route-1")
    assert stuck["processState"] == "Error"
    assert await charged_by(system, "route-1") in ([], ["payment"])

    # While the primary is down, new orders go straight to the secondary: no timeout.
    for i in range(2, 5):
        await system.submit(f"route-{i}")
    for i in range(2, 5):
        view = await system.wait_for(f"route-{i}")
        assert view["processState"] == "Processed", view
        charges = [d for d in dispatches(view) if d.startswith("charge-payment")]
        assert "agent-payment-secondary (instead of payment: circuit" in charges[0], charges
        assert await charged_by(system, f"route-{i}") == ["payment-secondary"]

    # The primary recovers: a heartbeat probe closes its breaker and work moves back.
    await system.clear_faults()
    deadline = time.monotonic() + 40
    n = 10
    while True:
        order_id = f"route-{n}"
        await system.submit(order_id)
        view = await system.wait_for(order_id)
        assert view["processState"] == "Processed"
        if await charged_by(system, order_id) == ["payment"]:
            break
        assert time.monotonic() < deadline, "work never moved back to the primary"
        n += 1
        await asyncio.sleep(1)

    # The exhausted order, resubmitted, is charged once, by the primary.
    await resubmit(system, "route-1")
    view = await system.wait_for("route-1")
    assert view["processState"] == "Processed"
    assert await charged_by(system, "route-1") == ["payment"]


async def test_high_priority_orders_travel_the_high_lanes(system: System) -> None:
    body = {
        "orderId": "vip-1",
        "customerId": "c-1",
        "items": [{"sku": "SKU-1", "quantity": 1, "unitPrice": 5.0}],
        "priority": "high",
    }
    async with system.session.post(f"{system.api}/orders", json=body) as r:
        assert r.status == 202, await r.text()
    view = await system.wait_for("vip-1")
    assert view["processState"] == "Processed"
    lanes = [d.split(" to ")[1].split(" ")[0] for d in dispatches(view)]
    # A loaded machine may time a step out against the tight complete-by: it is then
    # dispatched again, on the same lane.
    assert list(dict.fromkeys(lanes)) == [
        "agent-inventory-high",
        "agent-payment-high",
        "agent-shipping-high",
    ]
