"""Service Bus connections: which setting, which SDK client, and one log line per outage.

Split from the trigger loop because connections are shared: every receiver on the
same connection setting uses one client and one health record, as the Functions
extension shares one client per connection.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass

from azure.identity.aio import DefaultAzureCredential
from azure.servicebus.aio import ServiceBusClient

log = logging.getLogger("devhost.servicebus")

DEFAULT_CONNECTION = "AzureWebJobsServiceBus"
# The receive loop has its own back-off; the SDK's retries only need to ride out a
# blip, not hide an outage for half a minute before the loop hears about it.
SDK_RETRY_TOTAL = 2
SDK_RETRY_BACKOFF = 0.5
SDK_RETRY_BACKOFF_MAX = 2.0


class ServiceBusConfigError(Exception):
    """A trigger's connection setting is missing or unusable."""


@dataclass(frozen=True)
class ConnectionInfo:
    """Either a connection string or a namespace for identity-based access."""

    setting: str
    connection_string: str | None = None
    namespace: str | None = None

    @property
    def display(self) -> str:
        if self.namespace:
            return f"{self.namespace} (identity)"
        for part in (self.connection_string or "").split(";"):
            key, _, value = part.partition("=")
            if key.strip().lower() == "endpoint":
                return value.strip()
        return self.setting


def connection_info(setting: str | None, settings: Mapping[str, str]) -> ConnectionInfo:
    """Resolve a binding's ``connection`` the way the extension does."""
    name = setting or DEFAULT_CONNECTION
    for candidate in (name, f"AzureWebJobs{name}"):
        value = settings.get(candidate)
        if value:
            return ConnectionInfo(setting=name, connection_string=value)
    namespace = settings.get(f"{name}__fullyQualifiedNamespace")
    if namespace:
        return ConnectionInfo(setting=name, namespace=namespace)
    raise ServiceBusConfigError(
        f"Service Bus connection {name!r} is not configured: set {name} to a connection string "
        f"or {name}__fullyQualifiedNamespace for identity-based access"
    )


class ClientPool:
    """One ``ServiceBusClient`` per connection, shared by all receivers using it."""

    def __init__(self, settings: Mapping[str, str]) -> None:
        self._settings = settings
        self._clients: dict[str, ServiceBusClient] = {}
        self._credential: DefaultAzureCredential | None = None

    def get(self, info: ConnectionInfo) -> ServiceBusClient:
        client = self._clients.get(info.setting)
        if client is None:
            if info.connection_string:
                client = ServiceBusClient.from_connection_string(
                    info.connection_string,
                    retry_total=SDK_RETRY_TOTAL,
                    retry_backoff_factor=SDK_RETRY_BACKOFF,
                    retry_backoff_max=SDK_RETRY_BACKOFF_MAX,
                )
            else:
                if self._credential is None:
                    self._credential = DefaultAzureCredential()
                client = ServiceBusClient(
                    str(info.namespace),
                    self._credential,
                    retry_total=SDK_RETRY_TOTAL,
                    retry_backoff_factor=SDK_RETRY_BACKOFF,
                    retry_backoff_max=SDK_RETRY_BACKOFF_MAX,
                )
            self._clients[info.setting] = client
        return client

    async def close(self) -> None:
        for name, client in self._clients.items():
            try:
                await client.close()
            except Exception as exc:
                log.warning("closing Service Bus client %s failed: %s", name, exc)
        self._clients.clear()
        if self._credential is not None:
            await self._credential.close()
            self._credential = None


class ConnectionHealth:
    """One warning per outage for all receivers sharing a connection.

    Failures are grouped by error type: when the broker goes away every queue fails
    the same way and one line is enough; a different failure (a queue that does not
    exist) still gets its own line, and a queue that keeps failing does not make the
    healthy ones report "reachable again" over and over.
    """

    def __init__(self, info: ConnectionInfo) -> None:
        self._info = info
        self._failing: dict[str, str] = {}  # queue -> error type
        self._outages: dict[str, float] = {}  # error type -> since (monotonic)

    def failed(self, queue: str, exc: BaseException) -> None:
        kind = type(exc).__name__
        log.debug("receive on %s failed", queue, exc_info=exc)
        previous = self._failing.get(queue)
        if previous == kind:
            return
        self._failing[queue] = kind
        if previous is not None and previous not in self._failing.values():
            self._outages.pop(previous, None)
        if kind in self._outages:
            return
        self._outages[kind] = time.monotonic()
        log.warning(
            "Service Bus %s unavailable (queue %s): %s: %s; retrying with back-off",
            self._info.display,
            queue,
            kind,
            exc,
        )

    def succeeded(self, queue: str) -> None:
        kind = self._failing.pop(queue, None)
        if kind is None or kind in self._failing.values():
            return
        since = self._outages.pop(kind, time.monotonic())
        log.info(
            "Service Bus %s reachable again after %.0f s (%s)",
            self._info.display,
            time.monotonic() - since,
            kind,
        )
