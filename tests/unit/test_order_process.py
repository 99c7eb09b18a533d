"""The order process through its use cases, on in-memory adapters and a fake clock."""

from __future__ import annotations

import pytest

from shared.adapters.memory.store import Sent
from shared.contract import Queue, agent_queue
from shared.domain.machine.transition import InvalidTransition
from shared.domain.model import (
    Action,
    ExhaustedPolicy,
    NotificationStatus,
    Outcome,
    Phase,
    ProcessState,
    StepStatus,
)
from shared.ports import BusUnavailable
from shared.usecases.flow import scheduler
from shared.usecases.flow.scheduler import Handled
from shared.usecases.flow.submission import OrderConflict, submit_order
from shared.usecases.flow.supervisor import sweep
from shared.usecases.operations.operator import OrderNotFound, resubmit_order
from tests.builders import World, a_policy, a_reply, an_order

AGENT_QUEUES = (agent_queue("inventory"), agent_queue("payment"), agent_queue("shipping"))


def agent_requests(world: World) -> list[Sent]:
    return [m for q in AGENT_QUEUES for m in world.bus.take(q)]


def statuses(world: World, order_id: str) -> list[str]:
    return [
        m.body["status"] for m in world.bus.on(Queue.ORDER_STATUS) if m.body["orderId"] == order_id
    ]


async def submit_and_claim(world: World, order_id: str = "o-1") -> str:
    """Stored already claimed, as the composed app's intake does: no nudge."""
    await submit_order(world.deps(), an_order(order_id))
    assert world.bus.on(Queue.SCHEDULER) == []
    return order_id


async def test_submission_stores_pending_order_with_not_started_steps_and_nudges() -> None:
    world = World()  # an order not claimed at intake, as past the intake's burst
    result = await submit_order(world.deps(claim_at_intake=False), an_order("o-1"))
    stored = await world.store.load("o-1")
    assert result.created and stored is not None
    assert stored.state.process_state is ProcessState.PENDING
    assert stored.state.locked_by is None and stored.state.complete_by is None
    assert stored.state.failure_count == 0
    assert [s.status for s in stored.steps] == [StepStatus.NOT_STARTED] * 3
    assert [m.body["orderId"] for m in world.bus.on(Queue.SCHEDULER)] == ["o-1"]
    assert statuses(world, "o-1") == ["Received"]
    assert "o-1" in world.store.watched()


async def test_same_order_twice_is_one_order_and_a_different_body_conflicts() -> None:
    world = World()
    await submit_order(world.deps(), an_order("o-1", fingerprint="a"))
    again = await submit_order(world.deps(), an_order("o-1", fingerprint="a"))
    assert not again.created
    assert len(agent_requests(world)) == 1  # the repeat request is the same message id
    with pytest.raises(OrderConflict):
        await submit_order(world.deps(), an_order("o-1", fingerprint="b"))


async def test_happy_path_runs_steps_in_order_and_ends_processed_unlocked() -> None:
    world = World()
    await submit_and_claim(world)
    seen = []
    while requests := agent_requests(world):
        (request,) = requests
        seen.append((request.queue, request.body["step"], request.body["attempt"]))
        await scheduler.on_reply(world.deps(), a_reply(request))
    assert seen == [
        (agent_queue("inventory"), "reserve-inventory", 1),
        (agent_queue("payment"), "charge-payment", 1),
        (agent_queue("shipping"), "create-shipment", 1),
    ]
    done = await world.store.load("o-1")
    assert done is not None
    assert done.state.process_state is ProcessState.PROCESSED
    assert done.state.locked_by is None
    assert [s.status for s in done.steps] == [StepStatus.COMPLETED] * 3
    assert done.steps[1].result == {"ref": "charge-payment-result"}
    assert statuses(world, "o-1") == ["Received", "Processing", "Processed"]
    assert "o-1" not in world.store.watched()


