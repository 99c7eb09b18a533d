"""A step held back by a limit: the wait is not counted against its complete-by, so it is
never counted as a failure; fenced like a heartbeat, capped, and the live time only
grows (settle.py's rule stands)."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field, replace
from datetime import timedelta

from shared.adapters.memory.limits import InMemoryLimitStore
from shared.contract import Queue, agent_queue
from shared.domain.in_doubt import RemoteOutcome
from shared.domain.limits import AgentLimits
from shared.domain.machine.hold import hold_complete_by
from shared.domain.machine.recovery import next_complete_by
from shared.domain.machine.transition import ProcessPolicy
from shared.domain.messages import AgentRequest
from shared.domain.model import JsonObject, OrderProcess, ProcessState
from shared.domain.throttle import AdaptiveRate
from shared.ports import RateLimited, RemoteCall, TransientRemoteError
from shared.resilience import CircuitBreaker
from shared.usecases.flow.agent import AgentDeps, Performed, perform_step
from shared.usecases.flow.step_hold import StepHolds
from shared.usecases.flow.submission import submit_order
from shared.usecases.flow.supervisor import sweep
from shared.usecases.flow.unit_of_work import UnitOfWork
from shared.usecases.limits.limiter import AgentLimiter
from tests.builders import World, a_policy, an_order
from tests.unit.test_step_heartbeat import START, at, dispatched, running_step
from tests.workflows import CATALOGUE

HELD_FOR = 20.0
"""How long other instances' calls hold this one back: over three step timeouts."""


def seconds(n: float) -> timedelta:
    return timedelta(seconds=n)


def policy(hold_max: float = 300) -> ProcessPolicy:
    return replace(a_policy(step_timeout=6), hold_max=timedelta(seconds=hold_max))


def test_a_hold_moves_the_complete_by_later_by_the_wait() -> None:
    rules = policy()
    process = dispatched(rules)
    before = process.steps[0].live_until
    held = hold_complete_by(process, 1, running_step(process), seconds(19), at(1), rules)
    assert held is not None
    step = held.process.steps[0]
    assert step.complete_by == at(25) == held.process.state.complete_by
    assert before is not None and step.live_until == at(25) + rules.clock_skew > before
    assert held.outgoing == () and held.process.state.outbox == process.state.outbox
    assert [h.event for h in held.history] == ["step-held"]
    assert next_complete_by(held.process, rules) == at(25)


def test_a_hold_never_goes_past_hold_max_from_the_dispatch_nor_moves_anything_back() -> None:
    rules = policy(hold_max=10)
    process = dispatched(rules)
    step = running_step(process)
    held = hold_complete_by(process, 1, step, seconds(19), at(1), rules)
    assert held is not None and held.process.steps[0].complete_by == at(10)
    again = hold_complete_by(held.process, 1, step, seconds(10), at(2), rules)
    assert again is None, "at the cap: the usual timeout applies"
    nothing = hold_complete_by(process, 1, step, timedelta(0), at(0), rules)
    assert nothing is None, "a complete-by, and its live time, never move back"


def test_a_hold_is_fenced_like_a_heartbeat() -> None:
    rules = policy()
    process = dispatched(rules)
    step = running_step(process)
    waited = seconds(19)
    assert hold_complete_by(process, 2, step, waited, at(1), rules) is None
    assert hold_complete_by(process, 1, "x", waited, at(1), rules) is None
    late = hold_complete_by(process, 1, step, waited, at(7), rules)
    assert late is None, "past its complete-by the step is the Supervisor's"
    compensating = replace(
        process,
        state=replace(process.state, process_state=ProcessState.COMPENSATING),
    )
    assert hold_complete_by(compensating, 1, step, waited, at(1), rules) is None


class NeverAsked:
    """A service the agent never asks about a key nor abandons one at."""

    async def probe(self, timeout: float) -> None:
        return None

    async def outcome(self, key: str, timeout: float) -> RemoteOutcome:
        raise AssertionError("not asked")

    async def abandon(self, key: str, timeout: float) -> RemoteOutcome:
        raise AssertionError("not abandoned")


@dataclass
class Instant(NeverAsked):
    """A service that answers at once; the Supervisor sweeps first, at the time the
    held call finally starts (past the complete-by it was dispatched with)."""

    world: World
    swept: list[int]

    async def invoke(self, call: RemoteCall, timeout: float) -> JsonObject:
        report = await sweep(self.world.deps())
        self.swept.append(report.recovered)
        return {"ref": call.idempotency_key}


@dataclass
class HeldBack:
    """Order o-1's inventory request, whose call other instances' calls hold back
    HELD_FOR seconds (the shared schedule is booked that far)."""

    world: World
    request: AgentRequest
    limits: InMemoryLimitStore = field(default_factory=InMemoryLimitStore)
    swept: list[int] = field(default_factory=list)

    def agent(self, *, holds: bool) -> AgentDeps:
        """The inventory agent at 5 calls a second, on this rate row."""
        world = self.world
        return AgentDeps(
            agent="inventory",
            bus=world.bus,
            clock=world.clock,
            remote=Instant(world, self.swept),
            breaker=CircuitBreaker("inventory", world.clock),
            limiter=AgentLimiter(
                "inventory",
                AgentLimits(calls_per_second=5),
                self.limits,
                world.clock,
                "agent-1",
                world.policy.clock_skew,
            ),
            step_holds=StepHolds(
                UnitOfWork(world.store, world.bus, catalogue=CATALOGUE), world.clock, world.policy
            )
            if holds
            else None,
            catalogue=CATALOGUE,
        )


