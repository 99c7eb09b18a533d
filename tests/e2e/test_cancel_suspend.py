"""Cancel, suspend and resume end to end on the local runtime.

Every cancel must leave no remote effect applied and not undone; the simulator's effect
ledger is the judge. Waits are on conditions (order views, sweep records), never on
fixed sleeps, so that a loaded machine only makes the tests slower.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

import pytest

from devhost.broker import Broker
from devhost.simulator import SimulatorServer
from shared.contract import Queue, Route, Setting
from tests.e2e.conftest import System, e2e_settings, running_system

pytestmark = [pytest.mark.e2e, pytest.mark.azurite, pytest.mark.broker]

ENDED = {"Processed", "Compensated", "Cancelled", "Error"}


async def act(
    system: System, order_id: str, action: str, body: dict[str, Any] | None = None
) -> tuple[int, dict[str, Any]]:
    route = {"cancel": Route.CANCEL, "suspend": Route.SUSPEND, "resume": Route.RESUME}[action]
    async with system.session.post(
        system.app.url(route, order_id), json=body, headers={"x-operator": "e2e"}
    ) as response:
        return response.status, await response.json(content_type=None)


def step(view: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(s for s in view["steps"] if s["name"] == name)
    return found


def cancel_requested_in(view: dict[str, Any]) -> str:
    """The process state the order was in when the cancel arrived."""
    entries = [h for h in view["history"] if h["event"] == "cancel-requested"]
    assert len(entries) == 1, view["history"]
    state: str = entries[0]["processState"]
    return state


async def wait_step(
    system: System, order_id: str, name: str, status: str, timeout: float = 60
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    view: dict[str, Any] = {}
    while time.monotonic() < deadline:
        view = await system.order(order_id)
        if step(view, name)["status"] == status:
            return view
        await asyncio.sleep(0.1)
    raise TimeoutError(f"{order_id}: {name} never {status}: {view}")


async def assert_every_effect_undone(system: System, order_id: str) -> None:
    """No effect left in force, by the net-effect judge: each applied do is undone after
    it, at the same service (the agent that did a step also undoes it)."""
    await system.assert_net_effect(order_id)


async def cancelled(system: System, order_id: str, timeout: float = 60) -> dict[str, Any]:
    view = await system.wait_for(order_id, ENDED, timeout)
    assert view["processState"] == "Cancelled", view
    await assert_every_effect_undone(system, order_id)
    statuses = [m["status"] for m in await system.drain(Queue.ORDER_STATUS, order_id)]
    assert statuses[-1] == "Cancelled" and "Compensated" not in statuses, statuses
    return view


async def set_drain(system: System, agent: str, drained: bool) -> None:
    body = {"drained": drained, "reason": "e2e"}
    async with system.session.put(f"{system.api}/agents/{agent}/drain", json=body) as r:
        assert r.status == 200, await r.text()


async def a_pending_order(system: System, prefix: str) -> str:
    """An order the intake stored Pending: it claims only an order that can start, and
    the first agent is drained (which reaches the intake within its routing refresh)."""
    deadline = time.monotonic() + 30
    n = 0
    while True:
        n += 1
        answer = await system.submit(f"{prefix}-{n}")
        if answer["processState"] == "Pending":
            return f"{prefix}-{n}"
        assert time.monotonic() < deadline, "the drain never reached the intake"
        await asyncio.sleep(0.2)


async def test_cancel_in_pending_dispatches_nothing(system: System) -> None:
    await set_drain(system, "inventory", True)
    order_id = await a_pending_order(system, "cancel-pending")
    # The cancel's nudge waits on the broker, so the order is still cancelling, not yet
    # Cancelled, when the same cancel comes again.
    system.broker.set_faults(delay_rate=1.0, delay_ms=3000, queues=[Queue.SCHEDULER])
    status, answer = await act(system, order_id, "cancel", {"reason": "changed mind"})
    again, _ = await act(system, order_id, "cancel")
    system.broker.set_faults()
    await set_drain(system, "inventory", False)
    assert status == 202, answer
    assert answer["processState"] == "Pending"
    assert again == 202
    view = await cancelled(system, order_id)
    assert cancel_requested_in(view) == "Pending"
    assert await system.effects(order_id) == []
    status, _ = await act(system, order_id, "cancel")
    assert status == 409


async def test_cancel_mid_step_undoes_the_running_step_once_it_answers(system: System) -> None:
    await system.faults("shipping", latencyMs=2500)
    await system.submit("cancel-mid-1")
    await wait_step(system, "cancel-mid-1", "create-shipment", "Running")
    status, answer = await act(system, "cancel-mid-1", "cancel")
    assert status == 202, answer
    view = await cancelled(system, "cancel-mid-1")
    assert cancel_requested_in(view) == "Processing"
    undone = {e["operation"]: e.get("undone") for e in await system.effects("cancel-mid-1")}
    assert undone["release-inventory"] and undone["refund-payment"]
    assert undone["cancel-shipment"]  # the step that was running is undone too
    assert {s["status"] for s in view["steps"]} == {"Compensated"}


async def test_cancel_in_error_undoes_the_step_in_doubt_and_the_completed_ones(
    azurite_table_port: int,
    broker: Broker,
    simulator: SimulatorServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = e2e_settings(azurite_table_port, broker, simulator.url)
    settings[Setting.MAX_FAILURE_COUNT] = "1"
    async with running_system(settings, broker, simulator, monkeypatch) as system:
        await system.faults("shipping", hangRate=1.0, hangSeconds=30)
        await system.submit("cancel-error-1")
        view = await system.wait_for("cancel-error-1", ENDED, 60)
        assert view["processState"] == "Error"
        await system.clear_faults()
        status, answer = await act(system, "cancel-error-1", "cancel")
        assert status == 202, answer
        view = await cancelled(system, "cancel-error-1")
        assert cancel_requested_in(view) == "Error"
        # The hung shipment never applied: its key is settled (abandoned or not applied
        # once no request could apply), and no provider is asked to undo what it never did.
        assert step(view, "create-shipment")["compensationAttempts"] == 0
        await system.assert_net_effect("cancel-error-1")


async def test_cancel_of_a_suspended_order(system: System) -> None:
    await system.faults("payment", latencyMs=2000)
    await system.submit("cancel-suspended-1")
    await wait_step(system, "cancel-suspended-1", "charge-payment", "Running")
    status, answer = await act(system, "cancel-suspended-1", "suspend")
    assert status == 202 and answer["processState"] == "Suspended", answer
    await wait_step(system, "cancel-suspended-1", "charge-payment", "Completed")
    held = await system.order("cancel-suspended-1")
    assert held["processState"] == "Suspended"
    assert step(held, "create-shipment")["status"] == "NotStarted"  # nothing new dispatched
    status, answer = await act(system, "cancel-suspended-1", "cancel")
    assert status == 202, answer
    view = await cancelled(system, "cancel-suspended-1")
    assert cancel_requested_in(view) == "Suspended"
    effects = {e["operation"] for e in await system.effects("cancel-suspended-1")}
    assert "create-shipment" not in effects


async def test_cancel_during_compensation_ends_cancelled(system: System) -> None:
    await system.faults("payment", permanentFailureSkus=["DECLINED"])
    await system.faults("inventory", latencyMs=2500)
    await system.submit("cancel-undo-1", skus=("SKU-1", "DECLINED"))
    await system.wait_for("cancel-undo-1", {"Compensating"}, 60)
    status, answer = await act(system, "cancel-undo-1", "cancel")
    assert status == 202, answer
    view = await cancelled(system, "cancel-undo-1")
    assert cancel_requested_in(view) == "Compensating"
    assert step(view, "charge-payment")["status"] == "Failed"
    assert step(view, "reserve-inventory")["status"] == "Compensated"


@pytest.fixture
async def hanging_shipping(system: System) -> AsyncIterator[System]:
    await system.faults("shipping", hangRate=1.0, hangSeconds=30)
    yield system


async def test_suspended_order_counts_no_failure_and_resumes_with_a_fresh_deadline(
    hanging_shipping: System,
) -> None:
    system = hanging_shipping
    await system.submit("suspend-1")
    running = await wait_step(system, "suspend-1", "create-shipment", "Running")
    status, answer = await act(system, "suspend-1", "suspend")
    assert status == 202 and answer["processState"] == "Suspended", answer
    complete_by = datetime.fromisoformat(step(running, "create-shipment")["completeBy"])
    await system.sweeps_after(complete_by, 3)
    held = await system.order("suspend-1")
    assert held["processState"] == "Suspended"
    assert held["failureCount"] == 0
    assert "timed-out" not in [h["event"] for h in held["history"]]
    await system.clear_faults()
    status, answer = await act(system, "suspend-1", "resume")
    assert status == 202 and answer["processState"] == "Pending", answer
    done = await system.wait_for("suspend-1", ENDED, 60)
    assert done["processState"] == "Processed"
    assert done["failureCount"] == 0
    shipping = step(done, "create-shipment")
    assert shipping["attempts"] == 2  # dispatched again, under the same key
    keys = {e["idempotencyKey"] for e in await system.effects("suspend-1")}
    assert "suspend-1:create-shipment" in keys
    status, _ = await act(system, "suspend-1", "resume")
    assert status == 409
    statuses = [m["status"] for m in await system.drain(Queue.ORDER_STATUS, "suspend-1")]
    assert statuses == ["Received", "Processing", "Suspended", "Resumed", "Processed"]
