"""Steps that wait for the world (docs/catalogue.md), on the shipped `reviewed-order`
(an approval event) and `scheduled-delivery` (a timer on the order's notBefore)."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest

from shared.contract import Queue, agent_queue
from shared.domain.failures import Failure, failure_of
from shared.domain.machine.events import (
    InvalidEventData,
    NoApprovalWaiting,
    NotAnApproval,
    NotAwaited,
)
from shared.domain.machine.transition import InvalidTransition
from shared.domain.model import Order, OrderProcess, Outgoing, ProcessState, StepStatus
from shared.domain.workflow import OnDeadline
from shared.usecases.flow import scheduler
from shared.usecases.flow.submission import submit_order
from shared.usecases.flow.supervisor import sweep
from shared.usecases.operations.events import answer_approval, send_event
from shared.usecases.operations.operator import cancel_order, resume_order, suspend_order
from tests.builders import World, a_reply, an_order
from tests.workflows import CATALOGUE, REVIEWED_ORDER, SCHEDULED_DELIVERY, running

APPROVED = {"approved": True, "by": "ana"}
REJECTED = {"approved": False, "by": "ana", "comment": "looks like fraud"}


async def reach_review(world: World, order_id: str = "o-1") -> None:
    deps = world.deps()
    await submit_order(deps, an_order(order_id, clock=world.clock), workflow=REVIEWED_ORDER)
    (reserve,) = world.bus.take(agent_queue("inventory"))
    await scheduler.on_reply(deps, a_reply(reserve))


async def loaded(world: World, order_id: str = "o-1") -> OrderProcess:
    process = await world.store.load(order_id)
    assert process is not None
    return process


async def nudges(world: World) -> None:
    for nudge in world.bus.take(Queue.SCHEDULER):
        await scheduler.on_nudge(world.deps(), nudge.body["orderId"], nudge.message_id)


async def test_a_review_step_waits_with_no_agent_and_its_deadline_on_the_watch_list() -> None:
    world = World()
    await reach_review(world)
    process = await loaded(world)
    step = process.steps[1]
    assert (step.name, step.status, step.agent) == ("manual-review", StepStatus.RUNNING, None)
    assert step.complete_by == world.clock.now() + timedelta(days=1)
    assert process.state.complete_by == step.complete_by
    assert world.bus.take(agent_queue("payment")) == []
    world.clock.advance(31)
    await sweep(world.deps())
    (entry,) = await world.store.due(world.clock.now() + timedelta(days=2), 10)
    assert entry.check_at == step.complete_by, "one look, then nothing until the deadline"
    assert (await loaded(world)).state.version == process.state.version


async def test_an_approval_completes_the_step_and_the_order_goes_on() -> None:
    world = World()
    await reach_review(world)
    await send_event(world.deps(), "o-1", "review", "ev-1", APPROVED)
    process = await loaded(world)
    assert process.steps[1].status is StepStatus.COMPLETED
    assert process.steps[1].result == APPROVED
    (charge,) = world.bus.take(agent_queue("payment"))
    assert charge.body["step"] == "charge-payment"


async def test_the_same_event_id_twice_has_one_effect() -> None:
    world = World()
    await reach_review(world)
    await send_event(world.deps(), "o-1", "review", "ev-1", APPROVED)
    first = await loaded(world)
    await send_event(world.deps(), "o-1", "review", "ev-1", REJECTED)
    again = await loaded(world)
    assert again.state.version == first.state.version
    assert [e.event_id for e in again.state.events] == ["ev-1"]
    assert len(world.bus.take(agent_queue("payment"))) == 1


async def test_an_event_sent_before_its_step_is_kept_and_consumed_when_reached() -> None:
    world = World()
    deps = world.deps()
    await submit_order(deps, an_order("o-1", clock=world.clock), workflow=REVIEWED_ORDER)
    await send_event(deps, "o-1", "review", "early", APPROVED)
    (reserve,) = world.bus.take(agent_queue("inventory"))
    await scheduler.on_reply(deps, a_reply(reserve))
    assert (await loaded(world)).steps[1].status is StepStatus.RUNNING
    await nudges(world)
    process = await loaded(world)
    assert process.steps[1].status is StepStatus.COMPLETED
    assert process.state.events[0].consumed_by == "manual-review"
    assert len(world.bus.take(agent_queue("payment"))) == 1


async def test_an_event_sent_while_an_early_one_waits_for_its_nudge_takes_the_first() -> None:
    """Chaos (seed 1, 200 orders): an approval came while inventory was reserved, then a
    rejection after the wait began and before the nudge that has it take the approval;
    the rejection was taken, and the approved order was compensated."""
    world = World()
    deps = world.deps()
    await submit_order(deps, an_order("o-1", clock=world.clock), workflow=REVIEWED_ORDER)
    await send_event(deps, "o-1", "review", "first", APPROVED)
    (reserve,) = world.bus.take(agent_queue("inventory"))
    await scheduler.on_reply(deps, a_reply(reserve))

    await send_event(deps, "o-1", "review", "second", REJECTED)
    await nudges(world)

    process = await loaded(world)
    assert [(e.event_id, e.consumed_by) for e in process.state.events] == [
        ("first", "manual-review"),
        ("second", None),
    ]
    assert process.steps[1].status is StepStatus.COMPLETED
    assert len(world.bus.take(agent_queue("payment"))) == 1


async def test_an_early_event_whose_nudge_is_lost_is_taken_by_the_supervisor() -> None:
    """The nudge that has the wait take an event already kept may be lost (dead-lettered
    while the store was down: found by chaos); the Supervisor is its backstop, within
    the pending timeout, not at the wait's deadline a day later."""
    world = World()
    deps = world.deps()
    await submit_order(deps, an_order("o-1", clock=world.clock), workflow=REVIEWED_ORDER)
    await send_event(deps, "o-1", "review", "early", APPROVED)
    (reserve,) = world.bus.take(agent_queue("inventory"))
    await scheduler.on_reply(deps, a_reply(reserve))
    world.bus.take(Queue.SCHEDULER)  # the event nudge, lost
    process = await loaded(world)
    assert process.steps[1].complete_by == world.clock.now() + timedelta(days=1)
    world.clock.advance(61)
    await sweep(deps)
    process = await loaded(world)
    assert process.steps[1].status is StepStatus.COMPLETED
    assert process.state.events[0].consumed_by == "manual-review"
    assert process.state.failure_count == 0
    assert len(world.bus.take(agent_queue("payment"))) == 1


