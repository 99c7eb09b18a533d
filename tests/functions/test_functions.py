"""Each function called with real azure.functions request, message and timer objects."""

from __future__ import annotations

import json
from typing import Any

import pytest
from azure.functions.timer import TimerRequest

from shared.contract import PoisonProperty, Queue, agent_queue, high_priority
from shared.domain.model import ProcessState
from shared.ports import BusUnavailable, PermanentRemoteError, TransientRemoteError
from tests.functions.conftest import Harness, context_for
from tests.workflows import AGENT_QUEUES

ORDER = {
    "orderId": "fn-1",
    "customerId": "c-1",
    "items": [{"sku": "A", "quantity": 2, "unitPrice": 3.5}],
}


def body(response: Any) -> Any:
    return json.loads(response.get_body())


def assert_problem(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status
    assert response.mimetype == "application/problem+json"
    problem: dict[str, Any] = body(response)
    assert problem["status"] == status and problem["title"] and problem["detail"]
    return problem


async def test_post_order_answers_202_with_location_and_stores_it(harness: Harness) -> None:
    response = await harness.http("submit_order_http", "POST", "orders", ORDER)
    assert response.status_code == 202
    answer = body(response)
    assert answer == {
        "orderId": "fn-1",
        "processState": "Processing",
        "statusUrl": "http://localhost:7071/api/orders/fn-1",
    }
    assert response.headers["Location"] == answer["statusUrl"]
    # claimed at intake: its first request went out, no nudge
    assert [m.body["orderId"] for m in harness.bus.on(agent_queue("inventory"))] == ["fn-1"]
    assert harness.bus.on(Queue.SCHEDULER) == []


async def test_post_same_order_twice_same_answer_and_different_body_409(harness: Harness) -> None:
    first = await harness.http("submit_order_http", "POST", "orders", ORDER)
    again = await harness.http("submit_order_http", "POST", "orders", ORDER)
    assert (again.status_code, body(again)) == (first.status_code, body(first))
    assert len(harness.bus.on(agent_queue("inventory"))) == 1
    changed = {**ORDER, "items": [{"sku": "B", "quantity": 1, "unitPrice": 1}]}
    assert_problem(await harness.http("submit_order_http", "POST", "orders", changed), 409)


async def test_post_without_order_id_gets_a_generated_one(harness: Harness) -> None:
    anonymous = {k: v for k, v in ORDER.items() if k != "orderId"}
    response = await harness.http("submit_order_http", "POST", "orders", anonymous)
    assert response.status_code == 202
    assert len(body(response)["orderId"]) == 32


async def test_post_rejects_every_contract_violation_with_problem_json(harness: Harness) -> None:
    bad_bodies = [
        {},
        {**ORDER, "customerId": ""},
        {**ORDER, "items": []},
        {**ORDER, "items": [{"sku": "A", "quantity": 0, "unitPrice": 1}]},
        {**ORDER, "items": [{"sku": "A", "quantity": 1.5, "unitPrice": 1}]},
        {**ORDER, "items": [{"sku": "A", "quantity": True, "unitPrice": 1}]},
        {**ORDER, "items": [{"sku": "A", "quantity": 1, "unitPrice": -1}]},
        {**ORDER, "items": [{"sku": "A", "quantity": 1, "unitPrice": "1"}]},
        {**ORDER, "priority": "urgent"},
        {**ORDER, "orderId": "has space"},
        {**ORDER, "surprise": 1},
        [ORDER],
        {**ORDER, "replyTo": "somebody-elses-queue"},
    ]
    for bad in bad_bodies:
        assert_problem(await harness.http("submit_order_http", "POST", "orders", bad), 400)
    assert_problem(await harness.http("submit_order_http", "POST", "orders", raw=b"{nope"), 400)
    assert_problem(
        await harness.http(
            "submit_order_http", "POST", "orders", ORDER, headers={"content-type": "text/plain"}
        ),
        415,
    )
    huge = {**ORDER, "customerId": "x" * 100_000}
    assert_problem(await harness.http("submit_order_http", "POST", "orders", huge), 413)
    assert harness.bus.sent == []


async def test_allow_listed_reply_to_is_accepted(harness: Harness) -> None:
    response = await harness.http(
        "submit_order_http", "POST", "orders", {**ORDER, "replyTo": "client-a"}
    )
    assert response.status_code == 202
    assert [m.body["status"] for m in harness.bus.on("client-a")] == ["Received", "Processing"]


async def test_get_order_shows_state_steps_and_history(harness: Harness) -> None:
    await harness.http("submit_order_http", "POST", "orders", ORDER)
    response = await harness.http(
        "get_order", "GET", "orders/fn-1", route_params={"orderId": "fn-1"}
    )
    assert response.status_code == 200
    view = body(response)
    assert view["orderId"] == "fn-1" and view["processState"] == "Processing"
    assert view["lockedBy"] and view["completeBy"] and view["failureCount"] == 0
    assert [s["name"] for s in view["steps"]] == [
        "reserve-inventory",
        "charge-payment",
        "create-shipment",
    ]
    assert {"status", "attempts", "completeBy"} <= set(view["steps"][0])
    assert [h["event"] for h in view["history"]] == ["submitted", "claimed", "step-dispatched"]
    missing = await harness.http("get_order", "GET", "orders/x", route_params={"orderId": "nope"})
    assert_problem(missing, 404)


async def test_list_orders_by_state_and_bad_state(harness: Harness) -> None:
    await harness.http("submit_order_http", "POST", "orders", ORDER)
    response = await harness.http(
        "list_orders_http", "GET", "orders", params={"state": "Processing"}
    )
    assert [o["orderId"] for o in body(response)["items"]] == ["fn-1"]
    empty = await harness.http("list_orders_http", "GET", "orders", params={"state": "Error"})
    assert body(empty)["items"] == []
    assert_problem(
        await harness.http("list_orders_http", "GET", "orders", params={"state": "Bogus"}), 400
    )
    for size in ("0", "²", "١٢", "10000"):  # a superscript and Arabic-Indic digits pass isdigit
        assert_problem(
            await harness.http("list_orders_http", "GET", "orders", params={"pageSize": size}),
            400,
        )


async def test_resubmit_only_from_error(harness: Harness) -> None:
    await harness.http("submit_order_http", "POST", "orders", ORDER)
    route = {"orderId": "fn-1"}
    assert_problem(
        await harness.http(
            "resubmit_order_http", "POST", "orders/fn-1/resubmit", route_params=route
        ),
        409,
    )
    assert_problem(
        await harness.http(
            "resubmit_order_http", "POST", "orders/zz/resubmit", route_params={"orderId": "zz"}
        ),
        404,
    )


async def test_health_reports_its_dependencies(harness: Harness) -> None:
    response = await harness.http("health", "GET", "health")
    assert response.status_code == 200
    assert body(response) == {"status": "ok", "checks": {"stateStore": "ok", "serviceBus": "ok"}}


async def test_health_answers_from_a_short_cache_then_sees_a_failure(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert (await harness.http("health", "GET", "health")).status_code == 200

    async def down() -> None:
        raise BusUnavailable("gone")

    monkeypatch.setattr(harness.bus, "ping", down)
    assert (await harness.http("health", "GET", "health")).status_code == 200  # cached
    harness.clock.advance(6)
    degraded = await harness.http("health", "GET", "health")
    assert degraded.status_code == 503
    assert body(degraded)["checks"]["serviceBus"] == "unavailable: BusUnavailable"


async def test_whole_order_through_every_queue_function(harness: Harness) -> None:
    await harness.message("submit_order_message", ORDER, message_id="sub-1")
    for _ in range(10):
        for queue, function in (
            (Queue.SCHEDULER, "scheduler_nudge"),
            (agent_queue("inventory"), "inventory_agent"),
            (agent_queue("payment"), "payment_agent"),
            (agent_queue("shipping"), "shipping_agent"),
            (Queue.AGENT_REPLIES, "scheduler_reply"),
        ):
            for message in harness.bus.take(queue):
                await harness.message(function, dict(message.body), message.message_id)
    state = await harness.store.load("fn-1")
    assert state is not None and state.state.process_state is ProcessState.PROCESSED
    keys = [c.idempotency_key for r in harness.remotes.values() for c in r.calls]
    assert sorted(keys) == ["fn-1:charge-payment", "fn-1:create-shipment", "fn-1:reserve-inventory"]


async def test_a_high_priority_order_travels_only_the_high_lanes(harness: Harness) -> None:
    await harness.message("submit_order_message", {**ORDER, "priority": "high"}, "sub-1")
    lanes = [  # no nudge: the intake claims the order
        (high_priority(agent_queue("inventory")), "inventory_agent_high"),
        (high_priority(agent_queue("payment")), "payment_agent_high"),
        (high_priority(agent_queue("shipping")), "shipping_agent_high"),
        (Queue.AGENT_REPLIES_HIGH, "scheduler_reply_high"),
    ]
    used: list[str] = []
    for _ in range(10):
        for queue, function in lanes:
            for message in harness.bus.take(queue):
                used.append(queue)
                await harness.message(function, dict(message.body), message.message_id)
    state = await harness.store.load("fn-1")
    assert state is not None and state.state.process_state is ProcessState.PROCESSED
    assert set(used) == {queue for queue, _ in lanes}
    normal = {Queue.SCHEDULER, Queue.AGENT_REPLIES, *AGENT_QUEUES}
    assert not [m for m in harness.bus.sent if m.queue in normal]


async def test_agent_retries_transient_faults_and_reports_permanent_ones(harness: Harness) -> None:
    await harness.http("submit_order_http", "POST", "orders", ORDER)
    (request,) = harness.bus.take(agent_queue("inventory"))
    inventory = harness.remotes["inventory"]
    inventory.answers = [
        TransientRemoteError("http-503", "busy"),
        TransientRemoteError("unreachable", "reset"),
        PermanentRemoteError("out-of-stock", "sku A"),
    ]
    await harness.message("inventory_agent", dict(request.body), request.message_id)
    assert [c.idempotency_key for c in inventory.calls] == ["fn-1:reserve-inventory"] * 3
    (reply,) = harness.bus.take(Queue.AGENT_REPLIES)
    assert reply.body["outcome"] == "failed"
    assert reply.body["error"] == {"code": "out-of-stock", "message": "sku A"}
    assert reply.body["attempt"] == 1


async def test_agent_past_deadline_sends_nothing(harness: Harness) -> None:
    await harness.http("submit_order_http", "POST", "orders", ORDER)
    (request,) = harness.bus.take(agent_queue("inventory"))
    harness.clock.advance(31)
    await harness.message("inventory_agent", dict(request.body), request.message_id)
    assert harness.remotes["inventory"].calls == []
    assert harness.bus.on(Queue.AGENT_REPLIES) == []


async def test_agent_gives_up_silently_when_retries_reach_the_deadline(harness: Harness) -> None:
    await harness.http("submit_order_http", "POST", "orders", ORDER)
    (request,) = harness.bus.take(agent_queue("inventory"))
    inventory = harness.remotes["inventory"]
    inventory.answers = [TransientRemoteError("http-503", "busy")] * 1000
    await harness.message("inventory_agent", dict(request.body), request.message_id)
    assert 3 <= len(inventory.calls) < 1000
    assert harness.bus.on(Queue.AGENT_REPLIES) == []


async def test_poison_messages_are_dead_lettered_with_a_reason_on_first_delivery(
    harness: Harness,
) -> None:
    await harness.message("scheduler_nudge", b"not json", message_id="bad-1")
    await harness.message("scheduler_reply", {"orderId": "x"}, message_id="bad-2")
    await harness.message(
        "payment_agent",
        {
            "orderId": "x",
            "step": "reserve-inventory",
            "action": "do",
            "attempt": 1,
            "completeBy": "2030-01-01T00:00:00Z",
            "idempotencyKey": "k",
            "payload": {},
        },
        message_id="bad-3",
    )
    await harness.message("submit_order_message", {**ORDER, "orderId": None}, message_id="bad-4")
    await harness.message("scheduler_nudge", {"orderId": "ghost"}, message_id="bad-5")
    parked = [(p.queue, p.message_id, p.reason) for p in harness.bus.parked]
    assert parked == [
        (Queue.SCHEDULER, "bad-1", "invalid-message"),
        (Queue.AGENT_REPLIES, "bad-2", "invalid-message"),
        (agent_queue("payment"), "bad-3", "unknown-step"),
        (Queue.ORDERS, "bad-4", "invalid-message"),
        (Queue.SCHEDULER, "bad-5", "unknown-order"),
    ]
    assert harness.bus.parked[0].body == b"not json"
    assert "not performed by the payment agent" in harness.bus.parked[2].detail
    alerts = harness.bus.on(Queue.OPERATOR_ALERTS)
    assert [(a.body["orderId"], a.body["reason"]) for a in alerts] == [
        ("x", "invalid-message"),
        ("x", "unknown-step"),
        ("ghost", "unknown-order"),
    ]
    assert "agent-replies message bad-2" in alerts[0].body["lastError"]
    assert alerts[0].message_id == "alert:x:agent-replies:bad-2"
    assert (alerts[0].body["queue"], alerts[0].body["failureCount"]) == ("agent-replies", 0)
    assert json.loads(alerts[0].body["body"]) == {"orderId": "x"}
    assert (await harness.store.list_by_state(None, 10, None)).items == ()


async def test_a_reply_for_a_step_the_workflow_lacks_is_dead_lettered(harness: Harness) -> None:
    await harness.http("submit_order_http", "POST", "orders", ORDER)
    before = await harness.store.load("fn-1")
    reply = {"orderId": "fn-1", "step": "teleport", "action": "do", "attempt": 1}
    await harness.message(
        "scheduler_reply", {**reply, "outcome": "succeeded", "result": {}}, message_id="odd"
    )
    assert [(p.message_id, p.reason) for p in harness.bus.parked] == [("odd", "unknown-step")]
    after = await harness.store.load("fn-1")
    assert before is not None and after is not None and after.state == before.state


async def test_an_expiring_poison_copy_is_dropped_not_parked_again(harness: Harness) -> None:
    await harness.message(
        "scheduler_nudge",
        b"not json",
        message_id="poison:bad-1",
        properties={PoisonProperty.COPY_OF: "bad-1"},
    )
    assert harness.bus.parked == [] and harness.bus.on(Queue.OPERATOR_ALERTS) == []


async def test_a_poison_message_that_cannot_be_parked_is_retried(harness: Harness) -> None:
    harness.bus.fail_next = 1
    with pytest.raises(BusUnavailable):
        await harness.message("scheduler_nudge", b"not json", message_id="bad-1")
    await harness.message("scheduler_nudge", b"not json", message_id="bad-1")
    assert [p.message_id for p in harness.bus.parked] == ["bad-1"]


async def test_supervisor_timer_recovers_an_expired_step(harness: Harness) -> None:
    await harness.http("submit_order_http", "POST", "orders", ORDER)
    harness.clock.advance(31)
    await harness.functions["supervisor"].func(
        TimerRequest(past_due=False), **context_for(harness.functions["supervisor"])
    )
    state = await harness.store.load("fn-1")
    assert state is not None
    assert state.state.process_state is ProcessState.PENDING
    assert state.state.failure_count == 1


async def test_openapi_document_is_served_and_valid(harness: Harness) -> None:
    from openapi_spec_validator import validate  # noqa: PLC0415

    response = await harness.http("openapi", "GET", "openapi.json")
    assert response.status_code == 200
    spec = body(response)
    validate(spec)
    order_schema = spec["components"]["schemas"]["OrderSubmission"]
    assert set(order_schema["required"]) == {"customerId", "items"}


async def test_a_huge_error_text_in_a_reply_is_kept_but_cut(harness: Harness) -> None:
    await harness.http("submit_order_http", "POST", "orders", ORDER)
    (request,) = harness.bus.take(agent_queue("inventory"))
    reply = {
        "orderId": "fn-1",
        "step": "reserve-inventory",
        "action": "do",
        "attempt": request.body["attempt"],
        "outcome": "failed",
        "error": {"code": "c" * 300, "message": "m" * 100_000},
    }
    await harness.message("scheduler_reply", reply, message_id="huge")
    state = await harness.store.load("fn-1")
    assert state is not None and state.state.process_state is ProcessState.COMPENSATED
    assert harness.bus.parked == []
    error = state.steps[0].error
    assert error is not None and (len(error.code), len(error.message)) == (100, 1000)
