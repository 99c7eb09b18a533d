"""AMQP 1.0 messages handled section by section.

The broker keeps the bare message (properties, application properties, body, footer) exactly as
the sender encoded it and only rewrites the two sections Service Bus owns on the way out: the
header (delivery count) and the message annotations (sequence number, enqueued time, lock
expiry). Working on raw sections instead of a ``proton.Message`` round trip keeps every type the
SDK chose and every data section, which a decode/encode through ``proton.Message`` would not.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, cast

from proton import Array, Data, DataException, Described, symbol, ubyte, uint, ulong

HEADER = 0x70
DELIVERY_ANNOTATIONS = 0x71
MESSAGE_ANNOTATIONS = 0x72
PROPERTIES = 0x73
APPLICATION_PROPERTIES = 0x74
DATA = 0x75
AMQP_SEQUENCE = 0x76
AMQP_VALUE = 0x77
FOOTER = 0x78

_SYMBOLIC_CODES = {
    "amqp:header:list": HEADER,
    "amqp:delivery-annotations:map": DELIVERY_ANNOTATIONS,
    "amqp:message-annotations:map": MESSAGE_ANNOTATIONS,
    "amqp:properties:list": PROPERTIES,
    "amqp:application-properties:map": APPLICATION_PROPERTIES,
    "amqp:data:binary": DATA,
    "amqp:amqp-sequence:list": AMQP_SEQUENCE,
    "amqp:amqp-value:*": AMQP_VALUE,
    "amqp:footer:map": FOOTER,
}
_BARE_CODES = frozenset(
    {PROPERTIES, APPLICATION_PROPERTIES, DATA, AMQP_SEQUENCE, AMQP_VALUE, FOOTER}
)

SEQUENCE_NUMBER = symbol("x-opt-sequence-number")
ENQUEUED_TIME = symbol("x-opt-enqueued-time")
LOCKED_UNTIL = symbol("x-opt-locked-until")
SCHEDULED_ENQUEUE_TIME = symbol("x-opt-scheduled-enqueue-time")
MESSAGE_STATE = symbol("x-opt-message-state")
DEAD_LETTER_SOURCE = symbol("x-opt-deadletter-source")
# Annotations the broker sets itself; a sender's values for them are not forwarded.
BROKER_ANNOTATIONS = frozenset({SEQUENCE_NUMBER, ENQUEUED_TIME, LOCKED_UNTIL, MESSAGE_STATE})

Header = tuple[Any, Any, Any, Any, Any]
EMPTY_HEADER: Header = (None, None, None, None, None)


class CodecError(ValueError):
    """The bytes are not an AMQP message this broker can store."""


@dataclass(frozen=True, slots=True)
class ParsedMessage:
    """What the broker needs from a sent message; ``bare`` is forwarded untouched."""

    header: Header
    annotations: dict[Any, Any]
    bare: bytes
    message_id: str | None
    ttl_ms: int | None
    scheduled_ms: int | None


def _owned(value: Any) -> Any:
    """Copy proton's memoryviews into bytes: they point into a buffer reused by the next decode."""
    if isinstance(value, memoryview):
        return value.tobytes()
    if isinstance(value, dict):
        return type(value)({_owned(k): _owned(v) for k, v in value.items()})
    if isinstance(value, list):
        return [_owned(v) for v in value]
    if isinstance(value, Described):
        return Described(_owned(value.descriptor), _owned(value.value))
    if isinstance(value, Array):
        return Array(value.descriptor, value.type, *[_owned(v) for v in value.elements])
    return value


def _sections(buf: bytes) -> Iterator[tuple[int, Any, bytes]]:
    """Yield (section code, decoded value, raw encoded section) for each top-level section."""
    view = memoryview(buf)
    data = Data()
    pos = 0
    while pos < len(buf):
        data.clear()
        try:
            # proton's hint says bytes, but it reads any buffer; a view avoids a copy per section.
            consumed = data.decode(cast(bytes, view[pos:]))
        except DataException as exc:
            raise CodecError(f"undecodable AMQP section at offset {pos}: {exc}") from exc
        if consumed <= 0:
            raise CodecError(f"empty AMQP section at offset {pos}")
        data.rewind()
        data.next()
        value = data.get_object()
        if not isinstance(value, Described):
            raise CodecError(f"top-level value at offset {pos} is not a described section")
        descriptor = value.descriptor
        code = _SYMBOLIC_CODES.get(descriptor) if isinstance(descriptor, str) else descriptor
        if not isinstance(code, int) or not HEADER <= code <= FOOTER:
            raise CodecError(f"unknown section descriptor {descriptor!r}")
        yield code, _owned(value.value), bytes(view[pos : pos + consumed])
        pos += consumed


