"""A request that applies after its key was settled not applied (issue 37, finding A), and
agents that share one key space (finding F).

A: payment has no `abandon`. Its charge times out, the sweep past the request's live time
hears "never seen", the key is settled not applied, and the order goes back to Pending.
Then the request applies after all (a network path that held it past the clock-skew
margin: the residual risk in docs/in-doubt.md). Its success reply used to be dropped as
stale: the retry then charged payment-secondary too, or an operator's cancel of the
held order skipped the charge as never applied and the order ended Cancelled with it in
force.

F: with `retryElsewhere` the two payment regions are one key space, so the charge a
region answers for is the order's only charge: a late success from the region the order
left, or reconciliation asking both, must not refund it.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from shared.adapters.queues import queue_of
from shared.contract import Queue, agent_queue
from shared.domain import reconcile as rules
from shared.domain.in_doubt import NEVER_SEEN, NOT_SUPPORTED, RemoteOutcome
from shared.domain.machine.dispatch import heal_key
from shared.domain.machine.forward import apply_reply, claim, start
from shared.domain.machine.operator import cancel
from shared.domain.machine.recovery import recover
from shared.domain.messages import AgentReply
from shared.domain.model import (
    ErrorInfo,
    ExhaustedPolicy,
    KeyState,
    OrderProcess,
    Outcome,
    Outgoing,
    ProcessState,
    StepStatus,
)
from shared.domain.workflow import Workflow
from shared.ports import TransientRemoteError
from shared.usecases.flow import scheduler
from shared.usecases.operations.operator import cancel_order, resubmit_order
from tests.builders import World, a_policy, a_reply, an_order
from tests.unit.test_in_doubt import (
    CHARGE_KEY,
    REFUND_KEY,
    RESULT,
    Setup,
    at_payment,
    loaded,
    next_claim,
)
from tests.unit.test_reconcile import APPLIED, ask_all, finished
from tests.unit.test_routing import (
    BOTH_HEALTHY,
    payment_requests,
    reach_payment,
    retry_after_timeout,
    routed_world,
)
from tests.workflows import EXPRESS_DELIVERY, ORDER_FULFILMENT, running

PAST_LIVE_TIME = 36  # step timeout 30 s plus the 5 s clock-skew margin, and a second


def late(request: Outgoing, agent: str, outcome: Outcome = Outcome.SUCCEEDED) -> AgentReply:
    """The reply to `request` from `agent`, as a real agent sends it (naming itself)."""
    result = RESULT if outcome is Outcome.SUCCEEDED else None
    return replace(a_reply(request, outcome, result=result), agent=agent)


async def settled_not_applied(world: World | None = None) -> Setup:
    """The charge timed out at payment, a provider without abandon; the sweep past the
    request's live time heard "never seen", so its key is settled not applied there."""
    setup = await at_payment(world, "payment", "payment-secondary")
    setup.payment.answers[CHARGE_KEY] = NEVER_SEEN
    setup.payment.abandons[CHARGE_KEY] = NOT_SUPPORTED
    setup.world.clock.advance(PAST_LIVE_TIME)
    await setup.sweep()
    process = await loaded(setup)
    assert process.steps[1].key_state is KeyState.NOT_APPLIED
    return setup


def alerts(setup: Setup) -> list[str]:
    return [m.body["reason"] for m in setup.world.bus.take(Queue.OPERATOR_ALERTS)]


async def answer(setup: Setup, queue: str) -> Outgoing:
    """Take the one request on `queue` and answer it with success."""
    (request,) = setup.requests(queue)
    await scheduler.on_reply(setup.deps, a_reply(request))
    return request


# A, `_late_do`: the order still runs forward.


async def test_a_late_charge_while_the_retry_waits_is_the_steps_answer() -> None:
    setup = await settled_not_applied()
    process = await loaded(setup)
    assert process.state.process_state is ProcessState.PENDING
    assert setup.charge is not None

    await scheduler.on_reply(setup.deps, late(setup.charge, "payment"))
    await next_claim(setup)

    assert setup.requests(agent_queue("payment-secondary")) == [], "charged twice"
    assert setup.requests(agent_queue("payment")) == []
    await answer(setup, agent_queue("shipping"))
    final = await loaded(setup)
    assert final.state.process_state is ProcessState.PROCESSED
    step = final.steps[1]
    assert (step.status, step.key_state, step.agent) == (
        StepStatus.COMPLETED,
        KeyState.APPLIED,
        "payment",
    )
    assert step.result == RESULT
    assert alerts(setup) == ["applied-after-settled"]


