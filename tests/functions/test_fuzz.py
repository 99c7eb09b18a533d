"""Fuzzing the HTTP functions: no input produces a 5xx, every 4xx is problem+json."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared import jsonbounds
from shared.adapters.dataclass_json import to_json
from tests.app_functions import registered_functions
from tests.functions.conftest import Harness
from tests.hostile import Raw, corruptions, hostile, wire

ANY_TEXT = st.text(st.characters(exclude_categories=()), max_size=20)
"""Every code point, lone surrogates included (hypothesis leaves them out by default)."""
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | ANY_TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(ANY_TEXT, inner, max_size=4),
    max_leaves=12,
)
"""NaN and the infinities included: json.dumps writes them as Python's parser reads them."""
items = st.lists(
    st.fixed_dictionaries(
        {},
        optional={
            "sku": json_values | st.text(max_size=70),
            "quantity": json_values | st.integers(-5, 2_000_000),
            "unitPrice": json_values | st.floats(allow_nan=True, allow_infinity=True),
            "extra": json_values,
        },
    ),
    max_size=3,
)
orders = st.fixed_dictionaries(
    {},
    optional={
        "orderId": json_values | st.text(max_size=80),
        "customerId": json_values | st.text(max_size=200),
        "items": items | json_values,
        "priority": st.sampled_from(["normal", "high", "urgent", ""]) | json_values,
        "replyTo": st.sampled_from(["client-a", "nope", ""]) | json_values,
    },
)
raw_bodies = st.binary(max_size=300) | orders.map(lambda o: json.dumps(o).encode())
content_types = st.sampled_from(
    ["application/json", "text/plain", "", "application/x-www-form-urlencoded"]
)
SLOW = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))


def check(response: Any) -> None:
    assert response.status_code < 500, response.get_body()
    if response.status_code >= 400:
        assert response.mimetype == "application/problem+json"
        problem = json.loads(response.get_body())
        assert problem["status"] == response.status_code
        assert problem["title"] and problem["detail"]


@SLOW
@given(body=raw_bodies, content_type=content_types)
async def test_post_orders_never_5xx(harness: Harness, body: bytes, content_type: str) -> None:
    response = await harness.http(
        "submit_order_http", "POST", "orders", raw=body, headers={"content-type": content_type}
    )
    check(response)
    if response.status_code == 202:
        answer = json.loads(response.get_body())
        assert (await harness.store.load(answer["orderId"])) is not None


@SLOW
@given(order_id=st.text(st.characters(exclude_categories=()), max_size=100))
async def test_order_routes_never_5xx(harness: Harness, order_id: str) -> None:
    route = {"orderId": order_id}
    check(await harness.http("get_order", "GET", "orders/x", route_params=route))
    check(
        await harness.http("resubmit_order_http", "POST", "orders/x/resubmit", route_params=route)
    )
    for action in ("cancel", "suspend", "resume"):
        check(
            await harness.http(
                f"{action}_order_http", "POST", f"orders/x/{action}", route_params=route
            )
        )


@SLOW
@given(
    params=st.dictionaries(
        st.sampled_from(["state", "pageSize", "continuation"]),
        st.text(st.characters(exclude_categories=()), max_size=30),
    )
)
async def test_list_never_5xx(harness: Harness, params: dict[str, str]) -> None:
    check(await harness.http("list_orders_http", "GET", "orders", params=params))


# -- lone surrogates and non-finite numbers in every field (issue 41) --------------------


def corrupted(data: st.DataObject, document: Any) -> Any:
    return data.draw(corruptions(document), label="corrupted")


def reviewed(order_id: str) -> dict[str, Any]:
    return {
        "orderId": order_id,
        "customerId": "c-1",
        "items": [{"sku": "SKU-1", "quantity": 2, "unitPrice": 9.5}],
        "priority": "normal",
        "replyTo": "client-a",
        "workflow": "reviewed-order",
        "notBefore": "2026-01-01T00:00:00Z",
    }


