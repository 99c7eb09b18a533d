"""The broker's IO loop: sockets on one side, proton's C protocol engine on the other.

proton's Python ``Container`` turns every socket readiness, transport change and timer into
a Python event that walks a chain of handlers: about twenty events per message, which was
most of the broker's CPU. Here a turn selects once, feeds each readable socket's bytes to its
transport, hands the engine's endpoint and delivery events to the handler, lets the handler
end the turn (the store commit, then the acknowledgements it held back), and writes what each
transport has to say in one send per socket.
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Protocol

from cproton import (  # type: ignore[import-untyped]
    PN_TRANSPORT,
    isnull,
    pn_collector_peek,
    pn_collector_pop,
    pn_event_transport,
    pn_event_type,
)
from proton import Collector, Connection, Event, ProtonException, Transport

log = logging.getLogger(__name__)

_READ, _WRITE = selectors.EVENT_READ, selectors.EVENT_WRITE
_BACKLOG = 128
_LONGEST_SLEEP = 1.0


class TurnHandler(Protocol):
    event_numbers: frozenset[int]
    """The engine's event types the handler takes; the rest are dropped unwrapped."""

    def on_connected(self, transport: Any, connection: Any) -> None:
        """A client connected: configure its transport (SASL) and connection before any
        byte is read."""

    def on_event(self, event: Event) -> None:
        """An endpoint, flow or delivery event from the protocol engine."""

    def on_turn(self, now: float) -> float:
        """All input of this turn is handled: commit, acknowledge, run what is due.
        Returns when (monotonic seconds) the handler next needs a turn without input."""

    def on_closed(self, connection: Any) -> None:
        """A client's transport is gone: forget its links."""


@dataclass(eq=False, slots=True)
class _Client:
    sock: socket.socket
    transport: Any
    connection: Any
    interest: int = 0
    deadline: float = 0.0