async def test_a_rejection_fails_the_step_and_compensates_what_was_done() -> None:
    world = World()
    await reach_review(world)
    await send_event(world.deps(), "o-1", "review", "ev-1", REJECTED)
    process = await loaded(world)
    assert process.state.process_state is ProcessState.COMPENSATING
    assert process.state.last_error == "manual-review: rejected: rejected by ana: looks like fraud"
    (release,) = world.bus.take(agent_queue("inventory"))
    assert release.body["action"] == "compensate"


async def test_an_event_for_a_suspended_order_waits_for_the_resume() -> None:
    world = World()
    await reach_review(world)
    await suspend_order(world.deps(), "o-1", "op")
    await send_event(world.deps(), "o-1", "review", "ev-1", APPROVED)
    process = await loaded(world)
    assert process.state.process_state is ProcessState.SUSPENDED
    assert process.state.events[0].consumed_by is None
    await resume_order(world.deps(), "o-1", "op")
    await nudges(world)
    await nudges(world)
    assert (await loaded(world)).steps[1].status is StepStatus.COMPLETED
    assert len(world.bus.take(agent_queue("payment"))) == 1


async def test_cancel_while_waiting_ends_the_wait_and_undoes_what_was_done() -> None:
    world = World()
    await reach_review(world)
    await cancel_order(world.deps(), "o-1", "op")
    await nudges(world)
    (release,) = world.bus.take(agent_queue("inventory"))
    await scheduler.on_reply(world.deps(), a_reply(release))
    assert (await loaded(world)).state.process_state is ProcessState.CANCELLED
    with pytest.raises(InvalidTransition):
        await send_event(world.deps(), "o-1", "review", "late", APPROVED)


async def test_an_event_the_workflow_never_waits_for_is_refused() -> None:
    world = World()
    await reach_review(world)
    with pytest.raises(NotAwaited, match="never waits for event 'picked'"):
        await send_event(world.deps(), "o-1", "picked", "ev-1", {})


