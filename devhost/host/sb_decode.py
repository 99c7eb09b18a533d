"""A transfer from devhost's broker as the ``ReceivedMessage`` the host hands on.

The host's AMQP thread decodes every message it receives, so this is on the path of every
trigger invocation. ``proton.Message`` decodes in C but then turns each section into
Python objects through its ``Data`` walker, a few foreign calls per value, and builds and
frees a message object per transfer: 35-50 us a message, a third of the host thread's CPU
under ``bench.throughput`` (bench/README.md, 2026-11-29). The common message, every
section described by a small-ulong code (as the SDK and proton both write them) and a
body of data sections, is read with the Service Bus SDK's own AMQP decoder instead, the
one its receiver uses for the same bytes (about half the time). Anything else (an
amqp-value or amqp-sequence body, no body, a section described by a symbol or a long
code, bytes that decoder refuses) goes through ``proton.Message`` as before, so both
paths hand over the same message, which ``tests/devhost/test_sb_decode.py`` checks.

The broker checked every section with proton's C decoder when the message was sent
(``devhost/broker/codec.py``), so a delivered message is well formed.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from azure.servicebus._pyamqp._decode import _DECODE_BY_CONSTRUCTOR
from cproton import pn_message_get_content_type  # type: ignore[import-untyped]
from proton import Message as AmqpMessage

from devhost.host.sb_message import ReceivedMessage, body_bytes, text

_DESCRIBED = 0x00
_SMALL_ULONG = 0x53
_HEADER = 0x70
_DELIVERY_ANNOTATIONS = 0x71
_MESSAGE_ANNOTATIONS = 0x72
_PROPERTIES = 0x73
_APPLICATION_PROPERTIES = 0x74
_DATA = 0x75
_FOOTER = 0x78
_SKIPPED = frozenset({_DELIVERY_ANNOTATIONS, _FOOTER})

# properties: message-id, user-id, to, subject, reply-to, correlation-id, content-type,
# content-encoding, absolute-expiry-time, creation-time, group-id, group-sequence,
# reply-to-group-id (AMQP 1.0, 3.2.4)
_MESSAGE_ID, _TO, _SUBJECT, _REPLY_TO, _CORRELATION_ID, _CONTENT_TYPE = 0, 2, 3, 4, 5, 6
_GROUP_ID, _REPLY_TO_GROUP_ID = 10, 12
# header: durable, priority, ttl, first-acquirer, delivery-count (3.2.1)
_TTL, _DELIVERY_COUNT = 2, 4


def decode(payload: bytes, tag: bytes) -> ReceivedMessage:
    """A transfer as the host hands it on, with the fields the SDK would read from it;
    `tag` is the delivery tag, the message's lock token."""
    try:
        sections = _sections(payload)
    except (IndexError, KeyError, TypeError, ValueError):
        sections = None
    if sections is None:
        return decode_with_proton(payload, tag)
    header, annotations, properties, application, data = sections
    return _message(header, annotations, properties, application, data, tag)


def _sections(payload: bytes) -> tuple[Any, dict[Any, Any], Any, Any, list[bytes]] | None:
    """The sections read by the SDK's decoder, or None for a message it is not used for."""
    view = memoryview(payload)
    header: Any = None
    annotations: dict[Any, Any] = {}
    properties: Any = ()
    application: Any = None
    data: list[bytes] = []
    while view:
        if view[0] != _DESCRIBED or view[1] != _SMALL_ULONG:
            return None
        code = view[2]
        view, value = _DECODE_BY_CONSTRUCTOR[view[3]](view[4:])
        if code == _DATA:
            if not isinstance(value, bytes):
                return None
            data.append(value)
        elif code == _APPLICATION_PROPERTIES:
            application = value
        elif code == _PROPERTIES:
            properties = value
        elif code == _MESSAGE_ANNOTATIONS:
            annotations = value
        elif code == _HEADER:
            header = value
        elif code not in _SKIPPED:
            return None  # an amqp-value or amqp-sequence body, or no section we know
    if not data:
        return None
    return header, annotations or {}, properties or (), application, data


