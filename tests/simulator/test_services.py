"""The remote-service API as the agents see it: results, idempotency, validation."""

from __future__ import annotations

import hashlib

import pytest

from tests.simulator.conftest import ORDER, ORDER_AMOUNT, SimClient

PROBLEM = "application/problem+json"


def _hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:16]


async def test_reserve_inventory_result_is_derived_from_the_key(sim: SimClient) -> None:
    reply = await sim.call("inventory", "reserve-inventory", "o-1", "o-1:inventory")

    assert reply.status == 200
    assert reply.body == {
        "result": {"reservationId": f"res-{_hash('o-1:inventory')}", "skus": ["SKU-1", "SKU-2"]}
    }


async def test_charge_payment_sums_the_items(sim: SimClient) -> None:
    reply = await sim.call("payment", "charge-payment", "o-1", "o-1:payment")

    assert reply.status == 200
    assert reply.body == {
        "result": {"paymentId": f"pay-{_hash('o-1:payment')}", "amount": ORDER_AMOUNT}
    }


async def test_create_shipment_returns_ids(sim: SimClient) -> None:
    reply = await sim.call("shipping", "create-shipment", "o-1", "o-1:shipping")

    assert reply.status == 200
    result = reply.body["result"]
    assert result["shipmentId"] == f"shp-{_hash('o-1:shipping')}"
    assert result["trackingNumber"].startswith("TRK")
    assert len(result["trackingNumber"]) == 15


@pytest.mark.parametrize(
    "case",
    [
        ("inventory", "reserve-inventory", "release-inventory", "released", "reservationId"),
        ("payment", "charge-payment", "refund-payment", "refunded", "paymentId"),
        ("shipping", "create-shipment", "cancel-shipment", "cancelled", "shipmentId"),
    ],
)
async def test_compensation_echoes_the_original_result(
    sim: SimClient, case: tuple[str, str, str, str, str]
) -> None:
    service, do, undo, flag, id_field = case
    original = (await sim.call(service, do, "o-1", f"o-1:{do}")).body["result"]

    reply = await sim.call(service, undo, "o-1", f"o-1:{undo}", {"result": original})

    assert reply.status == 200
    assert reply.body["result"][flag] is True
    assert reply.body["result"][id_field] == original[id_field]


async def test_compensation_without_a_known_result_still_undoes(sim: SimClient) -> None:
    # A step that timed out is compensated without knowing its result.
    await sim.call("payment", "charge-payment", "o-1", "o-1:charge-payment")

    reply = await sim.call("payment", "refund-payment", "o-1", "o-1:refund", {"result": None})

    assert reply.status == 200
    assert reply.body == {"result": {"refunded": True}}


async def test_same_result_for_same_key_across_orders_of_calls(sim: SimClient) -> None:
    first = await sim.call("payment", "charge-payment", "o-1", "k-same")
    other = await sim.call("payment", "charge-payment", "o-2", "k-other")
    again = await sim.call("payment", "charge-payment", "o-1", "k-same")

    assert first.body == again.body
    assert first.body != other.body


async def test_repeat_returns_stored_result_without_applying_again(sim: SimClient) -> None:
    first = await sim.call("payment", "charge-payment", "o-1", "k-1")
    # Even a changed payload gets the stored result back, as with a real payment API.
    changed = {**ORDER, "items": [{"sku": "SKU-9", "quantity": 100, "unitPrice": 1}]}
    second = await sim.call("payment", "charge-payment", "o-1", "k-1", changed)

    assert second.status == 200
    assert second.body == first.body
    assert second.headers.get("Idempotent-Replayed") == "true"
    assert "Idempotent-Replayed" not in first.headers
    assert await sim.untimed_effect("k-1") == {
        "service": "payment",
        "operation": "charge-payment",
        "orderId": "o-1",
        "idempotencyKey": "k-1",
        "calls": 2,
        "applied": 1,
        "traceparents": [],
        "abandoned": False,
    }
    stats = await sim.stats("payment")
    assert (stats["calls"], stats["applied"], stats["idempotentRepeats"]) == (2, 1, 1)


