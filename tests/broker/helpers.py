"""SDK helpers shared by the broker tests.

The SDK spends about 0.5 s opening each sender or receiver and up to a second closing one
(receivers wait for their keep-alive timer), so tests open and close their handlers concurrently.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from azure.servicebus import ServiceBusReceivedMessage
from azure.servicebus.aio import ServiceBusClient, ServiceBusReceiver, ServiceBusSender

Handler = ServiceBusSender | ServiceBusReceiver


def connect(connection_string: str) -> ServiceBusClient:
    # A short socket timeout shortens the idle cycles of the receiver's drain on close.
    return ServiceBusClient.from_connection_string(connection_string, socket_timeout=0.05)


def open_sender(client: ServiceBusClient, queue: str) -> ServiceBusSender:
    """A sender without the SDK's keep-alive task, whose 1 s sleep otherwise delays each close."""
    return client.get_queue_sender(queue, keep_alive=0)


@contextlib.asynccontextmanager
async def opened(*handlers: Handler) -> AsyncIterator[None]:
    await asyncio.gather(*(handler.__aenter__() for handler in handlers))
    try:
        yield
    finally:
        await asyncio.gather(*(handler.close() for handler in handlers))


@contextlib.asynccontextmanager
async def sender_and_receiver(
    client: ServiceBusClient, queue: str, **receiver_kwargs: Any
) -> AsyncIterator[tuple[ServiceBusSender, ServiceBusReceiver]]:
    sender = open_sender(client, queue)
    receiver = client.get_queue_receiver(queue, **receiver_kwargs)
    async with opened(sender, receiver):
        yield sender, receiver


async def receive_n(
    receiver: ServiceBusReceiver, count: int, timeout: float = 5.0
) -> list[ServiceBusReceivedMessage]:
    """Receive until ``count`` messages arrived or ``timeout`` passed (then return what came)."""
    got: list[ServiceBusReceivedMessage] = []
    deadline = time.monotonic() + timeout
    while len(got) < count:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        batch = await receiver.receive_messages(
            max_message_count=count - len(got), max_wait_time=min(left, 1.0)
        )
        got.extend(batch)
    return got


async def wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


def body_of(message: ServiceBusReceivedMessage) -> bytes:
    return b"".join(message.body)
