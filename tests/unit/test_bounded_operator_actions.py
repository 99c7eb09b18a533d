"""Operator actions with a budget answer once the change is stored, whatever the bus does:
its sends go on in the background (or fail and are only logged, the order left for the
Supervisor), and a store that does not answer in time is StoreUnavailable. Without a
budget (bulk jobs) a failed send is still raised."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime

import pytest

from shared.adapters.memory.store import InMemoryBus, InMemoryHealthStore, InMemoryStateStore
from shared.contract import Queue
from shared.domain.health import AgentDrain
from shared.domain.model import OrderProcess, Outgoing, ProcessState
from shared.ports import BusUnavailable, StoreUnavailable
from shared.usecases.flow.submission import submit_order
from shared.usecases.flow.supervisor import sweep
from shared.usecases.limits.budget import Budget
from shared.usecases.operations.fleet import set_drain
from shared.usecases.operations.operator import (
    cancel_order,
    resubmit_order,
    resume_order,
    suspend_order,
)
from tests.builders import World, a_policy, an_order
from tests.workflows import CATALOGUE

BUDGET = Budget(store=0.2, nudge=0.1)


class StalledBus(InMemoryBus):
    """Sends wait while `stalled`, like a broker that is down and does not answer."""

    def __init__(self) -> None:
        super().__init__()
        self.flowing = asyncio.Event()
        self.flowing.set()

    async def send(self, messages: Sequence[Outgoing]) -> None:
        await self.flowing.wait()
        await super().send(messages)


class SilentStore(InMemoryStateStore):
    async def load(self, order_id: str) -> OrderProcess | None:
        await asyncio.sleep(3600)
        return None


class SilentHealthStore(InMemoryHealthStore):
    async def set_drain(self, drain: AgentDrain) -> None:
        await asyncio.sleep(3600)


async def claimed(world: World) -> None:
    await submit_order(world.deps(), an_order("o-1"))
    world.bus.take(Queue.SCHEDULER)


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def timed(action: Awaitable[OrderProcess]) -> OrderProcess:
    begun = time.monotonic()
    process = await action
    assert time.monotonic() - begun < 0.5
    return process


async def test_suspend_and_resume_answer_while_the_bus_stalls_and_their_sends_follow() -> None:
    world = World()
    bus = world.bus = StalledBus()
    await claimed(world)
    bus.flowing.clear()
    suspended = await timed(suspend_order(world.deps(), "o-1", "op", budget=BUDGET))
    assert suspended.state.process_state is ProcessState.SUSPENDED
    stored = await world.store.load("o-1")
    assert stored is not None and stored.state.process_state is ProcessState.SUSPENDED
    assert "o-1" in world.store.watched()  # unwatched only once its messages went out
    bus.flowing.set()
    await settle()
    assert "o-1" not in world.store.watched()
    bus.flowing.clear()
    resumed = await timed(resume_order(world.deps(), "o-1", "op", budget=BUDGET))
    assert resumed.state.process_state is ProcessState.PENDING
    assert bus.on(Queue.SCHEDULER) == []
    bus.flowing.set()
    await settle()
    assert [m.body["orderId"] for m in bus.on(Queue.SCHEDULER)] == ["o-1"]


async def test_cancel_answers_while_the_bus_stalls() -> None:
    world = World()
    world.bus = StalledBus()
    await claimed(world)
    world.bus.flowing.clear()
    cancelled = await timed(cancel_order(world.deps(), "o-1", "op", budget=BUDGET))
    assert cancelled.state.cancel_requested
    stored = await world.store.load("o-1")
    assert stored is not None and stored.state.cancel_requested


async def test_resubmit_answers_while_the_bus_stalls_and_again_resends_its_nudge() -> None:
    world = World(policy=a_policy(max_failure_count=1))
    bus = world.bus = StalledBus()
    await claimed(world)
    world.clock.advance(31)
    await sweep(world.deps())
    bus.take(Queue.SCHEDULER)
    bus.flowing.clear()
    first = await timed(resubmit_order(world.deps(), "o-1", "op", budget=BUDGET))
    again = await timed(resubmit_order(world.deps(), "o-1", "op", budget=BUDGET))
    assert first.state.process_state is again.state.process_state is ProcessState.PENDING
    assert again.state.version == first.state.version
    bus.flowing.set()
    await settle()
    assert {m.body["orderId"] for m in bus.on(Queue.SCHEDULER)} == {"o-1"}


async def test_a_failed_send_within_the_budget_is_logged_and_left_to_the_supervisor(
    caplog: pytest.LogCaptureFixture,
) -> None:
    world = World()
    await claimed(world)
    world.bus.fail_next = 1
    suspended = await suspend_order(world.deps(), "o-1", "op", budget=BUDGET)
    assert suspended.state.process_state is ProcessState.SUSPENDED
    await settle()
    assert "the Supervisor's next check sends it again" in caplog.text
    assert "o-1" in world.store.watched()
    world.clock.advance(31)
    await sweep(world.deps())  # a Suspended order still watched: its outbox is resent
    assert "o-1" not in world.store.watched()


async def test_without_a_budget_a_failed_send_is_raised() -> None:
    world = World()
    await claimed(world)
    world.bus.fail_next = 1
    with pytest.raises(BusUnavailable):
        await suspend_order(world.deps(), "o-1", "op")


@pytest.mark.parametrize(
    "act",
    [
        lambda w: cancel_order(w.deps(), "o-1", "op", budget=BUDGET),
        lambda w: suspend_order(w.deps(), "o-1", "op", budget=BUDGET),
        lambda w: resume_order(w.deps(), "o-1", "op", budget=BUDGET),
        lambda w: resubmit_order(w.deps(), "o-1", "op", budget=BUDGET),
    ],
)
async def test_a_silent_store_is_store_unavailable_within_the_budget(
    act: Callable[[World], Awaitable[OrderProcess]],
) -> None:
    world = World(store=SilentStore())
    begun = time.monotonic()
    with pytest.raises(StoreUnavailable, match=r"no answer within 0\.2 s"):
        await act(world)
    assert time.monotonic() - begun < 0.5


async def test_a_drain_on_a_silent_store_is_store_unavailable_within_the_budget() -> None:
    world = World()
    begun = time.monotonic()
    with pytest.raises(StoreUnavailable):
        await set_drain(
            SilentHealthStore(),
            world.clock,
            CATALOGUE,
            "payment",
            True,
            "maintenance",
            budget=BUDGET,
        )
    assert time.monotonic() - begun < 0.5


async def test_a_drain_within_the_budget_answers_with_the_flag() -> None:
    world = World()
    status = await set_drain(
        InMemoryHealthStore(), world.clock, CATALOGUE, "payment", True, budget=BUDGET
    )
    assert status.drained
    assert isinstance(status.drain.since if status.drain else None, datetime)


async def test_a_resume_while_the_suspends_sends_still_wait_stays_watched() -> None:
    """The race chaos found: suspend and resume during a broker outage. When the broker
    returns, the suspend's background sends unwatch entries of the suspend's version; the
    resumed order's entry carries its own, newer version and stays."""
    world = World()
    bus = world.bus = StalledBus()
    await claimed(world)
    bus.flowing.clear()
    await timed(suspend_order(world.deps(), "o-1", "op", budget=BUDGET))
    resumed = await timed(resume_order(world.deps(), "o-1", "op", budget=BUDGET))
    assert resumed.state.process_state is ProcessState.PENDING
    bus.flowing.set()
    await settle()
    assert "o-1" in world.store.watched()
    world.clock.advance(3600)
    await sweep(world.deps())
    assert "o-1" in {m.body["orderId"] for m in bus.on(Queue.SCHEDULER)}
