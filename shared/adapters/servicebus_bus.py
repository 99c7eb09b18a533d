"""Sending on Azure Service Bus with the azure-servicebus async SDK.

The same adapter talks to a real namespace (managed identity), Microsoft's emulator and
the repo's local broker: only the connection differs.

Why batches and a pool: a sender link must carry one send at a time (the SDK numbers a
transfer before it awaits, so concurrent sends on one link reach the wire out of order),
and one link per queue made every handler of a busy queue wait for it. So a call's
messages to one queue go out as one batch (one transfer and one round trip, each message
keeping its id and scheduled enqueue time, in call order), and each queue has a few
links, each used by one send at a time. A call's queues are sent concurrently, each on a
link of its own: a transition that asks an agent and tells the client waits for the
slower of the two round trips, not for their sum. The call fails if any queue's send
fails, once every queue's send has ended (what did go out is dropped as a duplicate when
the outbox is sent again).

Why every call has a deadline: a broker that is down refuses the connection, and the
SDK's default retries made a send take 11 s to fail; a broker that accepts the TCP
connection but never answers (a stopped process, a black-holed network) hangs the SDK's
AMQP open with no timeout at all. So the SDK retries little and each call is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import timedelta
from typing import Any
from uuid import UUID

from azure.core.credentials_async import AsyncTokenCredential
from azure.servicebus import ServiceBusMessage, ServiceBusMessageBatch, ServiceBusSubQueue
from azure.servicebus.aio import ServiceBusClient, ServiceBusReceiver, ServiceBusSender
from azure.servicebus.exceptions import MessageSizeExceededError, ServiceBusError

from shared import jsonbounds
from shared.adapters.queues import queue_of
from shared.contract import PoisonProperty, Queue
from shared.domain.model import Outgoing
from shared.ports import BusUnavailable, Poison
from shared.waiters import hand_to_first, leave

SENDERS_PER_QUEUE = 4
"""Links per queue: enough that concurrent handlers rarely wait, few enough to be cheap."""

SEND_TIMEOUT = 10.0
"""Seconds a send may take in all (a link opened if needed, the batches, the one retry on a
fresh link) before it fails with BusUnavailable. Far above a healthy send (tens of ms,
half a second when a link opens) and well under the 60 s message lock a triggered
handler holds; an HTTP handler that must answer sooner stops waiting on its own. A
constant, not a setting: it follows from the SDK and the lock, not from a deployment."""
PING_TIMEOUT = 2.0
"""The health probe's budget: `/api/health` answers within 3 s, both probes at once."""
PING_QUEUE = Queue.SCHEDULER
"""Whose dead letters the ping peeks at: a queue every deployment has and listens on."""
CLOSE_TIMEOUT = 5.0
"""A link that failed is closed in the background, and given up after this long."""
CLIENT_RETRIES: dict[str, Any] = {
    "retry_total": 1,
    "retry_backoff_factor": 0.2,
    "retry_backoff_max": 1.0,
}
"""The SDK's own retries inside one call: one, quickly. Its defaults (3 tries, 0.8 s
factor, 120 s cap) spent 11 s on a refused connection; the adapter retries once more on
a fresh link, and the callers' outbox and the Supervisor retry later still."""

_SEND_ERRORS = (TimeoutError, ServiceBusError, OSError)


