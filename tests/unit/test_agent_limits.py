"""An agent's `callsPerSecond` and `maxConcurrent` hold across instances
(docs/limits.md): two limiters sharing one limit store are two instances sharing one table. Every
clock is virtual: time moves only when every caller sleeps, so each start is exact."""

from __future__ import annotations

import asyncio
import heapq
import random
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime, timedelta
from typing import TypeVar

import pytest

from shared.adapters.memory.limits import InMemoryLimitStore
from shared.domain.limits import (
    TRIP,
    AgentLimits,
    Schedule,
    SlotLease,
    book,
    calls_allowed,
    claim,
    free_slots,
    lateness_allowed,
    slot_still_usable,
)
from shared.domain.model import JsonObject
from shared.ports import LimitStore
from shared.resilience import CircuitBreaker, RetryPolicy, call_until_deadline
from shared.usecases.limits.limiter import AgentLimiter
from tests.simulator.virtual_clock import VirtualClock

SKEW = timedelta(seconds=5)
GAP_AT_5 = timedelta(seconds=0.24)
"""At 5/s, 5 calls in a second: 6 slots span 5 gaps, 1.2 s (docs/limits.md)."""
T = TypeVar("T")


class IdleClock(VirtualClock):
    """Moves to the earliest sleeper once the loop is idle: no new sleeper and no task
    finished for a while. Unlike VirtualClock, a caller may block on something other
    than the clock (a local semaphore, a slot another caller books)."""

    async def run(self, work: Iterable[Awaitable[T]]) -> list[T]:
        tasks = [asyncio.ensure_future(w) for w in work]
        idle, seen = 0, None
        while not all(task.done() for task in tasks):
            state = (len(self._sleepers), sum(task.done() for task in tasks), self._now)
            idle = idle + 1 if state == seen else 0
            seen = state
            if idle > 20 and self._sleepers:
                wake, _, future = heapq.heappop(self._sleepers)
                self._now = max(self._now, wake)
                future.set_result(None)
                idle = 0
            await asyncio.sleep(0)
        return [task.result() for task in tasks]


def most_in_one_second(starts: list[datetime]) -> int:
    """The most starts in any sliding one-second window, as a provider counts them."""
    ordered = sorted(starts)
    most, first = 0, 0
    for last, start in enumerate(ordered):
        while start - ordered[first] >= timedelta(seconds=1):
            first += 1
        most = max(most, last - first + 1)
    return most


def limiter(
    store: LimitStore, clock: VirtualClock, limits: AgentLimits, holder: str
) -> AgentLimiter:
    return AgentLimiter("payment", limits, store, clock, holder, SKEW, random.Random(holder))


async def paced_calls(lim: AgentLimiter, clock: VirtualClock, calls: int) -> list[datetime]:
    starts = []
    for _ in range(calls):
        start = await lim.start_at()
        await clock.sleep((start - clock.now()).total_seconds())
        starts.append(clock.now())
    return starts


def test_booked_slots_are_a_gap_apart_from_the_next_free_one() -> None:
    now = datetime(2026, 1, 1, 12)
    gap = AgentLimits(calls_per_second=5).gap
    assert gap == GAP_AT_5
    fresh = book(None, now, 3, gap)
    assert fresh.starts == (now, now + gap, now + 2 * gap)
    assert fresh.next_start == now + 3 * gap
    behind = book(now + timedelta(seconds=4), now, 1, gap)
    assert behind.starts == (now + timedelta(seconds=4),)


def test_a_lease_is_held_until_its_expiry_plus_the_skew_margin() -> None:
    now = datetime(2026, 1, 1, 12)
    held = SlotLease(0, "a", now - timedelta(seconds=1), "e1")
    expired = SlotLease(1, "b", now - timedelta(seconds=6), "e2")
    free = free_slots([held, expired], 3, now, SKEW)
    assert [(f.slot, f.seen) for f in free] == [(1, expired), (2, None)]


async def test_two_instances_sharing_the_rate_row_stay_within_the_limit_together() -> None:
    clock = IdleClock()
    store = InMemoryLimitStore()
    limits = AgentLimits(calls_per_second=5)
    a, b = limiter(store, clock, limits, "a"), limiter(store, clock, limits, "b")

    runs = await clock.run(
        [
            *(paced_calls(a, clock, 5) for _ in range(4)),
            *(paced_calls(b, clock, 5) for _ in range(4)),
        ]
    )

    starts = [start for run in runs for start in run]
    assert len(starts) == 40
    assert most_in_one_second(starts) <= 5
    assert max(starts) - min(starts) < 40 * GAP_AT_5


async def test_two_instances_each_with_its_own_row_would_reach_twice_the_limit() -> None:
    """What a limit per process comes to: the check above fails on it."""
    clock = IdleClock()
    limits = AgentLimits(calls_per_second=5)
    a = limiter(InMemoryLimitStore(), clock, limits, "a")
    b = limiter(InMemoryLimitStore(), clock, limits, "b")

    runs = await clock.run([paced_calls(a, clock, 10), paced_calls(b, clock, 10)])

    assert most_in_one_second([s for run in runs for s in run]) == 10