async def test_an_approval_without_approved_is_refused() -> None:
    world = World()
    await reach_review(world)
    with pytest.raises(InvalidEventData):
        await send_event(world.deps(), "o-1", "review", "ev-1", {"ok": True})


@pytest.mark.parametrize(
    "data",
    [
        {"approved": True, "by": {"name": "ana"}},
        {"approved": True, "by": 1e308},
        {"approved": True, "by": ["ana"]},
        {"approved": False, "comment": 12},
        {"approved": False, "by": "ana", "comment": {"why": "fraud"}},
        {"approved": True, "by": True},
    ],
)
async def test_an_approval_whose_by_or_comment_is_not_a_string_is_refused(
    data: dict[str, object],
) -> None:
    """As the 400's message and the OpenAPI document say (issue 41, finding 4): an object
    or a huge number was kept and echoed back as the approver."""
    world = World()
    await reach_review(world)
    with pytest.raises(InvalidEventData, match='"by"\\?: string'):
        await send_event(world.deps(), "o-1", "review", "ev-1", data)
    process = await loaded(world)
    assert process.state.events == ()
    assert process.steps[1].status is StepStatus.RUNNING


async def test_an_approval_by_and_comment_may_be_left_out_or_null() -> None:
    world = World()
    await reach_review(world)
    await send_event(world.deps(), "o-1", "review", "ev-1", {"approved": True, "by": None})
    assert (await loaded(world)).steps[1].status is StepStatus.COMPLETED


async def test_an_expired_review_compensates_by_its_policy_and_counts_nothing() -> None:
    world = World()
    await reach_review(world)
    world.clock.advance(86401)
    await sweep(world.deps())
    process = await loaded(world)
    assert process.state.process_state is ProcessState.COMPENSATING
    assert process.state.failure_count == 0
    assert (process.state.last_error or "").startswith("manual-review: wait-expired: no review")
    (release,) = world.bus.take(agent_queue("inventory"))
    assert release.body["action"] == "compensate"


async def past_review_deadline(**changes: object) -> World:
    """A reviewed order whose review step has `changes`, a second past its deadline."""
    review = dataclasses.replace(REVIEWED_ORDER.steps[1], **changes)  # type: ignore[arg-type]
    steps = (REVIEWED_ORDER.steps[0], review, *REVIEWED_ORDER.steps[2:])
    world = World(catalogue=running(dataclasses.replace(REVIEWED_ORDER, steps=steps)))
    await reach_review(world)
    world.clock.advance(86401)
    await sweep(world.deps())
    return world


async def test_an_expired_wait_held_by_policy_is_an_error_with_its_own_code() -> None:
    world = await past_review_deadline(on_deadline=OnDeadline.HOLD)
    process = await loaded(world)
    assert process.state.process_state is ProcessState.ERROR
    assert machine_failure(process).error_code == "wait-expired"
    (alert,) = world.bus.take(Queue.OPERATOR_ALERTS)
    assert alert.body["reason"] == "wait-expired"


async def test_an_alerting_wait_alerts_then_waits_to_its_final_deadline() -> None:
    world = await past_review_deadline(
        on_deadline=OnDeadline.ALERT, final_deadline_seconds=3 * 86400
    )
    process = await loaded(world)
    assert process.state.process_state is ProcessState.PROCESSING
    (alert,) = world.bus.take(Queue.OPERATOR_ALERTS)
    assert alert.body["reason"] == "wait-overdue"
    await send_event(world.deps(), "o-1", "review", "ev-1", APPROVED)
    assert len(world.bus.take(agent_queue("payment"))) == 1


async def test_an_alerting_wait_is_held_at_its_final_deadline() -> None:
    world = await past_review_deadline(
        on_deadline=OnDeadline.ALERT, final_deadline_seconds=3 * 86400
    )
    world.bus.take(Queue.OPERATOR_ALERTS)
    world.clock.advance(2 * 86400)
    await sweep(world.deps())
    process = await loaded(world)
    assert process.state.process_state is ProcessState.ERROR
    (alert,) = world.bus.take(Queue.OPERATOR_ALERTS)
    assert alert.body["reason"] == "wait-expired"


