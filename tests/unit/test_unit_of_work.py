"""The unit of work's ordering rule, seen from the store and the bus: what a crash or a
failure between its writes leaves behind (in-memory adapters, fake clock)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

import pytest

from shared.domain.machine.operator import suspend
from shared.domain.machine.transition import Transition
from shared.domain.model import HistoryEntry, OrderProcess, ProcessState
from shared.domain.rest_index import RestRange
from shared.ports import BusUnavailable, ConcurrencyConflict, StoreUnavailable
from shared.usecases.flow.submission import submit_order
from shared.usecases.flow.supervisor import sweep
from shared.usecases.flow.unit_of_work import UnitOfWork
from shared.usecases.operations.events import send_event
from shared.usecases.operations.operator import resume_order, suspend_order
from tests.builders import World, an_order
from tests.unit.test_waits import APPROVED, loaded, reach_review
from tests.workflows import CATALOGUE


class CrashAfterSave(Exception):
    """The process died right after the store took the write."""


class Crashing(World):
    """A World whose store dies right after its next save."""

    def crash_after_next_save(self) -> None:
        real = self.store.save

        async def save(process: OrderProcess, history: Sequence[HistoryEntry]) -> str:
            self.store.save = real  # type: ignore[method-assign]
            await real(process, history)
            raise CrashAfterSave()

        self.store.save = save  # type: ignore[method-assign]


async def in_flight(world: World) -> OrderProcess:
    await submit_order(world.deps(), an_order("o-1"))  # claimed at intake
    process = await world.store.load("o-1")
    assert process is not None
    return process


async def test_a_resumed_order_is_watched_before_it_is_saved() -> None:
    """Suspended orders have no entry: a crash after the resume's save must not leave a
    moving order that no Supervisor will ever look at."""
    world = Crashing()
    await in_flight(world)
    await suspend_order(world.deps(), "o-1", "ops")
    assert "o-1" not in world.store.watched()
    world.crash_after_next_save()
    with pytest.raises(CrashAfterSave):
        await resume_order(world.deps(), "o-1", "ops")
    stored = await world.store.load("o-1")
    assert stored is not None and stored.state.process_state.value == "Pending"
    assert "o-1" in world.store.watched()


async def test_a_moving_order_that_loses_its_race_leaves_its_entry_alone() -> None:
    """An order in flight already has an entry: a loser writing its own check time there
    could push back the winner's earlier deadline."""
    world = World()
    process = await in_flight(world)
    before = world.store.watched()["o-1"]
    winner = suspend(process, world.clock.now(), "ops")
    assert winner is not None
    await world.store.save(winner.process, winner.history)
    late = suspend(process, world.clock.now(), "someone else")
    assert late is not None
    with pytest.raises(ConcurrencyConflict):
        await UnitOfWork(world.store, world.bus, catalogue=CATALOGUE).change(
            "o-1",
            lambda _: late,  # decided on the copy read before the winner's save
            cached=process,
            check_at=lambda _: world.clock.now() + timedelta(hours=1),
            races=1,
        )
    assert world.store.watched()["o-1"] == before


async def test_a_change_with_nothing_to_send_never_touches_the_bus() -> None:
    """A step heartbeat or an undelivered note must go through while the bus is down."""
    world = World()
    process = await in_flight(world)
    world.bus.fail_next = 1
    await UnitOfWork(world.store, world.bus, catalogue=CATALOGUE).commit(
        Transition(process, (), ())
    )
    assert world.bus.fail_next == 1


async def test_an_order_come_to_rest_is_unwatched_only_once_its_messages_went_out() -> None:
    """Its Suspended notification may be lost with the bus: the Supervisor, still
    watching, sends the outbox again."""
    world = World()
    await in_flight(world)
    world.bus.fail_next = 1
    with pytest.raises(BusUnavailable):
        await suspend_order(world.deps(), "o-1", "ops")
    assert "o-1" in world.store.watched()
    stored = await world.store.load("o-1")
    assert stored is not None and stored.state.process_state.value == "Suspended"


async def test_a_store_outage_during_a_resume_sends_nothing() -> None:
    world = World()
    await in_flight(world)
    await suspend_order(world.deps(), "o-1", "ops")
    sent = len(world.bus.sent)

    async def down(process: OrderProcess, history: Sequence[HistoryEntry]) -> str:
        raise StoreUnavailable("injected")

    world.store.save = down  # type: ignore[method-assign]
    with pytest.raises(StoreUnavailable):
        await resume_order(world.deps(), "o-1", "ops")
    assert len(world.bus.sent) == sent


class CrashBeforeSave(Exception):
    """The process died between the move's watch entry and its save."""


async def test_a_move_off_a_rest_that_never_saved_is_healed_once_then_left() -> None:
    """A resume watches the order for its next version, drops its rest entry and dies
    before its save: the order stays Suspended, without its entry, watched for a version
    that never comes. The Supervisor leaves it alone while the move might still save,
    then writes its entry back and unwatches it once, instead of at every sweep."""
    world = World()
    await in_flight(world)
    await suspend_order(world.deps(), "o-1", "ops")

    async def dies(process: OrderProcess, history: Sequence[HistoryEntry]) -> str:
        raise CrashBeforeSave()

    real = world.store.save
    world.store.save = dies  # type: ignore[method-assign]
    with pytest.raises(CrashBeforeSave):
        await resume_order(world.deps(), "o-1", "ops")
    world.store.save = real  # type: ignore[method-assign]
    assert "o-1" in world.store.watched()
    assert await rested(world) == []

    world.clock.advance(30)
    await sweep(world.deps())
    assert "o-1" in world.store.watched(), "the move may still save"
    assert await rested(world) == []

    world.clock.advance(60)
    first = await sweep(world.deps())
    assert first.finished == 1
    assert "o-1" not in world.store.watched()
    assert await rested(world) == ["o-1"]
    stored = await world.store.load("o-1")
    assert stored is not None and stored.state.process_state is ProcessState.SUSPENDED

    world.clock.advance(60)
    writes = world.store.operations["write"]
    again = await sweep(world.deps())
    assert (again.due, again.finished) == (0, 0)
    assert world.store.operations["write"] == writes


async def rested(world: World) -> list[str]:
    page = await world.store.rest_entries(RestRange(ProcessState.SUSPENDED), 10, None)
    return [entry.order_id for entry in page.items]


async def test_an_event_that_moves_a_check_earlier_watches_before_its_save() -> None:
    """Found by a chaos run (1,000 orders, seed 1): an approval's first POST crashed
    after its save. The order had been watched at its review's deadline, a day away; the
    save dispatched the charge, due in seconds, but the entry kept the day, and the
    repeat of the eventId changed nothing. The charge's request was lost, so the order
    sat Processing with nothing to look at it for a day. A check that moves earlier is
    written before the save too: a spare early entry only costs the Supervisor a read."""
    world = Crashing()
    await reach_review(world)
    world.clock.advance(31)
    await sweep(world.deps())  # one look at the waiting order: then nothing for a day
    assert world.store.watched()["o-1"] >= world.clock.now() + timedelta(hours=23)
    world.crash_after_next_save()
    with pytest.raises(CrashAfterSave):
        await send_event(world.deps(), "o-1", "review", "ev-1", APPROVED)
    process = await loaded(world)
    charge = process.steps[2]
    assert charge.complete_by is not None and charge.agent == "payment"
    assert world.store.watched()["o-1"] <= charge.complete_by
