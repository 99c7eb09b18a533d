"""Cancel, suspend and resume over HTTP: codes, bodies, and what the order does next."""

from __future__ import annotations

import azure.functions as func
import pytest

from shared.contract import Queue, agent_queue
from shared.domain.model import ProcessState
from tests.functions.conftest import Harness
from tests.functions.test_functions import ORDER, assert_problem, body
from tests.workflows import without

ROUTE = {"orderId": "fn-1"}


async def act(
    harness: Harness,
    action: str,
    payload: object = None,
    *,
    raw: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> func.HttpResponse:
    return await harness.http(
        f"{action}_order_http",
        "POST",
        f"orders/fn-1/{action}",
        payload,
        raw=raw,
        headers=headers,
        route_params=ROUTE,
    )


async def state(harness: Harness) -> ProcessState:
    process = await harness.store.load("fn-1")
    assert process is not None
    return process.state.process_state


async def deliver_everything(harness: Harness) -> None:
    """Every message to its function until none is left: the inventory agent's, the
    replies and the nudges (a cancelled order goes no further than its first step)."""
    listeners = (
        (agent_queue("inventory"), "inventory_agent"),
        (Queue.AGENT_REPLIES, "scheduler_reply"),
        (Queue.SCHEDULER, "scheduler_nudge"),
    )
    for _ in range(10):
        for queue, function in listeners:
            for message in harness.bus.take(queue):
                await harness.message(function, dict(message.body), message.message_id)


async def test_cancel_answers_202_and_again_202_then_409_once_cancelled(harness: Harness) -> None:
    await harness.http("submit_order_http", "POST", "orders", ORDER)
    first = await act(harness, "cancel", {"reason": "customer asked"})
    assert first.status_code == 202
    answer = body(first)
    # claimed at intake, its first request out: the cancel waits for that step
    assert (answer["orderId"], answer["processState"]) == ("fn-1", "Compensating")
    again = await act(harness, "cancel")  # no body at all
    assert again.status_code == 202
    assert body(again)["processState"] == "Compensating"
    await deliver_everything(harness)
    assert await state(harness) is ProcessState.CANCELLED
    assert_problem(await act(harness, "cancel"), 409)
    assert_problem(await act(harness, "suspend"), 409)
    assert_problem(await act(harness, "resume"), 409)
    history = await harness.store.history("fn-1")
    assert any(h.detail == "by operator: customer asked" for h in history)


async def test_suspend_then_resume(harness: Harness) -> None:
    await harness.http("submit_order_http", "POST", "orders", ORDER)
    assert_problem(await act(harness, "resume"), 409)
    suspended = await act(harness, "suspend", headers={"x-operator": "alice"})
    assert suspended.status_code == 202
    assert body(suspended)["processState"] == "Suspended"
    assert (await act(harness, "suspend")).status_code == 202
    resumed = await act(harness, "resume")
    assert resumed.status_code == 202
    assert body(resumed)["processState"] == "Pending"
    history = await harness.store.history("fn-1")
    assert any(h.event == "suspended" and h.detail.startswith("by alice") for h in history)


@pytest.mark.parametrize("action", ["cancel", "suspend", "resume"])
async def test_unknown_order_is_404(harness: Harness, action: str) -> None:
    assert_problem(await act(harness, action), 404)
    response = await harness.http(
        f"{action}_order_http", "POST", "orders/%/x", route_params={"orderId": "../x"}
    )
    assert_problem(response, 404)


@pytest.mark.parametrize(
    ("raw", "content_type", "status"),
    [
        (b'{"reason": 3}', "application/json", 400),
        (b'{"reason": "ok", "force": true}', "application/json", 400),
        (b"[]", "application/json", 400),
        (b'"reason"', "application/json", 400),
        (b"{", "application/json", 400),
        (b'{"reason": "' + b"x" * 501 + b'"}', "application/json", 400),
        (b'{"reason": "ok"}', "text/plain", 415),
        (b'{"reason": "' + b"x" * 70_000 + b'"}', "application/json", 413),
    ],
)
async def test_cancel_with_a_bad_body_is_refused(
    harness: Harness, raw: bytes, content_type: str, status: int
) -> None:
    await harness.http("submit_order_http", "POST", "orders", ORDER)
    response = await act(harness, "cancel", raw=raw, headers={"content-type": content_type})
    assert_problem(response, status)
    assert await state(harness) is ProcessState.PROCESSING


async def test_cancel_with_a_null_reason_is_a_cancel(harness: Harness) -> None:
    await harness.http("submit_order_http", "POST", "orders", ORDER)
    response = await act(harness, "cancel", {"reason": None})
    assert response.status_code == 202


async def test_an_order_on_a_dropped_version_gets_409_version_gone_not_a_500(
    harness: Harness,
) -> None:
    """Issue #37 G: the cancel and event routes answered 500 on such an order."""
    await harness.http("submit_order_http", "POST", "orders", ORDER)
    harness.run_on(without("order-fulfilment"))
    refused = await act(harness, "cancel")
    assert_problem(refused, 409)
    assert body(refused)["code"] == "version-gone"
    event = await harness.http(
        "send_event_http",
        "POST",
        "orders/fn-1/events/review",
        {"eventId": "e-1", "data": {"approved": True}},
        route_params={**ROUTE, "eventName": "review"},
    )
    assert_problem(event, 409)
    assert body(event)["code"] == "version-gone"
    assert await state(harness) is ProcessState.PROCESSING  # as the intake stored it


@pytest.mark.parametrize("action", ["suspend", "resume", "resubmit", "cancel"])
async def test_every_action_refuses_a_suspended_order_whose_version_is_gone(
    harness: Harness, action: str
) -> None:
    """A suspend of an order already Suspended changes nothing, and answered 202 where the
    version was gone; every action now answers such an order 409 alike."""
    await harness.http("submit_order_http", "POST", "orders", ORDER)
    assert (await act(harness, "suspend")).status_code == 202
    harness.run_on(without("order-fulfilment"))
    refused = await act(harness, action)
    assert_problem(refused, 409)
    assert body(refused)["code"] == "version-gone"
    assert await state(harness) is ProcessState.SUSPENDED
