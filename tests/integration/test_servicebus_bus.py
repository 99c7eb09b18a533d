"""The Service Bus adapter against the local broker, through the real SDK: batches per
queue, the sender pool under concurrency, the one retry and BusUnavailable; a worker's
links opened as it starts."""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta

import pytest
from azure.servicebus import ServiceBusReceivedMessage, ServiceBusSubQueue
from azure.servicebus.aio import ServiceBusClient

from devhost.broker import Broker
from shared.adapters.queues import destination_of
from shared.adapters.servicebus_bus import (
    CLIENT_RETRIES,
    POISON_BODY_LIMIT,
    SENDERS_PER_QUEUE,
    ServiceBusMessageBus,
)
from shared.bootstrap import Ports, build, opened_at_start
from shared.contract import PoisonProperty, Queue, Setting
from shared.domain.messages import AgentRequest
from shared.domain.model import Action, Outgoing
from shared.ports import BusUnavailable, Poison
from shared.settings import Settings
from tests.broker.helpers import body_of, connect, receive_n
from tests.waiting import eventually
from tests.workflows import CATALOGUE

pytestmark = pytest.mark.broker


@pytest.fixture
def broker() -> Iterator[Broker]:
    broker = Broker(control_port=None).start()
    yield broker
    broker.stop()


@pytest.fixture
async def bus(broker: Broker) -> AsyncIterator[ServiceBusMessageBus]:
    bus = ServiceBusMessageBus.from_connection_string(broker.connection_string)
    yield bus
    await bus.close()


def message(queue: str, message_id: str, deliver_at: datetime | None = None) -> Outgoing:
    return Outgoing(destination_of(queue), message_id, {"orderId": message_id, "n": 1}, deliver_at)


async def received(broker: Broker, queue: str, count: int, timeout: float = 10) -> list[str]:
    async with (
        connect(broker.connection_string) as client,
        client.get_queue_receiver(queue) as receiver,
    ):
        got = await receive_n(receiver, count, timeout)
        for m in got:
            await receiver.complete_message(m)
        return [str(m.message_id) for m in got]


async def test_a_calls_messages_go_as_one_batch_per_queue_in_order(
    broker: Broker, bus: ServiceBusMessageBus
) -> None:
    later = datetime.now(UTC) + timedelta(seconds=2)
    await bus.send(
        [
            message(Queue.ORDER_STATUS, "s-1"),
            message(Queue.SCHEDULER, "n-1", deliver_at=later),
            message(Queue.ORDER_STATUS, "s-2"),
            message(Queue.ORDER_STATUS, "s-3"),
        ]
    )
    assert bus.sent == 4 and bus.transfers == 2
    assert await received(broker, Queue.ORDER_STATUS, 3) == ["s-1", "s-2", "s-3"]
    async with (
        connect(broker.connection_string) as client,
        client.get_queue_receiver(Queue.SCHEDULER) as receiver,
    ):
        [nudge] = await receive_n(receiver, 1, timeout=10)
        assert nudge.scheduled_enqueue_time_utc is not None
        assert abs(nudge.scheduled_enqueue_time_utc - later) < timedelta(milliseconds=2)
        assert nudge.enqueued_time_utc is not None
        assert nudge.enqueued_time_utc >= later - timedelta(milliseconds=2)
        assert nudge.message_id == "n-1"
        assert json.loads(body_of(nudge)) == {"orderId": "n-1", "n": 1}
        assert nudge.content_type == "application/json"
        assert nudge.application_properties == {b"orderId": b"n-1"}
        await receiver.complete_message(nudge)


