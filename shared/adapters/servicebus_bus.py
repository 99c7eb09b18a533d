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

Why concurrent calls share a transfer: a transfer costs the SDK far more CPU than the
messages in it (bench.bus_sends), so callers that find every link of their queue busy
wait in line, and the first one handed a link carries the whole line with its own
messages, in arrival order, as one batch. Each message keeps its own id (so duplicate
detection still works per message) and scheduled time; the queues are neither
partitioned nor session-enabled (infra/app/servicebus.bicep), so messages of different
orders may share a batch. Every caller whose messages were in a transfer gets that
transfer's outcome: none is told its send happened unless the broker took the transfer,
and a carrier cut off mid-transfer (its deadline, its cancellation) fails the others too.

Why every call has a deadline: a broker that is down refuses the connection, and the
SDK's default retries made a send take 11 s to fail; a broker that accepts the TCP
connection but never answers (a stopped process, a black-holed network) hangs the SDK's
AMQP open with no timeout at all. So the SDK retries little and each call is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from datetime import timedelta
from typing import Any
from uuid import UUID

from azure.core.credentials_async import AsyncTokenCredential
from azure.servicebus import ServiceBusMessage, ServiceBusMessageBatch, ServiceBusSubQueue
from azure.servicebus.aio import ServiceBusClient, ServiceBusReceiver, ServiceBusSender
from azure.servicebus.amqp import AmqpAnnotatedMessage
from azure.servicebus.exceptions import MessageSizeExceededError, ServiceBusError

from shared import jsonbounds
from shared.adapters.queues import queue_of
from shared.contract import PoisonProperty, Queue
from shared.domain.model import Outgoing
from shared.ports import BusUnavailable, Poison

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

Sendable = ServiceBusMessage | AmqpAnnotatedMessage
"""What the SDK sends: our own messages are built as AMQP messages (`_message`), a
poison copy, which needs a time-to-live, as a ServiceBusMessage."""


class _Call:
    """One caller's messages to a queue, and how its turn ends."""

    __slots__ = ("alone", "messages", "turn")

    def __init__(self, messages: list[Sendable], alone: bool = False) -> None:
        self.messages = messages
        self.alone = alone
        self.turn: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()
        """A slot: this caller sends, and carries the line; None: another caller's
        transfer carried these messages; an exception: that transfer failed."""


class _SenderPool:
    """A queue's links, and the callers waiting for one. A caller holds one slot (and its
    link) for a whole transfer.

    A link takes about half a second to open, far longer than a send on an open one, so
    a caller never waits for a new link while another exists: it takes an idle one, or
    waits for a busy one to come back while one more link opens in the background. Only
    the first caller of a queue (or after a failure) opens a link itself.

    Callers that wait are served first come, first served: a slot given back goes to the
    longest waiting caller, never to one that arrives meanwhile. With asyncio's queue a
    newcomer took a slot from under a woken waiter, which then went to the back of the
    line; under one customer's 5,000-order burst a nudge waited out the send's 10 s that
    way (bench/README.md, issue #25). The caller handed a slot carries every call still
    in line (`carry`), so no waiting call needs a transfer of its own.
    """

    def __init__(
        self, queue: str, size: int, opener: Callable[[str, bool], Awaitable[ServiceBusSender]]
    ):
        self.queue = queue
        self.senders: list[ServiceBusSender | None] = [None] * size
        self._open = opener
        self._idle: list[int] = []
        """Slots nobody holds, the last given back on top (its link is the warmest)."""
        self._line: deque[_Call] = deque()
        self._spare = list(reversed(range(size)))
        self._growing: asyncio.Task[None] | None = None

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[int]:
        """A slot for a caller with nothing to send (none carries it): tests, probes."""
        slot = await self._acquire(_Call([]))
        assert slot is not None
        try:
            yield slot
        finally:
            self.give_back(slot)

    async def _acquire(self, call: _Call) -> int | None:
        """A slot to send `call` with, or None once another caller's transfer carried it."""
        if self._idle:
            return self._idle.pop()
        if self._spare and not self._opening():
            return self._spare.pop()
        if self._spare and self._growing is None:
            self._growing = asyncio.create_task(self._grow(self._spare.pop()))
        self._line.append(call)
        try:
            return await call.turn
        except asyncio.CancelledError:
            turn = call.turn
            if turn.done() and not turn.cancelled() and turn.exception() is None:
                handed = turn.result()
                if handed is not None:
                    self.give_back(handed)  # handed over as the caller was cancelled
            else:
                with contextlib.suppress(ValueError):
                    self._line.remove(call)
            raise

    def carry(self, call: _Call) -> list[_Call]:
        """What the holder of a slot sends: its own call, then every call in line that has
        messages, in the order they came; those leave the line."""
        carried = [call]
        kept: deque[_Call] = deque()
        for waiting in self._line:
            if waiting.turn.done():
                continue  # gave up
            (carried if waiting.messages else kept).append(waiting)
        self._line = kept
        return carried

    def give_back(self, slot: int) -> None:
        while self._line:
            waiting = self._line.popleft()
            if not waiting.turn.done():
                waiting.turn.set_result(slot)
                return
        self._idle.append(slot)

    def _opening(self) -> bool:
        """Whether some link exists or is being opened (so waiting for it is cheaper)."""
        taken = len(self.senders) - len(self._spare) - len(self._idle)
        return taken > 0 or self._growing is not None

    async def _grow(self, slot: int) -> None:
        try:
            self.senders[slot] = await self._open(self.queue, False)
        except _SEND_ERRORS:
            pass  # the caller who takes the slot opens it, and reports what fails then
        finally:
            self._growing = None
            self.give_back(slot)

    async def link(self, slot: int) -> ServiceBusSender:
        sender = self.senders[slot]
        if sender is None:
            first = not any(self.senders)
            sender = self.senders[slot] = await self._open(self.queue, first)
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


