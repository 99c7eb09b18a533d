"""The smaller edges of issue 41: what a hostile client found that was answered wrong
but did no harm.

- An event's `data` limit counts UTF-8 bytes, not the `\\uXXXX` escapes of ASCII JSON:
  6 KB of accented text was refused as "18024 bytes".
"""

from __future__ import annotations

import json
from typing import Any

import azure.functions as func

from shared.functions.events import MAX_DATA_BYTES
from tests.functions.conftest import Harness

ITEM = {"sku": "SKU-1", "quantity": 1, "unitPrice": 1.0}


def body(response: func.HttpResponse) -> Any:
    return json.loads(response.get_body())


async def reviewed_order(harness: Harness, order_id: str) -> None:
    order = {"orderId": order_id, "customerId": "c-1", "items": [ITEM]}
    submitted = await harness.http(
        "submit_order_http", "POST", "orders", {**order, "workflow": "reviewed-order"}
    )
    assert submitted.status_code == 202, submitted.get_body()


async def event(harness: Harness, order_id: str, data: Any) -> func.HttpResponse:
    return await harness.http(
        "send_event_http",
        "POST",
        f"orders/{order_id}/events/review",
        {"eventId": "ev-1", "data": data},
        route_params={"orderId": order_id, "eventName": "review"},
    )


async def test_event_data_is_measured_in_utf8_bytes_not_ascii_escapes(harness: Harness) -> None:
    await reviewed_order(harness, "ev-utf8")
    comment = "é" * 3000  # 6,000 bytes of UTF-8; 18,000 characters once escaped as \u00e9
    accepted = await event(harness, "ev-utf8", {"approved": True, "comment": comment})
    assert accepted.status_code == 202, accepted.get_body()
    stored = await harness.store.load("ev-utf8")
    assert stored is not None and stored.state.events[0].data == {
        "approved": True,
        "comment": comment,
    }


async def test_event_data_past_the_limit_is_a_413_naming_the_measure(harness: Harness) -> None:
    await reviewed_order(harness, "ev-big")
    data = {"approved": True, "comment": "漢" * 3000}  # 3 bytes each in UTF-8
    size = len(json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode())
    assert size > MAX_DATA_BYTES
    refused = await event(harness, "ev-big", data)
    assert refused.status_code == 413
    detail = body(refused)["detail"]
    assert f"{size} bytes" in detail and str(MAX_DATA_BYTES) in detail and "UTF-8" in detail
    at_limit = {"approved": True, "comment": "x" * (MAX_DATA_BYTES - 30)}
    assert len(json.dumps(at_limit, separators=(",", ":"))) == MAX_DATA_BYTES
    assert (await event(harness, "ev-big", at_limit)).status_code == 202
