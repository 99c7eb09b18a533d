"""The smaller edges of issue 41: what a hostile client found that was answered wrong
but did no harm.

- An event's `data` limit counts UTF-8 bytes, not the `\\uXXXX` escapes of ASCII JSON:
  6 KB of accented text was refused as "18024 bytes".
- An integer field takes what JSON Schema calls an integer, `2.0` included, in every
  request model: `toVersion: 1.0` was refused while `limit: 1.0` was taken.
"""

from __future__ import annotations

import json
from typing import Any

import azure.functions as func
import pytest

from shared.functions.events import MAX_DATA_BYTES
from tests.functions.conftest import Harness
from tests.unit.test_migrate import V2
from tests.workflows import run_on

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


def migrate(**changes: Any) -> dict[str, Any]:
    """A migrate of order-fulfilment v1's orders to v2, dry run, with `changes` made."""
    request: dict[str, Any] = {
        "action": "migrate",
        "filter": {"workflow": "order-fulfilment", "workflowVersion": 1},
        "toVersion": 2,
        "dryRun": True,
        "limit": 10,
    }
    for path, value in changes.items():
        if path == "workflowVersion":
            request["filter"] = {**request["filter"], path: value}
        else:
            request[path] = value
    return request


async def bulk(harness: Harness, request: dict[str, Any]) -> func.HttpResponse:
    return await harness.http("bulk_orders", "POST", "orders/bulk", request)


@pytest.mark.parametrize("field", ["toVersion", "workflowVersion", "limit"])
async def test_an_integral_float_is_an_integer_in_every_bulk_field(
    harness: Harness, monkeypatch: pytest.MonkeyPatch, field: str
) -> None:
    order = {"orderId": "int-1", "customerId": "c-1", "items": [ITEM]}
    assert (await harness.http("submit_order_http", "POST", "orders", order)).status_code == 202
    run_on(monkeypatch, V2)  # after the submission: the order runs v1
    whole = {"toVersion": 2.0, "workflowVersion": 1.0, "limit": 10.0}[field]
    answer = await bulk(harness, migrate(**{field: whole}))
    assert answer.status_code == 200, answer.get_body()
    assert body(answer)["matched"] == 1
    for wrong in (whole + 0.5, str(int(whole)), True):
        refused = await bulk(harness, migrate(**{field: wrong}))
        assert refused.status_code == 400, (wrong, refused.get_body())
        assert field in body(refused)["detail"]


async def test_a_whole_float_to_version_is_stored_as_the_integer(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_on(monkeypatch, V2)
    started = await bulk(harness, migrate(toVersion=2.0, workflowVersion=1.0, dryRun=False))
    assert started.status_code == 202, started.get_body()
    job = body(started)["bulkId"]
    answer = await harness.http("bulk_job", "GET", f"bulk/{job}", route_params={"bulkId": job})
    version = body(answer)["toVersion"]
    assert version == 2 and isinstance(version, int), "2, not 2.0"
    same = await bulk(harness, migrate(toVersion=1.0, workflowVersion=1))
    assert same.status_code == 400 and body(same)["title"] == "Invalid toVersion"