class _Opens:
    """One link opens at a time on the client, and a queue's first link goes before any
    other queue's further links (a pool's growth).

    Why the order: a link took 0.5-4 s to open under full load, and a burst grows every
    busy queue's pool to its size at once; in one line, the first link of a queue nobody
    had sent to yet (`scheduler`, when a burst's orders past the intake's own were nudged)
    waited out a dozen growths and its senders the send's 10 s (bench/README.md, "The
    first sends"). A queue with no link has every sender of it waiting; a growing queue
    has a link that works."""

    def __init__(self) -> None:
        self._busy = False
        self._first: deque[asyncio.Future[None]] = deque()
        self._more: deque[asyncio.Future[None]] = deque()

    @contextlib.asynccontextmanager
    async def turn(self, first: bool = True) -> AsyncIterator[None]:
        if self._busy:
            waiting: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            line = self._first if first else self._more
            line.append(waiting)
            try:
                await waiting
            except asyncio.CancelledError:
                if waiting.done() and not waiting.cancelled():
                    self._pass_on()  # handed the turn as it was cancelled
                else:
                    with contextlib.suppress(ValueError):
                        line.remove(waiting)
                raise
        self._busy = True
        try:
            yield
        finally:
            self._pass_on()

    def _pass_on(self) -> None:
        for line in (self._first, self._more):
            while line:
                waiting = line.popleft()
                if not waiting.done():
                    waiting.set_result(None)
                    return
        self._busy = False


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
        self._opens = _Opens()
        self._opening_early: asyncio.Task[None] | None = None
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

    async def _open(self, queue: str, first: bool = True) -> ServiceBusSender:
        """Open links one at a time: senders share the client, and the SDK's link setup
        is not safe when several open concurrently on it (`_Opens`)."""
        async with self._opens.turn(first):
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

    async def _send_to(self, queue: str, messages: list[Sendable], alone: bool = False) -> None:
        """Send on a link of the queue's pool, or ride on another caller's transfer while
        every link is busy (`_SenderPool.carry`). The caller handed a link sends for
        everyone it carries and tells each of them the outcome; one cut off mid-transfer
        tells them it failed, since whether the broker took it is unknown.

        `alone`: one message known to fit goes as itself when nobody rides along. A batch
        encodes it once more to measure it, and the broker then unpacks it; a message
        too large is refused by the batch as a send error, where alone it would cost the
        link."""
        pool = self._pool(queue)
        where = f"send to {queue} failed: "
        call = _Call(messages, alone)
        async with self._counted(), bounded(self._send_timeout, where):
            slot = await pool._acquire(call)
            if slot is None:
                return  # another caller's transfer carried it, and the broker took it
            try:
                carried = pool.carry(call)
                try:
                    refused = await self._transfer(pool, slot, carried, where)
                except BaseException as exc:
                    cut = isinstance(exc, asyncio.CancelledError)
                    _tell(carried[1:], f"{where}the transfer was cut off" if cut else str(exc))
                    raise
                for other in carried[1:]:
                    _tell([other], refused.get(other))
                if call in refused:
                    raise BusUnavailable(refused[call])
            finally:
                pool.give_back(slot)

    async def _transfer(
        self, pool: _SenderPool, slot: int, carried: list[_Call], where: str
    ) -> dict[_Call, str]:
        """Send the calls' messages with one retry on a fresh link; a batch that is re-sent
        whole is safe because the broker drops the message ids it has already accepted.
        Returns the calls that a message too large for any batch failed (and why): only
        those fail, not the calls they travelled with."""
        for attempt in (1, 2):
            try:
                async with translated_errors(pool, slot, where):
                    sender = await pool.link(slot)
                    refused: dict[_Call, str] = {}
                    transfers: Sequence[Sendable | ServiceBusMessageBatch]
                    if len(carried) == 1 and carried[0].alone:
                        transfers = carried[0].messages
                    else:
                        transfers = await _batches(sender, carried, refused, where)
                    for transfer in transfers:
                        await sender.send_messages(transfer)
                        self.transfers += 1
                return refused
            except BusUnavailable:
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def open_early(self, queues: Iterable[str]) -> None:
        """Open one link to each of `queues` now, one after another in the background.

        Why: the first send to a queue opens its link, and a link opened under full load
        took seconds (past the send's 10 s deadline, at a 500-order run's start on a loaded
        machine), while the sends behind it waited in its line. The nudges of a first burst
        of orders were such sends: the only ones to `scheduler` (bench/README.md, "The
        first sends"). A send that comes while its queue's link is still opening waits for
        it as it would behind any open. A failure is quiet: the send that needs the link
        opens it, and reports what fails then."""
        if self._opening_early is None:
            self._opening_early = asyncio.create_task(self._open_each(tuple(queues)))

    async def _open_each(self, queues: tuple[str, ...]) -> None:
        for queue in queues:
            pool = self._pool(queue)
            if any(pool.senders):
                continue
            with contextlib.suppress(BusUnavailable):
                async with (
                    bounded(self._send_timeout),
                    pool.slot() as slot,
                    translated_errors(pool, slot),
                ):
                    await pool.link(slot)

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
            async with (
                asyncio.timeout(max(self._send_timeout, 2 * PING_TIMEOUT)),
                self._opens.turn(),
            ):
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
        client closes once no link is opening (each open has its turn): its close walks
        the set of its links, which a link failing to open changes under it."""
        early = self._opening_early
        if early is not None and not early.done():
            early.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await early
        await asyncio.gather(*(pool.close() for pool in self._pools.values()))
        opening = self._opening_pinger
        if opening is not None and not opening.done():
            opening.cancel()
            with contextlib.suppress(asyncio.CancelledError, *_SEND_ERRORS):
                await opening
        self._drop_pinger()
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(t for t in _closing if t.get_loop() is loop))
        async with self._opens.turn():
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


SCHEDULED_ENQUEUE_TIME = "x-opt-scheduled-enqueue-time"
"""The message annotation Service Bus takes a message's scheduled enqueue time from."""


