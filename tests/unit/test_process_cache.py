"""The Scheduler's copy of the orders it wrote: reads it spares, and the races it still loses."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from shared.contract import agent_queue
from shared.domain.machine.forward import start
from shared.domain.model import OrderProcess, Outgoing, ProcessState, StepStatus
from shared.usecases.flow import scheduler
from shared.usecases.flow.deps import ProcessDeps
from shared.usecases.flow.process_cache import ProcessCache
from shared.usecases.flow.scheduler import Handled
from shared.usecases.flow.submission import submit_order
from shared.usecases.flow.supervisor import sweep
from tests.builders import World, a_reply, an_order
from tests.workflows import ORDER_FULFILMENT

AGENT_QUEUES = (agent_queue("inventory"), agent_queue("payment"), agent_queue("shipping"))


def cached(world: World, cache: ProcessCache, instance: str = "scheduler-1") -> ProcessDeps:
    return replace(world.deps(instance), cache=cache)


def agent_requests(world: World) -> list[Outgoing]:
    return [m for q in AGENT_QUEUES for m in world.bus.take(q)]


async def test_an_order_goes_through_the_scheduler_without_a_read_after_intake() -> None:
    world, cache = World(), ProcessCache()
    await submit_order(cached(world, cache), an_order("o-1"))  # claimed at intake
    reads = world.store.operations["read"]
    for _ in range(3):
        (request,) = agent_requests(world)
        assert await scheduler.on_reply(cached(world, cache), a_reply(request)) is Handled.APPLIED
    assert world.store.operations["read"] == reads
    done = await world.store.load("o-1")
    assert done is not None and done.state.process_state is ProcessState.PROCESSED
    assert "o-1" not in cache  # a finished order is not kept
    assert "o-1" not in world.store.watched()


async def test_a_copy_another_instance_moved_on_loses_its_write_and_is_read_again() -> None:
    world, mine, theirs = World(), ProcessCache(), ProcessCache()
    await submit_order(cached(world, mine), an_order("o-1"))
    stale = mine.get("o-1")
    (inventory,) = agent_requests(world)
    other = cached(world, theirs, "scheduler-2")
    assert await scheduler.on_reply(other, a_reply(inventory)) is Handled.APPLIED
    (payment,) = agent_requests(world)
    assert mine.get("o-1") == stale  # still the copy before the other instance's write
    writes = world.store.operations["write"]

    assert await scheduler.on_reply(cached(world, mine), a_reply(payment)) is Handled.APPLIED
    stored = await world.store.load("o-1")
    assert stored is not None
    assert [s.status for s in stored.steps[:2]] == [StepStatus.COMPLETED] * 2
    assert world.store.operations["write"] == writes + 1  # the stale copy never got a write in
    assert mine.get("o-1") == stored


async def test_a_conditional_write_on_a_stale_copy_is_refused_then_decided_afresh() -> None:
    world, mine = World(), ProcessCache()
    await submit_order(cached(world, mine), an_order("o-1"))
    (first,) = agent_requests(world)
    stale = mine.get("o-1")
    world.clock.advance(31)
    await sweep(world.deps())  # the step timed out elsewhere: requeued
    await scheduler.on_nudge(world.deps("scheduler-2"), "o-1")  # attempt 2, not cached here
    (second,) = agent_requests(world)
    assert mine.get("o-1") == stale  # attempt 1 as this instance last wrote it

    # On the stale copy attempt 1's reply looks current; the refused write makes it stale.
    assert await scheduler.on_reply(cached(world, mine), a_reply(first)) is Handled.STALE
    assert "o-1" not in mine
    now = await world.store.load("o-1")
    assert now is not None and now.steps[0].status is StepStatus.RUNNING
    assert await scheduler.on_reply(cached(world, mine), a_reply(second)) is Handled.APPLIED


async def test_nothing_to_do_on_a_copy_is_checked_against_a_fresh_read() -> None:
    world, mine = World(), ProcessCache()
    await submit_order(cached(world, mine), an_order("o-1"))
    (first,) = agent_requests(world)
    world.clock.advance(31)
    await sweep(world.deps())
    await scheduler.on_nudge(world.deps("scheduler-2"), "o-1")
    (second,) = agent_requests(world)
    # The copy holds attempt 1, so attempt 2's reply looks stale on it: the read says not.
    reads = world.store.operations["read"]
    assert await scheduler.on_reply(cached(world, mine), a_reply(second)) is Handled.APPLIED
    assert world.store.operations["read"] == reads + 1
    assert first.body["attempt"] == 1 and second.body["attempt"] == 2


async def test_two_instances_with_the_same_copy_have_one_winner() -> None:
    world, a, b = World(), ProcessCache(), ProcessCache()
    await submit_order(cached(world, a), an_order("o-1"))
    copy = a.get("o-1")
    assert copy is not None
    b.put(copy)
    (request,) = agent_requests(world)
    reply = a_reply(request)
    results = await asyncio.gather(
        scheduler.on_reply(cached(world, a, "s-a"), reply),
        scheduler.on_reply(cached(world, b, "s-b"), reply),
    )
    assert sorted(results) == sorted([Handled.APPLIED, Handled.STALE])
    assert len(agent_requests(world)) == 1


def test_the_cache_keeps_the_most_recently_used_orders() -> None:
    world = World()
    cache = ProcessCache(size=2)
    template = _a_stored_process(world)
    for order_id in ("a", "b"):
        cache.put(_as(template, order_id))
    assert cache.get("a") is not None
    cache.put(_as(template, "c"))
    assert "b" not in cache and "a" in cache and "c" in cache
    cache.put(replace(_as(template, "a"), etag=None))
    assert "a" not in cache
    with pytest.raises(ValueError):
        ProcessCache(size=0)


def _a_stored_process(world: World) -> OrderProcess:
    return start(an_order("t"), ORDER_FULFILMENT, world.clock.now()).process


def _as(process: OrderProcess, order_id: str) -> OrderProcess:
    order = replace(process.order, order_id=order_id)
    state = replace(process.state, order_id=order_id)
    return replace(process, order=order, state=state, etag='W/"1"')
