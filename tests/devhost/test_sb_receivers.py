"""The host's own AMQP connection hands a function the message the SDK's receiver would."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from collections.abc import Iterator
from datetime import timedelta

import pytest
from azure.servicebus import ServiceBusMessage, ServiceBusReceiveMode
from azure.servicebus.aio import ServiceBusClient
from proton._wrapper import Wrapper

from devhost.broker import Broker
from devhost.host.loader import HostConfig
from devhost.host.sb_connection import ConnectionInfo
from devhost.host.sb_links import Receivers, amqp_url
from devhost.host.sb_message import ReceivedMessage, from_sdk
from devhost.host.sb_proton import THREAD_NAME, ProtonLinks
from devhost.host.sb_sdk import SdkLinks
from tests.devhost.conftest import QUEUE, HostFactory, Recorder, build_app

pytestmark = pytest.mark.broker


@pytest.fixture
def broker() -> Iterator[Broker]:
    instance = Broker(port=0, db_path=None, control_port=None, extra_queues=[QUEUE])
    instance.start()
    yield instance
    instance.stop()


def rich_message() -> ServiceBusMessage:
    return ServiceBusMessage(
        b'{"orderId": "o-1"}',
        message_id="rich-1",
        content_type="application/json",
        correlation_id="corr-1",
        subject="the subject",
        to="someone",
        reply_to="replies",
        reply_to_session_id="reply-session",
        time_to_live=timedelta(minutes=5),
        application_properties={
            "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "count": 3,
            "flag": True,
            "raw": b"bytes",
        },
    )


def without_lock(message: ReceivedMessage) -> ReceivedMessage:
    return dataclasses.replace(message, lock_token=None, locked_until_utc=None)


async def test_both_clients_hand_over_the_same_message(broker: Broker) -> None:
    async with ServiceBusClient.from_connection_string(broker.connection_string) as client:
        async with client.get_queue_sender(QUEUE) as sender:
            await sender.send_messages(rich_message())

        links = ProtonLinks(f"amqp://127.0.0.1:{broker.port}", renewal_seconds=60)
        try:
            link = await links.open(QUEUE, 1, "test")
            (by_host,) = await link.receive(1, 10)
            await link.close()  # released: delivered again unchanged
        finally:
            await links.close()

        async with client.get_queue_receiver(
            QUEUE, receive_mode=ServiceBusReceiveMode.PEEK_LOCK
        ) as receiver:
            (received,) = await receiver.receive_messages(max_message_count=1, max_wait_time=10)
            by_sdk = from_sdk(received)
            await receiver.complete_message(received)

    assert by_host.message.lock_token and by_host.message.locked_until_utc
    assert without_lock(by_host.message) == without_lock(by_sdk)
    assert by_sdk.body == b'{"orderId": "o-1"}'
    assert by_sdk.application_properties["raw"] == "bytes"
    assert by_sdk.time_to_live == timedelta(minutes=5)
    assert by_sdk.host_delivery_count == 1


async def test_a_peer_that_is_not_devhosts_broker_gets_the_sdks_receiver(
    make_host: HostFactory, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The Service Bus emulator wants claims-based auth the host's connection does not do:
    a peer that does not name itself devhost's broker is received from with the SDK."""
    caplog.set_level(logging.INFO, logger="devhost")
    monkeypatch.setattr("devhost.broker.server.BROKER_CONTAINER", "the emulator")
    with Broker(port=0, db_path=None, control_port=None, extra_queues=[QUEUE]) as foreign:
        recorder = Recorder(expected=1)
        host = make_host(
            build_app(recorder, timer=False),
            {"TestBus": foreign.connection_string, "DevhostServiceBusReceiver": "host"},
        )
        await host.start()
        async with (
            ServiceBusClient.from_connection_string(foreign.connection_string) as client,
            client.get_queue_sender(QUEUE) as sender,
        ):
            await sender.send_messages(rich_message())
        await asyncio.wait_for(recorder.completed.wait(), 20)
        await host.stop()
        assert foreign.stats()[QUEUE]["completed"] == 1
    assert [m["id"] for m in recorder.messages] == ["rich-1"]
    assert any("is not devhost's broker" in r.getMessage() for r in caplog.records)