async def test_claim_sets_lock_deadline_and_attempt_and_dispatches_with_stable_key() -> None:
    world = World()
    await submit_and_claim(world)
    claimed = await world.store.load("o-1")
    assert claimed is not None
    assert claimed.state.locked_by == "scheduler-1"
    assert claimed.state.process_state is ProcessState.PROCESSING
    assert claimed.state.attempt == 1
    deadline = world.clock.now() + world.policy.step_timeout
    assert claimed.state.complete_by == deadline
    assert claimed.steps[0].status is StepStatus.RUNNING
    assert claimed.steps[0].complete_by == deadline
    (request,) = agent_requests(world)
    assert request.body["idempotencyKey"] == "o-1:reserve-inventory"
    assert request.body["completeBy"] == deadline.isoformat().replace("+00:00", "Z")


async def test_second_nudge_for_a_claimed_order_changes_nothing() -> None:
    world = World()
    await submit_and_claim(world)
    before = await world.store.load("o-1")
    assert await scheduler.on_nudge(world.deps("scheduler-2"), "o-1") is Handled.STALE
    after = await world.store.load("o-1")
    assert before == after


async def test_reply_from_an_older_attempt_is_fenced_off() -> None:
    world = World()
    await submit_and_claim(world)
    (first,) = agent_requests(world)
    world.clock.advance(31)
    await sweep(world.deps())  # step timed out: requeued
    world.clock.advance(5)
    await scheduler.on_nudge(world.deps(), "o-1")  # attempt 2
    (second,) = agent_requests(world)
    assert second.body["attempt"] == 2
    assert second.body["idempotencyKey"] == first.body["idempotencyKey"]
    late = a_reply(first)
    assert await scheduler.on_reply(world.deps(), late) is Handled.STALE
    state = await world.store.load("o-1")
    assert state is not None and state.steps[0].status is StepStatus.RUNNING
    assert await scheduler.on_reply(world.deps(), a_reply(second)) is Handled.APPLIED


async def test_duplicate_reply_is_applied_once() -> None:
    world = World()
    await submit_and_claim(world)
    (request,) = agent_requests(world)
    reply = a_reply(request)
    assert await scheduler.on_reply(world.deps(), reply) is Handled.APPLIED
    assert await scheduler.on_reply(world.deps(), reply) is Handled.STALE
    assert len(agent_requests(world)) == 1  # only the next step's request


async def test_permanent_failure_compensates_completed_steps_in_reverse_order() -> None:
    world = World()
    await submit_and_claim(world)
    for _ in range(2):
        (request,) = agent_requests(world)
        await scheduler.on_reply(world.deps(), a_reply(request))
    (shipping,) = agent_requests(world)
    await scheduler.on_reply(world.deps(), a_reply(shipping, Outcome.FAILED))
    undo = []
    while requests := agent_requests(world):
        (request,) = requests
        assert request.body["action"] == Action.COMPENSATE.value
        undo.append((request.body["step"], request.body["idempotencyKey"]))
        assert request.body["payload"] == {"result": {"ref": f"{request.body['step']}-result"}}
        await scheduler.on_reply(world.deps(), a_reply(request))
    assert undo == [
        ("charge-payment", "o-1:refund-payment"),
        ("reserve-inventory", "o-1:release-inventory"),
    ]
    final = await world.store.load("o-1")
    assert final is not None
    assert final.state.process_state is ProcessState.COMPENSATED
    assert [s.status for s in final.steps] == [
        StepStatus.COMPENSATED,
        StepStatus.COMPENSATED,
        StepStatus.FAILED,
    ]
    assert statuses(world, "o-1")[-2:] == ["Failed", "Compensated"]


async def test_failure_at_first_step_compensates_nothing() -> None:
    world = World()
    await submit_and_claim(world)
    (request,) = agent_requests(world)
    await scheduler.on_reply(world.deps(), a_reply(request, Outcome.FAILED))
    final = await world.store.load("o-1")
    assert final is not None and final.state.process_state is ProcessState.COMPENSATED
    assert agent_requests(world) == []


