"""Fixtures: a fresh in-process broker per test on free ports, driven only through the real SDK."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
from azure.servicebus.aio import ServiceBusClient

from devhost.broker import Broker

from .helpers import connect

QUEUE = "orders"

BrokerFactory = Callable[..., Broker]


@pytest.fixture
def make_broker() -> Iterator[BrokerFactory]:
    """Start brokers with per-test settings; every one is stopped at teardown."""
    started: list[Broker] = []

    def make(**kwargs: Any) -> Broker:
        broker = Broker(**kwargs).start()
        started.append(broker)
        return broker

    yield make
    for broker in started:
        broker.stop()


@pytest.fixture
def broker(make_broker: BrokerFactory) -> Broker:
    return make_broker()


@pytest.fixture
async def client(broker: Broker) -> AsyncIterator[ServiceBusClient]:
    async with connect(broker.connection_string) as sb:
        yield sb
