"""A provider's `429` is its quota, not a failure: the agent slows down and goes on.

Read as an ordinary transient error, a 429 trips the breaker (the Scheduler then routes
away from a healthy provider) and, retried at full speed, uses up the step's complete-by
until the Supervisor counts a failure against the order (docs/limits.md). The agent
talks HTTP to a scripted provider, or to the simulator with a quota, on a free port;
every clock is fake, so the waits cost no time and are seen exactly.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from datetime import timedelta

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from devhost.simulator import create_app
from shared.adapters.clock import FakeClock
from shared.adapters.http_remote import HttpRemoteService
from shared.adapters.memory.store import InMemoryBus
from shared.domain.health import BreakerState
from shared.domain.messages import AgentRequest
from shared.domain.model import Action
from shared.domain.throttle import AdaptiveRate
from shared.ports import Clock, RateLimited, RemoteCall
from shared.resilience import CircuitBreaker
from shared.usecases.flow.agent import AgentDeps, Performed, perform_step
from tests.simulator.conftest import ORDER, SimClient
from tests.simulator.scripted_provider import Answer, ScriptedProvider
from tests.simulator.virtual_clock import VirtualClock
from tests.workflows import CATALOGUE

CHARGE = ("POST", "/payment/charge-payment")
CHARGED = Answer(200, {"result": {"chargeId": "ch-1", "amount": 25.0}})


def too_many(retry_after: str | None = None) -> Answer:
    headers = {} if retry_after is None else {"Retry-After": retry_after}
    return Answer(429, {"code": "rate-limited", "detail": "slow down"}, headers)


def deps(
    url: str,
    session: aiohttp.ClientSession,
    clock: Clock,
    *,
    agent: str = "payment",
    throttle: AdaptiveRate | None = None,
) -> AgentDeps:
    return AgentDeps(
        agent=agent,
        bus=InMemoryBus(),
        clock=clock,
        remote=HttpRemoteService(f"{url}/{agent}", session),
        breaker=CircuitBreaker(agent, clock, failure_threshold=2),
        rng=random.Random(7),
        throttle=throttle if throttle is not None else AdaptiveRate(),
        catalogue=CATALOGUE,
    )


def request(
    clock: Clock, order: str = "o-1", step: str = "charge-payment", seconds: float = 30
) -> AgentRequest:
    payload = {"amount": 25.0} if step == "charge-payment" else dict(ORDER)
    return AgentRequest(
        order,
        step,
        Action.DO,
        1,
        clock.now() + timedelta(seconds=seconds),
        f"{order}:{step}",
        payload,
    )


def replies(agent: AgentDeps) -> list[str]:
    bus = agent.bus
    assert isinstance(bus, InMemoryBus)
    return [str(message.body["outcome"]) for message in bus.sent]


async def test_http_remote_reads_a_429_as_rate_limited_with_its_retry_after(
    provider: ScriptedProvider, session: aiohttp.ClientSession
) -> None:
    provider.on(*CHARGE, too_many("3"))
    agent = deps(provider.url, session, FakeClock())
    call = request(FakeClock())

    with pytest.raises(RateLimited) as raised:
        await agent.remote.invoke(
            RemoteCall(call.order_id, call.step, call.idempotency_key, call.payload), 5.0
        )

    assert (raised.value.code, raised.value.retry_after) == ("rate-limited", 3.0)


async def test_429s_with_retry_after_slow_the_agent_and_the_order_succeeds(
    provider: ScriptedProvider, session: aiohttp.ClientSession
) -> None:
    provider.on(*CHARGE, too_many("2"), too_many("2"), too_many("2"), CHARGED)
    clock = FakeClock()
    agent = deps(provider.url, session, clock)

    outcome = await perform_step(agent, request(clock))

    assert outcome is Performed.SUCCEEDED
    assert replies(agent) == ["succeeded"]
    assert len(provider.calls(*CHARGE)) == 4
    waits = [pause for pause in clock.slept if pause > 0]
    assert len(waits) == 3
    assert all(pause >= 2 for pause in waits), "Retry-After is the least wait, no back-off"
    assert agent.breaker.state is BreakerState.CLOSED, "three 429s, threshold two"
    assert agent.throttle is not None
    view = agent.throttle.view()
    assert view.throttled == 3
    assert view.rate is not None and view.last_limited_at is not None


async def test_429s_without_retry_after_are_spaced_by_the_throttle_alone(
    provider: ScriptedProvider, session: aiohttp.ClientSession
) -> None:
    provider.on(*CHARGE, too_many(), too_many(), CHARGED)
    clock = FakeClock()
    agent = deps(provider.url, session, clock, throttle=AdaptiveRate(ceiling=2))

    outcome = await perform_step(agent, request(clock))

    assert outcome is Performed.SUCCEEDED
    assert agent.breaker.state is BreakerState.CLOSED
    # Halved to 1/s, then (another 429 over a second later) to 0.5/s: each call keeps
    # the new rate's distance, plus the margin, from the one before.
    assert [round(p, 3) for p in clock.slept if p > 0] == [1.05, 2.1]


async def test_a_throttle_that_holds_the_call_past_the_deadline_says_so_and_replies_nothing(
    provider: ScriptedProvider, session: aiohttp.ClientSession
) -> None:
    """The provider asks for more time than the step has: the agent does not sleep into
    the deadline, replies nothing (no failure), and names the throttle as the cause."""
    provider.on(*CHARGE, too_many("60"))
    clock = FakeClock()
    agent = deps(provider.url, session, clock)

    outcome = await perform_step(agent, request(clock, seconds=30))

    assert outcome is Performed.HELD_BY_THROTTLE
    assert replies(agent) == []
    assert len(provider.calls(*CHARGE)) == 1
    assert [pause for pause in clock.slept if pause > 0] == []
    assert agent.breaker.state is BreakerState.CLOSED


@pytest.fixture
async def quota_sim(
    session: aiohttp.ClientSession,
) -> AsyncIterator[tuple[SimClient, VirtualClock]]:
    """The simulator in this loop, its quota windows on the agent's virtual clock."""
    clock = VirtualClock()
    server = TestServer(create_app(seed=3, monotonic=clock.monotonic), host="127.0.0.1")
    await server.start_server()
    try:
        yield SimClient(session, str(server.make_url("")).rstrip("/")), clock
    finally:
        await server.close()


