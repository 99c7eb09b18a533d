"""Bad input is a 4xx or a dead letter, never an exception: deep JSON, wrong media types,
whole numbers written as floats."""

from __future__ import annotations

import base64
import json
import sys
from collections.abc import Iterator

import azure.functions as func
import pytest

from shared import jsonbounds
from shared.adapters.table.store import _decode_token
from shared.contract import Queue
from tests.functions.conftest import Harness

DEPTH = 976
DEEP = "[" * DEPTH + "]" * DEPTH
ORDER = {"customerId": "c-1", "items": [{"sku": "SKU-1", "quantity": 2, "unitPrice": 9.5}]}


@pytest.fixture
def shallow_stack() -> Iterator[None]:
    """Leave the stack as full as a worker's: a recursive parse of DEEP cannot finish."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(200)
    try:
        yield
    finally:
        sys.setrecursionlimit(limit)


def problem_of(response: func.HttpResponse) -> dict[str, object]:
    assert response.mimetype == "application/problem+json"
    body: dict[str, object] = json.loads(response.get_body())
    return body


def test_depth_is_bounded_without_recursion(shallow_stack: None) -> None:
    with pytest.raises(jsonbounds.TooDeep):
        jsonbounds.loads(DEEP)
    nested = {"a": [{"b": [1]}]}
    assert jsonbounds.loads(json.dumps(nested)) == nested
    # Brackets inside strings are text, not nesting.
    assert jsonbounds.loads(json.dumps({"s": "[" * 100})) == {"s": "[" * 100}
    assert jsonbounds.loads(json.dumps({"s": '\\"[[[' * 50})) == {"s": '\\"[[[' * 50}


def test_a_deep_continuation_token_is_invalid(shallow_stack: None) -> None:
    token = base64.urlsafe_b64encode(DEEP.encode()).decode()
    with pytest.raises(ValueError, match="invalid continuation token"):
        _decode_token(token)


async def test_a_deep_body_is_a_400(harness: Harness, shallow_stack: None) -> None:
    for body in (DEEP, '{"customerId": ' + DEEP + "}"):
        response = await harness.http("submit_order_http", "POST", "orders", raw=body.encode())
        assert response.status_code == 400
        assert "nested deeper than 32" in str(problem_of(response)["detail"])


@pytest.mark.parametrize(
    "content_type",
    ["application/json", "application/json; charset=utf-8", "application/merge-patch+json"],
)
async def test_json_media_types_are_accepted(harness: Harness, content_type: str) -> None:
    response = await harness.http(
        "submit_order_http", "POST", "orders", ORDER, headers={"content-type": content_type}
    )
    assert response.status_code == 202


@pytest.mark.parametrize(
    "content_type", ["", "text/plain", "application/x-www-form-urlencoded", "multipart/form-data"]
)
async def test_other_media_types_are_a_415(harness: Harness, content_type: str) -> None:
    response = await harness.http(
        "submit_order_http", "POST", "orders", ORDER, headers={"content-type": content_type}
    )
    assert response.status_code == 415
    assert problem_of(response)["status"] == 415
    assert (await harness.store.list_by_state(None, 10, None)).items == ()


async def test_a_whole_float_quantity_is_an_integer(harness: Harness) -> None:
    body = {**ORDER, "items": [{"sku": "SKU-1", "quantity": 9799.0, "unitPrice": 1}]}
    response = await harness.http("submit_order_http", "POST", "orders", body)
    assert response.status_code == 202
    order_id = json.loads(response.get_body())["orderId"]
    stored = await harness.store.load(order_id)
    assert stored is not None and stored.order.items[0].quantity == 9799
    half = {**ORDER, "items": [{"sku": "SKU-1", "quantity": 9799.5, "unitPrice": 1}]}
    assert (await harness.http("submit_order_http", "POST", "orders", half)).status_code == 400


async def test_deep_messages_are_dead_lettered_with_a_reason(
    harness: Harness, shallow_stack: None
) -> None:
    deep_order = '{"orderId": "o-1", "customerId": ' + DEEP + "}"
    await harness.message("scheduler_nudge", DEEP.encode(), message_id="deep-1")
    await harness.message("submit_order_message", deep_order.encode(), message_id="deep-2")
    await harness.message("scheduler_reply", deep_order.encode(), message_id="deep-3")
    parked = [(p.queue, p.message_id, p.reason) for p in harness.bus.parked]
    assert parked == [
        (Queue.SCHEDULER, "deep-1", "invalid-message"),
        (Queue.ORDERS, "deep-2", "invalid-message"),
        (Queue.AGENT_REPLIES, "deep-3", "invalid-message"),
    ]
    assert all("nested deeper than 32" in p.detail for p in harness.bus.parked)
    # Too deep to read its orderId safely: no operator alert names an order.
    assert harness.bus.on(Queue.OPERATOR_ALERTS) == []


@pytest.mark.parametrize("notify", ["loud", "FINAL", 1, ["final"]])
async def test_a_notify_value_other_than_all_or_final_is_a_400_naming_both(
    harness: Harness, notify: object
) -> None:
    body = {**ORDER, "orderId": "o-1", "notify": notify}
    response = await harness.http("submit_order_http", "POST", "orders", body)
    assert response.status_code == 400
    assert problem_of(response)["detail"] == "notify: Input should be 'all' or 'final'"
    assert harness.bus.sent == [] and await harness.store.load("o-1") is None


async def test_a_notify_value_other_than_all_or_final_is_dead_lettered_from_the_queue(
    harness: Harness,
) -> None:
    message = {**ORDER, "orderId": "o-1", "notify": "loud"}
    await harness.message("submit_order_message", message, message_id="loud-1")
    (parked,) = harness.bus.parked
    assert (parked.queue, parked.reason) == (Queue.ORDERS, "invalid-message")
    assert "notify: Input should be 'all' or 'final'" in parked.detail


async def test_final_is_stored_with_the_order_and_the_client_hears_only_the_end(
    harness: Harness,
) -> None:
    body = {**ORDER, "orderId": "o-1", "notify": "final"}
    response = await harness.http("submit_order_http", "POST", "orders", body)
    assert response.status_code == 202
    stored = await harness.store.load("o-1")
    assert stored is not None and stored.order.notify.value == "final"
    assert harness.bus.on(Queue.ORDER_STATUS) == []
