"""The ``/_sim`` control API, whose shape chaos scripts and acceptance checks rely on."""

from __future__ import annotations

from typing import Any

import pytest

from devhost.simulator.services import SERVICE_NAMES
from tests.simulator.conftest import SimClient, untimed

DEFAULTS = {
    "transientErrorRate": 0.0,
    "hangRate": 0.0,
    "latencyMs": 0,
    "latencyJitterMs": 0,
    "hangSeconds": 600.0,
    "permanentFailureSkus": [],
    "permanentFailureOperations": [],
    "slowMs": 0,
    "applyThenHangRate": 0.0,
    "rateLimitPerSecond": None,
    "maxConcurrent": None,
    "lateRate": 0.0,
    "lateSeconds": 0.0,
    "abandonSupported": True,
}


async def test_health(sim: SimClient) -> None:
    reply = await sim.request("GET", "/_sim/health")

    assert reply.status == 200
    assert reply.body == {"status": "ok", "seed": 1234}


async def test_faults_start_empty(sim: SimClient) -> None:
    reply = await sim.request("GET", "/_sim/faults")

    assert reply.body == dict.fromkeys(SERVICE_NAMES, DEFAULTS)


async def test_put_faults_stores_and_returns_settings(sim: SimClient) -> None:
    settings = {"transientErrorRate": 0.25, "latencyMs": 20, "permanentFailureSkus": ["X"]}

    reply = await sim.put_faults("payment", settings)
    stored = (await sim.request("GET", "/_sim/faults")).body

    assert reply.status == 200
    assert reply.body == DEFAULTS | settings
    assert stored["payment"] == DEFAULTS | settings
    assert stored["inventory"] == DEFAULTS


async def test_put_replaces_the_previous_settings(sim: SimClient) -> None:
    await sim.put_faults("payment", {"transientErrorRate": 0.5, "latencyMs": 10})

    reply = await sim.put_faults("payment", {"hangRate": 0.1})

    assert reply.body == DEFAULTS | {"hangRate": 0.1}


async def test_delete_faults_resets_all(sim: SimClient) -> None:
    await sim.put_faults("payment", {"transientErrorRate": 1})
    await sim.put_faults("shipping", {"hangRate": 1})

    reply = await sim.request("DELETE", "/_sim/faults")

    assert reply.status in (200, 204)
    stored = (await sim.request("GET", "/_sim/faults")).body
    assert stored == dict.fromkeys(SERVICE_NAMES, DEFAULTS)


@pytest.mark.parametrize(
    "settings",
    [
        {"transientErrorRate": 1.5},
        {"transientErrorRate": -0.1},
        {"hangRate": 2},
        {"latencyMs": -1},
        {"latencyJitterMs": -5},
        {"hangSeconds": -1},
        {"latencyMs": 1.5},
        {"transientErrorRate": "0.5"},
        {"hangRate": True},
        {"permanentFailureSkus": "SKU-1"},
        {"permanentFailureSkus": [1]},
        {"transientErrorRates": 0.1},
        {"slowMs": -1},
        {"slowMs": 2.5},
        {"slowMs": "100"},
        {"applyThenHangRate": 1.1},
        {"applyThenHangRate": -0.5},
        {"applyThenHangRate": "0.5"},
        {"applyThenHang": 0.5},
        {"abandonSupported": "false"},
        {"abandonSupported": 0},
        {"rateLimitPerSecond": 0},
        {"rateLimitPerSecond": 2.5},
        {"rateLimitPerSecond": "5"},
        {"maxConcurrent": 0},
        {"maxConcurrent": -1},
        {"maxConcurrent": True},
        [],
        "inventory",
    ],
)
async def test_invalid_fault_settings_are_400(sim: SimClient, settings: Any) -> None:
    reply = await sim.put_faults("inventory", settings)

    assert reply.status == 400
    assert reply.content_type == "application/problem+json"
    assert reply.body["status"] == 400
    assert reply.body["code"] == "invalid-faults"
    assert (await sim.request("GET", "/_sim/faults")).body["inventory"] == DEFAULTS


@pytest.mark.parametrize(
    "operations",
    [
        ["charge-payment"],
        ["reserve-inventory", "nope"],
        "reserve-inventory",
        [1],
    ],
)
async def test_permanent_failure_operations_must_be_the_services_own(
    sim: SimClient, operations: Any
) -> None:
    reply = await sim.put_faults("inventory", {"permanentFailureOperations": operations})

    assert reply.status == 400
    assert reply.content_type == "application/problem+json"
    assert reply.body["code"] == "invalid-faults"
    assert (await sim.request("GET", "/_sim/faults")).body["inventory"] == DEFAULTS


async def test_permanent_failure_operations_are_stored(sim: SimClient) -> None:
    settings = {"permanentFailureOperations": ["reserve-inventory", "release-inventory"]}

    reply = await sim.put_faults("inventory", settings)

    assert reply.status == 200
    assert reply.body == DEFAULTS | settings
    assert (await sim.request("GET", "/_sim/faults")).body["inventory"] == DEFAULTS | settings


async def test_fault_body_that_is_not_json_is_400(sim: SimClient) -> None:
    reply = await sim.request("PUT", "/_sim/faults/inventory", data="{oops")

    assert reply.status == 400
    assert reply.content_type == "application/problem+json"