class _SenderPool:
    """A queue's links. A caller holds one slot (and its link) for a whole send.

    A link takes about half a second to open, far longer than a send on an open one, so
    a caller never waits for a new link while another exists: it takes an idle one, or
    waits for a busy one to come back while one more link opens in the background. Only
    the first caller of a queue (or after a failure) opens a link itself.

    Callers that wait are served first come, first served: a slot given back goes to the
    longest waiting caller, never to one that arrives meanwhile. With asyncio's queue a
    newcomer took a slot from under a woken waiter, which then went to the back of the
    line; under one customer's 5,000-order burst a nudge waited out the send's 10 s that
    way (bench/README.md, issue #25).
    """

    def __init__(self, queue: str, size: int, opener: Callable[[str], Awaitable[ServiceBusSender]]):
        self.queue = queue
        self.senders: list[ServiceBusSender | None] = [None] * size
        self._open = opener
        self._idle: list[int] = []
        """Slots nobody holds, the last given back on top (its link is the warmest)."""
        self._waiting: deque[asyncio.Future[int]] = deque()
        self._spare = list(reversed(range(size)))
        self._growing: asyncio.Task[None] | None = None

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[int]:
        slot = await self._acquire()
        try:
            yield slot
        finally:
            self._give_back(slot)

    async def _acquire(self) -> int:
        if self._idle:
            return self._idle.pop()
        if self._spare and not self._opening():
            return self._spare.pop()
        if self._spare and self._growing is None:
            self._growing = asyncio.create_task(self._grow(self._spare.pop()))
        handed: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._waiting.append(handed)
        try:
            return await handed
        except asyncio.CancelledError:
            if handed.done() and not handed.cancelled():
                self._give_back(handed.result())  # handed over as the caller was cancelled
            else:
                leave(self._waiting, handed)
            raise

    def _give_back(self, slot: int) -> None:
        if not hand_to_first(self._waiting, slot):
            self._idle.append(slot)

    def _opening(self) -> bool:
        """Whether some link exists or is being opened (so waiting for it is cheaper)."""
        taken = len(self.senders) - len(self._spare) - len(self._idle)
        return taken > 0 or self._growing is not None

    async def _grow(self, slot: int) -> None:
        try:
            self.senders[slot] = await self._open(self.queue)
        except _SEND_ERRORS:
            pass  # the caller who takes the slot opens it, and reports what fails then
        finally:
            self._growing = None
            self._give_back(slot)

    async def link(self, slot: int) -> ServiceBusSender:
        sender = self.senders[slot]
        if sender is None:
            sender = self.senders[slot] = await self._open(self.queue)
        return sender

    async def drop(self, slot: int) -> None:
        sender, self.senders[slot] = self.senders[slot], None
        if sender is not None:
            await _close_quietly(sender)

    def forget(self, slot: int) -> None:
        """Drop the slot's link without waiting: a link cut off mid-call (its deadline, a
        cancelled caller) may hang on close as it hung before, so it closes in the
        background."""
        sender, self.senders[slot] = self.senders[slot], None
        if sender is not None:
            task = asyncio.create_task(_close_quietly(sender))
            _closing.add(task)
            task.add_done_callback(_closing.discard)

    async def close(self) -> None:
        if self._growing is not None:
            self._growing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._growing
        await asyncio.gather(*(self.drop(slot) for slot in range(len(self.senders))))


_closing: set[asyncio.Task[None]] = set()
"""Background closes of failed links, referenced until done."""


def _close_in_background(link: ServiceBusSender | ServiceBusReceiver) -> None:
    task = asyncio.create_task(_close_quietly(link))
    _closing.add(task)
    task.add_done_callback(_closing.discard)


async def _close_quietly(link: ServiceBusSender | ServiceBusReceiver) -> None:
    with contextlib.suppress(ServiceBusError, OSError, TimeoutError):
        async with asyncio.timeout(CLOSE_TIMEOUT):
            await link.close()


@contextlib.asynccontextmanager
async def translated_errors(pool: _SenderPool, slot: int, where: str = "") -> AsyncIterator[None]:
    """Where the SDK's send and link errors become BusUnavailable. The link that failed is
    dropped first, so the slot's next user opens a fresh one; a link cut off mid-call (a
    deadline, a cancelled caller) is dropped without waiting. The SDK's exception is not
    chained (`from None`): its text is in the message."""
    try:
        yield
    except _SEND_ERRORS as exc:
        await pool.drop(slot)
        raise BusUnavailable(f"{where}{exc}") from None
    except asyncio.CancelledError:
        pool.forget(slot)
        raise


@contextlib.asynccontextmanager
async def bounded(timeout: float, where: str = "") -> AsyncIterator[None]:
    """A call still going after `timeout` is cut off and fails with BusUnavailable (the
    SDK's own timeouts are translated inside, so a TimeoutError here is the deadline)."""
    try:
        async with asyncio.timeout(timeout):
            yield
    except TimeoutError:
        raise BusUnavailable(f"{where}no answer within {timeout:g} s") from None