class IOLoop:
    """One thread: ``listen`` binds, ``run`` serves until ``request_stop`` (any thread)."""

    def __init__(self, handler: TurnHandler) -> None:
        self._handler = handler
        self._collector = Collector()
        self._selector = selectors.DefaultSelector()
        self._listener: socket.socket | None = None
        self._wake_in, self._wake_out = socket.socketpair()
        self._wake_in.setblocking(False)
        self._wake_out.setblocking(False)
        self._selector.register(self._wake_in, _READ, None)
        self._clients: dict[socket.socket, _Client] = {}
        self._by_transport: dict[Any, _Client] = {}
        # Clients whose transport may have output, input room or a timer to serve.
        self._dirty: set[_Client] = set()
        self._stop = threading.Event()
        self._closed = False

    def listen(self, host: str, port: int) -> int:
        listener = socket.socket()
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, True)
            listener.bind((host, port))
            listener.listen(_BACKLOG)
            listener.setblocking(False)
        except BaseException:
            listener.close()
            raise
        self._listener = listener
        self._selector.register(listener, _READ, None)
        return int(listener.getsockname()[1])

    def request_stop(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):  # closed already, or a wake-up byte is waiting
            self._wake_out.send(b"x")

    def run(self) -> None:
        try:
            wake_at = time.monotonic()
            while not self._stop.is_set():
                self._turn(wake_at)
                wake_at = self._handler.on_turn(time.monotonic())
                self._drain_events()
                self._write_all()
        finally:
            self.close()

    def close(self) -> None:
        """Drop every connection without a goodbye (as a stopping broker does) and the sockets."""
        if self._closed:
            return
        self._closed = True
        for client in list(self._clients.values()):
            self._forget(client)
        if self._listener is not None:
            self._listener.close()
        self._wake_in.close()
        self._wake_out.close()
        self._selector.close()

    # -- one turn --------------------------------------------------------------------------

    def _turn(self, wake_at: float) -> None:
        now = time.monotonic()
        deadlines = [wake_at, now + _LONGEST_SLEEP]
        deadlines += [c.deadline for c in self._clients.values() if c.deadline]
        timeout = 0.0 if self._dirty else max(0.0, min(deadlines) - now)
        for key, mask in self._selector.select(timeout):
            client: _Client | None = key.data
            if client is not None:
                self._dirty.add(client)
                if mask & _READ:
                    self._read(client)
            elif key.fileobj is self._listener:
                self._accept()
            else:
                self._drain_wake()
        now = time.monotonic()
        self._dirty.update(c for c in self._clients.values() if c.deadline and c.deadline <= now)
        self._drain_events()

    def _drain_events(self) -> None:
        """Hand the handler its events. Most are PN_TRANSPORT (a connection has output
        waiting): they only mark the client for the turn's writes. Events are read by number
        through proton's C binding, so that no Python wrappers are built (proton's
        Collector.peek builds them for every event) except for the events the handler takes."""
        collector = self._collector._impl
        handler = self._handler
        wanted = handler.event_numbers
        while not isnull(impl := pn_collector_peek(collector)):
            try:
                number = pn_event_type(impl)
                if number == PN_TRANSPORT:
                    client = self._by_transport.get(pn_event_transport(impl))
                    if client is not None:
                        self._dirty.add(client)
                elif number in wanted:
                    handler.on_event(Event.wrap(impl))
            finally:
                pn_collector_pop(collector)

    def _accept(self) -> None:
        assert self._listener is not None
        while True:
            try:
                sock, _address = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.warning("accept failed: %s", exc)
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, True)
            connection = Connection()
            connection.collect(self._collector)
            transport = Transport(Transport.SERVER)
            self._handler.on_connected(transport, connection)
            transport.bind(connection)
            client = _Client(sock, transport, connection)
            self._clients[sock] = client
            self._by_transport[transport._impl] = client
            self._dirty.add(client)

    def _drain_wake(self) -> None:
        try:
            while self._wake_in.recv(512):
                pass
        except (BlockingIOError, InterruptedError):
            pass

    def _read(self, client: _Client) -> None:
        transport = client.transport
        try:
            capacity = transport.capacity()
        except ProtonException:
            capacity = -1
        if capacity <= 0:
            return
        try:
            data = client.sock.recv(capacity)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            log.debug("recv failed: %s", exc)
            data = b""
        try:
            if data:
                transport.push(data)
            else:
                transport.close_tail()
        except ProtonException as exc:
            log.debug("transport refused input: %s", exc)

    def _write_all(self) -> None:
        """Serve the clients that had input, output or a timer this turn; the others' sockets
        and transports stand as they were."""
        now = time.monotonic()
        dirty, self._dirty = self._dirty, set()
        for client in dirty:
            if client.sock not in self._clients:
                continue  # forgotten this turn
            self._write(client)
            client.deadline = client.transport.tick(now)
            self._update(client)
        self._drain_events()

    def _write(self, client: _Client) -> None:
        transport = client.transport
        try:
            pending = transport.pending()
        except ProtonException:
            return
        if pending <= 0:
            return
        try:
            sent = client.sock.send(transport.peek(pending))
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            log.debug("send failed: %s", exc)
            transport.close_head()
            return
        transport.pop(sent)

    def _update(self, client: _Client) -> None:
        """Wait for what the transport can take or has to give; forget it once it is closed."""
        transport = client.transport
        try:
            reading = transport.capacity() > 0
            writing = transport.pending() > 0
        except ProtonException:
            reading = writing = False
        if transport.closed or (not reading and not writing and _ended(transport)):
            self._forget(client)
            self._handler.on_closed(client.connection)
            return
        interest = (_READ if reading else 0) | (_WRITE if writing else 0)
        if interest == client.interest:
            return
        if client.interest == 0:
            self._selector.register(client.sock, interest, client)
        elif interest == 0:
            self._selector.unregister(client.sock)
        else:
            self._selector.modify(client.sock, interest, client)
        client.interest = interest

    def _forget(self, client: _Client) -> None:
        self._clients.pop(client.sock, None)
        self._by_transport.pop(client.transport._impl, None)
        self._dirty.discard(client)
        if client.interest:
            self._selector.unregister(client.sock)
            client.interest = 0
        client.sock.close()
        client.transport.unbind()


def _ended(transport: Any) -> bool:
    """Input closed and no output left: nothing more can happen on this socket."""
    try:
        return bool(transport.capacity() < 0 and transport.pending() < 0)
    except ProtonException:
        return True
