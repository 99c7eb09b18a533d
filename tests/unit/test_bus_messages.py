"""The bus adapter builds each message as an AMQP message, not a ServiceBusMessage: on
the wire it must be the same message, byte for byte, as the SDK's own class makes of
the same fields (id, content type, application properties, scheduled time, body)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from azure.servicebus import ServiceBusMessage
from azure.servicebus._common.utils import transform_outbound_messages
from azure.servicebus._pyamqp._encode import encode_payload
from azure.servicebus._transport._pyamqp_transport import PyamqpTransport
from azure.servicebus.amqp import AmqpAnnotatedMessage

from shared.adapters.queues import destination_of
from shared.adapters.servicebus_bus import _body, _message
from shared.contract import Queue
from shared.domain.model import Outgoing

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _on_the_wire(message: ServiceBusMessage | AmqpAnnotatedMessage) -> bytes:
    """What the SDK writes for the message: converted as `send_messages` converts it."""
    sendable = transform_outbound_messages(
        message, ServiceBusMessage, PyamqpTransport.to_outgoing_amqp_message
    )
    assert isinstance(sendable, ServiceBusMessage)
    return bytes(encode_payload(bytearray(), sendable._message))


def _as_the_sdk_builds_it(message: Outgoing, body: str) -> ServiceBusMessage:
    properties: dict[str | bytes, str] = {"orderId": str(message.body.get("orderId", ""))}
    properties.update(message.properties)
    return ServiceBusMessage(
        body,
        message_id=message.message_id,
        content_type="application/json",
        scheduled_enqueue_time_utc=message.deliver_at,
        application_properties=dict(properties),
    )


@pytest.mark.parametrize(
    "message",
    [
        Outgoing(destination_of(Queue.ORDER_STATUS), "o-1:status:Received", {"orderId": "o-1"}),
        Outgoing(
            destination_of("agent-payment"),
            "o-1:charge-payment:1:do",
            {"orderId": "o-1", "payload": {"note": "é ✓"}, "attempt": 1},
            properties={"traceparent": TRACEPARENT, "Diagnostic-Id": TRACEPARENT},
        ),
        Outgoing(
            destination_of(Queue.SCHEDULER),
            "o-2:nudge",
            {"orderId": "o-2"},
            deliver_at=datetime(2026, 11, 29, 13, 0, 0, 123000, tzinfo=UTC),
        ),
        Outgoing(destination_of(Queue.SCHEDULER), "sweep", {}),
    ],
    ids=["notification", "traced-request", "scheduled-nudge", "no-order"],
)
def test_a_message_goes_out_as_the_sdks_own_class_would_send_it(message: Outgoing) -> None:
    body = _body(message)
    assert _on_the_wire(_message(message, body)) == _on_the_wire(
        _as_the_sdk_builds_it(message, body)
    )