BULK_FILTER = {
    "state": "Error",
    "step": "charge-payment",
    "errorCode": "timeout",
    "customerId": "c-1",
    "createdFrom": "2026-01-01T00:00:00Z",
    "createdTo": "2030-01-01T00:00:00Z",
    "workflow": "order-fulfilment",
    "workflowVersion": 1,
}
BODIES: dict[str, tuple[str, str, dict[str, str], Any]] = {
    # function: method, path, route parameters, a body it accepts (`{id}`: the order's)
    "submit_order_http": ("POST", "orders", {}, reviewed("{id}-2")),
    "cancel_order_http": ("POST", "orders/{id}/cancel", {"orderId": "{id}"}, {"reason": "why"}),
    "send_event_http": (
        "POST",
        "orders/{id}/events/review",
        {"orderId": "{id}", "eventName": "review"},
        {"eventId": "ev-1", "data": {"approved": True, "by": "ana", "comment": "ok"}},
    ),
    "bulk_orders": (
        "POST",
        "orders/bulk",
        {},
        {"action": "migrate", "dryRun": False, "limit": 5, "toVersion": 1, "filter": BULK_FILTER},
    ),
    "drain_agent_http": (
        "PUT",
        "agents/payment/drain",
        {"agent": "payment"},
        {"drained": True, "reason": "maintenance"},
    ),
    "answer_approval_http": (
        "POST",
        "orders/{id}/approval",
        {"orderId": "{id}"},
        {"eventId": "ap-1", "approved": True, "comment": "ok", "event": "review"},
    ),
}
PARAMETERS: dict[str, tuple[str, str, tuple[str, ...], tuple[str, ...]]] = {
    # function: method, path, its route parameters, its query parameters
    "get_order": ("GET", "orders/x", ("orderId",), ()),
    "ops_order": ("GET", "ops/orders/x", ("orderId",), ()),
    "resubmit_order_http": ("POST", "orders/x/resubmit", ("orderId",), ()),
    "suspend_order_http": ("POST", "orders/x/suspend", ("orderId",), ()),
    "resume_order_http": ("POST", "orders/x/resume", ("orderId",), ()),
    "list_orders_http": ("GET", "orders", (), ("state", "pageSize", "continuation")),
    "bulk_job": ("GET", "bulk/x", ("bulkId",), ()),
    "archive_day": ("GET", "archive/x", ("day",), ("pages", "continuation")),
    "archive_http": ("POST", "archive", (), ()),
    "reconcile_http": ("POST", "reconcile", (), ()),
    "agents_http": ("GET", "agents", (), ()),
    "failures_http": ("GET", "failures", (), ()),
    "workflows_http": ("GET", "workflows", (), ()),
    "ops_data": ("GET", "ops/data", (), ()),
    "ops_page": ("GET", "ops", (), ()),
    "health": ("GET", "health", (), ()),
    "openapi": ("GET", "openapi.json", (), ()),
}
PARAMETER_TEXT = st.sampled_from(["Error", "Processing", "2", "2026-01-01", "o-1"]).flatmap(
    lambda value: hostile(value).map(lambda v: v.token if isinstance(v, Raw) else str(v))
)
"""A parameter is text: a lone surrogate in it, or a non-finite number spelled out."""


def test_every_http_function_is_fuzzed() -> None:
    http = {f.name for f in registered_functions() if f.trigger_type == "httpTrigger"}
    assert http == set(BODIES) | set(PARAMETERS)


def strict(answer: Any) -> None:
    """An answer the rule itself would take: no NaN, no lone surrogate, however escaped."""
    if answer.mimetype in ("application/json", "application/problem+json"):
        jsonbounds.loads(answer.get_body())


async def kept_strictly(harness: Harness) -> None:
    """Nothing unrepresentable was stored: every order whole (steps, results, events,
    history) as the archive writes it, and what the routes that show them answer."""
    for state in (await harness.store.list_by_state(None, 1000, None)).items:
        process = await harness.store.load(state.order_id)
        assert process is not None
        json.dumps(to_json(process), allow_nan=False, ensure_ascii=False).encode()
    strict(await harness.http("agents_http", "GET", "agents"))
    strict(await harness.http("ops_data", "GET", "ops/data"))