async def test_expired_step_is_requeued_with_backoff_and_fresh_deadline() -> None:
    world = World()
    await submit_and_claim(world)
    world.clock.advance(29)
    assert (await sweep(world.deps())).recovered == 0
    world.clock.advance(2)
    report = await sweep(world.deps())
    assert report.requeued == 1
    state = await world.store.load("o-1")
    assert state is not None
    assert state.state.process_state is ProcessState.PENDING
    assert state.state.failure_count == 1 and state.state.locked_by is None
    assert state.state.complete_by is not None and state.state.complete_by > world.clock.now()
    assert state.steps[0].status is StepStatus.NOT_STARTED
    (nudge,) = world.bus.take(Queue.SCHEDULER)
    assert nudge.deliver_at is not None and nudge.deliver_at > world.clock.now()


async def test_threshold_moves_order_to_error_and_alerts_operator() -> None:
    world = World(policy=a_policy(max_failure_count=2))
    await submit_and_claim(world)
    for _ in range(2):
        world.clock.advance(31)
        await sweep(world.deps())
        world.clock.advance(5)
        await scheduler.on_nudge(world.deps(), "o-1")
    state = await world.store.load("o-1")
    assert state is not None
    assert state.state.process_state is ProcessState.ERROR
    assert state.state.failure_count == 2
    (alert,) = world.bus.on(Queue.OPERATOR_ALERTS)
    assert alert.body["reason"] == "max-failure-count-reached"
    assert alert.body["failureCount"] == 2
    assert "reserve-inventory not completed by" in alert.body["lastError"]
    assert "o-1" not in world.store.watched()


async def test_exhausted_policy_compensate_undoes_the_in_doubt_step_then_completed_ones() -> None:
    world = World(policy=a_policy(max_failure_count=1, exhausted=ExhaustedPolicy.COMPENSATE))
    await submit_and_claim(world)
    (inventory,) = agent_requests(world)
    await scheduler.on_reply(world.deps(), a_reply(inventory))
    agent_requests(world)  # payment hangs: it may have charged
    world.clock.advance(31)
    report = await sweep(world.deps())
    assert report.compensating == 1
    world.clock.advance(2)
    await scheduler.on_nudge(world.deps(), "o-1")
    assert agent_requests(world) == []  # the charge may still apply until T0+35: no refund
    world.clock.advance(3)
    await sweep(world.deps())  # past its live time: the refund meets the charge as it is
    for step in ("charge-payment", "reserve-inventory"):
        world.clock.advance(3)
        await scheduler.on_nudge(world.deps(), "o-1")
        (undo,) = agent_requests(world)
        assert (undo.body["step"], undo.body["action"]) == (step, "compensate")
        await scheduler.on_reply(world.deps(), a_reply(undo))
    final = await world.store.load("o-1")
    assert final is not None and final.state.process_state is ProcessState.COMPENSATED
    assert len(world.bus.on(Queue.OPERATOR_ALERTS)) == 1


async def test_resubmit_resumes_at_failed_step_without_redoing_completed_ones() -> None:
    world = World(policy=a_policy(max_failure_count=1))
    await submit_and_claim(world)
    (inventory,) = agent_requests(world)
    await scheduler.on_reply(world.deps(), a_reply(inventory))
    agent_requests(world)
    world.clock.advance(31)
    await sweep(world.deps())
    with pytest.raises(OrderNotFound):
        await resubmit_order(world.deps(), "no-such-order", "alice")
    state = await world.store.load("o-1")
    assert state is not None and state.state.process_state is ProcessState.ERROR
    await resubmit_order(world.deps(), "o-1", "alice")
    resumed = await world.store.load("o-1")
    assert resumed is not None
    assert resumed.state.process_state is ProcessState.PENDING
    assert resumed.state.failure_count == 0
    await scheduler.on_nudge(world.deps(), "o-1")
    (request,) = agent_requests(world)
    assert request.body["step"] == "charge-payment"
    assert resumed.steps[0].attempts == 1


async def test_resubmit_is_refused_unless_error() -> None:
    world = World()
    await submit_and_claim(world)
    with pytest.raises(InvalidTransition):
        await resubmit_order(world.deps(), "o-1", "alice")


