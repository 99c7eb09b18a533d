"""The sender pool's slots under contention: the longest waiting caller is served first;
one call's queues go out together; callers that wait for a busy link ride one transfer,
and each learns that transfer's own outcome. Links: a queue's first before another's
growth, and the order queues' links opened early, before any send.

No broker: the links are stand-ins; what is tested is who gets a slot, and when, and who
is told what."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from azure.servicebus import ServiceBusMessage
from azure.servicebus.aio import ServiceBusClient
from azure.servicebus.amqp import AmqpAnnotatedMessage
from azure.servicebus.exceptions import MessageSizeExceededError, ServiceBusError

from shared.adapters.queues import destination_of
from shared.adapters.servicebus_bus import ServiceBusMessageBus, _Call, _SenderPool
from shared.domain.model import Outgoing
from shared.ports import BusUnavailable
from tests.waiting import eventually


async def _link(queue: str, first: bool = True) -> Any:
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
        gone = asyncio.create_task(pool._acquire(_Call([])))
        await asyncio.sleep(0)
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
    async with asyncio.timeout(1), pool.slot() as slot:  # the slot came back
        assert slot == 0


async def test_a_waiter_cancelled_as_the_slot_is_handed_to_it_gives_it_back() -> None:
    pool = _SenderPool("scheduler", 1, _link)
    async with pool.slot():
        late = asyncio.create_task(pool._acquire(_Call([])))
        await asyncio.sleep(0)
    late.cancel()  # handed the slot, not yet resumed
    with pytest.raises(asyncio.CancelledError):
        await late
    async with asyncio.timeout(1), pool.slot() as slot:
        assert slot == 0


def _id(message: ServiceBusMessage | AmqpAnnotatedMessage) -> str:
    if isinstance(message, AmqpAnnotatedMessage):
        assert message.properties is not None
        return str(message.properties.message_id)
    return str(message.message_id)


class _Batch:
    """What a link's `create_message_batch` gives: messages up to a size, by body length."""

    def __init__(self, max_size: int) -> None:
        self.max_size = max_size
        self.ids: list[str] = []
        self.size = 0

    def add_message(self, message: ServiceBusMessage | AmqpAnnotatedMessage) -> None:
        size = len(str(message))
        if self.size + size > self.max_size:
            raise MessageSizeExceededError(message="too large for the batch")
        self.ids.append(_id(message))
        self.size += size

    def __len__(self) -> int:
        return len(self.ids)


class _Sender:
    """A link that records what it sent, one list of ids per transfer; its queue's gate
    holds its sends until set."""

    def __init__(self, queue: str, client: _Client) -> None:
        self.queue, self.client = queue, client

    async def __aenter__(self) -> _Sender:
        self.client.opened.append(self.queue)
        if self.client.open_gate is not None:
            await self.client.open_gate.wait()
        if self.client.refuse_opens:
            raise ServiceBusError("no link")
        return self

    async def create_message_batch(self) -> _Batch:
        return _Batch(self.client.max_size)

    async def send_messages(self, message: Any) -> None:
        self.client.started.add(self.queue)
        if self.client.together and self.client.started == set(self.client.gates):
            for gate in self.client.gates.values():
                gate.set()
        if self.queue in self.client.failing:
            raise ServiceBusError("refused")
        await self.client.gates[self.queue].wait()
        ids = message.ids if isinstance(message, _Batch) else [_id(message)]
        self.client.transfers.append(ids)
        self.client.sent.extend((self.queue, i) for i in ids)

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
        self.transfers: list[list[str]] = []
        self.max_size = 64 * 1024
        self.opened: list[str] = []
        """Each link's queue as its open began (opens take turns: the order of turns)."""
        self.open_gate: asyncio.Event | None = None
        """When set to an event, every open waits for it."""
        self.refuse_opens = False

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


