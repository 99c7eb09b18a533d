"""The Table Storage client both Table adapters share, with timeouts that fit a handler.

azure-core's defaults (10 retries backing off up to 120 s, 300 s to connect and to read)
made a store that was down look like a store that was slow: a call to a stopped Azurite
took minutes to fail. Here a refused connection fails in well under a second and a store
that accepts the connection but never answers fails within about 20 s (two tries of the
read timeout), inside the 60 s message lock of a triggered handler. An HTTP handler that
must answer sooner (intake, health) stops waiting on its own, earlier.

Constants, not settings: they follow from the SDK and the handlers' budgets, not from a
deployment.
"""

from __future__ import annotations

from typing import Any, Final

from azure.core.credentials_async import AsyncTokenCredential
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
        return TableServiceClient.from_connection_string(connection_string, **options)
    if endpoint is None or credential is None:
        raise ValueError("a Table client needs a connection string or an endpoint and a credential")
    return TableServiceClient(endpoint, credential=credential, **options)
