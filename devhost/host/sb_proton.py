"""The host's own AMQP connection to devhost's broker: receiving, settling and lock
renewal in qpid-proton's C engine, on a thread of its own.

In Azure the Functions host, a separate .NET process, receives from Service Bus, renews
locks and settles; the Python worker only runs handlers. The SDK's receiver did that work
in the app's interpreter on its pure-Python AMQP (bench/README.md, issue #25). Here
proton's engine, driven by an asyncio loop on a thread of its own, one per connection
setting, does it and hands each message to the app's event loop, which hands settlements
back; the app's own sends stay on the SDK.

Each link holds at most its window of unsettled messages, credit going back as each is
settled (``maxConcurrentCalls``, as the host with ``prefetchCount`` 0). Settlements wait
for the broker's outcome, so a lost lock is reported as the SDK reports it. Locks of held
messages are renewed here while a handler runs, up to ``maxAutoLockRenewalDuration``.

Only devhost's broker is spoken to this way: it names itself when the connection opens
(``BROKER_CONTAINER``); anything else raises ``ForeignBroker`` and gets the SDK's receiver.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, cast
from urllib.parse import urlparse

from cproton import ffi as _ffi  # type: ignore[import-untyped]
from cproton import lib as _lib
from proton import (
    UNDESCRIBED,
    Array,
    Collector,
    Connection,
    Data,
    Delivery,
    Endpoint,
    Link,
    Transport,
    TransportException,
)
from proton import Message as AmqpMessage

from devhost.broker.addresses import BROKER_CONTAINER, MANAGEMENT_SUFFIX
from devhost.host.sb_decode import decode
from devhost.host.sb_links import Delivered, ForeignBroker

log = logging.getLogger("devhost.servicebus")

THREAD_NAME = "devhost-amqp"
"""The host's thread: bench.throughput reports its CPU as the host's share."""
RENEW_CHECK_SECONDS = 0.5
CLOSE_SECONDS = 5.0
RENEW_AHEAD_SECONDS = 10.0
RENEW_OPERATION = "com.microsoft:renew-lock"
_PLAIN: Any = UNDESCRIBED
_OUTCOMES = {Delivery.ACCEPTED, Delivery.MODIFIED, Delivery.RELEASED}


class ConnectionLost(ConnectionError):
    """The connection to the broker failed or closed."""


class LinkRefused(Exception):
    """The broker detached a link with an error (an unknown queue, say)."""


class SettlementRefused(Exception):
    """The broker did not take a settlement: the message's lock was lost."""


def _delivery_tag(delivery: Any) -> bytes:
    """proton's Delivery.tag decodes tags as UTF-8; a lock token is 16 raw bytes."""
    raw = _lib.pn_delivery_tag(delivery._impl)
    return bytes(_ffi.unpack(raw.start, raw.size))


def name_os_thread(name: str) -> None:
    """Give the OS thread the name (Python 3.11 names only its own object), so that its
    CPU can be told from the app's by name; best effort, Linux only."""
    with contextlib.suppress(Exception):
        import ctypes  # noqa: PLC0415

        ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME


