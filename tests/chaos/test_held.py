"""Why each order left in Error is there (chaos/held.py), as the report shows it."""

from __future__ import annotations

from dataclasses import replace

from chaos.held import HeldOrder, left_in_error
from chaos.model import Alert
from shared.domain.model import OrderProcess, ProcessState
from tests.chaos.test_invariants import (
    STEPS,
    a_process,
    effect,
    express,
    express_processed,
    observe,
)


def with_last_error(process: OrderProcess, last_error: str) -> OrderProcess:
    return replace(process, state=replace(process.state, last_error=last_error))


def rejected_twice(order_id: str) -> OrderProcess:
    """Its notification rejected for good, resubmitted, and rejected again (the history
    as the state machine writes it: the resubmit and its requeue are both `resubmitted`)."""
    events = [("step-completed", s) for s in STEPS]
    events += [
        ("step-failed", "notify-customer: rejected"),
        ("resubmitted", "by chaos"),
        ("resubmitted", "nudge at 2026-01-01T00:00:09+00:00"),
        ("step-failed", "notify-customer: rejected"),
    ]
    held = express(order_id, ProcessState.ERROR, events, current_step=3)
    return with_last_error(held, "notify-customer: rejected: Rejected")


def test_a_rejected_notification_is_held_as_planned_with_the_shipment_in_force() -> None:
    obs = observe(
        [rejected_twice("x-held"), express_processed("x-ok")],
        [
            *(effect("x-held", s) for s in STEPS),
            effect("x-held", "notify-customer", applied=0),
            *(effect("x-ok", s) for s in (*STEPS, "notify-customer")),
        ],
        alerts=[Alert("x-held", "retriable-step-failed", 0)] * 2,
        failing={"x-held": "notifications"},
    )
    assert left_in_error(obs) == [
        HeldOrder(
            "x-held",
            "express-delivery",
            "notify-customer",
            "rejected",
            ("retriable-step-failed x2",),
            "notifications rejects PERM-NOTIFICATIONS at notify-customer",
            True,
            1,
            (
                "reserve-inventory at inventory",
                "charge-payment at payment",
                "create-shipment at shipping",
            ),
        )
    ]


def test_an_order_held_after_timeouts_is_named_unplanned_with_its_alert() -> None:
    timed_out = a_process(
        "o-held",
        ProcessState.ERROR,
        [("step-completed", "reserve-inventory"), ("timed-out", "charge-payment")],
        failure_count=3,
        current_step=1,
    )
    last_error = "charge-payment not completed by 2026-01-01T00:00:09+00:00"
    obs = observe(
        [with_last_error(timed_out, last_error)],
        [effect("o-held", "reserve-inventory"), effect("o-held", "charge-payment", applied=0)],
        alerts=[Alert("o-held", "max-failure-count-reached", 3)],
    )
    [held] = left_in_error(obs)
    assert (held.step, held.error_code, held.alerts) == (
        "charge-payment",
        "timeout",
        ("max-failure-count-reached",),
    )
    assert (held.planned, held.as_planned, held.resubmits) == (None, False, 0)
    assert held.in_force == ("reserve-inventory at inventory",)
