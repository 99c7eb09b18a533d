"""The stored drain flag, on the in-memory twin and real Azurite: what every instance's
routing refresh reads beside the heartbeats."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from azure.data.tables.aio import TableServiceClient

from shared.adapters.memory.store import InMemoryHealthStore
from shared.adapters.table.health import TableHealthStore
from shared.domain.health import AgentDrain, AgentHealth, AgentRecords, BreakerState
from shared.ports import HealthStore
from shared.settings import azurite_connection_string

T0 = datetime(2026, 11, 24, 9, 0, 0, 250000, tzinfo=UTC)


@pytest.fixture(params=["memory", pytest.param("table", marks=pytest.mark.azurite)])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[HealthStore]:
    if request.param == "memory":
        yield InMemoryHealthStore()
        return
    port = request.getfixturevalue("azurite_table_port")
    service = TableServiceClient.from_connection_string(azurite_connection_string(port))
    table = TableHealthStore(service, f"d{uuid.uuid4().hex[:20]}")
    try:
        yield table
    finally:
        await table.close()
        await service.close()


def a_drain(agent: str = "payment", **changes: object) -> AgentDrain:
    drain = AgentDrain(agent, drained=True, reason="provider maintenance", since=T0, by="ops-1")
    return replace(drain, **changes)  # type: ignore[arg-type]


def a_heartbeat(agent: str, at: datetime = T0, instance: str = "i-1") -> AgentHealth:
    return AgentHealth(agent, instance, BreakerState.CLOSED, 1.0, 10.0, 0, 8, 3, at)


async def test_no_flag_reads_as_no_drain(store: HealthStore) -> None:
    assert await store.agent_records() == AgentRecords((), ())


async def test_a_drain_reads_back_field_for_field_beside_the_heartbeats(
    store: HealthStore,
) -> None:
    beat = a_heartbeat("payment")
    await store.publish_health(beat)
    await store.set_drain(a_drain("shipping"))
    await store.set_drain(a_drain("payment", reason=None))
    records = await store.agent_records()
    assert records.health == (beat,)
    assert records.drains == (a_drain("payment", reason=None), a_drain("shipping"))
    assert await store.agent_health() == (beat,)  # the flags are not heartbeats


async def test_the_last_write_wins_so_undrain_replaces_the_flag(store: HealthStore) -> None:
    await store.set_drain(a_drain())
    cleared = a_drain(drained=False, reason=None, since=T0 + timedelta(minutes=5))
    await store.set_drain(cleared)
    assert (await store.agent_records()).drains == (cleared,)


async def test_forgetting_silent_instances_keeps_the_drain_flags(store: HealthStore) -> None:
    await store.publish_health(a_heartbeat("payment", at=T0 - timedelta(hours=3)))
    await store.set_drain(a_drain(since=T0 - timedelta(days=3)))
    assert await store.forget_agents(T0 - timedelta(hours=1)) == 1
    assert await store.agent_records() == AgentRecords((), (a_drain(since=T0 - timedelta(days=3)),))


async def test_a_long_reason_round_trips(store: HealthStore) -> None:
    drain = a_drain(reason="maintenance window " + "x" * 480)
    await store.set_drain(drain)
    assert (await store.agent_records()).drains == (drain,)