async def test_pending_order_whose_nudge_was_lost_is_nudged_again() -> None:
    world = World()
    world.bus.fail_next = 1
    await submit_order(world.deps(), an_order("o-1"))  # stored, nudge lost
    assert world.bus.on(Queue.SCHEDULER) == []
    world.clock.advance(61)
    report = await sweep(world.deps())
    assert report.requeued == 1
    (nudge,) = world.bus.on(Queue.SCHEDULER)
    assert nudge.body["orderId"] == "o-1"


async def test_redelivered_message_resends_the_outbox_it_produced() -> None:
    world = World()
    await submit_and_claim(world)
    for _ in range(2):
        (request,) = agent_requests(world)
        await scheduler.on_reply(world.deps(), a_reply(request))
    (shipping,) = agent_requests(world)
    world.bus.fail_next = 1
    with pytest.raises(Exception, match="injected"):
        await scheduler.on_reply(world.deps(), a_reply(shipping), message_id="m-1")
    assert "Processed" not in statuses(world, "o-1")
    # the host redelivers the same message: the change is stored, its outbox is re-sent
    assert await scheduler.on_reply(world.deps(), a_reply(shipping), "m-1") is Handled.STALE
    assert statuses(world, "o-1")[-1] == "Processed"


async def test_notifications_go_to_the_orders_reply_queue() -> None:
    world = World()
    await submit_order(world.deps(), an_order("o-1", reply_to="client-a"))
    assert [m.body["status"] for m in world.bus.on("client-a")] == [
        NotificationStatus.RECEIVED.value,
        NotificationStatus.PROCESSING.value,
    ]


async def test_compensation_that_fails_permanently_holds_for_operator() -> None:
    world = World()
    await submit_and_claim(world)
    (inventory,) = agent_requests(world)
    await scheduler.on_reply(world.deps(), a_reply(inventory))
    (payment,) = agent_requests(world)
    await scheduler.on_reply(world.deps(), a_reply(payment, Outcome.FAILED))
    (release,) = agent_requests(world)
    await scheduler.on_reply(world.deps(), a_reply(release, Outcome.FAILED))
    state = await world.store.load("o-1")
    assert state is not None
    assert state.state.process_state is ProcessState.ERROR
    assert state.state.phase is Phase.COMPENSATE
    (alert,) = world.bus.on(Queue.OPERATOR_ALERTS)
    assert alert.body["reason"] == "compensation-failed"


async def test_one_failing_check_does_not_stop_the_sweep() -> None:
    world = World()
    await submit_and_claim(world, "o-1")
    await submit_and_claim(world, "o-2")
    world.clock.advance(31)
    world.bus.fail_next = 1  # the first recovery's nudge cannot be sent
    report = await sweep(world.deps())
    assert report.failed == 1 and report.requeued == 1
    states = [await world.store.load(i) for i in ("o-1", "o-2")]
    # a timeout is stored only once its retry is sent: the first is counted next sweep
    assert sorted(s.state.failure_count for s in states if s is not None) == [0, 1]
    assert all(i in world.store.watched() for i in ("o-1", "o-2"))


async def test_resubmit_retried_after_a_lost_nudge_sends_it_again() -> None:
    world = World(policy=a_policy(max_failure_count=1))
    await submit_and_claim(world)
    agent_requests(world)
    world.clock.advance(31)
    await sweep(world.deps())
    world.bus.take(Queue.SCHEDULER)
    world.bus.fail_next = 1
    with pytest.raises(BusUnavailable):
        await resubmit_order(world.deps(), "o-1", "alice")
    assert world.bus.on(Queue.SCHEDULER) == []
    again = await resubmit_order(world.deps(), "o-1", "alice")
    assert again.state.process_state is ProcessState.PENDING
    (nudge,) = world.bus.take(Queue.SCHEDULER)
    assert nudge.body == {"orderId": "o-1", "reason": "resubmitted"}
    assert await scheduler.on_nudge(world.deps(), "o-1") is Handled.APPLIED
    with pytest.raises(InvalidTransition):
        await resubmit_order(world.deps(), "o-1", "alice")
