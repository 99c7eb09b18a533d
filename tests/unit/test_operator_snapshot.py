"""The ops snapshot's bounds: what it counts, when it says `N+`, what it flags as stale."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from shared.adapters.memory.store import InMemoryHealthStore, InMemoryStateStore
from shared.domain.health import AgentHealth, BreakerState
from shared.domain.model import OrderProcess, ProcessState
from shared.domain.rest_index import RestPage, RestRange, rest_entry
from shared.domain.routing import STALE_AFTER
from shared.ports import WatchPage
from shared.usecases.flow.submission import submit_order
from shared.usecases.operations.operator_page import operator_snapshot
from tests.builders import World, an_order


class EarlyStop(InMemoryStateStore):
    """Answers like Table Storage when a page stops early: a short page and a token."""

    def __init__(self) -> None:
        super().__init__()
        self.sizes: list[tuple[str, int]] = []

    async def rest_entries(self, keys: RestRange, limit: int, continuation: str | None) -> RestPage:
        self.sizes.append((keys.state.value, limit))
        page = await super().rest_entries(keys, limit, continuation)
        return RestPage(page.items[:1], "more-maybe") if page.items else page

    async def watch_list(self, limit: int, continuation: str | None) -> WatchPage:
        self.sizes.append(("watch", limit))
        return await super().watch_list(limit, continuation)


async def test_a_short_page_with_a_token_is_a_lower_bound_and_each_rest_reads_one_range() -> None:
    world = World()
    world.store = EarlyStop()
    for n in range(3):
        await submit_order(world.deps(), an_order(f"o-{n}"))
        process = await loaded(world, f"o-{n}")
        errored = replace(process.state, process_state=ProcessState.ERROR)
        await world.store.put_rest(rest_entry(replace(process, state=errored), None))
    snapshot = await operator_snapshot(world.deps(), InMemoryHealthStore(), count_cap=10)
    counts = {c.state: (c.count, c.capped) for c in snapshot.counts}
    assert counts[ProcessState.ERROR] == (1, True)
    assert counts[ProcessState.PROCESSING] == (3, False)  # claimed at intake
    assert sorted(world.store.sizes) == sorted(
        [("watch", 3 * 11), *((s.value, 11) for s in ProcessState if s.is_at_rest)]
    )


async def test_in_flight_counts_past_the_watch_lists_read_say_so() -> None:
    world = World()
    for n in range(10):
        await submit_order(world.deps(), an_order(f"o-{n}"))
    snapshot = await operator_snapshot(world.deps(), InMemoryHealthStore(), count_cap=2)
    counts = {c.state: (c.count, c.capped) for c in snapshot.counts}
    assert counts[ProcessState.PROCESSING] == (2, True)  # claimed at intake
    assert counts[ProcessState.PENDING] == (0, True)  # the unread entries may be
    assert counts[ProcessState.PROCESSED] == (0, False)


async def loaded(world: World, order_id: str) -> OrderProcess:
    found = await world.store.load(order_id)
    assert found is not None
    return found


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
    snapshot = await operator_snapshot(world.deps(), health)
    assert [(a.health.instance, a.stale) for a in snapshot.agents] == [
        ("i-1", False),
        ("i-2", True),
    ]


@pytest.mark.parametrize("cap", [0, 1001])
async def test_the_cap_is_bounded(cap: int) -> None:
    world = World()
    with pytest.raises(ValueError, match="count_cap"):
        await operator_snapshot(world.deps(), InMemoryHealthStore(), count_cap=cap)