async def test_faults_for_unknown_service_is_404(sim: SimClient) -> None:
    reply = await sim.put_faults("billing", {"transientErrorRate": 0.5})

    assert reply.status == 404
    assert reply.content_type == "application/problem+json"
    assert reply.body["code"] == "unknown-service"


async def _seed_effects(sim: SimClient) -> None:
    await sim.call("inventory", "reserve-inventory", "o-1", "o-1:inv")
    await sim.call("payment", "charge-payment", "o-1", "o-1:pay")
    await sim.call("inventory", "reserve-inventory", "o-2", "o-2:inv")


async def test_effects_are_listed_in_call_order(sim: SimClient) -> None:
    await _seed_effects(sim)

    effects = await sim.effects()

    assert [effect["idempotencyKey"] for effect in effects] == ["o-1:inv", "o-1:pay", "o-2:inv"]
    assert untimed(effects[0]) == {
        "service": "inventory",
        "operation": "reserve-inventory",
        "orderId": "o-1",
        "idempotencyKey": "o-1:inv",
        "calls": 1,
        "applied": 1,
        "traceparents": [],
        "abandoned": False,
    }


@pytest.mark.parametrize(
    ("query", "keys"),
    [
        ("?orderId=o-1", ["o-1:inv", "o-1:pay"]),
        ("?service=inventory", ["o-1:inv", "o-2:inv"]),
        ("?orderId=o-1&service=payment", ["o-1:pay"]),
        ("?orderId=o-3", []),
    ],
)
async def test_effects_filters(sim: SimClient, query: str, keys: list[str]) -> None:
    await _seed_effects(sim)

    effects = await sim.effects(query)

    assert [effect["idempotencyKey"] for effect in effects] == keys


async def test_effects_filter_on_unknown_service_is_400(sim: SimClient) -> None:
    reply = await sim.request("GET", "/_sim/effects?service=billing")

    assert reply.status == 400


async def test_delete_effects_clears_the_ledger(sim: SimClient) -> None:
    await _seed_effects(sim)

    reply = await sim.request("DELETE", "/_sim/effects")

    assert reply.status in (200, 204)
    assert await sim.effects() == []
    # A key seen before the clear is a fresh key afterwards.
    again = await sim.call("inventory", "reserve-inventory", "o-1", "o-1:inv")
    assert "Idempotent-Replayed" not in again.headers
    assert (await sim.effect("o-1:inv"))["calls"] == 1


async def test_stats_count_per_service(sim: SimClient) -> None:
    await _seed_effects(sim)
    await sim.call("payment", "charge-payment", "o-1", "o-1:pay")
    await sim.put_faults("shipping", {"permanentFailureSkus": ["SKU-1"]})
    await sim.call("shipping", "create-shipment", "o-1", "o-1:shp")

    stats = (await sim.request("GET", "/_sim/stats")).body

    assert set(stats) == set(SERVICE_NAMES)
    assert stats["inventory"]["calls"] == 2
    # The two calls were sequential: one ran at a time, and on the wall clock they are
    # one or two in a second (the windows are pinned down in test_limits.py).
    assert stats["payment"].pop("maxCallsInOneSecond") in (1, 2)
    assert stats["payment"] == {
        "calls": 2,
        "applied": 1,
        "transientErrors": 0,
        "transientErrorsAfterApply": 0,
        "hangs": 0,
        "permanentFailures": 0,
        "idempotentRepeats": 1,
        "keyReuseRejections": 0,
        "slowCalls": 0,
        "applyThenHangs": 0,
        "queries": 0,
        "queryTransientErrors": 0,
        "nothingToUndo": 0,
        "inProgressRejections": 0,
        "abandonedRejections": 0,
        "abandons": 0,
        "rateLimited": 0,
        "concurrencyLimited": 0,
        "lateArrivals": 0,
        "lateApplied": 0,
        "heldNow": 0,
        "maxConcurrentSeen": 1,
    }
    assert stats["shipping"]["permanentFailures"] == 1

    assert (await sim.request("DELETE", "/_sim/stats")).status == 204
    assert (await sim.stats("payment"))["calls"] == 0


async def test_the_health_probe_answers_unless_the_service_is_failing(sim: SimClient) -> None:
    ok = await sim.request("GET", "/payment-secondary/health")
    assert ok.status == 200 and ok.body == {"status": "ok", "service": "payment-secondary"}
    await sim.put_faults("payment", {"transientErrorRate": 1})
    assert (await sim.request("GET", "/payment/health")).status == 503
    assert (await sim.request("GET", "/inventory/health")).status == 200
    assert (await sim.request("GET", "/nowhere/health")).status == 404


async def test_delete_one_effect_forgets_only_that_key(sim: SimClient) -> None:
    await _seed_effects(sim)

    reply = await sim.request("DELETE", "/_sim/effects/payment/o-1:pay")

    assert reply.status == 204
    assert [e["idempotencyKey"] for e in await sim.effects()] == ["o-1:inv", "o-2:inv"]
    asked = await sim.request("GET", "/payment/operations/o-1:pay")
    assert asked.status == 404
    assert (await sim.request("DELETE", "/_sim/effects/payment/o-1:pay")).status == 404
    assert (await sim.request("DELETE", "/_sim/effects/inventory/o-1:pay")).status == 404
    assert (await sim.request("DELETE", "/_sim/effects/billing/o-1:pay")).status == 404
