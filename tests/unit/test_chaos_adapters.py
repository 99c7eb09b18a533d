"""The chaos decorators crash where a real process could: a save is stored, then it dies."""

from __future__ import annotations

import pytest

from shared.adapters.chaos import ChaosFault, ChaosMessageBus, ChaosStateStore
from shared.adapters.memory.store import InMemoryBus, InMemoryStateStore
from shared.domain.machine import forward
from tests.builders import World, an_order
from tests.workflows import ORDER_FULFILMENT


async def test_a_crash_after_save_leaves_the_write_stored() -> None:
    world = World()
    inner = InMemoryStateStore()
    chaos = ChaosStateStore(inner, rate=1.0, seed=1)
    start = forward.start(an_order("c-1"), ORDER_FULFILMENT, world.clock.now())
    with pytest.raises(ChaosFault):
        await chaos.create(start.process, start.history)
    assert await inner.load("c-1") is not None
    with pytest.raises(ChaosFault):
        await chaos.load("c-1")
    assert chaos.dice.injected == 2


async def test_rate_zero_never_crashes_and_sends_pass_through() -> None:
    inner = InMemoryBus()
    bus = ChaosMessageBus(inner, rate=0.0)
    world = World()
    start = forward.start(an_order("c-2"), ORDER_FULFILMENT, world.clock.now())
    await bus.send(start.outgoing)
    assert len(inner.sent) == 2 and bus.dice.injected == 0
    crashing = ChaosMessageBus(InMemoryBus(), rate=1.0)
    with pytest.raises(ChaosFault):
        await crashing.send(start.outgoing)
