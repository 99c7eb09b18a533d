"""POST /api/orders past IntakeMaxPendingPerCustomer: 429 problem+json with Retry-After,
nothing stored; the same order id is accepted once the customer is below it again."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from shared import bootstrap
from shared.adapters.clock import FakeClock
from shared.adapters.memory.store import InMemoryBus, InMemoryStateStore
from shared.contract import Queue, Setting
from shared.ports import RemoteService
from shared.settings import Settings
from shared.usecases.operations.operator import suspend_order
from tests.app_functions import registered_functions
from tests.functions.conftest import SETTINGS, Harness, ScriptedRemote
from tests.workflows import AGENTS, CATALOGUE, AgentName


@pytest.fixture
async def quota() -> AsyncIterator[Harness]:
    store, bus, clock = InMemoryStateStore(), InMemoryBus(), FakeClock()
    remotes = {name: ScriptedRemote() for name in AGENTS}
    ports: dict[AgentName, RemoteService] = dict(remotes)
    settings = Settings.from_env(
        {**SETTINGS, Setting.INTAKE_MAX_PENDING_PER_CUSTOMER: "2"}, catalogue=CATALOGUE
    )
    container = bootstrap.compose(settings, store, bus, ports, clock)
    bootstrap.use(container)
    try:
        functions = {f.name: f for f in registered_functions()}
        yield Harness(store, bus, clock, remotes, functions, container)
    finally:
        bootstrap.reset()


def order(order_id: str, customer: str = "c-1") -> dict[str, Any]:
    return {
        "orderId": order_id,
        "customerId": customer,
        "items": [{"sku": "A", "quantity": 1, "unitPrice": 2.5}],
    }


async def test_over_the_quota_429_nothing_stored_then_accepted_below_it(quota: Harness) -> None:
    for i in range(2):
        ok = await quota.http("submit_order_http", "POST", "orders", order(f"q-{i}"))
        assert ok.status_code == 202
    refused = await quota.http("submit_order_http", "POST", "orders", order("q-2"))
    assert refused.status_code == 429
    assert refused.mimetype == "application/problem+json"
    assert int(refused.headers["Retry-After"]) > 0
    problem = json.loads(refused.get_body())
    assert problem["status"] == 429 and "limit 2" in problem["detail"]
    assert await quota.store.load("q-2") is None and "q-2" not in quota.store.watched()
    other = await quota.http("submit_order_http", "POST", "orders", order("o-1", "c-2"))
    assert other.status_code == 202
    c = await bootstrap.container()
    await suspend_order(c.process, "q-0", "ops")  # at rest: no longer counted
    accepted = await quota.http("submit_order_http", "POST", "orders", order("q-2"))
    assert accepted.status_code == 202
    assert await quota.store.load("q-2") is not None


async def test_the_limit_and_the_top_customers_show_in_ops_data(quota: Harness) -> None:
    for i in range(2):
        await quota.http("submit_order_http", "POST", "orders", order(f"q-{i}"))
    await quota.http("submit_order_http", "POST", "orders", order("o-1", "c-2"))
    answer = await quota.http("ops_data", "GET", "ops/data")
    view = json.loads(answer.get_body())["customers"]
    assert view["maxPendingPerCustomer"] == 2 and view["fairShareRunningPerCustomer"] is None
    assert view["top"] == [
        {"customerId": "c-1", "open": 2, "running": 2, "waiting": 0},
        {"customerId": "c-2", "open": 1, "running": 1, "waiting": 0},
    ]


async def test_a_queued_order_over_the_quota_is_dead_lettered_at_once_saying_why(
    quota: Harness,
) -> None:
    """No redelivery could fix it before the queue's delivery count runs out, and a
    queue has no 429: the dead letter (and its operator alert) is the refusal."""
    for i in range(2):
        await quota.message("submit_order_message", order(f"q-{i}"), message_id=f"m-{i}")
    await quota.message("submit_order_message", order("q-2"), message_id="m-2")
    parked = [(p.queue, p.message_id, p.reason) for p in quota.bus.parked]
    assert parked == [(Queue.ORDERS, "m-2", "over-quota")]
    assert "limit 2" in quota.bus.parked[0].detail
    assert await quota.store.load("q-2") is None and "q-2" not in quota.store.watched()
    alerts = quota.bus.on(Queue.OPERATOR_ALERTS)
    assert [a.body["orderId"] for a in alerts] == ["q-2"]