class ServiceBusMessageBus:
    """One client per worker and a small pool of cached senders per queue."""

    def __init__(
        self,
        client: ServiceBusClient,
        credential: AsyncTokenCredential | None = None,
        senders_per_queue: int = SENDERS_PER_QUEUE,
        send_timeout: float = SEND_TIMEOUT,
    ):
        if senders_per_queue < 1:
            raise ValueError("senders_per_queue must be at least 1")
        self._client = client
        self._credential = credential
        self._pool_size = senders_per_queue
        self._send_timeout = send_timeout
        self._pools: dict[str, _SenderPool] = {}
        self._open_lock = asyncio.Lock()
        self._pinger: ServiceBusReceiver | None = None
        self._opening_pinger: asyncio.Task[ServiceBusReceiver] | None = None
        self._ping_lock = asyncio.Lock()
        """One peek at a time: the Supervisor's checks ping concurrently, and a receiver
        used while another task still opened it failed inside the SDK."""
        self.sent = 0
        self.transfers = 0
        self.failures = 0
        """Calls that found the broker down or silent (health reuses an answer only while
        this stays the same)."""

    @classmethod
    def from_connection_string(
        cls, connection_string: str, send_timeout: float = SEND_TIMEOUT
    ) -> ServiceBusMessageBus:
        client = ServiceBusClient.from_connection_string(connection_string, **CLIENT_RETRIES)
        return cls(client, send_timeout=send_timeout)

    @classmethod
    def from_namespace(
        cls, fully_qualified_namespace: str, credential: AsyncTokenCredential
    ) -> ServiceBusMessageBus:
        return cls(
            ServiceBusClient(fully_qualified_namespace, credential, **CLIENT_RETRIES), credential
        )

    def _pool(self, queue: str) -> _SenderPool:
        pool = self._pools.get(queue)
        if pool is None:
            pool = self._pools[queue] = _SenderPool(queue, self._pool_size, self._open)
        return pool

    async def _open(self, queue: str) -> ServiceBusSender:
        """Open links one at a time: senders share the client, and the SDK's link setup
        is not safe when several open concurrently on it."""
        async with self._open_lock:
            sender = self._client.get_queue_sender(queue)
            await sender.__aenter__()
            return sender

    async def send(self, messages: Sequence[Outgoing]) -> None:
        by_queue: dict[str, list[Outgoing]] = {}
        for message in messages:
            by_queue.setdefault(queue_of(message.destination), []).append(message)
        if len(by_queue) == 1:
            ((queue, batch),) = by_queue.items()
            await self._send_queue(queue, batch)
            return
        ended = await asyncio.gather(
            *(self._send_queue(q, batch) for q, batch in by_queue.items()),
            return_exceptions=True,
        )
        failed = next((e for e in ended if isinstance(e, BaseException)), None)
        if failed is not None:
            raise failed

    async def _send_queue(self, queue: str, batch: list[Outgoing]) -> None:
        bodies = [_body(m) for m in batch]
        alone = len(batch) == 1 and len(bodies[0]) <= ALONE_MAX_BODY
        await self._send_to(
            queue, [_message(m, b) for m, b in zip(batch, bodies, strict=True)], alone
        )
        self.sent += len(batch)

    async def park(self, poison: Poison) -> None:
        """Service Bus has no send-to-dead-letter, and a plain Python trigger cannot
        settle its message; so a copy goes to the queue with a 1 ms time-to-live and the
        queue's dead-lettering on expiry moves it to `<queue>/$DeadLetterQueue`, where the
        application properties carry the reason. The original is then completed."""
        await self._send_to(poison.queue, [_poison_copy(poison)])

    async def _send_to(
        self, queue: str, messages: list[ServiceBusMessage], alone: bool = False
    ) -> None:
        """Send with one retry on a fresh link; a batch that is re-sent whole is safe
        because the broker drops the message ids it has already accepted.

        `alone`: one message known to fit goes as itself. A batch encodes it once more
        to measure it, and the broker then unpacks it; a message too large is refused
        by the batch as a send error, where alone it would cost the link."""
        pool = self._pool(queue)
        where = f"send to {queue} failed: "
        async with self._counted(), bounded(self._send_timeout, where), pool.slot() as slot:
            for attempt in (1, 2):
                try:
                    async with translated_errors(pool, slot, where):
                        sender = await pool.link(slot)
                        transfers: Sequence[ServiceBusMessage | ServiceBusMessageBatch] = (
                            messages if alone else await _batches(sender, messages)
                        )
                        for transfer in transfers:
                            await sender.send_messages(transfer)
                            self.transfers += 1
                    return
                except BusUnavailable:
                    if attempt == 2:
                        raise

    def open_links(self) -> dict[str, int]:
        """Open sender links per queue, for health views and tests."""
        return {q: sum(s is not None for s in p.senders) for q, p in self._pools.items()}

    async def ping(self) -> None:
        """A peek at `PING_QUEUE`'s dead letters: a management request that the broker
        itself must answer. An open link proved nothing (the SDK answers from its own
        state, so a frozen broker looked healthy); the dead-letter sub-queue, because a
        receiver's one link credit must never lock a message that is work. The receiver
        opens in a task of its own, bounded like a sender's open and never below two probes'
        time (a silent broker meets the probe's own bound first): a probe that runs out
        of time leaves it opening (on a loaded machine the first open alone took longer
        than a probe may), so the next probe only pays for the peek."""
        async with self._counted(), bounded(PING_TIMEOUT, "ping: "):
            try:
                receiver = await asyncio.shield(self._pinger_opened())
                async with self._ping_lock:
                    await receiver.peek_messages(max_message_count=1)
            except _SEND_ERRORS as exc:
                self._drop_pinger()
                raise BusUnavailable(f"ping: {exc}") from None
            except asyncio.CancelledError:
                if self._pinger is not None:
                    self._drop_pinger()  # its peek was cut off: it may hang as the call did
                raise

    def _pinger_opened(self) -> asyncio.Task[ServiceBusReceiver]:
        if self._opening_pinger is None:
            self._opening_pinger = asyncio.create_task(self._open_pinger())
        return self._opening_pinger

    async def _open_pinger(self) -> ServiceBusReceiver:
        receiver = self._client.get_queue_receiver(
            PING_QUEUE, sub_queue=ServiceBusSubQueue.DEAD_LETTER
        )
        try:
            async with asyncio.timeout(max(self._send_timeout, 2 * PING_TIMEOUT)), self._open_lock:
                await receiver.__aenter__()
        except BaseException:
            self._opening_pinger = None
            _close_in_background(receiver)
            raise
        self._pinger = receiver
        return receiver

    def _drop_pinger(self) -> None:
        """In the background, like a failed sender: its close may hang as its call did."""
        receiver, self._pinger = self._pinger, None
        if receiver is not None:
            self._opening_pinger = None
            _close_in_background(receiver)

    @contextlib.asynccontextmanager
    async def _counted(self) -> AsyncIterator[None]:
        try:
            yield
        except (BusUnavailable, asyncio.CancelledError):
            self.failures += 1
            raise

    async def close(self) -> None:
        """All links at once: each close waits out its link's 1 s keep-alive tick, so one
        after another a worker with a dozen links took that many seconds to stop. The
        client closes once no link is opening (opens hold `_open_lock`): its close walks
        the set of its links, which a link failing to open changes under it."""
        await asyncio.gather(*(pool.close() for pool in self._pools.values()))
        opening = self._opening_pinger
        if opening is not None and not opening.done():
            opening.cancel()
            with contextlib.suppress(asyncio.CancelledError, *_SEND_ERRORS):
                await opening
        self._drop_pinger()
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(t for t in _closing if t.get_loop() is loop))
        async with self._open_lock:
            await self._client.close()
        if self._credential is not None:
            await self._credential.close()


