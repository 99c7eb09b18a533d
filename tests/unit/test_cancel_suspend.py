"""Cancel, suspend and resume through the use cases, on in-memory adapters and a fake clock."""

from __future__ import annotations

import asyncio

import pytest

from shared.contract import Queue, agent_queue
from shared.domain.machine.transition import InvalidTransition
from shared.domain.model import OrderProcess, Outcome, Outgoing, ProcessState, StepStatus
from shared.usecases.flow import scheduler
from shared.usecases.flow.scheduler import Handled
from shared.usecases.flow.submission import submit_order
from shared.usecases.flow.supervisor import sweep
from shared.usecases.operations.operator import (
    OrderNotFound,
    cancel_order,
    resubmit_order,
    resume_order,
    suspend_order,
)
from tests.builders import World, a_policy, a_reply, an_order

AGENT_QUEUES = (agent_queue("inventory"), agent_queue("payment"), agent_queue("shipping"))


def agent_requests(world: World) -> list[Outgoing]:
    return [m for q in AGENT_QUEUES for m in world.bus.take(q)]


def statuses(world: World, order_id: str = "o-1") -> list[str]:
    return [
        m.body["status"] for m in world.bus.on(Queue.ORDER_STATUS) if m.body["orderId"] == order_id
    ]


async def claimed(world: World, order_id: str = "o-1") -> None:
    """Stored already claimed, as the composed app's intake does: no nudge."""
    await submit_order(world.deps(), an_order(order_id))
    assert world.bus.on(Queue.SCHEDULER) == []


async def complete_steps(world: World, n: int) -> Outgoing | None:
    """Answer `n` forward steps `succeeded`; return the request that is running then."""
    for _ in range(n):
        (request,) = agent_requests(world)
        await scheduler.on_reply(world.deps(), a_reply(request))
    running = agent_requests(world)
    return running[0] if running else None


async def nudges(world: World) -> None:
    for nudge in world.bus.take(Queue.SCHEDULER) + world.bus.take("scheduler-high"):
        await scheduler.on_nudge(world.deps(), nudge.body["orderId"], nudge.message_id)


async def undo_all(world: World) -> list[tuple[str, str]]:
    """Claim what was requeued and answer every compensation `succeeded`."""
    undone: list[tuple[str, str]] = []
    await nudges(world)
    while requests := agent_requests(world):
        for request in requests:
            assert request.body["action"] == "compensate", request.body
            undone.append((request.body["step"], request.body["idempotencyKey"]))
            await scheduler.on_reply(world.deps(), a_reply(request))
        await nudges(world)
    return undone


async def load(world: World, order_id: str = "o-1") -> OrderProcess:
    process = await world.store.load(order_id)
    assert process is not None
    return process


# --- cancel -----------------------------------------------------------------------------


async def test_cancel_of_a_pending_order_dispatches_nothing_and_ends_cancelled() -> None:
    world = World()  # not claimed at intake, as past the intake's burst
    await submit_order(world.deps(claim_at_intake=False), an_order("o-1"))
    answer = await cancel_order(world.deps(), "o-1", "op", "customer asked")
    assert answer.state.process_state is ProcessState.PENDING
    assert answer.state.cancel_requested
    assert await undo_all(world) == []
    final = await load(world)
    assert final.state.process_state is ProcessState.CANCELLED
    assert statuses(world) == ["Received", "Cancelled"]
    assert "o-1" not in world.store.watched()
    events = [h.event for h in await world.store.history("o-1")]
    assert "cancel-requested" in events and events[-1] == "cancelled"


async def test_cancel_mid_step_waits_for_its_reply_then_undoes_it_too() -> None:
    world = World()
    await claimed(world)
    payment = await complete_steps(world, 1)
    assert payment is not None
    answer = await cancel_order(world.deps(), "o-1", "op")
    assert answer.state.process_state is ProcessState.COMPENSATING
    assert answer.steps[1].status is StepStatus.RUNNING
    assert agent_requests(world) == []  # nothing new while the step runs
    await scheduler.on_reply(world.deps(), a_reply(payment))
    undone = await undo_all(world)
    assert undone == [
        ("charge-payment", "o-1:refund-payment"),
        ("reserve-inventory", "o-1:release-inventory"),
    ]
    final = await load(world)
    assert final.state.process_state is ProcessState.CANCELLED
    assert statuses(world)[-1] == "Cancelled"
    assert "Compensated" not in statuses(world)


async def test_cancel_mid_step_whose_reply_says_failed_undoes_only_the_steps_before() -> None:
    world = World()
    await claimed(world)
    payment = await complete_steps(world, 1)
    assert payment is not None
    await cancel_order(world.deps(), "o-1", "op")
    await scheduler.on_reply(world.deps(), a_reply(payment, Outcome.FAILED))
    assert await undo_all(world) == [("reserve-inventory", "o-1:release-inventory")]
    final = await load(world)
    assert final.state.process_state is ProcessState.CANCELLED
    assert [s.status for s in final.steps] == [
        StepStatus.COMPENSATED,
        StepStatus.FAILED,
        StepStatus.NOT_STARTED,
    ]
    assert "Failed" not in statuses(world)


