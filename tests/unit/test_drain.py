"""Draining an agent: no new dispatch to it, work moves to an alternative or waits,
uncounted, until it is undrained; undos still go to the agent that did the step."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from shared.adapters.memory.store import InMemoryHealthStore
from shared.contract import Queue, agent_queue
from shared.domain.health import AgentDrain, AgentRecords
from shared.domain.model import NotificationStatus, Outcome, ProcessState, StepStatus
from shared.domain.routing import Routing, routing_from
from shared.usecases.flow import scheduler
from shared.usecases.flow.deps import ProcessDeps
from shared.usecases.flow.routing import RoutingSource
from shared.usecases.flow.submission import submit_order
from shared.usecases.flow.supervisor import sweep
from tests.builders import World, a_reply, an_order

PAYMENT = ("payment", "payment-secondary")
SHIPPING = ("shipping",)


def drained(*agents: str) -> Routing:
    return Routing(drained=frozenset(agents))


def test_a_drained_primary_sends_the_step_to_its_alternative() -> None:
    chosen, why = drained("payment").choose(PAYMENT)
    assert chosen == "payment-secondary" and why == "payment: drained"
    assert drained("payment-secondary").choose(PAYMENT) == ("payment", "")
    assert not drained("payment").all_drained(PAYMENT)
    assert drained("payment", "payment-secondary").all_drained(PAYMENT)
    assert drained("shipping").all_drained(SHIPPING)
    assert not Routing().all_drained(SHIPPING)


def test_a_drain_is_not_avoided_in_favour_of_an_agent_that_timed_out() -> None:
    chosen, _ = drained("payment-secondary").choose(PAYMENT, avoid="payment")
    assert chosen == "payment"


def test_only_flags_set_to_drained_count() -> None:
    at = World().clock.now()
    records = AgentRecords(
        (),
        (
            AgentDrain("payment", drained=True, reason="maintenance", since=at),
            AgentDrain("shipping", drained=False, reason=None, since=at),
        ),
    )
    assert routing_from(records, at).drained == frozenset({"payment"})


# --- through the use cases -------------------------------------------------------------


def drain_world(*agents: str) -> tuple[World, ProcessDeps, InMemoryHealthStore]:
    world = World()
    store = InMemoryHealthStore()
    for agent in agents:
        store._drains[agent] = AgentDrain(agent, True, "maintenance", world.clock.now())
    deps = replace(world.deps(), routing=RoutingSource(store, world.clock))
    return world, deps, store


async def undrain(world: World, store: InMemoryHealthStore, agent: str) -> None:
    await store.set_drain(AgentDrain(agent, False, None, world.clock.now()))
    world.clock.advance(3)  # past the routing refresh


async def complete(world: World, deps: ProcessDeps, queue: str) -> None:
    (request,) = world.bus.take(queue)
    await scheduler.on_reply(deps, a_reply(request))


async def test_draining_payment_moves_new_charges_to_the_secondary() -> None:
    world, deps, _ = drain_world("payment")
    await submit_order(deps, an_order("o-1", clock=world.clock))
    await complete(world, deps, agent_queue("inventory"))
    assert world.bus.on(agent_queue("payment")) == []
    (charge,) = world.bus.on(agent_queue("payment-secondary"))
    assert charge.body["step"] == "charge-payment"


async def test_a_step_whose_every_agent_is_drained_waits_uncounted_then_runs() -> None:
    world, deps, store = drain_world("shipping")
    await submit_order(deps, an_order("o-1", clock=world.clock))
    world.bus.take(Queue.SCHEDULER)
    await complete(world, deps, agent_queue("inventory"))
    await complete(world, deps, agent_queue("payment"))
    assert world.bus.on(agent_queue("shipping")) == []
    # Several pending timeouts pass; each scheduled look finds shipping still drained.
    for _ in range(20):
        (nudge,) = world.bus.take(Queue.SCHEDULER)
        assert nudge.deliver_at is not None and nudge.deliver_at > world.clock.now()
        world.clock.advance((nudge.deliver_at - world.clock.now()).total_seconds())
        await sweep(deps)
        await scheduler.on_nudge(deps, "o-1")
    process = await world.store.load("o-1")
    assert process is not None
    assert process.state.process_state is ProcessState.PENDING
    assert process.state.failure_count == 0
    assert process.steps[2].status is StepStatus.NOT_STARTED and process.steps[2].attempts == 0
    assert world.bus.on(agent_queue("shipping")) == []
    waits = [h for h in await world.store.history("o-1") if h.event == "waiting"]
    assert len(waits) == 1  # noted once, not on every look
    assert waits[0].detail == "create-shipment: its agents are drained; looking again every 10 s"

    await undrain(world, store, "shipping")
    (nudge,) = world.bus.take(Queue.SCHEDULER)
    assert nudge.deliver_at is not None
    world.clock.advance(max((nudge.deliver_at - world.clock.now()).total_seconds(), 0))
    await scheduler.on_nudge(deps, "o-1")
    await complete(world, deps, agent_queue("shipping"))
    process = await world.store.load("o-1")
    assert process is not None and process.state.process_state is ProcessState.PROCESSED
    assert process.state.failure_count == 0


async def test_a_new_order_waits_unclaimed_and_is_told_processing_once_it_starts() -> None:
    world, deps, store = drain_world("inventory")
    await submit_order(deps, an_order("o-1", clock=world.clock))
    await scheduler.on_nudge(deps, "o-1")
    process = await world.store.load("o-1")
    assert process is not None
    assert (process.state.process_state, process.state.attempt) == (ProcessState.PENDING, 0)
    assert process.state.locked_by is None
    assert world.bus.on(agent_queue("inventory")) == []
    await undrain(world, store, "inventory")
    world.bus.take(Queue.ORDER_STATUS)
    await scheduler.on_nudge(deps, "o-1")
    assert len(world.bus.on(agent_queue("inventory"))) == 1
    statuses = [m.body["status"] for m in world.bus.on(Queue.ORDER_STATUS)]
    assert statuses == [NotificationStatus.PROCESSING.value]


async def test_a_drained_agent_still_undoes_the_step_it_did() -> None:
    world, deps, store = drain_world()
    await submit_order(deps, an_order("o-1", clock=world.clock))
    await complete(world, deps, agent_queue("inventory"))
    (charge,) = world.bus.take(agent_queue("payment"))
    await scheduler.on_reply(deps, a_reply(charge))
    await store.set_drain(AgentDrain("payment", True, "maintenance", world.clock.now()))
    world.clock.advance(3)
    (shipment,) = world.bus.take(agent_queue("shipping"))
    await scheduler.on_reply(deps, a_reply(shipment, Outcome.FAILED))
    (refund,) = world.bus.take(agent_queue("payment"))
    assert (refund.body["step"], refund.body["action"]) == ("charge-payment", "compensate")
    assert world.bus.on(agent_queue("payment-secondary")) == []


async def test_a_timed_out_step_pinned_to_a_drained_agent_waits_for_it() -> None:
    """The retry must stay with the agent that has the key (no second provider)."""
    world, deps, store = drain_world()
    await submit_order(deps, an_order("o-1", clock=world.clock))
    await complete(world, deps, agent_queue("inventory"))
    world.bus.take(agent_queue("payment"))  # never answered
    await store.set_drain(AgentDrain("payment", True, "maintenance", world.clock.now()))
    world.clock.advance(31)
    await sweep(deps)
    world.bus.take(Queue.SCHEDULER)
    await scheduler.on_nudge(deps, "o-1")
    process = await world.store.load("o-1")
    assert process is not None and process.state.process_state is ProcessState.PENDING
    assert process.state.failure_count == 1  # the timeout counted; the wait does not
    assert world.bus.on(agent_queue("payment")) == []
    assert world.bus.on(agent_queue("payment-secondary")) == []
    assert timedelta(0) < process.state.complete_by - world.clock.now()  # type: ignore[operator]
