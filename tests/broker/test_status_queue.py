"""The load driver's client view of `order-status` against the local broker: every
notification is handed on once, in order, a malformed one is skipped, and the reader
returns once told to stop, also while no notification arrives."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime

from azure.servicebus import ServiceBusMessage
from azure.servicebus.aio import ServiceBusClient

from devhost.broker import Broker
from devhost.harness.load import StatusQueue
from shared.contract import Queue


async def test_every_notification_once_in_order_and_a_clean_stop(
    broker: Broker, client: ServiceBusClient
) -> None:
    seen: list[tuple[str, str, datetime | None]] = []
    all_seen = asyncio.Event()

    def on_event(order_id: str, status: str, at: datetime | None) -> None:
        seen.append((order_id, status, at))
        if len(seen) == 30:
            all_seen.set()

    stop = asyncio.Event()
    reader = StatusQueue(broker.connection_string)
    running = asyncio.create_task(reader.run(on_event, stop))
    bodies = [
        {"orderId": f"o-{i // 3}", "status": status, "at": "2026-11-27T00:00:00+00:00"}
        for i, status in enumerate(["Received", "Processing", "Processed"] * 10)
    ]
    async with client.get_queue_sender(Queue.ORDER_STATUS) as sender:
        await sender.send_messages(ServiceBusMessage(b"not json"))
        for body in bodies:
            await sender.send_messages(ServiceBusMessage(json.dumps(body)))
    await asyncio.wait_for(all_seen.wait(), 30)
    stop.set()
    await asyncio.wait_for(running, 30)
    assert [(o, s) for o, s, _ in seen] == [(b["orderId"], b["status"]) for b in bodies]
    assert all(at is not None and at.tzinfo is not None for _, _, at in seen)
    assert reader.received == 31