async def test_concurrent_senders_share_a_few_links_and_keep_each_calls_order(
    broker: Broker, bus: ServiceBusMessageBus
) -> None:
    calls = 120
    await asyncio.gather(
        *(
            bus.send(
                [
                    message(Queue.AGENT_REPLIES, f"{i:03d}-a"),
                    message(Queue.AGENT_REPLIES, f"{i:03d}-b"),
                ]
            )
            for i in range(calls)
        )
    )
    assert bus.sent == 2 * calls
    assert bus.transfers < calls  # callers that found every link busy rode one transfer
    assert 1 <= bus.open_links()[Queue.AGENT_REPLIES] <= SENDERS_PER_QUEUE
    ids = await received(broker, Queue.AGENT_REPLIES, 2 * calls)
    assert sorted(ids) == sorted(f"{i:03d}-{s}" for i in range(calls) for s in "ab")
    for i in range(calls):
        assert ids.index(f"{i:03d}-a") + 1 == ids.index(f"{i:03d}-b")


async def test_calls_that_share_a_transfer_keep_each_messages_id_and_scheduled_time(
    broker: Broker,
) -> None:
    """One link, many callers: they ride few transfers, and the broker still sees each
    message as its own: its id (a resent call is dropped as duplicates, message by
    message), its properties and its scheduled time."""
    client = ServiceBusClient.from_connection_string(broker.connection_string, **CLIENT_RETRIES)
    bus = ServiceBusMessageBus(client, senders_per_queue=1)
    later = datetime.now(UTC) + timedelta(seconds=2)
    calls = [
        [
            message(Queue.SCHEDULER, f"c{i:02d}-now"),
            message(Queue.SCHEDULER, f"c{i:02d}-later", deliver_at=later),
        ]
        for i in range(40)
    ]
    try:
        await asyncio.gather(*(bus.send(call) for call in calls))
        first = bus.transfers
        await asyncio.gather(*(bus.send(call) for call in calls[::2]))  # resent: all dropped
    finally:
        await bus.close()
    assert first < len(calls) and bus.sent == 80 + 40
    async with (
        connect(broker.connection_string) as client,
        client.get_queue_receiver(Queue.SCHEDULER) as receiver,
    ):
        got = await receive_n(receiver, 81, timeout=6)
        for m in got:
            await receiver.complete_message(m)
    ids = [str(m.message_id) for m in got]
    assert sorted(ids) == sorted(m.message_id for call in calls for m in call)
    for m in got:
        assert json.loads(body_of(m)) == {"orderId": m.message_id, "n": 1}
        assert m.application_properties == {b"orderId": str(m.message_id).encode()}
        if str(m.message_id).endswith("-later"):
            assert m.scheduled_enqueue_time_utc is not None
            assert abs(m.scheduled_enqueue_time_utc - later) < timedelta(milliseconds=2)
            assert m.enqueued_time_utc is not None
            assert m.enqueued_time_utc >= later - timedelta(milliseconds=2)
    assert ids.index("c00-now") < ids.index("c00-later")


async def test_lasting_contention_grows_the_pool_to_its_size_and_no_further(
    bus: ServiceBusMessageBus,
) -> None:
    deadline = time.monotonic() + 30
    rounds = 0
    while time.monotonic() < deadline:
        await asyncio.gather(
            *(bus.send([message(Queue.ORDER_STATUS, f"g-{rounds}-{i}")]) for i in range(32))
        )
        rounds += 1
        assert bus.open_links()[Queue.ORDER_STATUS] <= SENDERS_PER_QUEUE
        if bus.open_links()[Queue.ORDER_STATUS] == SENDERS_PER_QUEUE:
            break
    assert bus.open_links()[Queue.ORDER_STATUS] == SENDERS_PER_QUEUE
    assert bus.sent == 32 * rounds


async def test_one_caller_at_a_time_reuses_one_link(bus: ServiceBusMessageBus) -> None:
    for i in range(5):
        await bus.send([message(Queue.ORDER_STATUS, f"one-{i}")])
    assert bus.open_links() == {Queue.ORDER_STATUS: 1}


