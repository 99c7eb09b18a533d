"""Sending on Azure Service Bus with the azure-servicebus async SDK.

The same adapter talks to a real namespace (managed identity), Microsoft's emulator and
the repo's local broker: only the connection differs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Sequence

from azure.core.credentials_async import AsyncTokenCredential
from azure.servicebus import ServiceBusMessage
from azure.servicebus.aio import ServiceBusClient, ServiceBusSender
from azure.servicebus.exceptions import ServiceBusError

from shared.domain.model import Outgoing
from shared.ports import BusUnavailable


class ServiceBusMessageBus:
    """One client per worker and one cached sender per queue: no per-message reconnects."""

    def __init__(self, client: ServiceBusClient, credential: AsyncTokenCredential | None = None):
        self._client = client
        self._credential = credential
        self._senders: dict[str, ServiceBusSender] = {}
        self._lock = asyncio.Lock()
        self._sending: dict[str, asyncio.Lock] = {}
        self.sent = 0

    @classmethod
    def from_connection_string(cls, connection_string: str) -> ServiceBusMessageBus:
        return cls(ServiceBusClient.from_connection_string(connection_string))

    @classmethod
    def from_namespace(
        cls, fully_qualified_namespace: str, credential: AsyncTokenCredential
    ) -> ServiceBusMessageBus:
        return cls(ServiceBusClient(fully_qualified_namespace, credential), credential)

    async def _sender(self, queue: str) -> ServiceBusSender:
        """Open each sender once, one at a time: senders share the client's connection,
        and the SDK's link setup is not safe when several open concurrently on it."""
        sender = self._senders.get(queue)
        if sender is None:
            async with self._lock:
                sender = self._senders.get(queue)
                if sender is None:
                    sender = self._client.get_queue_sender(queue)
                    await sender.__aenter__()
                    self._senders[queue] = sender
        return sender

    async def send(self, messages: Sequence[Outgoing]) -> None:
        for message in messages:
            sb_message = ServiceBusMessage(
                json.dumps(dict(message.body), separators=(",", ":")),
                message_id=message.message_id,
                content_type="application/json",
                scheduled_enqueue_time_utc=message.deliver_at,
                application_properties={"orderId": str(message.body.get("orderId", ""))},
            )
            gate = self._sending.setdefault(message.queue, asyncio.Lock())
            for attempt in (1, 2):
                try:
                    # One send at a time per link: the SDK numbers a transfer before it
                    # awaits, so concurrent sends on one sender reach the wire out of order.
                    async with gate:
                        sender = await self._sender(message.queue)
                        await sender.send_messages(sb_message)
                    break
                except (TimeoutError, ServiceBusError, OSError) as exc:
                    await self._drop_sender(message.queue)
                    if attempt == 2:
                        raise BusUnavailable(f"send to {message.queue} failed: {exc}") from None
            self.sent += 1

    async def _drop_sender(self, queue: str) -> None:
        sender = self._senders.pop(queue, None)
        if sender is not None:
            with contextlib.suppress(ServiceBusError, OSError):
                await sender.close()

    async def ping(self) -> None:
        """Opening a sender proves the namespace answers and the credential is accepted."""
        try:
            await self._sender("scheduler")
        except (TimeoutError, ServiceBusError, OSError) as exc:
            await self._drop_sender("scheduler")
            raise BusUnavailable(str(exc)) from None

    async def close(self) -> None:
        for queue in list(self._senders):
            await self._drop_sender(queue)
        await self._client.close()
        if self._credential is not None:
            await self._credential.close()
