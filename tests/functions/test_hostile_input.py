"""Hostile input, as a client that means harm would send it (issue 27): strings with NUL,
control characters, lone surrogates and 10,000 characters in every name an order
carries, path tricks in order ids on every order route, and a huge body. Each gets a
precise 4xx in problem+json, and nothing is logged at ERROR."""

from __future__ import annotations

import json
import logging
import math
from typing import Any

import pytest

from tests.functions.conftest import Harness

ITEM = {"sku": "SKU-1", "quantity": 1, "unitPrice": 1.0}
ORDER: dict[str, Any] = {"customerId": "c-1", "items": [ITEM]}

NASTY = {
    "NUL": "a\x00b",
    "ESC and a colour": "\x1b[31mred",
    "CR LF forged line": "x\r\n04:00:00 ERROR forged",
    "DEL": "a\x7fb",
    "C1 control": "a\x85b",
    "lone surrogate": "\ud800",
    "10,000 characters": "x" * 10_000,
    "blank": "   ",
}

FIELDS = {
    "customerId": lambda text: {**ORDER, "customerId": text},
    "orderId": lambda text: {**ORDER, "orderId": text},
    "sku": lambda text: {**ORDER, "items": [{**ITEM, "sku": text}]},
}

ORDER_IDS = ["../x", "a/b", "..", "%2e%2e", "x\x00y", "\ud800", "x" * 10_000, "a%00", "bulk"]
ROUTES = {
    "get_order": ("GET", "orders/{id}"),
    "ops_order": ("GET", "ops/orders/{id}"),
    "cancel_order_http": ("POST", "orders/{id}/cancel"),
    "suspend_order_http": ("POST", "orders/{id}/suspend"),
    "resume_order_http": ("POST", "orders/{id}/resume"),
    "resubmit_order_http": ("POST", "orders/{id}/resubmit"),
}


def no_error_logged(caplog: pytest.LogCaptureFixture) -> None:
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == []


