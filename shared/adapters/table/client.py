"""The Table Storage client both Table adapters share, with timeouts that fit a handler.

azure-core's defaults (10 retries backing off up to 120 s, 300 s to connect and to read)
made a store that was down look like a store that was slow: a call to a stopped Azurite
took minutes to fail. Here a refused connection fails in well under a second and a store
that accepts the connection but never answers fails within about 20 s (two tries of the
read timeout), inside the 60 s message lock of a triggered handler. An HTTP handler that
must answer sooner (intake, health) stops waiting on its own, earlier.

Constants, not settings: they follow from the SDK and the handlers' budgets, not from a
deployment.

The request pipeline leaves out the azure-core policies that do nothing for this app
(`UNUSED_POLICIES`): each one is a layer of coroutine and checks on every request, and
an order makes 7-8 table requests; together 3.6-5% of the client's CPU per request. The
requests on the wire are the same (bench/README.md, "The Table client's CPU per request").

Against an emulator (a connection string) idle connections are dropped after
`EMULATOR_KEEPALIVE`: Azurite runs on node, which closes a connection idle for 5 s, and a
request sent on one as it closes fails "Server disconnected". azure-core retries only
idempotent methods after that, so an upsert (MERGE) or a batch (POST) came back as a store
failure. In Azure (an endpoint and a credential) the transport keeps aiohttp's default.

The state store's single-entity requests (insert, replace, merge, delete, point read: the
hot path of every order) do not go through this pipeline but are sent by entities.py,
which keeps these timeouts, the retry, the emulator's keep-alive and `FailureCount`.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

import aiohttp
from azure.core.credentials_async import AsyncTokenCredential
from azure.core.pipeline import PipelineRequest, PipelineResponse
from azure.core.pipeline.policies import (
    AsyncHTTPPolicy,
    CustomHookPolicy,
    DistributedTracingPolicy,
    NetworkTraceLoggingPolicy,
    ProxyPolicy,
)
from azure.core.pipeline.transport import AioHttpTransport
from azure.data.tables.aio import TableServiceClient

CONNECTION_TIMEOUT: Final = 3.0
"""Seconds to open a connection: loopback or the region's storage takes milliseconds."""
READ_TIMEOUT: Final = 10.0
"""Seconds of silence while waiting for an answer. Generous because Azurite scans a whole
table per query: a point read took about 2 s under the Supervisor's load at 20,000
finished orders (bench/README.md), and Azure answers in milliseconds anyway."""
RETRY_OPTIONS: Final[dict[str, Any]] = {
    "retry_total": 1,
    "retry_backoff_factor": 0.2,
    "retry_backoff_max": 1.0,
}
"""One quick retry inside a call; the callers' own retries (redelivery, the Supervisor)
come after. Writes are conditional, so a retried write that had landed is refused, not
applied twice."""

EMULATOR_KEEPALIVE: Final = 2.0
"""Seconds an idle connection to an emulator is kept: well under node's 5 s, because the
server counts from its answer and a starved event loop can take seconds from taking a
pooled connection to writing on it (4 s left one second, and a loaded machine lost
writes to "Server disconnected"). A new loopback connection costs well under 1 ms."""

UNUSED_POLICIES: Final = (
    ProxyPolicy,
    NetworkTraceLoggingPolicy,
    DistributedTracingPolicy,
    CustomHookPolicy,
)
"""Policies with nothing to do here. Proxy: no proxy is configured and `use_env_settings`
is off. Network trace logging: writes bodies only with `logging_enable`, never set. Tracing:
the app traces its ports itself (shared/ports.py) and turns the SDKs' spans off
(`disable_azure_core_tracing`). Custom hooks: no raw request or response hook is passed.
The HTTP logging policy stays: whether its records go out is the logging configuration's
choice (the Functions host logs at Information)."""


class FailureCount(AsyncHTTPPolicy):  # type: ignore[type-arg]
    """Counts the calls that found the store down: no answer (refused, reset, timed out,
    cut off by the caller's deadline) or a 5xx, after the pipeline's own retry. One count
    for every table adapter of a client, where each has its own error translation; the
    health check reuses an answer only while it stays the same."""

    def __init__(self) -> None:
        super().__init__()
        self.failures = 0

    async def send(self, request: PipelineRequest[Any]) -> PipelineResponse[Any, Any]:
        try:
            response = await self.next.send(request)
        except (Exception, asyncio.CancelledError):
            self.failures += 1
            raise
        if response.http_response.status_code >= 500:
            self.failures += 1
        return response


class _TableServiceClient(TableServiceClient):
    """Builds the pipeline without `UNUSED_POLICIES`, and with `FailureCount` outermost.
    The override is the one place the SDK composes it: `get_table_client` reuses this list
    for every table client, and a `policies=` argument would not reach them. The method is
    the SDK's private one: should a release stop calling it, the full pipeline comes back,
    which costs only the CPU (and the count stays at 0)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.failure_count = FailureCount()
        super().__init__(*args, **kwargs)

    def _configure_policies(self, *, audience: str | None = None, **kwargs: Any) -> list[Any]:
        policies = super()._configure_policies(audience=audience, **kwargs)
        return [self.failure_count, *(p for p in policies if not isinstance(p, UNUSED_POLICIES))]


def failures(service: TableServiceClient) -> int:
    """The client's count of failed calls; 0 for a client not made here."""
    return service.failure_count.failures if isinstance(service, _TableServiceClient) else 0


class _ShortKeepAliveTransport(AioHttpTransport):  # type: ignore[misc]
    """aiohttp's transport on a connector that drops idle connections after `keepalive`
    seconds; the session is made on first use, inside the running loop, as azure-core does."""

    session: aiohttp.ClientSession | None

    def __init__(self, keepalive: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._keepalive = keepalive

    async def open(self) -> None:
        if self.session is None:
            self.session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(keepalive_timeout=self._keepalive),
                trust_env=False,
                cookie_jar=aiohttp.DummyCookieJar(),
                auto_decompress=False,
            )
        await super().open()


def table_service_client(
    *,
    connection_string: str | None = None,
    endpoint: str | None = None,
    credential: AsyncTokenCredential | None = None,
) -> TableServiceClient:
    """From a connection string (emulators) or an endpoint with a credential (Azure).
    `use_env_settings=False`: otherwise aiohttp reads proxy variables and ~/.netrc on
    every storage request, in a thread; profiling showed a fifth of the worker's CPU there."""
    options: dict[str, Any] = {
        "use_env_settings": False,
        "connection_timeout": CONNECTION_TIMEOUT,
        "read_timeout": READ_TIMEOUT,
        **RETRY_OPTIONS,
    }
    if connection_string:
        transport = _ShortKeepAliveTransport(EMULATOR_KEEPALIVE, **options)
        return _TableServiceClient.from_connection_string(
            connection_string, transport=transport, **options
        )
    if endpoint is None or credential is None:
        raise ValueError("a Table client needs a connection string or an endpoint and a credential")
    return _TableServiceClient(endpoint, credential=credential, **options)
