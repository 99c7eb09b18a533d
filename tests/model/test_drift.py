"""The driver's copy of the use cases cannot drift from them: on situations the
explorer reaches, the real Scheduler and Supervisor, run over the in-memory store, make
the same change as tests/model/driver.py, and the watch entries they actually write
keep every moving order found by the Supervisor.

The driver calls the pure domain directly (fast enough to explore hundreds of thousands
of states), so what it adds around each call (the nudge that claims or wakes, the
in-doubt question with the routing and the exhausted count, `_settle`'s abandon and
ask) is a copy. Here each copy is checked against the code it copies, on every
situation a small exploration of each shipped setup reaches: the nudge
(scheduler.on_nudge), every reply on its way (scheduler.on_reply), and the sweep with
the services' true answers (supervisor._check with outcome queries read from the same
ledger). "Watched" is checked on the store: an order that is neither at rest nor
finished has a watch entry no later than its next deadline (or, when its step is in
doubt, the moment the Supervisor may ask about it).
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import cast

import pytest

from shared.adapters.clock import FakeClock
from shared.adapters.memory import InMemoryBus, InMemoryStateStore
from shared.domain.in_doubt import RemoteOutcome, RemoteOutcomeKind
from shared.domain.machine.recovery import next_deadline
from shared.domain.model import OrderProcess
from shared.domain.routing import Routing
from shared.usecases import scheduler, supervisor
from shared.usecases.deps import ProcessDeps
from shared.usecases.outcomes import OutcomeQueries
from shared.usecases.routing import RoutingSource
from tests.model import driver
from tests.model.provider import KeyStatus, Provider
from tests.model.setups import SETUPS, Setup
from tests.model.wire import Effects
from tests.model.world import BOUNDS, OrderWorld, World
from tests.workflows import CATALOGUE

SHIPPED = [s for n, s in SETUPS.items() if n.count("/") == 1]
"""The setups whose workflow is the catalogue's own (the use cases read the catalogue):
every shipped workflow under both policies."""
UNMIGRATED = dataclasses.replace(BOUNDS["core"], operator=BOUNDS["core"].operator - {"migrate"})
"""The use cases read the catalogue, which has no second version."""
WALKS = 20
STEPS = 30

_KIND = {
    KeyStatus.NEVER_SEEN: RemoteOutcomeKind.NEVER_SEEN,
    KeyStatus.RUNNING: RemoteOutcomeKind.IN_PROGRESS,
    KeyStatus.NOT_APPLIED: RemoteOutcomeKind.NOT_APPLIED,
    KeyStatus.REJECTED: RemoteOutcomeKind.NOT_APPLIED,
    KeyStatus.APPLIED: RemoteOutcomeKind.APPLIED,
    KeyStatus.ABANDONED: RemoteOutcomeKind.ABANDONED,
}


@dataclass
class Ledger:
    """Outcome queries answered from the model's ledger, as the world's sweep hears
    them (the true answer)."""

    world: World
    provider: Provider

    async def ask(self, agent: str, key: str) -> RemoteOutcome:
        status = self.provider.get(self.world.space(agent), key).status
        return RemoteOutcome(_KIND[status], {"ref": key} if status is KeyStatus.APPLIED else None)

    async def abandon(self, agent: str, key: str) -> RemoteOutcome:
        if not self.world.domain.setup.abandons(agent):
            return RemoteOutcome(RemoteOutcomeKind.NOT_SUPPORTED)
        self.provider, status = self.provider.abandon(self.world.space(agent), key)
        return RemoteOutcome(_KIND[status], {"ref": key} if status is KeyStatus.APPLIED else None)


@dataclass
class Routes:
    routing: Routing

    async def current(self) -> Routing:
        return self.routing


def situations(setup: Setup) -> Iterator[World]:
    """Seeded random walks through the core bound: deep situations (an exhausted
    count, a timer's time, a compensation waiting to settle) at a small cost."""
    model = OrderWorld(UNMIGRATED, setup)
    rng = random.Random(setup.name)
    seen = set()
    for _ in range(WALKS):
        world = model.initial()
        for _ in range(STEPS):
            key = model.key(world)
            if key not in seen:
                seen.add(key)
                yield world
            moves = list(model.successors(world))
            if not moves:
                break
            _, world = rng.choice(moves)


async def _store(world: World) -> tuple[InMemoryStateStore, ProcessDeps, FakeClock]:
    store = InMemoryStateStore()
    clock = FakeClock(driver.at(world.now))
    domain = world.domain
    process = world.process
    await store.create(process, ())
    check = domain.next_check(process, world.now)
    if check is not None:
        when = driver.at(min(check, world.now))
        await store.watch(process.order_id, when, replace=True, version=process.state.version)
    routes = cast(RoutingSource, Routes(domain.routing(world.drained)))
    deps = ProcessDeps(
        store, InMemoryBus(), clock, domain.policy, driver.SCHEDULER, routes, catalogue=CATALOGUE
    )
    return store, deps, clock


async def _stored(store: InMemoryStateStore) -> OrderProcess:
    process = await store.load(driver.ORDER.order_id)
    assert process is not None
    return process


def _same(world: World, what: str, real: OrderProcess, effects: object) -> None:
    expected = effects.process if isinstance(effects, Effects) else world.process
    assert driver.key(real) == driver.key(expected), (
        f"{what} at t={world.now} from {driver.describe(world.process)}:\n"
        f"  use case: {driver.describe(real)}\n  driver:   {driver.describe(expected)}"
    )


async def _watched(world: World, store: InMemoryStateStore, process: OrderProcess) -> None:
    """The entries written: a moving order is due no later than its next deadline."""
    if process.state.process_state.is_terminal:
        return
    entry = store.watched().get(process.order_id)
    deadline = next_deadline(process, world.domain.policy)
    asked = world.domain.question(process, world.drained)
    if deadline is not None and asked is not None:
        deadline = max(deadline, driver.at(asked.ask_at))  # asked earlier it would guess
    assert entry is not None, f"not watched: {driver.describe(process)}"
    assert deadline is None or entry <= deadline, (
        f"watched at {entry.isoformat()}, after its deadline {deadline.isoformat()}: "
        f"{driver.describe(process)}"
    )


async def _check(world: World) -> int:
    domain = world.domain
    compared = 0
    if world.due_nudges:
        store, deps, _ = await _store(world)
        await scheduler.on_nudge(deps, driver.ORDER.order_id)
        real = await _stored(store)
        _same(world, "nudge", real, domain.claim(world.process, world.now, world.drained))
        await _watched(world, store, real)
        compared += 1
    for reply in sorted(world.replies):
        store, deps, _ = await _store(world)
        await scheduler.on_reply(deps, domain.message(reply))
        real = await _stored(store)
        _same(
            world,
            f"reply {reply.describe()}",
            real,
            domain.reply(world.process, reply, world.now, world.drained),
        )
        await _watched(world, store, real)
        compared += 1
    if domain.due(world.process, world.now):
        store, deps, _ = await _store(world)
        ledger = Ledger(world, world.provider)
        entries = await store.due(driver.at(world.now), 10)
        if entries:
            queries = cast(OutcomeQueries, ledger)
            report = supervisor.SweepReport()
            await supervisor._check(deps, entries[0], report, lambda _: False, queries)
            real = await _stored(store)
            expected = _driver_sweep(world)
            _same(world, "sweep", real, expected)
            await _watched(world, store, real)
            compared += 1
    return compared


def _driver_sweep(world: World) -> Effects | None:
    """The world's own sweep with the true answer (its first), or None."""
    model = OrderWorld(UNMIGRATED, world.domain.setup)
    for label, after in model._supervisor(world):
        if label != "sweep: no-answer":
            return Effects(after.process, (), (), (), label)
    return None


@pytest.mark.parametrize("setup", SHIPPED, ids=[s.name for s in SHIPPED])
def test_the_use_cases_do_what_the_driver_does(setup: Setup) -> None:
    async def run() -> int:
        total = 0
        for world in situations(setup):
            total += await _check(world)
        return total

    compared = asyncio.run(run())
    assert compared > 20
