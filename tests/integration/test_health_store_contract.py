"""One contract for the health store (ops records), on the in-memory twin and real Azurite."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from azure.data.tables.aio import TableServiceClient

from shared.adapters.memory.store import InMemoryHealthStore
from shared.adapters.table.health import SWEEPS_PARTITION, TableHealthStore, sweep_row_key
from shared.domain.health import AgentHealth, BreakerState, SeenOutages, SweepRecord
from shared.ports import HealthStore
from shared.settings import azurite_connection_string

T0 = datetime(2026, 11, 21, 12, 0, 0, 123456, tzinfo=UTC)
RETENTION = timedelta(minutes=10)


@pytest.fixture(params=["memory", pytest.param("table", marks=pytest.mark.azurite)])
async def health_store(request: pytest.FixtureRequest) -> AsyncIterator[HealthStore]:
    if request.param == "memory":
        yield InMemoryHealthStore(retention=RETENTION)
        return
    port = request.getfixturevalue("azurite_table_port")
    service = TableServiceClient.from_connection_string(azurite_connection_string(port))
    store = TableHealthStore(service, f"h{uuid.uuid4().hex[:20]}", retention=RETENTION)
    try:
        yield store
    finally:
        await store.close()
        await service.close()


def a_heartbeat(agent: str = "payment", instance: str = "i-1", **changes: object) -> AgentHealth:
    health = AgentHealth(
        agent=agent,
        instance=instance,
        breaker=BreakerState.CLOSED,
        success_rate=0.75,
        latency_ms=12.5,
        in_flight=2,
        capacity=16,
        calls=40,
        heartbeat_at=T0,
    )
    return replace(health, **changes)  # type: ignore[arg-type]


def a_sweep(started_at: datetime, instance: str = "sup-1", due: int = 3) -> SweepRecord:
    return SweepRecord(
        instance=instance,
        started_at=started_at,
        finished_at=started_at + timedelta(milliseconds=40),
        due=due,
        requeued=1,
        errored=1,
        compensating=0,
        rescheduled=1,
        finished=0,
        lost_races=0,
        failed=0,
    )


async def test_an_empty_store_reads_empty(health_store: HealthStore) -> None:
    assert await health_store.agent_health() == ()
    assert await health_store.recent_sweeps(10) == ()


async def test_a_heartbeat_reads_back_field_for_field(health_store: HealthStore) -> None:
    closed = a_heartbeat()
    tripped = a_heartbeat(
        "inventory",
        breaker=BreakerState.OPEN,
        success_rate=0.0,
        open_until=T0 + timedelta(seconds=30),
    )
    await health_store.publish_health(closed)
    await health_store.publish_health(tripped)
    assert await health_store.agent_health() == (tripped, closed)  # by agent, then instance


async def test_a_newer_heartbeat_replaces_the_instance_view(health_store: HealthStore) -> None:
    await health_store.publish_health(a_heartbeat(open_until=T0))
    await health_store.publish_health(a_heartbeat(instance="i-2"))
    newer = a_heartbeat(heartbeat_at=T0 + timedelta(seconds=5), in_flight=0, calls=41)
    await health_store.publish_health(newer)
    assert await health_store.agent_health() == (newer, a_heartbeat(instance="i-2"))


async def test_concurrent_heartbeats_of_many_instances_all_land(health_store: HealthStore) -> None:
    beats = [a_heartbeat(instance=f"i-{n:02d}") for n in range(20)]
    await asyncio.gather(*(health_store.publish_health(b) for b in beats))
    assert await health_store.agent_health() == tuple(beats)


async def test_key_characters_in_names_are_stored_safely(health_store: HealthStore) -> None:
    odd = a_heartbeat(agent="pay/ment#2", instance="host?a\\b")
    await health_store.publish_health(odd)
    await health_store.record_sweep(a_sweep(T0, instance="host/1#x"))
    assert await health_store.agent_health() == (odd,)
    assert [s.instance for s in await health_store.recent_sweeps(5)] == ["host/1#x"]


async def test_sweeps_read_newest_first_up_to_the_limit(health_store: HealthStore) -> None:
    sweeps = [a_sweep(T0 + timedelta(seconds=n)) for n in range(6)]
    for sweep in (sweeps[2], sweeps[0], sweeps[5], sweeps[1], sweeps[4], sweeps[3]):
        await health_store.record_sweep(sweep)
    assert await health_store.recent_sweeps(3) == (sweeps[5], sweeps[4], sweeps[3])
    assert await health_store.recent_sweeps(100) == tuple(reversed(sweeps))
    assert await health_store.recent_sweeps(0) == ()


async def test_sweeps_of_two_instances_at_one_instant_are_both_kept(
    health_store: HealthStore,
) -> None:
    a, b = a_sweep(T0, instance="sup-a"), a_sweep(T0, instance="sup-b", due=9)
    await asyncio.gather(health_store.record_sweep(b), health_store.record_sweep(a))
    assert await health_store.recent_sweeps(5) == (a, b)


async def test_recording_the_same_sweep_again_keeps_one(health_store: HealthStore) -> None:
    await health_store.record_sweep(a_sweep(T0))
    again = a_sweep(T0, due=7)
    await health_store.record_sweep(again)
    assert await health_store.recent_sweeps(5) == (again,)


async def test_sweeps_older_than_the_retention_are_pruned(health_store: HealthStore) -> None:
    old = [a_sweep(T0 + timedelta(seconds=n)) for n in range(3)]
    for sweep in old:
        await health_store.record_sweep(sweep)
    edge = a_sweep(T0 + timedelta(seconds=2) + RETENTION)  # exactly the retention after old[2]
    await health_store.record_sweep(edge)
    assert await health_store.recent_sweeps(10) == (edge, old[2])
    latest = a_sweep(T0 + timedelta(seconds=3) + RETENTION)
    await health_store.record_sweep(latest)
    assert await health_store.recent_sweeps(10) == (latest, edge)


def test_sweep_keys_sort_newest_first_and_by_instance_within_an_instant() -> None:
    keys = [
        sweep_row_key(T0 + timedelta(microseconds=1), "b"),
        sweep_row_key(T0, "a"),
        sweep_row_key(T0, "b"),
        sweep_row_key(T0 - timedelta(days=400), "a"),
    ]
    assert keys == sorted(keys)
    assert SWEEPS_PARTITION.startswith("~")  # no order id (letter or digit first) can take it


async def test_heartbeats_of_instances_gone_silent_are_forgotten(
    health_store: HealthStore,
) -> None:
    gone = a_heartbeat(instance="scaled-in", heartbeat_at=T0 - timedelta(hours=2))
    live = a_heartbeat(instance="live", heartbeat_at=T0)
    await health_store.publish_health(gone)
    await health_store.publish_health(live)
    assert await health_store.forget_agents(T0 - timedelta(hours=1)) == 1
    assert await health_store.agent_health() == (live,)
    assert await health_store.forget_agents(T0 - timedelta(hours=1)) == 0


def window(start_s: float, end_s: float) -> tuple[datetime, datetime]:
    return (T0 + timedelta(seconds=start_s), T0 + timedelta(seconds=end_s))


async def test_shared_outages_are_each_instances_last_share(health_store: HealthStore) -> None:
    assert await health_store.seen_outages() == ()
    a = SeenOutages("sup-a", (window(0, 5),), T0 + timedelta(seconds=6))
    b = SeenOutages("sup-b", (window(1, 2), window(40, 41)), T0 + timedelta(seconds=42))
    await health_store.share_outages(a)
    await health_store.share_outages(b)
    a_later = SeenOutages("sup-a", (window(0, 5), window(50, 58)), T0 + timedelta(seconds=60))
    await health_store.share_outages(a_later)
    seen = sorted(await health_store.seen_outages(), key=lambda s: s.instance)
    assert seen == [a_later, b]


async def test_an_instance_whose_last_outage_ended_before_the_retention_is_forgotten(
    health_store: HealthStore,
) -> None:
    old = SeenOutages("gone", (window(0, 5),), T0 + timedelta(seconds=5))
    await health_store.share_outages(old)
    recent_at = T0 + RETENTION + timedelta(seconds=6)
    recent = SeenOutages("live", (window(500, 600),), recent_at)
    await health_store.share_outages(recent)
    assert await health_store.seen_outages() == (recent,)