async def test_a_lone_instance_pays_one_write_per_batch_of_waiting_calls() -> None:
    clock = IdleClock()
    store = InMemoryLimitStore()
    lone = limiter(store, clock, AgentLimits(calls_per_second=50), "a")

    await clock.run(paced_calls(lone, clock, 1) for _ in range(16))

    assert store.operations == {"read": 1, "write": 1}


async def test_without_a_rate_limit_no_slot_is_booked() -> None:
    clock = IdleClock()
    store = InMemoryLimitStore()
    free = limiter(store, clock, AgentLimits(max_concurrent=None), "a")
    assert await free.start_at() == clock.now()
    assert await free.enter(timedelta(seconds=10), clock_wait(clock)) is None
    assert store.operations == {}


def clock_wait(clock: VirtualClock) -> Callable[[datetime], Awaitable[None]]:
    async def wait(until: datetime) -> None:
        await clock.sleep((until - clock.now()).total_seconds())

    return wait


async def concurrent_calls(
    lim: AgentLimiter, clock: VirtualClock, calls: int, running: list[int], seen: list[int]
) -> None:
    for _ in range(calls):
        lease = await lim.enter(timedelta(seconds=10), clock_wait(clock))
        running[0] += 1
        seen.append(running[0])
        await clock.sleep(1)
        running[0] -= 1
        await lim.leave(lease)


async def test_two_instances_never_run_more_calls_at_once_than_max_concurrent() -> None:
    clock = IdleClock()
    store = InMemoryLimitStore()
    limits = AgentLimits(max_concurrent=3)
    a, b = limiter(store, clock, limits, "a"), limiter(store, clock, limits, "b")
    running: list[int] = [0]
    seen: list[int] = []

    await clock.run(
        [
            *(concurrent_calls(a, clock, 3, running, seen) for _ in range(4)),
            *(concurrent_calls(b, clock, 3, running, seen) for _ in range(4)),
        ]
    )

    assert len(seen) == 24
    assert max(seen) == 3


async def test_a_killed_instances_slots_come_back_once_their_leases_expire() -> None:
    clock = IdleClock()
    store = InMemoryLimitStore()
    limits = AgentLimits(max_concurrent=2)
    killed = limiter(store, clock, limits, "killed")
    for _ in range(2):
        await killed.enter(timedelta(seconds=10), clock_wait(clock))  # never left
    survivor = limiter(store, clock, limits, "survivor")
    began = clock.now()

    [lease] = await clock.run([survivor.enter(timedelta(seconds=10), clock_wait(clock))])

    assert lease is not None and lease.holder == "survivor"
    waited = clock.now() - began
    assert timedelta(seconds=15) <= waited < timedelta(seconds=17), "expiry 10 s + skew 5 s"


async def test_a_call_woken_past_its_slots_margin_books_another() -> None:
    """Seven calls booked together, a gap apart; the one with the first slot wakes 300 ms
    after it (its handler woke late, past the 100 ms a slot allows at 5/s). Started
    there, it would be the sixth call in one second with the five after it, whichever
    instance made those; it gives the slot up and books the next free one, and the calls
    on time never wait."""
    clock = IdleClock()
    lim = limiter(InMemoryLimitStore(), clock, AgentLimits(calls_per_second=5), "a")
    first: list[datetime] = []

    async def call() -> tuple[datetime, datetime]:
        booked = slot = await lim.start_at()
        late = 0.3 if not first else 0.0
        first.append(slot)
        while True:
            await clock.sleep((slot - clock.now()).total_seconds() + late)
            if lim.on_time(slot):
                return booked, clock.now()
            late, slot = 0.0, await lim.start_at()

    calls = await clock.run([call() for _ in range(7)])

    starts = [start for _, start in calls]
    assert most_in_one_second(starts) == 5
    assert lim.rebooked == 1
    (late_one,) = [(booked, start) for booked, start in calls if booked != start]
    assert late_one[0] == min(booked for booked, _ in calls)
    assert late_one[1] == max(booked for booked, _ in calls) + GAP_AT_5


def test_a_slot_is_usable_while_its_call_stays_within_the_guard_band() -> None:
    """n + 1 slots (n: `calls_allowed`) span n gaps, a second and 200 ms: a start at
    most 100 ms late, and an arrival at most TRIP (100 ms) after it, keep every n + 1
    arrivals a second apart."""
    slot = datetime(2026, 1, 1, 12)
    cases = ((3, 3, 400), (5, 5, 240), (10, 11, 1200 / 11), (15, 16, 75), (100, 110, 1200 / 110))
    for rate, most, gap_ms in cases:
        limits = AgentLimits(calls_per_second=rate)
        assert calls_allowed(rate) == most
        assert near(limits.gap, timedelta(milliseconds=gap_ms))
        assert near(lateness_allowed(rate), timedelta(milliseconds=100))
        assert slot_still_usable(slot, slot + timedelta(milliseconds=99), limits)
        assert not slot_still_usable(slot, slot + timedelta(milliseconds=101), limits)
    assert not slot_still_usable(slot, slot, AgentLimits(max_concurrent=2))


