"""The AMQP side: connections, links, transfers and dispositions.

One thread runs everything AMQP (``loop.IOLoop``). Entity links carry messages (client senders
into the engine, client receivers out of it through the dispatcher); ``$cbs`` and
``<entity>/$management`` links carry request/response pairs. An error while handling one
link's event is logged and closes that link, so one bad client cannot stop the broker.

What a client is told waits for the store: a send's acceptance, a settlement's echo and a
management response are held until the end of the loop's turn, when one commit covers all of
them (acknowledged means stored, for sends and completions alike).

proton's wrappers are handled as ``Any`` here: their hints make every ``event.link`` optional,
and the broker keeps its own per-link and per-delivery state as attributes on them.
"""

from __future__ import annotations

import functools
import logging
import sqlite3
from collections.abc import Callable
from typing import Any, TypeVar, cast

from proton import Condition, Delivery, Endpoint, Event, Link, Message, Terminus

from . import codec
from .addresses import BROKER_CONTAINER, Node, NodeKind, resolve
from .dispatch import Dispatcher
from .engine import Engine
from .loop import IOLoop
from .management import LOCK_LOST, ManagementNode, cbs_response
from .model import Settlement

log = logging.getLogger(__name__)

TICK_SECONDS = 0.05
"""How soon a commit that failed is tried again."""
IDLE_TICK_SECONDS = 1.0
"""The longest the loop sleeps with nothing due: dedupe pruning needs no more."""
RECEIVE_WINDOW = 100
MAX_MESSAGE_SIZE = 1024 * 1024
_ACTIVE = Endpoint.LOCAL_ACTIVE | Endpoint.REMOTE_ACTIVE
_UNINIT = Endpoint.LOCAL_UNINIT
_CLOSED = Endpoint.LOCAL_CLOSED
# The SDK waits for the broker to settle with the outcome it asked for (rcv-settle-mode second).
_ECHO = {
    Settlement.COMPLETE: Delivery.ACCEPTED,
    Settlement.ABANDON: Delivery.MODIFIED,
    Settlement.RELEASE: Delivery.RELEASED,
    Settlement.DEAD_LETTER: Delivery.REJECTED,
}

F = TypeVar("F", bound=Callable[..., None])


def _guarded(method: F) -> F:
    """Log an event handler's error and close the link involved instead of the loop dying."""

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


