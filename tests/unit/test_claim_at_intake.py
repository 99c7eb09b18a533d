"""The intake stores an order already claimed (issue #39): attempt 1, its first step
Running, the request and the client's notifications in the outbox of its one insert. An
order that must wait still goes Pending with a nudge; a crash between the insert and the
sends loses nothing (in-memory adapters, fake clock)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta

import pytest

from shared.adapters.memory.customers import InMemoryCustomerLedger
from shared.adapters.memory.store import InMemoryHealthStore
from shared.adapters.queues import queue_of
from shared.contract import Queue, agent_queue
from shared.domain.fairness import CustomerPolicy
from shared.domain.health import AgentDrain
from shared.domain.model import Order, OrderProcess, ProcessState, StepStatus
from shared.ports import BusUnavailable
from shared.usecases.flow import scheduler
from shared.usecases.flow.deps import ProcessDeps
from shared.usecases.flow.intake_load import BURST_STEP_TIME, IntakeLoad
from shared.usecases.flow.routing import RoutingSource
from shared.usecases.flow.scheduler import Handled
from shared.usecases.flow.submission import submit_order
from shared.usecases.flow.supervisor import sweep
from shared.usecases.limits.customers import Customers
from tests.builders import World, a_policy, a_reply, an_order
from tests.workflows import CATALOGUE

INVENTORY = agent_queue("inventory")
AGENT_QUEUES = (INVENTORY, agent_queue("payment"), agent_queue("shipping"))


def claiming(world: World) -> ProcessDeps:
    return replace(world.deps("intake-1"), claim_at_intake=True)


async def stored(world: World, order_id: str = "o-1") -> OrderProcess:
    process = await world.store.load(order_id)
    assert process is not None
    return process


def statuses(world: World, order_id: str = "o-1") -> list[str]:
    return [
        m.body["status"] for m in world.bus.on(Queue.ORDER_STATUS) if m.body["orderId"] == order_id
    ]


async def run_to_the_end(world: World, deps: ProcessDeps) -> None:
    """Each agent answers its request with success, as the broker would deliver it."""
    for _ in range(10):
        requests = [m for q in AGENT_QUEUES for m in world.bus.take(q)]
        if not requests:
            return
        for request in requests:
            await scheduler.on_reply(deps, a_reply(request))


async def test_a_new_order_is_stored_claimed_with_its_first_request_in_the_outbox() -> None:
    world = World()
    deps = claiming(world)
    result = await submit_order(deps, an_order("o-1"))
    assert result.created and result.process_state is ProcessState.PROCESSING
    process = await stored(world)
    state = process.state
    assert (state.version, state.attempt, state.locked_by) == (1, 1, "intake-1")
    assert state.failure_count == 0 and state.current_step == 0
    first = process.steps[0]
    assert first.status is StepStatus.RUNNING and first.attempts == 1
    assert first.complete_by == world.clock.now() + world.policy.step_timeout
    assert state.complete_by == first.complete_by
    assert [queue_of(m.destination) for m in state.outbox] == [
        Queue.ORDER_STATUS,
        INVENTORY,
        Queue.ORDER_STATUS,
    ]
    assert world.bus.on(Queue.SCHEDULER) == []  # no nudge: nothing for the Scheduler to claim
    assert [m.message_id for m in world.bus.sent] == [m.message_id for m in state.outbox]
    history = await world.store.history("o-1")
    assert [h.event for h in history] == ["submitted", "claimed", "step-dispatched"]
    pending, processing = ProcessState.PENDING, ProcessState.PROCESSING
    assert [h.process_state for h in history] == [pending, processing, processing]
    # first looked at halfway to the first complete-by, for a lost outbox (below)
    assert world.store.watched()["o-1"] == world.clock.now() + world.policy.step_timeout / 2


async def test_a_claimed_order_runs_to_its_end_on_the_replies_alone() -> None:
    world = World()
    deps = claiming(world)
    await submit_order(deps, an_order("o-1"))
    await run_to_the_end(world, deps)
    assert (await stored(world)).state.process_state is ProcessState.PROCESSED
    assert statuses(world) == ["Received", "Processing", "Processed"]
    assert world.bus.on(Queue.SCHEDULER) == []
    assert "o-1" not in world.store.watched()


async def test_a_crash_between_the_insert_and_the_sends_loses_nothing() -> None:
    """The outbox is in the row: the Supervisor, halfway to the first complete-by, finds
    the order as the intake stored it and sends it all again; nothing is counted."""
    world = World()
    deps = claiming(world)
    world.bus.fail_next = 1  # the sends after the insert never happen
    await submit_order(deps, an_order("o-1"))
    assert world.bus.sent == []
    world.clock.advance(world.policy.step_timeout.total_seconds() / 2)
    report = await sweep(world.deps())
    assert report.due == 1 and report.recovered == 0
    assert statuses(world) == ["Received", "Processing"]
    (request,) = world.bus.on(INVENTORY)
    assert request.body["attempt"] == 1 and request.body["step"] == "reserve-inventory"
    await run_to_the_end(world, deps)
    process = await stored(world)
    assert process.state.process_state is ProcessState.PROCESSED
    assert process.state.failure_count == 0 and process.state.attempt == 1
    assert statuses(world) == ["Received", "Processing", "Processed"]


async def test_the_supervisors_resend_is_dropped_when_the_sends_had_gone() -> None:
    world = World()
    deps = claiming(world)
    await submit_order(deps, an_order("o-1"))
    sent = len(world.bus.sent)
    world.clock.advance(world.policy.step_timeout.total_seconds() / 2)
    await sweep(world.deps())
    assert len(world.bus.sent) == sent and world.bus.duplicates == 3
    # rescheduled to the step's complete-by: the next look is the usual one
    assert world.store.watched()["o-1"] == (await stored(world)).steps[0].complete_by


async def test_a_long_first_step_is_looked_at_within_the_pending_timeout() -> None:
    world = World(policy=a_policy(step_timeout=3600))
    await submit_order(claiming(world), an_order("o-1"))
    assert world.store.watched()["o-1"] == world.clock.now() + world.policy.pending_timeout


async def test_past_the_queues_duplicate_window_nothing_is_sent_again() -> None:
    """A resend then would reach the client twice; a lost request is left to the step's
    timeout, as after any crash."""
    world = World(policy=a_policy(step_timeout=3600))
    deps = claiming(world)
    await submit_order(deps, an_order("o-1"))
    sent = len(world.bus.sent)
    world.clock.advance(601)
    report = await sweep(world.deps())
    assert report.due == 1 and len(world.bus.sent) == sent and world.bus.duplicates == 0


async def test_a_redelivered_order_message_sends_the_claimed_outbox_again() -> None:
    world = World()
    deps = claiming(world)
    world.bus.fail_next = 1
    with pytest.raises(BusUnavailable):
        await submit_order(deps, an_order("o-1"), cause="m-1", tolerate_bus_failure=False)
    again = await submit_order(deps, an_order("o-1"), cause="m-1", tolerate_bus_failure=False)
    assert not again.created and again.process_state is ProcessState.PROCESSING
    assert statuses(world) == ["Received", "Processing"]
    assert len(world.bus.on(INVENTORY)) == 1
    assert (await stored(world)).state.version == 1


async def test_a_repeat_once_the_order_moved_on_sends_nothing() -> None:
    world = World()
    deps = claiming(world)
    await submit_order(deps, an_order("o-1"))
    (request,) = world.bus.take(INVENTORY)
    await scheduler.on_reply(deps, a_reply(request))
    sent = len(world.bus.sent)
    await submit_order(deps, an_order("o-1"))
    assert len(world.bus.sent) == sent and world.bus.duplicates == 0


async def test_an_order_whose_first_agent_is_drained_waits_pending_for_the_scheduler() -> None:
    world = World()
    health = InMemoryHealthStore()
    await health.set_drain(AgentDrain("inventory", True, "maintenance", world.clock.now()))
    deps = replace(claiming(world), routing=RoutingSource(health, world.clock))
    await submit_order(deps, an_order("o-1"))
    process = await stored(world)
    assert process.state.process_state is ProcessState.PENDING and process.state.attempt == 0
    (nudge,) = world.bus.take(Queue.SCHEDULER)
    assert nudge.body["reason"] == "submitted"
    assert world.bus.on(INVENTORY) == []
    await scheduler.on_nudge(deps, "o-1")  # the Scheduler's claim waits for the agent
    assert (await stored(world)).state.process_state is ProcessState.PENDING
    await health.set_drain(AgentDrain("inventory", False, None, world.clock.now()))
    world.clock.advance(10)
    (recheck,) = world.bus.take(Queue.SCHEDULER)
    assert await scheduler.on_nudge(deps, "o-1", recheck.message_id) is Handled.APPLIED
    assert len(world.bus.on(INVENTORY)) == 1


def customer(order_id: str, who: str) -> Order:
    return replace(an_order(order_id), customer_id=who)


async def test_an_order_behind_its_customers_fair_share_waits_in_line_unclaimed() -> None:
    world = World()
    rules = Customers(InMemoryCustomerLedger(), CustomerPolicy(fair_share=1))
    deps = replace(claiming(world), customers=rules)
    await submit_order(deps, customer("a-0", "A"))
    await submit_order(deps, customer("a-1", "A"))
    await submit_order(deps, customer("b-0", "B"))
    assert (await stored(world, "a-0")).state.process_state is ProcessState.PROCESSING
    assert (await stored(world, "b-0")).state.process_state is ProcessState.PROCESSING
    waiting = await stored(world, "a-1")
    assert waiting.state.process_state is ProcessState.PENDING and waiting.state.attempt == 0
    assert world.bus.on(Queue.SCHEDULER) == []  # a promotion nudges it, not the intake
    await run_to_the_end(world, deps)
    assert (await stored(world, "a-0")).state.process_state is ProcessState.PROCESSED
    (promotion,) = world.bus.take(Queue.SCHEDULER)
    assert promotion.body["orderId"] == "a-1"
    assert await scheduler.on_nudge(deps, "a-1", promotion.message_id) is Handled.APPLIED
    await run_to_the_end(world, deps)
    assert (await stored(world, "a-1")).state.process_state is ProcessState.PROCESSED


async def test_a_first_step_that_waits_is_begun_at_intake_with_its_wake_up() -> None:
    """A timer first waits like the Scheduler's claim would have it: its wake-up nudge is
    scheduled for its time (here a workflow whose first step is the timer)."""
    scheduled = CATALOGUE.get("scheduled-delivery")
    assert scheduled is not None
    timer_first = replace(scheduled, steps=(scheduled.steps[2], *scheduled.steps[:2]))
    world = World()
    order = replace(an_order("o-1"), not_before=world.clock.now() + timedelta(hours=1))
    await submit_order(claiming(world), order, workflow=timer_first)
    process = await stored(world)
    assert process.state.process_state is ProcessState.PROCESSING
    assert process.steps[0].status is StepStatus.RUNNING
    (wake,) = world.bus.on(Queue.SCHEDULER)
    assert wake.deliver_at == world.clock.now() + timedelta(hours=1)


async def test_past_a_burst_of_submissions_at_once_an_order_is_nudged_not_claimed() -> None:
    """In a burst its first request would wait behind the others, its clock running;
    nudged, its clock starts when the Scheduler claims it."""
    world = World(policy=a_policy(step_timeout=BURST_STEP_TIME.total_seconds()))
    deps = replace(claiming(world), intake_load=IntakeLoad(burst=2))
    await asyncio.gather(*(submit_order(deps, an_order(f"o-{i}")) for i in range(4)))
    states = [(await stored(world, f"o-{i}")).state.process_state for i in range(4)]
    assert sorted(states) == [ProcessState.PENDING] * 2 + [ProcessState.PROCESSING] * 2
    assert len(world.bus.on(Queue.SCHEDULER)) == 2
    assert deps.intake_load.storing == 0
    await submit_order(deps, an_order("o-after"))  # the burst over: claimed again
    assert (await stored(world, "o-after")).state.process_state is ProcessState.PROCESSING


@pytest.mark.parametrize(("step_seconds", "claimed"), [(3, 2), (6, 4), (9, 6), (1, 2)])
async def test_a_first_step_with_more_time_allows_a_larger_burst(
    step_seconds: float, claimed: int
) -> None:
    """What a burst's wait eats into is the step's timeout: twice the time, twice the
    burst; never less than the burst, whatever the step's time."""
    world = World(policy=a_policy(step_timeout=step_seconds))
    deps = replace(claiming(world), intake_load=IntakeLoad(burst=2))
    await asyncio.gather(*(submit_order(deps, an_order(f"o-{i}")) for i in range(8)))
    states = [(await stored(world, f"o-{i}")).state.process_state for i in range(8)]
    assert states.count(ProcessState.PROCESSING) == claimed
    assert len(world.bus.on(Queue.SCHEDULER)) == 8 - claimed
