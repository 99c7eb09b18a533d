"""Reading and settling the dead-letter sub-queues with the azure-servicebus aio SDK.

Listing only peeks, so looking never changes delivery counts or locks anything.
Requeue and purge receive in peek-lock mode and settle one message at a time: a crash
leaves every message not yet completed where it was.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

from azure.core.exceptions import ClientAuthenticationError
from azure.identity.aio import DefaultAzureCredential
from azure.servicebus import (
    ServiceBusMessage,
    ServiceBusReceivedMessage,
    ServiceBusReceiveMode,
    ServiceBusSubQueue,
)
from azure.servicebus.aio import ServiceBusClient, ServiceBusReceiver, ServiceBusSender
from azure.servicebus.amqp import AmqpMessageBodyType
from azure.servicebus.exceptions import (
    MessagingEntityNotFoundError,
    OperationTimeoutError,
    ServiceBusAuthenticationError,
    ServiceBusAuthorizationError,
    ServiceBusCommunicationError,
    ServiceBusConnectionError,
    ServiceBusError,
)

from shared.cli.config import BusConfig
from shared.cli.errors import CliError, NotFound, Refused, Unreachable
from shared.contract import PoisonProperty

DEAD_LETTER_SUFFIX = "/$DeadLetterQueue"
DEAD_LETTER_KEYS = frozenset({"DeadLetterReason", "DeadLetterErrorDescription"})
POISON_COPY_OF = PoisonProperty.COPY_OF
POISON_KEYS = frozenset(
    {
        PoisonProperty.COPY_OF,
        PoisonProperty.REASON,
        PoisonProperty.DETAIL,
        PoisonProperty.ORIGINAL_DELIVERY_COUNT,
        PoisonProperty.TRUNCATED_FROM,
    }
)
"""What the bus adapter's ``park`` adds to a poison message's copy on its way here."""
REQUEUE_MARK = "~requeue-"
MAX_MESSAGE_ID = 128
BATCH = 50
RECEIVE_WAIT_SECONDS = 2.0

Property = int | float | bytes | bool | str | UUID


@dataclass(frozen=True)
class DeadLetter:
    queue: str
    message_id: str | None
    sequence_number: int | None
    enqueued_at: datetime | None
    delivery_count: int | None
    reason: str | None
    description: str | None
    properties: dict[str, Any]
    body: bytes | None
    body_size: int


@dataclass(frozen=True)
class Peeked:
    queue: str
    messages: list[DeadLetter]
    more: bool


@dataclass(frozen=True)
class Settled:
    message_id: str | None
    sequence_number: int | None
    new_message_id: str | None = None


@dataclass
class Settlement:
    """What a requeue or purge did to one dead-letter queue."""

    queue: str
    done: list[Settled] = field(default_factory=list)
    skipped: list[tuple[str | None, str]] = field(default_factory=list)


def dead_letter_path(queue: str) -> str:
    return queue + DEAD_LETTER_SUFFIX


def decoded(value: Any) -> Any:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return value
    return value


def properties_of(message: ServiceBusReceivedMessage) -> dict[str, Any]:
    """Application properties with str keys, without the broker's dead-letter pair."""
    found = {str(decoded(k)): decoded(v) for k, v in (message.application_properties or {}).items()}
    return {k: v for k, v in found.items() if k not in DEAD_LETTER_KEYS}


def original_id(message: ServiceBusReceivedMessage) -> str | None:
    """The id the message had before it was parked, else its own."""
    parked = properties_of(message).get(POISON_COPY_OF)
    return parked if isinstance(parked, str) and parked else message.message_id


def matches(message: ServiceBusReceivedMessage, message_id: str | None) -> bool:
    """``--message-id`` may name the dead letter or, for a parked poison copy, the original."""
    return message_id is None or message_id in {message.message_id, original_id(message)}


def body_of(message: ServiceBusReceivedMessage) -> bytes | None:
    """The data body; None for AMQP value or sequence bodies, which this app never sends."""
    if message.body_type != AmqpMessageBodyType.DATA:
        return None
    return b"".join(message.body)


def describe(queue: str, message: ServiceBusReceivedMessage) -> DeadLetter:
    body = body_of(message)
    return DeadLetter(
        queue=queue,
        message_id=message.message_id,
        sequence_number=message.sequence_number,
        enqueued_at=message.enqueued_time_utc,
        delivery_count=message.delivery_count,
        reason=message.dead_letter_reason,
        description=message.dead_letter_error_description,
        properties=properties_of(message),
        body=body,
        body_size=len(body) if body is not None else 0,
    )


