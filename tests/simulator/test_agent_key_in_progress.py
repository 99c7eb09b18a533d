"""Finding 4: a provider's `409 operation-in-progress` is an unsettled key, not a failure.

A provider answers a retry with the key of a call it is still running (Stripe does, for
a charge still being processed) with `409 operation-in-progress`. Read as a permanent
failure, the agent replied `failed`, the order was compensated, and the first charge
then settled: money taken for an order the client was told had failed. The agent here
talks HTTP to a scripted provider on a free port; its clock is fake, so the back-offs
cost no time and are seen exactly.
"""

from __future__ import annotations

import random
from datetime import timedelta

import aiohttp
import pytest

from shared.adapters.clock import FakeClock
from shared.adapters.http_remote import HttpRemoteService
from shared.adapters.memory.store import InMemoryBus
from shared.domain.health import BreakerState
from shared.domain.messages import AgentRequest
from shared.domain.model import Action
from shared.resilience import CircuitBreaker
from shared.usecases.flow.agent import AgentDeps, Performed, perform_step
from tests.simulator.scripted_provider import Answer, ScriptedProvider, in_progress
from tests.workflows import CATALOGUE

CHARGE = ("POST", "/payment/charge-payment")
CHARGED = Answer(200, {"result": {"chargeId": "ch-1", "amount": 25.0}})


def deps(
    provider: ScriptedProvider, session: aiohttp.ClientSession, clock: FakeClock, threshold: int = 5
) -> AgentDeps:
    return AgentDeps(
        agent="payment",
        bus=InMemoryBus(),
        clock=clock,
        remote=HttpRemoteService(f"{provider.url}/payment", session),
        breaker=CircuitBreaker("payment", clock, failure_threshold=threshold),
        rng=random.Random(7),
        catalogue=CATALOGUE,
    )


def charge(clock: FakeClock, seconds: float = 30) -> AgentRequest:
    return AgentRequest(
        "o-1",
        "charge-payment",
        Action.DO,
        1,
        clock.now() + timedelta(seconds=seconds),
        "o-1:charge-payment",
        {"amount": 25.0},
    )


def replies(agent: AgentDeps) -> list[str]:
    bus = agent.bus
    assert isinstance(bus, InMemoryBus)
    return [str(message.body["outcome"]) for message in bus.sent]


async def test_a_key_still_in_progress_is_retried_with_the_same_key_until_it_succeeds(
    provider: ScriptedProvider, session: aiohttp.ClientSession
) -> None:
    provider.on(*CHARGE, in_progress("2"), in_progress("2"), CHARGED)
    clock = FakeClock()
    agent = deps(provider, session, clock)

    outcome = await perform_step(agent, charge(clock))

    assert outcome is Performed.SUCCEEDED
    assert replies(agent) == ["succeeded"]
    calls = provider.calls(*CHARGE)
    assert [call.headers["Idempotency-Key"] for call in calls] == ["o-1:charge-payment"] * 3
    assert len(clock.slept) == 2
    assert all(pause >= 2 for pause in clock.slept), "Retry-After is the least back-off"


async def test_a_key_in_progress_past_the_deadline_gets_no_reply_not_a_failure(
    provider: ScriptedProvider, session: aiohttp.ClientSession
) -> None:
    """The provider asks for more time than the step has: the agent stops at once, with
    no retry too soon to be answered, and leaves the key to the Supervisor's question."""
    provider.on(*CHARGE, in_progress("60"))
    clock = FakeClock()
    agent = deps(provider, session, clock)

    outcome = await perform_step(agent, charge(clock, seconds=30))

    assert outcome is Performed.COMPLETE_BY_PASSED
    assert replies(agent) == []
    assert len(provider.calls(*CHARGE)) == 1


async def test_a_key_in_progress_is_no_evidence_against_the_service(
    provider: ScriptedProvider, session: aiohttp.ClientSession
) -> None:
    """The service answered each time: its breaker stays closed, so its other orders and
    the Scheduler's routing are not held up by one slow charge."""
    provider.on(*CHARGE, in_progress("1"))
    clock = FakeClock()
    agent = deps(provider, session, clock, threshold=2)

    outcome = await perform_step(agent, charge(clock, seconds=10))

    assert outcome is Performed.COMPLETE_BY_PASSED
    assert agent.breaker.state is BreakerState.CLOSED
    assert len(provider.calls(*CHARGE)) >= 5


async def test_an_abandoned_key_is_a_permanent_failure(
    provider: ScriptedProvider, session: aiohttp.ClientSession
) -> None:
    provider.on(*CHARGE, Answer(409, {"code": "operation-abandoned", "detail": "abandoned"}))
    clock = FakeClock()
    agent = deps(provider, session, clock)

    outcome = await perform_step(agent, charge(clock))

    assert outcome is Performed.FAILED
    bus = agent.bus
    assert isinstance(bus, InMemoryBus)
    [reply] = bus.sent
    assert reply.body["error"]["code"] == "operation-abandoned"
    assert len(provider.calls(*CHARGE)) == 1


@pytest.mark.parametrize("status", [429, 503])
async def test_a_transient_answers_retry_after_is_the_least_back_off(
    provider: ScriptedProvider, session: aiohttp.ClientSession, status: int
) -> None:
    provider.on(*CHARGE, Answer(status, {"code": "slow-down"}, {"Retry-After": "3"}), CHARGED)
    clock = FakeClock()
    agent = deps(provider, session, clock)

    outcome = await perform_step(agent, charge(clock))

    assert outcome is Performed.SUCCEEDED
    assert len(clock.slept) == 1
    assert clock.slept[0] >= 3