async def test_a_late_charge_at_the_provider_the_retry_left_is_undone_and_never_retried_there() -> (
    None
):
    """The retry is already at the secondary when payment's late success comes: payment
    refunds it, and no later retry goes back to payment with the same key (payment would
    answer it with the charge it just refunded)."""
    setup = await settled_not_applied()
    await next_claim(setup)
    (moved,) = setup.requests(agent_queue("payment-secondary"))
    assert setup.charge is not None

    await scheduler.on_reply(setup.deps, late(setup.charge, "payment"))

    (refund,) = setup.requests(agent_queue("payment"))
    assert (refund.body["action"], refund.body["idempotencyKey"]) == ("compensate", REFUND_KEY)
    assert refund.body["undoes"] == CHARGE_KEY
    assert alerts(setup) == ["applied-at-two-providers"]
    # The secondary's attempt times out too, and its key settles not applied there.
    setup.world.clock.advance(PAST_LIVE_TIME)
    await setup.sweep()
    process = await loaded(setup)
    assert process.steps[1].key_state is KeyState.NOT_APPLIED
    await next_claim(setup)
    assert setup.requests(agent_queue("payment")) == [], "a spent key sent again"
    (retry,) = setup.requests(agent_queue("payment-secondary"))
    assert retry.body["idempotencyKey"] == moved.body["idempotencyKey"]


# A, `_late_do`: the order held in Error, then an operator acts.


async def held_with_the_charge_settled_not_applied() -> Setup:
    setup = await settled_not_applied(World(policy=a_policy(max_failure_count=1)))
    process = await loaded(setup)
    assert process.state.process_state is ProcessState.ERROR
    alerts(setup)
    return setup


async def test_a_held_order_whose_charge_applied_late_refunds_it_when_cancelled() -> None:
    setup = await held_with_the_charge_settled_not_applied()
    assert setup.charge is not None
    await scheduler.on_reply(setup.deps, late(setup.charge, "payment"))
    process = await loaded(setup)
    assert process.state.process_state is ProcessState.ERROR, "still held for the operator"

    await cancel_order(setup.deps, "o-1", "op")
    await next_claim(setup)

    refunds = setup.requests(agent_queue("payment"))
    assert refunds, "cancelled with the late charge in force: no refund sent"
    (refund,) = refunds
    assert (refund.body["action"], refund.body["idempotencyKey"]) == ("compensate", REFUND_KEY)
    assert refund.body["payload"] == {"result": RESULT}
    await scheduler.on_reply(setup.deps, a_reply(refund))
    await answer(setup, agent_queue("inventory"))
    final = await loaded(setup)
    assert final.state.process_state is ProcessState.CANCELLED
    assert final.steps[1].status is StepStatus.COMPENSATED
    assert "applied-after-settled" in alerts(setup)


async def test_a_held_order_whose_charge_applied_late_goes_on_without_charging_again() -> None:
    setup = await held_with_the_charge_settled_not_applied()
    assert setup.charge is not None
    await scheduler.on_reply(setup.deps, late(setup.charge, "payment"))

    await resubmit_order(setup.deps, "o-1", "op")
    await next_claim(setup)

    assert setup.requests(agent_queue("payment-secondary")) == [], "charged twice"
    assert setup.requests(agent_queue("payment")) == []
    await answer(setup, agent_queue("shipping"))
    assert (await loaded(setup)).state.process_state is ProcessState.PROCESSED


async def test_a_charge_applied_after_its_order_was_cancelled_is_refunded_there() -> None:
    """The cancel came first and skipped the charge as never applied; the late success
    then proves it in force on a Cancelled order."""
    setup = await held_with_the_charge_settled_not_applied()
    await cancel_order(setup.deps, "o-1", "op")
    await next_claim(setup)
    await answer(setup, agent_queue("inventory"))
    assert (await loaded(setup)).state.process_state is ProcessState.CANCELLED
    assert setup.requests(agent_queue("payment")) == []
    assert setup.charge is not None

    await scheduler.on_reply(setup.deps, late(setup.charge, "payment"))

    (refund,) = setup.requests(agent_queue("payment"))
    assert (refund.body["action"], refund.body["idempotencyKey"]) == ("compensate", REFUND_KEY)
    assert (refund.body["undoes"], refund.body["payload"]) == (CHARGE_KEY, {"result": RESULT})
    assert alerts(setup) == ["applied-after-settled"]


# A, `_late_failure`: the same late answer, a failure (nothing applied: nothing to undo).


