"""The $management operations the SDK uses: schedule, cancel, renew lock, peek."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from azure.servicebus import ServiceBusMessage, ServiceBusMessageState
from azure.servicebus.aio import ServiceBusClient
from azure.servicebus.exceptions import ServiceBusError

from devhost.broker import Broker

from .conftest import QUEUE, BrokerFactory
from .helpers import connect, receive_n, sender_and_receiver, wait_for

pytestmark = pytest.mark.broker


async def test_scheduled_messages_become_visible_at_their_time_unless_cancelled(
    broker: Broker, client: ServiceBusClient
) -> None:
    async with sender_and_receiver(client, QUEUE) as (sender, receiver):
        at = datetime.now(UTC) + timedelta(seconds=0.8)
        seqs = await sender.schedule_messages(
            [ServiceBusMessage("keep", message_id="k"), ServiceBusMessage("drop")], at
        )
        assert len(seqs) == 2
        assert seqs[0] < seqs[1]
        # The other way to schedule: the enqueue time set on a plainly sent message.
        await sender.send_messages(
            [ServiceBusMessage("later", scheduled_enqueue_time_utc=at), ServiceBusMessage("now")]
        )
        assert broker.stats()[QUEUE]["scheduled"] == 3
        await sender.cancel_scheduled_messages(seqs[1])
        assert broker.stats()[QUEUE]["scheduled"] == 2
        [now] = await receive_n(receiver, 1)
        assert str(now) == "now"
        assert datetime.now(UTC) < at
        keep, later = await receive_n(receiver, 2, timeout=3)
        assert datetime.now(UTC) >= at
        assert (str(keep), str(later)) == ("keep", "later")
        assert keep.sequence_number == seqs[0]
        for message in (keep, later):
            assert message.scheduled_enqueue_time_utc is not None
            assert abs(message.scheduled_enqueue_time_utc - at) < timedelta(milliseconds=5)
            assert message.enqueued_time_utc is not None
            assert message.enqueued_time_utc >= at - timedelta(milliseconds=5)
        for message in (now, keep, later):
            await receiver.complete_message(message)
    stats = broker.stats()[QUEUE]
    assert (stats["scheduled"], stats["active"], stats["completed"]) == (0, 0, 3)


async def test_renew_message_lock_extends_locked_until(make_broker: BrokerFactory) -> None:
    broker = make_broker(lock_seconds=0.8)
    async with (
        connect(broker.connection_string) as client,
        sender_and_receiver(client, QUEUE) as (sender, receiver),
    ):
        await sender.send_messages(ServiceBusMessage("long job"))
        [message] = await receive_n(receiver, 1)
        first_until = message.locked_until_utc
        assert first_until is not None
        await wait_for(lambda: datetime.now(UTC) > first_until - timedelta(seconds=0.5))
        renewed = await receiver.renew_message_lock(message)
        assert renewed > first_until
        assert message.locked_until_utc == renewed
        await wait_for(lambda: datetime.now(UTC) > first_until + timedelta(seconds=0.1))
        assert broker.stats()[QUEUE]["locked"] == 1  # still ours, past the first expiry
        await receiver.complete_message(message)
        assert broker.stats()[QUEUE]["completed"] == 1


async def test_peek_messages_does_not_lock_or_consume(
    broker: Broker, client: ServiceBusClient
) -> None:
    async with sender_and_receiver(client, QUEUE) as (sender, receiver):
        await sender.send_messages([ServiceBusMessage(f"p{i}") for i in range(5)])
        at = datetime.now(UTC) + timedelta(hours=1)
        [scheduled_seq] = await sender.schedule_messages(ServiceBusMessage("future"), at)
        first = await receiver.peek_messages(max_message_count=3)
        assert [str(m) for m in first] == ["p0", "p1", "p2"]
        assert [m.sequence_number for m in first] == [1, 2, 3]
        rest = await receiver.peek_messages(max_message_count=10)
        assert [str(m) for m in rest] == ["p3", "p4", "future"]
        assert rest[-1].sequence_number == scheduled_seq
        assert rest[-1].state == ServiceBusMessageState.SCHEDULED
        assert await receiver.peek_messages(max_message_count=10) == []
        from_start = await receiver.peek_messages(max_message_count=1, sequence_number=1)
        assert [m.sequence_number for m in from_start] == [1]
        stats = broker.stats()[QUEUE]
        assert (stats["active"], stats["locked"], stats["delivered"]) == (5, 0, 0)
        # Operations the broker does not implement (here receive-by-sequence-number) are
        # answered with status 501, and the management node keeps working.
        with pytest.raises(ServiceBusError):
            await receiver.receive_deferred_messages([1])
        assert len(await receiver.peek_messages(max_message_count=10, sequence_number=1)) == 6
        messages = await receive_n(receiver, 5)
        for message in messages:
            await receiver.complete_message(message)
