"""Effects as a provider sees them (docs/simulator.md): an undo needs its do applied, a
running key answers 409, and an abandoned key never applies."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.simulator.conftest import SimClient

PROBLEM = "application/problem+json"
CHARGE = "o-1:charge-payment"
NOTHING_TO_UNDO = {"undone": False, "reason": "nothing-to-undo"}


async def _refund(sim: SimClient, key: str = "o-1:refund-payment", **extra: Any) -> Any:
    body = {"orderId": "o-1", "idempotencyKey": key, "payload": {"result": None}} | extra
    return await sim.request("POST", "/payment/refund-payment", json=body)


async def _hung_charge(sim: SimClient, key: str = CHARGE) -> asyncio.Task[Any]:
    """A charge whose call hangs while its client waits: running at the service until
    the task is cancelled. Faults are off again once it is seen running."""
    await sim.put_faults("payment", {"hangRate": 1.0, "hangSeconds": 60})
    task = asyncio.create_task(sim.call("payment", "charge-payment", "o-1", key))
    await sim.outcome_when("payment", key, 409)
    await sim.put_faults("payment", {})
    return task


@pytest.fixture
async def hung_charge(sim: SimClient) -> AsyncIterator[asyncio.Task[Any]]:
    task = await _hung_charge(sim)
    yield task
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_an_undo_of_an_applied_do_applies_after_it(sim: SimClient) -> None:
    charge = await sim.call("payment", "charge-payment", "o-1", CHARGE)

    refund = await _refund(sim, undoes=CHARGE)

    assert refund.status == 200
    assert refund.body == {"result": {"refunded": True}}
    do, undo = await sim.effects()
    assert (undo["undoes"], undo["undone"], undo["applied"]) == (CHARGE, True, 1)
    assert do["appliedAt"] < undo["appliedAt"]
    assert "undoes" not in do and "undone" not in do
    assert charge.status == 200


async def test_an_undo_names_the_key_it_undoes(sim: SimClient) -> None:
    await sim.call("payment", "charge-payment", "o-1", "charge-attempt-7")

    named = await _refund(sim, "refund-a", undoes="charge-attempt-7")
    inferred = await _refund(sim, "refund-b")

    assert named.body == {"result": {"refunded": True}}
    # Without `undoes` the do key is inferred as {orderId}:{do-operation}: not this one.
    assert inferred.body == NOTHING_TO_UNDO
    assert (await sim.effect("refund-b"))["undoes"] == CHARGE


async def test_an_undo_before_its_do_undoes_nothing_and_the_do_still_applies(
    sim: SimClient,
) -> None:
    refund = await _refund(sim, undoes=CHARGE)
    charge = await sim.call("payment", "charge-payment", "o-1", CHARGE)
    replayed = await _refund(sim, undoes=CHARGE)

    assert (refund.status, refund.body) == (200, NOTHING_TO_UNDO)
    assert charge.status == 200 and "result" in charge.body
    assert (replayed.body, replayed.headers.get("Idempotent-Replayed")) == (NOTHING_TO_UNDO, "true")
    undo, do = await sim.effects()
    assert (undo["undone"], undo["applied"], do["applied"]) == (False, 1, 1)
    assert undo["appliedAt"] < do["appliedAt"]
    asked = await sim.outcome("payment", "o-1:refund-payment")
    assert asked.body == {"applied": True, "result": NOTHING_TO_UNDO}
    assert (await sim.stats("payment"))["nothingToUndo"] == 1


async def test_an_undo_of_a_rejected_do_undoes_nothing(sim: SimClient) -> None:
    await sim.put_faults("payment", {"permanentFailureSkus": ["SKU-1"]})
    assert (await sim.call("payment", "charge-payment", "o-1", CHARGE)).status == 422

    refund = await _refund(sim, undoes=CHARGE)

    assert refund.body == NOTHING_TO_UNDO


async def test_an_undo_while_its_do_runs_is_in_progress(
    sim: SimClient, hung_charge: asyncio.Task[Any]
) -> None:
    refund = await _refund(sim, undoes=CHARGE)

    assert refund.status == 409
    assert refund.content_type == PROBLEM
    assert refund.body["code"] == "operation-in-progress"
    assert refund.headers["Retry-After"] == "1"
    # Not settled: the undo's own key may be tried again.
    assert (await sim.outcome("payment", "o-1:refund-payment")).body == {"applied": False}


async def test_a_call_whose_key_runs_is_refused_not_waited_on(
    sim: SimClient, hung_charge: asyncio.Task[Any]
) -> None:
    again = await sim.call("payment", "charge-payment", "o-1", CHARGE)

    assert again.status == 409
    assert again.body["code"] == "operation-in-progress"
    assert again.headers["Retry-After"] == "1"
    assert not hung_charge.done()
    hung_charge.cancel()
    await asyncio.gather(hung_charge, return_exceptions=True)
    await sim.outcome_when("payment", CHARGE, 200)
    later = await sim.call("payment", "charge-payment", "o-1", CHARGE)
    assert later.status == 200
    assert (await sim.effect(CHARGE))["applied"] == 1


async def test_a_slow_do_answers_repeats_409_until_it_applies(sim: SimClient) -> None:
    await sim.put_faults("payment", {"slowMs": 1500})
    first = asyncio.create_task(sim.call("payment", "charge-payment", "o-1", CHARGE))
    await sim.outcome_when("payment", CHARGE, 409)

    repeat = await sim.call("payment", "charge-payment", "o-1", CHARGE)
    applied = await first

    assert repeat.status == 409
    assert applied.status == 200
    effect = await sim.effect(CHARGE)
    assert (effect["calls"], effect["applied"]) == (2, 1)
    assert effect["firstCallAt"] < effect["appliedAt"]


async def test_abandon_of_a_key_never_seen_settles_it_for_good(sim: SimClient) -> None:
    reply = await sim.abandon("payment", CHARGE)
    call = await sim.call("payment", "charge-payment", "o-1", CHARGE)
    again = await sim.abandon("payment", CHARGE)

    assert (reply.status, reply.body) == (200, {"applied": False, "abandoned": True})
    assert call.status == 409
    assert call.content_type == PROBLEM
    assert call.body["code"] == "operation-abandoned"
    assert again.body == {"applied": False, "abandoned": True}
    asked = await sim.outcome("payment", CHARGE)
    assert (asked.status, asked.body) == (200, {"applied": False, "abandoned": True})
    effect = await sim.effect(CHARGE)
    assert (effect["operation"], effect["orderId"]) == ("charge-payment", "o-1")
    assert (effect["calls"], effect["applied"], effect["abandoned"]) == (1, 0, True)
    assert effect["appliedAt"] is None
    stats = await sim.stats("payment")
    assert (stats["abandons"], stats["abandonedRejections"], stats["applied"]) == (1, 1, 0)


async def test_abandon_of_an_applied_key_answers_its_result(sim: SimClient) -> None:
    charge = await sim.call("payment", "charge-payment", "o-1", CHARGE)

    reply = await sim.abandon("payment", CHARGE)

    assert (reply.status, reply.body) == (200, {"applied": True, "result": charge.body["result"]})
    assert (await sim.effect(CHARGE))["abandoned"] is False


async def test_abandon_of_a_running_key_is_in_progress(
    sim: SimClient, hung_charge: asyncio.Task[Any]
) -> None:
    reply = await sim.abandon("payment", CHARGE)

    assert reply.status == 409
    assert reply.body["code"] == "operation-in-progress"
    assert reply.headers["Retry-After"] == "1"
    assert (await sim.effect(CHARGE))["abandoned"] is False


async def test_abandon_of_a_rejected_key_then_calls_are_abandoned(sim: SimClient) -> None:
    await sim.put_faults("payment", {"permanentFailureSkus": ["SKU-1"]})
    await sim.call("payment", "charge-payment", "o-1", CHARGE)

    reply = await sim.abandon("payment", CHARGE)
    call = await sim.call("payment", "charge-payment", "o-1", CHARGE)

    assert reply.body == {"applied": False, "abandoned": True}
    assert call.body["code"] == "operation-abandoned"


async def test_an_undo_of_an_abandoned_do_undoes_nothing(sim: SimClient) -> None:
    await sim.abandon("payment", CHARGE)

    assert (await _refund(sim, undoes=CHARGE)).body == NOTHING_TO_UNDO


async def test_a_provider_without_abandon_answers_a_plain_404(sim: SimClient) -> None:
    await sim.put_faults("payment", {"abandonSupported": False})

    reply = await sim.abandon("payment", CHARGE)
    other = await sim.abandon("inventory", "o-1:reserve-inventory")
    call = await sim.call("payment", "charge-payment", "o-1", CHARGE)

    assert reply.status == 404
    assert reply.body.get("code") not in ("operation-not-found", "operation-abandoned")
    assert other.status == 200
    assert call.status == 200
    assert (await sim.effect(CHARGE))["abandoned"] is False