async def test_a_lone_message_and_a_large_one_arrive_whole(
    broker: Broker, bus: ServiceBusMessageBus
) -> None:
    """One small message goes as itself, a large one through a batch; both keep their
    body, id, content type and properties, and a repeat of either is dropped."""
    large = Outgoing(
        destination_of(Queue.ORDER_STATUS), "big-1", {"orderId": "big-1", "pad": "x" * 100_000}
    )
    small = Outgoing(
        destination_of(Queue.ORDER_STATUS), "small-1", {"orderId": "small-1"}, properties={"k": "v"}
    )
    for outgoing in (small, large, small, large):
        await bus.send([outgoing])
    async with (
        connect(broker.connection_string) as client,
        client.get_queue_receiver(Queue.ORDER_STATUS) as receiver,
    ):
        got = await receive_n(receiver, 4, timeout=2)
        for m in got:
            await receiver.complete_message(m)
    assert [str(m.message_id) for m in got] == ["small-1", "big-1"]
    first, second = got
    assert json.loads(body_of(first)) == {"orderId": "small-1"}
    assert first.content_type == "application/json"
    assert first.application_properties == {b"orderId": b"small-1", b"k": b"v"}
    assert second.application_properties == {b"orderId": b"big-1"}
    assert json.loads(body_of(second))["pad"] == "x" * 100_000


async def test_a_value_stored_before_the_rule_goes_as_a_message_the_triggers_take(
    broker: Broker, bus: ServiceBusMessageBus
) -> None:
    """A compensation's payload carries the step's result, and an older version stored
    results with NaN (issue 41): sent as the token, the agent's trigger, which refuses
    it now, would dead-letter the undo. It goes as null, a lone surrogate as U+FFFD."""
    request = AgentRequest(
        order_id="o-old",
        step="charge-payment",
        action=Action.COMPENSATE,
        attempt=2,
        complete_by=datetime(2030, 1, 1, tzinfo=UTC),
        idempotency_key="o-old:refund-payment",
        payload={"result": {"fee": math.nan, "ref": "r-\ud800", "limits": [math.inf, 1.5]}},
        undoes="o-old:charge-payment",
    )
    await bus.send([request.outgoing("payment")])
    async with (
        connect(broker.connection_string) as client,
        client.get_queue_receiver("agent-payment") as receiver,
    ):
        (got,) = await receive_n(receiver, 1, timeout=10)
        await receiver.complete_message(got)
    taken = AgentRequest.parse(body_of(got))
    assert taken.payload == {"result": {"fee": None, "ref": "r-\ufffd", "limits": [None, 1.5]}}


async def test_a_resent_batch_is_dropped_by_duplicate_detection(
    broker: Broker, bus: ServiceBusMessageBus
) -> None:
    batch = [message(Queue.ORDER_STATUS, "d-1"), message(Queue.ORDER_STATUS, "d-2")]
    await bus.send(batch)
    await bus.send(batch)
    assert await received(broker, Queue.ORDER_STATUS, 4, timeout=2) == ["d-1", "d-2"]


async def test_a_dead_link_is_replaced_once_and_the_send_goes_through(broker: Broker) -> None:
    client = ServiceBusClient.from_connection_string(broker.connection_string, retry_total=0)
    bus = ServiceBusMessageBus(client)  # no SDK retries: the adapter's own one must do it
    await bus.send([message(Queue.ORDER_STATUS, "before")])
    port = broker.port
    broker.stop()
    again = Broker(port=port, control_port=None).start()
    try:
        await bus.send([message(Queue.ORDER_STATUS, "after")])
        assert await received(again, Queue.ORDER_STATUS, 1) == ["after"]
    finally:
        await bus.close()
        again.stop()


async def test_an_unreachable_broker_is_bus_unavailable(broker: Broker) -> None:
    # Without the SDK's own retries (seconds of back-off each) only the adapter's one is left.
    client = ServiceBusClient.from_connection_string(broker.connection_string, retry_total=0)
    bus = ServiceBusMessageBus(client)
    broker.stop()
    started = time.monotonic()
    try:
        with pytest.raises(BusUnavailable):
            await bus.send([message(Queue.ORDER_STATUS, "lost")])
        with pytest.raises(BusUnavailable):
            await bus.ping()
    finally:
        await bus.close()
    assert time.monotonic() - started < 30


