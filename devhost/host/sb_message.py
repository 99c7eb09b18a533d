"""Received SDK messages as the ``azure.functions.ServiceBusMessage`` the worker builds."""

from __future__ import annotations

import json
from typing import Any

from azure.functions.servicebus import ServiceBusMessage
from azure.servicebus import ServiceBusReceivedMessage
from azure.servicebus.amqp import AmqpMessageBodyType


def _text(value: Any) -> Any:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def message_body(message: ServiceBusReceivedMessage) -> bytes:
    """The payload as bytes whatever AMQP body section the sender used."""
    body: Any = message.body
    if message.body_type == AmqpMessageBodyType.DATA:
        return b"".join(body)
    if isinstance(body, bytes):
        return body
    if isinstance(body, str):
        return body.encode()
    return json.dumps(body, default=_text).encode()


def host_delivery_count(message: ServiceBusReceivedMessage) -> int | None:
    """Delivery count as the Functions host reports it: 1 on the first delivery.

    Service Bus puts the AMQP header's zero-based count (prior failed deliveries) on
    the wire; the .NET SDK the host uses adds one, the Python SDK does not.
    """
    count = message.delivery_count
    return None if count is None else count + 1


def to_function_message(message: ServiceBusReceivedMessage) -> ServiceBusMessage:
    """Build the object the worker would hand to a ``serviceBusTrigger`` function."""
    properties = {
        str(_text(k)): _text(v) for k, v in (message.application_properties or {}).items()
    }
    lock_token = str(message.lock_token) if message.lock_token is not None else None
    delivery_count = host_delivery_count(message)
    metadata = {
        "MessageId": message.message_id,
        "DeliveryCount": delivery_count,
        "SequenceNumber": message.sequence_number,
        "EnqueuedTimeUtc": message.enqueued_time_utc,
        "LockToken": lock_token,
        "ContentType": message.content_type,
        "CorrelationId": message.correlation_id,
        "ApplicationProperties": properties,
        "UserProperties": properties,
    }
    return ServiceBusMessage(
        body=message_body(message),
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
        lock_token=lock_token,
        message_id=str(message.message_id or ""),
        partition_key=message.partition_key,
        reply_to=message.reply_to,
        reply_to_session_id=message.reply_to_session_id,
        scheduled_enqueue_time_utc=message.scheduled_enqueue_time_utc,
        sequence_number=message.sequence_number,
        session_id=message.session_id,
        state=int(message.state) if message.state is not None else None,
        subject=message.subject,
        time_to_live=message.time_to_live,
        to=message.to,
        user_properties=dict(properties),
    )