class BrokerHandler:
    """Speaks the subset of Service Bus's AMQP dialect that the azure-servicebus SDK uses."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.management = ManagementNode(engine)
        self.dispatcher = Dispatcher(engine)
        self.loop = IOLoop(self)
        # Held until the turn's commit: sends to accept, settlements to echo, responses.
        self._pending_acks: list[Any] = []
        self._pending_echoes: list[tuple[Any, Any]] = []
        self._pending_replies: list[tuple[Any, Message]] = []
        self._tick_at = 0.0
        self._handlers: dict[Any, Callable[[Event], None]] = {
            Event.CONNECTION_REMOTE_OPEN: self._on_connection_remote_open,
            Event.SESSION_REMOTE_OPEN: self._on_session_remote_open,
            Event.LINK_REMOTE_OPEN: self.on_link_remote_open,
            Event.LINK_REMOTE_CLOSE: self.on_link_remote_close,
            Event.SESSION_REMOTE_CLOSE: self._on_session_remote_close,
            Event.CONNECTION_REMOTE_CLOSE: self._on_connection_remote_close,
            Event.LINK_FLOW: self.on_link_flow,
            Event.DELIVERY: self.on_delivery,
            Event.TRANSPORT_ERROR: self._on_transport_error,
        }
        self.event_numbers = frozenset(event_type.number for event_type in self._handlers)

    # -- lifecycle -------------------------------------------------------------------------

    def listen(self, host: str, port: int) -> int:
        """Bind the listening socket now, so the caller knows the port before the thread runs."""
        return self.loop.listen(host, port)

    def run(self) -> None:
        try:
            self.loop.run()
        finally:
            self.dispatcher.clear()

    def abandon(self) -> None:
        """Release the sockets when the broker fails to start and run() never runs."""
        self.loop.close()

    def request_stop(self) -> None:
        """Thread-safe: the loop drops every connection and run() returns."""
        self.loop.request_stop()

    # -- the loop's calls ------------------------------------------------------------------

    def on_connected(self, transport: Any, connection: Any) -> None:
        # The SDK against the emulator authenticates with SASL ANONYMOUS over plain TCP and
        # then puts a token on $cbs, which is accepted whatever it is.
        sasl = transport.sasl()
        sasl.allow_insecure_mechs = True
        sasl.allowed_mechs("ANONYMOUS PLAIN")
        connection.container = BROKER_CONTAINER

    def on_event(self, event: Event) -> None:
        handler = self._handlers.get(event.type)
        if handler is not None:
            handler(event)

    def on_closed(self, connection: Any) -> None:
        self.dispatcher.remove_connection(connection)

    def on_turn(self, now: float) -> float:
        """Run what is due, commit what the turn changed and only then tell the clients;
        returns when the next turn is due without input.

        Waking for the next thing due instead of polling: a scheduled message or a lock
        expiry, a commit that failed, else IDLE_TICK_SECONDS. A lock taken later expires a
        full lock duration later, so capping the sleep at that duration keeps lock expiry
        on time without looking at every delivery.
        """
        if now >= self._tick_at:
            try:
                self.engine.tick()
                self.dispatcher.dispatch_woken()
            except Exception:
                log.exception("broker timer step failed")
        committed = self._commit()
        delay = min(IDLE_TICK_SECONDS, self.engine.limits.lock_ms / 1000)
        due = self.engine.seconds_to_deadline()
        if due is not None:
            delay = min(delay, due)
        if not committed:
            delay = min(delay, TICK_SECONDS)
        self._tick_at = now + delay
        return self._tick_at

    def _commit(self) -> bool:
        """One store commit for the turn, then the acknowledgements that waited for it.
        False when the commit failed: the sends are refused, the rest waits for a retry."""
        if self.engine.store_pending:
            try:
                self.engine.flush()
            except sqlite3.Error:
                acks, self._pending_acks = self._pending_acks, []
                log.exception("store commit failed; failing %d sends", len(acks))
                for delivery in acks:
                    self._reject(delivery, "amqp:internal-error", "The broker could not store it.")
                return False
        if self._pending_acks:
            acks, self._pending_acks = self._pending_acks, []
            for delivery in acks:
                delivery.update(Delivery.ACCEPTED)
                delivery.settle()
        if self._pending_echoes:
            echoes, self._pending_echoes = self._pending_echoes, []
            for delivery, outcome in echoes:
                delivery.update(outcome)
                # The SDK reports "did not confirm the settlement" until this settled echo arrives.
                delivery.settle()
        if self._pending_replies:
            replies, self._pending_replies = self._pending_replies, []
            for link, response in replies:
                if not link.state & _CLOSED:
                    link.send(response).settle()
        return True

    # -- connections and sessions: opened and closed as the client asks ----------------------

    @staticmethod
    def _on_connection_remote_open(event: Event) -> None:
        connection: Any = event.connection
        if connection.state & _UNINIT:
            connection.open()

    @staticmethod
    def _on_session_remote_open(event: Event) -> None:
        session: Any = event.session
        if session.state & _UNINIT:
            session.open()

    @staticmethod
    def _on_session_remote_close(event: Event) -> None:
        session: Any = event.session
        if not session.state & _CLOSED:
            session.close()

    @staticmethod
    def _on_connection_remote_close(event: Event) -> None:
        connection: Any = event.connection
        if not connection.state & _CLOSED:
            connection.close()

    @staticmethod
    def _on_transport_error(event: Event) -> None:
        # A client that drops its socket without an AMQP close is routine (the SDK does so on
        # close).
        transport: Any = event.transport
        condition = transport.condition
        log.info("connection ended: %s", condition.description if condition else "transport error")

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
        link: Any = event.link
        self.dispatcher.remove(link)
        if not link.state & _CLOSED:
            link.close()

    @_guarded
    def on_link_flow(self, event: Event) -> None:
        link: Any = event.link
        if not link.is_sender or not link.credit or (link.state & _ACTIVE) != _ACTIVE:
            return
        node: Node | None = getattr(link, "sb_node", None)
        if node is not None and node.kind is NodeKind.ENTITY:
            self.dispatcher.dispatch(node.entity)

    # -- outcomes from client receivers ----------------------------------------------------

    def _on_outcome(self, delivery: Any) -> None:
        """A disposition from a client receiver (what proton's OutgoingMessageHandler does)."""
        if not delivery.updated:
            return
        state = delivery.remote_state
        if state == Delivery.ACCEPTED:
            self.on_accepted(delivery)
        elif state == Delivery.REJECTED:
            self.on_rejected(delivery)
        elif state in (Delivery.RELEASED, Delivery.MODIFIED):
            self.on_released(delivery)
        if delivery.settled:
            # Only settles without an outcome (with one, the handlers above ran first): the
            # client gave the message up, so it goes back unchanged.
            self._settle(delivery, Settlement.RELEASE)

    def on_accepted(self, delivery: Any) -> None:
        self._settle(delivery, Settlement.COMPLETE)

    def on_rejected(self, delivery: Any) -> None:
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

    def on_released(self, delivery: Any) -> None:
        if delivery.remote_state == Delivery.MODIFIED:
            # Abandon (delivery-failed) or defer (undeliverable-here); deferral is not
            # supported, so both make the message available again with its count raised.
            self._settle(delivery, Settlement.ABANDON)
        else:
            # Released: the SDK's way to hand back prefetched messages it never surfaced.
            self._settle(delivery, Settlement.RELEASE)

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
            self._pending_echoes.append((delivery, _ECHO[settlement]))
        else:
            delivery.local.condition = Condition(LOCK_LOST, "The lock on the message was lost.")
            self._pending_echoes.append((delivery, Delivery.REJECTED))
        self.dispatcher.dispatch_woken()

    # -- transfers from clients ------------------------------------------------------------

    @_guarded
    def on_delivery(self, event: Event) -> None:
        delivery: Any = event.delivery
        link: Any = delivery.link
        if link.is_sender:
            self._on_outcome(delivery)
            return
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
        else:
            self._on_request(delivery, link, node, payload)

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
        self._pending_replies.append((reply_link, response))

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
