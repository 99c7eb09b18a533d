"""AMQP 1.0 messages handled section by section.

The broker keeps the bare message (properties, application properties, body, footer) exactly as
the sender encoded it and only rewrites the two sections Service Bus owns on the way out: the
header (delivery count) and the message annotations (sequence number, enqueued time, lock
expiry). Working on raw sections instead of a ``proton.Message`` round trip keeps every type the
SDK chose and every data section, which a decode/encode through ``proton.Message`` would not.

It runs for every message sent and delivered, so it does as little as it can in Python:
proton's C decoder checks each section and measures it, and only the values the broker reads
become Python objects (the message id, the header and the sender's annotations when there are
any); the sections the broker writes are written by hand when they hold what the broker puts
there, and by proton otherwise.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

from proton import Array, Data, DataException, Described, symbol, timestamp, ubyte, uint, ulong

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
    raw: bytes = b""
    """The message as sent: what the store keeps until the broker changes the message."""


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


class _Section(NamedTuple):
    code: int
    start: int
    value_start: int
    end: int


def _split(buf: bytes) -> list[_Section]:
    """The top-level sections of an encoded message, each checked by proton's C decoder."""
    view = memoryview(buf)
    data = Data()
    sections: list[_Section] = []
    pos = 0
    size = len(buf)
    while pos < size:
        data.clear()
        try:
            # proton's hint says bytes, but it reads any buffer; a view avoids a copy per section.
            consumed = data.decode(cast(bytes, view[pos:]))
        except DataException as exc:
            raise CodecError(f"undecodable AMQP section at offset {pos}: {exc}") from exc
        if consumed <= 0:
            raise CodecError(f"empty AMQP section at offset {pos}")
        code, value_start = _descriptor(buf, pos)
        sections.append(_Section(code, pos, value_start, pos + consumed))
        pos += consumed
    return sections


def _descriptor(buf: bytes, pos: int) -> tuple[int, int]:
    """The section code of the described value at ``pos`` (proton has decoded it whole), and
    where its value starts."""
    if buf[pos] != 0x00:
        raise CodecError(f"top-level value at offset {pos} is not a described section")
    constructor = buf[pos + 1]
    if constructor == 0x53:  # smallulong
        code, value_start = buf[pos + 2], pos + 3
    elif constructor == 0x80:  # ulong
        code, value_start = int.from_bytes(buf[pos + 2 : pos + 10], "big"), pos + 10
    elif constructor in (0xA3, 0xB3):  # sym8, sym32
        width = 1 if constructor == 0xA3 else 4
        length = int.from_bytes(buf[pos + 2 : pos + 2 + width], "big")
        name_start = pos + 2 + width
        name = bytes(buf[name_start : name_start + length]).decode("ascii", "replace")
        code, value_start = _SYMBOLIC_CODES.get(name, -1), name_start + length
    else:
        code, value_start = -1, pos
    if not HEADER <= code <= FOOTER:
        raise CodecError(f"unknown section descriptor at offset {pos}")
    return code, value_start


def _value(buf: bytes, section: _Section) -> Any:
    """A section's value as Python objects (for the few sections the broker reads whole)."""
    data = Data()
    data.decode(cast(bytes, memoryview(buf)[section.start : section.end]))
    data.rewind()
    data.next()
    described: Any = data.get_object()
    return _owned(described.value)


def _binary(buf: bytes, section: _Section) -> bytes | None:
    """A data section's bytes (vbin8 or vbin32)."""
    pos = section.value_start
    constructor = buf[pos]
    if constructor == 0xA0:
        return bytes(buf[pos + 2 : section.end])
    if constructor == 0xB0:
        return bytes(buf[pos + 5 : section.end])
    return None


def _first_field(buf: bytes, section: _Section) -> tuple[int, int] | None:
    """Where the first field of a list section is encoded, or None for an empty list."""
    pos = section.value_start
    constructor = buf[pos]
    if constructor == 0xC0 and buf[pos + 2] > 0:  # list8: size, count
        return buf[pos + 3], pos + 4
    if constructor == 0xD0 and int.from_bytes(buf[pos + 5 : pos + 9], "big") > 0:  # list32
        return buf[pos + 9], pos + 10
    return None


