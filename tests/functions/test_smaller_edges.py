"""The smaller edges of issue 41: what a hostile client found that was answered wrong
but did no harm.

- An event's `data` limit counts UTF-8 bytes, not the `\\uXXXX` escapes of ASCII JSON:
  6 KB of accented text was refused as "18024 bytes".
- An integer field takes what JSON Schema calls an integer, `2.0` included, in every
  request model: `toVersion: 1.0` was refused while `limit: 1.0` was taken.
- A continuation token that is junk, deeply nested, or another listing's is a 400: it
  was read as a place to start, answering an empty page that reads as the end.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import azure.functions as func
import pytest

from shared.functions.events import MAX_DATA_BYTES
from tests.functions.conftest import Harness
from tests.unit.test_migrate import V2
from tests.workflows import running

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
    harness: Harness, field: str
) -> None:
    order = {"orderId": "int-1", "customerId": "c-1", "items": [ITEM]}
    assert (await harness.http("submit_order_http", "POST", "orders", order)).status_code == 202
    harness.run_on(running(V2))  # after the submission: the order runs v1
    whole = {"toVersion": 2.0, "workflowVersion": 1.0, "limit": 10.0}[field]
    answer = await bulk(harness, migrate(**{field: whole}))
    assert answer.status_code == 200, answer.get_body()
    assert body(answer)["matched"] == 1
    for wrong in (whole + 0.5, str(int(whole)), True):
        refused = await bulk(harness, migrate(**{field: wrong}))
        assert refused.status_code == 400, (wrong, refused.get_body())
        assert field in body(refused)["detail"]


async def test_a_whole_float_to_version_is_stored_as_the_integer(
    harness: Harness,
) -> None:
    harness.run_on(running(V2))
    started = await bulk(harness, migrate(toVersion=2.0, workflowVersion=1.0, dryRun=False))
    assert started.status_code == 202, started.get_body()
    job = body(started)["bulkId"]
    answer = await harness.http("bulk_job", "GET", f"bulk/{job}", route_params={"bulkId": job})
    version = body(answer)["toVersion"]
    assert version == 2 and isinstance(version, int), "2, not 2.0"
    same = await bulk(harness, migrate(toVersion=1.0, workflowVersion=1))
    assert same.status_code == 400 and body(same)["title"] == "Invalid toVersion"


def b64(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


JUNK_TOKENS = {
    "a word": "junk",
    "after everything": "zzzz",
    "an order id": "tok-3",
    "brackets": "[" * 40,
    "deep JSON": "[" * 100 + "]" * 100,
    "deep JSON in base64": b64("[" * 100 + "]" * 100),
    "an empty object": b64("{}"),
    "an empty array": b64("[]"),
    "a number": b64("1"),
    "a store's table token": b64('{"PartitionKey": "tok-3", "RowKey": "state"}'),
    "an empty cursor": b64('{"v":1,"of":"orders","at":""}'),
    "a boolean version": b64('{"v":true,"of":"orders","at":"tok-3"}'),
    "not base64": "%%%",
    "too long": "A" * 5000,
    "bad padding": "A",
}
LISTINGS = {
    "every order": {},
    "at rest": {"state": "Suspended"},
    "in flight": {"state": "Processing"},
}


async def orders_for_listings(harness: Harness) -> None:
    """Five orders: three Suspended (the rest index), two Processing, as the intake
    claimed them (the watch list)."""
    for i in range(5):
        order = {"orderId": f"tok-{i}", "customerId": "c-1", "items": [ITEM]}
        assert (await harness.http("submit_order_http", "POST", "orders", order)).status_code == 202
    for i in range(3):
        suspended = await harness.http(
            "suspend_order_http", "POST", "x", route_params={"orderId": f"tok-{i}"}
        )
        assert suspended.status_code == 202


async def listed(harness: Harness, **params: str) -> func.HttpResponse:
    return await harness.http("list_orders_http", "GET", "orders", params=params)


@pytest.mark.parametrize("listing", LISTINGS)
async def test_every_listing_pages_to_its_end_by_its_tokens(harness: Harness, listing: str) -> None:
    await orders_for_listings(harness)
    expected = {"every order": 5, "at rest": 3, "in flight": 2}[listing]
    seen: list[str] = []
    token: str | None = None
    for _ in range(10):
        answer = await listed(
            harness, **LISTINGS[listing], pageSize="2", **({"continuation": token} if token else {})
        )
        assert answer.status_code == 200, answer.get_body()
        page = body(answer)
        seen += [o["orderId"] for o in page["items"]]
        token = page["continuation"]
        if token is None:
            break
    assert sorted(seen) == sorted(set(seen)) and len(seen) == expected


@pytest.mark.parametrize("listing", LISTINGS)
@pytest.mark.parametrize("junk", JUNK_TOKENS)
async def test_a_junk_continuation_is_a_400_on_every_listing(
    harness: Harness, listing: str, junk: str
) -> None:
    await orders_for_listings(harness)
    answer = await listed(harness, **LISTINGS[listing], continuation=JUNK_TOKENS[junk])
    assert answer.status_code == 400, answer.get_body()
    problem = body(answer)
    assert problem["title"] == "Invalid continuation"
    assert "continuation" in problem["detail"]


async def test_a_token_of_another_listing_is_a_400(harness: Harness) -> None:
    await orders_for_listings(harness)
    first = body(await listed(harness, state="Suspended", pageSize="1"))
    token = first["continuation"]
    assert token is not None
    for other in ({"state": "Pending"}, {"state": "Error"}, {}):
        answer = await listed(harness, **other, continuation=token)
        assert answer.status_code == 400, (other, answer.get_body())
        assert "another listing" in body(answer)["detail"]
    again = await listed(harness, state="Suspended", pageSize="1", continuation=token)
    assert again.status_code == 200


@pytest.mark.parametrize("junk", JUNK_TOKENS)
async def test_a_junk_continuation_of_an_archive_day_is_a_400(harness: Harness, junk: str) -> None:
    """Here no archive is configured: no token was ever handed out, so none is taken."""
    answer = await harness.http(
        "archive_day",
        "GET",
        "archive/2026-11-28",
        params={"continuation": JUNK_TOKENS[junk]},
        route_params={"day": "2026-11-28"},
    )
    assert answer.status_code == 400, answer.get_body()
    assert body(answer)["title"] == "Invalid continuation"