async def test_cancel_mid_step_that_never_answers_undoes_it_once_no_request_can_apply() -> None:
    world = World()
    await claimed(world)
    assert await complete_steps(world, 1) is not None
    await cancel_order(world.deps(), "o-1", "op")
    world.clock.advance(29)
    assert (await sweep(world.deps())).recovered == 0
    world.clock.advance(2)
    assert (await sweep(world.deps())).recovered == 1
    assert world.bus.take(Queue.SCHEDULER) == []  # the charge may still apply until T0+35
    assert agent_requests(world) == []
    world.clock.advance(5)
    assert (await sweep(world.deps())).recovered == 1  # no request can apply any more
    (nudge,) = world.bus.take(Queue.SCHEDULER)
    await scheduler.on_nudge(world.deps(), "o-1", nudge.message_id)
    (undo,) = agent_requests(world)
    assert undo.body["undoes"] == "o-1:charge-payment"
    assert undo.body["step"] == "charge-payment" and undo.body["action"] == "compensate"
    assert undo.body["operation"] == "refund-payment"  # the pinned version's, never guessed
    assert undo.body["payload"] == {"result": {}}  # in doubt: no result to pass on
    await scheduler.on_reply(world.deps(), a_reply(undo))
    assert await undo_all(world) == [("reserve-inventory", "o-1:release-inventory")]
    assert (await load(world)).state.process_state is ProcessState.CANCELLED


async def test_replies_of_an_older_attempt_change_nothing_after_a_cancel() -> None:
    world = World()
    await claimed(world)
    payment = await complete_steps(world, 1)
    assert payment is not None
    world.clock.advance(31)
    await cancel_order(world.deps(), "o-1", "op")  # in doubt, and live until T0+35
    await nudges(world)
    assert agent_requests(world) == []
    late = a_reply(payment)
    assert await scheduler.on_reply(world.deps(), late) is Handled.STALE
    world.clock.advance(5)
    await sweep(world.deps())
    await nudges(world)
    (undo,) = agent_requests(world)
    assert undo.body["attempt"] == 3 and undo.body["undoes"] == "o-1:charge-payment"
    await scheduler.on_reply(world.deps(), a_reply(undo))
    assert await scheduler.on_reply(world.deps(), a_reply(undo)) is Handled.STALE
    assert await undo_all(world) == [("reserve-inventory", "o-1:release-inventory")]
    assert await scheduler.on_reply(world.deps(), late) is Handled.STALE
    assert (await load(world)).state.process_state is ProcessState.CANCELLED


async def test_a_duplicate_reply_after_the_cancel_took_it_is_stale() -> None:
    world = World()
    await claimed(world)
    inventory = await complete_steps(world, 0)
    assert inventory is not None
    await cancel_order(world.deps(), "o-1", "op")
    assert await scheduler.on_reply(world.deps(), a_reply(inventory)) is Handled.APPLIED
    assert await scheduler.on_reply(world.deps(), a_reply(inventory)) is Handled.STALE
    assert await undo_all(world) == [("reserve-inventory", "o-1:release-inventory")]


async def test_cancel_twice_and_at_once_is_one_cancel() -> None:
    world = World()
    await claimed(world)
    await complete_steps(world, 1)
    first, second = await asyncio.gather(
        cancel_order(world.deps(), "o-1", "op-a"), cancel_order(world.deps(), "o-1", "op-b")
    )
    assert first.state.version == second.state.version
    again = await cancel_order(world.deps(), "o-1", "op-c")
    assert again.state.version == first.state.version
    events = [h.event for h in await world.store.history("o-1")]
    assert events.count("cancel-requested") == 1


async def test_cancel_racing_the_supervisor_still_undoes_every_effect() -> None:
    world = World()
    await claimed(world)
    await complete_steps(world, 2)  # shipping runs
    world.clock.advance(31)
    await asyncio.gather(sweep(world.deps()), cancel_order(world.deps(), "o-1", "op"))
    for _ in range(3):
        world.clock.advance(31)
        await sweep(world.deps())
        await nudges(world)
        if any(world.bus.on(q) for q in AGENT_QUEUES):
            break
    undone = await undo_all(world)
    assert [step for step, _ in undone] == [
        "create-shipment",
        "charge-payment",
        "reserve-inventory",
    ]
    assert (await load(world)).state.process_state is ProcessState.CANCELLED