def requeue_id(message_id: str | None, sequence_number: int | None) -> str:
    """A fresh id per dead-lettered message, the same on every retry of the same one.

    Reusing the original id would make duplicate detection drop the copy when the original
    was sent within the detection window; a random id would let a retried requeue (after a
    crash between send and complete) slip past it. Deriving it from the dead-letter
    sequence number gives neither.
    """
    base = (message_id or "").split(REQUEUE_MARK)[0]
    candidate = f"{base}{REQUEUE_MARK}{sequence_number}"
    if len(candidate) <= MAX_MESSAGE_ID:
        return candidate
    digest = hashlib.sha256(base.encode()).hexdigest()[:16]
    suffix = f"~{digest}{REQUEUE_MARK}{sequence_number}"
    return base[: MAX_MESSAGE_ID - len(suffix)] + suffix


def requeue_copy(message: ServiceBusReceivedMessage, body: bytes) -> ServiceBusMessage:
    """The message as it was sent, under a requeue id, without the reasons it was parked.

    The poison bookkeeping must go: the copy is a fresh delivery, and a trigger that sees
    ``poisonCopyOf`` takes the message for an already-parked copy and drops it, so a
    requeued message that failed again would vanish instead of coming back here. Nor is
    the time-to-live copied: a parked copy's is a millisecond.
    """
    properties: dict[str | bytes, Property] = {
        k: v for k, v in properties_of(message).items() if k not in POISON_KEYS
    }
    return ServiceBusMessage(
        body,
        message_id=requeue_id(original_id(message), message.sequence_number),
        application_properties=properties,
        content_type=message.content_type,
        correlation_id=message.correlation_id,
        subject=message.subject,
        reply_to=message.reply_to,
        to=message.to,
    )


class DeadLetterQueues:
    def __init__(self, client: ServiceBusClient) -> None:
        self._client = client

    @classmethod
    @asynccontextmanager
    async def open(cls, config: BusConfig) -> AsyncIterator[DeadLetterQueues]:
        """A client for the configured namespace; SDK failures become one-line errors."""
        credential: DefaultAzureCredential | None = None
        if config.connection_string:
            client = ServiceBusClient.from_connection_string(
                config.connection_string, retry_total=1
            )
        else:
            assert config.namespace is not None
            credential = DefaultAzureCredential(managed_identity_client_id=config.client_id)
            client = ServiceBusClient(config.namespace, credential, retry_total=1)
        try:
            async with client:
                yield cls(client)
        except CliError:
            raise
        except (ClientAuthenticationError, ServiceBusAuthenticationError) as exc:
            raise Refused(
                f"Service Bus at {config.host} refused the credentials: {_first_line(exc)}"
            ) from None
        except ServiceBusAuthorizationError as exc:
            raise Refused(
                f"not allowed on Service Bus at {config.host} (needs the Data Owner role "
                f"or a Manage/Listen/Send key): {_first_line(exc)}"
            ) from None
        except (
            ServiceBusConnectionError,
            ServiceBusCommunicationError,
            OperationTimeoutError,
            OSError,
        ) as exc:
            raise Unreachable(
                f"cannot reach Service Bus at {config.host}: {_first_line(exc)}"
            ) from None
        except MessagingEntityNotFoundError as exc:
            raise CliError(f"queue not found on {config.host}: {_first_line(exc)}") from None
        except ServiceBusError as exc:
            raise CliError(
                f"Service Bus at {config.host}: {type(exc).__name__}: {_first_line(exc)}"
            ) from None
        finally:
            if credential is not None:
                await credential.close()

    def _dead_letters(self, queue: str, mode: ServiceBusReceiveMode) -> ServiceBusReceiver:
        return self._client.get_queue_receiver(
            queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER, receive_mode=mode, prefetch_count=0
        )

    async def peek(self, queue: str, limit: int) -> Peeked:
        async with self._dead_letters(queue, ServiceBusReceiveMode.PEEK_LOCK) as receiver:
            messages = await _peek_all(receiver, limit + 1)
        return Peeked(queue, [describe(queue, m) for m in messages[:limit]], len(messages) > limit)

    async def requeue(self, queue: str, message_id: str | None, limit: int) -> Settlement:
        """Send a copy to the queue, then complete the dead letter.

        In that order a crash in between leaves the dead letter in place and the copy
        sent: the worst case is a duplicate, which duplicate detection (the retry sends
        the same requeue id) or the idempotent handlers absorb. The other order could
        lose the message.
        """
        # keep_alive=0: a short-lived sender needs no pings, and its ping task delays close.
        sender = self._client.get_queue_sender(queue, keep_alive=0)
        return await self._settle(queue, message_id, limit, _requeue_into(sender), sender)

    async def purge(self, queue: str, message_id: str | None, limit: int) -> Settlement:
        return await self._settle(queue, message_id, limit, _delete)

    async def _settle(
        self,
        queue: str,
        message_id: str | None,
        limit: int,
        action: Action,
        *others: ServiceBusSender,
    ) -> Settlement:
        """Settle the dead letters that a peek found, and only those.

        Peeking first makes ``--all`` mean "what is there now" (the loop ends when those
        are done instead of waiting for an empty receive) and lets an unknown
        ``--message-id`` fail before anything is locked.
        """
        result = Settlement(queue)
        receiver = self._dead_letters(queue, ServiceBusReceiveMode.PEEK_LOCK)
        async with _opened(receiver, *others):
            peeked = await _peek_all(receiver, limit)
            targets = {
                m.sequence_number
                for m in peeked
                if m.sequence_number is not None and matches(m, message_id)
            }
            if message_id is not None and not targets:
                raise NotFound(
                    f"no dead-lettered message with id {message_id!r} on {dead_letter_path(queue)}"
                )
            await _receive_and_settle(receiver, targets, action, result)
        return result