@pytest.mark.parametrize(
    ("operation", "order_id"),
    [("refund-payment", "o-1"), ("charge-payment", "o-2")],
)
async def test_key_reused_for_another_request_is_rejected(
    sim: SimClient, operation: str, order_id: str
) -> None:
    await sim.call("payment", "charge-payment", "o-1", "k-1")

    reply = await sim.call("payment", operation, order_id, "k-1", {"result": {}} | ORDER)

    assert reply.status == 422
    assert reply.content_type == PROBLEM
    assert reply.body["code"] == "idempotency-key-reused"
    assert (await sim.effect("k-1"))["calls"] == 1
    assert (await sim.stats("payment"))["keyReuseRejections"] == 1


async def test_keys_are_scoped_per_service(sim: SimClient) -> None:
    inventory = await sim.call("inventory", "reserve-inventory", "o-1", "shared")
    payment = await sim.call("payment", "charge-payment", "o-1", "shared")

    assert (inventory.status, payment.status) == (200, 200)
    assert len(await sim.effects()) == 2


async def test_key_may_come_from_the_header(sim: SimClient) -> None:
    reply = await sim.call(
        "inventory", "reserve-inventory", "o-1", None, headers={"Idempotency-Key": "hdr"}
    )

    assert reply.status == 200
    assert (await sim.effect("hdr"))["calls"] == 1


async def test_body_key_wins_over_header(sim: SimClient) -> None:
    reply = await sim.call(
        "inventory", "reserve-inventory", "o-1", "body-key", headers={"Idempotency-Key": "hdr"}
    )

    assert reply.status == 200
    assert [effect["idempotencyKey"] for effect in await sim.effects()] == ["body-key"]


async def test_missing_key_is_a_bad_request(sim: SimClient) -> None:
    reply = await sim.call("inventory", "reserve-inventory", "o-1", None)

    assert reply.status == 400
    assert reply.content_type == PROBLEM
    assert reply.body["code"] == "missing-idempotency-key"
    assert await sim.effects() == []


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ("{not json", "invalid-json"),
        ("[1, 2]", "invalid-request"),
        ('{"idempotencyKey": "k"}', "invalid-request"),
        ('{"orderId": "o", "idempotencyKey": "k", "payload": {"items": []}}', "invalid-payload"),
        (
            '{"orderId": "o", "idempotencyKey": "k", "payload": {"items": [{"sku": "A"}]}}',
            "invalid-payload",
        ),
    ],
)
async def test_malformed_calls_are_bad_requests(sim: SimClient, body: str, code: str) -> None:
    reply = await sim.request("POST", "/payment/charge-payment", data=body)

    assert reply.status == 400
    assert reply.content_type == PROBLEM
    assert reply.body["status"] == 400
    assert reply.body["code"] == code
    assert await sim.effects() == []


@pytest.mark.parametrize("path", ["/billing/charge-payment", "/payment/charge-card"])
async def test_unknown_service_or_operation_is_404(sim: SimClient, path: str) -> None:
    reply = await sim.request("POST", path, json={"orderId": "o", "idempotencyKey": "k"})

    assert reply.status == 404
    assert reply.content_type == PROBLEM
    assert set(reply.body) == {"type", "title", "status", "detail", "code"}


@pytest.mark.parametrize(
    ("service", "operation", "code"),
    [
        ("inventory", "reserve-inventory", "out-of-stock"),
        ("payment", "charge-payment", "card-declined"),
        ("shipping", "create-shipment", "address-rejected"),
    ],
)
async def test_permanent_failure_for_a_blocked_sku(
    sim: SimClient, service: str, operation: str, code: str
) -> None:
    await sim.put_faults(service, {"permanentFailureSkus": ["SKU-2"]})

    reply = await sim.call(service, operation, "o-1", "k-1")

    assert reply.status == 422
    assert reply.content_type == PROBLEM
    assert reply.body["code"] == code
    assert set(reply.body) == {"type", "title", "status", "detail", "code"}
    assert await sim.untimed_effect("k-1") == {
        "service": service,
        "operation": operation,
        "orderId": "o-1",
        "idempotencyKey": "k-1",
        "calls": 1,
        "applied": 0,
        "traceparents": [],
        "abandoned": False,
    }


