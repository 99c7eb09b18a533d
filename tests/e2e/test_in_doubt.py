"""End to end: a step in doubt is resolved by asking the service that holds its key."""

from __future__ import annotations

import asyncio

import pytest

from tests.e2e.conftest import System

pytestmark = [pytest.mark.e2e, pytest.mark.azurite, pytest.mark.broker]

HANG = {"hangSeconds": 120}


def events(view: dict[str, object]) -> list[str]:
    return [h["event"] for h in view["history"]]  # type: ignore[attr-defined]


async def test_a_hanging_primary_moves_in_flight_charges_to_the_secondary_once(
    system: System,
) -> None:
    await system.faults("payment", hangRate=1.0, **HANG)
    orders = [f"hung-primary-{i}" for i in range(3)]
    for order_id in orders:
        await system.submit(order_id)
    views = await asyncio.gather(*(system.wait_for(o, timeout=120) for o in orders))
    for order_id, view in zip(orders, views, strict=True):
        assert view["processState"] == "Processed", (order_id, events(view))
        # Not seen at the primary, its key is abandoned there before the retry moves.
        assert "in-doubt-abandoned" in events(view), events(view)
        await system.assert_net_effect(order_id)
        charges = {
            e["service"]: e["applied"]
            for e in await system.effects(order_id)
            if e["operation"] == "charge-payment"
        }
        assert charges == {"payment": 0, "payment-secondary": 1}


async def test_a_charge_applied_whose_reply_is_lost_is_not_called_again(system: System) -> None:
    await system.faults("payment", applyThenHangRate=1.0, **HANG)
    await system.submit("lost-reply-1")
    view = await system.wait_for("lost-reply-1", timeout=120)
    assert view["processState"] == "Processed", events(view)
    assert view["failureCount"] == 0
    assert "in-doubt-applied" in events(view)
    effects = await system.effects("lost-reply-1")
    charges = [e for e in effects if e["operation"] == "charge-payment"]
    assert [(e["service"], e["calls"], e["applied"]) for e in charges] == [("payment", 1, 1)]
