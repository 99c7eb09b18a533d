"""Trigger receivers on the ``azure-servicebus`` aio SDK: for any broker that is not
devhost's own (the Service Bus emulator, a namespace in Azure), or when
``DevhostServiceBusReceiver=sdk`` asks for it.

The SDK's pure-Python AMQP costs several times the CPU per message of the host's own
connection (``sb_proton``); the workarounds below keep its latency and correctness.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from azure.servicebus import ServiceBusReceiveMode
from azure.servicebus.aio import AutoLockRenewer, ServiceBusClient, ServiceBusReceiver

from devhost.host.loader import HostConfig
from devhost.host.sb_links import Delivered
from devhost.host.sb_message import from_sdk

log = logging.getLogger("devhost.servicebus")

FURTHER_PULL_SECONDS = 0.01
SOCKET_TIMEOUT_SECONDS = 0.02


class SdkLinks:
    """Receivers on one shared ``ServiceBusClient``."""

    def __init__(self, client: ServiceBusClient, config: HostConfig) -> None:
        self._client = client
        self._prefetch = config.prefetch_count
        self._renewal_seconds = config.max_auto_lock_renewal_seconds

    async def open(self, queue: str, window: int, function: str) -> SdkLink:
        receiver = self._client.get_queue_receiver(
            queue_name=queue,
            receive_mode=ServiceBusReceiveMode.PEEK_LOCK,
            prefetch_count=self._prefetch,
            socket_timeout=SOCKET_TIMEOUT_SECONDS,
        )
        serialize_lock_renewals(receiver)
        # After the first message of a batch the SDK keeps reading for more, 200 ms
        # in socket-timeout steps; with handler slots free that is pure latency on
        # every hop (measured: 200 ms a hop, 25 ms with these two settings).
        receiver._further_pull_receive_timeout = FURTHER_PULL_SECONDS
        link = SdkLink(receiver, queue, function, self._renewal_seconds)
        try:
            # Opened here, not by the first receive, which would give the link only the
            # receive's wait: a dozen links opening at once on a loaded machine overran it.
            await receiver.__aenter__()
        except BaseException:
            await link.close()
            raise
        return link

    async def close(self) -> None:
        """The client is the pool's to close."""


class SdkLink:
    def __init__(
        self, receiver: ServiceBusReceiver, queue: str, function: str, renewal_seconds: float
    ) -> None:
        self._receiver = receiver
        self._queue = queue
        self._function = function
        self._renewer = AutoLockRenewer(
            max_lock_renewal_duration=renewal_seconds,
            on_lock_renew_failure=self._lock_renew_failed,
        )

    async def receive(self, max_count: int, wait: float) -> list[Delivered]:
        wait_for_first_message(self._receiver, wait)
        batch = await self._receiver.receive_messages(
            max_message_count=max_count, max_wait_time=wait
        )
        for message in batch:
            # A broker that reports no lock expiry has nothing to renew.
            if message.locked_until_utc is not None:
                self._renewer.register(self._receiver, message)
        return [Delivered(from_sdk(message), message) for message in batch]

    async def complete(self, delivered: Delivered) -> None:
        await self._receiver.complete_message(delivered.handle)

    async def abandon(self, delivered: Delivered) -> None:
        await self._receiver.abandon_message(delivered.handle)

    async def close(self) -> None:
        """The SDK drains the link on close: what it holds is released, not left locked."""
        try:
            await self._receiver.close()
        finally:
            await self._renewer.close()

    async def _lock_renew_failed(self, renewable: Any, error: Exception | None) -> None:
        if error is not None:
            log.warning(
                "%s: lock renewal for message %s on %s failed: %s",
                self._function,
                getattr(renewable, "message_id", "?"),
                self._queue,
                error,
            )


