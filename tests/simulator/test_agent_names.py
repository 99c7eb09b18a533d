"""What an agent's requests and replies name: a compensation the do key it undoes (a
provider applies an undo only against that key applied), a reply the agent that sent
it (a late success from a provider the order has left is an effect at two providers)."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import aiohttp
import pytest

from shared.adapters.clock import FakeClock
from shared.adapters.http_remote import HttpRemoteService
from shared.adapters.memory.store import InMemoryBus
from shared.domain.messages import AgentRequest
from shared.domain.model import Action
from shared.domain.workflow import Catalogue
from shared.resilience import CircuitBreaker
from shared.usecases.flow.agent import AgentDeps, Performed, UnknownStep, perform_step
from tests.simulator.scripted_provider import Answer, ScriptedProvider
from tests.workflows import CATALOGUE, ORDER_FULFILMENT, running

CLOCK_START = FakeClock().now()
CHARGE = AgentRequest(
    "o-1",
    "charge-payment",
    Action.DO,
    1,
    CLOCK_START + timedelta(seconds=30),
    "o-1:charge-payment",
    {"amount": 25.0},
)
REFUND = replace(
    CHARGE,
    action=Action.COMPENSATE,
    idempotency_key="o-1:refund-payment",
    undoes="o-1:charge-payment",
)


async def perform(
    provider: ScriptedProvider,
    session: aiohttp.ClientSession,
    request: AgentRequest,
    catalogue: Catalogue = CATALOGUE,
) -> tuple[Performed, InMemoryBus]:
    clock, bus = FakeClock(CLOCK_START), InMemoryBus()
    deps = AgentDeps(
        agent="payment-secondary",
        bus=bus,
        clock=clock,
        remote=HttpRemoteService(f"{provider.url}/payment", session),
        breaker=CircuitBreaker("payment-secondary", clock),
        catalogue=catalogue,
    )
    return await perform_step(deps, request), bus


async def test_a_compensation_names_the_do_key_it_undoes(
    provider: ScriptedProvider, session: aiohttp.ClientSession
) -> None:
    provider.on("POST", "/payment/refund-payment", Answer(200, {"result": {"refundId": "r-1"}}))

    outcome, _ = await perform(provider, session, replace(REFUND, undoes="o-1:charge-payment#2"))

    assert outcome is Performed.SUCCEEDED
    [call] = provider.calls("POST", "/payment/refund-payment")
    assert call.body["undoes"] == "o-1:charge-payment#2"
    assert call.body["idempotencyKey"] == "o-1:refund-payment"


async def test_a_compensation_from_an_older_scheduler_names_its_steps_do_key(
    provider: ScriptedProvider, session: aiohttp.ClientSession
) -> None:
    provider.on("POST", "/payment/refund-payment", Answer(200, {"result": {"refundId": "r-1"}}))

    await perform(provider, session, replace(REFUND, undoes=None))

    [call] = provider.calls("POST", "/payment/refund-payment")
    assert call.body["undoes"] == "o-1:charge-payment"


async def test_a_do_names_nothing_it_undoes(
    provider: ScriptedProvider, session: aiohttp.ClientSession
) -> None:
    provider.on("POST", "/payment/charge-payment", Answer(200, {"result": {"chargeId": "c-1"}}))

    await perform(provider, session, CHARGE)

    [call] = provider.calls("POST", "/payment/charge-payment")
    assert "undoes" not in call.body


async def test_every_reply_names_the_agent_that_sent_it(
    provider: ScriptedProvider, session: aiohttp.ClientSession
) -> None:
    provider.on("POST", "/payment/charge-payment", Answer(200, {"result": {"chargeId": "c-1"}}))
    provider.on("POST", "/payment/refund-payment", Answer(402, {"code": "card-declined"}))

    _, succeeded = await perform(provider, session, CHARGE)
    _, failed = await perform(provider, session, REFUND)

    assert [m.body["outcome"] for m in succeeded.sent + failed.sent] == ["succeeded", "failed"]
    assert {m.body["agent"] for m in succeeded.sent + failed.sent} == {"payment-secondary"}


def with_a_second_charge_version() -> Catalogue:
    """order-fulfilment v2 undoes the charge by voiding it; v1 orders still refund."""
    steps = tuple(
        replace(s, compensation="void-payment") if s.name == "charge-payment" else s
        for s in ORDER_FULFILMENT.steps
    )
    return running(replace(ORDER_FULFILMENT, version=2, steps=steps))


async def test_a_compensation_calls_the_undo_its_request_names_not_another_versions(
    provider: ScriptedProvider, session: aiohttp.ClientSession
) -> None:
    both = with_a_second_charge_version()
    provider.on("POST", "/payment/void-payment", Answer(200, {"result": {"voidId": "v-1"}}))
    provider.on("POST", "/payment/refund-payment", Answer(200, {"result": {"refundId": "r-1"}}))
    void = replace(REFUND, idempotency_key="o-1:void-payment", operation="void-payment")

    await perform(provider, session, void, both)
    await perform(provider, session, replace(REFUND, operation="refund-payment"), both)

    [voided] = provider.calls("POST", "/payment/void-payment")
    assert voided.body["idempotencyKey"] == "o-1:void-payment"
    [refunded] = provider.calls("POST", "/payment/refund-payment")
    assert refunded.body["idempotencyKey"] == "o-1:refund-payment"


async def test_a_request_that_names_no_undo_is_refused_when_versions_disagree(
    provider: ScriptedProvider, session: aiohttp.ClientSession
) -> None:
    both = with_a_second_charge_version()
    with pytest.raises(UnknownStep, match="several compensations"):
        await perform(provider, session, REFUND, both)
    with pytest.raises(UnknownStep, match="is not an undo of step charge-payment"):
        await perform(provider, session, replace(REFUND, operation="cancel-shipment"), both)
    assert provider.calls("POST", "/payment/refund-payment") == []