async def test_a_late_failure_while_the_retry_waits_leaves_the_retry_to_the_secondary() -> None:
    setup = await settled_not_applied()
    assert setup.charge is not None

    await scheduler.on_reply(setup.deps, late(setup.charge, "payment", Outcome.FAILED))

    assert alerts(setup) == []
    await next_claim(setup)
    assert setup.requests(agent_queue("payment")) == []
    await answer(setup, agent_queue("payment-secondary"))
    await answer(setup, agent_queue("shipping"))
    assert (await loaded(setup)).state.process_state is ProcessState.PROCESSED


async def test_a_late_failure_on_a_held_order_means_its_cancel_refunds_nothing() -> None:
    """No answer by the live time leaves the key expired (a refund would be safe, and
    would find nothing); the late failure is the provider's last word: not applied."""
    setup = await at_payment(World(policy=a_policy(max_failure_count=1)), "payment")
    setup.payment.answers[CHARGE_KEY] = TransientRemoteError("http-503", "down")
    setup.payment.abandons[CHARGE_KEY] = NOT_SUPPORTED
    setup.world.clock.advance(PAST_LIVE_TIME)
    await setup.sweep()
    process = await loaded(setup)
    assert process.state.process_state is ProcessState.ERROR
    assert process.steps[1].key_state is KeyState.EXPIRED
    assert setup.charge is not None

    await scheduler.on_reply(setup.deps, late(setup.charge, "payment", Outcome.FAILED))
    assert (await loaded(setup)).steps[1].key_state is KeyState.NOT_APPLIED
    await cancel_order(setup.deps, "o-1", "op")
    await next_claim(setup)

    assert setup.requests(agent_queue("payment")) == [], "a refund for a charge never taken"
    await answer(setup, agent_queue("inventory"))
    assert (await loaded(setup)).state.process_state is ProcessState.CANCELLED


@pytest.mark.parametrize("heard", ["reply", "sweep"])
async def test_a_charge_applied_after_its_refund_found_nothing_is_healed_at_once(
    heard: str,
) -> None:
    """No answer by the live time left the key expired; the cancel's refund went (safe on
    an expired key) and found nothing to undo, heard from its reply or from the
    Supervisor's question once the reply was lost; then the charge applied after all,
    and its success reply came. The Scheduler knows the charge is in force on a
    Cancelled order: it alerts and refunds it at once under the heal key (the order's
    refund key is spent: payment would answer it from its record, nothing again), not
    leaving it to reconciliation's sample. Found by the explorer's told-late
    (ChargeRunning, depth 10 from the reply, 12 from the sweep)."""
    setup = await at_payment(World(policy=a_policy(max_failure_count=1)), "payment")
    setup.payment.answers[CHARGE_KEY] = TransientRemoteError("http-503", "down")
    setup.payment.abandons[CHARGE_KEY] = NOT_SUPPORTED
    setup.world.clock.advance(PAST_LIVE_TIME)
    await setup.sweep()
    assert (await loaded(setup)).steps[1].key_state is KeyState.EXPIRED
    alerts(setup)
    await cancel_order(setup.deps, "o-1", "op")
    await next_claim(setup)
    (refund,) = setup.requests(agent_queue("payment"))
    nothing = {"undone": False, "reason": "nothing-to-undo"}
    if heard == "reply":
        await scheduler.on_reply(setup.deps, a_reply(refund, result=nothing))
    else:
        setup.payment.answers[REFUND_KEY] = RemoteOutcome.applied(nothing)
        setup.world.clock.advance(PAST_LIVE_TIME)
        await setup.sweep()
        await next_claim(setup)
    await answer(setup, agent_queue("inventory"))
    assert (await loaded(setup)).state.process_state is ProcessState.CANCELLED
    assert setup.charge is not None

    await scheduler.on_reply(setup.deps, late(setup.charge, "payment"))

    heals = setup.requests(agent_queue("payment"))
    assert heals, "a charge in force on a Cancelled order, and no refund sent"
    (heal,) = heals
    assert (heal.body["action"], heal.body["idempotencyKey"]) == (
        "compensate",
        heal_key(REFUND_KEY),
    )
    assert (heal.body["undoes"], heal.body["payload"]) == (CHARGE_KEY, {"result": RESULT})
    assert heal.message_id != refund.message_id, "the broker would drop it as the refund's"
    assert alerts(setup) == ["applied-after-settled"]
    assert (await loaded(setup)).state.process_state is ProcessState.CANCELLED


