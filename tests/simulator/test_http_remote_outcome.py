"""The agents' HTTP adapter asking the real simulator what it did with a key."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from devhost.simulator import SimulatorServer
from shared.adapters.http_remote import HttpRemoteService
from shared.domain.in_doubt import RemoteOutcomeKind
from shared.ports import TransientRemoteError
from tests.simulator.conftest import SimClient

KEY = "order 1/a?b#c:charge-payment"
"""Every character that must be percent-encoded in one path segment."""


@pytest.fixture
def payment(simulator: SimulatorServer, session: aiohttp.ClientSession) -> HttpRemoteService:
    return HttpRemoteService(f"{simulator.url}/payment", session)


async def test_a_key_never_seen_is_never_seen(payment: HttpRemoteService) -> None:
    outcome = await payment.outcome(KEY, 5)

    assert outcome.kind is RemoteOutcomeKind.NEVER_SEEN


async def test_an_applied_key_is_applied_with_its_result(
    payment: HttpRemoteService, sim: SimClient
) -> None:
    call = await sim.call("payment", "charge-payment", "o-1", KEY)
    assert call.status == 200

    outcome = await payment.outcome(KEY, 5)

    assert (outcome.kind, outcome.result) == (RemoteOutcomeKind.APPLIED, call.body["result"])
    assert (await sim.effect(KEY))["calls"] == 1


async def test_a_rejected_key_is_not_applied(payment: HttpRemoteService, sim: SimClient) -> None:
    await sim.put_faults("payment", {"permanentFailureSkus": ["SKU-1"]})
    assert (await sim.call("payment", "charge-payment", "o-1", KEY)).status == 422

    assert (await payment.outcome(KEY, 5)).kind is RemoteOutcomeKind.NOT_APPLIED


async def test_a_call_still_running_is_in_progress(
    payment: HttpRemoteService, sim: SimClient
) -> None:
    await sim.put_faults("payment", {"slowMs": 3000})
    running = asyncio.create_task(sim.call("payment", "charge-payment", "o-1", KEY))
    try:
        for _ in range(50):
            outcome = await payment.outcome(KEY, 5)
            if outcome.kind is not RemoteOutcomeKind.NEVER_SEEN:
                break
            await asyncio.sleep(0.05)
        assert outcome.kind is RemoteOutcomeKind.IN_PROGRESS
    finally:
        await running


async def test_a_transient_error_raises_for_the_retry(
    payment: HttpRemoteService, sim: SimClient
) -> None:
    await sim.put_faults("payment", {"transientErrorRate": 1.0})

    with pytest.raises(TransientRemoteError):
        await payment.outcome(KEY, 5)


async def test_a_404_without_the_contracts_code_is_no_answer(
    simulator: SimulatorServer, session: aiohttp.ClientSession
) -> None:
    """A service without the read API must not read as "never seen": that would move the
    retry to another provider while this one may have applied the key."""
    no_read_api = HttpRemoteService(f"{simulator.url}/no-such-service", session)

    assert (await no_read_api.outcome(KEY, 5)).kind is RemoteOutcomeKind.UNKNOWN
