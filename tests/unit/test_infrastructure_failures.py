"""The system's own failures (bus or store down, a lost nudge, an unsent dispatch) never
count against an order; the Supervisor's sweep is bounded and backs off in an outage."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from shared.adapters.clock import FakeClock
from shared.adapters.memory.store import InMemoryBus, InMemoryHealthStore, InMemoryStateStore
from shared.contract import Queue, agent_queue
from shared.domain.model import OrderProcess, Outgoing, ProcessState, StepStatus
from shared.ports import BusUnavailable, StoreUnavailable, WatchEntry
from shared.usecases.flow import scheduler
from shared.usecases.flow.deps import ProcessDeps
from shared.usecases.flow.outage import Outage, WitnessedBus
from shared.usecases.flow.scheduler import Handled
from shared.usecases.flow.submission import submit_order
from shared.usecases.flow.supervisor import supervise, sweep, sweep_budget
from tests.builders import World, a_policy, a_reply, an_order

AGENT_QUEUES = (agent_queue("inventory"), agent_queue("payment"), agent_queue("shipping"))
DOWN = 1_000_000
"""fail_next for a bus that stays down until it is set back to 0."""


class SlowStore(InMemoryStateStore):
    """Each load takes `seconds` of the fake clock, like a store that answers slowly."""

    def __init__(self, clock: FakeClock, seconds: float) -> None:
        super().__init__()
        self.clock, self.seconds = clock, seconds

    async def load(self, order_id: str) -> OrderProcess | None:
        self.clock.advance(self.seconds)
        return await super().load(order_id)


class FlakyStore(InMemoryStateStore):
    """A store that can be taken down: every call raises StoreUnavailable meanwhile."""

    down = False

    def _check(self) -> None:
        if self.down:
            raise StoreUnavailable("store down")

    async def due(self, now: datetime, limit: int) -> tuple[WatchEntry, ...]:
        self._check()
        return await super().due(now, limit)

    async def load(self, order_id: str) -> OrderProcess | None:
        self._check()
        return await super().load(order_id)


class HangingBus(InMemoryBus):
    """A bus whose sends hang, as on a connection the broker dropped without a word."""

    hanging = False

    async def send(self, messages: Sequence[Outgoing]) -> None:
        if self.hanging:
            await asyncio.sleep(3600)
        await super().send(messages)


def agent_requests(world: World) -> list[Outgoing]:
    return [m for q in AGENT_QUEUES for m in world.bus.take(q)]


async def stored(world: World, order_id: str) -> OrderProcess:
    process = await world.store.load(order_id)
    assert process is not None
    return process


async def test_pending_order_is_nudged_again_without_counting_however_long_it_waits() -> None:
    world = World(policy=a_policy(max_failure_count=2))
    world.bus.fail_next = DOWN
    pending = world.deps(claim_at_intake=False)  # as past the intake's burst
    await submit_order(pending, an_order("o-1"))  # stored; its nudge not sent
    for _ in range(5):  # many pending timeouts: more than MaxFailureCount of them
        world.clock.advance(61)
        await sweep(world.deps())
    process = await stored(world, "o-1")
    assert process.state.process_state is ProcessState.PENDING
    assert process.state.failure_count == 0
    world.bus.fail_next = 0
    world.clock.advance(61)
    report = await sweep(world.deps())
    assert report.requeued == 1 and report.errored == 0
    (nudge,) = world.bus.take(Queue.SCHEDULER)
    assert nudge.body == {"orderId": "o-1", "reason": "renudged"}
    assert await scheduler.on_nudge(world.deps(), "o-1") is Handled.APPLIED
    assert (await stored(world, "o-1")).state.failure_count == 0


async def test_only_a_running_step_past_its_complete_by_counts() -> None:
    world = World()
    await submit_order(world.deps(), an_order("o-1"))
    world.bus.take(Queue.SCHEDULER)
    agent_requests(world)  # the agent has the request and never answers
    world.clock.advance(31)
    await sweep(world.deps())
    process = await stored(world, "o-1")
    assert process.state.failure_count == 1
    assert process.state.last_error is not None
    assert process.state.last_error.startswith("reserve-inventory not completed by")
    world.bus.take(Queue.SCHEDULER)  # the requeue nudge is lost
    world.clock.advance(200)
    await sweep(world.deps())
    process = await stored(world, "o-1")
    assert process.state.process_state is ProcessState.PENDING
    assert process.state.failure_count == 1  # the lost nudge did not count


async def test_a_dispatch_whose_send_failed_does_not_count() -> None:
    world = World(policy=a_policy(max_failure_count=1))
    await submit_order(world.deps(claim_at_intake=False), an_order("o-1"))  # the Scheduler's
    world.bus.take(Queue.SCHEDULER)
    world.bus.fail_next = 1
    with pytest.raises(BusUnavailable):
        await scheduler.on_nudge(world.deps(), "o-1", message_id="m-1")
    assert agent_requests(world) == []
    process = await stored(world, "o-1")
    assert process.state.process_state is ProcessState.PENDING
    assert process.steps[0].status is StepStatus.NOT_STARTED and process.steps[0].attempts == 1
    world.clock.advance(31)  # past the complete-by the unsent request had
    await sweep(world.deps())
    process = await stored(world, "o-1")
    assert process.state.failure_count == 0
    assert process.state.process_state is ProcessState.PENDING
    # the host redelivers the nudge: the step goes out again, same key, next attempt
    assert await scheduler.on_nudge(world.deps(), "o-1", message_id="m-1") is Handled.APPLIED
    (request,) = agent_requests(world)
    assert (request.body["step"], request.body["attempt"]) == ("reserve-inventory", 2)
    await scheduler.on_reply(world.deps(), a_reply(request))
    assert (await stored(world, "o-1")).state.failure_count == 0


async def test_a_next_step_whose_send_failed_goes_out_again_uncounted() -> None:
    world = World(policy=a_policy(max_failure_count=1))
    await submit_order(world.deps(), an_order("o-1"))
    world.bus.take(Queue.SCHEDULER)
    (inventory,) = agent_requests(world)
    world.bus.fail_next = 1
    with pytest.raises(BusUnavailable):
        await scheduler.on_reply(world.deps(), a_reply(inventory), message_id="r-1")
    world.clock.advance(61)
    await sweep(world.deps())
    process = await stored(world, "o-1")
    assert process.state.failure_count == 0
    assert process.state.current_step == 1
    assert process.steps[0].status is StepStatus.COMPLETED
    await scheduler.on_nudge(world.deps(), "o-1")
    (payment,) = agent_requests(world)
    assert payment.body["step"] == "charge-payment"


async def test_sweep_stops_starting_checks_at_its_budget_and_leaves_the_rest_due() -> None:
    clock = FakeClock()
    world = World(clock=clock, store=SlowStore(clock, 1.0))
    for i in range(6):  # Pending, as past the intake's burst
        await submit_order(world.deps(claim_at_intake=False), an_order(f"o-{i}"))
    clock.advance(61)
    report = await sweep(world.deps(), concurrency=1, budget=timedelta(seconds=2))
    assert report.requeued == 2 and report.deferred == 4
    report = await sweep(world.deps(), concurrency=1, budget=timedelta(seconds=60))
    assert report.requeued == 4 and report.deferred == 0
    orders = [await stored(world, f"o-{i}") for i in range(6)]
    assert all(p.state.failure_count == 0 for p in orders)


async def test_sweep_during_a_bus_outage_stops_early_backs_off_logs_once_and_catches_up(
    caplog: pytest.LogCaptureFixture,
) -> None:
    world = World()
    health = InMemoryHealthStore()
    outage = Outage(base=timedelta(seconds=2), cap=timedelta(seconds=8))
    for i in range(20):
        await submit_order(world.deps(), an_order(f"o-{i}"))
    world.bus.fail_next = DOWN
    caplog.set_level(logging.INFO, logger="orders.supervisor")
    ran = 0
    for _ in range(60):  # five minutes of 5 s ticks
        world.clock.advance(5)
        report = await supervise(world.deps(), health, outage=outage)
        ran += report.due > 0
    assert ran <= 35  # backed off: not every tick
    down = [r for r in caplog.records if "unreachable" in r.getMessage()]
    assert len(down) == 1 and "message bus" in down[0].getMessage()
    world.bus.fail_next = 0
    world.clock.advance(10)
    report = await supervise(world.deps(), health, outage=outage)
    assert report.outage is None
    assert any("reachable again" in r.getMessage() for r in caplog.records)
    world.clock.advance(61)
    await supervise(world.deps(), health, outage=outage)
    orders = [await stored(world, f"o-{i}") for i in range(20)]
    assert all(p.state.failure_count == 0 for p in orders)
    assert all(p.state.process_state is ProcessState.PENDING for p in orders)
    nudged = {m.body["orderId"] for m in world.bus.on(Queue.SCHEDULER)}
    assert nudged == {f"o-{i}" for i in range(20)}


async def test_sweep_with_the_store_down_backs_off_and_logs_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = FlakyStore()
    world = World(store=store)
    outage = Outage()
    await submit_order(world.deps(), an_order("o-1"))
    store.down = True
    caplog.set_level(logging.INFO, logger="orders.supervisor")
    for _ in range(10):
        world.clock.advance(5)
        report = await supervise(world.deps(), InMemoryHealthStore(), outage=outage)
        assert report.recovered == 0
    down = [r for r in caplog.records if "unreachable" in r.getMessage()]
    assert len(down) == 1 and "state store" in down[0].getMessage()
    store.down = False
    world.clock.advance(30)
    report = await supervise(world.deps(), InMemoryHealthStore(), outage=outage)
    assert report.requeued == 1
    assert (await stored(world, "o-1")).state.failure_count == 0


async def test_a_hanging_bus_stops_the_sweep_after_a_few_check_timeouts() -> None:
    bus = HangingBus()
    world = World(bus=bus)
    for i in range(40):
        await submit_order(world.deps(), an_order(f"o-{i}"))
    bus.hanging = True
    world.clock.advance(61)
    started = asyncio.get_running_loop().time()
    report = await sweep(world.deps(), concurrency=4, check_timeout=0.05)
    assert asyncio.get_running_loop().time() - started < 1.0
    assert isinstance(report.outage, TimeoutError)
    assert report.failed < 10 and report.deferred > 30
    orders = [await stored(world, f"o-{i}") for i in range(40)]
    assert all(p.state.failure_count == 0 for p in orders)


async def test_a_deadline_that_passed_in_an_outage_is_redispatched_uncounted() -> None:
    world = World(policy=a_policy(max_failure_count=1))
    health, outage = InMemoryHealthStore(), Outage()
    await submit_order(world.deps(), an_order("o-1"))
    world.bus.take(Queue.SCHEDULER)
    agent_requests(world)  # in the broker when it went down: the agent never gets it
    world.bus.fail_next = DOWN
    for _ in range(10):
        world.clock.advance(5)
        await supervise(world.deps(), health, outage=outage)
        assert (await stored(world, "o-1")).state.failure_count == 0
    world.bus.fail_next = 0
    world.clock.advance(61)
    report = await supervise(world.deps(), health, outage=outage)
    assert report.requeued == 1 and report.errored == 0
    events = [h.event for h in await world.store.history("o-1")]
    # Saved before it sent, a count that met the outage is taken back, never kept.
    taken_back = events.index("expired-in-outage")
    assert "timed-out" not in events[taken_back:]
    assert not world.bus.on(Queue.OPERATOR_ALERTS)
    process = await stored(world, "o-1")
    assert process.state.process_state is ProcessState.PENDING
    assert process.state.failure_count == 0
    assert process.steps[0].status is StepStatus.NOT_STARTED
    world.clock.advance(70)  # the outage's backlog has drained
    assert await scheduler.on_nudge(world.deps(), "o-1") is Handled.APPLIED
    (request,) = agent_requests(world)
    assert (request.body["step"], request.body["attempt"]) == ("reserve-inventory", 2)
    world.clock.advance(31)  # well after the outage: this timeout is the step's own
    await supervise(world.deps(), health, outage=outage)
    assert (await stored(world, "o-1")).state.process_state is ProcessState.ERROR


async def dispatched_then_glimpsed(world: World, deps: ProcessDeps, down_after: float) -> None:
    """o-1 dispatched, its request lost with the broker; `down_after` seconds later the
    broker is down for one handler's send (submitting o-2), then back."""
    await submit_order(deps, an_order("o-1"))
    world.bus.take(Queue.SCHEDULER)
    agent_requests(world)  # in the broker when it went down: the agent never gets it
    world.clock.advance(down_after)
    world.bus.fail_next = DOWN
    with contextlib.suppress(BusUnavailable):
        await submit_order(deps, an_order("o-2"))
    world.bus.fail_next = 0


