"""The rest index and the in-flight views, on the in-memory store and on Azurite: views
find orders at rest by one range read and in-flight ones on the watch list, and a crash
between an order's state write and its rest entry write (or drop) heals through the
Supervisor's check (docs/history.md)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from shared.adapters.memory.store import InMemoryHealthStore, Sent
from shared.contract import agent_queue
from shared.domain.model import HistoryEntry, OrderProcess, Outcome, ProcessState
from shared.domain.rest_index import RestEntry, RestRange, rest_entry
from shared.ports import StateStore
from shared.usecases.flow import scheduler
from shared.usecases.flow.submission import submit_order
from shared.usecases.flow.supervisor import sweep
from shared.usecases.history.rest_backfill import backfill_page
from shared.usecases.history.rest_shards import move_all
from shared.usecases.operations.failures import group_failures
from shared.usecases.operations.operator import resubmit_order, suspend_order
from shared.usecases.operations.operator_page import operator_snapshot
from shared.usecases.operations.order_views import orders_in
from tests.builders import World, a_policy, a_reply, an_order
from tests.integration.test_state_store_contract import store as state_store_on_memory_and_tables
from tests.unit.test_failures import time_out_at_payment
from tests.workflows import CATALOGUE

AGENT_QUEUES = (agent_queue("inventory"), agent_queue("payment"), agent_queue("shipping"))


store = state_store_on_memory_and_tables
"""The state-store contract's fixture: the same two stores."""


class Crash(RuntimeError):
    """The process died between the state write and the rest index write."""


class CrashingStore:
    """Delegates to a store; the named rest call raises once, before it reaches it."""

    def __init__(self, inner: StateStore) -> None:
        self._inner = inner
        self.crash_on: str | None = None
        self.meanwhile: dict[str, Callable[[], Awaitable[None]]] = {}
        """Per call, what another instance does just before it reaches the store (once)."""

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    async def _crash(self, call: str) -> None:
        if call in self.meanwhile:
            await self.meanwhile.pop(call)()
        if self.crash_on == call:
            self.crash_on = None
            raise Crash(call)

    async def save(self, process: OrderProcess, history: Sequence[HistoryEntry]) -> str:
        await self._crash("save")
        return await self._inner.save(process, history)

    async def put_rest(self, entry: RestEntry) -> None:
        await self._crash("put_rest")
        await self._inner.put_rest(entry)

    async def drop_rest(
        self, state: ProcessState, order_id: str, created_at: datetime, *, below: int | None = None
    ) -> None:
        await self._crash("drop_rest")
        await self._inner.drop_rest(state, order_id, created_at, below=below)


def a_world(store: StateStore) -> World:
    world = World(policy=a_policy(max_failure_count=1))
    world.store = store  # type: ignore[assignment]
    return world


def agent_requests(world: World, order_id: str) -> list[Sent]:
    mine = [m for q in AGENT_QUEUES for m in world.bus.on(q) if m.body["orderId"] == order_id]
    world.bus.sent = [m for m in world.bus.sent if m not in mine]
    return mine


async def claimed(world: World, order_id: str, customer: str = "cust-1") -> None:
    order = replace(an_order(order_id, clock=world.clock), customer_id=customer)
    await submit_order(world.deps(), order)
    await scheduler.on_nudge(world.deps(), order_id)


async def processed(world: World, order_id: str) -> None:
    await claimed(world, order_id)
    while requests := agent_requests(world, order_id):
        for request in requests:
            await scheduler.on_reply(world.deps(), a_reply(request))


async def errored(world: World, order_id: str) -> None:
    await claimed(world, order_id)
    await fail_to_error(world, order_id)


async def fail_to_error(world: World, order_id: str) -> None:
    """A claimed order's charge fails and so does the release that undoes the reservation."""
    (reserve,) = agent_requests(world, order_id)
    await scheduler.on_reply(world.deps(), a_reply(reserve))
    (charge,) = agent_requests(world, order_id)
    await scheduler.on_reply(world.deps(), a_reply(charge, Outcome.FAILED))
    (release,) = agent_requests(world, order_id)
    await scheduler.on_reply(world.deps(), a_reply(release, Outcome.FAILED))