def wait_for_first_message(receiver: ServiceBusReceiver, seconds: float) -> None:
    """Let the coming receive sleep until bytes arrive on its connection instead of
    polling the socket in SOCKET_TIMEOUT_SECONDS steps.

    The SDK reads one frame per step and loops until its wait is over; each step holds
    the connection's socket lock, which writes need too, so the step must stay short
    (a settlement or lock renewal waits behind it). With nothing arriving that woke each
    idle receiver 50 times a second, most of the runtime's idle CPU. Here a step of a
    receive that has no message yet first waits, without the lock, for the connection's
    stream to be fed; any frame ends the wait, so the first message is not delayed, and
    settlements, renewals and credit go out meanwhile as before.

    A settlement awaiting its outcome reads the same connection: a message it takes in
    while the receive sends its credit is buffered before the receive's first step, which
    then returns it at once instead of waiting for a next message or the wait's end.
    """
    handler: Any = getattr(receiver, "_handler", None)
    if handler is None:
        return  # opened by the receive itself; the next call wraps it
    handler._devhost_first_by = asyncio.get_running_loop().time() + seconds
    handler._devhost_first_step = True
    if getattr(handler, "_devhost_waits_for_first", False):
        return
    handler._devhost_waits_for_first = True
    received = handler._received_messages
    do_work = handler.do_work_async

    async def do_work_waiting(**kwargs: Any) -> Any:
        if handler._devhost_first_step:
            handler._devhost_first_step = False
            if not received.empty():
                # Taken in by a settlement while the receive sent its credit: the SDK counts
                # only what arrives within a step, so it would poll on to the end of its
                # wait. Reporting "not receiving" ends the receive with them at once.
                return False
        left = handler._devhost_first_by - asyncio.get_running_loop().time()
        if received.empty() and left > 0:
            await _until_fed(getattr(handler._connection, "_transport", None), left)
        return await do_work(**kwargs)

    handler.do_work_async = do_work_waiting


async def _until_fed(transport: Any, seconds: float) -> None:
    """Return when the transport's stream gets bytes (or EOF), has some unread, or after
    `seconds`; at once if the transport is not the stream-based one this knows."""
    reader = getattr(transport, "reader", None)
    if not isinstance(reader, asyncio.StreamReader):
        return
    fed: asyncio.Event | None = getattr(reader, "_devhost_fed", None)
    if fed is None:
        fed = _watch(reader)
    fed.clear()
    partial = getattr(transport, "_read_buffer", None)
    unread = partial.getbuffer().nbytes - partial.tell() if partial is not None else 0
    if unread or getattr(reader, "_buffer", b"") or reader.at_eof() or reader.exception():
        return
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await fed.wait()


def _watch(reader: Any) -> asyncio.Event:
    """An event set whenever the stream is fed: asyncio has no readiness hook of its own."""
    fed = asyncio.Event()
    feed_data, feed_eof, set_exception = reader.feed_data, reader.feed_eof, reader.set_exception

    def on_data(data: bytes) -> None:
        feed_data(data)
        fed.set()

    def on_eof() -> None:
        feed_eof()
        fed.set()

    def on_exception(exc: Exception) -> None:
        set_exception(exc)
        fed.set()

    reader.feed_data = on_data
    reader.feed_eof = on_eof
    reader.set_exception = on_exception
    reader._devhost_fed = fed
    return fed


def serialize_lock_renewals(receiver: ServiceBusReceiver) -> None:
    """Let one lock renewal at a time through a receiver.

    Renewals are requests on the receiver's management link, and the SDK numbers a
    transfer before it awaits: concurrent renewals (AutoLockRenewer runs one task per
    message) put duplicate delivery ids on the wire and the connection is torn down.
    """
    gate = asyncio.Lock()
    renew = receiver.renew_message_lock

    async def renew_one_at_a_time(message: Any, **kwargs: Any) -> Any:
        async with gate:
            return await renew(message, **kwargs)

    receiver.renew_message_lock = renew_one_at_a_time  # type: ignore[method-assign]
