"""A step that waits for our own limit is never counted as a failure, for a do and for
an undo (docs/limits.md, "A held step does not time out").

The agent's queue is served here as the host serves it: one handler takes the earliest
deliverable message, and the Supervisor sweeps whenever time moves on. A request that
waits for its rate slot in a handler keeps the requests behind it waiting in the broker,
where no hold is recorded; an undo held by the limiter used to end silent and be counted.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import timedelta

import pytest

from shared.adapters.clock import FakeClock
from shared.adapters.memory.limits import InMemoryLimitStore
from shared.contract import Queue, agent_queue
from shared.domain.in_doubt import RemoteOutcome
from shared.domain.limits import AgentLimits
from shared.domain.machine.hold import hold_complete_by
from shared.domain.machine.transition import ProcessPolicy
from shared.domain.messages import AgentReply, AgentRequest
from shared.domain.model import (
    Action,
    JsonObject,
    OrderProcess,
    Outcome,
    ProcessState,
    StepStatus,
)
from shared.ports import RemoteCall
from shared.resilience import CircuitBreaker
from shared.usecases.flow import scheduler
from shared.usecases.flow.agent import AgentDeps, Performed, perform_step
from shared.usecases.flow.step_heartbeat import KnownCompleteBy
from shared.usecases.flow.step_hold import StepHolds
from shared.usecases.flow.submission import submit_order
from shared.usecases.flow.supervisor import sweep
from shared.usecases.flow.unit_of_work import UnitOfWork
from shared.usecases.limits.limiter import AgentLimiter
from tests.builders import World, a_policy, a_reply, an_order
from tests.workflows import CATALOGUE

AGENT = "inventory"
BOOKED_AHEAD = 60.0
"""How far other instances' calls have booked the agent's schedule: over three step
timeouts (MaxFailureCount is 3), so every request here waits for its slot past the
complete-by it came with, and a retry after a counted timeout waits again."""
TIMEOUT = 6.0


def policy() -> ProcessPolicy:
    return replace(a_policy(step_timeout=TIMEOUT), hold_max=timedelta(seconds=300))


@dataclass
class Provider:
    """Answers every call at once, and records which operations it was asked for."""

    calls: list[str]

    async def invoke(self, call: RemoteCall, timeout: float) -> JsonObject:
        self.calls.append(f"{call.order_id}:{call.operation}")
        return {"ref": call.idempotency_key}

    async def probe(self, timeout: float) -> None:
        return None

    async def outcome(self, key: str, timeout: float) -> RemoteOutcome:
        raise AssertionError("not asked")

    async def abandon(self, key: str, timeout: float) -> RemoteOutcome:
        raise AssertionError("not abandoned")


async def limited_agent(
    world: World, calls: list[str], limits: InMemoryLimitStore | None = None
) -> AgentDeps:
    """The agent with a `callsPerSecond` limit whose shared schedule is booked
    BOOKED_AHEAD seconds ahead (unless `limits` is given), step holds on, as bootstrap
    builds it."""
    if limits is None:
        limits = InMemoryLimitStore()
        ahead = world.clock.now() + timedelta(seconds=BOOKED_AHEAD)
        await limits.put_schedule(AGENT, ahead, None)
    return AgentDeps(
        agent=AGENT,
        bus=world.bus,
        clock=world.clock,
        remote=Provider(calls),
        breaker=CircuitBreaker(AGENT, world.clock),
        limiter=AgentLimiter(
            AGENT, AgentLimits(calls_per_second=5), limits, world.clock, "agent-1", seconds(1)
        ),
        step_holds=StepHolds(
            UnitOfWork(world.store, world.bus, catalogue=CATALOGUE), world.clock, world.policy
        ),
        catalogue=CATALOGUE,
    )


def seconds(n: float) -> timedelta:
    return timedelta(seconds=n)


SERVED = (agent_queue(AGENT), Queue.SCHEDULER, Queue.AGENT_REPLIES)


async def serve(
    world: World, agent: AgentDeps, done: Callable[[], Awaitable[bool]], horizon: float
) -> list[Performed]:
    """Deliver what is due on the agent's queue (one handler, as `maxConcurrentCalls`
    1 would), the Scheduler's and the replies, in the order sent; when nothing is due,
    time moves on by at most a second and the Supervisor sweeps. Until `done`."""
    performed: list[Performed] = []
    end = world.clock.now() + seconds(horizon)
    while not await done():
        now = world.clock.now()
        assert now < end, f"not done within {horizon} s"
        waiting = [m for m in world.bus.sent if m.queue in SERVED]
        due = [m for m in waiting if m.deliver_at is None or m.deliver_at <= now]
        if not due:
            later = [m.deliver_at for m in waiting if m.deliver_at is not None]
            step = min([seconds(1), *(at - now for at in later)])
            world.clock.advance(step.total_seconds())
            await sweep(world.deps())
            continue
        message = due[0]
        world.bus.sent.remove(message)
        body = json.dumps(dict(message.body))
        if message.queue == Queue.SCHEDULER:
            await scheduler.on_nudge(world.deps(), str(message.body["orderId"]))
        elif message.queue == Queue.AGENT_REPLIES:
            await scheduler.on_reply(world.deps(), AgentReply.parse(body))
        else:
            await sweep(world.deps())
            performed.append(await perform_step(agent, AgentRequest.parse(body)))
    return performed


async def test_requests_behind_one_waiting_for_its_rate_slot_are_never_counted() -> None:
    """Four reservations dispatched at once; each waits for its slot, a minute ahead. A
    handler that waited there would leave the other three in the broker past their
    complete-by, unrecorded, and the Supervisor would count each of them."""
    world = World(policy=policy())
    ids = [f"o-{i}" for i in range(1, 5)]
    for order_id in ids:
        await submit_order(world.deps(), an_order(order_id))
    calls: list[str] = []
    agent = await limited_agent(world, calls)

    async def reserved() -> bool:
        for order_id in ids:
            process = await world.store.load(order_id)
            assert process is not None
            if process.steps[0].status is not StepStatus.COMPLETED:
                return False
        return True

    await serve(world, agent, reserved, horizon=120)

    counted = {}
    for order_id in ids:
        process = await world.store.load(order_id)
        assert process is not None
        if process.state.failure_count:
            counted[order_id] = process.state.failure_count
    assert counted == {}, "a wait for our own limit was counted as a failure"
    assert sorted(calls) == sorted(f"{o}:reserve-inventory" for o in ids)
    history = [h.event for o in ids for h in await world.store.history(o)]
    assert "timed-out" not in history
    assert history.count("step-held") >= len(ids)


async def releasing(world: World) -> OrderProcess:
    """Order o-1 reserved, its charge declined: the release of the reservation is out."""
    await submit_order(world.deps(), an_order("o-1"))
    world.bus.take(Queue.SCHEDULER)
    [reserve] = world.bus.take(agent_queue("inventory"))
    await scheduler.on_reply(world.deps(), a_reply(reserve))
    [charge] = world.bus.take(agent_queue("payment"))
    await scheduler.on_reply(world.deps(), a_reply(charge, Outcome.FAILED))
    process = await world.store.load("o-1")
    assert process is not None and process.state.process_state is ProcessState.COMPENSATING
    return process


async def test_an_undos_hold_moves_its_complete_by_fenced_and_leaves_the_do_keys_live_time() -> (
    None
):
    world = World(policy=policy())
    process = await releasing(world)
    rules, now, attempt = world.policy, world.clock.now(), process.state.attempt
    step = process.steps[0]
    assert step.complete_by is not None
    held = hold_complete_by(process, attempt, step.name, seconds(10), now, rules, Action.COMPENSATE)
    assert held is not None
    moved = held.process.steps[0]
    assert moved.complete_by == step.complete_by + seconds(10) == held.process.state.complete_by
    assert moved.live_until == step.live_until, "the live time is the do key's"
    assert [h.event for h in held.history] == ["step-held"]
    for fenced in (
        hold_complete_by(process, attempt, step.name, seconds(10), now, rules),
        hold_complete_by(
            process, attempt + 1, step.name, seconds(10), now, rules, Action.COMPENSATE
        ),
        hold_complete_by(
            process, attempt, "charge-payment", seconds(10), now, rules, Action.COMPENSATE
        ),
        hold_complete_by(
            process, attempt, step.name, seconds(10), step.complete_by, rules, Action.COMPENSATE
        ),
    ):
        assert fenced is None


async def test_an_undo_held_by_the_rate_limit_is_sent_and_never_counted() -> None:
    """The payment failed, so the reservation is released; the release waits a minute for
    the inventory agent's slot. It must be sent, and the order end Compensated with no
    failure counted: held by our own limit, the undo is neither dropped nor failed."""
    world = World(policy=policy())
    await releasing(world)
    calls: list[str] = []
    agent = await limited_agent(world, calls)

    async def at_rest() -> bool:
        process = await world.store.load("o-1")
        assert process is not None
        return process.state.process_state in (ProcessState.COMPENSATED, ProcessState.ERROR)

    performed = await serve(world, agent, at_rest, horizon=300)

    process = await world.store.load("o-1")
    assert process is not None
    assert (process.state.process_state, process.state.failure_count) == (
        ProcessState.COMPENSATED,
        0,
    ), [(h.event, h.detail) for h in await world.store.history("o-1")]
    assert calls == ["o-1:release-inventory"]
    assert Performed.SUCCEEDED in performed
    assert process.steps[0].status is StepStatus.COMPENSATED
    undo = [m for m in world.bus.sent if m.body.get("action") == Action.COMPENSATE.value]
    assert undo == [], "nothing is left waiting to be sent"


async def test_a_carried_slot_is_taken_while_usable_and_booked_again_once_past_its_margin() -> None:
    """A handed-back request carries its slot: on time, its call books nothing (it only
    claims the slot); late by more than the slot allows, it books another (started
    late, it could crowd the slots after it into one second)."""
    world = World(policy=policy())
    for order_id in ("o-1", "o-2"):
        await submit_order(world.deps(), an_order(order_id))
    on_time, late = (
        AgentRequest.parse(json.dumps(dict(m.body))) for m in world.bus.take(agent_queue(AGENT))
    )
    limits = InMemoryLimitStore()
    calls: list[str] = []
    agent = await limited_agent(world, calls, limits)
    now = world.clock.now()

    assert await perform_step(agent, replace(on_time, start_at=now)) is Performed.SUCCEEDED
    assert await limits.schedule(AGENT) is None, "no slot booked"
    stale = replace(late, start_at=now - seconds(0.5))
    assert await perform_step(agent, stale) is Performed.SUCCEEDED
    assert await limits.schedule(AGENT) is not None
    assert calls == ["o-1:reserve-inventory", "o-2:reserve-inventory"]


async def test_a_handed_back_request_delivered_twice_uses_its_slot_once() -> None:
    """The broker delivers at least once: two copies of one handed-back request carry one
    slot, perhaps to two instances. Both calling in it would be two calls in one slot,
    one past the limit when the schedule is full; the first copy claims the slot, the
    second books its own."""
    world = World(policy=policy())
    await submit_order(world.deps(), an_order("o-1"))
    (request,) = (
        AgentRequest.parse(json.dumps(dict(m.body))) for m in world.bus.take(agent_queue(AGENT))
    )
    limits = InMemoryLimitStore()
    calls: list[str] = []
    instances = [await limited_agent(world, calls, limits) for _ in range(2)]
    now = world.clock.now()
    copy = replace(request, start_at=now)

    for agent in instances:
        assert await perform_step(agent, copy) is Performed.SUCCEEDED

    booked = await limits.schedule(AGENT)
    assert booked is not None, "the second copy booked a slot of its own"
    assert booked.next_start == now + seconds(0.21), "one gap at 5/s"
    assert calls == ["o-1:reserve-inventory"] * 2


class WakesLate(FakeClock):
    """A loaded host: its first sleep ends `late` seconds after it was due."""

    def __init__(self, late: float) -> None:
        super().__init__()
        self.late = late

    async def sleep(self, seconds: float) -> None:
        late, self.late = self.late, 0.0
        await super().sleep(max(seconds, 0) + late)


@pytest.mark.parametrize(
    ("slot_in", "late"),
    [(-0.5, 0.0), (0.2, 0.3)],
    ids=["a copy delivered after its slot", "a call woken after its slot"],
)
async def test_a_call_that_misses_its_slot_comes_to_the_next_with_the_time_it_had(
    slot_in: float, late: float
) -> None:
    """A handed-back copy carries its slot and a complete-by its time after it. Come to
    the slot too late to start in it (delivered late, or woken late), it books another,
    at the back of a schedule a minute long, and is handed back again: the hold gives it
    the time since the missed slot too, so it comes to the new slot with at least the
    time it had at the old one. Counting only the wait from now, each missed slot ate
    the call's time, and a copy handed back a few times reached the agent past its
    complete-by (tests/e2e/test_limits.py with 25 ms allowed at 5/s)."""
    world = World(policy=policy(), clock=WakesLate(late))
    await submit_order(world.deps(), an_order("o-1"))
    (request,) = (
        AgentRequest.parse(json.dumps(dict(m.body))) for m in world.bus.take(agent_queue(AGENT))
    )
    agent = await limited_agent(world, [])
    copy = replace(request, start_at=world.clock.now() + seconds(slot_in))

    assert await perform_step(agent, copy) is Performed.HANDED_BACK

    (again,) = (
        AgentRequest.parse(json.dumps(dict(m.body))) for m in world.bus.take(agent_queue(AGENT))
    )
    assert again.start_at is not None and copy.start_at is not None
    assert again.start_at > copy.start_at + seconds(BOOKED_AHEAD - 1), "at the back"
    assert again.complete_by - again.start_at >= copy.complete_by - copy.start_at


async def test_a_missed_slot_counts_no_wait_twice() -> None:
    """A call waits for its rate slot, then past it for a concurrency slot, then comes
    to its call too late for the rate slot: the time since it arrived is waited once,
    the concurrency wait not counted again as lateness."""
    world = World(policy=policy())
    await submit_order(world.deps(), an_order("o-1"))
    (request,) = (
        AgentRequest.parse(json.dumps(dict(m.body))) for m in world.bus.take(agent_queue(AGENT))
    )
    holds = StepHolds(
        UnitOfWork(world.store, world.bus, catalogue=CATALOGUE), world.clock, world.policy
    )
    held = holds.for_request(request, KnownCompleteBy(request.complete_by))
    arrived, clock = world.clock.now(), world.clock
    slot = arrived + seconds(0.5)

    await held(slot)
    clock.advance(0.5)
    await held(clock.now() + seconds(0.4))  # a concurrency slot, looked for again
    clock.advance(0.4 + 0.1)  # woken 100 ms late
    held.missed(slot)

    assert held.unpaid == clock.now() - arrived == seconds(1.0)