def _one_link(client: _Client) -> ServiceBusMessageBus:
    return ServiceBusMessageBus(cast(ServiceBusClient, client), senders_per_queue=1, send_timeout=2)


async def _in_line(bus: ServiceBusMessageBus, queue: str, callers: int) -> None:
    await eventually(
        f"{callers} callers in line", lambda: len(bus._pool(queue)._line) == callers, 1, 0.001
    )


async def test_callers_waiting_for_a_busy_link_ride_one_transfer_in_the_order_they_came() -> None:
    client = _Client("order-status")
    bus = _one_link(client)
    first = asyncio.create_task(bus.send([_out("order-status", "first")]))
    await asyncio.sleep(0)
    rest = [
        asyncio.create_task(
            bus.send([_out("order-status", f"{n}-1"), _out("order-status", f"{n}-2")])
        )
        for n in "abc"
    ]
    await _in_line(bus, "order-status", 3)
    client.gates["order-status"].set()
    await asyncio.gather(first, *rest)
    assert client.transfers == [["first"], ["a-1", "a-2", "b-1", "b-2", "c-1", "c-2"]]
    assert bus.transfers == 2 and bus.sent == 7 and bus.failures == 0


async def test_a_failed_transfer_fails_every_caller_it_carried() -> None:
    """None of them is told its message went: each keeps its outbox for a resend."""
    client = _Client("order-status")
    bus = _one_link(client)
    first = asyncio.create_task(bus.send([_out("order-status", "first")]))
    await asyncio.sleep(0)
    rest = [asyncio.create_task(bus.send([_out("order-status", n)])) for n in "abc"]
    await _in_line(bus, "order-status", 3)
    client.failing.add("order-status")  # the transfer under way is past the check
    client.gates["order-status"].set()
    await first
    outcomes = await asyncio.gather(*rest, return_exceptions=True)
    assert all(isinstance(o, BusUnavailable) for o in outcomes), outcomes
    assert len({id(o) for o in outcomes}) == 3
    assert client.sent == [("order-status", "first")]
    assert bus.failures == 3


async def test_a_carrier_cut_off_mid_transfer_fails_the_callers_it_carried() -> None:
    """Whether the broker took the transfer is unknown: the riders are told it failed,
    at once, not left waiting for an answer that will not come."""
    client = _Client("order-status")
    bus = _one_link(client)
    first = asyncio.create_task(bus.send([_out("order-status", "first")]))
    await asyncio.sleep(0)
    carrier = asyncio.create_task(bus.send([_out("order-status", "carrier")]))
    await _in_line(bus, "order-status", 1)
    rider = asyncio.create_task(bus.send([_out("order-status", "rider")]))
    await _in_line(bus, "order-status", 2)
    first.cancel()  # the link comes back to the carrier, which takes the rider along
    await _in_line(bus, "order-status", 0)
    carrier.cancel()
    async with asyncio.timeout(1):
        with pytest.raises(BusUnavailable, match="cut off"):
            await rider
    for task in (first, carrier):
        with pytest.raises(asyncio.CancelledError):
            await task
    assert client.sent == []


async def test_a_message_too_large_fails_its_caller_only() -> None:
    client = _Client("order-status")
    client.max_size = 400
    bus = _one_link(client)
    first = asyncio.create_task(bus.send([_out("order-status", "first")]))
    await asyncio.sleep(0)
    small = asyncio.create_task(bus.send([_out("order-status", "small")]))
    huge = Outgoing(destination_of("order-status"), "huge", {"orderId": "o-1", "x": "y" * 1000})
    large = asyncio.create_task(bus.send([huge]))
    after = asyncio.create_task(bus.send([_out("order-status", "after")]))
    await _in_line(bus, "order-status", 3)
    client.gates["order-status"].set()
    await asyncio.gather(first, small, after)
    with pytest.raises(BusUnavailable, match="order-status"):
        await large
    assert client.transfers == [["first"], ["small", "after"]]
    assert bus.failures == 1


