"""Draining an agent on the real stack: new charges move to the secondary provider and
back; a drained shipping agent makes orders wait, uncounted, until it is undrained."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime
from typing import Any

import pytest

from tests.e2e.conftest import System

pytestmark = [pytest.mark.e2e, pytest.mark.azurite, pytest.mark.broker]

PENDING_TIMEOUT = 8.0
"""PendingTimeoutSeconds of the e2e settings (tests/e2e/conftest.py)."""
ROUTING_REFRESH = 2.0
"""Each instance re-reads health and drains this often (shared/usecases/flow/routing.py)."""


async def set_drain(system: System, agent: str, drained: bool) -> dict[str, Any]:
    body = {"drained": drained, "reason": "e2e maintenance window"}
    async with system.session.put(f"{system.api}/agents/{agent}/drain", json=body) as r:
        assert r.status == 200, await r.text()
        view: dict[str, Any] = await r.json()
    assert view["drained"] is drained
    return view


async def charged_by(system: System, order_id: str) -> list[str]:
    return [
        e["service"]
        for e in await system.effects(order_id)
        if e["operation"] == "charge-payment" and e["applied"] == 1
    ]


async def first_charged_by(system: System, service: str, prefix: str) -> int:
    """Submit orders one at a time until one is charged by `service`: a drain reaches a
    Scheduler within its routing refresh, so an order already routed may not see it."""
    deadline = time.monotonic() + ROUTING_REFRESH + 30
    n = 0
    while True:
        n += 1
        await system.submit(f"{prefix}-{n}")
        view = await system.wait_for(f"{prefix}-{n}")
        assert view["processState"] == "Processed", view
        if await charged_by(system, f"{prefix}-{n}") == [service]:
            return n
        assert time.monotonic() < deadline, f"charges never moved to {service}"


async def test_draining_payment_moves_new_charges_to_the_secondary_and_back(
    system: System,
) -> None:
    await set_drain(system, "payment", True)
    n = await first_charged_by(system, "payment-secondary", "drain-a")
    for i in (n + 1, n + 2):
        await system.submit(f"drain-a-{i}")
        view = await system.wait_for(f"drain-a-{i}")
        assert view["processState"] == "Processed", view
        assert await charged_by(system, f"drain-a-{i}") == ["payment-secondary"]
        dispatched = [h["detail"] for h in view["history"] if h["event"] == "step-dispatched"]
        assert any("instead of payment: drained" in d for d in dispatched), dispatched

    await set_drain(system, "payment", False)
    n = await first_charged_by(system, "payment", "drain-b")
    await system.submit(f"drain-b-{n + 1}")
    assert (await system.wait_for(f"drain-b-{n + 1}"))["processState"] == "Processed"
    assert await charged_by(system, f"drain-b-{n + 1}") == ["payment"]


def waits(view: dict[str, Any]) -> int:
    return sum(1 for h in view["history"] if h["event"] == "waiting")


def waited_seconds(view: dict[str, Any]) -> float:
    """From the wait's note to the order's last write (each look writes it)."""
    since = next(h["at"] for h in view["history"] if h["event"] == "waiting")
    waited = datetime.fromisoformat(view["updatedAt"]) - datetime.fromisoformat(since)
    return waited.total_seconds()


async def wait_until(system: System, order_id: str, done: Any, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        view = await system.order(order_id)
        if done(view):
            return view
        assert time.monotonic() < deadline, view
        await asyncio.sleep(0.25)


async def test_a_drained_shipping_agent_makes_orders_wait_uncounted_until_undrained(
    system: System,
) -> None:
    await set_drain(system, "shipping", True)
    # An order routed before the drain reached the Scheduler finishes: take the next.
    n, waiting = 0, ""
    deadline = time.monotonic() + ROUTING_REFRESH + 30
    while not waiting:
        n += 1
        await system.submit(f"ship-{n}")
        view = await wait_until(
            system, f"ship-{n}", lambda v: waits(v) or v["processState"] == "Processed", 30
        )
        waiting = f"ship-{n}" if waits(view) else ""
        assert time.monotonic() < deadline, "no order ever waited for shipping"
    await system.submit(f"ship-{n + 1}")

    # Looked at again past the Pending timeout (8 s) and many Supervisor periods (1 s):
    # still waiting, nothing counted, nothing shipped, one note in the history.
    for order_id in (waiting, f"ship-{n + 1}"):
        view = await wait_until(
            system, order_id, lambda v: waits(v) and waited_seconds(v) > PENDING_TIMEOUT + 2, 45
        )
        assert view["processState"] == "Pending", view
        assert view["currentStep"] == 2 and view["failureCount"] == 0, view
        assert waits(view) == 1, view["history"]
        assert not any(h["event"] == "timed-out" for h in view["history"]), view["history"]
        shipped = [e for e in await system.effects(order_id) if e["service"] == "shipping"]
        assert shipped == []

    await set_drain(system, "shipping", False)
    for order_id in (waiting, f"ship-{n + 1}"):
        view = await system.wait_for(order_id, timeout=60)
        assert view["processState"] == "Processed", view
        assert view["failureCount"] == 0
        shipped = [
            e
            for e in await system.effects(order_id)
            if e["operation"] == "create-shipment" and e["applied"] == 1
        ]
        assert len(shipped) == 1
