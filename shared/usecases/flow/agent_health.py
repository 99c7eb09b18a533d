"""An Agent's own health, measured where its calls happen and published as heartbeats.

Each instance measures what it sees (its breaker, its recent calls, its in-flight
requests) and publishes it to the state store, throttled so a busy agent costs a write
every few seconds rather than one per call; a breaker change is published at once
because routing depends on it. A timer publishes idle agents too, so silence means the
instance is gone, and probes a tripped breaker's service so it can close without
risking a customer's order on the trial call.
"""

from __future__ import annotations

import asyncio
from collections import deque
from datetime import datetime, timedelta
from typing import Protocol

from shared.domain.health import AgentHealth, BreakerState
from shared.domain.limits import AgentLimits
from shared.domain.throttle import AdaptiveRate
from shared.ports import Clock, HealthStore, StateStoreError, TransientRemoteError
from shared.resilience import CircuitBreaker
from shared.telemetry.logsafe import app_logger

log = app_logger("orders.agent")

PUBLISH_EVERY = timedelta(seconds=2)
WINDOW = 50
"""Remote calls the success rate and latency are computed over."""
PROBE_TIMEOUT = 2.0
RATE_WINDOW = timedelta(seconds=10)
"""The calls a heartbeat's `rate` counts: the last few heartbeats' worth."""
FORGET_AFTER = timedelta(hours=1)
"""Heartbeats this old belong to instances that scaled in; the page shows them as STALE
until then."""


class HealthProbe(Protocol):
    """The part of a RemoteService a heartbeat needs."""

    async def probe(self, timeout: float) -> None: ...


class HealthMonitor:
    def __init__(
        self,
        agent: str,
        instance: str,
        breaker: CircuitBreaker,
        clock: Clock,
        capacity: int,
        throttle: AdaptiveRate | None = None,
        limits: AgentLimits | None = None,
    ) -> None:
        self.agent = agent
        self.limits = limits or AgentLimits()
        self.instance = instance
        self.breaker = breaker
        self.throttle = throttle if throttle is not None else AdaptiveRate()
        """How fast the service's `429`s let this agent call, in this process."""
        self.capacity = capacity
        self.in_flight = 0
        self._clock = clock
        self._calls: deque[tuple[bool, float]] = deque(maxlen=WINDOW)
        self._ended: deque[datetime] = deque()
        self._published_at: datetime | None = None
        self._published_breaker: BreakerState | None = None
        self._publishing = asyncio.Lock()

    def started(self) -> None:
        self.in_flight += 1

    def finished(self) -> None:
        self.in_flight = max(self.in_flight - 1, 0)

    def observe(self, succeeded: bool, seconds: float) -> None:
        self._calls.append((succeeded, seconds))
        self._ended.append(self._clock.now())

    def rate(self) -> float:
        """Calls per second over the last RATE_WINDOW."""
        since = self._clock.now() - RATE_WINDOW
        while self._ended and self._ended[0] <= since:
            self._ended.popleft()
        return len(self._ended) / RATE_WINDOW.total_seconds()

    def snapshot(self) -> AgentHealth:
        calls = len(self._calls)
        breaker = self.breaker.state
        throttle = self.throttle.view()
        return AgentHealth(
            agent=self.agent,
            instance=self.instance,
            breaker=breaker,
            success_rate=sum(ok for ok, _ in self._calls) / calls if calls else 1.0,
            latency_ms=1000 * sum(s for _, s in self._calls) / calls if calls else 0.0,
            in_flight=self.in_flight,
            capacity=self.capacity,
            calls=calls,
            heartbeat_at=self._clock.now(),
            open_until=self.breaker.open_until if breaker is not BreakerState.CLOSED else None,
            max_concurrent=self.limits.max_concurrent,
            calls_per_second=self.limits.calls_per_second,
            rate=self.rate(),
            throttled=throttle.throttled,
            last_limited_at=throttle.last_limited_at,
        )

    def breaker_changed(self) -> bool:
        return self._published_breaker is not self.breaker.state

    def due(self) -> bool:
        if self.breaker_changed() or self._published_at is None:
            return True
        return self._clock.now() - self._published_at >= PUBLISH_EVERY

    async def publish(self, store: HealthStore, *, force: bool = False) -> bool:
        """Never raises: a lost heartbeat only makes routing a little less informed.

        One write at a time, each snapshot taken when its turn comes: two writes in flight
        could land out of order and leave an older breaker state in the table (seen in the
        demo: a slow `closed` overwrote `open`, and orders kept going to a failing provider).
        """
        async with self._publishing:
            if not (force or self.due()):
                return False
            health = self.snapshot()
            try:
                await store.publish_health(health)
            except (StateStoreError, OSError) as exc:
                log.warning("agent %s heartbeat not published: %s", self.agent, exc)
                return False
            self._published_at = health.heartbeat_at
            self._published_breaker = health.breaker
            return True

    async def probe(self, remote: HealthProbe) -> None:
        """Close a tripped breaker through the service's health call, not an order."""
        if self.breaker.state is not BreakerState.HALF_OPEN:
            return
        try:
            self.breaker.before_call()
        except TransientRemoteError:
            return
        try:
            await remote.probe(PROBE_TIMEOUT)
        except TransientRemoteError as exc:
            self.breaker.record_failure()
            log.info("agent %s probe failed (%s); circuit stays open", self.agent, exc.code)
            return
        self.breaker.record_success()
        log.info("agent %s probe succeeded; circuit closed", self.agent)


async def heartbeat(
    agents: list[tuple[HealthMonitor, HealthProbe]], store: HealthStore
) -> list[AgentHealth]:
    """Probe tripped breakers, publish every agent's health, idle or not, and forget the
    instances that have been silent for FORGET_AFTER (they scaled in)."""
    published = []
    for monitor, remote in agents:
        await monitor.probe(remote)
        await monitor.publish(store, force=True)
        published.append(monitor.snapshot())
    if published:
        try:
            await store.forget_agents(published[0].heartbeat_at - FORGET_AFTER)
        except (StateStoreError, OSError) as exc:
            log.warning("silent agents not forgotten: %s", exc)
    return published
