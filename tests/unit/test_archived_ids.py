"""An archived order's id stays taken (issue 37, H). The archiver purges a finished order's
rows; before, its id was then free, and a new order under it sent the archived order's
idempotency keys (`{orderId}:{operation}`) again, which a provider answered with the old
results: the new order ended Processed and was never charged. On the in-memory fakes,
through the real archiver and the real intake."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

import pytest

from shared.adapters.clock import FakeClock
from shared.adapters.memory.archive import InMemoryArchiveBlobs, InMemoryArchiveStore
from shared.contract import Queue, agent_queue
from shared.domain.archive import RetentionPolicy
from shared.domain.machine.forward import start
from shared.domain.model import ProcessState, StepStatus
from shared.domain.rest_index import rest_entry
from shared.usecases.flow.submission import OrderConflict, submit_order
from shared.usecases.history.archive import Archiver, archived_on, archived_order
from shared.usecases.history.archive_marks import backfill_marks
from shared.usecases.operations.operator import OrderNotFound, resubmit_order
from tests.builders import World, an_order
from tests.workflows import ORDER_FULFILMENT

NOW = datetime(2026, 12, 31, 12, 0, tzinfo=UTC)
OLD = NOW - timedelta(days=40)


@dataclass
class Shelf:
    world: World
    archive: InMemoryArchiveStore
    blobs: InMemoryArchiveBlobs


async def archived_world(order_id: str = "mo-A-1", fingerprint: str = "body-a") -> Shelf:
    """A world where `order_id` finished Processed long ago and the archiver took it."""
    world = World(clock=FakeClock(NOW))
    started = start(an_order(order_id, fingerprint=fingerprint), ORDER_FULFILMENT, OLD)
    steps = tuple(replace(s, status=StepStatus.COMPLETED) for s in started.process.steps)
    done = replace(
        started.process,
        steps=steps,
        state=replace(started.process.state, process_state=ProcessState.PROCESSED, updated_at=OLD),
    )
    await world.store.create(done, started.history)
    await world.store.put_rest(rest_entry(done, ORDER_FULFILMENT))
    archive, blobs = InMemoryArchiveStore(world.store), InMemoryArchiveBlobs()
    run = await Archiver(world.store, archive, blobs, world.clock, "t", RetentionPolicy()).run()
    assert run.archived == 1 and await world.store.load(order_id) is None
    return Shelf(world, archive, blobs)


def nothing_started(world: World, order_id: str) -> None:
    assert world.bus.on(Queue.SCHEDULER) == [], "no nudge: nothing to claim, no key sent"
    assert order_id not in world.store.watched()


async def test_an_archived_id_sent_again_with_another_body_is_a_conflict() -> None:
    world = (await archived_world()).world

    with pytest.raises(OrderConflict):
        await submit_order(world.deps(), an_order("mo-A-1", fingerprint="body-b"))

    assert await world.store.load("mo-A-1") is None, "no new order under the archived id"
    nothing_started(world, "mo-A-1")


async def test_the_same_body_again_is_the_duplicates_answer_and_starts_nothing() -> None:
    world = (await archived_world()).world

    again = await submit_order(world.deps(), an_order("mo-A-1", fingerprint="body-a"))

    assert not again.created
    assert again.order_id == "mo-A-1" and again.process_state is ProcessState.PROCESSED
    assert await world.store.load("mo-A-1") is None
    nothing_started(world, "mo-A-1")


async def test_the_archive_still_answers_the_order_and_its_day() -> None:
    shelf = await archived_world()
    world = shelf.world
    await submit_order(world.deps(), an_order("mo-A-1", fingerprint="body-a"))
    with pytest.raises(OrderConflict):
        await submit_order(world.deps(), an_order("mo-A-1", fingerprint="body-b"))

    copy = await archived_order(shelf.archive, shelf.blobs, "mo-A-1")
    assert copy is not None and copy.process.order.fingerprint == "body-a"
    assert copy.process.state.process_state is ProcessState.PROCESSED
    listing = await archived_on(shelf.blobs, OLD.date(), 10, None)
    assert [e.order_id for e in listing.entries] == ["mo-A-1"]
    with pytest.raises(OrderNotFound):
        await resubmit_order(world.deps(), "mo-A-1", "op")


async def test_an_order_never_archived_is_not_touched_by_another_ids_mark() -> None:
    world = (await archived_world()).world

    fresh = await submit_order(world.deps(), an_order("mo-A-2", fingerprint="body-b"))

    stored = await world.store.load("mo-A-2")
    assert fresh.created and stored is not None
    assert stored.state.process_state is ProcessState.PROCESSING  # claimed at intake
    assert [m.body["orderId"] for m in world.bus.on(agent_queue("inventory"))] == ["mo-A-2"]


async def test_the_backfill_marks_orders_archived_before_marks_and_names_reused_ids() -> None:
    """Orders archived before the purge left a mark have none: the one-off backfill
    writes it from the archive's copy; an id a newer order took meanwhile is named."""
    shelf = await archived_world("mo-B-1")
    world = shelf.world
    for order_id in ("mo-B-2", "mo-B-3"):
        await archive_another(shelf, order_id)
    for order_id in ("mo-B-1", "mo-B-2", "mo-B-3"):
        world.store.forget_mark(order_id)
    await submit_order(world.deps(), an_order("mo-B-3", fingerprint="body-b"))

    pages, written, continuation = 0, 0, None
    reused: list[str] = []
    while True:
        page = await backfill_marks(world.store, shelf.archive, shelf.blobs, 1, continuation)
        pages, written = pages + 1, written + page.written
        reused += page.reused
        continuation = page.continuation
        if continuation is None:
            break

    assert (pages, written, reused) == (3, 2, ["mo-B-3"])
    mark = await world.store.archived("mo-B-1")
    assert mark is not None and mark.fingerprint == "body-a"
    with pytest.raises(OrderConflict):
        await submit_order(world.deps(), an_order("mo-B-2", fingerprint="body-b"))
    again = await backfill_marks(world.store, shelf.archive, shelf.blobs, 10, None)
    assert (again.written, again.reused) == (0, ("mo-B-3",)), "safe to repeat"


async def archive_another(shelf: Shelf, order_id: str) -> None:
    world = shelf.world
    started = start(an_order(order_id, fingerprint="body-a"), ORDER_FULFILMENT, OLD)
    done = replace(
        started.process,
        state=replace(started.process.state, process_state=ProcessState.PROCESSED, updated_at=OLD),
    )
    await world.store.create(done, started.history)
    await world.store.put_rest(rest_entry(done, ORDER_FULFILMENT))
    world.clock.advance(3600)
    archiver = Archiver(world.store, shelf.archive, shelf.blobs, world.clock, "t")
    assert (await archiver.run()).archived == 1