def _message_id(buf: bytes, section: _Section) -> str | None:
    """The properties' message-id as a duplicate-detection key, read without decoding the
    rest of the properties."""
    first = _first_field(buf, section)
    if first is None:
        return None
    constructor, pos = first
    if constructor == 0x40:
        return None
    if constructor in (0xA1, 0xB1):  # str8, str32
        width = 1 if constructor == 0xA1 else 4
        length = int.from_bytes(buf[pos : pos + width], "big")
        try:
            return bytes(buf[pos + width : pos + width + length]).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CodecError(f"message-id is not UTF-8: {exc}") from exc
    if constructor == 0x98:  # uuid
        return str(uuid.UUID(bytes=bytes(buf[pos : pos + 16])))
    fields = _value(buf, section)  # binary and ulong ids
    return _message_id_key(fields[0] if fields else None)


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
    return _parsed(buf, _split(buf))


def _parsed(buf: bytes, sections: list[_Section]) -> ParsedMessage:
    header: Header = EMPTY_HEADER
    annotations: dict[Any, Any] = {}
    bare: list[bytes] = []
    message_id: str | None = None
    for section in sections:
        code = section.code
        if code == HEADER:
            fields = list(_value(buf, section) or [])[:5]
            header = (*fields, *[None] * (5 - len(fields)))
        elif code == MESSAGE_ANNOTATIONS:
            value = _value(buf, section) or {}
            annotations = {k: v for k, v in value.items() if k not in BROKER_ANNOTATIONS}
        elif code in _BARE_CODES:
            if code == PROPERTIES:
                message_id = _message_id(buf, section)
            bare.append(buf[section.start : section.end])
        # Delivery annotations are per hop: they are not stored.
    return ParsedMessage(
        header=header,
        annotations=annotations,
        bare=b"".join(bare),
        message_id=message_id,
        ttl_ms=_millis(header[2]),
        scheduled_ms=_millis(annotations.get(SCHEDULED_ENQUEUE_TIME)),
        raw=bytes(buf),
    )


def _looks_like_message(payload: bytes) -> bool:
    return (
        len(payload) >= 3
        and payload[0] == 0x00
        and payload[1] == 0x53
        and 0x70 <= payload[2] <= 0x78
    )


def parse_sent(buf: bytes) -> list[ParsedMessage]:
    """The messages of one transfer: the inner messages of a batch envelope (see
    ``unpack_batch``), else the transfer's message. Each section is decoded once."""
    sections = _split(buf)
    inner = _batch(buf, sections)
    if inner is not None:
        try:
            return [parse_message(payload) for payload in inner]
        except CodecError:
            pass  # not a batch after all: a message whose data sections look like messages
    return [_parsed(buf, sections)]


def _batch(buf: bytes, sections: list[_Section]) -> list[bytes] | None:
    inner: list[bytes] = []
    for section in sections:
        if section.code in (HEADER, APPLICATION_PROPERTIES, AMQP_SEQUENCE, AMQP_VALUE):
            return None
        if section.code == DATA:
            payload = _binary(buf, section)
            if payload is None or not _looks_like_message(payload):
                return None
            inner.append(payload)
    return inner or None


def unpack_batch(buf: bytes) -> list[bytes] | None:
    """Return the inner messages when ``buf`` is an SDK batch envelope, else None.

    ``send_messages([...])`` and message batches arrive as one transfer with message format
    0x80013700 whose data sections each hold a complete encoded message. The Python binding of
    proton does not expose the transfer's message format, so the envelope is recognised by its
    shape: no header, no application properties, and only data sections that are themselves
    AMQP messages. An application body that is itself an encoded AMQP message would be mistaken
    for a batch; JSON or text bodies never are.
    """
    try:
        inner = _batch(buf, _split(buf))
        if inner is None:
            return None
        for payload in inner:
            _split(payload)
    except CodecError:
        return None
    return inner


