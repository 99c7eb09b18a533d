"""The model's broker holds Service Bus duplicate detection (tests/model/world.py
`_broker`): a message whose id its queue took within the window is dropped, and the
`one-id-one-message` invariant fails when the dropped one was another message."""

from __future__ import annotations

from dataclasses import replace

import pytest

from shared.domain.messages import AgentReply
from shared.domain.model import Outgoing
from tests.model.invariants import one_id_one_message
from tests.model.setups import DEFAULT
from tests.model.wire import Reply, Request
from tests.model.world import OrderWorld

UNDO = "o-1:refund-payment"


def _refunds() -> tuple[Reply, Reply]:
    """The order's refund at payment and an undo of the same step and attempt at
    payment-secondary, both answered."""
    at = [
        Request(agent, "charge-payment", True, UNDO, 3, 40, "o-1:charge-payment")
        for agent in ("payment", "payment-secondary")
    ]
    return Reply(at[0], True), Reply(at[1], True)


def test_two_agents_answering_one_step_and_attempt_are_both_heard() -> None:
    model = OrderWorld(setup=DEFAULT)
    own, other = _refunds()

    replied = model._replied(model.initial(), (own, other))

    assert {own, other} <= replied.replies
    assert one_id_one_message(replied) is None


def test_a_reply_sent_again_is_dropped_as_the_duplicate_it_is() -> None:
    model = OrderWorld(setup=DEFAULT)
    own, _ = _refunds()
    first = model._replied(model.initial(), (own,))
    consumed = first.replies - {own}

    again = model._replied(replace(first, replies=consumed), (own,))

    assert own not in again.replies
    assert one_id_one_message(again) is None


def test_replies_whose_ids_did_not_name_the_agent_are_seen_colliding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Reply ids as they were: the second agent's answer is dropped, and the invariant
    names it."""
    outgoing = AgentReply.outgoing

    def unnamed(self: AgentReply, *, high: bool = False) -> Outgoing:
        old = f"rep:{self.order_id}:{self.step}:{self.action.value}:{self.attempt}"
        return replace(outgoing(self, high=high), message_id=old)

    monkeypatch.setattr(AgentReply, "outgoing", unnamed)
    model = OrderWorld(setup=DEFAULT)
    own, other = _refunds()

    replied = model._replied(model.initial(), (own, other))

    assert other not in replied.replies
    message = one_id_one_message(replied)
    assert message is not None and "payment-secondary" in message
