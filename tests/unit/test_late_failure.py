"""A failure reply that comes after the order stopped waiting for it is still the
provider's last word on the key. Found by the explorer's deep bound (tests/model, core
depth 13, `pointless-undo`): the charge is rejected, its reply is late, a sweep past the
request's live time gets no answer, and the refund then went out for a charge the
provider had told the order it never took."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from shared.domain.in_doubt import RemoteOutcome, RemoteOutcomeKind
from shared.domain.machine.forward import apply_reply, claim, start
from shared.domain.machine.operator import cancel
from shared.domain.machine.recovery import recover
from shared.domain.model import (
    KeyState,
    OrderProcess,
    Outcome,
    Outgoing,
    Phase,
    ProcessState,
    StepStatus,
)
from tests.builders import a_policy, a_reply, an_order
from tests.workflows import ORDER_FULFILMENT

POLICY = a_policy()
NO_ANSWER = RemoteOutcome(RemoteOutcomeKind.UNKNOWN, detail="unreachable")


def requests(outgoing: tuple[Outgoing, ...]) -> list[tuple[str, str]]:
    return [(m.body["step"], m.body["action"]) for m in outgoing if "action" in m.body]


def charging() -> tuple[OrderProcess, Outgoing]:
    """Inventory reserved, the charge sent (attempt 1) and not answered."""
    order = an_order("o-1")
    t0 = order.created_at
    process = start(order, ORDER_FULFILMENT, t0).process
    claimed = claim(process, ORDER_FULFILMENT, POLICY, "s-1", t0)
    assert claimed is not None
    (reserve,) = [m for m in claimed.outgoing if m.body.get("action") == "do"]
    replied = apply_reply(claimed.process, ORDER_FULFILMENT, POLICY, a_reply(reserve), t0)
    assert replied is not None
    (charge,) = [m for m in replied.outgoing if m.body.get("action") == "do"]
    assert charge.body["step"] == "charge-payment"
    return replied.process, charge


def past_live_time(process: OrderProcess) -> OrderProcess:
    """The Supervisor at the charge's live time, asking payment and getting no answer."""
    step = process.steps[1]
    assert step.live_until is not None
    recovered = recover(
        process, ORDER_FULFILMENT, POLICY, step.live_until + timedelta(seconds=1), outcome=NO_ANSWER
    )
    assert recovered is not None
    return recovered.process


def test_a_late_rejection_ends_the_retry_and_compensates_without_a_refund() -> None:
    process, charge = charging()
    waiting = past_live_time(process)
    assert (waiting.state.process_state, waiting.state.phase) == (
        ProcessState.PENDING,
        Phase.FORWARD,
    )
    late = apply_reply(
        waiting, ORDER_FULFILMENT, POLICY, a_reply(charge, Outcome.FAILED), waiting.state.updated_at
    )
    assert late is not None
    step = late.process.steps[1]
    assert (step.status, step.key_state) == (StepStatus.FAILED, KeyState.NOT_APPLIED)
    assert late.process.state.process_state is ProcessState.COMPENSATING
    assert requests(late.outgoing) == [("reserve-inventory", "compensate")]


def test_a_late_rejection_during_a_cancel_means_no_refund() -> None:
    process, charge = charging()
    t0 = process.state.updated_at
    cancelled = cancel(process, ORDER_FULFILMENT, POLICY, t0 + timedelta(seconds=1))
    assert cancelled is not None
    settling = past_live_time(cancelled.process)
    assert settling.state.phase is Phase.COMPENSATE
    late = apply_reply(
        settling,
        ORDER_FULFILMENT,
        POLICY,
        a_reply(charge, Outcome.FAILED),
        settling.state.updated_at,
    )
    assert late is not None
    assert late.process.steps[1].key_state is KeyState.NOT_APPLIED
    now = late.process.state.updated_at
    claimed = claim(late.process, ORDER_FULFILMENT, POLICY, "s-1", now)
    assert claimed is not None
    assert requests(claimed.outgoing) == [("reserve-inventory", "compensate")]


def test_a_late_rejection_from_a_provider_the_order_left_changes_nothing() -> None:
    process, charge = charging()
    waiting = past_live_time(process)
    elsewhere = replace(a_reply(charge, Outcome.FAILED), agent="payment-secondary")
    assert (
        apply_reply(waiting, ORDER_FULFILMENT, POLICY, elsewhere, waiting.state.updated_at) is None
    )
