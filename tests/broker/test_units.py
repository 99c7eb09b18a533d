"""The broker's parts without a network: codec, engine (on a fake clock) and management node."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from proton import Data, Described, Message, symbol, timestamp, ubyte, uint, ulong

from devhost.broker import codec
from devhost.broker.engine import Engine
from devhost.broker.faults import FaultConfig, FaultInjector
from devhost.broker.management import ManagementNode
from devhost.broker.model import Limits, Settlement
from devhost.broker.store import MemoryStore

pytestmark = pytest.mark.broker

QUEUE = "q"


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000_000

    def __call__(self) -> int:
        return self.now


def _engine(clock: Clock, **limits: int) -> Engine:
    settings = {"lock_ms": 1000, "max_delivery_count": 3, "dedupe_window_ms": 5000} | limits
    return Engine([QUEUE], MemoryStore(), Limits(**settings), clock=clock)


def _message(body: bytes = b"{}", **fields: Any) -> bytes:
    return Message(body=body, inferred=True, **fields).encode()


def _body(payload: bytes) -> Any:
    """A decoded message (as Any: proton's hints make every section optional)."""
    message = Message()
    message.decode(payload)
    return message


def _read(payload: bytes | None) -> bytes:
    assert payload is not None
    message = _body(payload)  # kept alive: proton's body view points into the message
    return bytes(message.body)


def test_codec_keeps_the_bare_message_and_rewrites_header_and_annotations() -> None:
    raw = _message(
        b'{"a": 1}',
        id="m-1",
        ttl=30,
        properties={"k": "v"},
        annotations={"x-opt-scheduled-enqueue-time": timestamp(5), "x-opt-sequence-number": 9},
    )
    parsed = codec.parse_message(raw)
    assert parsed.message_id == "m-1"
    assert parsed.ttl_ms == 30_000
    assert parsed.scheduled_ms == 5
    assert symbol("x-opt-sequence-number") not in parsed.annotations  # the broker's to set
    out = _body(codec.encode_message(parsed.header, 4, {codec.SEQUENCE_NUMBER: 7}, parsed.bare))
    assert (out.id, out.body, out.properties, out.delivery_count) == (
        "m-1",
        b'{"a": 1}',
        {"k": "v"},
        4,
    )
    assert out.annotations == {"x-opt-sequence-number": 7}


def test_codec_recognises_batch_envelopes_only() -> None:
    inner = [_message(b"one", id="1"), _message(b"two", id="2")]
    data = Data()
    for payload in inner:
        data.put_object(Described(ulong(codec.DATA), payload))
    assert codec.unpack_batch(data.encode()) == inner
    assert codec.unpack_batch(_message(b'{"json": true}')) is None
    with pytest.raises(codec.CodecError):
        codec.parse_message(b"\x00\x53\x75garbage")


def _proton_encoded(value: Any) -> bytes:
    data = Data()
    data.put_object(value)
    return bytes(data.encode())


@pytest.mark.parametrize(
    "header",
    [
        (None, None, None, None, None),
        (True, ubyte(4), uint(30_000), False, None),
        (False, ubyte(255), uint(7), True, None),
    ],
)
@pytest.mark.parametrize("delivery_count", [0, 3, 255, 256, 70_000])
def test_codec_writes_the_header_as_proton_does(header: codec.Header, delivery_count: int) -> None:
    durable, priority, ttl, first_acquirer, _ = header
    fields = [durable, priority, ttl, first_acquirer, uint(delivery_count)]
    expected = _proton_encoded(Described(ulong(codec.HEADER), fields))
    assert codec.encode_header(header, delivery_count) == expected


@pytest.mark.parametrize(
    "annotations",
    [
        {codec.SEQUENCE_NUMBER: 7, codec.ENQUEUED_TIME: timestamp(1_700_000_000_000)},
        {codec.SEQUENCE_NUMBER: 2**40, codec.LOCKED_UNTIL: timestamp(5), codec.MESSAGE_STATE: 2},
        {symbol("x-opt-partition-key"): "k" * 300, symbol("x-flag"): True, "plain": -200},
        {symbol("x-opt-via"): symbol("somewhere"), symbol("x-count"): ulong(3)},
        {symbol("x-opt-nested"): {"a": [1, 2]}, codec.SEQUENCE_NUMBER: 1},
    ],
)
def test_codec_writes_annotations_as_proton_does(annotations: dict[Any, Any]) -> None:
    expected = _proton_encoded(
        Described(ulong(codec.MESSAGE_ANNOTATIONS), {symbol(k): v for k, v in annotations.items()})
    )
    assert codec.encode_annotations(annotations) == expected


@pytest.mark.parametrize(
    ("message_id", "key"),
    [
        ("m-1", "m-1"),
        ("\u00e9t\u00e9-" + "x" * 300, "\u00e9t\u00e9-" + "x" * 300),
        (uuid.UUID(int=5), str(uuid.UUID(int=5))),
        (b"\x01\x02", "0102"),
        (ulong(42), str(ulong(42))),  # as the broker always keyed it
        (None, None),
    ],
)
def test_codec_keys_every_kind_of_message_id(message_id: Any, key: str | None) -> None:
    (parsed,) = codec.parse_sent(_message(b"x", id=message_id))
    assert parsed.message_id == key


def test_codec_reads_a_batch_envelope_and_a_message_alike() -> None:
    inner = [_message(b"one", id="1", ttl=5), _message(b"two", id="2")]
    data = Data()
    for payload in inner:
        data.put_object(Described(ulong(codec.DATA), payload))
    from_batch = codec.parse_sent(data.encode())
    assert from_batch == [codec.parse_message(payload) for payload in inner]
    assert [m.message_id for m in from_batch] == ["1", "2"]
    assert from_batch[0].ttl_ms == 5000
    single = _message(b'{"json": true}', id="3", properties={"k": "v"})
    assert codec.parse_sent(single) == [codec.parse_message(single)]
    with pytest.raises(codec.CodecError):
        codec.parse_sent(b"\x00\x53\x75\xa0\x05abc")


def test_dead_letter_properties_are_added_to_a_message_without_any() -> None:
    parsed = codec.parse_message(_message(b"x", id="m"))
    bare = codec.with_application_properties(parsed.bare, {"DeadLetterReason": "r"})
    out = _body(codec.encode_message(parsed.header, 0, {}, bare))
    assert (out.id, out.properties, out.body) == ("m", {"DeadLetterReason": "r"}, b"x")


def test_engine_expires_locks_and_dead_letters_after_max_deliveries() -> None:
    clock = Clock()
    engine = _engine(clock, max_delivery_count=2)
    engine.accept_send(QUEUE, _message(id="a"))
    first = uuid.uuid4()
    assert engine.take(QUEUE, first) is not None
    assert engine.take(QUEUE, uuid.uuid4()) is None  # locked: not handed out twice
    clock.now += 999
    engine.tick()
    assert engine.stats()[QUEUE]["locked"] == 1
    clock.now += 1
    engine.tick()
    assert engine.settle(first, Settlement.COMPLETE) is False  # the lock is lost
    second = uuid.uuid4()
    redelivered = _body(engine.take(QUEUE, second) or b"")
    assert redelivered.delivery_count == 1
    assert engine.settle(second, Settlement.ABANDON) is True
    stats = engine.stats()[QUEUE]
    assert (stats["active"], stats["deadLettered"], stats["abandoned"]) == (0, 1, 1)
    dead = _body(engine.take(QUEUE + "/$DeadLetterQueue", None) or b"")
    assert dead.properties["DeadLetterReason"] == "MaxDeliveryCountExceeded"


def test_engine_schedules_dedupes_and_serves_in_sequence_order() -> None:
    clock = Clock()
    engine = _engine(clock)
    engine.schedule(QUEUE, [_message(b"later", id="s")])
    clock.now += 1
    engine.accept_send(QUEUE, _message(b"x", id="d"))
    engine.accept_send(QUEUE, _message(b"x", id="d"))
    engine.accept_send(
        QUEUE,
        _message(b"soon", annotations={"x-opt-scheduled-enqueue-time": timestamp(clock.now + 10)}),
    )
    assert engine.stats()[QUEUE]["duplicatesSuppressed"] == 1
    assert engine.stats()[QUEUE]["scheduled"] == 1
    assert [_read(engine.take(QUEUE, None)) for _ in range(2)] == [b"later", b"x"]
    assert engine.take(QUEUE, None) is None
    clock.now += 10
    engine.tick()
    assert _read(engine.take(QUEUE, None)) == b"soon"
    clock.now += 5000
    engine.accept_send(QUEUE, _message(b"x", id="d"))  # the window is over
    assert engine.stats()[QUEUE]["active"] == 1


def _request(operation: str, body: Any) -> Any:
    return Message(id=uuid.uuid4(), body=body, properties={"operation": operation})


def _status(response: Message) -> Any:
    properties: dict[str, Any] = response.properties or {}
    return properties.get("statusCode"), properties.get("errorCondition")


def test_management_node_answers_lock_lost_unknown_operations_and_bad_requests() -> None:
    node = ManagementNode(_engine(Clock()))
    request = _request("com.microsoft:renew-lock", {"lock-tokens": [uuid.uuid4()]})
    lost = node.handle(QUEUE, request)
    assert lost.correlation_id == request.id
    assert _status(lost) == (410, "com.microsoft:message-lock-lost")
    unknown = node.handle(QUEUE, _request("com.microsoft:get-session-state", {}))
    assert _status(unknown) == (501, "amqp:not-implemented")
    bad = node.handle(QUEUE, _request("com.microsoft:cancel-scheduled-message", {}))
    assert _status(bad) == (400, "com.microsoft:argument-error")
    settle = _request(
        "com.microsoft:update-disposition",
        {"disposition-status": "completed", "lock-tokens": [uuid.uuid4()]},
    )
    assert _status(node.handle(QUEUE, settle))[0] == 410


def test_fault_injector_is_reproducible_for_a_seed() -> None:
    config = FaultConfig(duplicate_rate=0.3, drop_rate=0.3, delay_rate=0.3, delay_ms=5, seed=4)
    runs = []
    for _ in range(2):
        injector = FaultInjector(config)
        runs.append([injector.decide(QUEUE) for _ in range(50)])
    assert runs[0] == runs[1]
    assert any(d.drop for d in runs[0]) and any(d.duplicate for d in runs[0])
    assert (
        FaultInjector(FaultConfig(drop_rate=1, queues=frozenset({"other"}))).decide(QUEUE).drop
        is False
    )
