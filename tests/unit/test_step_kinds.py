"""Saga step kinds on the shipped `express-delivery` workflow: compensatable steps, then
the pivot (create-shipment), then a retriable step that takes earlier results."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from shared.adapters.memory.store import InMemoryBulkStore
from shared.contract import Queue, agent_queue
from shared.domain.bulk import JobState
from shared.domain.bulk_request import BulkAction, BulkFilter, BulkRequest
from shared.domain.machine.forward import MAX_RESULT_BYTES
from shared.domain.machine.operator import PastPivot
from shared.domain.machine.transition import InvalidTransition
from shared.domain.model import ErrorInfo, ExhaustedPolicy, Outcome, ProcessState, StepStatus
from shared.resilience import CircuitBreaker
from shared.usecases.flow import scheduler
from shared.usecases.flow.outcomes import Asked, OutcomeQueries
from shared.usecases.flow.submission import submit_order
from shared.usecases.flow.supervisor import sweep
from shared.usecases.operations.bulk import BulkDeps, job_status, preview, start_job, work_jobs
from shared.usecases.operations.operator import cancel_order, resubmit_order
from tests.builders import World, a_policy, a_reply, an_order
from tests.unit.test_in_doubt import Remote
from tests.workflows import EXPRESS_DELIVERY, without

SHIPMENT: dict[str, object] = {"shipmentId": "shp-1", "trackingNumber": "TRK42"}
CHARGE: dict[str, object] = {"paymentId": "pay-1", "amount": 19.0}


async def reach_shipment(world: World, order_id: str = "o-1") -> None:
    deps = world.deps()
    await submit_order(deps, an_order(order_id, clock=world.clock), workflow=EXPRESS_DELIVERY)
    (reserve,) = world.bus.take(agent_queue("inventory"))
    await scheduler.on_reply(deps, a_reply(reserve))
    (charge,) = world.bus.take(agent_queue("payment"))
    await scheduler.on_reply(deps, a_reply(charge, result=CHARGE))


async def ship(world: World, order_id: str = "o-1") -> None:
    (shipment,) = world.bus.take(agent_queue("shipping"))
    await scheduler.on_reply(world.deps(), a_reply(shipment, result=SHIPMENT))


async def state_of(world: World, order_id: str = "o-1") -> ProcessState:
    process = await world.store.load(order_id)
    assert process is not None
    return process.state.process_state


async def test_an_order_pins_the_workflow_and_version_it_started_on() -> None:
    world = World()
    await reach_shipment(world)
    process = await world.store.load("o-1")
    assert process is not None
    assert (process.state.workflow, process.state.workflow_version) == ("express-delivery", 1)
    assert [s.name for s in process.steps][-1] == "notify-customer"


async def test_the_retriable_step_gets_the_declared_results_of_earlier_steps() -> None:
    world = World()
    await reach_shipment(world)
    await ship(world)
    (notify,) = world.bus.take(agent_queue("notifications"))
    assert notify.body["payload"]["inputs"] == {
        "create-shipment.trackingNumber": "TRK42",
        "charge-payment.amount": 19.0,
    }
    assert notify.body["payload"]["customerId"] == "cust-1"
    await scheduler.on_reply(world.deps(), a_reply(notify))
    assert await state_of(world) is ProcessState.PROCESSED


async def test_a_cancel_once_the_pivot_completed_is_refused_as_past_pivot() -> None:
    world = World()
    await reach_shipment(world)
    await ship(world)
    with pytest.raises(PastPivot) as refused:
        await cancel_order(world.deps(), "o-1", "op")
    assert refused.value.code == "past-pivot"
    assert await state_of(world) is ProcessState.PROCESSING


async def test_a_cancel_while_the_pivot_request_is_out_is_refused_too() -> None:
    """The pivot's request may still apply: cancelling would undo the steps before it
    and leave the parcel shipped on a cancelled order."""
    world = World()
    await reach_shipment(world)
    with pytest.raises(PastPivot):
        await cancel_order(world.deps(), "o-1", "op")


async def test_a_cancel_before_the_pivot_compensates_as_usual() -> None:
    world = World()
    deps = world.deps()
    await submit_order(deps, an_order("o-1", clock=world.clock), workflow=EXPRESS_DELIVERY)
    (reserve,) = world.bus.take(agent_queue("inventory"))
    await scheduler.on_reply(deps, a_reply(reserve))
    (charge,) = world.bus.take(agent_queue("payment"))
    await cancel_order(deps, "o-1", "op")
    await scheduler.on_reply(deps, a_reply(charge, result=CHARGE))
    assert world.bus.take(agent_queue("shipping")) == []
    (refund,) = world.bus.take(agent_queue("payment"))
    await scheduler.on_reply(deps, a_reply(refund))
    (release,) = world.bus.take(agent_queue("inventory"))
    await scheduler.on_reply(deps, a_reply(release))
    assert await state_of(world) is ProcessState.CANCELLED


async def test_a_retriable_steps_permanent_failure_holds_the_order_without_compensating() -> None:
    world = World()
    await reach_shipment(world)
    await ship(world)
    (notify,) = world.bus.take(agent_queue("notifications"))
    bounced = ErrorInfo("rejected", "mailbox does not exist")
    await scheduler.on_reply(world.deps(), a_reply(notify, Outcome.FAILED, error=bounced))
    process = await world.store.load("o-1")
    assert process is not None
    assert process.state.process_state is ProcessState.ERROR
    assert process.state.last_error == (
        "notify-customer: rejected: mailbox does not exist "
        "(notify-customer refused at notifications)"
    )
    assert [s.status for s in process.steps[:3]] == [StepStatus.COMPLETED] * 3
    sent = world.bus.take(agent_queue("inventory")) + world.bus.take(agent_queue("payment"))
    assert sent == []
    (alert,) = world.bus.take(Queue.OPERATOR_ALERTS)
    assert alert.body["reason"] == "retriable-step-failed"


async def test_the_pivots_own_permanent_failure_compensates_the_steps_before_it() -> None:
    world = World()
    await reach_shipment(world)
    (shipment,) = world.bus.take(agent_queue("shipping"))
    await scheduler.on_reply(world.deps(), a_reply(shipment, Outcome.FAILED))
    assert await state_of(world) is ProcessState.COMPENSATING
    (refund,) = world.bus.take(agent_queue("payment"))
    assert refund.body["action"] == "compensate"
    assert refund.body["payload"]["result"] == CHARGE


async def test_exhausted_retries_of_the_retriable_step_hold_even_when_the_policy_compensates() -> (
    None
):
    world = World(policy=a_policy(exhausted=ExhaustedPolicy.COMPENSATE, max_failure_count=2))
    deps = world.deps()
    await reach_shipment(world)
    await ship(world)
    for _ in range(2):
        world.bus.take(agent_queue("notifications"))
        world.clock.advance(40)
        await sweep(deps)
        for nudge in world.bus.take(Queue.SCHEDULER):
            world.clock.advance(1)
            await scheduler.on_nudge(deps, nudge.body["orderId"])
    assert await state_of(world) is ProcessState.ERROR
    assert world.bus.take(agent_queue("payment")) == []


async def test_an_oversize_result_keeps_only_its_declared_fields() -> None:
    world = World()
    await reach_shipment(world)
    (shipment,) = world.bus.take(agent_queue("shipping"))
    bulky: dict[str, object] = {**SHIPMENT, "label": "x" * (MAX_RESULT_BYTES + 1)}
    await scheduler.on_reply(world.deps(), a_reply(shipment, result=bulky))
    process = await world.store.load("o-1")
    assert process is not None
    assert process.steps[2].result == SHIPMENT
    assert process.state.process_state is ProcessState.PROCESSING


async def test_a_result_too_large_even_in_its_declared_fields_is_held_for_an_operator() -> None:
    world = World()
    await reach_shipment(world)
    (shipment,) = world.bus.take(agent_queue("shipping"))
    huge: dict[str, object] = {"shipmentId": "s" * (MAX_RESULT_BYTES + 1), "trackingNumber": "T"}
    await scheduler.on_reply(world.deps(), a_reply(shipment, result=huge))
    process = await world.store.load("o-1")
    assert process is not None
    assert process.state.process_state is ProcessState.ERROR
    assert (process.state.last_error or "").startswith("create-shipment: result-too-large: ")
    assert process.steps[2].status is StepStatus.COMPLETED
    assert world.bus.take(agent_queue("notifications")) == []


async def test_an_order_whose_version_the_catalogue_dropped_is_held_with_an_alert() -> None:
    world = World()
    await reach_shipment(world)
    world.catalogue = without(EXPRESS_DELIVERY.name)
    assert await scheduler.on_nudge(world.deps(), "o-1") is scheduler.Handled.STALE
    world.clock.advance(40)
    await sweep(world.deps())
    process = await world.store.load("o-1")
    assert process is not None
    assert process.state.process_state is ProcessState.ERROR
    assert process.state.last_error == "workflow express-delivery v1 is not in the catalogue"
    (alert,) = world.bus.take(Queue.OPERATOR_ALERTS)
    assert alert.body["reason"] == "workflow-version-gone"


async def test_exhausting_a_step_past_the_pivot_abandons_no_key_and_a_resubmit_retries_it() -> None:
    """Issue #37 B: with ExhaustedPolicy=compensate an order past its pivot is held, not
    compensated, so its last timeout must not abandon the step's only provider (else a
    resubmit holds again with no provider left, a cancel is past-pivot: stuck forever)."""
    world = World(policy=a_policy(max_failure_count=2, exhausted=ExhaustedPolicy.COMPENSATE))
    deps = world.deps()
    notifications = Remote()
    queries = OutcomeQueries(
        {"notifications": Asked(notifications, CircuitBreaker("notifications", world.clock))},
        world.clock,
    )
    await reach_shipment(world)
    await ship(world)
    for _ in range(2):
        assert len(world.bus.take(agent_queue("notifications"))) == 1
        world.clock.advance(31)  # past complete-by and the settle margin
        await sweep(deps, queries=queries)
        for nudge in world.bus.take(Queue.SCHEDULER):
            world.clock.advance(10)
            await scheduler.on_nudge(deps, "o-1", nudge.message_id)
    assert await state_of(world) is ProcessState.ERROR
    assert notifications.abandoned == []
    await resubmit_order(deps, "o-1", "op")
    await scheduler.on_nudge(deps, "o-1")
    (again,) = world.bus.take(agent_queue("notifications"))
    await scheduler.on_reply(deps, a_reply(again))
    assert await state_of(world) is ProcessState.PROCESSED


async def test_an_order_on_a_dropped_version_is_refused_not_crashed_singly_and_in_bulk() -> None:
    """Issue #37 G: cancel raised a lookup error (a 500 on the route), and a bulk job
    failed on such an order at every timer run, replaying its page for ever."""
    world = World()
    deps = world.deps()
    await submit_order(deps, an_order("gone-1", clock=world.clock), workflow=EXPRESS_DELIVERY)
    await submit_order(deps, an_order("kept-1", clock=world.clock))
    bulk = BulkDeps(deps, InMemoryBulkStore(world.store), 50)
    request = BulkRequest(BulkAction.CANCEL, BulkFilter(customer_id="cust-1"), dry_run=True)
    job = await start_job(bulk, replace(request, dry_run=False), "ops")
    assert job.matched == 2
    world.catalogue = without(EXPRESS_DELIVERY.name)
    deps = world.deps()
    bulk = replace(bulk, process=deps)

    with pytest.raises(InvalidTransition) as refused:
        await cancel_order(deps, "gone-1", "op")
    assert refused.value.code == "version-gone"
    assert list((await preview(bulk, request)).sample_order_ids) == ["kept-1"]

    await work_jobs(bulk, budget=timedelta(minutes=1))
    finished = await job_status(bulk, job.bulk_id)
    assert finished.state is JobState.DONE
    assert (finished.done, finished.skipped, finished.failed) == (1, 1, 0)
    assert await state_of(world, "gone-1") is ProcessState.PROCESSING
