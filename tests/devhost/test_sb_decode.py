"""The host's decoding of a delivered message: the SDK's decoder for the common message,
proton for the rest, and the same ``ReceivedMessage`` from either."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage
from azure.servicebus._pyamqp._encode import encode_payload
from azure.servicebus._transport._pyamqp_transport import PyamqpTransport
from proton import Data, Described, Message, symbol, timestamp, ulong

from devhost.broker import codec
from devhost.host import sb_decode
from devhost.host.sb_decode import decode, decode_with_proton

TAG = bytes(range(16))
ANNOTATIONS = {
    codec.SEQUENCE_NUMBER: 9,
    codec.ENQUEUED_TIME: timestamp(1_795_959_840_378),
    codec.LOCKED_UNTIL: timestamp(1_795_959_900_378),
    "x-opt-partition-key": "pk",
    "x-opt-deadletter-source": "scheduler",
}


def delivered(sent: bytes, delivery_count: int = 2) -> bytes:
    """A message as devhost's broker delivers it: the sender's header with the delivery
    count, the broker's annotations, then the bare message as the sender encoded it."""
    parsed = codec.parse_message(sent)
    return codec.encode_message(parsed.header, delivery_count, ANNOTATIONS, parsed.bare)


def from_sdk_sender(message: ServiceBusMessage) -> bytes:
    outgoing = PyamqpTransport.to_outgoing_amqp_message(message.raw_amqp_message)
    return bytes(encode_payload(bytearray(), outgoing))


def rich() -> ServiceBusMessage:
    return ServiceBusMessage(
        b'{"orderId": "o-1"}',
        message_id="rich-1",
        content_type="application/json",
        correlation_id="corr-1",
        subject="the subject",
        to="someone",
        reply_to="replies",
        reply_to_session_id="reply-session",
        session_id="session",
        time_to_live=timedelta(minutes=5),
        application_properties={"traceparent": "00-ab-cd-01", "n": 3, "ok": True, "raw": b"b"},
    )


@pytest.fixture
def proton_calls(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The payloads that went to proton's decoder."""
    calls: list[bytes] = []

    def recorded(payload: bytes, tag: bytes) -> Any:
        calls.append(payload)
        return decode_with_proton(payload, tag)

    monkeypatch.setattr(sb_decode, "decode_with_proton", recorded)
    return calls


def test_an_sdk_senders_message_is_read_without_proton_and_equals_protons_reading(
    proton_calls: list[bytes],
) -> None:
    payload = delivered(from_sdk_sender(rich()))

    message = decode(payload, TAG)

    assert proton_calls == []
    assert message == decode_with_proton(payload, TAG)
    assert message.body == b'{"orderId": "o-1"}'
    assert message.application_properties == {
        "traceparent": "00-ab-cd-01",
        "n": 3,
        "ok": True,
        "raw": "b",
    }
    assert (message.message_id, message.delivery_count, message.sequence_number) == ("rich-1", 2, 9)
    assert (message.session_id, message.reply_to_session_id) == ("session", "reply-session")
    assert message.time_to_live == timedelta(minutes=5)
    assert message.partition_key == "pk"
    assert message.dead_letter_source == "scheduler"
    assert message.lock_token == "03020100-0504-0706-0809-0a0b0c0d0e0f"
    assert message.locked_until_utc is not None
    assert message.locked_until_utc.timestamp() == 1_795_959_900.378


@pytest.mark.parametrize(
    "message",
    [
        Message(body=b"data", inferred=True, id=7, properties={"k": "v"}),
        Message(body=b"data", inferred=True),
        Message(body=b"data", inferred=True, id="m", ttl=1.5, durable=True, priority=9),
    ],
    ids=["ulong id", "no properties", "header fields"],
)
def test_a_proton_senders_data_message_is_read_without_proton_too(
    message: Message, proton_calls: list[bytes]
) -> None:
    payload = delivered(message.encode(), delivery_count=0)

    assert decode(payload, TAG) == decode_with_proton(payload, TAG)
    assert proton_calls == []


@pytest.mark.parametrize(
    "body",
    [Message(body="text"), Message(body={"a": [1, 2]}), Message(body=None)],
    ids=["amqp-value string", "amqp-value map", "no body"],
)
def test_any_other_body_is_read_by_proton(body: Message, proton_calls: list[bytes]) -> None:
    payload = delivered(body.encode())

    message = decode(payload, TAG)

    assert proton_calls == [payload]
    assert message.body == decode_with_proton(payload, TAG).body


@pytest.mark.parametrize(
    "section",
    [Described(symbol("amqp:data:binary"), b"by name"), Described(ulong(codec.DATA), None)],
    ids=["described by its symbol", "not binary"],
)
def test_a_section_the_sdks_decoder_is_not_used_for_goes_to_proton(
    section: Described, proton_calls: list[bytes]
) -> None:
    data = Data()
    data.put_object(section)
    payload = codec.encode_message(codec.EMPTY_HEADER, 0, ANNOTATIONS, data.encode())

    message = decode(payload, TAG)

    assert proton_calls == [payload]
    assert message == decode_with_proton(payload, TAG)


def test_several_data_sections_are_joined_as_the_sdk_joins_them(
    proton_calls: list[bytes],
) -> None:
    data = Data()
    for chunk in (b"one ", b"two"):
        data.put_object(Described(ulong(codec.DATA), chunk))

    payload = codec.encode_message(codec.EMPTY_HEADER, 0, ANNOTATIONS, data.encode())

    message = decode(payload, TAG)

    assert proton_calls == []
    assert message.body == b"one two"


def test_bytes_the_sdks_decoder_refuses_go_to_proton(proton_calls: list[bytes]) -> None:
    payload = b"\x00\x53\x75\xff\xff"  # a data section with no known constructor

    assert decode(payload, TAG) == decode_with_proton(payload, TAG)
    assert proton_calls == [payload]


def test_a_message_without_a_content_type_has_none_either_way() -> None:
    payload = delivered(Message(body=b"x", inferred=True).encode())

    assert sb_decode._sections(payload) is not None
    assert decode(payload, TAG).content_type is None
    assert decode_with_proton(payload, TAG).content_type is None