async def test_cancel_of_an_error_order_undoes_the_step_in_doubt_and_the_completed_ones() -> None:
    world = World(policy=a_policy(max_failure_count=1))
    await claimed(world)
    await complete_steps(world, 1)  # payment hangs
    world.clock.advance(31)
    await sweep(world.deps())
    error = await load(world)
    assert error.state.process_state is ProcessState.ERROR
    answer = await cancel_order(world.deps(), "o-1", "op")
    assert answer.state.failure_count == 0
    assert "o-1" in world.store.watched()
    await nudges(world)
    assert agent_requests(world) == []  # the charge may still apply until T0+35
    world.clock.advance(5)
    await sweep(world.deps())
    undone = await undo_all(world)
    assert [step for step, _ in undone] == ["charge-payment", "reserve-inventory"]
    assert (await load(world)).state.process_state is ProcessState.CANCELLED


async def test_cancel_during_compensation_finishes_it_and_ends_cancelled() -> None:
    world = World()
    await claimed(world)
    shipping = await complete_steps(world, 2)
    assert shipping is not None
    await scheduler.on_reply(world.deps(), a_reply(shipping, Outcome.FAILED))
    (refund,) = agent_requests(world)
    answer = await cancel_order(world.deps(), "o-1", "op")
    assert answer.state.process_state is ProcessState.COMPENSATING
    assert answer.state.attempt == 1  # the refund in flight stays the one awaited
    await scheduler.on_reply(world.deps(), a_reply(refund))
    assert await undo_all(world) == [("reserve-inventory", "o-1:release-inventory")]
    assert (await load(world)).state.process_state is ProcessState.CANCELLED
    assert statuses(world)[-2:] == ["Failed", "Cancelled"]


async def test_cancel_after_a_compensation_failed_tries_it_again() -> None:
    world = World()
    await claimed(world)
    payment = await complete_steps(world, 1)
    assert payment is not None
    await scheduler.on_reply(world.deps(), a_reply(payment, Outcome.FAILED))
    (release,) = agent_requests(world)
    await scheduler.on_reply(world.deps(), a_reply(release, Outcome.FAILED))
    assert (await load(world)).state.process_state is ProcessState.ERROR
    await cancel_order(world.deps(), "o-1", "op")
    # The failed release was refused for good, and a provider replays that to its key.
    assert await undo_all(world) == [("reserve-inventory", "o-1:release-inventory:r2")]
    assert (await load(world)).state.process_state is ProcessState.CANCELLED


@pytest.mark.parametrize("outcome", ["processed", "compensated", "cancelled"])
async def test_cancel_is_refused_once_final(outcome: str) -> None:
    world = World()
    await claimed(world)
    if outcome == "processed":
        assert await complete_steps(world, 3) is None
    elif outcome == "compensated":
        (inventory,) = agent_requests(world)
        await scheduler.on_reply(world.deps(), a_reply(inventory, Outcome.FAILED))
    else:
        await cancel_order(world.deps(), "o-1", "op")
        (inventory,) = agent_requests(world)
        await scheduler.on_reply(world.deps(), a_reply(inventory))
        await undo_all(world)
    with pytest.raises(InvalidTransition):
        await cancel_order(world.deps(), "o-1", "op")
    with pytest.raises(InvalidTransition):
        await suspend_order(world.deps(), "o-1", "op")


async def test_operator_actions_on_an_unknown_order() -> None:
    world = World()
    for action in (cancel_order, suspend_order, resume_order):
        with pytest.raises(OrderNotFound):
            await action(world.deps(), "nope", "op")


# --- suspend and resume -------------------------------------------------------------------


async def test_suspended_order_records_the_running_steps_reply_and_dispatches_nothing() -> None:
    world = World()
    await claimed(world)
    inventory = await complete_steps(world, 0)
    assert inventory is not None
    suspended = await suspend_order(world.deps(), "o-1", "op")
    assert suspended.state.process_state is ProcessState.SUSPENDED
    assert "o-1" not in world.store.watched()
    assert await scheduler.on_reply(world.deps(), a_reply(inventory)) is Handled.APPLIED
    assert agent_requests(world) == []
    held = await load(world)
    assert held.state.process_state is ProcessState.SUSPENDED
    assert held.steps[0].status is StepStatus.COMPLETED
    resumed = await resume_order(world.deps(), "o-1", "op")
    assert resumed.state.process_state is ProcessState.PENDING
    await nudges(world)
    (payment,) = agent_requests(world)
    assert payment.body["step"] == "charge-payment"
    assert statuses(world)[-2:] == ["Suspended", "Resumed"]