async def test_a_charge_applied_after_a_moved_refund_found_nothing_heals_under_its_round() -> None:
    """As above, but the first refund was refused for good, so the second cancel sent it
    under `:r2`, and that one found nothing to undo. The heal goes under the heal key of
    the refund that found nothing (`...:r2:heal`), the one reconciliation names from the
    step's current undo key (shared/domain/reconcile.py, `StepCheck.heal_key`): under
    round 0's (`...:heal`), a reconciliation run after it would undo one charge under a
    second key."""
    setup = await at_payment(World(policy=a_policy(max_failure_count=1)), "payment")
    setup.payment.answers[CHARGE_KEY] = TransientRemoteError("http-503", "down")
    setup.payment.abandons[CHARGE_KEY] = NOT_SUPPORTED
    setup.world.clock.advance(PAST_LIVE_TIME)
    await setup.sweep()
    alerts(setup)
    await cancel_order(setup.deps, "o-1", "op")
    await next_claim(setup)
    (refund,) = setup.requests(agent_queue("payment"))
    refused = ErrorInfo("rejected", "account closed")
    await scheduler.on_reply(setup.deps, a_reply(refund, Outcome.FAILED, error=refused))
    assert (await loaded(setup)).state.process_state is ProcessState.ERROR
    await cancel_order(setup.deps, "o-1", "op")
    await next_claim(setup)
    (again,) = setup.requests(agent_queue("payment"))
    assert again.body["idempotencyKey"] == f"{REFUND_KEY}:r2"
    nothing = {"undone": False, "reason": "nothing-to-undo"}
    await scheduler.on_reply(setup.deps, a_reply(again, result=nothing))
    await answer(setup, agent_queue("inventory"))
    assert (await loaded(setup)).state.process_state is ProcessState.CANCELLED
    assert setup.charge is not None
    alerts(setup)

    await scheduler.on_reply(setup.deps, late(setup.charge, "payment"))

    (heal,) = setup.requests(agent_queue("payment"))
    assert (heal.body["action"], heal.body["idempotencyKey"]) == (
        "compensate",
        heal_key(f"{REFUND_KEY}:r2"),
    )
    assert alerts(setup) == ["applied-after-settled"]


# A, past the pivot: nothing undoes the effect, so the order is held.


def express_shipping_timed_out() -> tuple[OrderProcess, Outgoing]:
    """express-delivery under ExhaustedPolicy=compensate: inventory and the charge done,
    the shipment (the pivot) unanswered, settled not applied past its live time, and the
    order undoing the charge."""
    policy = a_policy(max_failure_count=1, exhausted=ExhaustedPolicy.COMPENSATE)
    order = an_order("o-1")
    now = order.created_at
    process = start(order, EXPRESS_DELIVERY, now).process
    claimed = claim(process, EXPRESS_DELIVERY, policy, "s-1", now)
    assert claimed is not None
    process, sent = claimed.process, claimed.outgoing
    for queue in (agent_queue("inventory"), agent_queue("payment")):
        (request,) = [m for m in sent if queue_of(m.destination) == queue]
        replied = apply_reply(process, EXPRESS_DELIVERY, policy, a_reply(request), now)
        assert replied is not None
        process, sent = replied.process, replied.outgoing
    (ship,) = [m for m in sent if queue_of(m.destination) == agent_queue("shipping")]
    now += timedelta(seconds=PAST_LIVE_TIME)
    recovered = recover(process, EXPRESS_DELIVERY, policy, now, outcome=NEVER_SEEN)
    assert recovered is not None
    process = recovered.process
    assert process.steps[2].key_state is KeyState.NOT_APPLIED
    claimed = claim(process, EXPRESS_DELIVERY, policy, "s-1", now)
    assert claimed is not None
    assert claimed.process.state.process_state is ProcessState.COMPENSATING
    return claimed.process, ship


def test_a_pivot_applied_late_while_the_order_compensates_holds_it_with_an_alert() -> None:
    process, ship = express_shipping_timed_out()
    policy = a_policy(max_failure_count=1, exhausted=ExhaustedPolicy.COMPENSATE)
    now = process.state.updated_at

    moved = apply_reply(process, EXPRESS_DELIVERY, policy, late(ship, "shipping"), now)

    assert moved is not None
    assert moved.process.state.process_state is ProcessState.ERROR
    reasons = [
        m.body["reason"] for m in moved.outgoing if queue_of(m.destination) == Queue.OPERATOR_ALERTS
    ]
    assert reasons == ["applied-after-settled"]
    assert [m for m in moved.outgoing if "action" in m.body] == [], "nothing undoes a shipment"


# F: two regions of one provider share one key space.


def regions() -> Workflow:
    charge = ORDER_FULFILMENT.steps[1]
    steps = list(ORDER_FULFILMENT.steps)
    steps[1] = replace(charge, retry_elsewhere=True)
    return replace(ORDER_FULFILMENT, steps=tuple(steps))


