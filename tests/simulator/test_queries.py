"""Outcome queries, ``GET /{service}/operations/{key}``: knowing what a lost reply did."""

from __future__ import annotations

import asyncio
import time

import pytest

from devhost.simulator.services import SERVICE_NAMES, SERVICES
from tests.simulator.conftest import SimClient
from tests.waiting import eventually

PROBLEM = "application/problem+json"
RETRYABLE = {429, 500, 503}

DO = {name: service.dos[0].name for name, service in SERVICES.items()}
"""A do operation of each service (the catalogue's first step it may do)."""


@pytest.mark.parametrize("service", SERVICE_NAMES)
async def test_a_key_never_seen_is_404(sim: SimClient, service: str) -> None:
    reply = await sim.outcome(service, "o-1:never")

    assert reply.status == 404
    assert reply.content_type == PROBLEM
    assert reply.body["code"] == "operation-not-found"


@pytest.mark.parametrize("service", SERVICE_NAMES)
async def test_an_applied_key_answers_the_operations_result(sim: SimClient, service: str) -> None:
    key = f"o-1:{DO[service]}"
    call = await sim.call(service, DO[service], "o-1", key)

    reply = await sim.outcome(service, key)

    assert reply.status == 200
    assert reply.body == {"applied": True, "result": call.body["result"]}
    # Asking is not calling: the key's call count stays as it was.
    assert (await sim.effect(key))["calls"] == 1


async def test_keys_are_per_service(sim: SimClient) -> None:
    await sim.call("payment", "charge-payment", "o-1", "o-1:charge-payment")

    assert (await sim.outcome("payment-secondary", "o-1:charge-payment")).status == 404


async def test_a_permanently_rejected_key_is_seen_not_applied(sim: SimClient) -> None:
    await sim.put_faults("payment", {"permanentFailureSkus": ["SKU-1"]})
    assert (await sim.call("payment", "charge-payment", "o-1", "k-1")).status == 422

    reply = await sim.outcome("payment", "k-1")

    assert (reply.status, reply.body) == (200, {"applied": False})


async def test_a_call_that_failed_before_applying_is_seen_not_applied(sim: SimClient) -> None:
    await sim.put_faults("payment", {"transientErrorRate": 1.0})
    keys = [f"k-{i}" for i in range(8)]
    before = [
        key
        for key in keys
        if (await sim.call("payment", "charge-payment", "o-1", key)).headers["X-Simulator-Fault"]
        == "transient-before-apply"
    ]
    assert before
    await sim.put_faults("payment", {})

    replies = [await sim.outcome("payment", key) for key in before]

    assert all((r.status, r.body) == (200, {"applied": False}) for r in replies)


async def test_a_hung_call_is_in_progress_until_its_client_leaves(sim: SimClient) -> None:
    """While the caller still waits the call might apply; once it left, nothing will."""
    await sim.put_faults("payment", {"hangRate": 1.0, "hangSeconds": 30})
    hung = asyncio.create_task(sim.call("payment", "charge-payment", "o-1", "k-hang"))
    await eventually("the call hangs", lambda: sim.counted("payment", "hangs"), 10)

    during = await sim.outcome("payment", "k-hang")
    hung.cancel()
    await asyncio.gather(hung, return_exceptions=True)
    after = await sim.outcome_when("payment", "k-hang", 200)

    assert during.status == 409
    assert during.content_type == PROBLEM
    assert during.body["code"] == "operation-in-progress"
    assert after.body == {"applied": False}


async def test_a_compensated_key_stays_applied_and_the_undo_answers_for_itself(
    sim: SimClient,
) -> None:
    """A refunded charge still happened, as a provider's read API says; the refund is
    a request of its own, asked under its own key."""
    charge = await sim.call("payment", "charge-payment", "o-1", "o-1:charge-payment")
    refund = await sim.call(
        "payment", "refund-payment", "o-1", "o-1:refund-payment", {"result": charge.body["result"]}
    )

    charged = await sim.outcome("payment", "o-1:charge-payment")
    refunded = await sim.outcome("payment", "o-1:refund-payment")

    assert charged.body == {"applied": True, "result": charge.body["result"]}
    assert refunded.body == {"applied": True, "result": refund.body["result"]}


async def test_cleared_ledger_forgets_keys(sim: SimClient) -> None:
    await sim.call("inventory", "reserve-inventory", "o-1", "k-1")

    await sim.request("DELETE", "/_sim/effects")

    assert (await sim.outcome("inventory", "k-1")).status == 404


async def test_transient_errors_apply_to_queries(sim: SimClient) -> None:
    await sim.call("shipping", "create-shipment", "o-1", "k-1")
    await sim.put_faults("shipping", {"transientErrorRate": 1.0})

    replies = [await sim.outcome("shipping", "k-1") for _ in range(10)]

    assert {r.status for r in replies} <= RETRYABLE
    assert all(r.headers["X-Simulator-Fault"] == "transient-query" for r in replies)
    stats = await sim.stats("shipping")
    assert (stats["queries"], stats["queryTransientErrors"], stats["calls"]) == (10, 10, 1)
    assert (await sim.effect("k-1"))["calls"] == 1


async def test_some_queries_fail_and_asking_again_answers(sim: SimClient) -> None:
    await sim.call("shipping", "create-shipment", "o-1", "k-1")
    await sim.put_faults("shipping", {"transientErrorRate": 0.5})

    statuses = [(await sim.outcome("shipping", "k-1")).status for _ in range(20)]

    assert 200 in statuses
    assert set(statuses) - {200} <= RETRYABLE
    assert set(statuses) != {200}


async def test_latency_applies_to_queries(sim: SimClient) -> None:
    await sim.put_faults("inventory", {"latencyMs": 300, "latencyJitterMs": 50})

    started = time.monotonic()
    reply = await sim.outcome("inventory", "k-unknown")

    assert reply.status == 404
    assert time.monotonic() - started >= 0.3


async def test_hangs_slowness_and_permanent_failures_do_not_apply_to_queries(
    sim: SimClient,
) -> None:
    await sim.call("payment", "charge-payment", "o-1", "k-1")
    await sim.put_faults(
        "payment",
        {
            "hangRate": 1.0,
            "applyThenHangRate": 1.0,
            "slowMs": 5000,
            "permanentFailureSkus": ["SKU-1", "SKU-2"],
        },
    )

    started = time.monotonic()
    applied = await sim.outcome("payment", "k-1")
    unknown = await sim.outcome("payment", "k-2")

    assert time.monotonic() - started < 1
    assert applied.status == 200 and applied.body["applied"] is True
    assert unknown.status == 404


async def test_query_faults_replay_with_the_seed(sim: SimClient) -> None:
    await sim.put_faults("payment", {"transientErrorRate": 0.5})
    first = [(await sim.outcome("payment", f"k-{i}")).status for i in range(12)]

    await sim.request("DELETE", "/_sim/effects")  # query numbers start again
    again = [(await sim.outcome("payment", f"k-{i}")).status for i in range(12)]

    assert first == again


async def test_query_for_an_unknown_service_is_a_problem_404(sim: SimClient) -> None:
    reply = await sim.request("GET", "/billing/operations/k-1")

    assert reply.status == 404
    assert reply.content_type == PROBLEM
