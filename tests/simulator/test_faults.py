"""Injected faults seen through HTTP: transient errors, hangs, latency, concurrency."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
from aiohttp import web

from devhost.simulator import SimulatorServer, create_app
from tests.simulator.conftest import SimClient
from tests.waiting import eventually

RETRYABLE = {429, 500, 503}


async def test_transient_rate_one_fails_every_call(sim: SimClient) -> None:
    await sim.put_faults("shipping", {"transientErrorRate": 1.0})

    replies = [await sim.call("shipping", "create-shipment", f"o-{i}", f"k-{i}") for i in range(20)]

    assert {reply.status for reply in replies} <= RETRYABLE
    assert all(reply.content_type == "application/problem+json" for reply in replies)
    for reply in replies:
        if reply.status == 429:
            assert reply.headers["Retry-After"] == "1"
    assert (await sim.stats("shipping"))["transientErrors"] == 20


async def test_half_the_transient_errors_lose_an_applied_effect(sim: SimClient) -> None:
    """With a seed, some failed calls applied the effect (response lost), some did not;
    the retry with the same key then applies nothing new either way."""
    await sim.put_faults("payment", {"transientErrorRate": 1.0})
    keys = [f"k-{i}" for i in range(12)]
    failed = {key: await sim.call("payment", "charge-payment", "o-1", key) for key in keys}

    after = {
        key
        for key, reply in failed.items()
        if reply.headers["X-Simulator-Fault"] == "transient-after-apply"
    }
    applied = {effect["idempotencyKey"] for effect in await sim.effects() if effect["applied"]}
    assert applied == after
    assert 0 < len(after) < len(keys)

    await sim.put_faults("payment", {"transientErrorRate": 0})
    retried = {key: await sim.call("payment", "charge-payment", "o-1", key) for key in keys}

    assert all(reply.status == 200 for reply in retried.values())
    effects = await sim.effects()
    assert all((effect["calls"], effect["applied"]) == (2, 1) for effect in effects)
    stats = await sim.stats("payment")
    assert stats["applied"] == len(keys)
    assert stats["idempotentRepeats"] == len(after)
    assert stats["transientErrorsAfterApply"] == len(after)


async def test_same_seed_same_faults() -> None:
    async def run(seed: int) -> list[int]:
        with SimulatorServer(seed=seed) as server:
            async with aiohttp.ClientSession() as session:
                sim = SimClient(session, server.url)
                await sim.put_faults("inventory", {"transientErrorRate": 0.5})
                return [
                    (await sim.call("inventory", "reserve-inventory", "o", f"k-{i}")).status
                    for i in range(16)
                ]

    first, again, other = await run(7), await run(7), await run(8)

    assert first == again
    assert first != other


async def test_hung_call_abandoned_by_the_client_applies_nothing(sim: SimClient) -> None:
    await sim.put_faults("inventory", {"hangRate": 1.0, "hangSeconds": 0.6})

    with pytest.raises(TimeoutError):
        await sim.call("inventory", "reserve-inventory", "o-1", "k-hang", time_limit=0.2)
    # Nothing may happen late either: once the call is no longer in progress (had the
    # hang ignored the client's leaving, that is after hangSeconds and the apply), the
    # simulator has finished with it and nothing can apply any more.
    settled = await sim.outcome_when("inventory", "k-hang", 200)

    assert settled.body == {"applied": False}
    assert (await sim.effect("k-hang"))["calls"] == 1
    assert (await sim.effect("k-hang"))["applied"] == 0
    assert (await sim.stats("inventory"))["hangs"] == 1


async def test_hang_shorter_than_the_client_timeout_is_just_slow(sim: SimClient) -> None:
    await sim.put_faults("inventory", {"hangRate": 1.0, "hangSeconds": 0.3})

    started = time.monotonic()
    reply = await sim.call("inventory", "reserve-inventory", "o-1", "k-slow", time_limit=5)

    assert reply.status == 200
    assert time.monotonic() - started >= 0.3
    assert (await sim.effect("k-slow"))["applied"] == 1


async def test_hung_calls_do_not_block_others(sim: SimClient) -> None:
    await sim.put_faults("inventory", {"hangRate": 1.0, "hangSeconds": 30})
    hung = [
        asyncio.create_task(sim.call("inventory", "reserve-inventory", f"o-{i}", f"h-{i}"))
        for i in range(100)
    ]
    await eventually("100 calls hang", lambda: sim.counted("inventory", "hangs", 100), 30)

    started = time.monotonic()
    replies = await asyncio.gather(
        *(sim.call("payment", "charge-payment", f"o-{i}", f"p-{i}") for i in range(100))
    )

    assert all(reply.status == 200 for reply in replies)
    assert time.monotonic() - started < 5
    assert not any(task.done() for task in hung)
    for task in hung:
        task.cancel()
    await asyncio.gather(*hung, return_exceptions=True)
    assert (await sim.stats("inventory"))["hangs"] == 100


async def test_hang_ends_on_disconnect_without_handler_cancellation() -> None:
    """Runners that do not cancel handlers (aiohttp's default) still see the client go."""
    runner = web.AppRunner(create_app(seed=1))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        async with aiohttp.ClientSession() as session:
            sim = SimClient(session, f"http://127.0.0.1:{runner.addresses[0][1]}")
            await sim.put_faults("payment", {"hangRate": 1.0, "hangSeconds": 0.6})
            with pytest.raises(TimeoutError):
                await sim.call("payment", "charge-payment", "o", "k", time_limit=0.2)
            # Not in progress any more: the handler saw the client go (had it not, it
            # would have hung on for hangSeconds and then applied the call).
            settled = await sim.outcome_when("payment", "k", 200)

            assert settled.body == {"applied": False}
            assert (await sim.effect("k"))["applied"] == 0
    finally:
        await runner.cleanup()


async def test_stop_does_not_wait_for_hung_calls() -> None:
    server = SimulatorServer().start()
    async with aiohttp.ClientSession() as session:
        sim = SimClient(session, server.url)
        await sim.put_faults("shipping", {"hangRate": 1.0})  # default hangSeconds: 600
        hung = asyncio.create_task(sim.call("shipping", "create-shipment", "o", "k"))
        await eventually("the call hangs", lambda: sim.counted("shipping", "hangs"), 10)

        started = time.monotonic()
        await asyncio.to_thread(server.stop)

        assert time.monotonic() - started < 3
        reply = await hung
        assert reply.status == 503


async def test_latency_is_honoured(sim: SimClient) -> None:
    await sim.put_faults("payment", {"latencyMs": 300, "latencyJitterMs": 100})

    started = time.monotonic()
    reply = await sim.call("payment", "charge-payment", "o-1", "k-1")
    elapsed = time.monotonic() - started

    assert reply.status == 200
    assert 0.3 <= elapsed < 1.5


async def test_slow_call_still_applies_after_the_client_gives_up(sim: SimClient) -> None:
    """Unlike a hang, a slow call was already being processed: the effect happens."""
    await sim.put_faults("payment", {"latencyMs": 400})

    with pytest.raises(TimeoutError):
        await sim.call("payment", "charge-payment", "o-1", "k-late", time_limit=0.1)
    settled = await sim.outcome_when("payment", "k-late", 200)

    assert settled.body["applied"] is True
    assert (await sim.effect("k-late"))["applied"] == 1


async def test_concurrent_repeats_apply_once(sim: SimClient) -> None:
    """A repeat while the key is running is refused (409), never waited on or applied
    again; once settled, repeats replay the one result."""
    await sim.put_faults("payment", {"latencyMs": 50})

    replies = await asyncio.gather(
        *(sim.call("payment", "charge-payment", "o-1", "k-race") for _ in range(50))
    )
    again = await sim.call("payment", "charge-payment", "o-1", "k-race")

    assert {reply.status for reply in replies} <= {200, 409}
    assert {str(r.body) for r in replies if r.status == 200} == {str(again.body)}
    refused = [r for r in replies if r.status == 409]
    assert all(r.body["code"] == "operation-in-progress" for r in refused)
    assert all(r.headers["Retry-After"] == "1" for r in refused)
    assert await sim.untimed_effect("k-race") == {
        "service": "payment",
        "operation": "charge-payment",
        "orderId": "o-1",
        "idempotencyKey": "k-race",
        "calls": 51,
        "applied": 1,
        "traceparents": [],
        "abandoned": False,
    }
    assert (await sim.stats("payment"))["inProgressRejections"] == len(refused)


async def test_a_few_hundred_concurrent_calls(sim: SimClient) -> None:
    await sim.put_faults("shipping", {"latencyMs": 100})

    replies = await asyncio.gather(
        *(sim.call("shipping", "create-shipment", f"o-{i}", f"k-{i}") for i in range(300))
    )

    assert all(reply.status == 200 for reply in replies)
    assert len(await sim.effects("?service=shipping")) == 300