class ProtonLinks:
    """The app's event loop's side of one connection; the engine runs on its own thread."""

    def __init__(self, url: str, renewal_seconds: float) -> None:
        self._url = url
        self._renewal_seconds = renewal_seconds
        self._engine: _Engine | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._outbox: collections.deque[Callable[[], None]] = collections.deque()
        self._outbox_posted = False

    async def open(self, queue: str, window: int, function: str) -> ProtonLink:
        engine = self._started()
        link = ProtonLink(self, engine, queue, function)
        opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        engine.call(lambda: engine.attach(link, window, opened))
        try:
            await opened
        except BaseException:
            engine.call(lambda: engine.detach(link, None))
            raise
        return link

    def _started(self) -> _Engine:
        if self._engine is None:
            self._loop = asyncio.get_running_loop()
            self._engine = _Engine(self, self._url, self._renewal_seconds)
            self._thread = threading.Thread(target=self._engine.run, name=THREAD_NAME, daemon=True)
            self._thread.start()
        return self._engine

    def to_loop(self, work: Callable[[], None]) -> None:
        """From the host's thread: run `work` on the app's loop, one wake-up per batch."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        self._outbox.append(work)
        if not self._outbox_posted:
            self._outbox_posted = True
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(self._drain_outbox)

    def _drain_outbox(self) -> None:
        self._outbox_posted = False
        while self._outbox:
            self._outbox.popleft()()

    async def close(self) -> None:
        engine, thread = self._engine, self._thread
        if engine is None or thread is None:
            return
        self._engine = self._thread = None
        engine.call(engine.shutdown)
        await asyncio.to_thread(thread.join, 5.0)
        self._drain_outbox()


class ProtonLink:
    """One trigger's receiver: messages arrive from the host's thread into a buffer here.
    It holds no proton object: the engine keeps its receiver (see ``_Engine``)."""

    def __init__(self, links: ProtonLinks, engine: _Engine, queue: str, function: str) -> None:
        self.queue = queue
        self.function = function
        self._links = links
        self._engine = engine
        self._buffer: collections.deque[Delivered] = collections.deque()
        self._arrived = asyncio.Event()
        self._error: BaseException | None = None

    # -- from the host's thread, through to_loop --------------------------------------

    def arrived(self, delivered: Delivered) -> None:
        self._buffer.append(delivered)
        self._arrived.set()

    def lost(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
        self._arrived.set()

    # -- the trigger's side ----------------------------------------------------------------

    async def receive(self, max_count: int, wait: float) -> list[Delivered]:
        if not self._buffer and self._error is None:
            self._arrived.clear()
            try:
                async with asyncio.timeout(wait):
                    await self._arrived.wait()
            except TimeoutError:
                return []
        if self._error is not None and not self._buffer:
            raise self._error
        taken = [self._buffer.popleft() for _ in range(min(max_count, len(self._buffer)))]
        return taken

    async def complete(self, delivered: Delivered) -> None:
        await self._settle(delivered, Delivery.ACCEPTED)

    async def abandon(self, delivered: Delivered) -> None:
        await self._settle(delivered, Delivery.MODIFIED)

    async def _settle(self, delivered: Delivered, outcome: Any) -> None:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        engine = self._engine
        engine.call(lambda: engine.settle(delivered.handle, outcome, done))
        await done

    async def close(self) -> None:
        self._buffer.clear()
        closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        engine = self._engine
        engine.call(lambda: engine.detach(self, closed))
        await asyncio.wait_for(closed, CLOSE_SECONDS)


class _Held:
    """A message whose lock the host holds, and the app's handle on it. ``delivery`` is
    touched, and let go of, on the host's thread only (see ``_Engine``)."""

    __slots__ = (
        "delivery",
        "link",
        "lock_ms",
        "locked_until_ms",
        "message_id",
        "renewing",
        "settling",
        "since",
    )

    def __init__(
        self, delivery: Any, link: ProtonLink, message_id: str | None, locked_until_ms: int | None
    ) -> None:
        self.delivery: Any = delivery
        self.link = link
        self.message_id = message_id
        self.locked_until_ms = locked_until_ms
        now = time.time_ns() // 1_000_000
        self.lock_ms = max(0, (locked_until_ms or now) - now)
        self.since = time.monotonic()
        self.settling: asyncio.Future[None] | None = None
        self.renewing = False


class _Protocol(asyncio.Protocol):
    """The socket under the engine; bytes go to proton as they come."""

    def __init__(self, engine: _Engine) -> None:
        self._engine = engine

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._engine.connected(cast(asyncio.Transport, transport))

    def data_received(self, data: bytes) -> None:
        self._engine.received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._engine.socket_lost(exc)


