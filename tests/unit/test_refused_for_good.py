"""An operation the saga counts on refused for good (issue #37, liveness): a retriable
step's do or an undo. The premise is that both eventually succeed; a provider that
refuses one for good breaks it, and only a person can mend the provider. So the order
is held at once with an alert naming the step, the operation, the provider and the
reason, nothing else moves, and once the provider stops refusing one resubmit (or, for
a held compensation, a cancel) reaches the right end: docs/in-doubt.md."""

from __future__ import annotations

from shared.adapters.memory.store import Sent
from shared.contract import Queue, agent_queue
from shared.domain.failures import failure_of
from shared.domain.model import ErrorInfo, Outcome, Phase, ProcessState, StepStatus
from shared.usecases.flow import scheduler
from shared.usecases.flow.submission import submit_order
from shared.usecases.operations.operator import cancel_order, resubmit_order
from tests.builders import World, a_reply, an_order
from tests.unit.test_step_kinds import reach_shipment, ship
from tests.workflows import CATALOGUE, EXPRESS_DELIVERY

REFUSED = ErrorInfo("rejected", "account closed")


def _all_requests(world: World) -> list[Sent]:
    return [
        m
        for agent in ("inventory", "payment", "payment-secondary", "shipping", "notifications")
        for m in world.bus.take(agent_queue(agent))
    ]


async def _refund_refused(world: World) -> Sent:
    """order-fulfilment: inventory reserved, payment charged, the shipment declined for
    good, and the charge's refund refused for good at payment."""
    deps = world.deps()
    await submit_order(deps, an_order("o-1", clock=world.clock))
    for agent in ("inventory", "payment"):
        (request,) = world.bus.take(agent_queue(agent))
        await scheduler.on_reply(deps, a_reply(request))
    (shipment,) = world.bus.take(agent_queue("shipping"))
    await scheduler.on_reply(deps, a_reply(shipment, Outcome.FAILED))
    (refund,) = world.bus.take(agent_queue("payment"))
    assert refund.body["operation"] == "refund-payment"
    world.bus.take(Queue.OPERATOR_ALERTS)
    await scheduler.on_reply(deps, a_reply(refund, Outcome.FAILED, error=REFUSED))
    return refund


async def test_a_refused_retriable_step_holds_the_order_with_an_alert_naming_what_refused() -> None:
    world = World()
    await reach_shipment(world)
    await ship(world)
    (notify,) = world.bus.take(agent_queue("notifications"))
    await scheduler.on_reply(world.deps(), a_reply(notify, Outcome.FAILED, error=REFUSED))
    process = await world.store.load("o-1")
    assert process is not None
    assert process.state.process_state is ProcessState.ERROR
    (alert,) = world.bus.take(Queue.OPERATOR_ALERTS)
    assert alert.body["reason"] == "retriable-step-failed"
    said = str(alert.body["lastError"])
    for named in ("notify-customer", "rejected", "account closed", "notifications"):
        assert named in said, (named, said)
    assert failure_of(process.state, EXPRESS_DELIVERY).error_code == "rejected"
    assert _all_requests(world) == []


async def test_once_the_provider_stops_refusing_one_resubmit_finishes_the_order() -> None:
    world = World()
    deps = world.deps()
    await reach_shipment(world)
    await ship(world)
    (notify,) = world.bus.take(agent_queue("notifications"))
    await scheduler.on_reply(deps, a_reply(notify, Outcome.FAILED, error=REFUSED))
    await resubmit_order(deps, "o-1", "op")
    await scheduler.on_nudge(deps, "o-1")
    (again,) = world.bus.take(agent_queue("notifications"))
    assert again.body["idempotencyKey"] == notify.body["idempotencyKey"]
    await scheduler.on_reply(deps, a_reply(again))
    process = await world.store.load("o-1")
    assert process is not None
    assert process.state.process_state is ProcessState.PROCESSED
    assert [s.status for s in process.steps] == [StepStatus.COMPLETED] * 4


async def test_a_refused_undo_holds_the_compensation_with_an_alert_naming_what_refused() -> None:
    world = World()
    await _refund_refused(world)
    process = await world.store.load("o-1")
    assert process is not None
    assert (process.state.process_state, process.state.phase) == (
        ProcessState.ERROR,
        Phase.COMPENSATE,
    )
    (alert,) = world.bus.take(Queue.OPERATOR_ALERTS)
    assert alert.body["reason"] == "compensation-failed"
    said = str(alert.body["lastError"])
    for named in ("charge-payment", "refund-payment", "payment", "rejected", "account closed"):
        assert named in said, (named, said)
    workflow = CATALOGUE.get("order-fulfilment")
    assert failure_of(process.state, workflow).error_code == "rejected"
    assert _all_requests(world) == []


async def test_a_resubmit_of_a_held_compensation_sends_the_refused_undo_again_and_goes_on() -> None:
    world = World()
    deps = world.deps()
    refund = await _refund_refused(world)
    await resubmit_order(deps, "o-1", "op")
    await scheduler.on_nudge(deps, "o-1")
    (again,) = _all_requests(world)
    assert again.destination.agent == "payment"
    assert again.body["action"] == "compensate"
    assert again.body["idempotencyKey"] == refund.body["idempotencyKey"]
    await scheduler.on_reply(deps, a_reply(again))
    (release,) = world.bus.take(agent_queue("inventory"))
    assert release.body["operation"] == "release-inventory"
    await scheduler.on_reply(deps, a_reply(release))
    process = await world.store.load("o-1")
    assert process is not None
    assert process.state.process_state is ProcessState.COMPENSATED


async def test_a_cancel_of_a_held_compensation_undoes_the_rest_and_ends_cancelled() -> None:
    world = World()
    deps = world.deps()
    refund = await _refund_refused(world)
    await cancel_order(deps, "o-1", "op")
    await scheduler.on_nudge(deps, "o-1")
    (again,) = _all_requests(world)
    assert again.body["idempotencyKey"] == refund.body["idempotencyKey"]
    await scheduler.on_reply(deps, a_reply(again))
    (release,) = world.bus.take(agent_queue("inventory"))
    await scheduler.on_reply(deps, a_reply(release))
    process = await world.store.load("o-1")
    assert process is not None
    assert process.state.process_state is ProcessState.CANCELLED
