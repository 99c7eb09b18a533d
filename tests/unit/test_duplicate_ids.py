"""Two different messages on one queue must not share a message id: every queue drops a
message whose id it took within its duplicate-detection window, whatever its body
(docs/contract.md, section 1.1). Every agent's replies share one queue, so a reply's id
must tell apart the agents that answer for one step and attempt; the same reply sent
again (an agent's retry after a crash) must keep its id, so the broker still drops it.
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta

from shared.adapters.clock import FakeClock
from shared.domain.machine.dispatch import heal_key, undo_at
from shared.domain.machine.forward import apply_reply, claim, start
from shared.domain.machine.transition import Transition
from shared.domain.messages import AgentReply, AgentRequest
from shared.domain.model import Action, OrderProcess, Outcome, Outgoing, ProcessState, StepStatus
from tests.builders import a_policy, a_reply, an_order
from tests.workflows import ORDER_FULFILMENT

POLICY = a_policy()
CLOCK = FakeClock()


def _requests(transition: Transition) -> list[Outgoing]:
    return [m for m in transition.outgoing if m.destination.agent is not None]


def refunding() -> tuple[OrderProcess, Outgoing]:
    """order-fulfilment in one claim (attempt 1): reserved, charged at payment, the
    shipment declined, so the charge's refund is on its way to payment."""
    process = start(an_order("o-1"), ORDER_FULFILMENT, CLOCK.now()).process
    transition = claim(process, ORDER_FULFILMENT, POLICY, "scheduler-1", CLOCK.now())
    for outcome in (Outcome.SUCCEEDED, Outcome.SUCCEEDED, Outcome.FAILED):
        assert transition is not None
        (request,) = _requests(transition)
        reply = a_reply(request, outcome)
        transition = apply_reply(transition.process, ORDER_FULFILMENT, POLICY, reply, CLOCK.now())
    assert transition is not None
    process = transition.process
    (refund,) = _requests(transition)
    assert (refund.body["step"], refund.body["action"], refund.destination.agent) == (
        "charge-payment",
        "compensate",
        "payment",
    )
    assert process.state.process_state is ProcessState.COMPENSATING
    return process, refund


def test_a_compensation_reply_from_an_agent_that_does_not_hold_the_step_is_not_its_answer() -> None:
    """The refund went to payment; an undo of the same step and attempt answered by
    payment-secondary (an undo sent there for an effect the order left behind) says
    nothing of payment's refund."""
    process, refund = refunding()
    other = replace(a_reply(refund), agent="payment-secondary")

    assert apply_reply(process, ORDER_FULFILMENT, POLICY, other, CLOCK.now()) is None


def test_the_holders_compensation_reply_is_taken_and_so_is_one_from_an_older_agent() -> None:
    process, refund = refunding()
    for agent in ("payment", None):
        reply = replace(a_reply(refund), agent=agent)
        taken = apply_reply(process, ORDER_FULFILMENT, POLICY, reply, CLOCK.now())
        assert taken is not None
        assert taken.process.steps[1].status is StepStatus.COMPENSATED


def test_replies_of_two_agents_to_one_step_and_attempt_have_two_ids() -> None:
    """The order's refund at payment and an undo of the same step and attempt at
    payment-secondary (`undo_at`, reconciliation's heal): their replies share
    `agent-replies`, and the second must not be dropped as the first's duplicate."""
    process, refund = refunding()
    undo = undo_at(
        process,
        ORDER_FULFILMENT.steps[1],
        POLICY,
        "payment-secondary",
        process.state.attempt,
        {"paymentId": "p-2"},
        CLOCK.now() + timedelta(seconds=1),
    )
    own = _answered(refund, "payment")
    extra = _answered(undo, "payment-secondary")

    assert own.destination == extra.destination
    assert own.message_id != extra.message_id


def test_a_heal_at_the_holder_and_the_orders_own_undo_there_have_two_reply_ids() -> None:
    """The order's refund at payment found nothing to undo (its charge was held on the
    network), the charge applied after it, and reconciliation's heal goes to payment
    under the heal key, at the order's last attempt: the one its refund went in."""
    process, refund = refunding()
    heal = undo_at(
        process,
        ORDER_FULFILMENT.steps[1],
        POLICY,
        "payment",
        process.state.attempt,
        {"paymentId": "p-1"},
        CLOCK.now() + timedelta(seconds=1),
        key=heal_key(str(refund.body["idempotencyKey"])),
    )

    assert _answered(refund, "payment").message_id != _answered(heal, "payment").message_id
    assert _answered(heal, "payment").message_id == _answered(heal, "payment").message_id
    assert "key" not in _answered(heal, "payment").body


def test_the_same_reply_sent_again_keeps_its_id() -> None:
    """An agent that crashed after its send answers the request again: the broker must
    drop the second copy."""
    _, refund = refunding()

    assert _answered(refund, "payment").message_id == _answered(refund, "payment").message_id


def test_a_reply_from_an_agent_older_than_the_agent_field_keeps_the_id_it_had() -> None:
    _, refund = refunding()
    reply = AgentRequest.parse(_json(refund)).answer(Outcome.SUCCEEDED)

    assert reply.outgoing().message_id == "rep:o-1:charge-payment:compensate:1"


def _answered(request: Outgoing, agent: str) -> Outgoing:
    reply: AgentReply = AgentRequest.parse(_json(request)).answer(
        Outcome.SUCCEEDED, result={"undone": True}, agent=agent
    )
    assert reply.action is Action.COMPENSATE
    return reply.outgoing()


def _json(message: Outgoing) -> str:
    return json.dumps(message.body)