async def test_a_caller_that_gives_up_in_line_is_not_carried() -> None:
    client = _Client("order-status")
    bus = _one_link(client)
    first = asyncio.create_task(bus.send([_out("order-status", "first")]))
    await asyncio.sleep(0)
    gone = asyncio.create_task(bus.send([_out("order-status", "gone")]))
    kept = asyncio.create_task(bus.send([_out("order-status", "kept")]))
    await _in_line(bus, "order-status", 2)
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    client.gates["order-status"].set()
    await asyncio.gather(first, kept)
    assert client.transfers == [["first"], ["kept"]]


def _opening(client: _Client, *queues: str) -> _Client:
    client.open_gate = asyncio.Event()
    for gate in client.gates.values():
        gate.set()
    return client


async def test_a_queues_first_link_opens_before_another_queues_further_ones() -> None:
    """A nudge to a queue nobody had sent to waited behind every busy queue's growth, each
    open taking seconds under load, until its send's deadline passed."""
    client = _opening(_Client("agent-payment", "scheduler"))
    bus = ServiceBusMessageBus(cast(ServiceBusClient, client), senders_per_queue=2, send_timeout=2)
    busy = asyncio.create_task(bus.send([_out("agent-payment", "p-1")]))
    await eventually("the first open", lambda: client.opened == ["agent-payment"], 1, 0.001)
    more = asyncio.create_task(bus.send([_out("agent-payment", "p-2")]))
    await eventually("a growth waiting", lambda: len(bus._opens._more) == 1, 1, 0.001)
    nudge = asyncio.create_task(bus.send([_out("scheduler", "n-1")]))
    await eventually("a first link waiting", lambda: len(bus._opens._first) == 1, 1, 0.001)
    client.open_gate.set()  # type: ignore[union-attr]
    await asyncio.gather(busy, more, nudge)
    assert client.opened == ["agent-payment", "scheduler", "agent-payment"]
    assert sorted(client.sent) == [
        ("agent-payment", "p-1"),
        ("agent-payment", "p-2"),
        ("scheduler", "n-1"),
    ]


async def test_links_open_early_one_per_queue_and_a_send_meanwhile_waits_for_its_queues() -> None:
    client = _opening(_Client("scheduler", "order-status"))
    bus = _one_link(client)
    bus.open_early(["scheduler", "order-status"])
    await eventually("scheduler's link opening", lambda: client.opened == ["scheduler"], 1, 0.001)
    nudge = asyncio.create_task(bus.send([_out("scheduler", "n-1")]))
    await _in_line(bus, "scheduler", 1)
    client.open_gate.set()  # type: ignore[union-attr]
    await nudge
    expected = {"scheduler": 1, "order-status": 1}
    await eventually("each queue's link", lambda: bus.open_links() == expected, 1, 0.001)
    assert client.opened == ["scheduler", "order-status"]
    assert client.sent == [("scheduler", "n-1")]


async def test_a_link_refused_early_is_opened_by_the_first_send() -> None:
    client = _opening(_Client("scheduler"))
    client.refuse_opens = True
    client.open_gate.set()  # type: ignore[union-attr]
    bus = _one_link(client)
    bus.open_early(["scheduler"])
    await eventually("the early open tried", lambda: client.opened == ["scheduler"], 1, 0.001)
    client.refuse_opens = False
    await bus.send([_out("scheduler", "n-1")])
    assert client.opened == ["scheduler", "scheduler"]
    assert client.sent == [("scheduler", "n-1")]


async def test_closing_while_an_early_link_hangs_ends_at_once() -> None:
    client = _opening(_Client("scheduler"))
    bus = _one_link(client)
    bus.open_early(["scheduler"])
    await eventually("the early open hanging", lambda: client.opened == ["scheduler"], 1, 0.001)
    async with asyncio.timeout(1):
        await bus.close()
    assert bus.open_links() == {"scheduler": 0}