def _sections(buf: bytes) -> Iterator[tuple[int, Any, bytes]]:
    """Yield (section code, decoded value, raw encoded section) for each top-level section."""
    for section in _split(buf):
        yield section.code, _value(buf, section), bytes(buf[section.start : section.end])


def _encode(value: Any) -> bytes:
    data = Data()
    data.put_object(value)
    return data.encode()


_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_HEADER_START = b"\x00\x53\x70\xd0"
_ANNOTATIONS_START = b"\x00\x53\x72\xd1"
_symbols: dict[str, bytes] = {}


def _flag(value: Any) -> bytes | None:
    if value is None:
        return b"\x40"
    if type(value) is bool:
        return b"\x41" if value else b"\x42"
    return None


def _uint(value: int) -> bytes:
    if value == 0:
        return b"\x43"
    if value < 256:
        return bytes((0x52, value))
    return b"\x70" + _U32.pack(value)


def _symbol(name: Any) -> bytes | None:
    encoded = _symbols.get(name)
    if encoded is None:
        if not isinstance(name, str) or not name.isascii() or len(name) > 255:
            return None
        encoded = bytes((0xA3, len(name))) + name.encode("ascii")
        if len(_symbols) < 1024:
            _symbols[name] = encoded
    return encoded


def _scalar(value: Any) -> bytes | None:
    """What proton writes for the annotation values the broker sets (and the plain values a
    sender sets); None for any other type, which proton then writes."""
    kind = type(value)
    if kind is int:
        if -128 <= value <= 127:
            return bytes((0x55, value & 0xFF))
        if -(2**63) <= value < 2**63:
            return b"\x81" + _I64.pack(value)
        return None
    if kind is timestamp:
        return b"\x83" + _I64.pack(value) if -(2**63) <= value < 2**63 else None
    if kind is str:
        text: bytes = value.encode("utf-8")
        if len(text) < 256:
            return bytes((0xA1, len(text))) + text
        return b"\xb1" + _U32.pack(len(text)) + text
    if kind is symbol:
        return _symbol(value)
    return _flag(value)


def _proton_header(header: Header, delivery_count: int) -> bytes:
    durable, priority, ttl, first_acquirer, _ = header
    fields = [
        durable,
        None if priority is None else ubyte(int(priority)),
        None if ttl is None else uint(int(ttl)),
        first_acquirer,
        uint(delivery_count),
    ]
    return _encode(Described(ulong(HEADER), fields))


def encode_header(header: Header, delivery_count: int) -> bytes:
    durable, priority, ttl, first_acquirer, _ = header
    durable_field, acquirer_field = _flag(durable), _flag(first_acquirer)
    if (
        durable_field is None
        or acquirer_field is None
        or not (priority is None or (isinstance(priority, int) and 0 <= priority < 256))
        or not (ttl is None or (isinstance(ttl, int) and 0 <= ttl < 2**32))
        or not 0 <= delivery_count < 2**32
    ):
        return _proton_header(header, delivery_count)
    fields = b"".join(
        (
            durable_field,
            b"\x40" if priority is None else bytes((0x50, priority)),
            b"\x40" if ttl is None else _uint(ttl),
            acquirer_field,
            _uint(delivery_count),
        )
    )
    return _HEADER_START + _U32.pack(len(fields) + 4) + _U32.pack(5) + fields


def encode_annotations(annotations: Mapping[Any, Any]) -> bytes:
    if not annotations:
        return b""
    parts: list[bytes] = []
    for key, value in annotations.items():
        encoded_key, encoded_value = _symbol(key), _scalar(value)
        if encoded_key is None or encoded_value is None:
            return _encode(
                Described(
                    ulong(MESSAGE_ANNOTATIONS), {symbol(k): v for k, v in annotations.items()}
                )
            )
        parts += (encoded_key, encoded_value)
    body = b"".join(parts)
    return _ANNOTATIONS_START + _U32.pack(len(body) + 4) + _U32.pack(len(parts)) + body


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
