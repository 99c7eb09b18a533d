"""Provider quotas (``rateLimitPerSecond``, ``maxConcurrent``) and what they measure
(``maxCallsInOneSecond``, ``maxConcurrentSeen``), docs/limits.md. The one-second
windows run on an injected monotonic clock, so no test waits for a second to pass."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from devhost.simulator import create_app
from devhost.simulator.faults import FaultSettings
from devhost.simulator.limits import LoadMeter, Refusal
from tests.simulator.conftest import SimClient


class FakeMonotonic:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _limits(**fields: int) -> FaultSettings:
    return FaultSettings.model_validate(fields)


def test_the_quota_counts_the_calls_let_in_over_the_last_second() -> None:
    clock = FakeMonotonic()
    meter = LoadMeter(("payment",), clock)
    quota = _limits(rateLimitPerSecond=2)
    admitted = []
    for at in (0.0, 0.4, 0.5, 0.99, 1.0, 1.3, 1.4):
        clock.now = 100.0 + at
        refusal = meter.begin("payment", quota).refusal
        if refusal is None:
            meter.end("payment")
        admitted.append((at, refusal))

    assert admitted == [
        (0.0, None),
        (0.4, None),
        (0.5, Refusal.RATE),
        (0.99, Refusal.RATE),
        # The window is (t - 1 s, t]: the call at 0.0 has left it at exactly 1.0.
        (1.0, None),
        (1.3, Refusal.RATE),
        (1.4, None),
    ]


def test_calls_in_one_second_counts_the_refused_ones_too() -> None:
    """What the caller sent is the figure a limit on the calling side is judged by."""
    clock = FakeMonotonic()
    meter = LoadMeter(("payment",), clock)
    seen = [meter.begin("payment", _limits(rateLimitPerSecond=1)) for _ in range(3)]

    assert [a.calls_in_window for a in seen] == [1, 2, 3]
    assert [a.refusal for a in seen] == [None, Refusal.RATE, Refusal.RATE]


def test_concurrency_counts_running_calls_until_they_end() -> None:
    meter = LoadMeter(("payment",), FakeMonotonic())
    quota = _limits(maxConcurrent=2)

    first, second, third = (meter.begin("payment", quota) for _ in range(3))
    meter.end("payment")
    fourth = meter.begin("payment", quota)

    assert [a.refusal for a in (first, second, third, fourth)] == [
        None,
        None,
        Refusal.CONCURRENCY,
        None,
    ]
    assert [a.concurrent for a in (first, second, third, fourth)] == [1, 2, 3, 2]


@pytest.fixture
def clock() -> FakeMonotonic:
    return FakeMonotonic()


@pytest.fixture
async def timed_sim(clock: FakeMonotonic) -> AsyncIterator[SimClient]:
    """A simulator in this test's loop whose quotas read `clock`."""
    server = TestServer(create_app(seed=1, monotonic=clock), host="127.0.0.1")
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as session:
            yield SimClient(session, str(server.make_url("")).rstrip("/"))
    finally:
        await server.close()


async def test_past_the_rate_limit_a_call_is_429_with_retry_after_one(
    timed_sim: SimClient, clock: FakeMonotonic
) -> None:
    sim = timed_sim
    await sim.put_faults("payment", {"rateLimitPerSecond": 2})

    replies = [await sim.call("payment", "charge-payment", "o-1", f"k-{i}") for i in range(3)]

    assert [r.status for r in replies] == [200, 200, 429]
    refused = replies[2]
    assert refused.headers["Retry-After"] == "1"
    assert refused.headers["X-Simulator-Fault"] == "rate-limit"
    assert refused.content_type == "application/problem+json"
    assert refused.body["code"] == "rate-limited"
    assert {e["idempotencyKey"] for e in await sim.effects()} == {"k-0", "k-1"}

    clock.now += 1.0
    again = await sim.call("payment", "charge-payment", "o-1", "k-2")

    assert again.status == 200
    stats = await sim.stats("payment")
    assert (stats["calls"], stats["applied"], stats["rateLimited"]) == (4, 3, 1)
    assert stats["maxCallsInOneSecond"] == 3
    assert (await sim.stats("shipping"))["maxCallsInOneSecond"] == 0


async def test_a_burst_across_a_second_boundary_counts_whole(
    timed_sim: SimClient, clock: FakeMonotonic
) -> None:
    """The window slides: four calls in 0.2 s around a boundary are four in one second."""
    sim = timed_sim
    for step in range(4):
        clock.now = 100.9 + step * 0.05
        assert (await sim.call("inventory", "reserve-inventory", "o-1", f"k-{step}")).status == 200

    assert (await sim.stats("inventory"))["maxCallsInOneSecond"] == 4


async def test_past_max_concurrent_a_call_is_429(timed_sim: SimClient) -> None:
    sim = timed_sim
    await sim.put_faults("shipping", {"maxConcurrent": 1, "slowMs": 300})

    slow = asyncio.create_task(sim.call("shipping", "create-shipment", "o-1", "k-slow"))
    for _ in range(100):
        if (await sim.stats("shipping"))["calls"] == 1:
            break
        await asyncio.sleep(0.01)
    refused = await sim.call("shipping", "create-shipment", "o-2", "k-refused")
    assert (await slow).status == 200
    after = await sim.call("shipping", "create-shipment", "o-3", "k-after")

    assert refused.status == 429
    assert refused.headers["Retry-After"] == "1"
    assert refused.headers["X-Simulator-Fault"] == "concurrency-limit"
    assert after.status == 200
    stats = await sim.stats("shipping")
    assert (stats["concurrencyLimited"], stats["maxConcurrentSeen"]) == (1, 2)


async def test_without_limits_nothing_is_refused_and_the_figures_are_kept(
    timed_sim: SimClient,
) -> None:
    sim = timed_sim
    replies = await asyncio.gather(
        *(sim.call("inventory", "reserve-inventory", f"o-{i}", f"k-{i}") for i in range(5))
    )

    assert {r.status for r in replies} == {200}
    stats = await sim.stats("inventory")
    assert stats["maxCallsInOneSecond"] == 5
    assert 1 <= stats["maxConcurrentSeen"] <= 5
    assert (await sim.request("DELETE", "/_sim/stats")).status == 204
    assert (await sim.stats("inventory"))["maxCallsInOneSecond"] == 0
