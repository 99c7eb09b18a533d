"""What a queue trigger needs from a receiver, and which client receives for a connection.

In Azure the Functions host receives, renews locks and settles, and the worker only runs
handlers. Locally, from devhost's broker, the host's own AMQP connection does that work
(``sb_proton``, qpid-proton's C engine on a thread of its own): about a third of the
SDK's CPU per message, off the app's interpreter. It was opt-in for a while after one run
under a 5,000-order burst stalled with it (a link stopped taking messages with a full
window); that likely cause, proton objects let go of on the app's thread, is fixed, and
the burst runs since went clean (bench/README.md, issue #25).
``DevhostServiceBusReceiver=sdk`` keeps the SDK's receiver (``sb_sdk``) in the app's loop.
Anything other than devhost's broker, such as the Service Bus emulator, which wants
claims-based auth, or a namespace in Azure, always gets the SDK's receiver.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlparse

from devhost.host.loader import HostConfig
from devhost.host.sb_connection import ClientPool, ConnectionHealth, ConnectionInfo
from devhost.host.sb_message import ReceivedMessage

log = logging.getLogger("devhost.servicebus")

RECEIVER_SETTING = "DevhostServiceBusReceiver"
"""``sdk``: receive with the SDK even from devhost's broker (tests of that path use it)."""
_LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1"})


@dataclass(frozen=True, slots=True, eq=False)
class Delivered:
    """A message the host holds the lock of; ``handle`` is the client's own record."""

    message: ReceivedMessage
    handle: Any


class TriggerLink(Protocol):
    """One open receiver on one queue, for one trigger."""

    async def receive(self, max_count: int, wait: float) -> list[Delivered]:
        """At least one message, or none after ``wait`` seconds."""
        ...

    async def complete(self, delivered: Delivered) -> None:
        """Raises when the broker did not take the settlement (its lock was lost)."""
        ...

    async def abandon(self, delivered: Delivered) -> None: ...

    async def close(self) -> None:
        """Hand back what was received and not settled, and detach."""
        ...


class LinkSource(Protocol):
    async def open(self, queue: str, window: int, function: str) -> TriggerLink:
        """A receiver holding at most ``window`` unsettled messages."""
        ...

    async def close(self) -> None: ...


class ForeignBroker(Exception):
    """The connection answered, but not as devhost's broker: use the SDK's receiver."""


def _local_broker_candidate(info: ConnectionInfo) -> bool:
    fields: dict[str, str] = {}
    for part in (info.connection_string or "").split(";"):
        key, sep, value = part.partition("=")
        if sep:
            fields[key.strip().lower()] = value.strip()
    if fields.get("usedevelopmentemulator", "").lower() != "true":
        return False
    return urlparse(fields.get("endpoint", "")).hostname in _LOOPBACK


def amqp_url(info: ConnectionInfo) -> str:
    for part in (info.connection_string or "").split(";"):
        key, _, value = part.partition("=")
        if key.strip().lower() == "endpoint":
            endpoint = urlparse(value.strip())
            return f"amqp://{endpoint.hostname}:{endpoint.port or 5672}"
    raise ValueError(f"connection {info.setting} has no Endpoint")


class Receivers:
    """One receiving client per connection setting, shared by every trigger using it, and
    one health record per connection (one warning per outage)."""

    def __init__(self, settings: Mapping[str, str], config: HostConfig) -> None:
        self._config = config
        self._clients = ClientPool(settings)
        self._host_connection = settings.get(RECEIVER_SETTING, "").strip().lower() != "sdk"
        self._sources: dict[str, LinkSource] = {}
        self._health: dict[str, ConnectionHealth] = {}

    def health(self, info: ConnectionInfo) -> ConnectionHealth:
        found = self._health.get(info.setting)
        if found is None:
            found = self._health[info.setting] = ConnectionHealth(info)
        return found

    def source(self, info: ConnectionInfo) -> LinkSource:
        found = self._sources.get(info.setting)
        if found is None:
            found = self._sources[info.setting] = self._new_source(info)
        return found

    def _new_source(self, info: ConnectionInfo) -> LinkSource:
        if self._host_connection and _local_broker_candidate(info):
            from devhost.host.sb_proton import ProtonLinks  # noqa: PLC0415

            return ProtonLinks(amqp_url(info), self._config.max_auto_lock_renewal_seconds)
        return self._sdk(info)

    def _sdk(self, info: ConnectionInfo) -> LinkSource:
        from devhost.host.sb_sdk import SdkLinks  # noqa: PLC0415

        return SdkLinks(self._clients.get(info), self._config)

    async def fall_back(self, info: ConnectionInfo, source: LinkSource, why: Exception) -> None:
        """The peer is not devhost's broker: every trigger on it switches to the SDK."""
        if self._sources.get(info.setting) is source:
            log.info(
                "Service Bus %s is not devhost's broker (%s); receiving with the SDK",
                info.display,
                why,
            )
            self._sources[info.setting] = self._sdk(info)
            await source.close()

    async def close(self) -> None:
        for source in self._sources.values():
            try:
                await source.close()
            except Exception as exc:
                log.warning("closing a Service Bus receiver client failed: %s", exc)
        self._sources.clear()
        await self._clients.close()