def _message(message: Outgoing, body: str) -> AmqpAnnotatedMessage:
    """The AMQP message itself, which the SDK sends as it is. A ServiceBusMessage with
    the same fields encodes to the same bytes (tests/unit/test_bus_messages.py), but its
    constructor runs every property setter, each of which measures the message's
    sections by listing their fields: 39 us a message against 12 (bench/README.md,
    "The app's CPU outside the Table path")."""
    properties = {"orderId": str(message.body.get("orderId", ""))}
    properties.update(message.properties.items())
    return AmqpAnnotatedMessage(
        data_body=body,
        properties={"message_id": message.message_id, "content_type": "application/json"},
        application_properties=properties,
        annotations=(
            None if message.deliver_at is None else {SCHEDULED_ENQUEUE_TIME: message.deliver_at}
        ),
    )


def _tell(calls: Sequence[_Call], failed: str | None) -> None:
    """Each carried caller learns its transfer's outcome: None, it went; else why not (an
    exception of its own, so that no two callers share a traceback)."""
    for call in calls:
        if call.turn.done():
            continue  # it gave up waiting
        if failed is None:
            call.turn.set_result(None)
        else:
            call.turn.set_exception(BusUnavailable(failed))


async def _batches(
    sender: ServiceBusSender, calls: list[_Call], refused: dict[_Call, str], where: str
) -> list[ServiceBusMessageBatch]:
    """As few batches as the link's size limit allows, the calls' messages in order. A
    message too large for a batch of its own (it would be too large alone too) fails its
    call, noted in `refused`; the call's later messages stay behind, its earlier ones
    still go (a resend of its outbox is dropped as duplicates)."""
    batches = [await sender.create_message_batch()]
    for call in calls:
        for message in call.messages:
            try:
                batches[-1].add_message(message)
                continue
            except MessageSizeExceededError as exc:
                error = exc
            if len(batches[-1]):
                fresh = await sender.create_message_batch()
                try:
                    fresh.add_message(message)
                    batches.append(fresh)
                    continue
                except MessageSizeExceededError as exc:
                    error = exc
            refused[call] = f"{where}{error}"
            break
    return [batch for batch in batches if len(batch)]