async def reach_timer(world: World) -> tuple[Order, Outgoing]:
    """A scheduled-delivery order charged, waiting for a notBefore two hours out; its
    scheduled wake-up nudge, taken off the queue."""
    deps = world.deps()
    order = dataclasses.replace(
        an_order("o-1", clock=world.clock), not_before=world.clock.now() + timedelta(hours=2)
    )
    await submit_order(deps, order, workflow=SCHEDULED_DELIVERY)
    world.bus.take(Queue.SCHEDULER)
    for queue in ("inventory", "payment"):
        (request,) = world.bus.take(agent_queue(queue))
        await scheduler.on_reply(deps, a_reply(request))
    (timer,) = world.bus.take(Queue.SCHEDULER)
    return order, timer


async def test_a_timer_fires_at_the_orders_not_before_by_its_scheduled_nudge() -> None:
    world = World()
    deps = world.deps()
    order, timer = await reach_timer(world)
    assert timer.deliver_at == order.not_before
    assert world.bus.take(agent_queue("shipping")) == []
    world.clock.advance(2 * 3600)
    await scheduler.on_nudge(deps, "o-1", timer.message_id)
    (ship,) = world.bus.take(agent_queue("shipping"))
    assert ship.body["step"] == "create-shipment"


async def test_a_timer_whose_nudge_is_lost_is_fired_by_the_supervisor() -> None:
    world = World()
    deps = world.deps()
    await reach_timer(world)
    world.clock.advance(3600)
    await sweep(deps)
    assert world.bus.take(agent_queue("shipping")) == []
    world.clock.advance(3601)
    await sweep(deps)
    (ship,) = world.bus.take(agent_queue("shipping"))
    assert (await loaded(world)).state.failure_count == 0
    assert ship.body["step"] == "create-shipment"


async def test_a_timer_already_past_when_its_step_begins_moves_the_check_up() -> None:
    """The charge answers after the order's notBefore: the timer's step is due at once,
    before the check the charge's step left on the watch entry (its complete-by). With
    its nudge lost, the Supervisor's next sweep fires it, not a step timeout later."""
    world = World()
    deps = world.deps()
    start = world.clock.now()
    order = dataclasses.replace(
        an_order("o-1", clock=world.clock), not_before=start + timedelta(seconds=5)
    )
    await submit_order(deps, order, workflow=SCHEDULED_DELIVERY)
    (reserve,) = world.bus.take(agent_queue("inventory"))
    await scheduler.on_reply(deps, a_reply(reserve))
    world.clock.advance(15)
    await sweep(deps)  # the first look: moved on to the charge's complete-by
    assert world.store.watched()["o-1"] == start + timedelta(seconds=30)
    world.clock.advance(5)
    (charge,) = world.bus.take(agent_queue("payment"))
    await scheduler.on_reply(deps, a_reply(charge))
    assert world.store.watched()["o-1"] == world.clock.now()
    (timer,) = world.bus.take(Queue.SCHEDULER)  # lost
    assert timer.deliver_at == world.clock.now()
    await sweep(deps)
    (ship,) = world.bus.take(agent_queue("shipping"))
    assert ship.body["step"] == "create-shipment"


def machine_failure(process: OrderProcess) -> Failure:
    state = process.state
    return failure_of(state, CATALOGUE.get(state.workflow, state.workflow_version))


async def test_an_operator_answers_the_approval_a_suspended_order_is_at_and_it_waits() -> None:
    """The operator route's rule (docs/events.md#operators-answer-approvals): with no
    event named, the approval the order is at, even Suspended; kept until it resumes."""
    world = World()
    await reach_review(world)
    deps = world.deps()
    await suspend_order(deps, "o-1", "ops")
    kept = await answer_approval(deps, "o-1", "ops-1", True, "ana", "fine")
    assert (kept.name, kept.data, kept.consumed_by) == (
        "review",
        {"approved": True, "by": "ana", "comment": "fine"},
        None,
    )
    assert (await loaded(world)).steps[1].status is StepStatus.RUNNING
    await resume_order(deps, "o-1", "ops")
    await nudges(world)  # the resume's nudge claims the order: the review waits again
    await nudges(world)  # that wait's own nudge takes the kept answer
    process = await loaded(world)
    assert process.steps[1].status is StepStatus.COMPLETED
    with pytest.raises(NoApprovalWaiting):
        await answer_approval(deps, "o-1", "ops-2", False, "bo")
    with pytest.raises(NotAnApproval):
        await answer_approval(deps, "o-1", "ops-3", False, "bo", event="picked")
