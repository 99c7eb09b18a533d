"""What a client hears on its response queue, as it asked when it submitted (`notify`):
every status by default, or the one that ends the order only (issue #39)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from pydantic import ValidationError

from shared.adapters.clock import FakeClock
from shared.adapters.table import rows as table_rows
from shared.contract import Queue, agent_queue
from shared.domain.machine.forward import start
from shared.domain.messages import OrderSubmission, describe
from shared.domain.model import FINAL_NOTIFICATIONS, NotificationStatus, Notify, Outcome
from shared.openapi import document
from shared.usecases.flow import scheduler
from shared.usecases.flow.submission import submit_order
from tests.builders import World, a_reply, an_order
from tests.workflows import CATALOGUE

BODY: dict[str, Any] = {
    "orderId": "o-1",
    "customerId": "c-1",
    "items": [{"sku": "s", "quantity": 1, "unitPrice": 2.5}],
}
AGENT_QUEUES = tuple(agent_queue(a) for a in ("inventory", "payment", "shipping"))


def test_final_means_the_statuses_that_end_an_order() -> None:
    assert {s.value for s in FINAL_NOTIFICATIONS} == {"Processed", "Compensated", "Cancelled"}
    assert all(Notify.ALL.hears(s) for s in NotificationStatus)
    heard = {s for s in NotificationStatus if Notify.FINAL.hears(s)}
    assert heard == FINAL_NOTIFICATIONS


def test_the_choice_is_read_from_the_body_and_all_said_or_not_is_the_same_body() -> None:
    plain = OrderSubmission.model_validate(BODY)
    said = OrderSubmission.model_validate({**BODY, "notify": "all"})
    final = OrderSubmission.model_validate({**BODY, "notify": "final"})
    now = FakeClock().now()
    assert plain.to_order(now).notify is Notify.ALL
    assert said.to_order(now).notify is Notify.ALL
    assert final.to_order(now).notify is Notify.FINAL
    assert plain.fingerprint() == said.fingerprint() != final.fingerprint()


@pytest.mark.parametrize("value", ["loud", "FINAL", 1, True, ["final"]])
def test_any_other_value_is_refused_naming_the_field_and_the_values(value: object) -> None:
    with pytest.raises(ValidationError) as refused:
        OrderSubmission.model_validate({**BODY, "notify": value})
    assert describe(refused.value) == "notify: Input should be 'all' or 'final'"


def test_the_published_schema_offers_the_two_values() -> None:
    schema = document()["components"]["schemas"]["OrderSubmission"]["properties"]["notify"]
    assert {"enum": ["all", "final"], "type": "string"} in schema["anyOf"]
    assert "final" in schema["description"]


def test_the_choice_is_stored_with_the_order_and_absent_for_the_default() -> None:
    workflow = CATALOGUE.default_workflow()
    for notify, stored in ((Notify.ALL, None), (Notify.FINAL, "final")):
        order = replace(an_order("o-1"), notify=notify)
        process = start(order, workflow, order.created_at).process
        entity = table_rows.state_entity(process)
        assert entity.get("Notify") == stored
        assert table_rows.to_order(entity).notify is notify


def statuses(world: World) -> list[str]:
    return [m.body["status"] for m in world.bus.on(Queue.ORDER_STATUS)]


async def answer_all(world: World, outcome: Outcome = Outcome.SUCCEEDED) -> None:
    for _ in range(10):
        requests = [m for q in AGENT_QUEUES for m in world.bus.take(q)]
        if not requests:
            return
        for request in requests:
            body = request.body
            failed = outcome is Outcome.FAILED and body["step"] == "charge-payment"
            answer = Outcome.FAILED if failed else Outcome.SUCCEEDED
            await scheduler.on_reply(world.deps(), a_reply(request, answer))


async def run(notify: Notify, outcome: Outcome = Outcome.SUCCEEDED) -> list[str]:
    world = World()
    await submit_order(world.deps(), replace(an_order("o-1"), notify=notify))  # claimed
    await answer_all(world, outcome)
    return statuses(world)


async def test_by_default_the_client_hears_every_status() -> None:
    assert await run(Notify.ALL) == ["Received", "Processing", "Processed"]
    assert await run(Notify.ALL, Outcome.FAILED) == [
        "Received",
        "Processing",
        "Failed",
        "Compensated",
    ]


async def test_final_only_hears_the_status_that_ends_the_order() -> None:
    assert await run(Notify.FINAL) == ["Processed"]
    assert await run(Notify.FINAL, Outcome.FAILED) == ["Compensated"]