AZURE = "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=v"


async def test_the_local_broker_gets_the_hosts_connection_and_anything_else_the_sdk() -> None:
    receivers = Receivers({"DevhostServiceBusReceiver": "host"}, HostConfig())
    local = ConnectionInfo("Bus", connection_string=Broker(port=5999).connection_string)
    assert amqp_url(local) == "amqp://127.0.0.1:5999"
    assert isinstance(receivers.source(local), ProtonLinks)
    azure = ConnectionInfo("Azure", connection_string=AZURE)
    assert isinstance(receivers.source(azure), SdkLinks)
    identity = ConnectionInfo("Identity", namespace="ns.servicebus.windows.net")
    assert isinstance(receivers.source(identity), SdkLinks)
    forced = Receivers({"DevhostServiceBusReceiver": "sdk"}, HostConfig())
    assert isinstance(forced.source(local), SdkLinks)
    default = Receivers({}, HostConfig())
    assert isinstance(default.source(local), ProtonLinks), "the host's connection by default"
    await default.close()
    await receivers.close()
    await forced.close()


def host_thread_alive() -> bool:
    return any(thread.name == THREAD_NAME for thread in threading.enumerate())


async def test_no_proton_object_is_released_off_the_hosts_thread_while_it_runs(
    broker: Broker, make_host: HostFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """proton is not thread-safe, and a wrapper's release is an engine call: the last one
    of a settled delivery unlinks it from its link and pools it for the next transfer.
    Released on the app's loop while the host's thread took in transfers, that raced the
    engine (issue #25: a link that stopped taking messages with its window used up)."""
    app_thread = threading.get_ident()
    released: list[str] = []
    release = Wrapper.__del__

    def recorded(wrapper: Wrapper) -> None:
        if threading.get_ident() == app_thread and host_thread_alive():
            released.append(type(wrapper).__name__)
        release(wrapper)

    monkeypatch.setattr(Wrapper, "__del__", recorded)
    count = 20
    recorder = Recorder(expected=count)
    settings = {"TestBus": broker.connection_string, "DevhostServiceBusReceiver": "host"}
    host = make_host(build_app(recorder, timer=False), settings)
    await host.start()
    async with (
        ServiceBusClient.from_connection_string(broker.connection_string) as client,
        client.get_queue_sender(QUEUE) as sender,
    ):
        await sender.send_messages(
            [ServiceBusMessage(b"{}", message_id=f"m-{n}") for n in range(count)]
        )
    await asyncio.wait_for(recorder.completed.wait(), 20)
    await host.stop()
    assert not host_thread_alive()
    assert broker.stats()[QUEUE]["completed"] == count
    assert released == [], sorted(set(released))


async def test_an_open_given_up_before_the_connection_is_up_leaves_no_link(
    broker: Broker,
) -> None:
    """A trigger whose open timed out while the connection was still coming up opens a
    new link; the first one must not be attached later and take messages nobody reads."""
    async with (
        ServiceBusClient.from_connection_string(broker.connection_string) as client,
        client.get_queue_sender(QUEUE) as sender,
    ):
        await sender.send_messages([ServiceBusMessage(b"{}", message_id=f"m-{n}") for n in (1, 2)])
    links = ProtonLinks(f"amqp://127.0.0.1:{broker.port}", renewal_seconds=60)
    try:
        given_up = asyncio.ensure_future(links.open(QUEUE, 1, "test"))
        await asyncio.sleep(0)  # the attach is asked for; the connection is not up yet
        given_up.cancel()
        with pytest.raises(asyncio.CancelledError):
            await given_up
        link = await links.open(QUEUE, 1, "test")
        taken: list[str] = []
        async with asyncio.timeout(20):
            while len(taken) < 2:
                for delivered in await link.receive(1, 5):
                    taken.append(str(delivered.message.message_id))
                    await link.complete(delivered)
    finally:
        await links.close()
    assert sorted(taken) == ["m-1", "m-2"]
