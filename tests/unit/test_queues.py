"""Destinations and their queues: the domain names where a message goes in the pattern's
words, the buses name the queue (shared/adapters/queues.py), and an outbox stored
before destinations (queue names only) still delivers to the queues it named."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from shared.adapters.memory.store import InMemoryBus
from shared.adapters.queues import destination_of, queue_of
from shared.adapters.table.rows import get_text, put_text, state_entity, to_process
from shared.contract import Queue
from shared.domain.destination import Destination
from shared.domain.machine.forward import claim, start
from shared.domain.model import Outgoing, Priority
from tests.builders import a_policy, an_order
from tests.workflows import AGENTS, ALL_QUEUES, ORDER_FULFILMENT

AT = an_order("o-1").created_at


@pytest.mark.parametrize(
    ("destination", "queue"),
    [
        (Destination.to_scheduler(), "scheduler"),
        (Destination.to_scheduler(high=True), "scheduler-high"),
        (Destination.to_scheduler_replies(), "agent-replies"),
        (Destination.to_scheduler_replies(high=True), "agent-replies-high"),
        (Destination.to_agent("payment"), "agent-payment"),
        (Destination.to_agent("payment-secondary", high=True), "agent-payment-secondary-high"),
        (Destination.to_client(), "order-status"),
        (Destination.to_client("shop-replies"), "shop-replies"),
        (Destination.to_operators(), "operator-alerts"),
    ],
)
def test_each_destination_goes_to_its_contract_queue(destination: Destination, queue: str) -> None:
    assert queue_of(destination) == queue
    assert destination_of(queue) == destination


@pytest.mark.parametrize(
    "queue", [*ALL_QUEUES, "shop-replies", "agent-", "agent-high", "agent--high", "x-high"]
)
def test_every_queue_name_reads_back_to_a_destination_with_that_queue(queue: str) -> None:
    """What an old outbox row named is where it still goes, whatever the name."""
    assert queue_of(destination_of(queue)) == queue


@pytest.mark.parametrize("priority", [Priority.NORMAL, Priority.HIGH])
def test_the_history_names_the_agent_of_a_request_as_its_queue(priority: Priority) -> None:
    """Operators read `charge-payment to agent-payment` in the history (docs/routing.md)
    and find the queue by that name."""
    order = replace(an_order("o-1"), priority=priority)
    started = start(order, ORDER_FULFILMENT, AT)
    claimed = claim(started.process, ORDER_FULFILMENT, a_policy(), "s-1", AT)
    assert claimed is not None
    (request,) = [m for m in claimed.outgoing if m.destination.agent is not None]
    (note,) = [h.detail for h in claimed.history if h.event == "step-dispatched"]
    assert note == f"reserve-inventory to {queue_of(request.destination)}"
    assert request.destination.high is (priority is Priority.HIGH)


OLD_OUTBOX = [
    ("scheduler-high", "nudge:o-1:2"),
    ("agent-payment-secondary-high", "req:o-1:charge-payment:do:1"),
    ("agent-replies", "rep:o-1:charge-payment:do:1"),
    ("shop-replies", "status:o-1:Processing:2"),
    ("order-status", "status:o-1:Received:1"),
    ("operator-alerts", "alert:o-1:2"),
]


async def test_an_outbox_stored_with_queue_names_still_delivers_to_those_queues() -> None:
    """Rows written before destinations keep `queue` only: they are read back and sent
    where they named, as the Supervisor's resend does."""
    process = start(an_order("o-1"), ORDER_FULFILMENT, AT).process
    entity = state_entity(process)
    old = [{"queue": q, "messageId": i, "body": {"orderId": "o-1"}} for q, i in OLD_OUTBOX]
    put_text(entity, "Outbox", json.dumps(old))
    stored = to_process(entity, etag="e-1")
    bus = InMemoryBus()
    await bus.send(stored.state.outbox)
    assert [(m.queue, m.message_id) for m in bus.sent] == OLD_OUTBOX


def test_an_outbox_is_stored_with_its_destinations_and_their_queues() -> None:
    """The queue is kept beside the destination, for an instance of the version before
    destinations still running during a deployment; this version reads the destination."""
    process = start(an_order("o-1"), ORDER_FULFILMENT, AT).process
    outbox = tuple(
        Outgoing(destination_of(queue), message_id, {"orderId": "o-1"})
        for queue, message_id in OLD_OUTBOX
    )
    written = state_entity(replace(process, state=replace(process.state, outbox=outbox)))
    rows = json.loads(get_text(written, "Outbox") or "[]")
    assert [(row["queue"], row["messageId"]) for row in rows] == OLD_OUTBOX
    assert rows[1]["to"] == "agent" and rows[1]["agent"] == "payment-secondary" and rows[1]["high"]
    assert to_process(written, etag="e-1").state.outbox == outbox


def test_every_agent_of_the_catalogue_has_its_two_lanes() -> None:
    lanes = {queue_of(Destination.to_agent(a, high=h)) for a in AGENTS for h in (False, True)}
    assert lanes == set(ALL_QUEUES) - {
        Queue.ORDERS,
        Queue.SCHEDULER,
        Queue.SCHEDULER_HIGH,
        Queue.AGENT_REPLIES,
        Queue.AGENT_REPLIES_HIGH,
        Queue.ORDER_STATUS,
        Queue.OPERATOR_ALERTS,
    }
