"""Fuzzing the HTTP functions: no input produces a 5xx, every 4xx is problem+json."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.functions.conftest import Harness

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)
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
@given(order_id=st.text(max_size=100))
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
        st.sampled_from(["state", "pageSize", "continuation"]), st.text(max_size=30)
    )
)
async def test_list_never_5xx(harness: Harness, params: dict[str, str]) -> None:
    check(await harness.http("list_orders_http", "GET", "orders", params=params))
