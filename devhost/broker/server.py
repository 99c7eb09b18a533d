"""The proton reactor side: connections, links, transfers and dispositions.

One reactor thread runs everything AMQP. Entity links carry messages (client senders into the
engine, client receivers out of it through the dispatcher); ``$cbs`` and ``<entity>/$management``
links carry request/response pairs. An error while handling one link's event is logged and
closes that link, so one bad client cannot stop the broker.

proton's wrappers are handled as ``Any`` here: their hints make every ``event.link`` optional,
and the broker keeps its own per-link and per-delivery state as attributes on them.
"""

from __future__ import annotations

import functools
import logging
import os
import sqlite3
import time
from collections.abc import Callable
from typing import Any, TypeVar, cast

from proton import Condition, Delivery, Endpoint, Event, Handler, Link, Message, Terminus
from proton.handlers import IncomingMessageHandler, MessagingHandler
from proton.reactor import ApplicationEvent, Container, EventInjector

from . import codec
from .addresses import BROKER_CONTAINER, Node, NodeKind, resolve
from .dispatch import Dispatcher
from .engine import Engine
from .management import LOCK_LOST, ManagementNode, cbs_response
from .model import Settlement

log = logging.getLogger(__name__)

TICK_SECONDS = 0.05
"""How long settlements wait to be committed to the store."""
IDLE_TICK_SECONDS = 1.0
"""The longest the reactor sleeps with nothing due: dedupe pruning needs no more."""
RECEIVE_WINDOW = 100
MAX_MESSAGE_SIZE = 1024 * 1024
STOP_EVENT = "broker_stop"
_ACTIVE = Endpoint.LOCAL_ACTIVE | Endpoint.REMOTE_ACTIVE
# The SDK waits for the broker to settle with the outcome it asked for (rcv-settle-mode second).
_ECHO = {
    Settlement.COMPLETE: Delivery.ACCEPTED,
    Settlement.ABANDON: Delivery.MODIFIED,
    Settlement.RELEASE: Delivery.RELEASED,
    Settlement.DEAD_LETTER: Delivery.REJECTED,
}

F = TypeVar("F", bound=Callable[..., None])


class _SocketNoiseFilter(logging.Filter):
    """proton logs a client resetting its socket as an error; for a broker that is routine."""

    def filter(self, record: logging.LogRecord) -> bool:
        if str(record.msg).startswith(("Couldn't send", "Couldn't recv")):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger("proton").isEnabledFor(logging.DEBUG)
        return True


logging.getLogger("proton").addFilter(_SocketNoiseFilter())


def _guarded(method: F) -> F:
    """Log an event handler's error and close the link involved instead of the reactor dying."""

    @functools.wraps(method)
    def wrapper(self: BrokerHandler, event: Event) -> None:
        try:
            method(self, event)
        except Exception:
            log.exception("broker error in %s", method.__name__)
            link: Any = event.link
            if link is not None and not link.state & Endpoint.LOCAL_CLOSED:
                link.condition = Condition("amqp:internal-error", "broker error, see its log")
                link.close()
                self.dispatcher.remove(link)

    return cast(F, wrapper)


class _Timer(Handler):
    def __init__(self, callback: Callable[[], None]) -> None:
        super().__init__()
        self._callback = callback

    def on_timer_task(self, event: Event) -> None:
        try:
            self._callback()
        except Exception:
            log.exception("broker timer task failed")


