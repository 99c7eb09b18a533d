"""Service Bus queue triggers driven by the real ``azure-servicebus`` aio SDK.

Mirrors the Functions Service Bus extension closely enough that retry semantics
seen locally are the ones production has: peek-lock receive, complete on success,
abandon on exception (so the broker counts deliveries and dead-letters at
``maxDeliveryCount``), ``maxConcurrentCalls`` handlers at most per function, lock
renewal while a handler runs. One ``ServiceBusClient`` per connection setting is
shared by every receiver; a lost broker is retried with back-off and reported once
per outage, never in a tight loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

from azure.servicebus import ServiceBusReceivedMessage, ServiceBusReceiveMode
from azure.servicebus.aio import AutoLockRenewer, ServiceBusReceiver
from opentelemetry.trace import SpanKind

from devhost.host.invoke import invoke, new_invocation_id
from devhost.host.loader import FunctionSpec, HostConfig
from devhost.host.sb_connection import (
    ClientPool,
    ConnectionHealth,
    ConnectionInfo,
    ServiceBusConfigError,
    connection_info,
)
from devhost.host.sb_message import host_delivery_count, to_function_message
from devhost.host.tracing import invocation_span, message_carrier

__all__ = [
    "ClientPool",
    "ConnectionHealth",
    "ConnectionInfo",
    "QueueTrigger",
    "ServiceBusConfigError",
    "connection_info",
    "to_function_message",
]

log = logging.getLogger("devhost.servicebus")

RECEIVE_WAIT_SECONDS = 5.0
"""How long one receive waits for a first message. Each receive sends the broker a credit
frame, so an idle receiver costs one round trip per wait; stopping does not wait for it."""
STOP_GRACE_SECONDS = 2.0
LINK_OPEN_SECONDS = 30.0
BACKOFF_INITIAL = 1.0
BACKOFF_MAX = 10.0
CANCEL_ABANDON_SECONDS = 2.0


class QueueTrigger:
    """Receiver loop for one ``serviceBusTrigger`` function."""

    def __init__(
        self,
        spec: FunctionSpec,
        trigger: Mapping[str, Any],
        pool: ClientPool,
        settings: Mapping[str, str],
        config: HostConfig,
    ) -> None:
        self.spec = spec
        self.queue = str(trigger["queueName"])
        self.info = connection_info(trigger.get("connection"), settings)
        self.many = str(trigger.get("cardinality", "one")).lower() == "many"
        self.max_concurrent = config.max_concurrent_calls
        self._prefetch = config.prefetch_count
        self._renewal_seconds = config.max_auto_lock_renewal_seconds
        self._batch_size = config.max_message_batch_size
        self._pool = pool
        self._stopping = asyncio.Event()
        self.listening = asyncio.Event()
        """Set once the receiver's link is open: a message sent from then on is taken
        without the seconds a first link needs on a loaded machine."""
        self._loop_task: asyncio.Task[None] | None = None
        self._receiving = False
        self._handlers: set[asyncio.Task[None]] = set()
        self._retiring: set[asyncio.Task[None]] = set()
        self._renewer = AutoLockRenewer(
            max_lock_renewal_duration=self._renewal_seconds,
            on_lock_renew_failure=self._lock_renew_failed,
        )

    def start(self) -> None:
        self._loop_task = asyncio.create_task(self._run(), name=f"servicebus:{self.spec.name}")

    def in_flight(self) -> list[asyncio.Task[None]]:
        return [task for task in self._handlers if not task.done()]

    async def stop_receiving(self) -> None:
        """Stop taking new messages; handlers already running keep going."""
        self._stopping.set()
        task = self._loop_task
        if task is None:
            return
        if self._receiving:
            # A receive in progress is cut short; whatever it holds is released when
            # its receiver is closed (the SDK drains the link), not left locked.
            task.cancel()
        _, pending = await asyncio.wait({task}, timeout=STOP_GRACE_SECONDS)
        for late in pending:
            late.cancel()
        await asyncio.gather(task, return_exceptions=True)
        self._loop_task = None

    async def close(self) -> None:
        """Close receivers once their handlers are done (``drain`` has waited for them)."""
        for task in self.in_flight():
            task.cancel()
        await asyncio.gather(*self._handlers, *self._retiring, return_exceptions=True)
        await self._renewer.close()

    async def _run(self) -> None:
        client = self._pool.get(self.info)
        health = self._pool.health[self.info.setting]
        delay = BACKOFF_INITIAL
        while not self._stopping.is_set():
            receiver = client.get_queue_receiver(
                queue_name=self.queue,
                receive_mode=ServiceBusReceiveMode.PEEK_LOCK,
                prefetch_count=self._prefetch,
                socket_timeout=SOCKET_TIMEOUT_SECONDS,
            )
            serialize_lock_renewals(receiver)
            # After the first message of a batch the SDK keeps reading for more, 200 ms
            # in socket-timeout steps; with handler slots free that is pure latency on
            # every hop (measured: 200 ms a hop, 25 ms with these two settings).
            receiver._further_pull_receive_timeout = FURTHER_PULL_SECONDS
            mine: set[asyncio.Task[None]] = set()
            try:
                # Opened here, not by the first receive, which would give the link only
                # RECEIVE_WAIT_SECONDS: a dozen links opening at once on a loaded machine
                # overran that, and each receiver backed off as if the broker were down.
                await asyncio.wait_for(receiver.__aenter__(), LINK_OPEN_SECONDS)
                self.listening.set()
                async for _ in self._pump(receiver, mine):
                    health.succeeded(self.queue)
                    delay = BACKOFF_INITIAL
            except Exception as exc:
                health.failed(self.queue, exc)
            finally:
                self._retire(receiver, mine)
            if self._stopping.is_set():
                return
            # Jitter keeps several receivers from reconnecting in lockstep.
            await self._sleep(delay * random.uniform(0.8, 1.2))
            delay = min(delay * 2, BACKOFF_MAX)

    async def _pump(
        self, receiver: ServiceBusReceiver, mine: set[asyncio.Task[None]]
    ) -> AsyncIterator[None]:
        """Yield after every successful receive so the caller can reset its back-off."""
        while not self._stopping.is_set():
            running = self.in_flight()
            free = self.max_concurrent - len(running)
            if free <= 0:
                await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                continue
            wait_for_first_message(receiver, RECEIVE_WAIT_SECONDS)
            self._receiving = True
            try:
                batch = await receiver.receive_messages(
                    max_message_count=self._batch_size if self.many else free,
                    max_wait_time=RECEIVE_WAIT_SECONDS,
                )
            finally:
                self._receiving = False
            yield
            if self.many and batch:
                self._spawn(self._process(receiver, batch), mine)
                continue
            for message in batch:
                self._spawn(self._process(receiver, [message]), mine)

    def _spawn(self, work: Awaitable[None], mine: set[asyncio.Task[None]]) -> None:
        """`mine` is what the receiver must wait for before it closes; a receiver lives
        for the whole run, so a finished handler leaves it too (kept, every message's
        task and coroutine stayed until a reconnect: a leak per message)."""
        task = asyncio.ensure_future(work)
        self._handlers.add(task)
        mine.add(task)
        task.add_done_callback(self._handlers.discard)
        task.add_done_callback(mine.discard)

    def _retire(self, receiver: ServiceBusReceiver, mine: set[asyncio.Task[None]]) -> None:
        """Close a receiver only after its handlers have settled their messages through it."""

        async def retire() -> None:
            if mine:
                await asyncio.wait(mine)
            try:
                await receiver.close()
            except Exception as exc:
                log.debug("closing receiver on %s failed: %s", self.queue, exc)

        task = asyncio.create_task(retire(), name=f"retire:{self.queue}")
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)

    async def _process(
        self, receiver: ServiceBusReceiver, messages: list[ServiceBusReceivedMessage]
    ) -> None:
        """Invoke the function for one message (or one batch when cardinality is many)."""
        ids = ", ".join(str(m.message_id) for m in messages)
        for message in messages:
            # A broker that reports no lock expiry has nothing to renew.
            if message.locked_until_utc is not None:
                self._renewer.register(receiver, message)
        invocation_id = new_invocation_id()
        log.debug("%s <- %s message %s", self.spec.name, self.queue, ids)
        try:
            converted = [to_function_message(m) for m in messages]
            # One message: the host's span is its child; a batch's has no one parent.
            carrier = {} if self.many else message_carrier(messages[0].application_properties)
            attributes = {
                "faas.trigger": "pubsub",
                "faas.invocation_id": invocation_id,
                "messaging.destination.name": self.queue,
            }
            with invocation_span(self.spec.name, SpanKind.CONSUMER, carrier, attributes) as trace:
                await invoke(
                    self.spec, converted if self.many else converted[0], invocation_id, trace
                )
        except asyncio.CancelledError:
            log.warning(
                "%s: handler for message %s cancelled at shutdown; abandoning it",
                self.spec.name,
                ids,
            )
            # Hand the message back now rather than when its lock expires, so the next
            # run sees it at once. Bounded: shutdown must not hang on a dead broker.
            for message in messages:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        self._settle(receiver.abandon_message, message, "abandon"),
                        CANCEL_ABANDON_SECONDS,
                    )
            raise
        except Exception as exc:
            log.warning(
                "%s failed on message %s (delivery %s): %s: %s; abandoning",
                self.spec.name,
                ids,
                host_delivery_count(messages[0]),
                type(exc).__name__,
                exc,
            )
            log.debug("traceback of %s on message %s", self.spec.name, ids, exc_info=exc)
            for message in messages:
                await self._settle(receiver.abandon_message, message, "abandon")
            return
        for message in messages:
            await self._settle(receiver.complete_message, message, "complete")

    async def _settle(
        self,
        action: Callable[[ServiceBusReceivedMessage], Awaitable[None]],
        message: ServiceBusReceivedMessage,
        verb: str,
    ) -> None:
        try:
            await action(message)
        except Exception as exc:
            log.warning(
                "%s: could not %s message %s on %s (%s: %s); the broker redelivers it "
                "when the lock expires",
                self.spec.name,
                verb,
                message.message_id,
                self.queue,
                type(exc).__name__,
                exc,
            )

    async def _lock_renew_failed(self, renewable: Any, error: Exception | None) -> None:
        if error is not None:
            log.warning(
                "%s: lock renewal for message %s on %s failed: %s",
                self.spec.name,
                getattr(renewable, "message_id", "?"),
                self.queue,
                error,
            )


FURTHER_PULL_SECONDS = 0.01
SOCKET_TIMEOUT_SECONDS = 0.02


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