def _message(
    header: Any,
    annotations: dict[Any, Any],
    properties: Any,
    application: Any,
    data: list[bytes],
    tag: bytes,
) -> ReceivedMessage:
    count = len(properties)

    def field(index: int) -> Any:
        return properties[index] if index < count else None

    head = header or ()
    delivery_count = head[_DELIVERY_COUNT] if len(head) > _DELIVERY_COUNT else None
    ttl_ms = head[_TTL] if len(head) > _TTL else None
    message_id = field(_MESSAGE_ID)
    state = annotations.get(b"x-opt-message-state")
    return ReceivedMessage(
        body=b"".join(data),
        application_properties={str(text(k)): text(v) for k, v in (application or {}).items()},
        message_id=None if message_id is None else str(text(message_id)),
        delivery_count=delivery_count or 0,
        sequence_number=annotations.get(b"x-opt-sequence-number"),
        enqueued_sequence_number=annotations.get(b"x-opt-enqueue-sequence-number"),
        enqueued_time_utc=_utc(annotations.get(b"x-opt-enqueued-time")),
        locked_until_utc=_utc(annotations.get(b"x-opt-locked-until")),
        lock_token=str(uuid.UUID(bytes_le=tag)),
        content_type=_str(field(_CONTENT_TYPE)),
        correlation_id=_str(field(_CORRELATION_ID)),
        subject=_str(field(_SUBJECT)),
        to=_str(field(_TO)),
        reply_to=_str(field(_REPLY_TO)),
        reply_to_session_id=_str(field(_REPLY_TO_GROUP_ID)),
        session_id=_str(field(_GROUP_ID)),
        partition_key=_str(annotations.get(b"x-opt-partition-key")),
        time_to_live=timedelta(milliseconds=ttl_ms) if ttl_ms else None,
        scheduled_enqueue_time_utc=_utc(annotations.get(b"x-opt-scheduled-enqueue-time")),
        dead_letter_source=_str(annotations.get(b"x-opt-deadletter-source")),
        state=0 if state is None else int(state),
    )


def decode_with_proton(payload: bytes, tag: bytes) -> ReceivedMessage:
    """Any message proton can decode (it reads what it cannot as an empty message)."""
    message = AmqpMessage()
    message.decode(payload)
    annotations: dict[Any, Any] = dict(message.annotations or {})
    properties: dict[Any, Any] = dict(message.properties or {})
    ttl_ms = round(message.ttl * 1000)
    message_id = message.id
    state = annotations.get("x-opt-message-state")
    return ReceivedMessage(
        body=body_bytes(message.body),
        application_properties={str(text(k)): text(v) for k, v in properties.items()},
        message_id=None if message_id is None else str(text(message_id)),
        delivery_count=message.delivery_count,
        sequence_number=annotations.get("x-opt-sequence-number"),
        enqueued_sequence_number=annotations.get("x-opt-enqueue-sequence-number"),
        enqueued_time_utc=_utc(annotations.get("x-opt-enqueued-time")),
        locked_until_utc=_utc(annotations.get("x-opt-locked-until")),
        lock_token=str(uuid.UUID(bytes_le=tag)),
        # Message.content_type makes a symbol of a missing type too: 'None'.
        content_type=_str(pn_message_get_content_type(message._msg)),
        correlation_id=_str(message.correlation_id),
        subject=_str(message.subject),
        to=_str(message.address),
        reply_to=_str(message.reply_to),
        reply_to_session_id=_str(message.reply_to_group_id),
        session_id=_str(message.group_id),
        partition_key=_str(annotations.get("x-opt-partition-key")),
        time_to_live=timedelta(milliseconds=ttl_ms) if ttl_ms else None,
        scheduled_enqueue_time_utc=_utc(annotations.get("x-opt-scheduled-enqueue-time")),
        dead_letter_source=_str(annotations.get("x-opt-deadletter-source")),
        state=0 if state is None else int(state),
    )


def _utc(value: Any) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(int(value) / 1000.0, UTC)


def _str(value: Any) -> str | None:
    return None if value is None else str(text(value))