def near(seen: timedelta | None, expected: timedelta) -> bool:
    """Within what a timedelta's whole microseconds round away."""
    return seen is not None and abs(seen - expected) < timedelta(microseconds=100)


def test_the_contracts_ten_percent_is_counted_in_whole_calls() -> None:
    """3.3 calls in a second is 3; 2.75 is 2, though ceil(2.5) is 3; one below 1/s."""
    allowed = {r: calls_allowed(r) for r in (0.5, 2.5, 3, 5, 10, 20)}
    assert allowed == {0.5: 1, 2.5: 2, 3: 3, 5: 5, 10: 11, 20: 22}
    assert AgentLimits(max_concurrent=2).gap is None  # no rate: no slots, none to count


@pytest.mark.parametrize("rate", [1, 2.5, 3, 5, 10, 15, 100])
def test_calls_late_by_up_to_the_guard_band_never_crowd_the_providers_second(rate: float) -> None:
    """What the provider counts is arrivals: each call may start up to `lateness_allowed`
    after its slot and take up to TRIP more to arrive. The worst case is a call late by
    all of it followed by calls exactly on time; among 200 slots a gap apart, with every
    call either on time or as late as allowed in every pattern of a period of n + 1,
    no second holds more than `calls_allowed` arrivals (4 at 3/s and 6 at 5/s before
    the guard band, with 375 and 235 ms allowed and 25 ms for the way there)."""
    limits = AgentLimits(calls_per_second=rate)
    gap, most = limits.gap, calls_allowed(rate)
    assert gap is not None
    latest = lateness_allowed(rate) + TRIP
    slots = [datetime(2026, 1, 1, 12) + gap * i for i in range(200)]
    for late_one in range(most + 1):
        arrivals = [
            slot + (latest if i % (most + 1) == late_one else timedelta(0))
            for i, slot in enumerate(slots)
        ]
        assert most_in_one_second(arrivals) <= most, (rate, late_one)


def test_a_carried_slot_is_claimed_once_and_old_claims_are_dropped() -> None:
    now = datetime(2026, 1, 1, 12)
    keep = timedelta(seconds=3)
    old, slot = now - timedelta(seconds=4), now + timedelta(seconds=1)
    assert claim((old, now), slot, now, keep) == (now, slot)
    assert claim((now, slot), slot, now, keep) is None


async def test_a_hold_written_before_the_wait_does_not_make_the_call_late() -> None:
    """The hold (a store write) is written before the call sleeps to its slot; the sleep
    is measured after it, so the call still starts at its slot, not the write's time
    later (which the check for lateness would then refuse)."""
    clock = IdleClock()
    lim = limiter(InMemoryLimitStore(), clock, AgentLimits(calls_per_second=5), "a")
    await lim.start_at()
    await lim.start_at()
    slot = clock.now() + 2 * GAP_AT_5  # the third slot
    started: list[datetime] = []

    async def hold(_: datetime) -> None:
        await clock.sleep(0.1)

    async def operation(_: float) -> JsonObject:
        started.append(clock.now())
        return {}

    await clock.run(
        [
            call_until_deadline(
                operation,
                deadline=clock.now() + timedelta(seconds=30),
                clock=clock,
                breaker=CircuitBreaker("payment", clock),
                policy=RetryPolicy(),
                gate=lim,
                held=hold,
            )
        ]
    )

    assert started == [slot]
    assert lim.rebooked == 0


class SlowWrites(InMemoryLimitStore):
    """A loaded host's store: each schedule write comes back `seconds` after it began."""

    def __init__(self, clock: IdleClock, seconds: float) -> None:
        super().__init__()
        self.clock, self.seconds = clock, seconds

    async def put_schedule(
        self, agent: str, next_start: datetime, seen: Schedule | None
    ) -> Schedule:
        await self.clock.sleep(self.seconds)
        return await super().put_schedule(agent, next_start, seen)


async def test_a_booking_slower_than_a_slots_window_still_finds_its_slot_ahead() -> None:
    """On an idle schedule a booking takes the slot "now"; with the write taking 150 ms
    (a loaded host's store), that slot is past its 100 ms window by the time the call
    hears of it: each call that came to an idle schedule gave its first slot up and
    booked again (a booking and a slot of the schedule spent, and the call's time).
    Slots now start no earlier than the last booking's round trip: only the first call
    misses."""
    clock = IdleClock()
    lim = limiter(SlowWrites(clock, 0.15), clock, AgentLimits(calls_per_second=5), "a")
    started: list[datetime] = []

    async def operation(_: float) -> JsonObject:
        started.append(clock.now())
        return {}

    async def calls() -> None:
        for _ in range(5):
            await call_until_deadline(
                operation,
                deadline=clock.now() + timedelta(seconds=5),
                clock=clock,
                breaker=CircuitBreaker("payment", clock),
                policy=RetryPolicy(),
                gate=lim,
            )
            await clock.sleep(1)  # the schedule is idle again

    await clock.run([calls()])

    assert len(started) == 5
    assert lim.rebooked == 1
