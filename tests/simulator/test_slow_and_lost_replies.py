"""Slow calls that succeed (``slowMs``) and calls that apply and then hang
(``applyThenHangRate``), seen through the calls, the ledger and outcome queries."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.simulator.conftest import SimClient
from tests.waiting import eventually


async def test_a_slow_call_succeeds_after_slow_ms(sim: SimClient) -> None:
    await sim.put_faults("shipping", {"slowMs": 400})

    started = time.monotonic()
    reply = await sim.call("shipping", "create-shipment", "o-1", "k-1", time_limit=5)

    assert reply.status == 200
    assert time.monotonic() - started >= 0.4
    assert (await sim.effect("k-1"))["applied"] == 1
    stats = await sim.stats("shipping")
    assert (stats["slowCalls"], stats["hangs"], stats["applied"]) == (1, 0, 1)


async def test_a_slow_call_is_in_progress_and_then_applied(sim: SimClient) -> None:
    await sim.put_faults("shipping", {"slowMs": 800})
    call = asyncio.create_task(sim.call("shipping", "create-shipment", "o-1", "k-1"))
    await eventually("the call is slow", lambda: sim.counted("shipping", "slowCalls"), 10)

    during = await sim.outcome("shipping", "k-1")
    reply = await call
    after = await sim.outcome("shipping", "k-1")

    assert during.status == 409
    assert reply.status == 200
    assert after.body == {"applied": True, "result": reply.body["result"]}


async def test_a_slow_call_abandoned_by_its_caller_still_applies(sim: SimClient) -> None:
    """The server got the request and finishes the work: the query must not say 'not
    applied' meanwhile, or a failover would apply the effect a second time."""
    await sim.put_faults("payment", {"slowMs": 600})

    with pytest.raises(TimeoutError):
        await sim.call("payment", "charge-payment", "o-1", "k-1", time_limit=0.2)
    during = await sim.outcome("payment", "k-1")
    after = await sim.outcome_when("payment", "k-1", 200)

    assert during.status == 409
    assert after.body["applied"] is True
    assert (await sim.effect("k-1"))["applied"] == 1


async def test_slow_ms_applies_to_compensations_but_not_to_the_health_probe(
    sim: SimClient,
) -> None:
    await sim.put_faults("payment", {"slowMs": 300})

    started = time.monotonic()
    probe = await sim.request("GET", "/payment/health")
    probe_seconds = time.monotonic() - started
    refund = await sim.call("payment", "refund-payment", "o-1", "k-undo", {"result": None})

    assert probe.status == 200 and probe_seconds < 0.3
    assert refund.status == 200
    assert (await sim.stats("payment"))["slowCalls"] == 1


async def test_apply_then_hang_applies_and_the_reply_never_comes(sim: SimClient) -> None:
    await sim.put_faults("payment", {"applyThenHangRate": 1.0, "hangSeconds": 30})

    with pytest.raises(TimeoutError):
        await sim.call("payment", "charge-payment", "o-1", "o-1:charge-payment", time_limit=0.5)
    answer = await sim.outcome("payment", "o-1:charge-payment")
    await sim.put_faults("payment", {})
    retry = await sim.call("payment", "charge-payment", "o-1", "o-1:charge-payment")

    assert answer.status == 200
    assert answer.body == {"applied": True, "result": retry.body["result"]}
    assert retry.headers.get("Idempotent-Replayed") == "true"
    effect = await sim.effect("o-1:charge-payment")
    assert (effect["calls"], effect["applied"]) == (2, 1)
    stats = await sim.stats("payment")
    assert (stats["applyThenHangs"], stats["hangs"], stats["transientErrors"]) == (1, 0, 0)


async def test_apply_then_hang_shorter_than_the_client_timeout_answers_late(
    sim: SimClient,
) -> None:
    await sim.put_faults("inventory", {"applyThenHangRate": 1.0, "hangSeconds": 0.3})

    started = time.monotonic()
    reply = await sim.call("inventory", "reserve-inventory", "o-1", "k-1", time_limit=5)

    assert reply.status == 200
    assert time.monotonic() - started >= 0.3
    assert (await sim.effect("k-1"))["applied"] == 1


async def test_apply_then_hang_of_a_rejected_call_leaves_nothing_applied(sim: SimClient) -> None:
    await sim.put_faults(
        "payment",
        {"applyThenHangRate": 1.0, "hangSeconds": 30, "permanentFailureSkus": ["SKU-1"]},
    )

    with pytest.raises(TimeoutError):
        await sim.call("payment", "charge-payment", "o-1", "k-1", time_limit=0.5)

    assert (await sim.outcome("payment", "k-1")).body == {"applied": False}


async def test_traceparents_are_kept_per_key_most_recent_last_and_bounded(
    sim: SimClient,
) -> None:
    parents = [f"00-{i:032x}-{i:016x}-01" for i in range(1, 13)]
    for parent in parents:
        await sim.call("payment", "charge-payment", "o-1", "k-1", headers={"traceparent": parent})
    await sim.call("payment", "charge-payment", "o-1", "k-1")  # no header: nothing added
    await sim.call("inventory", "reserve-inventory", "o-1", "k-2")

    assert (await sim.effect("k-1"))["traceparents"] == parents[-10:]
    assert (await sim.effect("k-2"))["traceparents"] == []


async def test_a_call_held_on_the_network_is_never_seen_until_it_arrives_then_applies(
    sim: SimClient,
) -> None:
    """`lateRate`: the residual risk of a provider without abandon. The caller gives up,
    the key is never seen meanwhile (a query answers 404, so a caller past the live time
    settles it as not applied), and the request still applies when it arrives; the
    ledger says which effect came that way."""
    await sim.put_faults("payment", {"lateRate": 1.0, "lateSeconds": 0.8})

    with pytest.raises(TimeoutError):
        await sim.call("payment", "charge-payment", "o-1", "o-1:charge-payment", time_limit=0.3)
    during = await sim.outcome("payment", "o-1:charge-payment")
    assert (await sim.stats("payment"))["heldNow"] == 1
    after = await sim.outcome_when("payment", "o-1:charge-payment", 200)

    assert during.status == 404
    assert after.body["applied"] is True
    effect = await sim.effect("o-1:charge-payment")
    assert (effect["applied"], effect["arrivedLate"]) == (1, True)
    stats = await sim.stats("payment")
    assert (stats["lateArrivals"], stats["lateApplied"], stats["heldNow"]) == (1, 1, 0)


async def test_a_key_settled_by_a_call_on_time_is_not_marked_late(sim: SimClient) -> None:
    """The flag names the call that settled the key: a held copy that arrives after a
    call on time is a repeat and changes nothing."""
    await sim.put_faults("payment", {"lateRate": 1.0, "lateSeconds": 0.6})
    with pytest.raises(TimeoutError):
        await sim.call("payment", "charge-payment", "o-1", "o-1:charge-payment", time_limit=0.2)
    await sim.put_faults("payment", {})
    on_time = await sim.call("payment", "charge-payment", "o-1", "o-1:charge-payment")
    await eventually(
        "the held call arrived",
        lambda: sim.counted("payment", "idempotentRepeats"),
        10,
    )

    effect = await sim.effect("o-1:charge-payment")
    assert on_time.status == 200
    assert (effect["applied"], "arrivedLate" in effect) == (1, False)