@SLOW
@given(data=st.data(), escape=st.booleans())
async def test_a_lone_surrogate_or_a_non_finite_number_in_any_body_field_never_5xx(
    harness: Harness, data: st.DataObject, escape: bool
) -> None:
    """Each route's body with one of its strings or numbers, names included, made
    hostile; the rest as the route accepts it, so nothing else stops it first."""
    order_id = f"o-{data.draw(st.integers(0, 10**9))}"
    await harness.http("submit_order_http", "POST", "orders", reviewed(order_id))
    name = data.draw(st.sampled_from(sorted(BODIES)))
    method, path, route_params, body = json.loads(
        json.dumps(BODIES[name]).replace("{id}", order_id)
    )
    response = await harness.http(
        name, method, path, raw=wire(corrupted(data, body), escape), route_params=route_params
    )
    check(response)
    strict(response)
    await kept_strictly(harness)


@SLOW
@given(data=st.data())
async def test_a_lone_surrogate_or_a_non_finite_number_in_any_parameter_never_5xx(
    harness: Harness, data: st.DataObject
) -> None:
    name = data.draw(st.sampled_from(sorted(PARAMETERS)))
    method, path, route_names, query_names = PARAMETERS[name]
    route = {n: data.draw(PARAMETER_TEXT) for n in route_names}
    query = {n: data.draw(PARAMETER_TEXT) for n in query_names}
    response = await harness.http(name, method, path, route_params=route, params=query)
    check(response)
    strict(response)


def messages(order_id: str) -> dict[str, Any]:
    """A message of each kind its trigger accepts, for the order (running its first step)."""
    return {
        "submit": {**reviewed(f"{order_id}-m"), "replyTo": "client-a"},
        "nudge": {"orderId": order_id, "reason": "why"},
        "reply": {
            "orderId": order_id,
            "step": "reserve-inventory",
            "action": "do",
            "attempt": 1,
            "outcome": "succeeded",
            "result": {"ref": "r-1", "amount": 9.5},
            "agent": "inventory",
        },
        "failed reply": {
            "orderId": order_id,
            "step": "reserve-inventory",
            "action": "do",
            "attempt": 1,
            "outcome": "failed",
            "error": {"code": "declined", "message": "no stock"},
        },
        "request": {
            "orderId": order_id,
            "step": "reserve-inventory",
            "action": "do",
            "attempt": 1,
            "completeBy": "2030-01-01T00:00:00Z",
            "idempotencyKey": f"{order_id}:reserve-inventory",
            "payload": {"customerId": "c-1", "amount": 9.5},
            "undoes": f"{order_id}:reserve-inventory",
        },
    }


def queue_functions() -> dict[str, tuple[str, ...]]:
    """Every queue-triggered function, and the kinds of message it takes."""
    kinds: dict[str, tuple[str, ...]] = {}
    for f in registered_functions():
        if f.trigger_type != "serviceBusTrigger":
            continue
        kinds[f.name] = (
            ("submit",)
            if f.name == "submit_order_message"
            else ("nudge",)
            if "nudge" in f.name
            else ("reply", "failed reply")
            if "reply" in f.name
            else ("request",)
        )
    return kinds


REASONS = {"invalid-message", "unknown-order", "unknown-step", "order-conflict", "over-quota"}


@SLOW
@given(data=st.data(), escape=st.booleans())
async def test_a_lone_surrogate_or_a_non_finite_number_in_any_message_field_is_handled(
    harness: Harness, data: st.DataObject, escape: bool
) -> None:
    """Every queue trigger, each field of its message made hostile in turn: handled, or
    dead-lettered with a reason the broker can carry. Never an exception, which the
    host answers with redelivery after redelivery; nothing unrepresentable stored."""
    order_id = f"o-{data.draw(st.integers(0, 10**9))}"
    await harness.http("submit_order_http", "POST", "orders", reviewed(order_id))
    await harness.message("scheduler_nudge", {"orderId": order_id}, message_id=f"n-{order_id}")
    kinds = queue_functions()
    name = data.draw(st.sampled_from(sorted(kinds)))
    body = messages(order_id)[data.draw(st.sampled_from(kinds[name]))]
    parked = len(harness.bus.parked)
    await harness.message(name, wire(corrupted(data, body), escape), message_id=f"fz-{order_id}")
    for poison in harness.bus.parked[parked:]:
        assert poison.reason in REASONS
        poison.detail.encode()
    await kept_strictly(harness)
