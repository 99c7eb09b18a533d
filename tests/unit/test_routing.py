"""Health- and capacity-aware routing, and priority lanes, through the Scheduler's use cases."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

from shared.adapters.memory.store import InMemoryHealthStore, Sent
from shared.contract import Queue, agent_queue, high_priority
from shared.domain.health import AgentHealth, AgentRecords, BreakerState
from shared.domain.model import Outcome, Outgoing, Priority, ProcessState
from shared.domain.routing import STALE_AFTER, Availability, Routing, merge
from shared.domain.workflow import Catalogue
from shared.usecases.flow import scheduler
from shared.usecases.flow.deps import ProcessDeps
from shared.usecases.flow.routing import RoutingSource
from shared.usecases.flow.submission import submit_order
from shared.usecases.flow.supervisor import sweep
from tests.builders import World, a_reply, an_order
from tests.workflows import CATALOGUE, ORDER_FULFILMENT, running

PAYMENT_QUEUES = (
    agent_queue("payment"),
    agent_queue("payment-secondary"),
    high_priority(agent_queue("payment")),
    high_priority(agent_queue("payment-secondary")),
)
T0 = datetime(2026, 11, 21, 12, 0, 0)


def health(
    agent: str,
    *,
    at: datetime = T0,
    breaker: BreakerState = BreakerState.CLOSED,
    in_flight: int = 0,
    capacity: int = 16,
    instance: str = "i-1",
    open_until: datetime | None = None,
) -> AgentHealth:
    return AgentHealth(
        agent=agent,
        instance=instance,
        breaker=breaker,
        success_rate=1.0,
        latency_ms=20.0,
        in_flight=in_flight,
        capacity=capacity,
        calls=10,
        heartbeat_at=at,
        open_until=open_until,
    )


def routing(*observations: AgentHealth, now: datetime = T0) -> Routing:
    return Routing(merge(observations, now))


PAYMENT = ("payment", "payment-secondary")


def test_each_health_signal_classifies_an_agent() -> None:
    later = T0 + timedelta(seconds=3)
    views = merge(
        [
            health("a"),
            health("b", breaker=BreakerState.OPEN, open_until=T0 + timedelta(seconds=5)),
            health("c", breaker=BreakerState.OPEN, open_until=T0 + timedelta(seconds=1)),
            health("d", breaker=BreakerState.HALF_OPEN),
            health("e", in_flight=8, capacity=8),
            health("f", at=later - STALE_AFTER - timedelta(seconds=1)),
        ],
        later,
    )
    assert {name: v.availability for name, v in views.items()} == {
        "a": Availability.HEALTHY,
        "b": Availability.UNAVAILABLE,
        "c": Availability.PROBE,
        "d": Availability.PROBE,
        "e": Availability.FULL,
        "f": Availability.UNAVAILABLE,
    }
    assert "no heartbeat" in views["f"].reason


def test_the_freshest_instance_decides_the_breaker_and_capacity_adds_up() -> None:
    views = merge(
        [
            health("a", instance="i-1", breaker=BreakerState.OPEN, open_until=T0),
            health("a", instance="i-2", at=T0 + timedelta(seconds=1), in_flight=16),
            health("a", instance="i-3", at=T0 + timedelta(seconds=1), in_flight=3),
        ],
        T0 + timedelta(seconds=1),
    )
    assert views["a"].availability is Availability.HEALTHY
    assert (views["a"].in_flight, views["a"].capacity) == (19, 48)


def test_primary_first_while_healthy_secondary_when_it_is_not() -> None:
    assert routing(health("payment"), health("payment-secondary")).choose(PAYMENT)[0] == ("payment")
    open_primary = health(
        "payment", breaker=BreakerState.OPEN, open_until=T0 + timedelta(seconds=5)
    )
    chosen, why = routing(open_primary, health("payment-secondary")).choose(PAYMENT)
    assert chosen == "payment-secondary" and why == "payment: circuit open"
    full = health("payment", in_flight=16, capacity=16)
    assert routing(full, health("payment-secondary")).choose(PAYMENT)[0] == ("payment-secondary")
    stale = health("payment", at=T0 - STALE_AFTER - timedelta(seconds=1))
    assert routing(stale, health("payment-secondary")).choose(PAYMENT)[0] == ("payment-secondary")


def test_unknown_agents_rank_with_healthy_ones_and_all_bad_still_picks_one() -> None:
    assert Routing().choose(PAYMENT)[0] == "payment"
    down = BreakerState.OPEN
    until = T0 + timedelta(seconds=5)
    both_down = routing(
        health("payment", breaker=down, open_until=until),
        health("payment-secondary", breaker=down, open_until=until),
    )
    assert both_down.choose(PAYMENT)[0] == "payment"
    probing_primary = routing(
        health("payment", breaker=BreakerState.HALF_OPEN),
        health("payment-secondary", breaker=down, open_until=until),
    )
    assert probing_primary.choose(PAYMENT)[0] == "payment"


def test_a_retry_avoids_the_agent_that_timed_out_only_for_a_known_healthy_one() -> None:
    both = routing(health("payment"), health("payment-secondary"))
    chosen, why = both.choose(PAYMENT, avoid="payment")
    assert chosen == "payment-secondary" and why == "payment: its attempt timed out"
    assert Routing().choose(PAYMENT, avoid="payment")[0] == "payment"
    secondary_down = routing(
        health("payment"),
        health(
            "payment-secondary", breaker=BreakerState.OPEN, open_until=T0 + timedelta(seconds=9)
        ),
    )
    assert secondary_down.choose(PAYMENT, avoid="payment")[0] == "payment"


# --- through the use cases -------------------------------------------------------------


def payment_requests(world: World) -> list[Sent]:
    return [m for q in PAYMENT_QUEUES for m in world.bus.take(q)]


def agent_request(world: World, queue: str) -> Outgoing:
    (request,) = world.bus.take(queue)
    return request


async def reach_payment(world: World, deps: ProcessDeps, order_id: str, high: bool) -> None:
    order = an_order(order_id, clock=world.clock)
    if high:
        order = replace(order, priority=Priority.HIGH)
    await submit_order(deps, order)
    inventory = high_priority(agent_queue("inventory")) if high else agent_queue("inventory")
    await scheduler.on_reply(deps, a_reply(agent_request(world, inventory)))


NOW = World().clock.now()
"""Where every fake clock starts."""


def tripped(agent: str) -> AgentHealth:
    return health(agent, at=NOW, breaker=BreakerState.OPEN, open_until=NOW + timedelta(seconds=30))


BOTH_HEALTHY = (health("payment", at=NOW), health("payment-secondary", at=NOW))


def routed_world(
    *observations: AgentHealth, catalogue: Catalogue = CATALOGUE
) -> tuple[World, ProcessDeps, InMemoryHealthStore]:
    world = World(catalogue=catalogue)
    store = InMemoryHealthStore()
    for h in observations:
        store._health[(h.agent, h.instance)] = h
    deps = replace(world.deps(), routing=RoutingSource(store, world.clock))
    return world, deps, store


async def test_the_scheduler_sends_payment_to_the_secondary_while_the_primary_is_open() -> None:
    world, deps, _ = routed_world(tripped("payment"), health("payment-secondary", at=NOW))
    await reach_payment(world, deps, "o-1", high=False)
    (request,) = payment_requests(world)
    assert request.queue == agent_queue("payment-secondary")
    process = await world.store.load("o-1")
    assert process is not None and process.steps[1].agent == "payment-secondary"
    assert any(
        "agent-payment-secondary (instead of payment: circuit open)" in h.detail
        for h in await world.store.history("o-1")
    )


async def test_compensation_goes_to_the_agent_that_did_the_step() -> None:
    world, deps, store = routed_world(tripped("payment"), health("payment-secondary", at=NOW))
    await reach_payment(world, deps, "o-1", high=False)
    (charge,) = payment_requests(world)
    await scheduler.on_reply(deps, a_reply(charge))
    await store.publish_health(health("payment", at=NOW))  # the primary is back
    (ship,) = world.bus.take(agent_queue("shipping"))
    await scheduler.on_reply(deps, a_reply(ship, Outcome.FAILED))
    (refund,) = payment_requests(world)
    assert (refund.queue, refund.body["action"]) == (agent_queue("payment-secondary"), "compensate")


async def retry_after_timeout(world: World, deps: ProcessDeps, store: InMemoryHealthStore) -> None:
    world.clock.advance(31)
    for name in ("payment", "payment-secondary"):
        await store.publish_health(health(name, at=world.clock.now()))
    await sweep(deps)
    world.clock.advance(2)
    await scheduler.on_nudge(deps, "o-1")


async def test_a_timed_out_payment_is_retried_where_its_idempotency_key_lives() -> None:
    """Two providers do not share keys: after a timeout the first charge may exist, so
    moving the retry would charge twice. New orders still go to the healthy one."""
    world, deps, store = routed_world(*BOTH_HEALTHY)
    await reach_payment(world, deps, "o-1", high=False)
    (first,) = payment_requests(world)
    assert first.queue == agent_queue("payment")
    await retry_after_timeout(world, deps, store)
    (retry,) = payment_requests(world)
    assert retry.queue == agent_queue("payment")
    assert retry.body["attempt"] == first.body["attempt"] + 1


async def test_a_step_whose_agents_share_keys_is_retried_on_another_healthy_agent() -> None:
    charge = ORDER_FULFILMENT.steps[1]
    regions = replace(
        ORDER_FULFILMENT,
        steps=(
            ORDER_FULFILMENT.steps[0],
            replace(charge, retry_elsewhere=True),
            ORDER_FULFILMENT.steps[2],
        ),
    )
    world, deps, store = routed_world(*BOTH_HEALTHY, catalogue=running(regions))
    await reach_payment(world, deps, "o-1", high=False)
    (first,) = payment_requests(world)
    assert first.queue == agent_queue("payment")
    await retry_after_timeout(world, deps, store)
    (retry,) = payment_requests(world)
    assert retry.queue == agent_queue("payment-secondary")
    await scheduler.on_reply(deps, a_reply(retry))
    process = await world.store.load("o-1")
    assert process is not None and process.steps[1].status.value == "Completed"
    assert any(
        "(instead of payment: its attempt timed out)" in h.detail
        for h in await world.store.history("o-1")
    )


async def test_high_priority_orders_use_the_high_lanes_with_a_tighter_complete_by() -> None:
    world = World(policy=replace(World().policy, high_priority_step_timeout=timedelta(seconds=5)))
    deps = world.deps()
    await reach_payment(world, deps, "vip", high=True)
    (charge,) = payment_requests(world)
    assert charge.queue == high_priority(agent_queue("payment"))
    process = await world.store.load("vip")
    assert process is not None and process.steps[1].complete_by == (
        world.clock.now() + timedelta(seconds=5)
    )
    await reach_payment(world, deps, "normal", high=False)
    (normal,) = payment_requests(world)
    assert normal.queue == agent_queue("payment")
    process = await world.store.load("normal")
    assert process is not None and process.steps[1].complete_by == (
        world.clock.now() + timedelta(seconds=30)
    )
    assert process.state.process_state is ProcessState.PROCESSING


async def test_the_claim_sends_the_agent_request_before_the_processing_notification() -> None:
    world = World()
    deps = world.deps(claim_at_intake=False)  # the Scheduler's claim
    await submit_order(deps, an_order("o-1", clock=world.clock))
    world.bus.sent.clear()
    await scheduler.on_nudge(deps, "o-1")
    assert [m.queue for m in world.bus.sent] == [agent_queue("inventory"), Queue.ORDER_STATUS]
    world.bus.sent.clear()
    await submit_order(world.deps(), an_order("o-2", clock=world.clock))  # claimed at intake
    assert [(m.queue, m.body.get("status")) for m in world.bus.sent] == [
        (Queue.ORDER_STATUS, "Received"),
        (agent_queue("inventory"), None),
        (Queue.ORDER_STATUS, "Processing"),
    ]


async def test_routing_reads_health_once_per_refresh_and_keeps_the_last_on_failure() -> None:
    world = World()
    store = InMemoryHealthStore()
    source = RoutingSource(store, world.clock)
    reads = 0
    original = store.agent_records

    async def counting() -> AgentRecords:
        nonlocal reads
        reads += 1
        return await original()

    store.agent_records = counting  # type: ignore[method-assign]
    await store.publish_health(health("payment", at=world.clock.now()))
    first = await source.current()
    await source.current()
    assert reads == 1 and "payment" in first.views
    world.clock.advance(3)

    async def failing() -> AgentRecords:
        from shared.ports import StoreUnavailable  # noqa: PLC0415

        raise StoreUnavailable("down")

    store.agent_records = failing  # type: ignore[method-assign]
    assert (await source.current()) is first
