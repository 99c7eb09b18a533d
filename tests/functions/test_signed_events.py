"""Signed events bound to what they authorise, and the operators' approval route, over
the HTTP functions with EventSigningSecret set (docs/events.md).

A signed approval captured on its way to one order must not approve another (issue 41,
finding 5): every way of presenting it elsewhere, later or changed is a 401
problem+json that leaves the order as it was; unchanged within the window it is a
repeat of its eventId. Operators, who cannot sign from a page, answer through
`POST /api/orders/{orderId}/approval` (finding 6).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import AsyncIterator
from typing import Any

import azure.functions as func
import pytest

from shared.contract import Queue, Setting, agent_queue
from shared.domain.event_signature import WINDOW_SECONDS, header
from shared.domain.model import ProcessState
from tests.functions.conftest import Harness, harness_with
from tests.functions.test_functions import assert_problem, body

SECRET = "functions-test-secret"
APPROVE = {"approved": True, "by": "ana"}


@pytest.fixture
async def signed() -> AsyncIterator[Harness]:
    async with harness_with({Setting.EVENT_SIGNING_SECRET: SECRET}) as started:
        yield started


async def submit(harness: Harness, order_id: str) -> None:
    order = {
        "orderId": order_id,
        "customerId": "c-1",
        "items": [{"sku": "A", "quantity": 1, "unitPrice": 5}],
        "workflow": "reviewed-order",
    }
    response = await harness.http("submit_order_http", "POST", "orders", order)
    assert response.status_code == 202, body(response)


async def pump(harness: Harness) -> None:
    """Deliver what the bus holds until it is quiet: the order goes as far as it can."""
    lanes = (
        (Queue.SCHEDULER, "scheduler_nudge"),
        (agent_queue("inventory"), "inventory_agent"),
        (agent_queue("payment"), "payment_agent"),
        (agent_queue("shipping"), "shipping_agent"),
        (Queue.AGENT_REPLIES, "scheduler_reply"),
    )
    for _ in range(10):
        for queue, function in lanes:
            for message in harness.bus.take(queue):
                await harness.message(function, dict(message.body), message.message_id)


async def post_event(
    harness: Harness, order_id: str, name: str, raw: bytes, signature: str | None
) -> func.HttpResponse:
    return await harness.http(
        "send_event_http",
        "POST",
        f"orders/{order_id}/events/{name}",
        raw=raw,
        headers={"x-signature": signature} if signature is not None else {},
        route_params={"orderId": order_id, "eventName": name},
    )


def approval(event_id: str = "ev-1", data: dict[str, Any] = APPROVE) -> bytes:
    return json.dumps({"eventId": event_id, "data": data}).encode()


def now(harness: Harness) -> int:
    return int(harness.clock.now().timestamp())


async def events_of(harness: Harness, order_id: str) -> list[tuple[str, str]]:
    process = await harness.store.load(order_id)
    assert process is not None
    return [(e.event_id, e.name) for e in process.state.events]


async def test_a_signed_approval_is_taken_and_replayed_to_another_order_is_401(
    signed: Harness,
) -> None:
    await submit(signed, "sig-a")
    await submit(signed, "sig-b")
    raw = approval()
    captured = header(SECRET, now(signed), "sig-a", "review", raw)
    assert (await post_event(signed, "sig-a", "review", raw, captured)).status_code == 202

    replayed = assert_problem(await post_event(signed, "sig-b", "review", raw, captured), 401)
    assert "does not match" in replayed["detail"]
    assert await events_of(signed, "sig-b") == []
    assert await events_of(signed, "sig-a") == [("ev-1", "review")]


async def test_a_body_only_signature_as_clients_sent_it_before_is_refused(
    signed: Harness,
) -> None:
    """The captured form of finding 5: `sha256=` HMAC of the body, which approved and
    charged every order it was replayed to."""
    await submit(signed, "sig-old")
    raw = approval()
    body_only = "sha256=" + hmac.new(SECRET.encode(), raw, hashlib.sha256).hexdigest()
    refused = assert_problem(await post_event(signed, "sig-old", "review", raw, body_only), 401)
    assert "no longer accepted" in refused["detail"]
    assert await events_of(signed, "sig-old") == []


async def test_a_signature_presented_as_another_event_is_401(signed: Harness) -> None:
    await submit(signed, "sig-name")
    raw = approval()
    for_review = header(SECRET, now(signed), "sig-name", "review", raw)
    assert_problem(await post_event(signed, "sig-name", "picked", raw, for_review), 401)
    assert await events_of(signed, "sig-name") == []
    assert (await post_event(signed, "sig-name", "review", raw, for_review)).status_code == 202


async def test_a_tampered_body_is_401(signed: Harness) -> None:
    await submit(signed, "sig-body")
    signature = header(SECRET, now(signed), "sig-body", "review", approval())
    rejected = approval(data={"approved": False, "by": "mallory"})
    assert_problem(await post_event(signed, "sig-body", "review", rejected, signature), 401)
    another_id = approval("ev-2")
    assert_problem(await post_event(signed, "sig-body", "review", another_id, signature), 401)
    assert await events_of(signed, "sig-body") == []
    assert (
        await post_event(signed, "sig-body", "review", approval(), signature)
    ).status_code == 202


async def test_an_old_or_future_timestamp_is_401_and_within_the_window_is_taken(
    signed: Harness,
) -> None:
    await submit(signed, "sig-time")
    raw = approval()
    t = now(signed)
    signed.clock.advance(WINDOW_SECONDS + 1)
    old = header(SECRET, t, "sig-time", "review", raw)
    stale = assert_problem(await post_event(signed, "sig-time", "review", raw, old), 401)
    assert f"signed {WINDOW_SECONDS + 1} s ago" in stale["detail"]
    ahead = header(SECRET, now(signed) + WINDOW_SECONDS + 1, "sig-time", "review", raw)
    assert_problem(await post_event(signed, "sig-time", "review", raw, ahead), 401)
    assert await events_of(signed, "sig-time") == []

    edge = header(SECRET, now(signed) - WINDOW_SECONDS, "sig-time", "review", raw)
    assert (await post_event(signed, "sig-time", "review", raw, edge)).status_code == 202


async def test_the_same_signed_request_again_within_the_window_is_a_harmless_repeat(
    signed: Harness,
) -> None:
    await submit(signed, "sig-again")
    await pump(signed)
    raw = approval()
    captured = header(SECRET, now(signed), "sig-again", "review", raw)
    first = await post_event(signed, "sig-again", "review", raw, captured)
    await pump(signed)
    signed.clock.advance(60)
    again = await post_event(signed, "sig-again", "review", raw, captured)
    assert first.status_code == again.status_code == 202
    await pump(signed)
    process = await signed.store.load("sig-again")
    assert process is not None and process.state.process_state is ProcessState.PROCESSED
    assert await events_of(signed, "sig-again") == [("ev-1", "review")]
    charges = [c for c in signed.remotes["payment"].calls if c.operation == "charge-payment"]
    assert len(charges) == 1


async def test_no_signature_or_an_unreadable_one_is_401_saying_the_form(signed: Harness) -> None:
    await submit(signed, "sig-none")
    raw = approval()
    missing = assert_problem(await post_event(signed, "sig-none", "review", raw, None), 401)
    assert "t=<unix seconds>,v1=" in missing["detail"]
    assert_problem(await post_event(signed, "sig-none", "review", raw, "t=now,v1=x"), 401)


async def answer(
    harness: Harness,
    order_id: str,
    payload: Any,
    operator: str | None = "ana",
) -> func.HttpResponse:
    return await harness.http(
        "answer_approval_http",
        "POST",
        f"orders/{order_id}/approval",
        payload,
        headers={"x-operator": operator} if operator else {},
        route_params={"orderId": order_id},
    )


async def test_an_operator_approves_without_the_secret_recorded_as_the_operator(
    signed: Harness,
) -> None:
    await submit(signed, "op-ok")
    early = body(await answer(signed, "op-ok", {"eventId": "x", "approved": True}))
    assert early["status"] == 409 and "not waiting for an approval" in early["detail"]
    await pump(signed)

    first = await answer(signed, "op-ok", {"eventId": "ops-1", "approved": True, "comment": "ok"})
    assert first.status_code == 202
    assert body(first) == {
        "orderId": "op-ok",
        "event": "review",
        "eventId": "ops-1",
        "approved": True,
        "by": "ana",
    }
    # A second click, or another operator's Reject with the same id: the first answer.
    again = await answer(signed, "op-ok", {"eventId": "ops-1", "approved": False}, "bo")
    assert again.status_code == 202 and body(again)["by"] == "ana"
    await pump(signed)
    process = await signed.store.load("op-ok")
    assert process is not None and process.state.process_state is ProcessState.PROCESSED
    (event,) = process.state.events
    assert (event.name, event.consumed_by) == ("review", "manual-review")
    assert event.data == {"approved": True, "by": "ana", "comment": "ok"}


async def test_an_operator_rejects_a_named_approval_and_it_compensates(signed: Harness) -> None:
    await submit(signed, "op-no")
    early = await answer(
        signed, "op-no", {"eventId": "ops-2", "approved": False, "event": "review"}, None
    )
    assert early.status_code == 202 and body(early)["by"] == "operator"
    await pump(signed)
    process = await signed.store.load("op-no")
    assert process is not None and process.state.process_state is ProcessState.COMPENSATED
    assert process.state.last_error == "manual-review: rejected: rejected by operator: no reason"


@pytest.mark.parametrize(
    ("payload", "status", "words"),
    [
        ({"eventId": "e", "approved": True, "event": "picked"}, 400, "has no approval 'picked'"),
        ({"eventId": "e", "approved": "yes"}, 400, "approved is required"),
        ({"approved": True}, 400, "eventId is required"),
        ({"eventId": "e", "approved": True, "by": "someone"}, 400, "the body is"),
        ({"eventId": "e", "approved": True, "comment": "x" * 501}, 400, "at most 500"),
        ({"eventId": "e", "approved": True, "comment": 7}, 400, "comment is a string"),
        ({"eventId": "e", "approved": True, "event": "Review"}, 400, "lower-case"),
        ([], 400, "the body is"),
    ],
)
async def test_a_bad_approval_is_a_precise_problem(
    signed: Harness, payload: Any, status: int, words: str
) -> None:
    await submit(signed, "op-bad")
    problem = assert_problem(await answer(signed, "op-bad", payload), status)
    assert words in problem["detail"]
    assert await events_of(signed, "op-bad") == []


async def test_an_approval_for_an_unknown_or_finished_order(signed: Harness) -> None:
    assert_problem(await answer(signed, "nobody", {"eventId": "e", "approved": True}), 404)
    await submit(signed, "op-done")
    await pump(signed)
    assert (await answer(signed, "op-done", {"eventId": "e", "approved": True})).status_code == 202
    await pump(signed)
    late = {"eventId": "late", "approved": True, "event": "review"}
    assert_problem(await answer(signed, "op-done", late), 409)