BURST = 20
LIMIT = 5


async def _burst(sim: SimClient, clock: VirtualClock, throttle: AdaptiveRate) -> AgentDeps:
    await sim.put_faults("shipping", {"rateLimitPerSecond": LIMIT})
    agent = deps(sim.base_url, sim.session, clock, agent="shipping", throttle=throttle)
    requests = [request(clock, f"o-{i}", "create-shipment", seconds=120) for i in range(BURST)]

    outcomes = await clock.run(perform_step(agent, r) for r in requests)

    assert set(outcomes) == {Performed.SUCCEEDED}, "no order has a failure counted"
    assert replies(agent) == ["succeeded"] * BURST
    assert agent.breaker.state is BreakerState.CLOSED
    return agent


async def test_a_burst_under_the_services_limit_stays_within_it(
    quota_sim: tuple[SimClient, VirtualClock],
) -> None:
    sim, clock = quota_sim

    await _burst(sim, clock, AdaptiveRate(ceiling=LIMIT))

    stats = await sim.stats("shipping")
    assert stats["maxCallsInOneSecond"] <= LIMIT * 1.1
    assert (stats["applied"], stats["rateLimited"]) == (BURST, 0)


async def test_a_burst_with_no_declared_limit_learns_it_from_the_429s(
    quota_sim: tuple[SimClient, VirtualClock],
) -> None:
    """The first wave goes out at full speed and meets the quota; the rest is paced."""
    sim, clock = quota_sim

    agent = await _burst(sim, clock, AdaptiveRate())

    stats = await sim.stats("shipping")
    assert stats["applied"] == BURST
    assert agent.throttle is not None and agent.throttle.view().throttled == stats["rateLimited"]
    assert stats["rateLimited"] > 0