async def test_deadlines_do_not_count_while_suspended() -> None:
    world = World(policy=a_policy(max_failure_count=1))
    await claimed(world)
    await complete_steps(world, 1)
    await suspend_order(world.deps(), "o-1", "op")
    for _ in range(5):
        world.clock.advance(61)
        report = await sweep(world.deps())
        assert report.recovered == 0
    held = await load(world)
    assert held.state.process_state is ProcessState.SUSPENDED
    assert held.state.failure_count == 0
    resumed = await resume_order(world.deps(), "o-1", "op")
    assert resumed.state.failure_count == 0
    assert "o-1" in world.store.watched()
    await nudges(world)
    (payment,) = agent_requests(world)
    # Re-dispatched: same key, the next attempt, a fresh complete-by.
    assert payment.body["idempotencyKey"] == "o-1:charge-payment"
    assert payment.body["attempt"] == 2
    after = await load(world)
    assert after.steps[1].complete_by is not None
    assert after.steps[1].complete_by > world.clock.now()
    assert after.steps[1].attempts == 2


async def test_suspend_is_idempotent_and_resume_needs_suspended() -> None:
    world = World()
    await claimed(world)
    first = await suspend_order(world.deps(), "o-1", "op")
    again = await suspend_order(world.deps(), "o-1", "op")
    assert again.state.version == first.state.version
    await resume_order(world.deps(), "o-1", "op")
    retried = await resume_order(world.deps(), "o-1", "op")  # before the Scheduler claims
    assert retried.state.process_state is ProcessState.PENDING
    await nudges(world)
    with pytest.raises(InvalidTransition):
        await resume_order(world.deps(), "o-1", "op")


async def test_suspend_is_refused_for_an_error_order_and_resubmit_still_works() -> None:
    world = World(policy=a_policy(max_failure_count=1))
    await claimed(world)
    world.clock.advance(31)
    await sweep(world.deps())
    with pytest.raises(InvalidTransition):
        await suspend_order(world.deps(), "o-1", "op")
    await resubmit_order(world.deps(), "o-1", "op")


async def test_suspend_during_compensation_then_resume_continues_it() -> None:
    world = World()
    await claimed(world)
    shipping = await complete_steps(world, 2)
    assert shipping is not None
    await scheduler.on_reply(world.deps(), a_reply(shipping, Outcome.FAILED))
    (refund,) = agent_requests(world)
    await suspend_order(world.deps(), "o-1", "op")
    await scheduler.on_reply(world.deps(), a_reply(refund))
    assert agent_requests(world) == []
    await resume_order(world.deps(), "o-1", "op")
    assert await undo_all(world) == [("reserve-inventory", "o-1:release-inventory")]
    assert (await load(world)).state.process_state is ProcessState.COMPENSATED


async def test_cancel_of_a_suspended_order_waits_for_its_running_step() -> None:
    world = World()
    await claimed(world)
    payment = await complete_steps(world, 1)
    assert payment is not None
    await suspend_order(world.deps(), "o-1", "op")
    answer = await cancel_order(world.deps(), "o-1", "op")
    assert answer.state.process_state is ProcessState.COMPENSATING
    assert "o-1" in world.store.watched()
    await scheduler.on_reply(world.deps(), a_reply(payment))
    undone = await undo_all(world)
    assert [step for step, _ in undone] == ["charge-payment", "reserve-inventory"]
    assert (await load(world)).state.process_state is ProcessState.CANCELLED


async def test_cancel_of_a_suspended_order_whose_step_answered_undoes_at_once() -> None:
    world = World()
    await claimed(world)
    inventory = await complete_steps(world, 0)
    assert inventory is not None
    await suspend_order(world.deps(), "o-1", "op")
    await scheduler.on_reply(world.deps(), a_reply(inventory))
    answer = await cancel_order(world.deps(), "o-1", "op")
    assert answer.state.process_state is ProcessState.PENDING
    assert await undo_all(world) == [("reserve-inventory", "o-1:release-inventory")]
    assert (await load(world)).state.process_state is ProcessState.CANCELLED


async def test_suspending_a_cancel_and_resuming_it_finishes_the_cancel() -> None:
    world = World()
    await claimed(world)
    payment = await complete_steps(world, 1)
    assert payment is not None
    await cancel_order(world.deps(), "o-1", "op")
    await suspend_order(world.deps(), "o-1", "op")
    world.clock.advance(31)  # the payment's complete-by passes while suspended: in doubt
    assert (await sweep(world.deps())).recovered == 0
    await resume_order(world.deps(), "o-1", "op")
    await nudges(world)
    assert agent_requests(world) == []  # the charge may still apply until T0+35
    world.clock.advance(5)
    await sweep(world.deps())
    undone = await undo_all(world)
    assert [step for step, _ in undone] == ["charge-payment", "reserve-inventory"]
    final = await load(world)
    assert final.state.process_state is ProcessState.CANCELLED
    assert [s.status for s in final.steps] == [
        StepStatus.COMPENSATED,
        StepStatus.COMPENSATED,
        StepStatus.NOT_STARTED,
    ]