async def ids(store: StateStore, state: ProcessState) -> list[str]:
    return [s.order_id for s in (await orders_in(store, state, 50, None)).items]


async def filed(store: StateStore, state: ProcessState) -> list[str]:
    return [e.order_id for e in (await store.rest_entries(RestRange(state), 50, None)).items]


async def test_views_read_rest_entries_and_the_watch_list(store: StateStore) -> None:
    world = a_world(store)
    await errored(world, "a-1")
    await processed(world, "d-1")
    await claimed(world, "b-1")
    pending = world.deps(claim_at_intake=False)  # as past the intake's burst
    await submit_order(pending, an_order("p-1", clock=world.clock))
    await claimed(world, "s-1")
    await suspend_order(world.deps(), "s-1", "ops")

    assert await ids(store, ProcessState.ERROR) == ["a-1"]
    assert await ids(store, ProcessState.PROCESSED) == ["d-1"]
    assert await ids(store, ProcessState.SUSPENDED) == ["s-1"]
    assert await ids(store, ProcessState.PROCESSING) == ["b-1"]
    assert await ids(store, ProcessState.PENDING) == ["p-1"]
    (shown,) = (await store.rest_entries(RestRange(ProcessState.ERROR), 5, None)).items
    a_1 = await store.load("a-1")
    assert a_1 is not None and a_1.state.last_error
    assert (shown.failure_count, shown.last_error, shown.customer_id) == (
        a_1.state.failure_count,
        a_1.state.last_error,
        "cust-1",
    )
    report = await group_failures(store)
    assert [(g.step, g.error_code, g.count) for g in report.groups] == [
        ("release-inventory", "declined", 1)
    ]
    snapshot = await operator_snapshot(world.deps(), InMemoryHealthStore(), count_cap=10)
    counts = {c.state: (c.count, c.capped) for c in snapshot.counts}
    assert counts == {
        ProcessState.PENDING: (1, False),
        ProcessState.PROCESSING: (1, False),
        ProcessState.COMPENSATING: (0, False),
        ProcessState.PROCESSED: (1, False),
        ProcessState.CANCELLED: (0, False),
        ProcessState.COMPENSATED: (0, False),
        ProcessState.ERROR: (1, False),
        ProcessState.SUSPENDED: (1, False),
    }
    assert [(e.entry.order_id, e.step) for e in snapshot.errors] == [("a-1", "reserve-inventory")]


async def test_a_crash_before_the_rest_entry_is_healed_by_the_supervisors_check(
    store: StateStore,
) -> None:
    crashing = CrashingStore(store)
    world = a_world(crashing)  # type: ignore[arg-type]
    crashing.crash_on = "put_rest"
    with pytest.raises(Crash):
        await processed(world, "d-1")
    order = await store.load("d-1")
    assert order is not None and order.state.process_state is ProcessState.PROCESSED
    assert await filed(store, ProcessState.PROCESSED) == []  # trails by the one write

    world.clock.advance(3600)
    await sweep(world.deps())
    assert await filed(store, ProcessState.PROCESSED) == ["d-1"]
    assert (await store.watch_list(10, None)).items == ()


async def test_an_order_leaving_a_rest_drops_its_entry_first_and_a_crash_after_heals(
    store: StateStore,
) -> None:
    crashing = CrashingStore(store)
    world = a_world(crashing)  # type: ignore[arg-type]
    await errored(world, "a-1")
    await errored(world, "a-2")
    assert await filed(store, ProcessState.ERROR) == ["a-1", "a-2"]

    await resubmit_order(world.deps(), "a-1", "ops")
    assert await filed(store, ProcessState.ERROR) == ["a-2"]
    assert await ids(store, ProcessState.PENDING) == ["a-1"]

    crashing.crash_on = "save"  # after its entry went, before the resubmit is stored
    with pytest.raises(Crash):
        await resubmit_order(world.deps(), "a-2", "ops")
    assert await ids(store, ProcessState.ERROR) == []  # trails by the one write
    assert await store.load("a-2") is not None

    world.clock.advance(3600)
    await sweep(world.deps())
    assert await filed(store, ProcessState.ERROR) == ["a-2"]
    assert await ids(store, ProcessState.ERROR) == ["a-2"]