Action = Callable[[ServiceBusReceiver, ServiceBusReceivedMessage], Awaitable[Settled]]


class _Skip(Exception):
    """This message cannot be handled by the CLI; it stays dead-lettered."""


def _requeue_into(sender: ServiceBusSender) -> Action:
    async def requeue(receiver: ServiceBusReceiver, message: ServiceBusReceivedMessage) -> Settled:
        body = body_of(message)
        if body is None:
            raise _Skip(f"{message.body_type.value} body: move it by hand")
        copy = requeue_copy(message, body)
        await sender.send_messages(copy)
        await receiver.complete_message(message)
        return Settled(message.message_id, message.sequence_number, copy.message_id)

    return requeue


async def _delete(receiver: ServiceBusReceiver, message: ServiceBusReceivedMessage) -> Settled:
    await receiver.complete_message(message)
    return Settled(message.message_id, message.sequence_number)


async def _peek_all(receiver: ServiceBusReceiver, limit: int) -> list[ServiceBusReceivedMessage]:
    found: list[ServiceBusReceivedMessage] = []
    next_sequence = 0
    while len(found) < limit:
        batch = await receiver.peek_messages(
            max_message_count=min(BATCH, limit - len(found)), sequence_number=next_sequence
        )
        if not batch:
            break
        found.extend(batch)
        next_sequence = (batch[-1].sequence_number or 0) + 1
    return found


async def _receive_and_settle(
    receiver: ServiceBusReceiver, targets: set[int], action: Action, result: Settlement
) -> None:
    """Lock messages batch by batch; those not asked for are held, then released at the end.

    Holding them (instead of abandoning at once) keeps the receive loop from being handed
    the same message again and again.
    """
    held: list[ServiceBusReceivedMessage] = []
    pending = set(targets)
    try:
        while pending:
            batch = await receiver.receive_messages(
                max_message_count=min(BATCH, len(pending)), max_wait_time=RECEIVE_WAIT_SECONDS
            )
            if not batch:
                break
            for message in batch:
                if message.sequence_number not in pending:
                    held.append(message)
                    continue
                pending.discard(message.sequence_number)
                try:
                    result.done.append(await action(receiver, message))
                except _Skip as skip:
                    held.append(message)
                    result.skipped.append((message.message_id, str(skip)))
    finally:
        for message in held:
            with suppress(ServiceBusError):
                await receiver.abandon_message(message)


@asynccontextmanager
async def _opened(*handlers: ServiceBusReceiver | ServiceBusSender) -> AsyncIterator[None]:
    """Open and close handlers together: each costs a round trip or a timer either way."""
    await asyncio.gather(*(h.__aenter__() for h in handlers))
    try:
        yield
    finally:
        await asyncio.gather(*(h.close() for h in handlers), return_exceptions=True)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