async def counted_nothing(world: World) -> bool:
    """o-1 was redispatched uncounted; False: its deadline was counted (held in Error)."""
    o1 = await stored(world, "o-1")
    if o1.state.process_state is ProcessState.ERROR:
        return False
    assert o1.state.failure_count == 0
    assert "expired-in-outage" in [h.event for h in await world.store.history("o-1")]
    return True


@pytest.mark.parametrize("witnessed", [True, False])
async def test_a_broker_outage_the_sweeps_never_touched_counts_nothing(witnessed: bool) -> None:
    """The broker goes down and comes back between two sweeps that send nothing; only a
    handler's send saw it. A Supervisor told of that send (the instance's WitnessedBus)
    counts nothing; one that is not counts the deadline that passed in it."""
    world = World(policy=a_policy(max_failure_count=1))
    health, outage = InMemoryHealthStore(), Outage()
    bus = WitnessedBus(world.bus, outage, world.clock) if witnessed else world.bus
    deps = replace(world.deps(), bus=bus)
    await dispatched_then_glimpsed(world, deps, down_after=2)
    world.clock.advance(40)  # o-1's complete-by passed while the broker was down
    await supervise(deps, health, outage=outage)
    assert await counted_nothing(world) is witnessed


@pytest.mark.parametrize("shared", [True, False])
async def test_an_instance_started_after_an_outage_counts_nothing_another_saw(
    shared: bool,
) -> None:
    """The chaos run's case: instance A saw the broker down (a handler's send failed) and
    was killed; B, started afterwards with an empty Outage, takes the check of a deadline
    that passed in A's outage. Told through the health store what A saw, B counts
    nothing; on its own it counts the deadline and holds the order in Error."""
    world = World(policy=a_policy(max_failure_count=1))
    health, a = InMemoryHealthStore(), Outage()
    deps_a = replace(world.deps("a"), bus=WitnessedBus(world.bus, a, world.clock))
    await dispatched_then_glimpsed(world, deps_a, down_after=10)
    world.clock.advance(6)
    await supervise(deps_a, health if shared else InMemoryHealthStore(), outage=a)
    world.clock.advance(29)  # A was killed; o-1's complete-by (30 s) passed meanwhile
    await supervise(world.deps("b"), health, outage=Outage())
    assert await counted_nothing(world) is shared


