"""The Scheduler's kept copies and the history carried in the state entity, on real
Azurite: what an order costs, and that two instances racing on one order still leave
exactly one winner."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from datetime import timedelta

import pytest
from azure.data.tables.aio import TableServiceClient

from shared.adapters.clock import FakeClock
from shared.adapters.memory.store import InMemoryBus
from shared.adapters.table.rows import INLINE_HISTORY_ENTRIES
from shared.adapters.table.store import TableStateStore
from shared.contract import agent_queue
from shared.domain.model import HistoryEntry, Outgoing, ProcessState, StepStatus
from shared.ports import ConcurrencyConflict
from shared.settings import azurite_connection_string
from shared.usecases.flow import scheduler
from shared.usecases.flow.deps import ProcessDeps
from shared.usecases.flow.process_cache import ProcessCache
from shared.usecases.flow.scheduler import Handled
from shared.usecases.flow.submission import OrderConflict, submit_order
from tests.builders import a_policy, a_reply, an_order
from tests.workflows import CATALOGUE

pytestmark = pytest.mark.azurite

AGENT_QUEUES = (agent_queue("inventory"), agent_queue("payment"), agent_queue("shipping"))
Instance = Callable[[str], ProcessDeps]


@pytest.fixture
async def stores(azurite_table_port: int) -> AsyncIterator[Callable[[], TableStateStore]]:
    """Store objects on one fresh table, as separate instances would have."""
    connection = azurite_connection_string(azurite_table_port)
    name = f"t{uuid.uuid4().hex[:20]}"
    made: list[TableStateStore] = []

    def new() -> TableStateStore:
        made.append(TableStateStore(TableServiceClient.from_connection_string(connection), name))
        return made[-1]

    try:
        yield new
    finally:
        for store in made:
            await store.close()


def instance(store: TableStateStore, bus: InMemoryBus, clock: FakeClock, name: str) -> ProcessDeps:
    return ProcessDeps(
        store, bus, clock, a_policy(), name, cache=ProcessCache(), catalogue=CATALOGUE
    )


def requests(bus: InMemoryBus) -> list[Outgoing]:
    return [m for q in AGENT_QUEUES for m in bus.take(q)]


async def test_a_fault_free_order_costs_no_read_and_no_transaction(
    stores: Callable[[], TableStateStore],
) -> None:
    store, bus, clock = stores(), InMemoryBus(), FakeClock()
    deps = instance(store, bus, clock, "s-1")
    await submit_order(deps, an_order("o-1"))  # claimed at intake
    for _ in range(3):
        (request,) = requests(bus)
        assert await scheduler.on_reply(deps, a_reply(request)) is Handled.APPLIED
    # The intake's create is its existence check; the unwatch of a Processed order
    # needs no read; every history entry rode in the state entity.
    assert store.operations == {"write": 7}  # watch, create, 3 saves, rest entry, unwatch
    fresh = stores()
    done = await fresh.load("o-1")
    assert done is not None and done.state.process_state is ProcessState.PROCESSED
    events = [h.event for h in await fresh.history("o-1")]
    assert events[0] == "submitted" and events[1] == "claimed"
    assert events.count("step-completed") == 3 and events.count("step-dispatched") == 3


async def test_a_stale_copy_loses_its_conditional_write_and_reads_again(
    stores: Callable[[], TableStateStore],
) -> None:
    bus, clock = InMemoryBus(), FakeClock()
    mine, theirs = stores(), stores()
    a = instance(mine, bus, clock, "s-a")
    b = instance(theirs, bus, clock, "s-b")
    await submit_order(a, an_order("o-1"))  # claimed at intake
    (inventory,) = requests(bus)
    assert await scheduler.on_reply(b, a_reply(inventory)) is Handled.APPLIED
    (payment,) = requests(bus)
    assert a.cache is not None
    stale = a.cache.get("o-1")
    assert stale is not None and stale.steps[0].status is StepStatus.RUNNING
    before = mine.operations.copy()

    # A redelivered inventory reply looks current on the stale copy: its write is refused.
    assert await scheduler.on_reply(a, a_reply(inventory)) is Handled.STALE
    assert mine.operations - before == {"write": 1, "read": 1}
    assert "o-1" not in a.cache
    assert await scheduler.on_reply(a, a_reply(payment)) is Handled.APPLIED
    stored = await stores().load("o-1")
    assert stored is not None
    assert [s.status for s in stored.steps] == [
        StepStatus.COMPLETED,
        StepStatus.COMPLETED,
        StepStatus.RUNNING,
    ]
    assert a.cache.get("o-1") == stored
    events = [h.event for h in await stores().history("o-1")]
    assert events.count("step-completed") == 2


async def test_two_instances_racing_on_the_same_copy_have_exactly_one_winner(
    stores: Callable[[], TableStateStore],
) -> None:
    bus, clock = InMemoryBus(), FakeClock()
    a = instance(stores(), bus, clock, "s-a")
    b = instance(stores(), bus, clock, "s-b")
    await submit_order(a, an_order("o-1"))  # claimed at intake
    assert a.cache is not None and b.cache is not None
    copy = a.cache.get("o-1")
    assert copy is not None
    b.cache.put(copy)
    (request,) = requests(bus)
    reply = a_reply(request)

    results = await asyncio.gather(scheduler.on_reply(a, reply), scheduler.on_reply(b, reply))

    assert sorted(results) == sorted([Handled.APPLIED, Handled.STALE])
    assert len(requests(bus)) == 1
    events = [h.event for h in await stores().history("o-1")]
    assert events.count("step-completed") == 1


async def test_history_past_its_bound_moves_to_rows_and_reads_back_whole(
    stores: Callable[[], TableStateStore],
) -> None:
    store, other, clock = stores(), stores(), FakeClock()
    await submit_order(instance(store, InMemoryBus(), clock, "s-1"), an_order("o-1"))
    process = await store.load("o-1")
    assert process is not None
    intake = [h.event for h in await store.history("o-1")]
    written = INLINE_HISTORY_ENTRIES + 5
    for n in range(written):
        clock.advance(1)
        entry = HistoryEntry(clock.now(), "waiting", f"n{n}", ProcessState.PENDING, 0, 0)
        process = replace(process, state=replace(process.state, version=process.state.version + 1))
        # Every other save by a store that never saw the ETag: it reads the history first.
        etag = await (other if n % 2 else store).save(process, [entry])
        process = replace(process, etag=etag)
    # One move to rows (the 41st entry), in one transaction with its state change.
    assert store.operations["transaction"] + other.operations["transaction"] == 1
    history = await stores().history("o-1")
    assert [h.event for h in history] == intake + ["waiting"] * written
    assert [h.detail for h in history[len(intake) :]] == [f"n{i}" for i in range(written)]
    reloaded = await stores().load("o-1")
    assert reloaded is not None and reloaded.etag == process.etag


async def test_a_save_on_an_etag_the_entity_no_longer_has_is_a_lost_race(
    stores: Callable[[], TableStateStore],
) -> None:
    store, clock = stores(), FakeClock()
    await submit_order(instance(store, InMemoryBus(), clock, "s-1"), an_order("o-1"))
    process = await store.load("o-1")
    assert process is not None
    await store.save(process, [])
    with pytest.raises(ConcurrencyConflict):
        await stores().save(process, [])  # reads the history first: the ETag moved on
    with pytest.raises(ConcurrencyConflict):
        await store.save(process, [])


async def test_a_repeat_submission_leaves_the_watch_list_as_the_order_needs_it(
    stores: Callable[[], TableStateStore],
) -> None:
    """A repeat of a running order keeps its watch entry; a repeat of a finished one
    takes back the entry its own watch write made, so the Supervisor never sees it."""
    store, bus, clock = stores(), InMemoryBus(), FakeClock()
    deps = instance(store, bus, clock, "s-1")
    await submit_order(deps, an_order("o-2"))  # claimed at intake
    far = clock.now() + timedelta(days=1)
    again = await submit_order(deps, an_order("o-2"))
    assert not again.created and again.process_state is ProcessState.PROCESSING
    assert [e.order_id for e in await store.due(far, 10)] == ["o-2"]
    for _ in range(3):
        (request,) = requests(bus)
        assert await scheduler.on_reply(deps, a_reply(request)) is Handled.APPLIED
    assert await store.due(far, 10) == ()
    late = await submit_order(deps, an_order("o-2"))
    assert not late.created and late.process_state is ProcessState.PROCESSED
    assert await store.due(far, 10) == ()
    with pytest.raises(OrderConflict):
        await submit_order(deps, an_order("o-2", fingerprint="another body"))
    assert await store.due(far, 10) == ()