async def test_a_rest_entry_racing_an_operator_who_moves_the_order_on_does_not_stay(
    store: StateStore,
) -> None:
    crashing = CrashingStore(store)
    world = a_world(crashing)  # type: ignore[arg-type]
    await errored(world, "a-1")
    stale = (await store.rest_entries(RestRange(ProcessState.ERROR), 5, None)).items[0]

    async def late_put() -> None:  # whoever brought it to Error, between drop and save
        await store.put_rest(stale)

    crashing.meanwhile["save"] = late_put
    await resubmit_order(world.deps(), "a-1", "ops")
    assert await filed(store, ProcessState.ERROR) == []

    await claimed(world, "a-2")

    async def resubmitted_before_the_entry() -> None:
        order = await store.load("a-2")
        assert order is not None and order.state.process_state is ProcessState.ERROR
        version = order.state.version + 1
        moved = replace(order.state, process_state=ProcessState.PENDING, version=version)
        await store.watch("a-2", world.clock.now(), replace=True, version=version)
        await store.save(replace(order, state=moved), ())

    crashing.meanwhile["put_rest"] = resubmitted_before_the_entry
    await fail_to_error(world, "a-2")
    assert await filed(store, ProcessState.ERROR) == []
    assert await ids(store, ProcessState.PENDING) == ["a-1", "a-2"]


async def test_a_range_pages_by_day_and_filters_the_customer(store: StateStore) -> None:
    day = datetime(2026, 3, 1, 12, tzinfo=UTC)

    def entry(order_id: str, days: int, customer: str) -> RestEntry:
        at = day + timedelta(days=days)
        return RestEntry(order_id, ProcessState.PROCESSED, 3, at, at, customer, "w", 1, 2)

    for e in (
        entry("o-1", 0, "ann"),
        entry("o-2", 0, "bob"),
        entry("o-3", 1, "ann"),
        entry("o-4", 2, "ann"),
        entry("o-5", 2, "bob"),
    ):
        await store.put_rest(e)
    everything = RestRange(ProcessState.PROCESSED)
    first = await store.rest_entries(everything, 2, None)
    second = await store.rest_entries(everything, 2, first.continuation)
    third = await store.rest_entries(everything, 2, second.continuation)
    pages = [first.items, second.items, third.items]
    assert [[e.order_id for e in p] for p in pages] == [["o-1", "o-2"], ["o-3", "o-4"], ["o-5"]]
    assert third.continuation is None
    assert first.items[0] == entry("o-1", 0, "ann")

    anns = RestRange(ProcessState.PROCESSED, customer_id="ann")
    assert [e.order_id for e in (await store.rest_entries(anns, 10, None)).items] == [
        "o-1",
        "o-3",
        "o-4",
    ]
    middle = RestRange(
        ProcessState.PROCESSED,
        created_from=day + timedelta(days=1),
        created_to=day + timedelta(days=1, hours=1),
    )
    assert [e.order_id for e in (await store.rest_entries(middle, 10, None)).items] == ["o-3"]
    with pytest.raises(ValueError, match="continuation"):
        await store.rest_entries(middle, 10, first.continuation)

    await store.drop_rest(ProcessState.PROCESSED, "o-3", day, below=3)  # no such key
    await store.drop_rest(ProcessState.PROCESSED, "o-4", day + timedelta(days=2), below=3)
    await store.drop_rest(ProcessState.PROCESSED, "o-5", day + timedelta(days=2), below=4)
    assert [e.order_id for e in (await store.rest_entries(everything, 10, None)).items] == [
        "o-1",
        "o-2",
        "o-3",
        "o-4",
    ]


