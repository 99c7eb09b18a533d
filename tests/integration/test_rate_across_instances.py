"""Two instances sharing one agent's rate row on Azurite (docs/limits.md, "How it holds
across instances"): what the provider sees is when the calls start, not which slots were
booked, so one instance's calls woken late must not crowd the other's into one second.

The chaos run found shipping at 12-13 calls in one second at 10/s with two runtimes on
one storage account: the bookings were a gap apart, but a host that stalls wakes its
calls late, after their slots, into the slots the other runtime booked next. What a
provider counts is arrivals: a loaded host is slow to send as well as to wake, so here
the stalled host's calls reach the provider TRIP (100 ms) after they start, the steady
host's at once. The provider may see the limit plus the contract's 10% in whole calls,
never more: 3 at 3/s, 5 at 5/s, 11 at 10/s (4, 6 and 12 before the guard band, with a
slot allowing 375, 235 and 130 ms of lateness and 25 ms for the way)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from azure.data.tables.aio import TableServiceClient

from shared.adapters.clock import SystemClock
from shared.adapters.table.limits import TableLimitStore
from shared.domain.limits import TRIP, AgentLimits, Schedule, calls_allowed, lateness_allowed
from shared.domain.model import JsonObject
from shared.resilience import CircuitBreaker, RetryPolicy, call_until_deadline
from shared.settings import azurite_connection_string
from shared.usecases.limits.limiter import AgentLimiter

pytestmark = pytest.mark.azurite

SKEW = timedelta(seconds=1)
CALLS = 10


def stall_for(limits: AgentLimits) -> timedelta:
    """Two gaps and all but 20 ms of a slot's lateness: the first slot's call starts at
    once, the second's wakes too late for its slot and books again, the third's just in
    time, as late as a slot lets a call start (0.3 s at 10/s, the stall that put 13 in
    one second before slots were start windows)."""
    assert limits.gap is not None and limits.calls_per_second is not None
    return 2 * limits.gap + lateness_allowed(limits.calls_per_second) - timedelta(milliseconds=20)


class StalledHost(SystemClock):
    """A loaded host: its event loop stalls once, so every wake-up due in the stall comes
    at its end, as a handler sleeping until its slot does on a busy runtime."""

    def __init__(self, stall: timedelta) -> None:
        self.stall = stall
        self.stall_from: datetime | None = None

    async def sleep(self, seconds: float) -> None:
        wake = self.now() + timedelta(seconds=max(seconds, 0))
        if self.stall_from is not None and self.stall_from <= wake < self.stall_from + self.stall:
            wake = self.stall_from + self.stall
        await asyncio.sleep(max((wake - self.now()).total_seconds(), 0))


class Booked(TableLimitStore):
    """Tells when this instance has booked its slots."""

    def __init__(self, service: TableServiceClient, table_name: str) -> None:
        super().__init__(service, table_name)
        self.booked = asyncio.Event()

    async def put_schedule(
        self, agent: str, next_start: datetime, seen: Schedule | None
    ) -> Schedule:
        written = await super().put_schedule(agent, next_start, seen)
        self.booked.set()
        return written


@pytest.fixture
async def tables(azurite_table_port: int) -> AsyncIterator[tuple[Booked, Booked]]:
    """Two instances' limit stores over one table of one storage account."""
    service = TableServiceClient.from_connection_string(
        azurite_connection_string(azurite_table_port)
    )
    name = f"t{uuid.uuid4().hex[:20]}"
    one, two = Booked(service, name), Booked(service, name)
    try:
        yield one, two
    finally:
        await one.close()
        await two.close()
        await service.close()


def most_in_one_second(starts: list[datetime]) -> int:
    """The most arrivals in any half-open one-second window, as a provider counts them."""
    ordered = sorted(starts)
    most, first = 0, 0
    for last, start in enumerate(ordered):
        while start - ordered[first] >= timedelta(seconds=1):
            first += 1
        most = max(most, last - first + 1)
    return most


@pytest.mark.parametrize("rate", [3, 5, 10])
async def test_a_stalled_instance_does_not_crowd_the_others_calls_into_the_providers_second(
    tables: tuple[Booked, Booked], rate: int
) -> None:
    limits = AgentLimits(calls_per_second=rate)
    stalled_store, steady_store = tables
    stalled_clock, steady_clock = StalledHost(stall_for(limits)), SystemClock()
    stalled = AgentLimiter("shipping", limits, stalled_store, stalled_clock, "a", SKEW)
    steady = AgentLimiter("shipping", limits, steady_store, steady_clock, "b", SKEW)
    arrivals: list[datetime] = []

    async def call(limiter: AgentLimiter, clock: SystemClock, ready: asyncio.Barrier) -> None:
        async def operation(_: float) -> JsonObject:
            if limiter is stalled:
                await asyncio.sleep(TRIP.total_seconds())
            arrivals.append(datetime.now(UTC))
            return {}

        await ready.wait()
        await call_until_deadline(
            operation,
            deadline=clock.now() + timedelta(seconds=30),
            clock=clock,
            breaker=CircuitBreaker("shipping", clock),
            policy=RetryPolicy(),
            gate=limiter,
        )

    async def instance(
        limiter: AgentLimiter, clock: SystemClock, after: asyncio.Event | None
    ) -> None:
        if after is not None:
            await after.wait()
        ready = asyncio.Barrier(CALLS)
        await asyncio.gather(*(call(limiter, clock, ready) for _ in range(CALLS)))

    stalled_clock.stall_from = datetime.now(UTC)
    await asyncio.wait_for(
        asyncio.gather(
            instance(stalled, stalled_clock, None),
            instance(steady, steady_clock, stalled_store.booked),
        ),
        timeout=30,
    )

    assert len(arrivals) == 2 * CALLS
    assert stalled.rebooked >= 1, "the stall made a call too late for its slot"
    assert most_in_one_second(arrivals) <= calls_allowed(rate), "the limit plus 10%, whole calls"
