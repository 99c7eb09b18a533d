"""A table service that does not answer is StoreUnavailable from every call of both Table
adapters, never the SDK's own exception (callers retry or answer 503 on the port's error)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime

import pytest
from azure.data.tables.aio import TableServiceClient

from devhost.harness.ports import free_port
from shared.adapters.table.health import TableHealthStore
from shared.adapters.table.store import TableStateStore
from shared.ports import StoreUnavailable, WatchEntry
from shared.settings import azurite_connection_string

NOW = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)


@pytest.fixture
async def service() -> AsyncIterator[TableServiceClient]:
    """Nothing listens on the port; no SDK retries, so each call fails at once."""
    connection = azurite_connection_string(free_port())
    client = TableServiceClient.from_connection_string(connection, retry_total=0)
    async with client:
        yield client


async def raises_unavailable(call: Callable[[], Awaitable[object]]) -> StoreUnavailable:
    with pytest.raises(StoreUnavailable) as raised:
        await call()
    assert raised.value.__cause__ is None
    assert raised.value.__suppress_context__
    return raised.value


async def test_every_state_store_call_is_store_unavailable(service: TableServiceClient) -> None:
    store = TableStateStore(service, "Orders")
    entry = WatchEntry("o-1", NOW, 'W/"etag"', 1)
    first = await raises_unavailable(lambda: store.load("o-1"))
    assert str(first).startswith("table Orders: ")
    await raises_unavailable(store.ping)
    await raises_unavailable(lambda: store.history("o-1"))
    await raises_unavailable(lambda: store.list_by_state(None, 10, None))
    await raises_unavailable(lambda: store.watch("o-1", NOW, replace=True))
    await raises_unavailable(lambda: store.due(NOW, 10))
    await raises_unavailable(lambda: store.reschedule(entry, NOW))
    await raises_unavailable(lambda: store.unwatch("o-1"))
    await raises_unavailable(lambda: store.unwatch("o-1", version=1))


async def test_every_health_store_call_is_store_unavailable(service: TableServiceClient) -> None:
    store = TableHealthStore(service, "Orders")
    try:
        read = await raises_unavailable(store.agent_health)
        assert str(read).startswith("table Orders: ")
        await raises_unavailable(lambda: store.recent_sweeps(5))
        await raises_unavailable(lambda: store.forget_agents(NOW))
    finally:
        await store.close()