async def test_the_watch_list_pages_through_every_entry_once(store: StateStore) -> None:
    now = datetime(2026, 3, 1, tzinfo=UTC)
    wanted = {f"w-{n}" for n in range(12)}
    for order_id in wanted:
        await store.watch(order_id, now, replace=True)
    seen: list[str] = []
    continuation: str | None = None
    while True:
        page = await store.watch_list(5, continuation)
        assert len(page.items) <= 5
        seen.extend(e.order_id for e in page.items)
        continuation = page.continuation
        if continuation is None:
            break
    assert sorted(seen) == sorted(wanted)


async def test_the_backfill_files_orders_stored_at_rest_before_the_index(
    store: StateStore,
) -> None:
    world = a_world(store)
    await errored(world, "a-1")
    await processed(world, "d-1")
    await claimed(world, "b-1")
    for state, order_id in ((ProcessState.ERROR, "a-1"), (ProcessState.PROCESSED, "d-1")):
        found = await store.load(order_id)
        assert found is not None
        await store.drop_rest(state, order_id, found.state.created_at)  # as before the index
    assert await ids(store, ProcessState.ERROR) == []

    written, continuation = 0, None
    while True:
        page = await backfill_page(store, CATALOGUE, 2, continuation)
        written += page.written
        continuation = page.continuation
        if continuation is None:
            break
    assert written == 2
    assert await ids(store, ProcessState.ERROR) == ["a-1"]
    assert await ids(store, ProcessState.PROCESSED) == ["d-1"]
    assert (
        await backfill_page(store, CATALOGUE, 10, None)
    ).written == 2  # a repeat rewrites the same
    assert await filed(store, ProcessState.PROCESSED) == ["d-1"]
    assert await ids(store, ProcessState.PROCESSING) == ["b-1"]


async def test_an_order_the_supervisor_gives_up_on_is_filed_under_error(
    store: StateStore,
) -> None:
    world = World()
    world.store = store  # type: ignore[assignment]
    await time_out_at_payment(world, "t-1")
    report = await group_failures(store)
    assert [(g.step, g.error_code, g.count) for g in report.groups] == [
        ("charge-payment", "timeout", 1)
    ]


async def test_an_older_entry_landing_over_a_newer_one_of_the_same_rest_is_written_again(
    store: StateStore,
) -> None:
    crashing = CrashingStore(store)
    world = a_world(crashing)  # type: ignore[arg-type]
    await claimed(world, "a-3")

    async def changed_again_at_rest() -> None:  # e.g. an operator's migrate, entry and all
        order = await store.load("a-3")
        assert order is not None and order.state.process_state is ProcessState.ERROR
        newer = replace(order.state, version=order.state.version + 1, failure_count=9)
        await store.save(replace(order, state=newer), ())
        await store.put_rest(rest_entry(replace(order, state=newer), None))

    crashing.meanwhile["put_rest"] = changed_again_at_rest
    await fail_to_error(world, "a-3")
    (entry,) = (await store.rest_entries(RestRange(ProcessState.ERROR), 5, None)).items
    row = await store.load("a-3")
    assert row is not None
    assert (entry.version, entry.failure_count) == (row.state.version, 9)


async def test_the_move_into_shards_finds_nothing_where_every_entry_is_sharded(
    store: StateStore,
) -> None:
    """Entries written by this version are in their shards already (the Table layout's
    older ones: tests/integration/test_rest_shards_on_azurite.py): a move reads, moves
    and changes nothing, on either store."""
    world = a_world(store)
    await errored(world, "a-1")
    await processed(world, "d-1")
    assert await move_all(store, CATALOGUE, 10) == 0  # type: ignore[arg-type]
    assert await filed(store, ProcessState.ERROR) == ["a-1"]
    assert await filed(store, ProcessState.PROCESSED) == ["d-1"]