async def test_permanent_failure_is_remembered_per_key(sim: SimClient) -> None:
    await sim.put_faults("payment", {"permanentFailureSkus": ["SKU-1"]})
    first = await sim.call("payment", "charge-payment", "o-1", "k-1")
    await sim.request("DELETE", "/_sim/faults")

    again = await sim.call("payment", "charge-payment", "o-1", "k-1")
    fresh_key = await sim.call("payment", "charge-payment", "o-1", "k-2")

    assert again.status == 422
    assert again.body == first.body
    assert fresh_key.status == 200
    assert (await sim.effect("k-1"))["calls"] == 2
    assert (await sim.effect("k-1"))["applied"] == 0
    stats = await sim.stats("payment")
    assert (stats["permanentFailures"], stats["idempotentRepeats"]) == (1, 1)


async def test_payment_can_fail_for_a_sku_while_inventory_succeeds(sim: SimClient) -> None:
    await sim.put_faults("payment", {"permanentFailureSkus": ["SKU-1"]})

    inventory = await sim.call("inventory", "reserve-inventory", "o-1", "o-1:inv")
    payment = await sim.call("payment", "charge-payment", "o-1", "o-1:pay")

    assert (inventory.status, payment.status) == (200, 422)


async def test_compensations_never_fail_permanently(sim: SimClient) -> None:
    await sim.put_faults("inventory", {"permanentFailureSkus": ["SKU-1"]})

    reply = await sim.call(
        "inventory", "release-inventory", "o-1", "k-rel", {"result": {"skus": ["SKU-1"]}}
    )

    assert reply.status == 200


@pytest.mark.parametrize(
    ("service", "operation"),
    [
        ("inventory", "reserve-inventory"),
        ("payment-secondary", "charge-payment"),
        ("notifications", "notify-customer"),
    ],
)
async def test_a_listed_operation_is_rejected_for_every_order(
    sim: SimClient, service: str, operation: str
) -> None:
    await sim.put_faults(service, {"permanentFailureOperations": [operation]})
    other = {**ORDER, "items": [{"sku": "SKU-9", "quantity": 1, "unitPrice": 1}]}

    replies = [
        await sim.call(service, operation, "o-1", "k-1"),
        await sim.call(service, operation, "o-2", "k-2", other),
    ]

    for reply in replies:
        assert reply.status == 422
        assert reply.content_type == PROBLEM
        assert reply.body["code"] == "rejected"
        assert set(reply.body) == {"type", "title", "status", "detail", "code"}
    assert [(e["applied"], e["abandoned"]) for e in await sim.effects()] == [(0, False)] * 2
    assert (await sim.outcome(service, "k-1")).body == {"applied": False}
    stats = await sim.stats(service)
    assert (stats["calls"], stats["applied"], stats["permanentFailures"]) == (2, 0, 2)


async def test_a_listed_operation_leaves_the_others_of_its_service(sim: SimClient) -> None:
    await sim.put_faults("payment", {"permanentFailureOperations": ["refund-payment"]})

    charged = await sim.call("payment", "charge-payment", "o-1", "o-1:charge-payment")
    refunded = await sim.call(
        "payment", "refund-payment", "o-1", "o-1:refund-payment", {"result": charged.body["result"]}
    )
    elsewhere = await sim.call(
        "payment-secondary", "refund-payment", "o-1", "k-r", {"result": None}
    )

    assert charged.status == 200
    assert refunded.status == 422
    assert refunded.body["code"] == "rejected"
    # Rejected, the refund undid nothing: the charge stays applied.
    refund = await sim.effect("o-1:refund-payment")
    assert (refund["applied"], refund["undone"]) == (0, None)
    assert (await sim.effect("o-1:charge-payment"))["applied"] == 1
    assert elsewhere.status == 200


async def test_an_operation_rejection_is_remembered_per_key(sim: SimClient) -> None:
    await sim.put_faults("shipping", {"permanentFailureOperations": ["create-shipment"]})
    first = await sim.call("shipping", "create-shipment", "o-1", "k-1")
    await sim.request("DELETE", "/_sim/faults")

    again = await sim.call("shipping", "create-shipment", "o-1", "k-1")
    fresh_key = await sim.call("shipping", "create-shipment", "o-1", "k-2")

    assert again.status == 422
    assert again.body == first.body
    assert again.headers.get("Idempotent-Replayed") == "true"
    assert fresh_key.status == 200
