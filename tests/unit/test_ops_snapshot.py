"""The ops snapshot's bounds: what it counts, when it says `N+`, what it flags as stale."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from shared.adapters.memory import InMemoryHealthStore, InMemoryStateStore
from shared.domain.health import AgentHealth, BreakerState
from shared.domain.model import ProcessState
from shared.domain.routing import STALE_AFTER
from shared.ports import Page
from shared.usecases.status_page import ops_snapshot
from shared.usecases.submission import submit_order
from tests.builders import World, an_order


class EarlyStop(InMemoryStateStore):
    """Answers like Table Storage at a partition boundary: a short page and a token."""

    def __init__(self) -> None:
        super().__init__()
        self.sizes: list[int] = []

    async def list_by_state(
        self, state: ProcessState | None, page_size: int, continuation: str | None
    ) -> Page:
        self.sizes.append(page_size)
        page = await super().list_by_state(state, page_size, continuation)
        return Page(page.items[:1], "more-maybe") if page.items else page


async def test_a_short_page_with_a_token_is_a_lower_bound_and_each_state_reads_one_page() -> None:
    world = World()
    world.store = EarlyStop()
    for n in range(3):
        await submit_order(world.deps(), an_order(f"o-{n}"))
    snapshot = await ops_snapshot(world.deps(), InMemoryHealthStore(), count_cap=10)
    pending = next(c for c in snapshot.counts if c.state is ProcessState.PENDING)
    assert (pending.count, pending.capped) == (1, True)
    assert world.store.sizes == [11] * len(ProcessState)


async def test_heartbeats_are_stale_only_past_the_threshold() -> None:
    world = World()
    health = InMemoryHealthStore()
    beat = AgentHealth(
        agent="inventory",
        instance="i-1",
        breaker=BreakerState.CLOSED,
        success_rate=1.0,
        latency_ms=3.0,
        in_flight=0,
        capacity=16,
        calls=0,
        heartbeat_at=world.clock.now() - STALE_AFTER,
    )
    await health.publish_health(beat)
    older = replace(beat, instance="i-2", heartbeat_at=beat.heartbeat_at - timedelta(seconds=1))
    await health.publish_health(older)
    snapshot = await ops_snapshot(world.deps(), health)
    assert [(a.health.instance, a.stale) for a in snapshot.agents] == [
        ("i-1", False),
        ("i-2", True),
    ]


@pytest.mark.parametrize("cap", [0, 1001])
async def test_the_cap_is_bounded(cap: int) -> None:
    world = World()
    with pytest.raises(ValueError, match="count_cap"):
        await ops_snapshot(world.deps(), InMemoryHealthStore(), count_cap=cap)
