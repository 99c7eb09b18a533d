"""A received message as the host knows it, and the ``azure.functions.ServiceBusMessage``
the worker builds from it.

``ReceivedMessage`` is what the host hands the worker, whichever client received it: the
host's own AMQP connection (``sb_proton``) or the SDK's receiver (``sb_sdk``). Both must
give the function the same message, which ``tests/devhost/test_sb_receivers.py`` checks.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from azure.functions.servicebus import ServiceBusMessage
from azure.servicebus import ServiceBusReceivedMessage
from azure.servicebus.amqp import AmqpMessageBodyType


def text(value: Any) -> Any:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


@dataclass(frozen=True, slots=True)
class ReceivedMessage:
    """The fields a ``serviceBusTrigger`` function can read; ``delivery_count`` is the wire's
    zero-based count (prior failed deliveries), as both clients report it."""

    body: bytes
    application_properties: dict[str, Any]
    message_id: str | None
    delivery_count: int | None
    sequence_number: int | None
    enqueued_sequence_number: int | None
    enqueued_time_utc: datetime | None
    locked_until_utc: datetime | None
    lock_token: str | None
    content_type: str | None
    correlation_id: str | None
    subject: str | None
    to: str | None
    reply_to: str | None
    reply_to_session_id: str | None
    session_id: str | None
    partition_key: str | None
    time_to_live: timedelta | None
    scheduled_enqueue_time_utc: datetime | None
    dead_letter_source: str | None
    state: int | None

    @property
    def host_delivery_count(self) -> int | None:
        """Delivery count as the Functions host reports it: 1 on the first delivery.

        Service Bus puts the AMQP header's zero-based count on the wire; the .NET SDK the
        host uses adds one, the Python SDK does not.
        """
        return None if self.delivery_count is None else self.delivery_count + 1

    @property
    def expires_at_utc(self) -> datetime | None:
        if self.enqueued_time_utc and self.time_to_live:
            return self.enqueued_time_utc + self.time_to_live
        return None

    @property
    def dead_letter_reason(self) -> str | None:
        return _text_or_none(self.application_properties.get("DeadLetterReason"))

    @property
    def dead_letter_error_description(self) -> str | None:
        return _text_or_none(self.application_properties.get("DeadLetterErrorDescription"))


def _text_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


def body_bytes(body: Any) -> bytes:
    """An amqp-value or amqp-sequence body as the bytes the worker would hand over."""
    if isinstance(body, bytes | bytearray | memoryview):
        return bytes(body)
    if isinstance(body, str):
        return body.encode()
    return json.dumps(body, default=text).encode()


def from_sdk(message: ServiceBusReceivedMessage) -> ReceivedMessage:
    """What the SDK's receiver got, in the host's terms."""
    raw: Any = message.body
    body = b"".join(raw) if message.body_type == AmqpMessageBodyType.DATA else body_bytes(raw)
    state = message.state
    return ReceivedMessage(
        body=body,
        application_properties={
            str(text(k)): text(v) for k, v in (message.application_properties or {}).items()
        },
        message_id=None if message.message_id is None else str(message.message_id),
        delivery_count=message.delivery_count,
        sequence_number=message.sequence_number,
        enqueued_sequence_number=message.enqueued_sequence_number,
        enqueued_time_utc=message.enqueued_time_utc,
        locked_until_utc=message.locked_until_utc,
        lock_token=None if message.lock_token is None else str(message.lock_token),
        content_type=message.content_type,
        correlation_id=message.correlation_id,
        subject=message.subject,
        to=message.to,
        reply_to=message.reply_to,
        reply_to_session_id=message.reply_to_session_id,
        session_id=message.session_id,
        partition_key=message.partition_key,
        time_to_live=message.time_to_live,
        scheduled_enqueue_time_utc=message.scheduled_enqueue_time_utc,
        dead_letter_source=message.dead_letter_source,
        state=None if state is None else int(state),
    )


def to_function_message(message: ReceivedMessage) -> ServiceBusMessage:
    """Build the object the worker would hand to a ``serviceBusTrigger`` function."""
    properties = message.application_properties
    delivery_count = message.host_delivery_count
    metadata = {
        "MessageId": message.message_id,
        "DeliveryCount": delivery_count,
        "SequenceNumber": message.sequence_number,
        "EnqueuedTimeUtc": message.enqueued_time_utc,
        "LockToken": message.lock_token,
        "ContentType": message.content_type,
        "CorrelationId": message.correlation_id,
        "ApplicationProperties": properties,
        "UserProperties": properties,
    }
    return ServiceBusMessage(
        body=message.body,
        trigger_metadata=metadata,
        application_properties=properties,
        content_type=message.content_type,
        correlation_id=message.correlation_id,
        dead_letter_error_description=message.dead_letter_error_description,
        dead_letter_reason=message.dead_letter_reason,
        dead_letter_source=message.dead_letter_source,
        delivery_count=delivery_count,
        enqueued_sequence_number=message.enqueued_sequence_number,
        enqueued_time_utc=message.enqueued_time_utc,
        expires_at_utc=message.expires_at_utc,
        label=message.subject,
        locked_until=message.locked_until_utc,
        lock_token=message.lock_token,
        message_id=message.message_id or "",
        partition_key=message.partition_key,
        reply_to=message.reply_to,
        reply_to_session_id=message.reply_to_session_id,
        scheduled_enqueue_time_utc=message.scheduled_enqueue_time_utc,
        sequence_number=message.sequence_number,
        session_id=message.session_id,
        state=message.state,
        subject=message.subject,
        time_to_live=message.time_to_live,
        to=message.to,
        user_properties=dict(properties),
    )
