"""Every Service Bus and Table call ends in bounded time with the port's error: against a
port nothing listens on (a killed broker or Azurite) and against a listener that accepts
the connection and never says a word (a stopped process), where the SDKs alone would wait
for minutes or for ever. Afterwards the bus works again on a broker that answers."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from devhost.broker import Broker
from devhost.harness.ports import LOOPBACK, free_port
from devhost.harness.services import service_bus_connection_string
from shared.adapters.queues import destination_of
from shared.adapters.servicebus_bus import PING_TIMEOUT, ServiceBusMessageBus
from shared.adapters.table import client as table_client
from shared.adapters.table.client import table_service_client
from shared.adapters.table.health import TableHealthStore
from shared.adapters.table.store import TableStateStore
from shared.domain.model import Outgoing
from shared.ports import BusUnavailable, StoreUnavailable
from shared.settings import azurite_connection_string

NUDGE = Outgoing(destination_of("scheduler"), "m-1", {"orderId": "o-1", "reason": "submitted"})


@pytest.fixture
def silent_port() -> Iterator[int]:
    """Accepts connections (the kernel's backlog) and never reads or answers."""
    with socket.socket() as listener:
        listener.bind((LOOPBACK, 0))
        listener.listen(16)
        yield listener.getsockname()[1]


async def test_a_silent_broker_fails_ping_and_send_within_their_timeouts(
    silent_port: int,
) -> None:
    bus = ServiceBusMessageBus.from_connection_string(
        service_bus_connection_string(silent_port), send_timeout=1.0
    )
    try:
        begun = time.monotonic()
        with pytest.raises(BusUnavailable, match="no answer within 2 s"):
            await bus.ping()
        assert time.monotonic() - begun < PING_TIMEOUT + 0.5
        begun = time.monotonic()
        with pytest.raises(BusUnavailable, match="send to scheduler failed: no answer within 1 s"):
            await bus.send([NUDGE])
        assert time.monotonic() - begun < 1.5
        assert bus.open_links() == {"scheduler": 0}
    finally:
        begun = time.monotonic()
        await bus.close()
        assert time.monotonic() - begun < 6


async def test_a_killed_broker_fails_a_send_in_about_a_second() -> None:
    bus = ServiceBusMessageBus.from_connection_string(service_bus_connection_string(free_port()))
    try:
        begun = time.monotonic()
        with pytest.raises(BusUnavailable, match="send to scheduler failed"):
            await bus.send([NUDGE])
        assert time.monotonic() - begun < 2.5
    finally:
        await bus.close()


@pytest.mark.broker
async def test_the_bus_sends_again_once_the_broker_is_back() -> None:
    port = free_port()
    bus = ServiceBusMessageBus.from_connection_string(service_bus_connection_string(port))
    try:
        with pytest.raises(BusUnavailable):
            await bus.send([NUDGE])
        broker = Broker(port=port, control_port=None).start()
        try:
            await bus.send([NUDGE])
            assert broker.stats()["scheduler"]["active"] == 1
        finally:
            broker.stop()
    finally:
        await bus.close()


async def test_a_killed_table_service_fails_a_call_at_once() -> None:
    service = table_service_client(connection_string=azurite_connection_string(free_port()))
    async with service:
        store = TableStateStore(service, "Orders")
        begun = time.monotonic()
        with pytest.raises(StoreUnavailable):
            await store.load("o-1")
        assert time.monotonic() - begun < 1.5


async def test_a_silent_table_service_fails_within_two_read_timeouts(
    silent_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(table_client, "READ_TIMEOUT", 0.5)
    service = table_service_client(connection_string=azurite_connection_string(silent_port))
    async with service:
        health = TableHealthStore(service, "Orders")
        begun = time.monotonic()
        with pytest.raises(StoreUnavailable):
            await health.agent_health()
        assert time.monotonic() - begun < 2 * 0.5 + 1.5
        await health.close()


def test_a_table_client_needs_somewhere_to_go() -> None:
    with pytest.raises(ValueError, match="connection string or an endpoint"):
        table_service_client()