def problem(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.get_body()[:300]
    assert response.mimetype == "application/problem+json"
    document: dict[str, Any] = json.loads(response.get_body())
    assert document["status"] == status
    return document


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("nasty", NASTY)
async def test_a_hostile_string_in_an_order_is_a_400(
    harness: Harness, caplog: pytest.LogCaptureFixture, field: str, nasty: str
) -> None:
    raw = json.dumps(FIELDS[field](NASTY[nasty])).encode()
    response = await harness.http("submit_order_http", "POST", "orders", raw=raw)
    document = problem(response, 400)
    assert field in document["detail"]
    stored = await harness.store.list_by_state(None, 10, None)
    assert stored.items == (), "nothing is stored"
    no_error_logged(caplog)


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("order_id", ORDER_IDS, ids=lambda text: repr(text[:12]))
async def test_a_path_trick_in_an_order_id_is_a_404(
    harness: Harness, caplog: pytest.LogCaptureFixture, route: str, order_id: str
) -> None:
    method, path = ROUTES[route]
    response = await harness.http(
        route, method, path.format(id=order_id), route_params={"orderId": order_id}
    )
    problem(response, 404)
    no_error_logged(caplog)


async def test_a_huge_body_is_a_413(harness: Harness, caplog: pytest.LogCaptureFixture) -> None:
    raw = json.dumps({**ORDER, "items": [ITEM] * 20_000}).encode()
    response = await harness.http("submit_order_http", "POST", "orders", raw=raw)
    problem(response, 413)
    no_error_logged(caplog)


@pytest.mark.parametrize(
    ("not_before", "status"),
    [("0097-08-21T00:49:29Z", 400), ("1600-12-31T23:59:59Z", 400), ("1601-01-01T00:00:00Z", 202)],
)
async def test_a_not_before_table_storage_cannot_keep_is_a_400(
    harness: Harness, caplog: pytest.LogCaptureFixture, not_before: str, status: int
) -> None:
    """Found by schemathesis: an order stored with a year before 1601 could never be
    loaded again (the Supervisor's check of it failed on every sweep)."""
    raw = json.dumps({**ORDER, "notBefore": not_before}).encode()
    response = await harness.http("submit_order_http", "POST", "orders", raw=raw)
    assert response.status_code == status, response.get_body()[:300]
    if status == 400:
        assert "1601" in problem(response, 400)["detail"]
    no_error_logged(caplog)


BULK_FILTERS: dict[str, dict[str, Any]] = {
    "createdTo at the calendar's start, +14:00": {"createdTo": "0001-01-01T00:00:00+14:00"},
    "createdTo at its end, -23:59": {"createdTo": "9999-12-31T23:59:59-23:59"},
    "createdFrom month 13": {"createdFrom": "2026-13-01T00:00:00Z"},
    "createdFrom without an offset": {"createdFrom": "2026-01-31T00:00:00"},
    "customerId with NUL": {"customerId": "a\x00b"},
    "step with ESC": {"step": "\x1b[2Jcharge-payment"},
    "customerId of 10,000 characters": {"customerId": "x" * 10_000},
    "state unknown": {"state": "Nope"},
    "customerId with a lone surrogate": {"customerId": "c-\ud800"},
    "step with a lone surrogate": {"step": "\udfffcharge-payment"},
    "workflowVersion NaN": {"workflow": "order-fulfilment", "workflowVersion": math.nan},
    "workflowVersion Infinity": {"workflow": "order-fulfilment", "workflowVersion": math.inf},
}
"""A lone surrogate in filter.customerId was a 500 on Table Storage, whose filter
quoting cannot encode it (issue 41, finding 2)."""
LIMITS = {
    "zero": "0",
    "negative": "-1",
    "1e400": "1e400",
    "a string": '"abc"',
    "303.5": "303.5",
    "NaN": "NaN",
    "Infinity": "Infinity",
    "-Infinity": "-Infinity",
}


@pytest.mark.parametrize("case", BULK_FILTERS)
async def test_a_hostile_bulk_filter_is_a_400(
    harness: Harness, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    body = {"action": "cancel", "dryRun": True, "filter": {"state": "Error", **BULK_FILTERS[case]}}
    response = await harness.http(
        "bulk_orders", "POST", "orders/bulk", raw=json.dumps(body).encode()
    )
    assert "filter." in problem(response, 400)["detail"]
    no_error_logged(caplog)


@pytest.mark.parametrize("case", LIMITS)
async def test_a_hostile_bulk_limit_is_a_400(
    harness: Harness, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    raw = '{"action": "cancel", "dryRun": true, "filter": {"state": "Error"}, "limit": %s}'
    response = await harness.http(
        "bulk_orders", "POST", "orders/bulk", raw=(raw % LIMITS[case]).encode()
    )
    assert "limit" in problem(response, 400)["detail"]
    no_error_logged(caplog)


NOT_TEXT = {
    "an object": {"name": "ana"},
    "a list": ["ana"],
    "a huge number": 1e308,
    "true": True,
    "NaN": math.nan,
    "a lone surrogate": "\ud800x",
}


@pytest.mark.parametrize("field", ["by", "comment"])
@pytest.mark.parametrize("value", NOT_TEXT)
async def test_an_approval_whose_by_or_comment_is_not_text_is_a_400(
    harness: Harness, caplog: pytest.LogCaptureFixture, field: str, value: str
) -> None:
    """Issue 41, findings 3 and 4: `"by": NaN` was answered 202, charged the order and
    made its GET invalid JSON; an object or a huge number was kept and echoed back."""
    order = {**ORDER, "orderId": "o-review", "workflow": "reviewed-order"}
    assert (await harness.http("submit_order_http", "POST", "orders", order)).status_code == 202
    data = {"approved": True, field: NOT_TEXT[value]}
    response = await harness.http(
        "send_event_http",
        "POST",
        "orders/o-review/events/review",
        raw=json.dumps({"eventId": "ev-1", "data": data}).encode(),
        route_params={"orderId": "o-review", "eventName": "review"},
    )
    problem(response, 400)
    stored = await harness.store.load("o-review")
    assert stored is not None and stored.state.events == ()
    no_error_logged(caplog)


@pytest.mark.parametrize(
    ("route", "body"),
    [
        ("cancel_order_http", '{"reason": "\\ud800"}'),
        ("cancel_order_http", '{"reason": NaN}'),
        ("drain_agent_http", '{"drained": true, "reason": "\\udfff"}'),
        ("drain_agent_http", '{"drained": Infinity}'),
    ],
)
async def test_a_lone_surrogate_or_a_non_finite_number_in_an_operators_body_is_a_400(
    harness: Harness, caplog: pytest.LogCaptureFixture, route: str, body: str
) -> None:
    """Issue 41, finding 1: a cancel reason of `"\\ud800"` was answered 202 and stored,
    and the archive then failed on that order on every run."""
    assert (await harness.http("submit_order_http", "POST", "orders", ORDER_O1)).status_code == 202
    method, path, params = {
        "cancel_order_http": ("POST", "orders/o-1/cancel", {"orderId": "o-1"}),
        "drain_agent_http": ("PUT", "agents/payment/drain", {"agent": "payment"}),
    }[route]
    response = await harness.http(route, method, path, raw=body.encode(), route_params=params)
    problem(response, 400)
    stored = await harness.store.load("o-1")
    assert stored is not None and stored.state.process_state.value == "Processing"  # unmoved
    agents = json.loads((await harness.http("agents_http", "GET", "agents")).get_body())
    assert not any(a["drained"] for a in agents["agents"])
    no_error_logged(caplog)


ORDER_O1 = {**ORDER, "orderId": "o-1"}