POISON_BODY_LIMIT = 192 * 1024
"""Leaves room for the properties under the Standard tier's 256 KiB message limit."""
POISON_TTL = timedelta(milliseconds=1)


def _poison_copy(poison: Poison) -> ServiceBusMessage:
    """A body too large to travel with the copy's properties is cut, and says so: the
    alternative, failing the send, would leave the message to ten redeliveries."""
    body = poison.body
    properties: dict[str | bytes, int | float | bytes | bool | str | UUID] = {
        PoisonProperty.COPY_OF: poison.message_id,
        PoisonProperty.REASON: poison.reason,
        PoisonProperty.DETAIL: poison.detail[:1024],
        PoisonProperty.ORIGINAL_DELIVERY_COUNT: poison.delivery_count,
    }
    if len(body) > POISON_BODY_LIMIT:
        properties[PoisonProperty.TRUNCATED_FROM] = len(body)
        body = body[:POISON_BODY_LIMIT]
    return ServiceBusMessage(
        body,
        message_id=f"poison:{poison.message_id}",
        time_to_live=POISON_TTL,
        application_properties=properties,
    )


ALONE_MAX_BODY = 64 * 1024
"""A body this small fits the Standard tier's 256 KiB with any properties we set."""


def _body(message: Outgoing) -> str:
    """As every trigger reads it (shared/jsonbounds.py): a value from an order stored
    before that rule (a result with NaN, issue 41) goes as null, not as a message the
    receiving trigger would dead-letter."""
    return jsonbounds.dumps(dict(message.body), separators=(",", ":"))


def _message(message: Outgoing, body: str) -> ServiceBusMessage:
    properties: dict[str | bytes, int | float | bytes | bool | str | UUID] = {
        "orderId": str(message.body.get("orderId", ""))
    }
    properties.update(message.properties.items())
    return ServiceBusMessage(
        body,
        message_id=message.message_id,
        content_type="application/json",
        scheduled_enqueue_time_utc=message.deliver_at,
        application_properties=properties,
    )


async def _batches(
    sender: ServiceBusSender, messages: list[ServiceBusMessage]
) -> list[ServiceBusMessageBatch]:
    """As few batches as the link's size limit allows, in order; a message too large for
    a batch of its own is an error of the send (it would be one alone too)."""
    batches = [await sender.create_message_batch()]
    for message in messages:
        try:
            batches[-1].add_message(message)
        except MessageSizeExceededError:
            if len(batches[-1]) == 0:
                raise
            batches.append(await sender.create_message_batch())
            batches[-1].add_message(message)
    return batches
