"""The chaos invariants for cancelled orders: nothing may stay applied and not undone."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from chaos import invariants
from chaos.model import Effect
from shared.domain.model import OrderProcess, ProcessState
from tests.chaos.test_invariants import a_process, effect, failing, observe

NOTHING_LEFT = "net effect: Processed in force once, Compensated or Cancelled nothing in force"


def cancelled(order_id: str, events: list[tuple[str, str]], **state: Any) -> OrderProcess:
    process = a_process(order_id, state.pop("state", ProcessState.CANCELLED), events)
    return replace(process, state=replace(process.state, cancel_requested=True, **state))


MID_STEP = [
    ("step-completed", "reserve-inventory"),
    ("cancel-requested", "by op"),
    ("timed-out", "charge-payment not completed by ..."),
    ("step-compensated", "charge-payment"),
    ("step-compensated", "reserve-inventory"),
    ("cancelled", ""),
]


def test_a_cancel_that_undid_the_step_in_doubt_passes_every_invariant() -> None:
    effects = [
        effect("c-1", "reserve-inventory"),
        effect("c-1", "charge-payment"),  # applied, its reply lost: in doubt
        effect("c-1", "refund-payment"),
        effect("c-1", "release-inventory"),
    ]
    assert failing(invariants.check_all(observe([cancelled("c-1", MID_STEP)], effects))) == {}


def test_an_undo_never_applied_for_a_step_that_never_happened_is_fine() -> None:
    effects = [
        effect("c-1", "reserve-inventory"),
        effect("c-1", "charge-payment", applied=0),
        effect("c-1", "refund-payment"),
        effect("c-1", "release-inventory"),
    ]
    assert failing(invariants.check_all(observe([cancelled("c-1", MID_STEP)], effects))) == {}


def test_an_applied_effect_left_without_its_undo_fails() -> None:
    effects = [
        effect("c-1", "reserve-inventory"),
        effect("c-1", "release-inventory"),
        effect("c-1", "charge-payment"),
    ]
    found = failing(invariants.check_all(observe([cancelled("c-1", MID_STEP)], effects)))
    (violation,) = found[NOTHING_LEFT]
    assert violation.startswith("c-1: Cancelled, left-in-force charge-payment")
    assert "in force charge-payment at payment" in violation


def test_an_undo_at_another_provider_does_not_count() -> None:
    effects = [
        Effect("payment-secondary", "charge-payment", "c-1", "c-1:charge-payment", 1, 1),
        effect("c-1", "refund-payment"),
    ]
    found = failing(invariants.check_all(observe([cancelled("c-1", MID_STEP)], effects)))
    assert NOTHING_LEFT in found


def test_undoing_out_of_order_or_ending_otherwise_fails() -> None:
    backwards = [
        ("cancel-requested", "by op"),
        ("step-compensated", "reserve-inventory"),
        ("step-compensated", "charge-payment"),
        ("cancelled", ""),
    ]
    processed = cancelled("c-2", [("processed", "")], state=ProcessState.PROCESSED)
    found = failing(invariants.check_all(observe([cancelled("c-1", backwards), processed])))
    assert any(
        "c-1" in v for v in found["compensations exactly for the completed steps, in reverse order"]
    )
    assert found["outcome matches the order"] == ("c-2: cancelled, yet Processed",)