async def parked(broker: Broker, queue: str, count: int) -> list[ServiceBusReceivedMessage]:
    """Drain the main queue (expired copies move on the way), then read the DLQ."""
    async with connect(broker.connection_string) as client:
        async with client.get_queue_receiver(queue, max_wait_time=1) as receiver:
            assert await receiver.receive_messages(max_wait_time=1) == []
        dlq = client.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER)
        async with dlq:
            got = await receive_n(dlq, count, 10)
            for m in got:
                await dlq.complete_message(m)
            return got


async def test_park_dead_letters_a_copy_with_the_reason(
    broker: Broker, bus: ServiceBusMessageBus
) -> None:
    await bus.park(Poison(Queue.SCHEDULER, "m-1", b"{oops", "invalid-message", "bad JSON"))
    (copy,) = await parked(broker, Queue.SCHEDULER, 1)
    props = {k.decode(): v for k, v in (copy.application_properties or {}).items()}  # type: ignore[union-attr]
    assert b"".join(copy.body) == b"{oops"
    assert props[PoisonProperty.COPY_OF] in ("m-1", b"m-1")
    assert props[PoisonProperty.REASON] in ("invalid-message", b"invalid-message")
    assert PoisonProperty.TRUNCATED_FROM not in props


async def test_park_cuts_a_body_too_large_to_travel_with_its_reason(
    broker: Broker, bus: ServiceBusMessageBus
) -> None:
    huge = b"x" * (250 * 1024)
    await bus.park(Poison(Queue.SCHEDULER, "m-2", huge, "invalid-message", "too large"))
    (copy,) = await parked(broker, Queue.SCHEDULER, 1)
    props = {k.decode(): v for k, v in (copy.application_properties or {}).items()}  # type: ignore[union-attr]
    assert len(b"".join(copy.body)) == POISON_BODY_LIMIT
    assert props[PoisonProperty.TRUNCATED_FROM] == len(huge)


async def test_concurrent_pings_each_get_the_brokers_answer(bus: ServiceBusMessageBus) -> None:
    """The Supervisor's checks ping at once; the first opens the ping's receiver while the
    others wait, and every one is a round trip, none a failure."""
    await asyncio.gather(*(bus.ping() for _ in range(20)))
    assert bus.failures == 0


async def test_closing_while_links_open_raises_nothing(broker: Broker) -> None:
    """A worker stops while handlers are opening links: the client closes once no link is
    opening (its close walks the set of links a failing open changes)."""
    for round_ in range(4):
        bus = ServiceBusMessageBus.from_connection_string(broker.connection_string)
        sends = [
            asyncio.ensure_future(bus.send([message(q, f"c{round_}-{q}")]))
            for q in (Queue.SCHEDULER, Queue.ORDERS, Queue.ORDER_STATUS, Queue.AGENT_REPLIES)
        ]
        await asyncio.sleep(0.02 * round_)  # the scenario: closes at several points of the opens
        await bus.close()
        answers = await asyncio.gather(*sends, return_exceptions=True)
        assert all(a is None or isinstance(a, BusUnavailable) for a in answers), answers


async def test_a_worker_opens_the_links_of_its_orders_queues_before_its_first_send(
    broker: Broker,
) -> None:
    """The first link to a queue opened under a burst took seconds, past a send's 10 s
    deadline (bench/README.md, "The first sends"): the composition root opens them at
    once, one per queue, and sends nothing."""
    built: list[Ports] = []

    def keep(ports: Ports) -> Ports:
        built.append(ports)
        return ports

    env = {
        Setting.STORAGE: "UseDevelopmentStorage=true",
        Setting.SERVICE_BUS: broker.connection_string,
    }
    container = build(Settings.from_env(env, catalogue=CATALOGUE), keep)
    try:
        (ports,) = built
        bus = ports.bus
        assert isinstance(bus, ServiceBusMessageBus)
        expected = dict.fromkeys(opened_at_start(CATALOGUE), 1)
        assert Queue.SCHEDULER in expected and Queue.ORDER_STATUS in expected
        await eventually("one link per queue", lambda: bus.open_links() == expected, 30)
        assert bus.sent == 0
    finally:
        await container.close()
