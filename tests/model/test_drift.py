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

The same holds for what operators and deploys do around an order: every single operator
action and every bulk action (`bulk._act`) over the store against the driver's; an order
whose version the catalogue dropped, refused by every action and held by the Supervisor;
reconciliation (`Reconciler._check`) over every order at rest the walks reach, finished
or held in Error or Suspended (the product samples both), over the model's ledger, over
that ledger with a step's effect added or taken away at each provider, and with a step's
undo that found nothing to undo followed by its do, its heal key unasked, undone, or
finding nothing itself; and the customer ledger's line (the
intake's admission, and the Supervisor's check of an order in line).
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Awaitable, Callable, Hashable, Iterator
from dataclasses import dataclass
from typing import cast

import pytest

from shared.adapters.clock import FakeClock
from shared.adapters.memory.customers import InMemoryCustomerLedger
from shared.adapters.memory.reconcile import InMemoryReconcileStore
from shared.adapters.memory.store import InMemoryBus, InMemoryStateStore
from shared.domain import reconcile as reconciliation
from shared.domain.bulk import BulkJob
from shared.domain.bulk_request import BulkAction
from shared.domain.destination import To
from shared.domain.in_doubt import RemoteOutcome, RemoteOutcomeKind
from shared.domain.machine import line
from shared.domain.machine.dispatch import heal_key
from shared.domain.machine.recovery import next_complete_by
from shared.domain.machine.transition import InvalidTransition
from shared.domain.model import Notify, OrderProcess
from shared.domain.routing import Routing
from shared.domain.workflow import Catalogue
from shared.usecases.flow import scheduler, supervisor
from shared.usecases.flow.deps import ProcessDeps
from shared.usecases.flow.intake_load import BURST, IntakeLoad
from shared.usecases.flow.outcomes import OutcomeQueries
from shared.usecases.flow.routing import RoutingSource
from shared.usecases.flow.submission import submit_order
from shared.usecases.limits.customers import Customers
from shared.usecases.operations import bulk as bulk_usecase
from shared.usecases.operations.events import send_event
from shared.usecases.operations.operator import (
    cancel_order,
    resubmit_order,
    resume_order,
    suspend_order,
)
from shared.usecases.operations.reconcile import Reconciler, _Tally
from tests.model import driver
from tests.model.provider import Entry, KeyStatus, Provider
from tests.model.setups import SETUPS, Setup
from tests.model.wire import Effects
from tests.model.world import BOUNDS, OrderWorld, World, _truth
from tests.workflows import CATALOGUE, running, without

T0 = driver.T0


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
        """An applied undo's answer says whether it undid its do, as the world's does."""
        return _truth(dataclasses.replace(self.world, provider=self.provider), agent, key)

    async def abandon(self, agent: str, key: str) -> RemoteOutcome:
        if not self.world.domain.setup.abandons(agent):
            return RemoteOutcome(RemoteOutcomeKind.NOT_SUPPORTED)
        self.provider, status = self.provider.abandon(self.world.space(agent), key)
        return RemoteOutcome(_KIND[status], {"ref": key} if status is KeyStatus.APPLIED else None)


@dataclass
class Truth:
    """Outcome queries as reconciliation hears them: an undo's result says whether it
    undid anything."""

    world: World

    async def ask(self, agent: str, key: str) -> RemoteOutcome:
        return _truth(self.world, agent, key)


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


