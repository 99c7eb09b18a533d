"""The Supervisor's own dispatches follow the routing: when a wait's deadline passes it
fires the timer or takes the event kept for it, and dispatches the next step itself
(machine/recovery.py `_wait_passed`). Found by the explorer (docs/explorer.md, the
`drained` invariant): it sent the next step to its primary agent even when that agent
was drained, where the Scheduler's own dispatch would route around it or wait."""

from __future__ import annotations

import dataclasses
from dataclasses import replace
from datetime import timedelta

from shared.adapters.memory.store import InMemoryHealthStore
from shared.contract import Queue, agent_queue
from shared.domain.health import AgentDrain
from shared.domain.model import ProcessState
from shared.usecases.flow import scheduler
from shared.usecases.flow.deps import ProcessDeps
from shared.usecases.flow.routing import RoutingSource
from shared.usecases.flow.submission import submit_order
from shared.usecases.flow.supervisor import sweep
from shared.usecases.operations.events import send_event
from tests.builders import World, a_reply, an_order
from tests.workflows import REVIEWED_ORDER, SCHEDULED_DELIVERY

APPROVED = {"approved": True, "by": "ana"}


async def draining(world: World, agent: str) -> ProcessDeps:
    health = InMemoryHealthStore()
    await health.set_drain(AgentDrain(agent, True, "maintenance", world.clock.now()))
    return replace(world.deps(), routing=RoutingSource(health, world.clock))


async def test_an_event_the_supervisor_takes_sends_the_charge_around_a_drained_payment() -> None:
    world = World()
    deps = world.deps()
    await submit_order(deps, an_order("o-1", clock=world.clock), workflow=REVIEWED_ORDER)
    await send_event(deps, "o-1", "review", "early", APPROVED)
    await scheduler.on_nudge(deps, "o-1")
    (reserve,) = world.bus.take(agent_queue("inventory"))
    await scheduler.on_reply(deps, a_reply(reserve))
    world.bus.take(Queue.SCHEDULER)  # the event nudge, lost
    drained = await draining(world, "payment")
    world.clock.advance(61)

    await sweep(drained)

    assert world.bus.take(agent_queue("payment")) == []
    (charge,) = world.bus.take(agent_queue("payment-secondary"))
    assert charge.body["step"] == "charge-payment"


async def test_a_timer_the_supervisor_fires_waits_for_a_drained_shipping() -> None:
    world = World()
    deps = world.deps()
    order = dataclasses.replace(
        an_order("o-1", clock=world.clock), not_before=world.clock.now() + timedelta(hours=1)
    )
    await submit_order(deps, order, workflow=SCHEDULED_DELIVERY)
    world.bus.take(Queue.SCHEDULER)
    await scheduler.on_nudge(deps, "o-1")
    for queue in ("inventory", "payment"):
        (request,) = world.bus.take(agent_queue(queue))
        await scheduler.on_reply(deps, a_reply(request))
    world.bus.take(Queue.SCHEDULER)  # the timer's wake-up, lost
    drained = await draining(world, "shipping")
    world.clock.advance(3601)

    await sweep(drained)

    assert world.bus.take(agent_queue("shipping")) == []
    process = await world.store.load("o-1")
    assert process is not None
    assert process.state.process_state is ProcessState.PENDING
    assert process.state.failure_count == 0
