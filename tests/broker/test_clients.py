"""Several clients at once, the sync SDK, and what an unknown queue looks like to the SDK."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient as SyncServiceBusClient
from azure.servicebus import ServiceBusMessage, ServiceBusReceivedMessage
from azure.servicebus.aio import ServiceBusClient, ServiceBusReceiver
from azure.servicebus.exceptions import MessagingEntityNotFoundError, ServiceBusError

from devhost.broker import Broker

from .conftest import QUEUE, BrokerFactory
from .helpers import connect, open_sender, opened, receive_n

pytestmark = pytest.mark.broker

RECEIVERS = 4
MESSAGES = 120


async def test_competing_receivers_each_message_delivered_to_exactly_one(
    broker: Broker, client: ServiceBusClient
) -> None:
    receivers = [client.get_queue_receiver(QUEUE, prefetch_count=10) for _ in range(RECEIVERS)]
    await asyncio.gather(*(r.__aenter__() for r in receivers))
    held: list[list[ServiceBusReceivedMessage]] = [[] for _ in receivers]

    async def drain(index: int, receiver: ServiceBusReceiver) -> None:
        # Keep every lock until all messages are out, so a second delivery would be a bug.
        while sum(map(len, held)) < MESSAGES:
            held[index].extend(
                await receiver.receive_messages(max_message_count=10, max_wait_time=0.2)
            )

    try:
        async with open_sender(client, QUEUE) as sender:
            await asyncio.gather(
                *(drain(i, r) for i, r in enumerate(receivers)),
                *(
                    sender.send_messages(
                        [ServiceBusMessage(f"m{n}", message_id=f"{b}-{n}") for n in range(10)]
                    )
                    for b in range(MESSAGES // 10)
                ),
            )
        ids = Counter(m.message_id for batch in held for m in batch)
        assert len(ids) == MESSAGES
        assert set(ids.values()) == {1}
        assert sum(1 for batch in held if batch) > 1  # the work was actually shared
        stats = broker.stats()[QUEUE]
        assert (stats["locked"], stats["delivered"], stats["active"]) == (MESSAGES, MESSAGES, 0)
        await asyncio.gather(
            *(
                r.complete_message(m)
                for r, batch in zip(receivers, held, strict=True)
                for m in batch
            )
        )
    finally:
        await asyncio.gather(*(r.close() for r in receivers))
    assert broker.stats()[QUEUE]["completed"] == MESSAGES


async def test_unknown_queue_is_refused_with_entity_not_found(client: ServiceBusClient) -> None:
    started = time.monotonic()
    with pytest.raises(MessagingEntityNotFoundError):
        async with open_sender(client, "no-such-queue") as sender:
            await sender.send_messages(ServiceBusMessage("lost"))
    with pytest.raises(MessagingEntityNotFoundError):
        async with client.get_queue_receiver("no-such-queue") as receiver:
            await receiver.receive_messages(max_wait_time=1)
    assert time.monotonic() - started < 10


async def test_extra_queues_are_declared(make_broker: BrokerFactory) -> None:
    broker = make_broker(extra_queues=["test-extra"])
    async with (
        connect(broker.connection_string) as client,
        open_sender(client, "test-extra") as sender,
    ):
        await sender.send_messages(ServiceBusMessage("hi"))
    assert broker.stats()["test-extra"]["active"] == 1


def test_sync_sdk_send_receive_complete(broker: Broker) -> None:
    with SyncServiceBusClient.from_connection_string(broker.connection_string) as client:
        with client.get_queue_sender(QUEUE) as sender:
            sender.send_messages(ServiceBusMessage("sync", message_id="s-1"))
        with client.get_queue_receiver(QUEUE, max_wait_time=2) as receiver:
            [message] = receiver.receive_messages(max_message_count=1, max_wait_time=2)
            assert str(message) == "sync"
            assert message.message_id == "s-1"
            receiver.abandon_message(message)
            [again] = receiver.receive_messages(max_message_count=1, max_wait_time=2)
            assert again.delivery_count == 1
            receiver.complete_message(again)
    stats = broker.stats()[QUEUE]
    assert (stats["completed"], stats["abandoned"], stats["active"]) == (1, 1, 0)


async def test_an_error_on_one_link_closes_that_link_only(
    broker: Broker, client: ServiceBusClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    no_retry = ServiceBusClient.from_connection_string(broker.connection_string, retry_total=0)
    sender, receiver = open_sender(client, QUEUE), client.get_queue_receiver(QUEUE)
    failing = no_retry.get_queue_receiver(QUEUE)
    async with no_retry, opened(sender, receiver, failing):
        await sender.send_messages([ServiceBusMessage("a"), ServiceBusMessage("b")])
        with monkeypatch.context() as patch:
            patch.setattr(broker.engine, "take", _raise_once(broker.engine.take))
            with pytest.raises(ServiceBusError):
                await failing.receive_messages(max_message_count=1, max_wait_time=2)
        messages = await receive_n(receiver, 2)
        assert sorted(str(m) for m in messages) == ["a", "b"]
        for message in messages:
            await receiver.complete_message(message)
        await sender.send_messages(ServiceBusMessage("c"))  # the sender's link was unaffected
    assert broker.stats()[QUEUE]["completed"] == 2


def _raise_once(take: Callable[..., bytes | None]) -> Callable[..., bytes | None]:
    calls = 0

    def flaky(*args: Any) -> bytes | None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("injected broker bug")
        return take(*args)

    return flaky
