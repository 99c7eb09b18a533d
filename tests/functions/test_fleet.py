"""Agents (drain, undrain) and failures grouped, over HTTP: codes and bodies."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import azure.functions as func
import pytest

from shared import bootstrap
from shared.catalogue.running import workflow_of
from shared.domain.health import AgentHealth, BreakerState
from shared.domain.messages import iso
from shared.domain.model import Phase, ProcessState
from shared.domain.rest_index import rest_entry
from tests.functions.conftest import Harness
from tests.functions.test_functions import ORDER, assert_problem, body
from tests.workflows import CATALOGUE

AGENTS = list(CATALOGUE.agents)


async def drain(
    harness: Harness,
    agent: str,
    payload: object,
    *,
    raw: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> func.HttpResponse:
    return await harness.http(
        "drain_agent_http",
        "PUT",
        f"agents/{agent}/drain",
        payload,
        raw=raw,
        headers=headers,
        route_params={"agent": agent},
    )


async def test_agents_lists_every_agent_undrained_and_unheard_of(harness: Harness) -> None:
    response = await harness.http("agents_http", "GET", "agents")
    assert response.status_code == 200
    agents = body(response)["agents"]
    assert [a["agent"] for a in agents] == AGENTS
    payment = agents[1]
    assert payment["queue"] == "agent-payment"
    assert payment["highPriorityQueue"] == "agent-payment-high"
    assert (payment["drained"], payment["reason"], payment["health"]) == (False, None, None)


async def test_drain_answers_200_with_the_agent_and_the_list_shows_it(harness: Harness) -> None:
    response = await drain(
        harness,
        "payment",
        {"drained": True, "reason": "provider maintenance"},
        headers={"x-operator": "alice"},
    )
    assert response.status_code == 200
    view = body(response)
    assert (view["agent"], view["drained"], view["reason"], view["by"]) == (
        "payment",
        True,
        "provider maintenance",
        "alice",
    )
    assert view["since"]
    listed = body(await harness.http("agents_http", "GET", "agents"))["agents"]
    assert [a["agent"] for a in listed if a["drained"]] == ["payment"]
    undrained = body(await drain(harness, "payment", {"drained": False}))
    assert (undrained["drained"], undrained["reason"]) == (False, None)
    records = await (await bootstrap.container()).health.agent_records()
    assert [(d.agent, d.drained) for d in records.drains] == [("payment", False)]


async def test_an_unknown_agent_is_404(harness: Harness) -> None:
    assert_problem(await drain(harness, "billing", {"drained": True}), 404)
    assert_problem(await drain(harness, "../x", {"drained": True}), 404)


@pytest.mark.parametrize(
    "payload",
    [
        {},
        {"drained": "yes"},
        {"drained": 1},
        {"drained": None},
        {"drained": True, "reason": 5},
        {"drained": True, "reason": "x" * 501},
        {"drained": True, "extra": 1},
        [True],
        "true",
    ],
)
async def test_a_bad_drain_body_is_400(harness: Harness, payload: object) -> None:
    assert_problem(await drain(harness, "shipping", payload), 400)
    records = await (await bootstrap.container()).health.agent_records()
    assert records.drains == ()


async def test_a_drain_body_that_is_not_json_is_400_or_415(harness: Harness) -> None:
    assert_problem(await drain(harness, "shipping", None, raw=b"{"), 400)
    response = await drain(
        harness, "shipping", None, raw=b"drained", headers={"content-type": "text/plain"}
    )
    assert_problem(response, 415)


async def error_order(harness: Harness, order_id: str, last_error: str, step: int) -> None:
    await harness.http("submit_order_http", "POST", "orders", {**ORDER, "orderId": order_id})
    process = await harness.store.load(order_id)
    assert process is not None
    state = replace(
        process.state,
        process_state=ProcessState.ERROR,
        last_error=last_error,
        current_step=step,
        phase=Phase.FORWARD,
    )
    errored = replace(process, state=state)
    await harness.store.save(errored, ())
    await harness.store.put_rest(
        rest_entry(errored, workflow_of(CATALOGUE, state))
    )  # as its rest writes it


async def test_failures_groups_error_orders_largest_first(harness: Harness) -> None:
    empty = await harness.http("failures_http", "GET", "failures")
    assert empty.status_code == 200
    assert body(empty) == {"groups": [], "scanned": 0, "scanCap": 10000, "truncated": False}
    for i in range(3):
        timeout = f"charge-payment not completed by 2026-11-24T09:00:0{i}Z"
        await error_order(harness, f"t-{i}", timeout, 1)
    await error_order(harness, "d-1", "create-shipment: no-route: address unknown", 2)
    answer = body(await harness.http("failures_http", "GET", "failures"))
    assert answer["scanned"] == 4 and answer["truncated"] is False
    groups = answer["groups"]
    assert [(g["step"], g["errorCode"], g["count"]) for g in groups] == [
        ("charge-payment", "timeout", 3),
        ("create-shipment", "no-route", 1),
    ]
    assert sorted(groups[0]["sampleOrderIds"]) == ["t-0", "t-1", "t-2"]
    assert groups[0]["firstAt"] <= groups[0]["lastAt"]


async def test_agents_show_each_agents_limits_rate_and_429s_over_its_instances(
    harness: Harness,
) -> None:
    """Two instances' heartbeats: the limits as they run them, the rates added up, the
    `429`s counted over both and the latest of them."""
    c = await bootstrap.container()
    now = harness.clock.now()
    for instance, rate, throttled, last in (("i-1", 2.4, 3, 10), ("i-2", 2.5, 1, 20)):
        await c.health.publish_health(
            AgentHealth(
                "payment", instance, BreakerState.CLOSED, 1.0, 10.0, 0, 16, 5, now,
                max_concurrent=8, calls_per_second=5.0, rate=rate, throttled=throttled,
                last_limited_at=now - timedelta(seconds=last),
            )
        )  # fmt: skip

    response = await harness.http("agents_http", "GET", "agents")

    agents = {a["agent"]: a for a in body(response)["agents"]}
    assert agents["payment"]["limits"] == {
        "maxConcurrent": 8,
        "callsPerSecond": 5.0,
        "rate": 4.9,
        "throttled": 4,
        "last429": iso(now - timedelta(seconds=10)),
    }
    assert agents["shipping"]["limits"] == {
        "maxConcurrent": None,
        "callsPerSecond": None,
        "rate": 0,
        "throttled": 0,
        "last429": None,
    }
