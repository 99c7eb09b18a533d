"""Send, receive and settle through the real SDK: the peek-lock contract of Service Bus."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

import pytest
from azure.servicebus import ServiceBusMessage, ServiceBusReceiveMode, ServiceBusSubQueue
from azure.servicebus.aio import ServiceBusClient
from azure.servicebus.amqp import AmqpAnnotatedMessage, AmqpMessageBodyType
from azure.servicebus.exceptions import MessageLockLostError

from devhost.broker import Broker

from .conftest import QUEUE, BrokerFactory
from .helpers import (
    body_of,
    connect,
    open_sender,
    opened,
    receive_n,
    sender_and_receiver,
    wait_for,
)

pytestmark = pytest.mark.broker


async def test_send_receive_complete_round_trips_properties_and_bodies(
    broker: Broker, client: ServiceBusClient
) -> None:
    async with sender_and_receiver(client, QUEUE) as (sender, receiver):
        started = time.monotonic()
        assert await receiver.receive_messages(max_message_count=5, max_wait_time=0.3) == []
        assert time.monotonic() - started < 1.5  # an empty receive honours max_wait_time
        await sender.send_messages(
            ServiceBusMessage(
                b'{"orderId": "o-1"}',
                message_id="m-1",
                correlation_id="corr-1",
                content_type="application/json",
                subject="OrderSubmitted",
                application_properties={"attempt": 2, "kind": "order", "ok": True},
                to="orders",
                reply_to="agent-replies",
                time_to_live=timedelta(minutes=5),
            )
        )
        started = time.monotonic()
        [message] = await receiver.receive_messages(max_message_count=10, max_wait_time=10)
        assert time.monotonic() - started < 2.0  # returns once messages are there
        assert body_of(message) == b'{"orderId": "o-1"}'
        assert message.message_id == "m-1"
        assert message.correlation_id == "corr-1"
        assert message.content_type == "application/json"
        assert message.subject == "OrderSubmitted"
        assert message.application_properties == {b"attempt": 2, b"kind": b"order", b"ok": True}
        assert message.to == "orders"
        assert message.reply_to == "agent-replies"
        assert message.time_to_live == timedelta(minutes=5)
        assert message.sequence_number == 1
        assert message.delivery_count == 0
        assert message.enqueued_time_utc is not None
        assert message.locked_until_utc is not None
        assert message.locked_until_utc > message.enqueued_time_utc
        assert message.lock_token is not None
        assert broker.stats()[QUEUE]["locked"] == 1
        await receiver.complete_message(message)

        await sender.send_messages(
            [
                AmqpAnnotatedMessage(value_body={"kind": "value", "n": 1}),
                AmqpAnnotatedMessage(sequence_body=[[1, "two"]]),
            ]
        )
        value, sequence = await receive_n(receiver, 2)
        assert value.body_type == AmqpMessageBodyType.VALUE
        assert value.body == {b"kind": b"value", b"n": 1}
        assert sequence.body_type == AmqpMessageBodyType.SEQUENCE
        assert list(sequence.body) == [[1, b"two"]]
        for settled in (value, sequence):
            await receiver.complete_message(settled)
    stats = broker.stats()[QUEUE]
    assert (stats["sent"], stats["delivered"], stats["completed"]) == (3, 3, 3)
    assert (stats["active"], stats["locked"]) == (0, 0)


async def test_batch_send_enqueues_each_message(broker: Broker, client: ServiceBusClient) -> None:
    async with sender_and_receiver(client, QUEUE) as (sender, receiver):
        await sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(3)])
        batch = await sender.create_message_batch()
        for i in range(3, 6):
            batch.add_message(ServiceBusMessage(f"m{i}", subject=f"s{i}"))
        await sender.send_messages(batch)
        messages = await receive_n(receiver, 6)
        assert [str(m) for m in messages] == [f"m{i}" for i in range(6)]
        assert [m.sequence_number for m in messages] == list(range(1, 7))
        assert messages[4].subject == "s4"
        for message in messages:
            await receiver.complete_message(message)
    assert broker.stats()[QUEUE]["completed"] == 6


async def test_abandon_redelivers_with_incremented_delivery_count(
    broker: Broker, client: ServiceBusClient
) -> None:
    async with sender_and_receiver(client, QUEUE) as (sender, receiver):
        await sender.send_messages(ServiceBusMessage("again"))
        [first] = await receive_n(receiver, 1)
        await receiver.abandon_message(first)
        [second] = await receive_n(receiver, 1)
        assert second.sequence_number == first.sequence_number
        assert second.delivery_count == 1
        assert second.lock_token != first.lock_token
        await receiver.complete_message(second)
    stats = broker.stats()[QUEUE]
    assert (stats["abandoned"], stats["delivered"], stats["completed"]) == (1, 2, 1)


async def test_lock_expiry_redelivers_and_the_expired_lock_is_lost(
    make_broker: BrokerFactory,
) -> None:
    broker = make_broker(lock_seconds=0.3)
    async with (
        connect(broker.connection_string) as client,
        sender_and_receiver(client, QUEUE) as (sender, receiver),
    ):
        await sender.send_messages(ServiceBusMessage("slow"))
        [first] = await receive_n(receiver, 1)
        assert broker.stats()[QUEUE]["locked"] == 1
        await wait_for(lambda: broker.stats()[QUEUE]["locked"] == 0)
        with pytest.raises(MessageLockLostError):
            await receiver.renew_message_lock(first)
        with pytest.raises(MessageLockLostError):
            await receiver.complete_message(first)
        [second] = await receive_n(receiver, 1)
        assert second.sequence_number == first.sequence_number
        assert second.delivery_count == 1
        await receiver.complete_message(second)
    assert broker.stats()[QUEUE]["completed"] == 1


async def test_dead_letter_queue_gets_rejected_poison_and_expired_messages(
    make_broker: BrokerFactory,
) -> None:
    broker = make_broker(max_delivery_count=2)
    async with connect(broker.connection_string) as client:
        sender, receiver = open_sender(client, QUEUE), client.get_queue_receiver(QUEUE)
        dead_letters = client.get_queue_receiver(QUEUE, sub_queue=ServiceBusSubQueue.DEAD_LETTER)
        async with opened(sender, receiver, dead_letters):
            await sender.send_messages(
                ServiceBusMessage("stale", time_to_live=timedelta(milliseconds=100))
            )
            # Lets its time to live pass, which is the scenario. There is no event to wait
            # for: the broker expires a message when it would deliver it. The broker had
            # it before the send returned, so this is past its expiry on any machine.
            await asyncio.sleep(0.2)
            await sender.send_messages(
                [
                    ServiceBusMessage("bad", application_properties={"kind": "order"}),
                    ServiceBusMessage("poison", message_id="p-1"),
                ]
            )
            bad, poison = await receive_n(receiver, 2)
            await receiver.dead_letter_message(
                bad, reason="ValidationFailed", error_description="items must not be empty"
            )
            for attempt in range(2):
                assert poison.delivery_count == attempt
                await receiver.abandon_message(poison)
                if attempt == 0:
                    [poison] = await receive_n(receiver, 1)
            stats = broker.stats()[QUEUE]
            assert (stats["active"], stats["locked"], stats["deadLettered"]) == (0, 0, 3)

            dead = {str(m): m for m in await receive_n(dead_letters, 3)}
            assert dead["bad"].dead_letter_reason == "ValidationFailed"
            assert dead["bad"].dead_letter_error_description == "items must not be empty"
            assert dead["bad"].application_properties is not None
            assert dead["bad"].application_properties[b"kind"] == b"order"
            assert dead["bad"].sequence_number == bad.sequence_number
            assert dead["poison"].dead_letter_reason == "MaxDeliveryCountExceeded"
            assert dead["poison"].message_id == "p-1"
            assert dead["poison"].delivery_count == 2
            assert dead["stale"].dead_letter_reason == "TTLExpiredException"
            for message in dead.values():
                await dead_letters.complete_message(message)
    assert broker.stats()[QUEUE]["deadLettered"] == 0


async def test_receive_and_delete_removes_on_delivery(
    broker: Broker, client: ServiceBusClient
) -> None:
    async with sender_and_receiver(
        client, QUEUE, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
    ) as (sender, receiver):
        await sender.send_messages([ServiceBusMessage("a"), ServiceBusMessage("b")])
        messages = await receive_n(receiver, 2)
        assert [str(m) for m in messages] == ["a", "b"]
    stats = broker.stats()[QUEUE]
    assert (stats["active"], stats["locked"], stats["completed"]) == (0, 0, 2)


async def test_duplicate_message_id_is_accepted_but_not_enqueued_within_the_window(
    make_broker: BrokerFactory,
) -> None:
    window = 2.0
    broker = make_broker(duplicate_detection_window_seconds=window)
    async with (
        connect(broker.connection_string) as client,
        sender_and_receiver(client, QUEUE) as (sender, receiver),
    ):
        await sender.send_messages(ServiceBusMessage("one", message_id="same"))
        # The broker accepted "one" before the send returned: its window ends before this.
        window_over = time.monotonic() + window
        await sender.send_messages(ServiceBusMessage("two", message_id="same"))
        await sender.send_messages(ServiceBusMessage("three", message_id="other"))
        messages = await receive_n(receiver, 2)
        assert [str(m) for m in messages] == ["one", "three"]
        for message in messages:
            await receiver.complete_message(message)
        # Lets the window pass, which is the scenario: an id expires with the time alone.
        await asyncio.sleep(max(0.0, window_over - time.monotonic()) + 0.05)
        await sender.send_messages(ServiceBusMessage("four", message_id="same"))
        [late] = await receive_n(receiver, 1)
        assert str(late) == "four"  # the window is over: the same id is new again
        await receiver.complete_message(late)
    stats = broker.stats()[QUEUE]
    assert (stats["sent"], stats["duplicatesSuppressed"], stats["completed"]) == (4, 1, 3)
    assert (stats["active"], stats["locked"]) == (0, 0)
