"""An agent's health as it measures and publishes it, and its breaker inside the deadline."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta

import pytest

from shared.adapters.clock import FakeClock
from shared.adapters.memory.store import InMemoryHealthStore
from shared.domain.health import AgentHealth, BreakerState
from shared.ports import StoreUnavailable, TransientRemoteError
from shared.resilience import CircuitBreaker, DeadlinePassed, RetryPolicy, call_until_deadline
from shared.usecases.flow.agent_health import HealthMonitor, heartbeat


class Probed:
    def __init__(self, healthy: bool) -> None:
        self.healthy = healthy
        self.probes = 0

    async def probe(self, timeout: float) -> None:
        self.probes += 1
        if not self.healthy:
            raise TransientRemoteError("http-503", "down")


def a_monitor(clock: FakeClock) -> HealthMonitor:
    breaker = CircuitBreaker("payment", clock, failure_threshold=2)
    return HealthMonitor("payment", "i-1", breaker, clock, capacity=16)


async def test_snapshot_reports_breaker_rate_latency_and_load() -> None:
    clock = FakeClock()
    monitor = a_monitor(clock)
    monitor.started()
    monitor.observe(True, 0.1)
    monitor.observe(False, 0.3)
    health = monitor.snapshot()
    assert (health.success_rate, round(health.latency_ms), health.calls) == (0.5, 200, 2)
    assert (health.in_flight, health.capacity, health.breaker) == (1, 16, BreakerState.CLOSED)
    monitor.finished()
    monitor.finished()
    assert monitor.snapshot().in_flight == 0


async def test_publishing_is_throttled_but_a_breaker_change_goes_at_once() -> None:
    clock = FakeClock()
    store = InMemoryHealthStore()
    monitor = a_monitor(clock)
    assert await monitor.publish(store)
    assert not await monitor.publish(store)
    monitor.breaker.record_failure()
    monitor.breaker.record_failure()
    assert monitor.breaker_changed() and await monitor.publish(store)
    (published,) = await store.agent_health()
    assert published.breaker is BreakerState.OPEN and published.open_until is not None
    clock.advance(2)
    assert await monitor.publish(store)


async def test_a_failed_publish_is_reported_not_raised() -> None:
    class Down(InMemoryHealthStore):
        async def publish_health(self, health: object) -> None:
            raise StoreUnavailable("down")

    assert not await a_monitor(FakeClock()).publish(Down())


async def test_heartbeat_probes_a_half_open_breaker_and_publishes_idle_agents() -> None:
    clock = FakeClock()
    store = InMemoryHealthStore()
    monitor = a_monitor(clock)
    down, up = Probed(healthy=False), Probed(healthy=True)
    await heartbeat([(monitor, down)], store)
    assert down.probes == 0  # closed: nothing to probe
    monitor.breaker.record_failure()
    monitor.breaker.record_failure()
    clock.advance(6)
    assert monitor.snapshot().breaker is BreakerState.HALF_OPEN
    await heartbeat([(monitor, down)], store)
    assert down.probes == 1 and monitor.snapshot().breaker is BreakerState.OPEN
    clock.advance(6)
    (health,) = await heartbeat([(monitor, up)], store)
    assert up.probes == 1 and health.breaker is BreakerState.CLOSED
    assert (await store.agent_health())[0].breaker is BreakerState.CLOSED


async def test_a_call_cut_short_by_the_deadline_does_not_trip_the_breaker() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker("payment", clock, failure_threshold=1)
    seen: list[bool] = []

    async def slow(timeout: float) -> dict[str, object]:
        clock.advance(timeout)
        raise TransientRemoteError("unreachable", "timed out")

    with pytest.raises(DeadlinePassed):
        await call_until_deadline(
            slow,
            deadline=clock.now() + timedelta(seconds=2),
            clock=clock,
            breaker=breaker,
            policy=RetryPolicy(call_timeout=10),
            observe=lambda ok, _s: seen.append(ok),
        )
    assert breaker.state is BreakerState.CLOSED
    assert seen == [False]

    async def failing(timeout: float) -> dict[str, object]:
        raise TransientRemoteError("http-503", "down")

    with pytest.raises(DeadlinePassed):
        await call_until_deadline(
            failing,
            deadline=clock.now() + timedelta(seconds=2),
            clock=clock,
            breaker=breaker,
            policy=RetryPolicy(call_timeout=10),
        )
    assert breaker.state is not BreakerState.CLOSED


async def test_heartbeat_forgets_instances_silent_for_an_hour() -> None:
    clock = FakeClock()
    store = InMemoryHealthStore()
    old = a_monitor(clock).snapshot()
    await store.publish_health(replace(old, instance="scaled-in"))
    clock.advance(3601)
    await heartbeat([(a_monitor(clock), Probed(healthy=True))], store)
    assert [h.instance for h in await store.agent_health()] == ["i-1"]


async def test_publishes_land_in_order_so_a_slow_old_snapshot_cannot_win() -> None:
    clock = FakeClock()
    monitor = a_monitor(clock)
    release = asyncio.Event()

    class SlowFirstWrite(InMemoryHealthStore):
        writes = 0

        async def publish_health(self, health: AgentHealth) -> None:
            self.writes += 1
            if self.writes == 1:
                await release.wait()
            await super().publish_health(health)

    store = SlowFirstWrite()
    slow = asyncio.create_task(monitor.publish(store, force=True))  # snapshot: closed
    await asyncio.sleep(0)
    monitor.breaker.record_failure()
    monitor.breaker.record_failure()  # the breaker opens meanwhile
    fresh = asyncio.create_task(monitor.publish(store))
    await asyncio.sleep(0)
    release.set()
    await asyncio.gather(slow, fresh)
    (stored,) = await store.agent_health()
    assert stored.breaker is BreakerState.OPEN
