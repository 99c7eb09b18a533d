"""The sender pool's slots under contention: the longest waiting caller is served first;
and one call's queues go out together.

No broker: the links are stand-ins; what is tested is who gets a slot, and when."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from azure.servicebus.aio import ServiceBusClient
from azure.servicebus.exceptions import ServiceBusError

from shared.adapters.queues import destination_of
from shared.adapters.servicebus_bus import ServiceBusMessageBus, _SenderPool
from shared.domain.model import Outgoing
from shared.ports import BusUnavailable


async def _link(queue: str) -> Any:
    return object()


async def test_a_slot_given_back_goes_to_the_caller_waiting_not_to_one_arriving() -> None:
    """A caller that sends again as soon as its send ends must not pass one that waits:
    repeated, that kept a nudge waiting past the send's 10 s under a burst."""
    pool = _SenderPool("scheduler", 1, _link)
    served: list[str] = []

    async def waiter() -> None:
        async with pool.slot():
            served.append("waiter")

    async with pool.slot():
        served.append("busy")
        waiting = asyncio.create_task(waiter())
        await asyncio.sleep(0)  # it finds the only slot taken and waits
    async with pool.slot():  # given back, and asked for again at once
        served.append("busy again")
    await waiting
    assert served == ["busy", "waiter", "busy again"]


async def test_a_cancelled_waiter_leaves_the_line_and_loses_no_slot() -> None:
    pool = _SenderPool("scheduler", 1, _link)
    async with pool.slot():
        gone = asyncio.create_task(pool._acquire())
        await asyncio.sleep(0)
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
    async with asyncio.timeout(1), pool.slot() as slot:  # the slot came back
        assert slot == 0


async def test_a_waiter_cancelled_as_the_slot_is_handed_to_it_gives_it_back() -> None:
    pool = _SenderPool("scheduler", 1, _link)
    async with pool.slot():
        late = asyncio.create_task(pool._acquire())
        await asyncio.sleep(0)
    late.cancel()  # handed the slot, not yet resumed
    with pytest.raises(asyncio.CancelledError):
        await late
    async with asyncio.timeout(1), pool.slot() as slot:
        assert slot == 0


class _Sender:
    """A link that records what it sent; its queue's gate holds its sends until set."""

    def __init__(self, queue: str, client: _Client) -> None:
        self.queue, self.client = queue, client

    async def __aenter__(self) -> _Sender:
        return self

    async def send_messages(self, message: Any) -> None:
        self.client.started.add(self.queue)
        if self.client.together and self.client.started == set(self.client.gates):
            for gate in self.client.gates.values():
                gate.set()
        if self.queue in self.client.failing:
            raise ServiceBusError("refused")
        await self.client.gates[self.queue].wait()
        self.client.sent.append((self.queue, str(message.message_id)))

    async def close(self) -> None:
        pass


class _Client:
    def __init__(self, *queues: str) -> None:
        self.gates = {q: asyncio.Event() for q in queues}
        self.started: set[str] = set()
        self.failing: set[str] = set()
        self.together = False
        """Hold every send until each queue's has started."""
        self.sent: list[tuple[str, str]] = []

    def get_queue_sender(self, queue: str) -> _Sender:
        return _Sender(queue, self)

    async def close(self) -> None:
        pass


def _out(queue: str, message_id: str) -> Outgoing:
    return Outgoing(destination_of(queue), message_id, {"orderId": "o-1"})


async def test_one_calls_queues_are_sent_together_not_one_after_another() -> None:
    """Each queue's send is held until every queue's has started: sent one after the
    other, the call would never end."""
    client = _Client("agent-payment", "order-status")
    client.together = True
    bus = ServiceBusMessageBus(cast(ServiceBusClient, client), send_timeout=2)
    await bus.send([_out("agent-payment", "req"), _out("order-status", "st")])
    assert sorted(client.sent) == [("agent-payment", "req"), ("order-status", "st")]
    assert bus.sent == 2


async def test_a_failed_queue_fails_the_call_once_the_others_went() -> None:
    """The caller's outbox stays for a resend (which the broker dedupes for what went)."""
    client = _Client("agent-payment", "order-status")
    client.failing.add("order-status")
    client.gates["agent-payment"].set()
    bus = ServiceBusMessageBus(cast(ServiceBusClient, client), send_timeout=2)
    with pytest.raises(BusUnavailable, match="order-status"):
        await bus.send([_out("agent-payment", "req"), _out("order-status", "st")])
    assert client.sent == [("agent-payment", "req")]
    assert bus.failures == 1