class _Engine:
    """proton's engine driven by an asyncio loop of its own, on the host's thread: no
    proton reactor, whose Python I/O loop cost more than the AMQP work itself. Calls from
    the app's loop come through ``call``; results go back through ``ProtonLinks.to_loop``.

    No proton object reaches the app's loop, not even as an opaque handle: proton is not
    thread-safe, and dropping a wrapper is an engine call. The last wrapper of a settled
    delivery unlinks it from its link and pools it for the next transfer; dropped on the
    app's loop while this thread took in transfers, that raced the engine, and a link
    stopped taking messages with its window used up (issue #25)."""

    def __init__(self, links: ProtonLinks, url: str, renewal_seconds: float) -> None:
        parsed = urlparse(url)
        self._host = parsed.hostname or "127.0.0.1"
        self._port = parsed.port or 5672
        self._links = links
        self._renewal_seconds = renewal_seconds
        self.loop = asyncio.new_event_loop()
        self._inbox: collections.deque[Callable[[], None]] = collections.deque()
        self._woken = False
        self._socket: asyncio.Transport | None = None
        self._transport: Any = None
        self._collector: Any = None
        self._connection: Any = None
        self._session: Any = None
        self._connecting = False
        self._ready = False
        self._waiting: list[tuple[ProtonLink, int, asyncio.Future[None]]] = []
        self._opening: dict[Any, tuple[ProtonLink, asyncio.Future[None]]] = {}
        self._open: dict[Any, ProtonLink] = {}
        self._receivers: dict[ProtonLink, Any] = {}
        self._owed: dict[Any, int] = {}
        self._held: dict[Any, _Held] = {}
        self._management: dict[str, tuple[Any, Any]] = {}
        self._requests: dict[str, _Held] = {}
        self._sweep: asyncio.TimerHandle | None = None
        self._stopping = False

    # -- thread plumbing -------------------------------------------------------------------

    def run(self) -> None:
        name_os_thread(THREAD_NAME)
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            self._lose(ConnectionLost("the host's AMQP thread stopped"))
            self.loop.close()

    def call(self, work: Callable[[], None]) -> None:
        """From the app's loop: run `work` on the host's thread. The wake-up waits for the
        end of the app loop's turn, so that every settlement of the turn shares it: each
        wake-up hands the GIL to this thread, and the app's loop waits to get it back."""
        if self.loop.is_closed():
            raise ConnectionLost("the host's AMQP thread has stopped")
        self._inbox.append(work)
        if not self._woken:
            self._woken = True
            asyncio.get_running_loop().call_soon(self._wake)

    def _wake(self) -> None:
        self._woken = False
        with contextlib.suppress(RuntimeError):  # the host's loop is closed
            self.loop.call_soon_threadsafe(self._drain_inbox)

    def _drain_inbox(self) -> None:
        while self._inbox:
            try:
                self._inbox.popleft()()
            except Exception:
                log.exception("the host's AMQP thread failed on a request")
        for proton_link, owed in self._owed.items():
            if owed and proton_link.state & Endpoint.LOCAL_ACTIVE:
                proton_link.flow(owed)
        self._owed.clear()
        self._flush()

    def _post(self, work: Callable[[], None]) -> None:
        self._links.to_loop(work)

    def _resolve(self, future: asyncio.Future[None] | None, error: BaseException | None) -> None:
        if future is None:
            return

        def settle() -> None:
            if future.done():
                return
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(error)

        self._post(settle)

    # -- connection ------------------------------------------------------------------------

    def attach(self, link: ProtonLink, window: int, opened: asyncio.Future[None]) -> None:
        if self._stopping:
            self._resolve(opened, ConnectionLost("the host is stopping"))
            return
        if self._ready:
            self._attach_now(link, window, opened)
            return
        self._waiting.append((link, window, opened))
        if not self._connecting and self._socket is None:
            self._connecting = True
            self.loop.create_task(self._connect())

    async def _connect(self) -> None:
        try:
            await self.loop.create_connection(lambda: _Protocol(self), self._host, self._port)
        except OSError as exc:
            self._lose(ConnectionLost(f"{type(exc).__name__}: {exc}"))
        finally:
            self._connecting = False

    def connected(self, socket: asyncio.Transport) -> None:
        self._socket = socket
        connection = Connection()
        connection.container = f"devhost-host-{uuid.uuid4()}"
        connection.hostname = self._host
        transport = Transport()
        transport.sasl().allowed_mechs("ANONYMOUS")
        transport.bind(connection)
        collector = Collector()
        connection.collect(collector)
        connection.open()
        session = connection.session()
        session.open()
        self._connection, self._transport, self._collector = connection, transport, collector
        self._session = session
        self._flush()

    def received(self, data: bytes) -> None:
        transport = self._transport
        if transport is None:
            return
        view = memoryview(data)
        try:
            while view:
                room = transport.capacity()
                if room <= 0:
                    break
                transport.push(bytes(view[:room]))
                view = view[room:]
        except TransportException as exc:
            log.debug("AMQP input refused: %s", exc)
        self._process()
        self._flush()

    def socket_lost(self, exc: Exception | None) -> None:
        self._socket = None
        self._lose(ConnectionLost(f"connection closed: {exc}" if exc else "connection closed"))

    def _flush(self) -> None:
        transport, socket = self._transport, self._socket
        if transport is None or socket is None:
            return
        while True:
            pending = transport.pending()
            if pending < 0:  # the engine closed its output
                socket.close()
                return
            if pending == 0:
                return
            data = transport.peek(pending)
            if not data:
                return
            socket.write(data)
            transport.pop(len(data))

    def _process(self) -> None:
        """Handle the engine's events; only the few the host acts on are wrapped."""
        collector = self._collector
        while collector is not None:
            event = _lib.pn_collector_peek(collector._impl)
            if event == _ffi.NULL:
                return
            kind = _lib.pn_event_type(event)
            try:
                if kind == _lib.PN_DELIVERY:
                    self._on_delivery(Delivery.wrap(_lib.pn_event_delivery(event)))
                elif kind == _lib.PN_LINK_REMOTE_OPEN:
                    self._on_link_remote_open(Link.wrap(_lib.pn_event_link(event)))
                elif kind == _lib.PN_LINK_REMOTE_CLOSE:
                    self._on_link_remote_close(Link.wrap(_lib.pn_event_link(event)))
                elif kind == _lib.PN_CONNECTION_REMOTE_OPEN:
                    self._on_connection_remote_open()
                elif kind == _lib.PN_CONNECTION_REMOTE_CLOSE:
                    self._on_connection_remote_close()
                elif kind == _lib.PN_TRANSPORT_ERROR:
                    condition = self._transport.condition if self._transport else None
                    self._lose(
                        ConnectionLost(condition.description if condition else "transport error")
                    )
            except Exception:
                log.exception("the host's AMQP thread failed on an event")
            if self._collector is None:
                return
            _lib.pn_collector_pop(collector._impl)

    def _on_connection_remote_open(self) -> None:
        connection = self._connection
        if connection.remote_container != BROKER_CONTAINER:
            who = connection.remote_container or "a peer without a container id"
            self._lose(ForeignBroker(f"it answers as {who!r}"))
            return
        self._ready = True
        waiting, self._waiting = self._waiting, []
        for link, window, opened in waiting:
            self._attach_now(link, window, opened)

    def _attach_now(self, link: ProtonLink, window: int, opened: asyncio.Future[None]) -> None:
        receiver = self._session.receiver(f"{link.queue}-{uuid.uuid4()}")
        receiver.source.address = link.queue
        receiver.target.address = link.queue
        receiver.snd_settle_mode = Link.SND_UNSETTLED
        receiver.rcv_settle_mode = Link.RCV_SECOND
        receiver.open()
        receiver.flow(window)
        self._receivers[link] = receiver
        self._opening[receiver] = (link, opened)
        self._flush()

    def _on_link_remote_open(self, proton_link: Any) -> None:
        opening = self._opening.get(proton_link)
        if opening is None:
            return
        if proton_link.remote_source.address is None:
            return  # refused: the broker attaches with a null source, then detaches
        del self._opening[proton_link]
        link, opened = opening
        self._open[proton_link] = link
        self._resolve(opened, None)

    def _on_link_remote_close(self, proton_link: Any) -> None:
        condition = proton_link.remote_condition
        error = LinkRefused(
            f"{condition.name}: {condition.description}" if condition else "link detached"
        )
        opening = self._opening.pop(proton_link, None)
        if opening is not None:
            self._receivers.pop(opening[0], None)
            self._resolve(opening[1], error)
        link = self._open.pop(proton_link, None)
        if link is not None:
            self._receivers.pop(link, None)
            self._drop_held(lambda held: held.link is link, error)
            self._post(lambda: link.lost(error))
        if proton_link.state & Endpoint.LOCAL_ACTIVE:
            proton_link.close()

    def _on_connection_remote_close(self) -> None:
        condition = self._connection.remote_condition
        self._lose(ConnectionLost(condition.description if condition else "connection closed"))

    def _lose(self, error: BaseException) -> None:
        """Everything on the connection fails: links, opens and settlements in flight."""
        socket = self._socket
        self._socket = None
        self._connection = self._transport = self._collector = self._session = None
        self._ready = False
        if socket is not None:
            socket.close()
        waiting, self._waiting = self._waiting, []
        for _, _, opened in waiting:
            self._resolve(opened, error)
        for _, opened in self._opening.values():
            self._resolve(opened, error)
        self._opening.clear()
        for link in self._open.values():
            self._post(lambda link=link: link.lost(error))  # type: ignore[misc]
        self._open.clear()
        self._receivers.clear()
        self._owed.clear()
        self._drop_held(lambda held: True, error)
        self._management.clear()
        self._requests.clear()

    def _drop_held(self, which: Callable[[_Held], bool], error: BaseException) -> None:
        for held in list(self._held.values()):
            if which(held):
                self._forget(held)
                self._resolve(held.settling, error)

    def _forget(self, held: _Held) -> None:
        """The host lets go of the delivery here, on its own thread, whoever keeps `held`."""
        del self._held[held.delivery]
        held.delivery = None

    # -- deliveries ------------------------------------------------------------------------

    def _on_delivery(self, delivery: Any) -> None:
        proton_link: Any = delivery.link
        if proton_link.is_sender:
            if delivery.remote_state or delivery.settled:
                delivery.settle()  # a renewal request the broker took
            return
        held = self._held.get(delivery)
        if held is not None:
            if delivery.settled:
                self._settled(delivery, held)
            return
        if delivery.partial or not delivery.readable:
            return
        payload = proton_link.recv(delivery.pending) or b""
        proton_link.advance()
        link = self._open.get(proton_link)
        if link is None:
            address = proton_link.source.address
            if address and address.endswith(MANAGEMENT_SUFFIX):
                delivery.update(Delivery.ACCEPTED)
                delivery.settle()
                self._renewed(payload)
                return
            delivery.update(Delivery.RELEASED)
            delivery.settle()
            return
        try:
            message = decode(payload, _delivery_tag(delivery))
        except Exception as exc:
            log.warning(
                "%s: undecodable message on %s abandoned: %s", link.function, link.queue, exc
            )
            delivery.local.failed = True
            delivery.update(Delivery.MODIFIED)
            delivery.settle()
            self._owed[proton_link] = self._owed.get(proton_link, 0) + 1
            return
        locked_until = message.locked_until_utc
        held = _Held(
            delivery,
            link,
            message.message_id,
            None if locked_until is None else int(locked_until.timestamp() * 1000),
        )
        self._held[delivery] = held
        self._arm_sweep()
        delivered = Delivered(message, held)
        self._post(lambda: link.arrived(delivered))

    def settle(self, held: _Held, outcome: Any, done: asyncio.Future[None]) -> None:
        delivery = held.delivery
        if delivery is None or held.settling is not None:
            self._resolve(done, ConnectionLost("the message's link is gone"))
            return
        held.settling = done
        if outcome == Delivery.MODIFIED:
            delivery.local.failed = True
        # Delivery.update also copies the local disposition's data, annotations and
        # condition into the engine; the host sets none of them.
        _lib.pn_delivery_update(delivery._impl, outcome)
        proton_link = self._receivers.get(held.link)
        if proton_link is not None and proton_link in self._open:
            self._owed[proton_link] = self._owed.get(proton_link, 0) + 1

    def _settled(self, delivery: Any, held: _Held) -> None:
        """The broker's answer to a settlement (it settles with the outcome it took)."""
        self._forget(held)
        state = delivery.remote_state
        error: BaseException | None = None
        if state not in _OUTCOMES:
            condition = delivery.remote.condition
            error = SettlementRefused(
                condition.description if condition is not None else f"outcome {state}"
            )
        delivery.settle()
        self._resolve(held.settling, error)

    def detach(self, link: ProtonLink, closed: asyncio.Future[None] | None) -> None:
        """Hand back what the link holds unsettled, then detach it; an open still waiting
        for the connection is dropped, else it would attach later, for nobody."""
        self._waiting = [waiting for waiting in self._waiting if waiting[0] is not link]
        proton_link = self._receivers.pop(link, None)
        self._open.pop(proton_link, None)
        self._opening.pop(proton_link, None)
        self._owed.pop(proton_link, None)
        for held in list(self._held.values()):
            if held.link is link and held.settling is None:
                delivery = held.delivery
                self._forget(held)
                delivery.update(Delivery.RELEASED)
                delivery.settle()
        if proton_link is not None and proton_link.state & Endpoint.LOCAL_ACTIVE:
            proton_link.close()
        self._resolve(closed, None)

    # -- lock renewal ----------------------------------------------------------------------

    def _arm_sweep(self) -> None:
        if self._sweep is None and not self._stopping:
            self._sweep = self.loop.call_later(RENEW_CHECK_SECONDS, self._renew_due)

    def _renew_due(self) -> None:
        """Renew each held lock when it is within RENEW_AHEAD_SECONDS (or half its
        duration) of expiring, for as long as maxAutoLockRenewalDuration allows."""
        self._sweep = None
        if not self._held or not self._ready:
            return
        now_ms = time.time_ns() // 1_000_000
        now = time.monotonic()
        for held in self._held.values():
            if held.settling is not None or held.renewing or held.locked_until_ms is None:
                continue
            if now - held.since > self._renewal_seconds:
                continue
            ahead = min(RENEW_AHEAD_SECONDS * 1000, held.lock_ms / 2)
            if held.locked_until_ms - now_ms <= ahead:
                self._request_renewal(held)
        self._flush()
        self._arm_sweep()

    def _request_renewal(self, held: _Held) -> None:
        queue = held.link.queue
        pair = self._management.get(queue)
        if pair is None:
            address = queue + MANAGEMENT_SUFFIX
            name = f"{address}-{uuid.uuid4()}"
            sender = self._session.sender(f"{name}-requests")
            sender.target.address = address
            sender.open()
            receiver = self._session.receiver(f"{name}-responses")
            receiver.source.address = address
            receiver.target.address = name
            receiver.open()
            receiver.flow(100)
            pair = self._management[queue] = (sender, receiver)
        sender, receiver = pair
        if receiver.credit < 50:
            receiver.flow(100 - receiver.credit)
        request_id = str(uuid.uuid4())
        token = uuid.UUID(bytes_le=_delivery_tag(held.delivery))
        request = AmqpMessage(
            id=request_id,
            reply_to=receiver.source.address,
            properties={"operation": RENEW_OPERATION},
            body={"lock-tokens": Array(_PLAIN, Data.UUID, token)},
        )
        held.renewing = True
        self._requests[request_id] = held
        sender.delivery(uuid.uuid4().bytes)
        sender.stream(request.encode())
        sender.advance()

    def _renewed(self, payload: bytes) -> None:
        response = AmqpMessage()
        response.decode(payload)
        held = self._requests.pop(str(response.correlation_id), None)
        if held is None:
            return
        held.renewing = False
        properties: dict[Any, Any] = response.properties or {}
        status = properties.get("statusCode")
        body = response.body if isinstance(response.body, dict) else {}
        expirations = body.get("expirations")
        if status == 200 and isinstance(expirations, Array) and expirations.elements:
            locked_until = int(expirations.elements[0])
            now = time.time_ns() // 1_000_000
            held.lock_ms = max(held.lock_ms, locked_until - now)
            held.locked_until_ms = locked_until
            return
        link = held.link
        log.warning(
            "%s: lock renewal for message %s on %s failed: %s",
            link.function,
            held.message_id,
            link.queue,
            properties.get("statusDescription", status),
        )
        held.locked_until_ms = None  # not renewed again

    # -- stop ------------------------------------------------------------------------------

    def shutdown(self) -> None:
        self._stopping = True
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        connection = self._connection
        if connection is not None:
            connection.close()
            self._flush()
        self._lose(ConnectionLost("the host is stopping"))
        self.loop.stop()