async def held_back(*, holds: bool) -> tuple[HeldBack, Performed]:
    world = World(policy=policy())
    await submit_order(world.deps(), an_order("o-1"))
    world.bus.take(Queue.SCHEDULER)
    [message] = world.bus.take(agent_queue("inventory"))
    held = HeldBack(world, AgentRequest.parse(json.dumps(dict(message.body))))
    await held.limits.put_schedule("inventory", START + timedelta(seconds=HELD_FOR), None)
    return held, await perform_step(held.agent(holds=holds), held.request)


async def stored(world: World) -> OrderProcess:
    process = await world.store.load("o-1")
    assert process is not None
    return process


async def test_a_step_held_by_the_limiter_is_answered_and_never_counted_as_a_failure() -> None:
    """Its slot is far, so the request is handed back to wait for it in the broker,
    with its hold written (usecases/flow/rate_slot.py); the copy takes that slot."""
    held, outcome = await held_back(holds=True)
    world = held.world

    assert outcome is Performed.HANDED_BACK
    process = await stored(world)
    assert process.steps[0].complete_by == START + timedelta(seconds=HELD_FOR + 6)
    [copy] = world.bus.take(agent_queue("inventory"))
    request = AgentRequest.parse(json.dumps(dict(copy.body)))
    assert request.start_at == START + timedelta(seconds=HELD_FOR)
    assert request.complete_by == process.steps[0].complete_by
    assert copy.deliver_at is not None and START < copy.deliver_at < request.start_at
    world.clock.advance((copy.deliver_at - world.clock.now()).total_seconds())
    again = await perform_step(held.agent(holds=True), request)

    assert again is Performed.SUCCEEDED
    assert world.clock.now() >= START + timedelta(seconds=HELD_FOR)
    assert held.swept == [0], "the sweep at the call's start finds its deadline not yet passed"
    process = await stored(world)
    assert process.state.failure_count == 0
    assert process.steps[0].complete_by == START + timedelta(seconds=HELD_FOR + 6)
    history = [h.event for h in await world.store.history("o-1")]
    assert history.count("step-held") == 1
    [reply] = world.bus.take(Queue.AGENT_REPLIES)
    assert reply.body["outcome"] == "succeeded"


async def test_without_holds_the_same_wait_ends_silent_and_the_supervisor_counts_it() -> None:
    """What the hold prevents: the wait runs past the complete-by, no reply goes, and
    the Supervisor's next sweep counts an expired attempt against the order."""
    held, outcome = await held_back(holds=False)
    world = held.world

    assert outcome is Performed.HELD_BY_THROTTLE
    assert held.swept == []
    world.clock.advance(10)
    await sweep(world.deps())
    assert (await stored(world)).state.failure_count == 1


@dataclass
class FailingAndLimiting(NeverAsked):
    """A provider down for good that answers every other call `429` (`Retry-After: 1`),
    as the simulator's transient faults do: the `429`s must not keep the step alive."""

    calls: int = 0

    async def invoke(self, call: RemoteCall, timeout: float) -> JsonObject:
        self.calls += 1
        if self.calls % 2 == 0:
            raise RateLimited("rate-limited", "slow down", retry_after=1.0)
        raise TransientRemoteError("service-unavailable", "down")


async def test_a_failing_provider_that_also_answers_429_still_meets_its_timeout() -> None:
    """Only the waits move the complete-by: a hold that restarted the whole timeout at
    each `429` kept this step Processing to the 300 s cap."""
    world = World(policy=policy())
    await submit_order(world.deps(), an_order("o-1"))
    world.bus.take(Queue.SCHEDULER)
    [message] = world.bus.take(agent_queue("inventory"))
    request = AgentRequest.parse(json.dumps(dict(message.body)))
    remote = FailingAndLimiting()
    deps = AgentDeps(
        agent="inventory",
        bus=world.bus,
        clock=world.clock,
        remote=remote,
        breaker=CircuitBreaker("inventory", world.clock),
        rng=random.Random(1),
        throttle=AdaptiveRate(),
        step_holds=StepHolds(
            UnitOfWork(world.store, world.bus, catalogue=CATALOGUE), world.clock, world.policy
        ),
        catalogue=CATALOGUE,
    )
    outcome = await perform_step(deps, request)

    assert outcome in (Performed.COMPLETE_BY_PASSED, Performed.HELD_BY_THROTTLE)
    limited = remote.calls // 2
    assert limited >= 3, "the provider answered 429 often enough to matter"
    complete_by = (await stored(world)).steps[0].complete_by
    assert complete_by is not None
    # Each 429 holds the calls after it by its Retry-After (1 s) and at most one gap of
    # the throttle at its floor (0.5 calls/s with its 5% margin): the timeout is moved
    # by no more than that.
    assert complete_by <= START + seconds(6 + limited * (1 + 2.1)), (limited, complete_by)
