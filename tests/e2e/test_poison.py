"""Poison messages on the real broker: dead-lettered with a reason on the first delivery."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage, ServiceBusSubQueue
from azure.servicebus.aio import ServiceBusClient

from shared.contract import Queue
from tests.e2e.conftest import System

pytestmark = [pytest.mark.e2e, pytest.mark.azurite, pytest.mark.broker]


async def dead_letters(
    system: System, queue: str, expected: int, timeout: float = 20
) -> list[dict[str, Any]]:
    """Peek (never consume) the queue's dead-letter sub-queue until `expected` arrive.
    Each peek continues after the last message the receiver peeked."""
    found: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    async with ServiceBusClient.from_connection_string(system.broker.connection_string) as c:
        receiver = c.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER)
        async with receiver:
            while time.monotonic() < deadline:
                peeked = await receiver.peek_messages(max_message_count=50)
                found += [
                    {
                        "body": b"".join(m.body),
                        "reason": m.dead_letter_reason,
                        "props": {
                            (k.decode() if isinstance(k, bytes) else k): (
                                v.decode() if isinstance(v, bytes) else v
                            )
                            for k, v in (m.application_properties or {}).items()
                        },
                    }
                    for m in peeked
                ]
                if len(found) >= expected:
                    return found
                await asyncio.sleep(0.3)
    return found


async def send(system: System, queue: str, body: bytes, message_id: str) -> None:
    async with (
        ServiceBusClient.from_connection_string(system.broker.connection_string) as c,
        c.get_queue_sender(queue) as sender,
    ):
        await sender.send_messages(ServiceBusMessage(body, message_id=message_id))


async def test_poison_messages_are_dead_lettered_once_with_the_reason(system: System) -> None:
    await send(system, Queue.SCHEDULER, b"{not json", "poison-1")
    await send(system, Queue.SCHEDULER, b'{"orderId": "ghost-1"}', "poison-2")
    reply = {
        "orderId": "ghost-2",
        "step": "charge-payment",
        "action": "do",
        "attempt": 1,
        "outcome": "succeeded",
        "result": {},
    }
    await send(system, Queue.AGENT_REPLIES, json.dumps(reply).encode(), "poison-3")

    parked = await dead_letters(system, Queue.SCHEDULER, 2)
    by_id = {p["props"]["poisonCopyOf"]: p for p in parked}
    assert set(by_id) == {"poison-1", "poison-2"}
    assert by_id["poison-1"]["body"] == b"{not json"
    assert by_id["poison-1"]["props"]["poisonReason"] == "invalid-message"
    assert "Invalid JSON" in by_id["poison-1"]["props"]["poisonDetail"]
    assert by_id["poison-2"]["props"]["poisonReason"] == "unknown-order"
    assert all(p["props"]["originalDeliveryCount"] == 1 for p in parked)
    (reply_parked,) = await dead_letters(system, Queue.AGENT_REPLIES, 1)
    assert reply_parked["props"]["poisonReason"] == "unknown-order"

    alerts = await system.drain(Queue.OPERATOR_ALERTS, "ghost-1")
    assert [a["reason"] for a in alerts] == ["unknown-order"]
    # Nothing else: the originals are gone from their queues, no order was created.
    assert await dead_letters(system, Queue.SCHEDULER, 3, timeout=2) == parked
    async with system.session.get(f"{system.api}/orders?state=Pending") as r:
        assert (await r.json())["items"] == []