def _message_id_key(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.hex()
    return str(value)


def _millis(value: Any) -> int | None:
    return int(value) if isinstance(value, int) else None


def parse_message(buf: bytes) -> ParsedMessage:
    """Split a sent message into the parts the broker rewrites and the bare message it keeps."""
    header: Header = EMPTY_HEADER
    annotations: dict[Any, Any] = {}
    bare: list[bytes] = []
    message_id: str | None = None
    for code, value, raw in _sections(buf):
        if code == HEADER:
            fields = list(value or [])[:5]
            header = (*fields, *[None] * (5 - len(fields)))
        elif code == MESSAGE_ANNOTATIONS:
            annotations = {k: v for k, v in (value or {}).items() if k not in BROKER_ANNOTATIONS}
        elif code in _BARE_CODES:
            if code == PROPERTIES and value:
                message_id = _message_id_key(value[0])
            bare.append(raw)
        # Delivery annotations are per hop: they are not stored.
    return ParsedMessage(
        header=header,
        annotations=annotations,
        bare=b"".join(bare),
        message_id=message_id,
        ttl_ms=_millis(header[2]),
        scheduled_ms=_millis(annotations.get(SCHEDULED_ENQUEUE_TIME)),
    )


def _looks_like_message(payload: bytes) -> bool:
    return (
        len(payload) >= 3
        and payload[0] == 0x00
        and payload[1] == 0x53
        and 0x70 <= payload[2] <= 0x78
    )


def unpack_batch(buf: bytes) -> list[bytes] | None:
    """Return the inner messages when ``buf`` is an SDK batch envelope, else None.

    ``send_messages([...])`` and message batches arrive as one transfer with message format
    0x80013700 whose data sections each hold a complete encoded message. The Python binding of
    proton does not expose the transfer's message format, so the envelope is recognised by its
    shape: no header, no application properties, and only data sections that are themselves
    AMQP messages. An application body that is itself an encoded AMQP message would be mistaken
    for a batch; JSON or text bodies never are.
    """
    inner: list[bytes] = []
    try:
        for code, value, _raw in _sections(buf):
            if code in (HEADER, APPLICATION_PROPERTIES, AMQP_SEQUENCE, AMQP_VALUE):
                return None
            if code == DATA:
                if not isinstance(value, bytes) or not _looks_like_message(value):
                    return None
                inner.append(value)
    except CodecError:
        return None
    if not inner:
        return None
    for payload in inner:
        try:
            for _ in _sections(payload):
                pass
        except CodecError:
            return None
    return inner


def _encode(value: Any) -> bytes:
    data = Data()
    data.put_object(value)
    return data.encode()


def encode_header(header: Header, delivery_count: int) -> bytes:
    durable, priority, ttl, first_acquirer, _ = header
    fields = [
        durable,
        None if priority is None else ubyte(int(priority)),
        None if ttl is None else uint(int(ttl)),
        first_acquirer,
        uint(delivery_count),
    ]
    return _encode(Described(ulong(HEADER), fields))


def encode_annotations(annotations: Mapping[Any, Any]) -> bytes:
    if not annotations:
        return b""
    return _encode(
        Described(ulong(MESSAGE_ANNOTATIONS), {symbol(k): v for k, v in annotations.items()})
    )


def encode_message(
    header: Header, delivery_count: int, annotations: Mapping[Any, Any], bare: bytes
) -> bytes:
    """Assemble a complete message from a header, annotations and an untouched bare message."""
    return encode_header(header, delivery_count) + encode_annotations(annotations) + bare


def with_application_properties(bare: bytes, extra: Mapping[str, str]) -> bytes:
    """Return ``bare`` with ``extra`` merged into its application properties section.

    Used when dead-lettering, where Service Bus records the reason as application properties.
    """
    added: dict[Any, Any] = dict(extra)
    out: list[bytes] = []
    merged = False
    for code, value, raw in _sections(bare):
        if code == APPLICATION_PROPERTIES:
            props: dict[Any, Any] = {**(value or {}), **added}
            out.append(_encode(Described(ulong(APPLICATION_PROPERTIES), props)))
            merged = True
        elif not merged and code != PROPERTIES:
            # No application properties yet: they go right after the properties section.
            out.append(_encode(Described(ulong(APPLICATION_PROPERTIES), added)))
            out.append(raw)
            merged = True
        else:
            out.append(raw)
    if not merged:
        out.append(_encode(Described(ulong(APPLICATION_PROPERTIES), added)))
    return b"".join(out)


def as_list(value: Any) -> list[Any]:
    """Elements of an AMQP array or list from a management request body."""
    if isinstance(value, Array):
        return list(value.elements)
    if isinstance(value, list | tuple):
        return list(value)
    if value is None:
        return []
    return [value]


def as_uuid(value: Any) -> uuid.UUID | None:
    if isinstance(value, uuid.UUID):
        return value
    if isinstance(value, bytes) and len(value) == 16:
        return uuid.UUID(bytes=value)
    if isinstance(value, str):
        try:
            return uuid.UUID(value)
        except ValueError:
            return None
    return None