async def _store(
    world: World, catalogue: Catalogue = CATALOGUE, *, due: bool = True
) -> tuple[InMemoryStateStore, ProcessDeps, FakeClock]:
    """The order stored as the world has it. `due`: watched now, so a sweep reads it;
    otherwise watched where the world's entry is (`World.watch`), so that what a use
    case writes, or leaves, can be compared with the driver's."""
    store = InMemoryStateStore()
    clock = FakeClock(driver.at(world.now))
    domain = world.domain
    process = world.process
    await store.create(process, ())
    check = domain.next_check(process, world.now) if due else world.watch
    if check is not None:
        when = driver.at(min(check, world.now) if due else check)
        await store.watch(process.order_id, when, replace=True, version=process.state.version)
    routes = cast(RoutingSource, Routes(domain.routing(world.drained)))
    deps = ProcessDeps(
        store, InMemoryBus(), clock, domain.policy, driver.SCHEDULER, routes, catalogue=catalogue
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
    """The entries written: a moving order is due no later than its next deadline (or
    its ask-at)."""
    if process.state.process_state.is_at_rest:
        return
    entry = store.watched().get(process.order_id)
    deadline = next_complete_by(process, world.domain.policy)
    asked = world.domain.question(process, world.drained)
    if deadline is not None and asked is not None:
        deadline = max(deadline, driver.at(asked.ask_at))  # asked earlier it would guess
    assert entry is not None, f"not watched: {driver.describe(process)}"
    assert deadline is None or entry <= deadline, (
        f"watched at {entry.isoformat()}, after its deadline {deadline.isoformat()}: "
        f"{driver.describe(process)}"
    )


def _wrote(world: World, what: str, store: InMemoryStateStore, effects: Effects | None) -> None:
    """The watch entry the use case left is the one the driver's change leaves
    (`Effects.rewatch`): the world judges `watched` on it."""
    entry = store.watched().get(driver.ORDER.order_id)
    real = None if entry is None else driver.tick(entry)
    expected = world.watch if effects is None else effects.watched(world.watch)
    assert real == expected, (
        f"{what} at t={world.now} from {driver.describe(world.process)} watched at "
        f"t={world.watch}: the use case left the entry at {real}, the driver at {expected}"
    )


async def _check(world: World) -> int:
    domain = world.domain
    compared = 0
    if world.due_nudges:
        store, deps, _ = await _store(world, due=False)
        await scheduler.on_nudge(deps, driver.ORDER.order_id)
        real = await _stored(store)
        claimed = domain.claim(world.process, world.now, world.drained)
        _same(world, "nudge", real, claimed)
        _wrote(world, "nudge", store, claimed)
        await _watched(world, store, real)
        compared += 1
    for reply in sorted(world.replies):
        store, deps, _ = await _store(world, due=False)
        await scheduler.on_reply(deps, domain.message(reply))
        real = await _stored(store)
        taken = domain.reply(world.process, reply, world.now, world.drained)
        _same(world, f"reply {reply.describe()}", real, taken)
        _wrote(world, f"reply {reply.describe()}", store, taken)
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
            if expected is not None:
                _wrote(world, "sweep", store, expected)
            await _watched(world, store, real)
            compared += 1
    return compared


def _driver_sweep(world: World) -> Effects | None:
    """The world's own sweep with the true answer (its first), or None."""
    model = OrderWorld(UNMIGRATED, world.domain.setup)
    for label, after in model._supervisor(world):
        if label != "sweep: no-answer":
            return Effects(after.process, (), (), (), label, rewatch=True, watch=after.watch)
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


EVERY = 4
"""The operator and version checks take every fourth situation: each runs several use
cases, and the walks' neighbouring situations differ little."""


def _sampled(setup: Setup) -> Iterator[World]:
    for i, world in enumerate(situations(setup)):
        if i % EVERY == 0:
            yield world


_SINGLE: dict[str, Callable[[ProcessDeps, str, str], Awaitable[OrderProcess]]] = {
    "cancel": cancel_order,
    "suspend": suspend_order,
    "resume": resume_order,
    "resubmit": resubmit_order,
}


async def _operated(
    world: World, action: str, bulk: bool, catalogue: Catalogue = CATALOGUE
) -> tuple[OrderProcess, bool, InMemoryStateStore]:
    """The order after the real use case, running on `catalogue`: a single action
    (refused: unchanged), or a bulk job's `_act` (skipped: unchanged). The flag: did it
    act? The store: its watch entry, read after."""
    store, deps, _ = await _store(world, catalogue, due=False)
    order_id = driver.ORDER.order_id
    if bulk:
        job = BulkJob("b-1", BulkAction(action), driver.BULK_FILTER, 1, T0, T0)
        acted = await bulk_usecase._act(deps, job, order_id, replay=False)
        return await _stored(store), acted is bulk_usecase.Acted.DONE, store
    try:
        await _SINGLE[action](deps, order_id, "op")
    except InvalidTransition:
        return await _stored(store), False, store
    return await _stored(store), True, store


def _expected(world: World, action: str, bulk: bool, gone: bool = False) -> Effects | None:
    domain = world.domain
    if bulk:
        return domain.bulk(world.process, action, world.now, gone)
    move = {
        "cancel": domain.cancel,
        "suspend": domain.suspend,
        "resume": domain.resume,
        "resubmit": domain.resubmit,
    }[action]
    return move(world.process, world.now, gone)


@pytest.mark.parametrize("setup", SHIPPED, ids=[s.name for s in SHIPPED])
def test_the_operator_and_bulk_use_cases_do_what_the_driver_does(setup: Setup) -> None:
    async def run() -> int:
        compared = 0
        for world in _sampled(setup):
            for action in _SINGLE:
                for bulk in (False, True):
                    real, acted, store = await _operated(world, action, bulk)
                    expected = _expected(world, action, bulk)
                    what = f"{'bulk ' if bulk else ''}{action}"
                    _same(world, what, real, expected)
                    _wrote(world, what, store, expected)
                    assert acted == (expected is not None) or not bulk, what
                    compared += 1
        return compared

    assert asyncio.run(run()) > 50


@pytest.mark.parametrize("setup", SHIPPED, ids=[s.name for s in SHIPPED])
def test_an_order_on_a_dropped_version_is_refused_and_held_as_the_driver_says(
    setup: Setup,
) -> None:
    dropped = without(setup.workflow.name)  # the shipped catalogue has one version of each

    async def run() -> int:
        compared = 0
        for world in _sampled(setup):
            if driver.finished(world.process) is not None:
                continue
            gone = dataclasses.replace(world, gone=True)
            for action in _SINGLE:
                for bulk in (False, True):
                    real, acted, _ = await _operated(gone, action, bulk, dropped)
                    # A single suspend of a Suspended order changes nothing, refused or not.
                    what = f"{'bulk ' if bulk else ''}{action}: {driver.describe(world.process)}"
                    assert not (acted and bulk), what
                    assert _expected(gone, action, bulk, gone=True) is None
                    _same(gone, action, real, None)
            store, deps, _ = await _store(gone, dropped)
            await scheduler.on_nudge(deps, driver.ORDER.order_id)
            _same(gone, "nudge", await _stored(store), None)
            for name in gone.domain.events:
                with pytest.raises(InvalidTransition):
                    await send_event(deps, driver.ORDER.order_id, name, "e-9", None)
            if world.domain.due(world.process, world.now):
                entries = await store.due(driver.at(world.now), 10)
                report = supervisor.SweepReport()
                await supervisor._check(deps, entries[0], report, lambda _: False)
                expected = world.domain.sweep(world.process, world.now, None, gone=True)
                _same(gone, "sweep", await _stored(store), expected)
            compared += 1
        return compared

    assert asyncio.run(run()) > 10


def _ledgers(world: World) -> Iterator[Provider]:
    """The model's ledger, and each variant with one step's effect added (applied) or
    taken away (never applied) at one of its providers: the disagreements
    reconciliation is for. Then, for a step with an undo, its undo found nothing and the
    do applied after it, with the heal key (`{orderId}:{undo}:heal`) never seen, undone,
    or itself finding nothing: the three answers a later run hears for its heal."""
    yield world.provider
    for step in world.domain.steps:
        if step.do_key is None:
            continue
        for space in dict.fromkeys(world.space(a) for a in step.agents):
            entry = world.provider.get(space, step.do_key)
            if entry.status is KeyStatus.APPLIED:
                yield world.provider.put(dataclasses.replace(entry, status=KeyStatus.NOT_APPLIED))
            else:
                yield world.provider.put(dataclasses.replace(entry, status=KeyStatus.APPLIED))
            if step.undo_key is None:
                continue
            applied = KeyStatus.APPLIED
            late = world.provider.put(dataclasses.replace(entry, status=applied)).put(
                Entry(space, step.undo_key, applied, undoes=step.do_key, undone=False)
            )
            yield late
            heal = heal_key(step.undo_key)
            for undone in (True, False):
                yield late.put(Entry(space, heal, applied, undoes=step.do_key, undone=undone))


async def _reconciled(world: World) -> None:
    """The real Reconciler's check of the order at rest sends what the driver's does."""
    store, _, clock = await _store(world)
    process = world.process
    reconciler = Reconciler(
        InMemoryReconcileStore(store),
        cast(OutcomeQueries, Truth(world)),
        InMemoryBus(),
        clock,
        "explorer",
        world.domain.policy,
        catalogue=running(world.domain.of(process)),
    )
    tally = _Tally()
    await reconciler._check(process, tally)
    real = {u.message_id for heal in tally.heals for u in reconciliation.heals(*heal, clock.now())}
    real |= {m.alert(c, clock.now()).message_id for m, c in tally.mismatches}

    expected = world.domain.reconciled(process, world.now, lambda a, k: _truth(world, a, k))
    assert real == {m.message_id for m in expected}, (
        f"{driver.describe(process)} with {world.provider.describe()}"
    )


@pytest.mark.parametrize("setup", SHIPPED, ids=[s.name for s in SHIPPED])
def test_reconciliation_sends_what_the_driver_says(setup: Setup) -> None:
    async def run() -> tuple[int, int]:
        compared = held = 0
        seen: set[Hashable] = set()
        for world in situations(setup):
            if not driver.at_rest(world.process) or world.process_key in seen:
                continue
            seen.add(world.process_key)
            held += driver.finished(world.process) is None
            for ledger in _ledgers(world):
                await _reconciled(dataclasses.replace(world, provider=ledger))
                compared += 1
        return compared, held

    compared, held = asyncio.run(run())
    assert compared > 5
    assert held, "no order held in Error or Suspended was compared"


@pytest.mark.parametrize("setup", SHIPPED, ids=[s.name for s in SHIPPED])
def test_the_customer_line_is_what_the_driver_says(setup: Setup) -> None:
    """The intake admits an order behind its customer's running one to wait in line, as
    the driver's start does; the Supervisor leaves an order in line that the ledger still
    holds there, and releases and nudges one the ledger promoted."""
    model = OrderWorld(BOUNDS["fair"], setup)

    async def run() -> None:
        first = model.initial()
        store = InMemoryStateStore()
        clock = FakeClock(driver.at(0))
        ledger = InMemoryCustomerLedger()
        customers = Customers(ledger, driver.FAIR_SHARE)
        deps = ProcessDeps(
            store,
            InMemoryBus(),
            clock,
            setup.policy,
            driver.SCHEDULER,
            customers=customers,
            catalogue=CATALOGUE,
        )
        other = dataclasses.replace(driver.ORDER, order_id="o-0", fingerprint="other")
        await submit_order(deps, other, workflow=setup.workflow)
        submitted = await submit_order(deps, driver.ORDER, workflow=setup.workflow)
        assert submitted.process is not None
        assert driver.key(submitted.process) == first.process_key
        due = setup.policy.pending_timeout.total_seconds() + line.HOLD.total_seconds()
        clock.advance(due)
        now = driver.tick(clock.now())
        waiting = dataclasses.replace(first, now=now)
        for promoted in (False, True):
            if promoted:
                await ledger.leave(driver.ORDER.customer_id, "o-0", driver.FAIR_SHARE, clock.now())
            process = await _stored(store)
            await store.watch(process.order_id, clock.now(), replace=True)
            (entry,) = [e for e in await store.due(clock.now(), 10) if e.order_id == "o-1"]
            await supervisor._check(deps, entry, supervisor.SweepReport(), lambda _: False)
            expected = waiting.domain.sweep(process, now, None, in_line=not promoted)
            _same(
                dataclasses.replace(waiting, process=process),
                "sweep",
                await _stored(store),
                expected,
            )

    asyncio.run(run())


@pytest.mark.parametrize("setup", SHIPPED, ids=[s.name for s in SHIPPED])
@pytest.mark.parametrize("notify", list(Notify), ids=[n.value for n in Notify])
def test_the_intake_stores_and_sends_what_the_driver_starts(setup: Setup, notify: Notify) -> None:
    """The intake's choice (issue #39) over the in-memory store: within the burst the
    order is stored claimed as the driver's `start_claimed` has it, watched at the
    driver's first look, its outbox sent as the world hears it; past the burst
    (`IntakeLoad` full) stored Pending and nudged as `start_nudged`. The intake dying
    before its sends: the real Supervisor's check at the first look sends what the
    world's `_looked` sends, and nothing else changes."""
    model = OrderWorld(BOUNDS["intake"], setup)
    domain = model.domain
    order = dataclasses.replace(driver.ORDER, notify=notify)
    choices = dict(model._intake(model.initial()))

    async def submitted(bus: InMemoryBus, burst: int) -> tuple[InMemoryStateStore, ProcessDeps]:
        store = InMemoryStateStore()
        routes = cast(RoutingSource, Routes(domain.routing(frozenset())))
        deps = ProcessDeps(
            store,
            bus,
            FakeClock(driver.at(0)),
            domain.policy,
            driver.INTAKE,
            routes,
            catalogue=CATALOGUE,
            intake_load=IntakeLoad(burst),
        )
        await submit_order(deps, order, workflow=setup.workflow)
        return store, deps

    def told(bus: InMemoryBus) -> list[str]:
        return [str(m.body["status"]) for m in bus.sent if m.destination.to is To.CLIENT]

    async def run() -> None:
        for label, burst in (("claimed", BURST), ("nudged", 0)):
            world = choices[f"intake ({notify}): {label}"]
            bus = InMemoryBus()
            store, _ = await submitted(bus, burst)
            real = await _stored(store)
            _same(world, f"intake, {label}", real, Effects(world.process, (), (), (), label))
            assert real.order.notify is notify
            assert told(bus) == list(world.heard)
            sent = [domain._request(m) for m in bus.sent if m.destination.to is To.AGENT]
            assert sent == list(world.just_sent)
            look = world.first_look
            watched = store.watched()[order.order_id]
            assert (look is None) == (label == "nudged")
            assert look is None or watched == driver.at(look)

        died = choices[f"intake ({notify}): claimed, died before its sends"]
        assert died.first_look is not None
        down = InMemoryBus()
        down.fail_next = 1
        store, deps = await submitted(down, BURST)
        assert down.sent == []
        deps = dataclasses.replace(deps, bus=(after := InMemoryBus()))
        deps.clock.advance(died.first_look)  # type: ignore[attr-defined]
        (entry,) = await store.due(driver.at(died.first_look), 10)
        await supervisor._check(deps, entry, supervisor.SweepReport(), lambda _: False)
        looked = model._looked(dataclasses.replace(died, now=died.first_look))
        assert (await _stored(store)).state.version == 1
        assert told(after) == list(looked.heard)
        resent = [domain._request(m) for m in after.sent if m.destination.to is To.AGENT]
        assert resent == list(looked.just_sent) and resent

    asyncio.run(run())
