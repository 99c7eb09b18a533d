"""The net-effect judge on hand-built ledgers: each way an order can leave the world
wrong is named, with the order, what is in force where and the ledger that shows it."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from devhost.simulator.judge import (
    LedgerEntry,
    OrderToJudge,
    Problem,
    Step,
    Verdict,
    in_force,
    judge,
)
from tests.simulator.conftest import SimClient

T0 = datetime(2026, 1, 1, tzinfo=UTC)
STEPS = (
    Step("reserve-inventory", "release-inventory"),
    Step("charge-payment", "refund-payment"),
    Step("create-shipment", "cancel-shipment"),
)
SERVICE = {
    "reserve-inventory": "inventory",
    "release-inventory": "inventory",
    "charge-payment": "payment",
    "refund-payment": "payment",
    "create-shipment": "shipping",
    "cancel-shipment": "shipping",
}
UNDOES = {s.undo: s.do for s in STEPS}


def do(order: str, operation: str, at: int, service: str | None = None) -> LedgerEntry:
    return LedgerEntry(
        service=service or SERVICE[operation],
        operation=operation,
        order_id=order,
        idempotency_key=f"{order}:{operation}",
        applied=True,
        applied_at=T0 + timedelta(seconds=at),
        first_call_at=T0 + timedelta(seconds=at),
    )


def undo(
    order: str, operation: str, at: int, *, undone: bool = True, service: str | None = None
) -> LedgerEntry:
    return LedgerEntry(
        service=service or SERVICE[operation],
        operation=operation,
        order_id=order,
        idempotency_key=f"{order}:{operation}",
        applied=True,
        applied_at=T0 + timedelta(seconds=at),
        first_call_at=T0 + timedelta(seconds=at),
        undoes=f"{order}:{UNDOES[operation]}",
        undone=undone,
    )


def processed(order: str, start: int = 0) -> list[LedgerEntry]:
    return [do(order, s.do, start + i) for i, s in enumerate(STEPS)]


def verdict(entries: list[LedgerEntry], *orders: tuple[str, str]) -> Verdict:
    return judge(entries, [OrderToJudge(o, state) for o, state in orders], STEPS)


def test_a_processed_order_with_each_step_in_force_once_passes() -> None:
    result = verdict(processed("o-1"), ("o-1", "Processed"))

    assert result.passed
    assert result.judged == ("o-1",)


def test_a_compensation_after_each_do_leaves_nothing_in_force() -> None:
    ledger = [
        do("o-1", "reserve-inventory", 1),
        do("o-1", "charge-payment", 2),
        undo("o-1", "refund-payment", 3),
        undo("o-1", "release-inventory", 4),
    ]

    assert verdict(ledger, ("o-1", "Compensated")).passed


def test_a_refund_that_found_nothing_before_the_charge_applied_leaves_the_charge() -> None:
    ledger = [
        do("o-1", "reserve-inventory", 1),
        undo("o-1", "refund-payment", 2, undone=False),
        do("o-1", "charge-payment", 3),
        undo("o-1", "release-inventory", 4),
    ]

    [violation] = verdict(ledger, ("o-1", "Compensated")).violations

    assert (violation.order_id, violation.state) == ("o-1", "Compensated")
    assert (violation.problem, violation.step) == (Problem.LEFT_IN_FORCE, "charge-payment")
    assert [(f.service, f.key) for f in violation.in_force] == [("payment", "o-1:charge-payment")]
    assert [e.operation for e in violation.sequence] == ["refund-payment", "charge-payment"]
    text = str(violation)
    assert "nothing-to-undo for o-1:charge-payment" in text
    assert text.index("refund-payment") < text.index("charge-payment o-1:charge-payment: applied")


def test_an_undo_counts_only_after_its_do_in_applied_order() -> None:
    """A ledger claiming an undo before its do (impossible from the simulator, which only
    undoes an applied do) does not undo it: order is what the judge reads."""
    ledger = [undo("o-1", "refund-payment", 1), do("o-1", "charge-payment", 2)]

    [violation] = verdict(ledger, ("o-1", "Cancelled")).violations

    assert (violation.problem, violation.step) == (Problem.LEFT_IN_FORCE, "charge-payment")


def test_only_an_undo_that_undid_counts_whatever_its_place() -> None:
    """The provider's own word (``undone``) decides, not the entry's place: a refund that
    said nothing-to-undo undid nothing, even listed after the charge."""
    ledger = [do("o-1", "charge-payment", 1), undo("o-1", "refund-payment", 2, undone=False)]

    [violation] = verdict(ledger, ("o-1", "Compensated")).violations

    assert violation.step == "charge-payment"


def test_an_undo_undoes_the_key_it_names_at_its_own_service() -> None:
    other_key = replace(undo("o-1", "refund-payment", 3), undoes="o-1:charge-payment:2")
    elsewhere = undo("o-1", "refund-payment", 4, service="payment-secondary")
    ledger = [do("o-1", "charge-payment", 1), other_key, elsewhere]

    [violation] = verdict(ledger, ("o-1", "Compensated")).violations

    assert violation.in_force[0].service == "payment"


def test_a_do_in_force_at_two_services_of_a_processed_order() -> None:
    ledger = [*processed("o-1"), do("o-1", "charge-payment", 9, service="payment-secondary")]

    [violation] = verdict(ledger, ("o-1", "Processed")).violations

    assert (violation.problem, violation.step) == (Problem.IN_FORCE_TWICE, "charge-payment")
    assert sorted(f.service for f in violation.in_force) == ["payment", "payment-secondary"]
    assert "in force charge-payment at payment" in str(violation)


def test_a_step_moved_to_another_service_with_the_first_effect_undone_passes() -> None:
    ledger = [
        *processed("o-1"),
        do("o-1", "charge-payment", 9, service="payment-secondary"),
        undo("o-1", "refund-payment", 10, service="payment-secondary"),
    ]

    assert verdict(ledger, ("o-1", "Processed")).passed


def test_a_do_in_force_on_a_cancelled_order() -> None:
    ledger = [
        do("o-1", "reserve-inventory", 1),
        do("o-1", "charge-payment", 2),
        undo("o-1", "release-inventory", 3),
    ]

    [violation] = verdict(ledger, ("o-1", "Cancelled")).violations

    assert (violation.state, violation.problem) == ("Cancelled", Problem.LEFT_IN_FORCE)
    assert violation.step == "charge-payment"


def test_a_processed_order_missing_a_step() -> None:
    ledger = processed("o-1")[:2]
    not_applied = LedgerEntry("shipping", "create-shipment", "o-1", "o-1:create-shipment", False)

    [violation] = verdict([*ledger, not_applied], ("o-1", "Processed")).violations

    assert (violation.problem, violation.step) == (Problem.MISSING_STEP, "create-shipment")
    assert violation.in_force == ()
    assert "in force nowhere" in str(violation)
    assert "create-shipment o-1:create-shipment: not applied" in str(violation)


def test_a_processed_order_whose_step_was_undone_is_missing_it() -> None:
    ledger = [*processed("o-1"), undo("o-1", "cancel-shipment", 9)]

    [violation] = verdict(ledger, ("o-1", "Processed")).violations

    assert (violation.problem, violation.step) == (Problem.MISSING_STEP, "create-shipment")


def test_orders_are_judged_apart_and_unfinished_ones_not_at_all() -> None:
    ledger = [*processed("o-1"), do("o-2", "reserve-inventory", 5)]

    result = verdict(ledger, ("o-1", "Processed"), ("o-2", "Processing"), ("o-3", "Compensated"))

    assert result.passed
    assert result.judged == ("o-1", "o-3")


def test_an_order_not_yet_past_its_complete_by_is_not_judged() -> None:
    ledger = [do("o-1", "charge-payment", 1)]
    orders = [
        OrderToJudge("o-1", "Cancelled", settles_at=T0 + timedelta(seconds=30)),
        OrderToJudge("o-2", "Cancelled", settles_at=T0 + timedelta(seconds=5)),
    ]

    result = judge(ledger, orders, STEPS, now=T0 + timedelta(seconds=10))
    later = judge(ledger, orders, STEPS, now=T0 + timedelta(seconds=31))

    assert (result.not_yet, result.judged, result.passed) == (("o-1",), ("o-2",), True)
    assert [v.order_id for v in later.violations] == ["o-1"]


def test_in_force_lists_each_order_in_applied_order() -> None:
    ledger = [do("o-1", "charge-payment", 2), do("o-1", "reserve-inventory", 1)]

    assert [f.step for f in in_force(ledger, STEPS)["o-1"]] == [
        "reserve-inventory",
        "charge-payment",
    ]


async def test_the_judge_reads_the_simulators_ledger(sim: SimClient) -> None:
    """End to end through the simulator: the refund before the charge is caught."""
    refund = {"orderId": "o-1", "idempotencyKey": "o-1:refund-payment", "payload": {}}
    await sim.request("POST", "/payment/refund-payment", json=refund)
    await sim.call("payment", "charge-payment", "o-1", "o-1:charge-payment")

    entries = [LedgerEntry.from_json(e) for e in await sim.effects()]
    result = judge(entries, [OrderToJudge("o-1", "Cancelled")], STEPS)

    [violation] = result.violations
    assert violation.step == "charge-payment"
    assert [e.undone for e in violation.sequence] == [False, None]
