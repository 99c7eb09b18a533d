"""Fault injection (duplicate, drop, delay) and the HTTP control API that switches it."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from azure.servicebus import ServiceBusMessage
from azure.servicebus.aio import ServiceBusClient

from devhost.broker import Broker, FaultConfig

from .conftest import QUEUE
from .helpers import connect, open_sender, receive_n, sender_and_receiver

pytestmark = pytest.mark.broker

COUNT = 40


@pytest.fixture
async def http(broker: Broker) -> AsyncIterator[aiohttp.ClientSession]:
    base = f"http://127.0.0.1:{broker.control_port}"
    async with aiohttp.ClientSession(base_url=base) as session:
        yield session


async def _send_all(client: ServiceBusClient, count: int = COUNT) -> None:
    async with open_sender(client, QUEUE) as sender:
        await sender.send_messages(
            [ServiceBusMessage(f"m{i}", message_id=f"id-{i}") for i in range(count)]
        )


async def test_duplicate_fault_delivers_some_messages_twice(
    broker: Broker, client: ServiceBusClient
) -> None:
    broker.set_faults(duplicate_rate=0.5, seed=7)
    async with sender_and_receiver(client, QUEUE) as (sender, receiver):
        await sender.send_messages(
            [ServiceBusMessage(f"m{i}", message_id=f"id-{i}") for i in range(COUNT)]
        )
        duplicated = broker.stats()[QUEUE]["duplicated"]
        assert 0 < duplicated < COUNT
        messages = await receive_n(receiver, COUNT + duplicated)
        for message in messages:
            await receiver.complete_message(message)
    counts = Counter(m.message_id for m in messages)
    assert set(counts) == {f"id-{i}" for i in range(COUNT)}
    assert sum(1 for n in counts.values() if n == 2) == duplicated
    assert broker.stats()[QUEUE]["active"] == 0


async def test_drop_fault_accepts_but_loses_messages(
    broker: Broker, client: ServiceBusClient
) -> None:
    broker.set_faults({"dropRate": 0.5, "seed": 3})
    await _send_all(client)
    stats = broker.stats()[QUEUE]
    assert 0 < stats["dropped"] < COUNT
    assert stats["sent"] == COUNT
    assert stats["active"] == COUNT - stats["dropped"]


async def test_delay_fault_makes_messages_visible_later(
    broker: Broker, client: ServiceBusClient
) -> None:
    broker.set_faults(delay_rate=1.0, delay_ms=300, queues=[QUEUE])
    async with sender_and_receiver(client, QUEUE) as (sender, receiver):
        sent_at = time.monotonic()
        await sender.send_messages(ServiceBusMessage("slow"))
        stats = broker.stats()[QUEUE]
        assert (stats["delayed"], stats["scheduled"], stats["active"]) == (1, 1, 0)
        [message] = await receive_n(receiver, 1, timeout=3)
        assert time.monotonic() - sent_at >= 0.28
        await receiver.complete_message(message)


async def test_faults_only_hit_the_listed_queues(broker: Broker, client: ServiceBusClient) -> None:
    broker.set_faults(drop_rate=1.0, queues=["scheduler"])
    await _send_all(client, 5)
    assert broker.stats()[QUEUE]["dropped"] == 0
    assert broker.stats()[QUEUE]["active"] == 5


async def test_same_seed_gives_same_faults(make_broker: Any) -> None:
    outcomes = []
    for _ in range(2):
        broker = make_broker(faults={"dropRate": 0.3, "duplicateRate": 0.3, "seed": 11})
        async with connect(broker.connection_string) as client:
            await _send_all(client, 20)
        stats = broker.stats()[QUEUE]
        outcomes.append((stats["dropped"], stats["duplicated"], stats["active"]))
    assert outcomes[0] == outcomes[1]


async def test_control_api_sets_reads_and_clears_faults(
    broker: Broker, http: aiohttp.ClientSession
) -> None:
    body = {
        "duplicateRate": 0.25,
        "dropRate": 0,
        "delayRate": 0.5,
        "delayMs": 100,
        "queues": [QUEUE],
    }
    async with http.put("/_broker/faults", json=body) as response:
        assert response.status == 200
        assert (await response.json())["duplicateRate"] == 0.25
    assert broker.faults == FaultConfig(
        duplicate_rate=0.25, delay_rate=0.5, delay_ms=100, queues=frozenset([QUEUE])
    )
    async with http.get("/_broker/faults") as response:
        got = await response.json()
        assert (got["delayMs"], got["queues"]) == (100, [QUEUE])
    async with http.delete("/_broker/faults") as response:
        assert response.status == 204
    assert broker.faults == FaultConfig()


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ({"dropRate": 1.5}, "dropRate"),
        ({"delayMs": -1}, "delayMs"),
        ({"duplicateRate": "high"}, "duplicateRate"),
        ({"queues": ["nope"]}, "nope"),
        ({"surprise": 1}, "surprise"),
        ([1, 2], "object"),
    ],
)
async def test_control_api_rejects_bad_fault_config_with_problem_json(
    broker: Broker, http: aiohttp.ClientSession, body: Any, problem: str
) -> None:
    async with http.put("/_broker/faults", json=body) as response:
        assert response.status == 400
        assert response.content_type == "application/problem+json"
        detail = await response.json(content_type=None)
        assert detail["status"] == 400
        assert problem in detail["detail"]
    assert broker.faults == FaultConfig()


async def test_control_api_rejects_malformed_json(http: aiohttp.ClientSession) -> None:
    async with http.put("/_broker/faults", data=b"{not json") as response:
        assert response.status == 400
        assert response.content_type == "application/problem+json"


async def test_control_api_stats_match_broker_stats(
    broker: Broker, client: ServiceBusClient, http: aiohttp.ClientSession
) -> None:
    await _send_all(client, 3)
    async with http.get("/_broker/stats") as response:
        stats = await response.json()
    assert stats == broker.stats()
    assert stats[QUEUE]["active"] == 3
    assert set(stats[QUEUE]) == {
        "active",
        "scheduled",
        "locked",
        "deadLettered",
        "sent",
        "delivered",
        "completed",
        "abandoned",
        "duplicatesSuppressed",
        "dropped",
        "duplicated",
        "delayed",
    }