async def test_a_worker_restarted_under_its_instance_name_keeps_what_it_shared() -> None:
    """In Azure a worker process restarts under the same WEBSITE_INSTANCE_ID: the
    successor's empty Outage learns what its predecessor shared under that name."""
    world = World(policy=a_policy(max_failure_count=1))
    health, before = InMemoryHealthStore(), Outage()
    deps = replace(world.deps("i-1"), bus=WitnessedBus(world.bus, before, world.clock))
    await dispatched_then_glimpsed(world, deps, down_after=10)
    world.clock.advance(6)
    await supervise(deps, health, outage=before)
    world.clock.advance(29)
    await supervise(world.deps("i-1"), health, outage=Outage())
    assert await counted_nothing(world)


def test_glimpses_close_together_are_one_outage_and_far_apart_are_two() -> None:
    outage = Outage()
    start = datetime(2026, 1, 1, tzinfo=UTC)
    outage.glimpsed(start)
    outage.glimpsed(start + timedelta(seconds=20))
    outage.glimpsed(start + timedelta(seconds=200))
    assert outage.past == [
        (start, start + timedelta(seconds=20)),
        (start + timedelta(seconds=200), start + timedelta(seconds=200)),
    ]
    none = timedelta(0)
    assert outage.covers(start + timedelta(seconds=10), none, none)
    assert not outage.covers(start + timedelta(seconds=100), none, none)


def test_sweep_budget_is_half_the_schedule_period() -> None:
    assert sweep_budget("*/5 * * * * *") == timedelta(seconds=2.5)
    assert sweep_budget("*/30 * * * * *") == timedelta(seconds=15)
    assert sweep_budget("0 */1 * * * *") == timedelta(seconds=15)
    assert sweep_budget(None) == timedelta(seconds=15)
