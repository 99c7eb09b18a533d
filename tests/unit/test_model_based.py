"""Model-based test: random interleavings of everything that can happen to orders.

Hypothesis drives submissions, claims by several schedulers, agent replies delivered in
order, late, twice or never, supervisor sweeps (two at once), clock jumps, crashes
between a state write and its sends, and operators who resubmit, cancel, suspend and
resume. The invariants hold after every step, and at the
end every order converges to a terminal state once faults stop.
"""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from datetime import datetime

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from shared.adapters.memory.store import Sent
from shared.adapters.queues import queue_of
from shared.contract import Queue, agent_queue
from shared.domain.machine.recovery import next_complete_by
from shared.domain.machine.transition import InvalidTransition
from shared.domain.messages import AgentReply
from shared.domain.model import (
    Action,
    ErrorInfo,
    OrderProcess,
    Outcome,
    Outgoing,
    ProcessState,
    StepStatus,
)
from shared.ports import BusUnavailable
from shared.usecases.flow import scheduler
from shared.usecases.flow.scheduler import Handled
from shared.usecases.flow.submission import submit_order
from shared.usecases.flow.supervisor import sweep
from shared.usecases.operations.operator import (
    cancel_order,
    resubmit_order,
    resume_order,
    suspend_order,
)
from tests.builders import World, a_policy, an_order
from tests.workflows import ORDER_FULFILMENT

AGENT_QUEUES = (agent_queue("inventory"), agent_queue("payment"), agent_queue("shipping"))
ORDER_IDS = [f"m-{i}" for i in range(2)]
STEPS = [s.name for s in ORDER_FULFILMENT.steps]
UNDO = {s.name: s.compensation for s in ORDER_FULFILMENT.steps}
MAX_FAILURES = 3


def run(coro: object) -> object:
    return asyncio.run(coro)  # type: ignore[arg-type]


class OrderProcessMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.world = World(policy=a_policy(max_failure_count=MAX_FAILURES))
        self.inflight: list[Outgoing] = []
        self.failing_step: dict[str, str | None] = {}
        self.applied: dict[str, int] = defaultdict(int)
        self.keys: dict[tuple[str, str], set[str]] = defaultdict(set)
        self.undone: dict[str, list[str]] = defaultdict(list)
        self.history: list[Outgoing] = []

    # --- the network -------------------------------------------------------------

    def _collect(self) -> None:
        self.inflight.extend(self.world.bus.sent)
        self.world.bus.sent.clear()

    def _deliver(self, message: Outgoing) -> None:
        deps = self.world.deps(f"scheduler-{len(self.inflight) % 3}")
        self.history.append(message)
        body = message.body
        if queue_of(message.destination) == Queue.SCHEDULER:
            run(self._guarded(scheduler.on_nudge(deps, body["orderId"], message.message_id)))
        elif queue_of(message.destination) in AGENT_QUEUES:
            self._agent(message)
        elif queue_of(message.destination) == Queue.AGENT_REPLIES:
            reply = AgentReply.parse(json.dumps(body))
            before = run(self.world.store.load(reply.order_id))
            handled = run(self._guarded(scheduler.on_reply(deps, reply, message.message_id)))
            if isinstance(before, OrderProcess) and before.state.attempt != reply.attempt:
                # Only as evidence: a permanent failure is the provider's word on the key,
                # whichever attempt carried it (machine/forward.py `_late_failure`).
                evidence = reply.outcome is Outcome.FAILED and reply.action is Action.DO
                assert handled is Handled.STALE or evidence, (
                    "a reply from another attempt was applied"
                )
        self._collect()

    async def _guarded(self, work: object) -> object:
        try:
            return await work  # type: ignore[misc]
        except BusUnavailable:
            return None  # the host abandons; a redelivery rule may bring the message back

    def _agent(self, request: Outgoing) -> None:
        """The agent and its remote service: idempotent per key, silent past the deadline."""
        body = request.body
        deadline = datetime.fromisoformat(body["completeBy"].replace("Z", "+00:00"))
        if self.world.clock.now() >= deadline:
            return
        order_id, step, action = body["orderId"], body["step"], Action(body["action"])
        key = body["idempotencyKey"]
        operation = key.split(":", 1)[1]
        self.keys[(order_id, operation)].add(key)
        fails = action is Action.DO and self.failing_step.get(order_id) == step
        if not fails and self.applied[key] == 0:
            self.applied[key] += 1
            if action is Action.COMPENSATE:
                self.undone[order_id].append(step)
        outcome = Outcome.FAILED if fails else Outcome.SUCCEEDED
        self.world.bus.sent.append(
            Sent.of(
                AgentReply(
                    order_id=order_id,
                    step=step,
                    action=action,
                    attempt=body["attempt"],
                    outcome=outcome,
                    result={"key": key} if not fails else None,
                    error=ErrorInfo("declined", "no") if fails else None,
                ).outgoing()
            )
        )

    # --- rules -------------------------------------------------------------------

    @rule(
        order_id=st.sampled_from(ORDER_IDS),
        failing=st.sampled_from([None, None, *STEPS]),
        lose_sends=st.booleans(),
    )
    def submit(self, order_id: str, failing: str | None, lose_sends: bool) -> None:
        self.failing_step.setdefault(order_id, failing)
        self.world.bus.fail_next = 1 if lose_sends else 0
        order = an_order(order_id, clock=self.world.clock)
        run(self._guarded(submit_order(self.world.deps(), order)))
        self.world.bus.fail_next = 0
        self._collect()

    @precondition(lambda self: self.inflight)
    @rule(data=st.data())
    def deliver(self, data: st.DataObject) -> None:
        index = data.draw(st.integers(0, len(self.inflight) - 1))
        self._deliver(self.inflight.pop(index))

    @precondition(lambda self: self.inflight)
    @rule(data=st.data())
    def deliver_twice(self, data: st.DataObject) -> None:
        index = data.draw(st.integers(0, len(self.inflight) - 1))
        message = self.inflight[index]
        self._deliver(message)
        self._deliver(message)
        self.inflight.remove(message)

    @precondition(lambda self: self.inflight)
    @rule(data=st.data())
    def lose(self, data: st.DataObject) -> None:
        index = data.draw(st.integers(0, len(self.inflight) - 1))
        self.inflight.pop(index)

    @precondition(lambda self: self.inflight)
    @rule(data=st.data())
    def crash_after_write(self, data: st.DataObject) -> None:
        """The handler stores its transition, then dies before sending; the host redelivers."""
        index = data.draw(st.integers(0, len(self.inflight) - 1))
        message = self.inflight[index]
        self.world.bus.fail_next = 1
        self._deliver(message)
        self.world.bus.fail_next = 0

    @precondition(lambda self: self.history)
    @rule(data=st.data())
    def old_message_arrives_late(self, data: st.DataObject) -> None:
        """Any message seen before comes again much later: a late reply, an old request."""
        self._deliver(data.draw(st.sampled_from(self.history)))

    @rule(seconds=st.sampled_from([1, 5, 31, 61, 200]))
    def clock_jumps(self, seconds: int) -> None:
        self.world.clock.advance(seconds)

    @rule(two=st.booleans())
    def supervisor_sweeps(self, two: bool) -> None:
        async def sweeps() -> None:
            runs = [sweep(self.world.deps()) for _ in range(2 if two else 1)]
            await asyncio.gather(*runs)

        run(self._guarded(sweeps()))
        self._collect()

    @rule(order_id=st.sampled_from(ORDER_IDS))
    def operator_resubmits(self, order_id: str) -> None:
        process = run(self.world.store.load(order_id))
        if isinstance(process, OrderProcess) and process.state.process_state is ProcessState.ERROR:
            run(self._guarded(resubmit_order(self.world.deps(), order_id, "op")))
            self._collect()

    @rule(
        order_id=st.sampled_from(ORDER_IDS),
        action=st.sampled_from(["cancel", "suspend", "resume"]),
        lose_sends=st.booleans(),
    )
    def operator_acts(self, order_id: str, action: str, lose_sends: bool) -> None:
        if not isinstance(run(self.world.store.load(order_id)), OrderProcess):
            return
        act = {"cancel": cancel_order, "suspend": suspend_order, "resume": resume_order}[action]
        self.world.bus.fail_next = 1 if lose_sends else 0
        try:
            run(self._guarded(act(self.world.deps(), order_id, "op")))
        except InvalidTransition:
            event(f"{action} refused")
        self.world.bus.fail_next = 0
        self._collect()

    # --- invariants --------------------------------------------------------------

    def _orders(self) -> list[OrderProcess]:
        found = [run(self.world.store.load(i)) for i in ORDER_IDS]
        return [p for p in found if isinstance(p, OrderProcess)]

    @invariant()
    def state_record_is_consistent(self) -> None:
        watched = self.world.store.watched()
        for p in self._orders():
            state = p.state
            assert 0 <= state.failure_count <= MAX_FAILURES
            held = state.process_state in (ProcessState.PROCESSING, ProcessState.COMPENSATING)
            if state.locked_by is not None:
                assert held, state
            if held and not state.cancel_requested:
                # A cancel that waits for a suspended order's running step holds no lock.
                assert state.locked_by is not None, state
            running = [i for i, s in enumerate(p.steps) if s.status is StepStatus.RUNNING]
            assert len(running) <= 1
            if running:
                assert state.process_state in (
                    ProcessState.PROCESSING,
                    ProcessState.SUSPENDED,
                    ProcessState.COMPENSATING,
                ), state
                if state.process_state is ProcessState.COMPENSATING:
                    assert state.cancel_requested
                assert running == [state.current_step]
            if state.process_state is ProcessState.PROCESSED:
                assert all(s.status is StepStatus.COMPLETED for s in p.steps)
            if state.process_state is ProcessState.COMPENSATED:
                assert not any(s.status is StepStatus.COMPLETED for s in p.steps)
            if state.process_state is ProcessState.CANCELLED:
                assert all(
                    s.status in (StepStatus.COMPENSATED, StepStatus.FAILED) or s.attempts == 0
                    for s in p.steps
                ), p.steps
            if not state.process_state.is_at_rest:
                deadline = next_complete_by(p, self.world.policy)
                assert p.order_id in watched, f"{p.order_id} is in flight but unwatched"
                assert deadline is not None and watched[p.order_id] <= deadline

    @invariant()
    def effects_are_applied_once_under_one_key(self) -> None:
        assert all(n == 1 for n in self.applied.values())
        for (order_id, operation), keys in self.keys.items():
            assert keys == {f"{order_id}:{operation}"}

    @invariant()
    def a_cancelled_order_has_no_effect_applied_and_not_undone(self) -> None:
        for p in self._orders():
            if p.state.process_state is ProcessState.CANCELLED:
                for step in STEPS:
                    if self.applied.get(f"{p.order_id}:{step}"):
                        assert self.applied.get(f"{p.order_id}:{UNDO[step]}"), (step, p.steps)

    @invariant()
    def compensation_undoes_completed_steps_in_reverse(self) -> None:
        for undone in self.undone.values():
            assert undone == sorted(set(undone), key=STEPS.index, reverse=True)

    def teardown(self) -> None:
        """Faults stop, operators resume what they suspended: everything converges to
        Processed, Compensated, Cancelled or Error."""
        for p in self._orders():
            if p.state.process_state is ProcessState.SUSPENDED:
                run(resume_order(self.world.deps(), p.order_id, "op"))
        for _ in range(200):
            self._collect()
            while self.inflight:
                self._deliver(self.inflight.pop(0))
            orders = self._orders()
            if all(p.state.process_state.is_at_rest for p in orders):
                break
            self.world.clock.advance(31)
            run(sweep(self.world.deps()))
            self._collect()
        for p in self._orders():
            event(f"ended {p.state.process_state.value}")
            event(f"attempts reached {min(p.state.attempt, 3)}")
            assert p.state.process_state.is_at_rest, p.state
            assert p.state.process_state is not ProcessState.SUSPENDED
            if p.state.process_state in (ProcessState.COMPENSATED, ProcessState.CANCELLED):
                expected = [s.name for s in p.steps if s.status is StepStatus.COMPENSATED]
                assert sorted(self.undone[p.order_id]) == sorted(expected)


OrderProcessMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestOrderProcessModel = OrderProcessMachine.TestCase


class DeepOrderProcessMachine(OrderProcessMachine):
    """The same model, searched ten times longer (`bin/test -m slow`)."""


DeepOrderProcessMachine.TestCase.settings = settings(
    max_examples=1000,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestOrderProcessModelDeep = pytest.mark.slow(DeepOrderProcessMachine.TestCase)