class BrokerHandler(MessagingHandler):
    """Speaks the subset of Service Bus's AMQP dialect that the azure-servicebus SDK uses."""

    def __init__(self, engine: Engine) -> None:
        # prefetch=0: credit is granted in bulk below instead of proton's FlowController topping
        # it up after every transfer (an extra frame per message; the SDK reads frames slowly).
        super().__init__(prefetch=0, auto_accept=False, auto_settle=False)
        # proton's IncomingMessageHandler decodes every transfer into a proton.Message, losing
        # the raw bytes the broker stores and forwards; on_delivery reads transfers instead.
        handlers = cast(list[Any], self.handlers)
        self.handlers = [h for h in handlers if not isinstance(h, IncomingMessageHandler)]
        self.engine = engine
        self.management = ManagementNode(engine)
        self.dispatcher = Dispatcher(engine)
        self.injector = EventInjector()
        self._container: Any = None
        self._acceptor: Any = None
        self._connections: set[Any] = set()
        self._pending_acks: list[Any] = []
        self._flush_scheduled = False
        self._tick: Any = None
        self._tick_at = 0.0
        self._stopping = False
        self._released = False

    # -- lifecycle -------------------------------------------------------------------------

    def listen(self, host: str, port: int) -> int:
        """Bind the listening socket now, so the caller knows the port before the thread runs."""
        self._container = Container(self)
        self._container.selectable(self.injector)
        self._acceptor = self._container.acceptor(host, port)
        # proton does not expose the bound socket, and port 0 needs the real port back.
        sock = self._acceptor._selectable._delegate
        return int(sock.getsockname()[1])

    def run(self) -> None:
        try:
            self._container.run()
        finally:
            self._release()

    def _release(self) -> None:
        if self._released:
            return
        self._released = True
        # proton never closes the injector's wake-up pipe.
        for fd in self.injector.pipe:
            os.close(fd)

    def abandon(self) -> None:
        """Undo __init__ and listen() when the broker fails to start and run() never runs."""
        if self._acceptor is not None:
            self._acceptor._selectable._delegate.close()
        self._release()

    def request_stop(self) -> None:
        """Thread-safe: ask the reactor thread to close everything and return from run()."""
        if not self._released:
            self.injector.trigger(ApplicationEvent(STOP_EVENT))

    def on_reactor_init(self, event: Event) -> None:
        self._arm()

    def on_broker_stop(self, event: Event) -> None:
        """Close the listener and every connection; run() returns once all sockets are gone."""
        self._stopping = True
        if self._tick is not None:
            self._tick.cancel()
            self._tick = None
        self._flush()
        self._acceptor.close()
        self.injector.close()
        for connection in list(self._connections):
            connection.close()
            transport = connection.transport
            if transport is not None:
                transport.close_tail()
                transport.close_head()
        self._connections.clear()
        self.dispatcher.clear()

    def _on_tick(self) -> None:
        """Activate scheduled messages, expire locks and commit what settlements changed."""
        self._tick = None
        if self._stopping:
            return
        try:
            self.engine.tick()
            self.dispatcher.dispatch_woken()
            if self.engine.store_pending:
                self._flush()
        finally:
            self._arm()

    def _arm(self) -> None:
        """Wake for the next thing due instead of polling: a scheduled message or a lock
        expiry, a commit of settlements within TICK_SECONDS, else IDLE_TICK_SECONDS.

        Called after every event that can bring a deadline forward. A lock taken later
        expires a full lock duration later, so capping the sleep at that duration keeps
        lock expiry on time without re-arming on every delivery.
        """
        if self._stopping:
            return
        delay = min(IDLE_TICK_SECONDS, self.engine.limits.lock_ms / 1000)
        due = self.engine.seconds_to_deadline()
        if due is not None:
            delay = min(delay, due)
        if self.engine.store_pending:
            delay = min(delay, TICK_SECONDS)
        at = time.monotonic() + delay
        if self._tick is not None:
            if self._tick_at <= at:
                return
            self._tick.cancel()
        self._tick = self._container.schedule(delay, _Timer(self._on_tick))
        self._tick_at = at

    # -- connections -----------------------------------------------------------------------

    def on_connection_bound(self, event: Event) -> None:
        transport: Any = event.transport
        # The SDK against the emulator authenticates with SASL ANONYMOUS over plain TCP and
        # then puts a token on $cbs, which is accepted whatever it is.
        sasl = transport.sasl()
        sasl.allow_insecure_mechs = True
        sasl.allowed_mechs("ANONYMOUS PLAIN")
        connection: Any = event.connection
        connection.container = BROKER_CONTAINER
        self._connections.add(connection)

    def on_transport_error(self, event: Event) -> None:
        # A client that drops its socket without an AMQP close is routine (the SDK does so on
        # close); proton's default handler logs it as an error.
        transport: Any = event.transport
        condition = transport.condition
        log.info("connection ended: %s", condition.description if condition else "transport error")

    def on_transport_closed(self, event: Event) -> None:
        connection = event.connection
        if connection is not None:
            self._connections.discard(connection)
            self.dispatcher.remove_connection(connection)

    # -- links -----------------------------------------------------------------------------

    @_guarded
    def on_link_remote_open(self, event: Event) -> None:
        link: Any = event.link
        if not link.state & Endpoint.LOCAL_UNINIT:
            return
        address = (link.remote_source if link.is_sender else link.remote_target).address
        node = resolve(address, self.engine.queue_names)
        link.source.copy(link.remote_source)
        link.target.copy(link.remote_target)
        link.snd_settle_mode = link.remote_snd_settle_mode
        link.rcv_settle_mode = link.remote_rcv_settle_mode
        link.max_message_size = MAX_MESSAGE_SIZE
        if node is None:
            self._refuse(
                link, "amqp:not-found", f"The messaging entity '{address}' could not be found."
            )
            return
        if node.kind is NodeKind.ENTITY and node.dead_letter and link.is_receiver:
            self._refuse(
                link, "amqp:not-allowed", "Messages cannot be sent to a dead-letter queue."
            )
            return
        link.sb_node = node
        link.open()
        if link.is_receiver:
            link.flow(RECEIVE_WINDOW)
        elif node.kind is NodeKind.ENTITY:
            presettled = link.remote_snd_settle_mode == Link.SND_SETTLED  # receive-and-delete
            self.dispatcher.add(node.entity, link, presettled)

    @staticmethod
    def _refuse(link: Any, condition: str, description: str) -> None:
        """As Service Bus does: attach with a null terminus for the entity, then detach with the
        error, which the SDK turns into e.g. MessagingEntityNotFoundError."""
        log.info("refusing link %s: %s", link.name, description)
        (link.target if link.is_receiver else link.source).type = Terminus.UNSPECIFIED
        link.open()
        link.condition = Condition(condition, description)
        link.close()

    def on_link_remote_close(self, event: Event) -> None:
        self.dispatcher.remove(event.link)

    @_guarded
    def on_sendable(self, event: Event) -> None:
        node: Node | None = getattr(event.link, "sb_node", None)
        if node is not None and node.kind is NodeKind.ENTITY:
            self.dispatcher.dispatch(node.entity)
            self._arm()  # a message that expired on the way out was dead-lettered: commit it

    # -- outcomes from client receivers ----------------------------------------------------

    @_guarded
    def on_accepted(self, event: Event) -> None:
        self._settle(event.delivery, Settlement.COMPLETE)

    @_guarded
    def on_rejected(self, event: Event) -> None:
        delivery: Any = event.delivery
        condition = delivery.remote.condition
        info = (condition.info if condition is not None else None) or {}
        reason = info.get("DeadLetterReason")
        description = info.get("DeadLetterErrorDescription")
        self._settle(
            delivery,
            Settlement.DEAD_LETTER,
            None if reason is None else str(reason),
            None if description is None else str(description),
        )

    @_guarded
    def on_released(self, event: Event) -> None:
        delivery: Any = event.delivery
        if delivery.remote_state == Delivery.MODIFIED:
            # Abandon (delivery-failed) or defer (undeliverable-here); deferral is not
            # supported, so both make the message available again with its count raised.
            self._settle(delivery, Settlement.ABANDON)
        else:
            # Released: the SDK's way to hand back prefetched messages it never surfaced.
            self._settle(delivery, Settlement.RELEASE)

    @_guarded
    def on_settled(self, event: Event) -> None:
        # Only reached without an outcome (with one, the handlers above ran first): the client
        # gave the message up, so it goes back unchanged.
        self._settle(event.delivery, Settlement.RELEASE)

    def _settle(
        self,
        delivery: Any,
        settlement: Settlement,
        reason: str | None = None,
        description: str | None = None,
    ) -> None:
        if getattr(delivery, "sb_done", False):
            return
        delivery.sb_done = True
        token = getattr(delivery, "sb_token", None)
        if token is None:  # pre-settled or a management response
            delivery.settle()
            return
        if self.engine.settle(token, settlement, reason, description):
            if settlement is Settlement.ABANDON:
                delivery.local.failed = True
            delivery.update(_ECHO[settlement])
        else:
            delivery.local.condition = Condition(LOCK_LOST, "The lock on the message was lost.")
            delivery.update(Delivery.REJECTED)
        # The SDK reports "did not confirm the settlement" until this settled echo arrives.
        delivery.settle()
        self.dispatcher.dispatch_woken()
        self._arm()

    # -- transfers from clients ------------------------------------------------------------

    @_guarded
    def on_delivery(self, event: Event) -> None:
        delivery: Any = event.delivery
        link: Any = delivery.link
        if link.is_sender:
            return  # outcomes of our transfers arrive via on_accepted & co.
        if delivery.aborted:
            delivery.settle()
            return
        if delivery.partial or not delivery.readable:
            return
        payload: bytes = link.recv(delivery.pending) or b""
        link.advance()
        if link.credit < RECEIVE_WINDOW // 2:
            link.flow(RECEIVE_WINDOW - link.credit)
        node: Node | None = getattr(link, "sb_node", None)
        if node is None:
            self._reject(delivery, "amqp:not-found", "The link has no entity.")
        elif node.kind is NodeKind.ENTITY:
            self._on_sent(delivery, node, payload)
            self._arm()
        else:
            self._on_request(delivery, link, node, payload)
            self._arm()

    @staticmethod
    def _reject(delivery: Any, condition: str, description: str) -> None:
        delivery.local.condition = Condition(condition, description)
        delivery.update(Delivery.REJECTED)
        delivery.settle()

    def _on_sent(self, delivery: Any, node: Node, payload: bytes) -> None:
        try:
            self.engine.accept_send(node.entity, payload)
        except codec.CodecError as exc:
            log.warning("rejecting undecodable message for %s: %s", node.entity, exc)
            self._reject(delivery, "amqp:decode-error", str(exc))
            return
        self.dispatcher.dispatch_woken()
        self._pending_acks.append(delivery)
        if not self.engine.store_pending:
            self._flush()
        elif not self._flush_scheduled:
            # The ack waits for the commit; a zero delay lets one commit cover every send that
            # arrived in the same reactor pass.
            self._flush_scheduled = True
            self._container.schedule(0, _Timer(self._flush))

    def _flush(self) -> None:
        self._flush_scheduled = False
        acks, self._pending_acks = self._pending_acks, []
        try:
            self.engine.flush()
        except sqlite3.Error:
            log.exception("store commit failed; failing %d sends", len(acks))
            for delivery in acks:
                self._reject(delivery, "amqp:internal-error", "The broker could not store it.")
            return
        for delivery in acks:
            delivery.update(Delivery.ACCEPTED)
            delivery.settle()

    def _on_request(self, delivery: Any, link: Any, node: Node, payload: bytes) -> None:
        request = Message()
        request.decode(payload)
        delivery.update(Delivery.ACCEPTED)
        delivery.settle()
        if node.kind is NodeKind.CBS:
            response = cbs_response(request)
        else:
            response = self.management.handle(node.entity, request)
            self.dispatcher.dispatch_woken()
        reply_link = self._reply_link(link)
        if reply_link is None:
            log.warning("no reply link for a request on %s", link.target.address)
            return
        reply_link.send(response).settle()

    @staticmethod
    def _reply_link(request_link: Any) -> Any:
        """The sender link on the same connection whose source is the request link's target."""
        address = request_link.target.address
        fallback = None
        link = request_link.connection.link_head(_ACTIVE)
        while link is not None:
            if link.is_sender and link.source.address == address:
                if link.session == request_link.session:
                    return link
                fallback = link
            link = link.next(_ACTIVE)
        return fallback