async def test_a_late_success_from_the_other_region_is_the_same_charge_not_a_second() -> None:
    world, deps, store = routed_world(*BOTH_HEALTHY, catalogue=running(regions()))
    await reach_payment(world, deps, "o-1", high=False)
    (first,) = payment_requests(world)
    await retry_after_timeout(world, deps, store)
    (retry,) = payment_requests(world)
    assert queue_of(retry.destination) == agent_queue("payment-secondary")
    await scheduler.on_reply(deps, replace(a_reply(retry), agent="payment-secondary"))

    await scheduler.on_reply(deps, replace(a_reply(first), agent="payment"))

    assert payment_requests(world) == [], "the only charge refunded"
    assert world.bus.take(Queue.OPERATOR_ALERTS) == []
    process = await world.store.load("o-1")
    assert process is not None
    assert (process.steps[1].status, process.steps[1].agent) == (
        StepStatus.COMPLETED,
        "payment-secondary",
    )


def regions_failed_over(state: ProcessState) -> OrderProcess:
    """The charge went to payment, then (retried elsewhere) to payment-secondary, which
    the order holds it at."""
    process = finished(state)
    steps = list(process.steps)
    steps[1] = replace(steps[1], tried=("payment", "payment-secondary"))
    return replace(process, steps=tuple(steps))


def test_reconciliation_asks_one_key_space_once_and_never_refunds_its_only_charge() -> None:
    workflow = regions()
    process = regions_failed_over(ProcessState.PROCESSED)
    (check,) = [c for c in rules.checks(process, workflow) if c.step == "charge-payment"]
    # One charge, which either region answers for.
    said = {(region, CHARGE_KEY): APPLIED for region in ("payment", "payment-secondary")}

    answers = ask_all(check, said)

    now = process.state.updated_at
    assert rules.heals(process, workflow, a_policy(), check, answers, now) == (), "refunded"
    assert rules.mismatches(check, answers) == ()
    assert rules.verdict(check, answers) is rules.Verdict.MATCH
    assert list(answers) == [("payment-secondary", CHARGE_KEY)]


@pytest.mark.parametrize("state", [ProcessState.COMPENSATED, ProcessState.CANCELLED])
def test_reconciliation_of_an_undone_order_asks_its_key_space_once(state: ProcessState) -> None:
    workflow = regions()
    process = regions_failed_over(state)
    (check,) = [c for c in rules.checks(process, workflow) if c.step == "charge-payment"]
    said = {
        (region, key): APPLIED
        for region in ("payment", "payment-secondary")
        for key in (CHARGE_KEY, REFUND_KEY)
    }

    answers = ask_all(check, said)

    assert list(answers) == [("payment-secondary", REFUND_KEY)]
    assert rules.verdict(check, answers) is rules.Verdict.MATCH


def test_a_late_region_failure_is_the_shared_keys_last_word() -> None:
    """The other region's permanent failure is the one key's: a held order then cancelled
    refunds nothing (the refund would find no charge anywhere)."""
    workflow = regions()
    policy = a_policy(max_failure_count=1)
    order = an_order("o-1")
    now = order.created_at
    process = start(order, workflow, now).process
    claimed = claim(process, workflow, policy, "s-1", now)
    assert claimed is not None
    (reserve,) = [
        m for m in claimed.outgoing if queue_of(m.destination) == agent_queue("inventory")
    ]
    replied = apply_reply(claimed.process, workflow, policy, a_reply(reserve), now)
    assert replied is not None
    (first,) = [m for m in replied.outgoing if queue_of(m.destination) == agent_queue("payment")]
    # The Supervisor heard nothing by the live time: the key expired, the order is held.
    now += timedelta(seconds=PAST_LIVE_TIME)
    unanswered = RemoteOutcome.unknown("unreachable")
    held = recover(replied.process, workflow, policy, now, outcome=unanswered)
    assert held is not None
    step = held.process.steps[1]
    assert held.process.state.process_state is ProcessState.ERROR
    moved = replace(step, agent="payment-secondary", tried=("payment", "payment-secondary"))
    process = replace(held.process, steps=(held.process.steps[0], moved, *held.process.steps[2:]))

    answered = apply_reply(process, workflow, policy, late(first, "payment", Outcome.FAILED), now)

    assert answered is not None
    assert answered.process.steps[1].key_state is KeyState.NOT_APPLIED
    cancelled = cancel(answered.process, workflow, policy, now)
    assert cancelled is not None
    claimed = claim(cancelled.process, workflow, policy, "s-1", now)
    assert claimed is not None
    undone = [m.body["step"] for m in claimed.outgoing if m.body.get("action") == "compensate"]
    assert undone == ["reserve-inventory"]
