"""Step heartbeats: a running step's complete-by moves with its agent's beats, fenced."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from shared.adapters.clock import FakeClock
from shared.adapters.memory.store import InMemoryStateStore
from shared.contract import Queue, agent_queue
from shared.domain.in_doubt import RemoteOutcome
from shared.domain.machine.forward import apply_reply, claim, start
from shared.domain.machine.heartbeat import extend_complete_by
from shared.domain.machine.recovery import next_complete_by, recover
from shared.domain.machine.transition import ProcessPolicy
from shared.domain.messages import AgentRequest
from shared.domain.model import HistoryEntry, JsonObject, OrderProcess, ProcessState, StepStatus
from shared.ports import ConcurrencyConflict, RemoteCall, StoreUnavailable, TransientRemoteError
from shared.resilience import CircuitBreaker
from shared.usecases.flow.agent import AgentDeps, Performed, perform_step
from shared.usecases.flow.step_heartbeat import StepHeartbeats
from shared.usecases.flow.submission import submit_order
from shared.usecases.flow.supervisor import sweep
from shared.usecases.flow.unit_of_work import UnitOfWork
from tests.builders import World, a_policy, a_reply, an_order
from tests.workflows import CATALOGUE, ORDER_FULFILMENT

WORKFLOW = ORDER_FULFILMENT
START = FakeClock().now()


def beating_policy(heartbeat: float = 10, step_max: float | None = 300) -> ProcessPolicy:
    return replace(
        a_policy(step_timeout=6),
        step_heartbeat=timedelta(seconds=heartbeat),
        step_max=None if step_max is None else timedelta(seconds=step_max),
    )


def dispatched(policy: ProcessPolicy) -> OrderProcess:
    """An order whose first step went out at START (attempt 1, complete-by START + 6 s)."""
    started = start(an_order("o-1"), WORKFLOW, START)
    claimed = claim(started.process, WORKFLOW, policy, "scheduler-1", START)
    assert claimed is not None
    return replace(claimed.process, etag="etag-1")


def at(seconds: float) -> datetime:
    return START + timedelta(seconds=seconds)


def running_step(process: OrderProcess) -> str:
    return process.steps[process.state.current_step].name


def test_dispatch_records_when_the_step_went_out() -> None:
    process = dispatched(beating_policy())
    step = process.steps[0]
    assert step.status is StepStatus.RUNNING
    assert step.dispatched_at == START
    assert step.complete_by == at(6)


def test_a_beat_moves_the_step_and_the_order_complete_by_and_keeps_the_outbox() -> None:
    policy = beating_policy()
    process = dispatched(policy)
    beat = extend_complete_by(process, 1, running_step(process), at(5), policy)
    assert beat is not None
    step = beat.process.steps[0]
    assert step.complete_by == at(15)
    assert beat.process.state.complete_by == at(15)
    assert step.step_heartbeats == 1
    assert beat.outgoing == ()
    assert beat.process.state.outbox == process.state.outbox
    assert beat.process.state.version == process.state.version + 1
    assert beat.process.etag == process.etag
    assert next_complete_by(beat.process, policy) == at(15)


def test_only_the_first_beat_of_an_attempt_is_noted_in_the_history() -> None:
    policy = beating_policy()
    process = dispatched(policy)
    first = extend_complete_by(process, 1, running_step(process), at(5), policy)
    assert first is not None
    assert [h.event for h in first.history] == ["step-heartbeat"]
    second = extend_complete_by(first.process, 1, running_step(process), at(10), policy)
    assert second is not None
    assert second.history == ()
    assert second.process.steps[0].step_heartbeats == 2
    assert second.process.steps[0].complete_by == at(20)


def test_beats_never_extend_past_step_max_from_the_dispatch() -> None:
    policy = beating_policy(heartbeat=10, step_max=12)
    process = dispatched(policy)
    beat = extend_complete_by(process, 1, running_step(process), at(5), policy)
    assert beat is not None
    assert beat.process.steps[0].complete_by == at(12)
    assert beat.process.state.complete_by == at(12)
    at_cap = extend_complete_by(beat.process, 1, running_step(process), at(10), policy)
    assert at_cap is None


def test_without_step_max_beats_change_nothing() -> None:
    policy = beating_policy(step_max=None)
    process = dispatched(policy)
    assert extend_complete_by(process, 1, running_step(process), at(5), policy) is None


def test_a_stale_attempt_changes_nothing() -> None:
    policy = beating_policy()
    process = dispatched(policy)
    step = running_step(process)
    assert extend_complete_by(process, 0, step, at(5), policy) is None
    assert extend_complete_by(process, 2, step, at(5), policy) is None
    assert extend_complete_by(process, 1, "create-shipment", at(5), policy) is None


def test_a_recovered_step_is_not_extended_by_its_old_attempt() -> None:
    policy = beating_policy()
    process = dispatched(policy)
    recovered = recover(process, ORDER_FULFILMENT, policy, at(7))
    assert recovered is not None
    assert recovered.process.state.process_state is ProcessState.PENDING
    step = running_step(process)
    assert extend_complete_by(recovered.process, 1, step, at(7.5), policy) is None


def test_a_finished_step_changes_nothing() -> None:
    policy = beating_policy()
    process = dispatched(policy)
    request = next(m for m in process.state.outbox if m.body.get("step") == running_step(process))
    replied = apply_reply(process, WORKFLOW, policy, a_reply(request), at(2))
    assert replied is not None
    done = replace(replied.process, state=replace(replied.process.state, current_step=0))
    assert done.steps[0].status is StepStatus.COMPLETED
    assert extend_complete_by(done, 1, running_step(process), at(3), policy) is None


def test_a_terminal_or_held_order_changes_nothing() -> None:
    policy = beating_policy()
    process = dispatched(policy)
    step = running_step(process)
    for held in (ProcessState.SUSPENDED, ProcessState.ERROR, ProcessState.CANCELLED):
        stopped = replace(process, state=replace(process.state, process_state=held))
        assert extend_complete_by(stopped, 1, step, at(5), policy) is None


def test_a_beat_after_the_complete_by_leaves_the_step_in_doubt() -> None:
    policy = beating_policy()
    process = dispatched(policy)
    assert extend_complete_by(process, 1, running_step(process), at(6), policy) is None


# The agent's side: beats while its call runs, through the store ------------------------


@dataclass
class SlowRemote:
    """A service whose call takes `seconds` of the fake clock, then succeeds."""

    clock: FakeClock
    seconds: float
    calls: int = 0

    async def invoke(self, call: RemoteCall, timeout: float) -> JsonObject:
        self.calls += 1
        done_at = self.clock.now() + timedelta(seconds=self.seconds)
        given_up_at = self.clock.now() + timedelta(seconds=timeout)
        while self.clock.now() < done_at:
            if self.clock.now() >= given_up_at:
                raise TransientRemoteError("timeout", "the call timed out")
            self.clock.advance(0.05)
            await asyncio.sleep(0)
        return {"ref": call.idempotency_key}

    async def probe(self, timeout: float) -> None:
        return None

    async def outcome(self, key: str, timeout: float) -> RemoteOutcome:
        raise AssertionError("not asked here")

    async def abandon(self, key: str, timeout: float) -> RemoteOutcome:
        raise AssertionError("not abandoned here")


class RacingStore(InMemoryStateStore):
    """Loses the first `conflicts` saves to someone else (an ETag race)."""

    def __init__(self) -> None:
        super().__init__()
        self.conflicts = 0
        self.down = False

    async def save(self, process: OrderProcess, history: Sequence[HistoryEntry]) -> str:
        if self.down:
            raise StoreUnavailable("down")
        if self.conflicts and process.state.process_state is ProcessState.PROCESSING:
            self.conflicts -= 1
            raise ConcurrencyConflict(process.order_id)
        return await super().save(process, history)


@dataclass
class Running:
    world: World
    store: RacingStore
    request: AgentRequest
    remote: SlowRemote

    def deps(self) -> AgentDeps:
        policy = self.world.policy
        return AgentDeps(
            agent="inventory",
            bus=self.world.bus,
            clock=self.world.clock,
            remote=self.remote,
            breaker=CircuitBreaker("inventory", self.world.clock),
            step_heartbeats=StepHeartbeats(
                UnitOfWork(self.store, self.world.bus, catalogue=CATALOGUE),
                self.world.clock,
                policy,
            ),
            catalogue=CATALOGUE,
        )

    async def stored(self) -> OrderProcess:
        process = await self.store.load("o-1")
        assert process is not None
        return process


async def running(
    call_seconds: float, *, step_max: float | None = 300, conflicts: int = 0
) -> Running:
    """Order o-1 claimed (inventory step, complete-by 6 s), its request taken off the bus."""
    store = RacingStore()
    world = World(store=store, policy=beating_policy(heartbeat=4, step_max=step_max))
    await submit_order(world.deps(), an_order("o-1"))
    world.bus.take(Queue.SCHEDULER)
    [request] = world.bus.take(agent_queue("inventory"))
    store.conflicts = conflicts
    return Running(
        world,
        store,
        AgentRequest.parse(json.dumps(dict(request.body))),
        SlowRemote(world.clock, call_seconds),
    )


def stopped_at(run: Running, seconds: float) -> bool:
    """The agent gave up at that complete-by (within the fake call's clock steps)."""
    late = run.world.clock.now() - (START + timedelta(seconds=seconds))
    return timedelta(0) <= late < timedelta(seconds=0.5)


def replies(run: Running) -> list[JsonObject]:
    return [m.body for m in run.world.bus.take(Queue.AGENT_REPLIES)]


async def test_a_fast_call_costs_no_beat() -> None:
    run = await running(call_seconds=1)
    reads = run.store.operations["read"]
    assert await perform_step(run.deps(), run.request) is Performed.SUCCEEDED
    assert run.store.operations["read"] == reads
    assert (await run.stored()).steps[0].step_heartbeats == 0


async def test_a_call_three_times_the_timeout_is_kept_alive_and_answers() -> None:
    run = await running(call_seconds=18)
    assert await perform_step(run.deps(), run.request) is Performed.SUCCEEDED
    assert [r["outcome"] for r in replies(run)] == ["succeeded"]
    step = (await run.stored()).steps[0]
    assert step.step_heartbeats >= 4
    assert step.complete_by is not None and step.complete_by > START + timedelta(seconds=18)
    history = [h.event for h in await run.store.history("o-1")]
    assert history.count("step-heartbeat") == 1


async def test_a_capped_step_stops_at_step_max_and_answers_nothing() -> None:
    run = await running(call_seconds=18, step_max=10)
    assert await perform_step(run.deps(), run.request) is Performed.COMPLETE_BY_PASSED
    assert replies(run) == []
    stored = await run.stored()
    assert stored.steps[0].complete_by == START + timedelta(seconds=10)
    assert stopped_at(run, 10)


async def test_without_step_max_the_call_stops_at_its_complete_by_and_beats_nothing() -> None:
    run = await running(call_seconds=18, step_max=None)
    reads = run.store.operations["read"]
    assert await perform_step(run.deps(), run.request) is Performed.COMPLETE_BY_PASSED
    assert run.store.operations["read"] == reads
    assert stopped_at(run, 6)


async def test_a_lost_race_reads_again_once_and_the_beat_goes_through() -> None:
    run = await running(call_seconds=18, conflicts=1)
    assert await perform_step(run.deps(), run.request) is Performed.SUCCEEDED
    assert (await run.stored()).steps[0].step_heartbeats >= 4


async def test_two_lost_races_end_the_beats_at_the_last_known_complete_by() -> None:
    run = await running(call_seconds=18, conflicts=2)
    assert await perform_step(run.deps(), run.request) is Performed.COMPLETE_BY_PASSED
    assert (await run.stored()).steps[0].step_heartbeats == 0
    assert stopped_at(run, 6)


async def test_a_store_outage_ends_the_beats_and_the_agent_answers_nothing() -> None:
    run = await running(call_seconds=18)
    run.store.down = True
    assert await perform_step(run.deps(), run.request) is Performed.COMPLETE_BY_PASSED
    assert replies(run) == []
    assert stopped_at(run, 6)


async def test_a_stale_attempt_stops_beating_once_the_order_moved_on() -> None:
    run = await running(call_seconds=18)
    stale = replace(run.request, attempt=run.request.attempt - 1)
    assert await perform_step(run.deps(), stale) is Performed.COMPLETE_BY_PASSED
    assert (await run.stored()).steps[0].step_heartbeats == 0


async def test_the_sweep_reschedules_a_beaten_order_to_its_new_complete_by() -> None:
    run = await running(call_seconds=18)
    await sweep(run.world.deps())
    assert await perform_step(run.deps(), run.request) is Performed.SUCCEEDED
    beaten = (await run.stored()).steps[0].complete_by
    run.store.conflicts = 0
    report = await sweep(run.world.deps())
    assert report.recovered == 0
    assert run.store.watched()["o-1"] == beaten
