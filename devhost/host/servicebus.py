"""Service Bus queue triggers: the Functions host's receive loop, whichever client receives.

Mirrors the Functions Service Bus extension closely enough that retry semantics
seen locally are the ones production has: peek-lock receive, complete on success,
abandon on exception (so the broker counts deliveries and dead-letters at
``maxDeliveryCount``), ``maxConcurrentCalls`` handlers at most per function, lock
renewal while a handler runs. One client per connection setting is shared by every
receiver (``sb_links.Receivers``: the host's own AMQP connection for devhost's broker,
the SDK's receiver for anything else); a lost broker is retried with back-off and
reported once per outage, never in a tight loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

from opentelemetry.trace import SpanKind

from devhost.host.invoke import invoke, new_invocation_id
from devhost.host.loader import FunctionSpec, HostConfig
from devhost.host.sb_connection import (
    ConnectionHealth,
    ConnectionInfo,
    ServiceBusConfigError,
    connection_info,
)
from devhost.host.sb_links import Delivered, ForeignBroker, Receivers, TriggerLink
from devhost.host.sb_message import ReceivedMessage, to_function_message
from devhost.host.tracing import invocation_span, message_carrier

__all__ = [
    "ConnectionHealth",
    "ConnectionInfo",
    "QueueTrigger",
    "Receivers",
    "ServiceBusConfigError",
    "connection_info",
    "to_function_message",
]

log = logging.getLogger("devhost.servicebus")

RECEIVE_WAIT_SECONDS = 5.0
"""How long one receive waits for a first message. An SDK receive sends the broker a
credit frame, so an idle receiver costs one round trip per wait; stopping does not wait."""
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
        pool: Receivers,
        settings: Mapping[str, str],
        config: HostConfig,
    ) -> None:
        self.spec = spec
        self.queue = str(trigger["queueName"])
        self.info = connection_info(trigger.get("connection"), settings)
        self.many = str(trigger.get("cardinality", "one")).lower() == "many"
        self.max_concurrent = config.max_concurrent_calls
        self._batch_size = config.max_message_batch_size
        self._window = (self._batch_size if self.many else self.max_concurrent) + (
            config.prefetch_count
        )
        self._pool = pool
        self._stopping = asyncio.Event()
        self.listening = asyncio.Event()
        """Set once the receiver's link is open: a message sent from then on is taken
        without the seconds a first link needs on a loaded machine."""
        self._loop_task: asyncio.Task[None] | None = None
        self._receiving = False
        self._handlers: set[asyncio.Task[None]] = set()
        self._retiring: set[asyncio.Task[None]] = set()

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
            # A receive in progress is cut short; whatever its link holds is handed back
            # when the link is closed, not left locked.
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

    async def _run(self) -> None:
        health = self._pool.health(self.info)
        delay = BACKOFF_INITIAL
        while not self._stopping.is_set():
            source = self._pool.source(self.info)
            link: TriggerLink | None = None
            mine: set[asyncio.Task[None]] = set()
            try:
                # Opened before the first receive, which would give the link only
                # RECEIVE_WAIT_SECONDS: a dozen links opening at once on a loaded machine
                # overran that, and each receiver backed off as if the broker were down.
                link = await asyncio.wait_for(
                    source.open(self.queue, self._window, self.spec.name), LINK_OPEN_SECONDS
                )
                self.listening.set()
                async for _ in self._pump(link, mine):
                    health.succeeded(self.queue)
                    delay = BACKOFF_INITIAL
            except ForeignBroker as exc:
                await self._pool.fall_back(self.info, source, exc)
                continue
            except Exception as exc:
                health.failed(self.queue, exc)
            finally:
                if link is not None:
                    self._retire(link, mine)
            if self._stopping.is_set():
                return
            # Jitter keeps several receivers from reconnecting in lockstep.
            await self._sleep(delay * random.uniform(0.8, 1.2))
            delay = min(delay * 2, BACKOFF_MAX)

    async def _pump(self, link: TriggerLink, mine: set[asyncio.Task[None]]) -> AsyncIterator[None]:
        """Yield after every successful receive so the caller can reset its back-off."""
        while not self._stopping.is_set():
            running = self.in_flight()
            free = self.max_concurrent - len(running)
            if free <= 0:
                await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                continue
            self._receiving = True
            try:
                batch = await link.receive(
                    self._batch_size if self.many else free, RECEIVE_WAIT_SECONDS
                )
            finally:
                self._receiving = False
            yield
            if self.many and batch:
                self._spawn(self._process(link, batch), mine)
                continue
            for delivered in batch:
                self._spawn(self._process(link, [delivered]), mine)

    def _spawn(self, work: Awaitable[None], mine: set[asyncio.Task[None]]) -> None:
        """`mine` is what the receiver must wait for before it closes; a receiver lives
        for the whole run, so a finished handler leaves it too (kept, every message's
        task and coroutine stayed until a reconnect: a leak per message)."""
        task = asyncio.ensure_future(work)
        self._handlers.add(task)
        mine.add(task)
        task.add_done_callback(self._handlers.discard)
        task.add_done_callback(mine.discard)

    def _retire(self, link: TriggerLink, mine: set[asyncio.Task[None]]) -> None:
        """Close a receiver only after its handlers have settled their messages through it."""

        async def retire() -> None:
            if mine:
                await asyncio.wait(mine)
            try:
                await link.close()
            except Exception as exc:
                log.debug("closing receiver on %s failed: %s", self.queue, exc)

        task = asyncio.create_task(retire(), name=f"retire:{self.queue}")
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)

    async def _process(self, link: TriggerLink, batch: list[Delivered]) -> None:
        """Invoke the function for one message (or one batch when cardinality is many)."""
        messages = [delivered.message for delivered in batch]
        invocation_id = new_invocation_id()
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s <- %s message %s", self.spec.name, self.queue, _ids(messages))
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
                _ids(messages),
            )
            # Hand the message back now rather than when its lock expires, so the next
            # run sees it at once. Bounded: shutdown must not hang on a dead broker.
            for delivered in batch:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        self._settle(link.abandon, delivered, "abandon"),
                        CANCEL_ABANDON_SECONDS,
                    )
            raise
        except Exception as exc:
            ids = _ids(messages)
            log.warning(
                "%s failed on message %s (delivery %s): %s: %s; abandoning",
                self.spec.name,
                ids,
                messages[0].host_delivery_count,
                type(exc).__name__,
                exc,
            )
            log.debug("traceback of %s on message %s", self.spec.name, ids, exc_info=exc)
            for delivered in batch:
                await self._settle(link.abandon, delivered, "abandon")
            return
        for delivered in batch:
            await self._settle(link.complete, delivered, "complete")

    async def _settle(
        self,
        action: Callable[[Delivered], Awaitable[None]],
        delivered: Delivered,
        verb: str,
    ) -> None:
        try:
            await action(delivered)
        except Exception as exc:
            log.warning(
                "%s: could not %s message %s on %s (%s: %s); the broker redelivers it "
                "when the lock expires",
                self.spec.name,
                verb,
                delivered.message.message_id,
                self.queue,
                type(exc).__name__,
                exc,
            )


def _ids(messages: list[ReceivedMessage]) -> str:
    return ", ".join(str(message.message_id) for message in messages)
