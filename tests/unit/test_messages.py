"""Each message builds and parses through one definition: what is sent reads back the same,
on the queue and with the message id that duplicate detection relies on."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from shared.domain.destination import Destination
from shared.domain.messages import (
    MAX_MESSAGE_BYTES,
    AgentReply,
    AgentRequest,
    InvalidMessage,
    Nudge,
    OperatorAlert,
    OrderSubmission,
    StatusNotification,
)
from shared.domain.model import Action, ErrorInfo, NotificationStatus, Outcome
from shared.openapi import document

AT = datetime(2030, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
REQUEST = AgentRequest("o-1", "charge-payment", Action.DO, 2, AT, "o-1:charge-payment", {"a": 1})


Message = Nudge | AgentRequest | AgentReply | StatusNotification | OperatorAlert


def wire(body: object) -> bytes:
    return json.dumps(body).encode()


@pytest.mark.parametrize(
    "message",
    [
        Nudge("o-1", "requeued"),
        REQUEST,
        AgentReply("o-1", "s", Action.COMPENSATE, 3, Outcome.SUCCEEDED, {"ref": "x"}),
        AgentReply("o-1", "s", Action.DO, 1, Outcome.FAILED, error=ErrorInfo("declined", "no")),
        StatusNotification("o-1", NotificationStatus.FAILED, AT, "why"),
        StatusNotification("o-1", NotificationStatus.PROCESSED, AT),
        OperatorAlert("o-1", "max-failure-count-reached", 3, None, AT),
        OperatorAlert("o-1", "unknown-step", 0, "why", AT, queue="agent-payment", body="{}"),
    ],
)
def test_what_is_sent_parses_back_to_the_same_message(message: Message) -> None:
    assert type(message).parse(wire(message.to_body())) == message


def test_an_agent_request_in_wire_form() -> None:
    sent = REQUEST.outgoing("payment", high=True)
    assert (sent.destination, sent.message_id) == (
        Destination.to_agent("payment", high=True),
        "req:o-1:charge-payment:do:2",
    )
    assert sent.body == {
        "orderId": "o-1",
        "step": "charge-payment",
        "action": "do",
        "attempt": 2,
        "completeBy": "2030-01-02T03:04:05.678000Z",
        "idempotencyKey": "o-1:charge-payment",
        "payload": {"a": 1},
    }


def test_the_reply_to_a_request_answers_its_step_and_attempt() -> None:
    reply = REQUEST.answer(Outcome.FAILED).outgoing()
    assert (reply.destination, reply.message_id) == (
        Destination.to_scheduler_replies(),
        "rep:o-1:charge-payment:do:2",
    )
    assert reply.body["error"] == {"code": "unknown", "message": "no detail"}
    assert "result" not in reply.body
    succeeded = REQUEST.answer(Outcome.SUCCEEDED).outgoing(high=True)
    assert succeeded.destination == Destination.to_scheduler_replies(high=True)
    assert succeeded.body["result"] == {}
    assert "error" not in succeeded.body


def test_destinations_and_message_ids_of_the_process_messages() -> None:
    nudge = Nudge("o-1", "submitted").outgoing(4, high=True, deliver_at=AT)
    assert (nudge.destination, nudge.message_id, nudge.deliver_at) == (
        Destination.to_scheduler(high=True),
        "nudge:o-1:4",
        AT,
    )
    status = StatusNotification("o-1", NotificationStatus.PROCESSED, AT).outgoing(5, None)
    assert (status.destination, status.message_id) == (
        Destination.to_client(),
        "status:o-1:Processed:5",
    )
    assert status.body == {
        "orderId": "o-1",
        "status": "Processed",
        "at": "2030-01-02T03:04:05.678000Z",
    }
    failed = StatusNotification("o-1", NotificationStatus.FAILED, AT).outgoing(5, "mine")
    assert failed.destination == Destination.to_client("mine")
    alert = OperatorAlert("o-1", "compensation-failed", 2, None, AT).outgoing(6)
    assert (alert.destination, alert.message_id) == (Destination.to_operators(), "alert:o-1:6")
    assert alert.body["lastError"] is None
    assert "queue" not in alert.body


def test_a_naive_complete_by_is_read_as_utc() -> None:
    body = {**REQUEST.to_body(), "completeBy": "2030-01-02T03:04:05"}
    assert AgentRequest.parse(wire(body)).complete_by == datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)


def test_an_error_text_is_cut_not_refused_and_unknown_fields_are_ignored() -> None:
    body = {
        **AgentReply("o-1", "s", Action.DO, 1, Outcome.FAILED).to_body(),
        "error": {"code": "c" * 500, "message": "m" * 5000, "extra": 1},
        "extra": True,
    }
    error = AgentReply.parse(wire(body)).error
    assert error == ErrorInfo("c" * 100, "m" * 1000)


@pytest.mark.parametrize(
    ("kind", "body", "reason"),
    [
        (Nudge, b"{not json", "Invalid JSON"),
        (Nudge, b'{"orderId": "has space"}', "orderId"),
        (AgentReply, wire({"orderId": "x"}), "step: Field required"),
        (AgentRequest, wire({**REQUEST.to_body(), "attempt": 0}), "attempt"),
        (AgentRequest, b" " * (MAX_MESSAGE_BYTES + 1), "exceeds"),
    ],
)
def test_a_body_no_retry_can_fix_is_an_invalid_message(
    kind: type[Nudge | AgentReply | AgentRequest], body: bytes, reason: str
) -> None:
    with pytest.raises(InvalidMessage, match=reason):
        kind.parse(body)


def test_an_order_message_refuses_unknown_fields_and_reads_back() -> None:
    order = {
        "orderId": "o-1",
        "customerId": "c",
        "items": [{"sku": "s", "quantity": 1, "unitPrice": 2.5}],
    }
    submission = OrderSubmission.parse(wire(order))
    assert submission.to_body() == {**order, "priority": "normal"}
    with pytest.raises(InvalidMessage, match="extra"):
        OrderSubmission.parse(wire({**order, "extra": 1}))


def test_the_published_order_item_schema_speaks_json_schema_not_pydantic() -> None:
    """A client generated from the document must refuse what the server refuses: the
    quantity's bounds as JSON Schema keywords (issue 27, item 2)."""
    quantity = document()["components"]["schemas"]["OrderItem"]["properties"]["quantity"]
    assert quantity["exclusiveMinimum"] == 0 and quantity["maximum"] == 1_000_000
    assert not {"gt", "ge", "lt", "le"} & set(quantity)
