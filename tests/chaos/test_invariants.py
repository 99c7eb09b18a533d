"""The chaos invariants are pure checks: each one passes on a healthy run and names the
order and the problem on a broken one."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from chaos import invariants
from chaos.model import (
    Accepted,
    Alert,
    Check,
    Convergence,
    Effect,
    Figures,
    Heard,
    InvariantResult,
    LateEvent,
    Observations,
    PlannedOrder,
    Sample,
    SentEvent,
)
from chaos.report import stories
from shared.domain.failures import timed_out
from shared.domain.in_doubt import RemoteOutcome
from shared.domain.machine.dispatch import heal_key
from shared.domain.machine.events import receive_event
from shared.domain.machine.forward import apply_reply, claim, start
from shared.domain.machine.operator import PastPivot, cancel
from shared.domain.machine.recovery import recover
from shared.domain.machine.transition import InvalidTransition, Transition
from shared.domain.machine.waits import wake
from shared.domain.model import (
    HistoryEntry,
    Order,
    OrderLine,
    OrderProcess,
    Outcome,
    Phase,
    Priority,
    ProcessState,
    StateRecord,
    StepRecord,
)
from shared.domain.reconcile import FINISHED, MISMATCH_REASON
from shared.domain.workflow import Workflow
from tests.builders import a_policy, a_reply
from tests.workflows import EXPRESS_DELIVERY, ORDER_FULFILMENT, REVIEWED_ORDER, SCHEDULED_DELIVERY

T0 = datetime(2026, 1, 1, tzinfo=UTC)
STEPS = ("reserve-inventory", "charge-payment", "create-shipment")
UNDO = {
    "reserve-inventory": "release-inventory",
    "charge-payment": "refund-payment",
    "create-shipment": "cancel-shipment",
}
SERVICE = {
    "reserve-inventory": "inventory",
    "release-inventory": "inventory",
    "charge-payment": "payment",
    "refund-payment": "payment",
    "create-shipment": "shipping",
    "cancel-shipment": "shipping",
    "notify-customer": "notifications",
}
EXPRESS = "express-delivery"
EXPRESS_STEPS = (*STEPS, "notify-customer")


def an_order(order_id: str) -> Order:
    return Order(order_id, "c-1", (OrderLine("S", 1, 1.0),), Priority.NORMAL, None, "fp", T0)


def a_process(
    order_id: str,
    state: ProcessState,
    events: Iterable[tuple[str, str]] = (),
    *,
    locked_by: str | None = None,
    failure_count: int = 0,
    workflow: str = ORDER_FULFILMENT.name,
    current_step: int = 0,
) -> OrderProcess:
    history = tuple(
        HistoryEntry(T0 + timedelta(seconds=i), event, detail, state, failure_count, 1)
        for i, (event, detail) in enumerate(events)
    )
    record = StateRecord(
        order_id=order_id,
        process_state=state,
        locked_by=locked_by,
        complete_by=None,
        failure_count=failure_count,
        attempt=1,
        phase=Phase.FORWARD,
        current_step=current_step,
        last_error=None,
        version=len(history),
        created_at=T0,
        updated_at=T0,
        workflow=workflow,
        cancel_requested=any(h.event == "cancel-requested" for h in history),
    )
    return OrderProcess(an_order(order_id), record, (), "etag", history)


def processed(order_id: str) -> OrderProcess:
    return a_process(
        order_id,
        ProcessState.PROCESSED,
        [("step-completed", s) for s in STEPS] + [("processed", "")],
    )


def compensated(order_id: str, completed: Sequence[str], failed: str) -> OrderProcess:
    events = [("step-completed", s) for s in completed]
    events.append(("step-failed", f"{failed}: card-declined"))
    events += [("step-compensated", s) for s in reversed(completed)]
    events.append(("compensated", ""))
    return a_process(order_id, ProcessState.COMPENSATED, events)


_ticks = itertools.count(1)
DO_OF = {undo: do for do, undo in UNDO.items()}


def effect(
    order_id: str,
    operation: str,
    applied: int = 1,
    key: str | None = None,
    *,
    service: str | None = None,
    undone: bool | None = None,
) -> Effect:
    """A ledger row stamped later than every row built before it; an applied undo undid
    its do unless told otherwise."""
    at = T0 + timedelta(milliseconds=next(_ticks))
    undoes = f"{order_id}:{DO_OF[operation]}" if operation in DO_OF else None
    if undoes is not None and applied and undone is None:
        undone = True
    return Effect(
        service or SERVICE[operation],
        operation,
        order_id,
        key or f"{order_id}:{operation}",
        1,
        applied,
        applied_at=at if applied else None,
        first_call_at=at,
        undoes=undoes,
        undone=undone,
    )


def effects_of_processed(order_id: str) -> list[Effect]:
    return [effect(order_id, s) for s in STEPS]


def effects_of_compensated(order_id: str, completed: Sequence[str], failed: str) -> list[Effect]:
    found = [effect(order_id, s) for s in completed]
    found.append(effect(order_id, failed, applied=0))
    found += [effect(order_id, UNDO[s]) for s in reversed(completed)]
    return found


def observe(
    processes: Iterable[OrderProcess],
    effects: Iterable[Effect] = (),
    *,
    alerts: Iterable[Alert] = (),
    samples: Iterable[Sample] = (),
    failing: dict[str, str] | None = None,
    terminal_at: float | None = 30.0,
    cancels: dict[str, tuple[str, ...]] | None = None,
) -> Observations:
    """Each order planned on the workflow it is stored with."""
    by_id = {p.order_id: p for p in processes}
    failing = failing or {}
    planned = {
        i: PlannedOrder(i, {"orderId": i}, failing.get(i), p.state.workflow)
        for i, p in by_id.items()
    }
    return Observations(
        workflow=ORDER_FULFILMENT,
        max_failure_count=3,
        planned=planned,
        accepted={i: Accepted(i, 1.0, "a", 1) for i in by_id},
        processes=by_id,
        effects=tuple(effects),
        alerts=tuple(alerts),
        samples=tuple(samples),
        last_submission_at=10.0,
        terminal_at=terminal_at,
        bound_seconds=100.0,
        reconciled=sum(p.state.process_state in FINISHED for p in by_id.values()),
        workflows={EXPRESS: EXPRESS_DELIVERY},
        cancel_answers=cancels or {},
        rest_index={
            i: (p.state.process_state,)
            for i, p in by_id.items()
            if p.state.process_state.is_at_rest
        },
    )


def test_a_rest_index_that_trails_or_outlives_its_rows_fails() -> None:
    obs = healthy()
    assert obs.rest_index is not None
    order_id, process = next(iter(obs.processes.items()))
    state = process.state.process_state
    missing = {k: v for k, v in obs.rest_index.items() if k != order_id}
    trailing = invariants.rest_index_agrees_with_state_rows(replace(obs, rest_index=missing))
    assert trailing.violations == (f"{order_id}: {state.value} in its row, but filed as no entry",)
    stale = {**obs.rest_index, order_id: (state, ProcessState.ERROR)}
    twice = invariants.rest_index_agrees_with_state_rows(replace(obs, rest_index=stale))
    assert not twice.passed
    gone = {**obs.rest_index, "purged-1": (ProcessState.PROCESSED,)}
    outlived = invariants.rest_index_agrees_with_state_rows(replace(obs, rest_index=gone))
    assert outlived.violations == ("purged-1: a rest entry but no row",)
    assert invariants.rest_index_agrees_with_state_rows(obs).passed


def failing(results: Iterable[InvariantResult]) -> dict[str, tuple[str, ...]]:
    return {r.name: r.violations for r in results if not r.passed}


def healthy() -> Observations:
    return observe(
        [
            processed("ok-1"),
            compensated("comp-0", [], "reserve-inventory"),
            compensated("comp-2", ["reserve-inventory", "charge-payment"], "create-shipment"),
        ],
        [
            *effects_of_processed("ok-1"),
            *effects_of_compensated("comp-0", [], "reserve-inventory"),
            *effects_of_compensated(
                "comp-2", ["reserve-inventory", "charge-payment"], "create-shipment"
            ),
        ],
        failing={"comp-0": "inventory", "comp-2": "shipping"},
    )


def test_a_healthy_run_passes_every_invariant() -> None:
    results = invariants.check_all(healthy())
    assert failing(results) == {}
    assert len(results) == len(invariants.CHECKS)


def test_histories_made_by_the_real_state_machine_pass() -> None:
    """The checks read history the way the state machine writes it (event names, details)."""
    policy = a_policy(step_timeout=4)
    order = an_order("real-1")
    transition = start(order, ORDER_FULFILMENT, T0)
    history = list(transition.history)
    process = transition.process
    claimed = claim(process, ORDER_FULFILMENT, policy, "i-1", T0)
    assert claimed is not None
    history += claimed.history
    process, request = claimed.process, claimed.outgoing[0]  # the agent request goes first
    for outcome in (Outcome.SUCCEEDED, Outcome.SUCCEEDED, Outcome.FAILED):
        step = apply_reply(process, ORDER_FULFILMENT, policy, a_reply(request, outcome), T0)
        assert step is not None
        history += step.history
        process, request = step.process, step.outgoing[-1]
    for _ in range(2):
        undo = apply_reply(process, ORDER_FULFILMENT, policy, a_reply(request), T0)
        assert undo is not None
        history += undo.history
        process = undo.process
        if undo.outgoing:
            request = undo.outgoing[-1]
    assert process.state.process_state is ProcessState.COMPENSATED
    final = replace(process, history=tuple(history))
    completed = ["reserve-inventory", "charge-payment"]
    obs = observe(
        [final],
        effects_of_compensated("real-1", completed, "create-shipment"),
        failing={"real-1": "shipping"},
    )
    assert failing(invariants.check_all(obs)) == {}


def test_an_order_not_terminal_or_missing_or_late_fails() -> None:
    obs = observe([processed("ok-1"), a_process("stuck-1", ProcessState.PENDING)], terminal_at=None)
    obs = replace(obs, accepted={**obs.accepted, "lost-1": Accepted("lost-1", 2.0, "b", 1)})
    violations = invariants.all_terminal_within_bound(obs).violations
    assert any("lost-1" in v and "not in the state store" in v for v in violations)
    assert any("stuck-1" in v and "Pending" in v for v in violations)
    assert any("never saw every accepted order terminal" in v for v in violations)
    late = invariants.all_terminal_within_bound(
        observe([processed("ok-1")], effects_of_processed("ok-1"), terminal_at=200.0)
    )
    assert not late.passed and "beyond the bound" in late.violations[0]


def test_an_accepted_order_missing_from_the_store_is_reported_lost() -> None:
    obs = observe([processed("ok-1")], effects_of_processed("ok-1"))
    assert invariants.no_accepted_order_lost(obs).passed
    lost = replace(obs, accepted={**obs.accepted, "lost-1": Accepted("lost-1", 2.0, "b", 1)})
    (violation,) = failing(invariants.check_all(lost))["no accepted order lost"]
    assert violation.startswith("lost-1: accepted (202) by runtime b at 2.0 s")
    assert violation.endswith("LOST")


def test_an_effect_applied_twice_fails() -> None:
    effects = [*effects_of_processed("ok-1")[:2], effect("ok-1", "create-shipment", applied=2)]
    result = invariants.effects_applied_at_most_once(observe([processed("ok-1")], effects))
    assert result.violations == (
        "ok-1: create-shipment applied 2 times (key ok-1:create-shipment)",
    )


def test_a_step_in_force_at_two_providers_fails() -> None:
    charged_twice = [
        *effects_of_processed("ok-1"),
        effect("ok-1", "charge-payment", service="payment-secondary"),
    ]
    (violation,) = invariants.net_effect_judged(
        observe([processed("ok-1")], charged_twice)
    ).violations
    assert violation.startswith("ok-1: Processed, in-force-twice charge-payment: in force")
    assert "at payment (key" in violation and "at payment-secondary (key" in violation
    undone_there = [
        *charged_twice,
        effect("ok-1", "refund-payment", service="payment-secondary"),
    ]
    assert invariants.net_effect_judged(observe([processed("ok-1")], undone_there)).passed


def test_a_refund_that_found_nothing_before_its_charge_leaves_the_charge() -> None:
    """Counting `applied` sees a charge and a refund; the judge sees their order."""
    process = compensated("comp-1", ["reserve-inventory", "charge-payment"], "create-shipment")
    late_charge = [
        effect("comp-1", "reserve-inventory"),
        effect("comp-1", "refund-payment", undone=False),
        effect("comp-1", "charge-payment"),
        effect("comp-1", "create-shipment", applied=0),
        effect("comp-1", "release-inventory"),
    ]
    obs = observe([process], late_charge, failing={"comp-1": "shipping"})
    (violation,) = failing(invariants.check_all(obs))[
        "net effect: Processed in force once, Compensated or Cancelled nothing in force"
    ]
    assert violation.startswith("comp-1: Compensated, left-in-force charge-payment")
    assert "nothing-to-undo for comp-1:charge-payment" in violation
    undid = invariants.compensations_exactly_for_completed_steps(obs).violations
    assert any("services undid ['reserve-inventory']" in v for v in undid)


def test_a_cancelled_order_with_an_effect_in_force_fails() -> None:
    cancelled = a_process("cx-1", ProcessState.CANCELLED, [("cancel-requested", "by chaos")])
    left = [effect("cx-1", "reserve-inventory"), effect("cx-1", "charge-payment")]
    left.append(effect("cx-1", "refund-payment"))
    (violation,) = invariants.net_effect_judged(observe([cancelled], left)).violations
    assert violation.startswith("cx-1: Cancelled, left-in-force reserve-inventory")


def test_a_processed_order_missing_a_step_at_the_services_fails() -> None:
    (violation,) = invariants.net_effect_judged(
        observe([processed("ok-1")], effects_of_processed("ok-1")[:2])
    ).violations
    assert violation.startswith("ok-1: Processed, missing-step create-shipment: in force nowhere")


def test_a_foreign_or_second_idempotency_key_fails() -> None:
    effects = [
        *effects_of_processed("ok-1"),
        effect("ok-1", "charge-payment", applied=0, key="ok-1:charge-payment:2"),
    ]
    violations = invariants.one_key_per_order_and_operation(
        observe([processed("ok-1")], effects)
    ).violations
    assert any("not 'ok-1:charge-payment'" in v for v in violations)


def test_a_later_round_only_after_every_earlier_one_never_applied() -> None:
    """An operator's resubmit sends an operation refused for good under the next round
    (shared/domain/machine/rekey.py): fine once the earlier round never applied; after it
    applied, or skipping a round, a second effect could follow."""
    refused = [
        *effects_of_processed("ok-1"),
        effect("ok-1", "notify-customer", applied=0),
        effect("ok-1", "notify-customer", key="ok-1:notify-customer:r2"),
    ]
    check = invariants.one_key_per_order_and_operation
    assert check(observe([processed("ok-1")], refused)).violations == ()
    twice = [
        *effects_of_processed("ok-1"),
        effect("ok-1", "charge-payment", key="ok-1:charge-payment:r2"),
    ]
    (violation,) = check(observe([processed("ok-1")], twice)).violations
    assert violation == "ok-1: charge-payment sent under a later round after round 0 applied"
    skipped = [
        effect("ok-1", "notify-customer", applied=0),
        effect("ok-1", "notify-customer", key="ok-1:notify-customer:r3"),
    ]
    (violation,) = check(observe([processed("ok-1")], skipped)).violations
    assert violation == "ok-1: notify-customer called under rounds [0, 2]"


def test_compensation_out_of_order_or_incomplete_fails() -> None:
    completed = ["reserve-inventory", "charge-payment"]
    wrong_order = a_process(
        "comp-1",
        ProcessState.COMPENSATED,
        [
            *(("step-completed", s) for s in completed),
            ("step-failed", "create-shipment: address-rejected"),
            *(("step-compensated", s) for s in completed),  # not reversed
        ],
    )
    effects = [
        *(effect("comp-1", s) for s in completed),
        effect("comp-1", "release-inventory"),  # the services undid in the wrong order too
        effect("comp-1", "refund-payment"),
    ]
    violations = invariants.compensations_exactly_for_completed_steps(
        observe([wrong_order], effects)
    ).violations
    assert any(
        "history compensated ['reserve-inventory', 'charge-payment']" in v for v in violations
    )
    assert any("services undid ['reserve-inventory', 'charge-payment']" in v for v in violations)

    missing = a_process(
        "comp-2",
        ProcessState.COMPENSATED,
        [*(("step-completed", s) for s in completed), ("step-compensated", "charge-payment")],
    )
    result = invariants.compensations_exactly_for_completed_steps(
        observe(
            [missing],
            [*(effect("comp-2", s) for s in completed), effect("comp-2", UNDO[completed[1]])],
        )
    )
    assert any("Compensated with completed" in v for v in result.violations)


def test_a_processed_order_with_a_compensation_call_fails() -> None:
    effects = [*effects_of_processed("ok-1"), effect("ok-1", "refund-payment", applied=0)]
    result = invariants.compensations_exactly_for_completed_steps(
        observe([processed("ok-1")], effects)
    )
    assert result.violations == (
        "ok-1: Processed but compensations were called: ['refund-payment']",
    )


def test_an_error_order_may_stop_part_way_through_its_compensation() -> None:
    completed = ["reserve-inventory", "charge-payment", "create-shipment"]
    held = a_process(
        "held-1",
        ProcessState.ERROR,
        [*(("step-completed", s) for s in completed), ("step-compensated", "create-shipment")],
    )
    effects = [
        *(effect("held-1", s) for s in completed),
        effect("held-1", "cancel-shipment"),
        effect("held-1", "refund-payment"),  # applied, its reply lost, then held
    ]
    alert = Alert("held-1", "max-failure-count-reached", 3)
    assert failing(invariants.check_all(observe([held], effects, alerts=[alert]))) == {}


def test_a_compensated_order_with_an_unrecorded_effect_fails() -> None:
    """An effect the order does not know of would never be compensated."""
    process = compensated("comp-1", ["reserve-inventory"], "charge-payment")
    effects = [effect("comp-1", "reserve-inventory"), effect("comp-1", "charge-payment")]
    effects.append(effect("comp-1", "release-inventory"))
    result = invariants.effects_match_history(observe([process], effects))
    assert any("an effect would stay without compensation" in v for v in result.violations)


def test_a_completed_step_the_service_never_applied_fails() -> None:
    effects = effects_of_processed("ok-1")[:2]
    result = invariants.effects_match_history(observe([processed("ok-1")], effects))
    assert any("['create-shipment'] completed but never applied" in v for v in result.violations)


def test_an_error_order_needs_a_hold_alert() -> None:
    held = a_process("held-1", ProcessState.ERROR, failure_count=3)
    unalerted = invariants.every_error_has_an_alert(
        observe([held], alerts=[Alert("held-1", "invalid-message", 0)])
    )
    assert not unalerted.passed and "without an operator alert" in unalerted.violations[0]
    alerted = invariants.every_error_has_an_alert(
        observe([held], alerts=[Alert("held-1", "max-failure-count-reached", 3)])
    )
    assert alerted.passed and alerted.checked == 1


@pytest.mark.parametrize("state", [ProcessState.PROCESSING, ProcessState.COMPENSATING])
def test_an_in_flight_order_without_a_lock_fails(state: ProcessState) -> None:
    sample = Sample(12.5, "ok-1", state, None, 1)
    locked = Sample(13.0, "ok-1", state, "chaos-a1", 1)
    result = invariants.locks_and_failure_counts(
        observe([processed("ok-1")], samples=[sample, locked])
    )
    assert result.violations == (f"ok-1: {state.value} with no lockedBy (seen at 12.5 s)",)


def test_failure_counts_above_the_maximum_fail_wherever_they_are_seen() -> None:
    too_many = a_process("err-1", ProcessState.ERROR, [("timed-out", "x")], failure_count=4)
    sample = Sample(3.0, "err-1", ProcessState.PENDING, None, 4)
    violations = invariants.locks_and_failure_counts(
        observe([too_many], samples=[sample])
    ).violations
    assert len(violations) == 3
    assert any("history 'timed-out' with failureCount 4" in v for v in violations)


def test_a_terminal_order_still_locked_fails() -> None:
    locked = a_process("ok-1", ProcessState.PROCESSED, locked_by="chaos-b2")
    result = invariants.locks_and_failure_counts(observe([locked]))
    assert result.violations == ("ok-1: ends Processed locked by chaos-b2",)


def test_a_step_completed_twice_means_a_stale_reply_was_applied() -> None:
    twice = a_process(
        "ok-1",
        ProcessState.PROCESSED,
        [("step-completed", s) for s in (*STEPS, "charge-payment")],
    )
    result = invariants.stale_replies_ignored(observe([twice]))
    assert result.violations == ("ok-1: 2 x step-completed for charge-payment",)


def test_outcomes_must_match_the_rejected_sku() -> None:
    wrong_step = compensated("comp-1", [], "reserve-inventory")
    obs = observe(
        [wrong_step, compensated("comp-2", [], "reserve-inventory"), processed("ok-1")],
        failing={"comp-1": "payment", "ok-1": "shipping"},
    )
    violations = invariants.outcomes_match_orders(obs).violations
    assert violations == (
        "comp-1: charge-payment rejects it, yet failed steps are ['reserve-inventory']",
        "comp-2: no rejected SKU, yet Compensated (failed steps ['reserve-inventory'])",
        "ok-1: create-shipment rejects it, yet Processed",
    )


def held_after_timeouts(*complete_by: datetime) -> Observations:
    timeouts = [("timed-out", timed_out("reserve-inventory", at)) for at in complete_by]
    held = a_process("held", ProcessState.ERROR, timeouts, failure_count=len(timeouts))
    return observe([held], alerts=[Alert("held", "max-failure-count-reached", len(timeouts))])


def test_an_error_order_whose_counted_timeout_missed_its_complete_by_in_an_outage_fails() -> None:
    obs = held_after_timeouts(T0 - timedelta(seconds=20), T0 + timedelta(seconds=1.2))
    inside = replace(obs, outages=((T0 + timedelta(seconds=1), T0 + timedelta(seconds=1.5)),))
    (violation,) = failing(invariants.check_all(inside))[
        "no order in Error because of an infrastructure outage"
    ]
    assert violation.startswith("held: Error, and a timeout counted at"), violation
    assert "complete-by 00:00:01 in an outage" in violation


def test_a_timeout_counted_in_an_outage_for_a_complete_by_before_it_is_the_steps_own() -> None:
    """The count's moment does not matter (history entries are at T0 + 0 s, 1 s, 2 s): a
    step that hung past its complete-by before the outage began failed on its own."""
    obs = held_after_timeouts(*(T0 - timedelta(seconds=s) for s in (40, 30, 20)))
    during_the_counts = replace(obs, outages=((T0, T0 + timedelta(seconds=5)),))
    assert invariants.no_error_from_an_outage(during_the_counts).passed


def test_the_grace_after_an_outage_covers_the_complete_bys_it_delayed() -> None:
    obs = held_after_timeouts(T0 - timedelta(seconds=20))
    before = replace(obs, outages=((T0 - timedelta(seconds=60), T0 - timedelta(seconds=30)),))
    assert invariants.no_error_from_an_outage(before).passed
    graced = replace(before, outage_grace=timedelta(seconds=30))
    assert not invariants.no_error_from_an_outage(graced).passed


def test_a_timeout_whose_words_name_no_complete_by_is_a_violation() -> None:
    held = a_process("held", ProcessState.ERROR, [("timed-out", "reserve-inventory late")])
    assert not invariants.no_error_from_an_outage(observe([held])).passed


def test_a_timeout_counted_while_suspended_fails() -> None:
    events = [("suspended", "by chaos"), ("timed-out", "charge-payment not completed")]
    held = a_process("s-1", ProcessState.PROCESSING, [*events, ("resumed", "by chaos")])
    result = invariants.no_failure_counted_while_suspended(observe([held]))
    assert not result.passed and result.violations[0].startswith("s-1: a timeout counted")
    resumed = a_process("s-2", ProcessState.PROCESSING, [events[0], ("resumed", ""), events[1]])
    assert invariants.no_failure_counted_while_suspended(observe([resumed])).passed


def test_a_cancel_waiting_on_a_suspended_step_may_be_unlocked() -> None:
    waiting = Sample(5.0, "ok-1", ProcessState.COMPENSATING, None, 0, cancel_requested=True)
    assert invariants.locks_and_failure_counts(
        observe([processed("ok-1")], samples=[waiting])
    ).passed


def test_a_step_its_service_said_was_applied_counts_as_completed() -> None:
    """Apply-then-hang: the charge's reply is lost, the Supervisor's outcome query finds
    it applied and records it Completed; the checks read that as the step's completion."""
    policy = a_policy(step_timeout=4)
    transition = start(an_order("hung-1"), ORDER_FULFILMENT, T0)
    history = list(transition.history)
    claimed = claim(transition.process, ORDER_FULFILMENT, policy, "i-1", T0)
    assert claimed is not None
    history += claimed.history
    process, request = claimed.process, claimed.outgoing[0]
    reply = apply_reply(process, ORDER_FULFILMENT, policy, a_reply(request), T0)
    assert reply is not None
    history += reply.history
    process = reply.process
    later = T0 + timedelta(seconds=10)
    claimed = claim(process, ORDER_FULFILMENT, policy, "i-1", T0)
    if claimed is not None:  # the reply may have dispatched the charge itself
        history += claimed.history
        process = claimed.process
    resolved = recover(
        process,
        ORDER_FULFILMENT,
        policy,
        later,
        count=True,
        outcome=RemoteOutcome.applied({"ref": "ch"}),
    )
    assert resolved is not None
    history += resolved.history
    assert any(h.event == "in-doubt-applied" for h in resolved.history)
    process = resolved.process
    claimed = claim(process, ORDER_FULFILMENT, policy, "i-1", later)
    assert claimed is not None
    history += claimed.history
    request = claimed.outgoing[0]
    assert request.body["step"] == "create-shipment"
    done = apply_reply(claimed.process, ORDER_FULFILMENT, policy, a_reply(request), later)
    assert done is not None
    history += done.history
    assert done.process.state.process_state is ProcessState.PROCESSED
    final = replace(done.process, history=tuple(history))
    assert failing(invariants.check_all(observe([final], effects_of_processed("hung-1")))) == {}

    twice = replace(
        final,
        history=(*final.history, HistoryEntry(later, "step-completed", "charge-payment",
                                              ProcessState.PROCESSED, 0, 1)),
    )  # fmt: skip
    result = invariants.stale_replies_ignored(observe([twice]))
    assert result.violations == ("hung-1: 2 x step-completed for charge-payment",)


def test_a_reconciliation_mismatch_or_a_reconciliation_that_did_not_run_fails() -> None:
    obs = healthy()
    mismatch = Alert("ok-1", "reconciliation-mismatch", 0, "Processed order ok-1: ...")
    found = invariants.finished_orders_reconcile(replace(obs, alerts=(mismatch,)))
    assert found.violations == (
        "ok-1: reconciliation mismatch (Processed order ok-1: ...), and no request of the "
        "order arrived late",
    )
    not_run = invariants.finished_orders_reconcile(replace(obs, reconciled=None))
    assert not_run.violations == ("reconciliation could not be run after the load",)
    partial = invariants.finished_orders_reconcile(replace(obs, reconciled=1))
    assert partial.violations == ("reconciliation checked 1 of 3 finished orders",)


# express-delivery: reserve and charge compensatable, create-shipment the pivot (no
# undo), notify-customer retriable (no undo)


def express(order_id: str, state: ProcessState, events: Iterable[tuple[str, str]] = (), *,
            current_step: int = 0) -> OrderProcess:  # fmt: skip
    return a_process(order_id, state, events, workflow=EXPRESS, current_step=current_step)


def express_processed(order_id: str) -> OrderProcess:
    events = [("step-completed", s) for s in EXPRESS_STEPS] + [("processed", "")]
    return express(order_id, ProcessState.PROCESSED, events, current_step=3)


def express_held(order_id: str) -> OrderProcess:
    """The notification bounced for good: held in Error at notify-customer."""
    events = [("step-completed", s) for s in STEPS]
    events.append(("step-failed", "notify-customer: address-bounced"))
    return express(order_id, ProcessState.ERROR, events, current_step=3)


def express_healthy() -> Observations:
    """An express order Processed, one held at its retriable step, one whose pivot was
    rejected (compensated), one cancelled before its pivot, and one refused a cancel
    past its pivot that went on to be Processed."""
    return observe(
        [
            express_processed("x-ok"),
            express_held("x-held"),
            express(
                "x-pivot",
                ProcessState.COMPENSATED,
                [
                    ("step-completed", "reserve-inventory"),
                    ("step-completed", "charge-payment"),
                    ("step-failed", "create-shipment: address-rejected"),
                    ("step-compensated", "charge-payment"),
                    ("step-compensated", "reserve-inventory"),
                    ("compensated", ""),
                ],
                current_step=0,
            ),
            express(
                "x-cx",
                ProcessState.CANCELLED,
                [
                    ("step-completed", "reserve-inventory"),
                    ("cancel-requested", "by chaos"),
                    ("step-compensated", "reserve-inventory"),
                ],
            ),
            express_processed("x-late"),
            processed("ok-1"),
        ],
        [
            *(effect("x-ok", s) for s in EXPRESS_STEPS),
            *(effect("x-held", s) for s in STEPS),
            effect("x-held", "notify-customer", applied=0),
            *effects_of_compensated(
                "x-pivot", ["reserve-inventory", "charge-payment"], "create-shipment"
            ),
            effect("x-cx", "reserve-inventory"),
            effect("x-cx", "release-inventory"),
            *(effect("x-late", s) for s in EXPRESS_STEPS),
            *effects_of_processed("ok-1"),
        ],
        alerts=[Alert("x-held", "retriable-step-failed", 0)],
        failing={"x-held": "notifications", "x-pivot": "shipping"},
        cancels={"x-cx": ("202",), "x-late": ("409 past-pivot",), "ok-1": ("409",)},
    )


def test_express_orders_judged_against_their_own_workflow_pass() -> None:
    results = invariants.check_all(express_healthy())
    assert failing(results) == {}
    by_name = {r.name: r for r in results}
    assert (
        by_name[
            "past the pivot only forward: nothing undone, no cancel, a held order keeps its steps"
        ].checked
        == 5
    )  # the express orders; order-fulfilment has no pivot


def test_a_processed_express_order_without_its_notification_fails() -> None:
    """Judged against order-fulfilment it would pass: the judge gets its own steps."""
    obs = observe([express_processed("x-ok")], [effect("x-ok", s) for s in STEPS])
    (violation,) = invariants.net_effect_judged(obs).violations
    assert violation.startswith("x-ok: Processed, missing-step notify-customer")
    assert violation.endswith("[express-delivery]")


def test_a_cancelled_express_order_with_the_shipment_in_force_fails() -> None:
    """What a cancel let through past the pivot leaves: the charge refunded, the
    reservation released, the parcel with the courier (nothing undoes a pivot)."""
    cancelled = express(
        "x-cx",
        ProcessState.CANCELLED,
        [
            *(("step-completed", s) for s in STEPS),
            ("cancel-requested", "by chaos"),
            ("step-compensated", "charge-payment"),
            ("step-compensated", "reserve-inventory"),
        ],
    )
    effects = [
        *(effect("x-cx", s) for s in STEPS),
        effect("x-cx", "refund-payment"),
        effect("x-cx", "release-inventory"),
    ]
    found = failing(invariants.check_all(observe([cancelled], effects)))
    (judged,) = found[
        "net effect: Processed in force once, Compensated or Cancelled nothing in force"
    ]
    assert judged.startswith("x-cx: Cancelled, left-in-force create-shipment: in force ")
    assert "create-shipment at shipping (key x-cx:create-shipment" in judged
    forward = found[
        "past the pivot only forward: nothing undone, no cancel, a held order keeps its steps"
    ]
    assert forward == (
        "x-cx: pivot create-shipment applied, yet Cancelled",
        "x-cx: pivot create-shipment applied, yet undid ['charge-payment', 'reserve-inventory']",
    )


def test_a_cancel_refused_past_the_pivot_must_not_end_cancelled() -> None:
    cancelled = express(
        "x-1", ProcessState.CANCELLED, [("cancel-requested", "by chaos")], current_step=0
    )
    refused = observe([cancelled], cancels={"x-1": ("202", "409 past-pivot")})
    (violation,) = invariants.forward_only_past_the_pivot(refused).violations
    assert violation == (
        "x-1: a cancel was refused as past the pivot, yet the order took a cancel and is Cancelled"
    )
    plain = observe([processed("ok-1")], effects_of_processed("ok-1"),
                    cancels={"ok-1": ("409 past-pivot",)})  # fmt: skip
    (violation,) = invariants.forward_only_past_the_pivot(plain).violations
    assert "order-fulfilment has no pivot" in violation


def test_a_held_retriable_failure_that_compensated_or_lost_a_step_fails() -> None:
    """ExhaustedPolicy=compensate or a bounced notification must not refund: a retriable
    step's failure holds the order with every earlier step in force."""
    refunded = [
        *(effect("x-held", s) for s in STEPS),
        effect("x-held", "notify-customer", applied=0),
        effect("x-held", "refund-payment"),
    ]
    alert = Alert("x-held", "retriable-step-failed", 0)
    obs = observe([express_held("x-held")], refunded, alerts=[alert])
    assert invariants.forward_only_past_the_pivot(obs).violations == (
        "x-held: pivot create-shipment applied, yet undid ['charge-payment']",
        "x-held: held in Error at notify-customer, yet charge-payment in force 0 times (nowhere)",
        "x-held: held in Error at notify-customer, yet undid ['charge-payment']",
    )
    unalerted = observe(
        [express_held("x-held")], refunded[:4], alerts=[Alert("x-held", "invalid-message", 0)]
    )
    (violation,) = invariants.forward_only_past_the_pivot(unalerted).violations
    assert "held without a retriable-step-failed alert" in violation
    assert not invariants.every_error_has_an_alert(unalerted).passed


def test_a_held_step_that_failed_for_good_yet_applied_at_its_provider_fails() -> None:
    """The order says the notification was rejected; the provider's ledger must agree,
    resubmits included (the same key meets the same rejection)."""
    alert = Alert("x-held", "retriable-step-failed", 0)
    sent = [effect("x-held", s) for s in EXPRESS_STEPS]
    obs = observe([express_held("x-held")], sent, alerts=[alert])
    (violation,) = invariants.forward_only_past_the_pivot(obs).violations
    assert violation.startswith("x-held: notify-customer failed for good, yet in force (")
    rejected = [*sent[:3], effect("x-held", "notify-customer", applied=0)]
    assert invariants.forward_only_past_the_pivot(replace(obs, effects=tuple(rejected))).passed


def test_a_rejection_at_the_retriable_step_must_be_held_not_compensated() -> None:
    compensated_instead = express(
        "x-1",
        ProcessState.COMPENSATED,
        [
            *(("step-completed", s) for s in STEPS),
            ("step-failed", "notify-customer: address-bounced"),
            ("compensated", ""),
        ],
    )
    obs = observe([compensated_instead], failing={"x-1": "notifications"})
    assert invariants.outcomes_match_orders(obs).violations == (
        "x-1: notify-customer (express-delivery, retriable) rejects it, so it is held in "
        "Error; yet Compensated",
    )
    planned_elsewhere = observe([processed("ok-1")], failing={"ok-1": "notifications"})
    (violation,) = invariants.outcomes_match_orders(planned_elsewhere).violations
    assert violation == (
        "ok-1: planned to fail at notifications, which order-fulfilment does not use"
    )


def test_an_order_stored_on_another_workflow_than_submitted_fails() -> None:
    obs = observe([processed("ok-1")], effects_of_processed("ok-1"))
    moved = replace(obs, planned={"ok-1": PlannedOrder("ok-1", {"orderId": "ok-1"}, None, EXPRESS)})
    assert invariants.each_order_runs_its_workflow(moved).violations == (
        "ok-1: submitted on express-delivery, stored on order-fulfilment",
    )


def _drive(
    process: OrderProcess, rejects: str | None
) -> tuple[OrderProcess, list[Effect], list[Alert]]:
    """Run an order through the real state machine against a tiny provider: every
    request applies and answers, except the do of step `rejects`, rejected for good.
    Returns the final process (with its history), the provider's ledger and the alerts."""
    policy = a_policy(step_timeout=4)
    workflow = EXPRESS_DELIVERY
    history = list(process.history)
    effects: list[Effect] = []
    alerts: list[Alert] = []
    claimed = claim(process, workflow, policy, "i-1", T0)
    assert claimed is not None
    transitions = [claimed]
    while transitions:
        transition = transitions.pop(0)
        history += transition.history
        process = transition.process
        for out in transition.outgoing:
            if "reason" in out.body:
                alerts.append(Alert.from_json(out.body))
            if "action" not in out.body or "step" not in out.body:
                continue
            body = out.body
            undo = body["action"] != "do"
            operation = UNDO[body["step"]] if undo else body["step"]
            rejected = not undo and body["step"] == rejects
            effects.append(effect(process.order_id, operation, applied=0 if rejected else 1))
            outcome = Outcome.FAILED if rejected else Outcome.SUCCEEDED
            reply = apply_reply(process, workflow, policy, a_reply(out, outcome), T0)
            if reply is not None:
                transitions.append(reply)
    return replace(process, history=tuple(history)), effects, alerts


def test_the_real_state_machine_holds_a_bounced_notification_and_the_checks_agree() -> None:
    """The express rules as the product writes them pass the checks: a notification
    rejected for good holds the order in Error with everything before it in force. Make
    a retriable failure compensate (say `forward_only` returning False) and this fails."""
    started = start(an_order("x-real"), EXPRESS_DELIVERY, T0)
    final, effects, alerts = _drive(
        replace(started.process, history=started.history), "notify-customer"
    )
    obs = observe([final], effects, alerts=alerts, failing={"x-real": "notifications"})
    assert failing(invariants.check_all(obs)) == {}
    assert final.state.process_state is ProcessState.ERROR


def test_the_real_state_machine_refuses_a_cancel_past_the_pivot_and_the_checks_agree() -> None:
    """A cancel once the shipment applied: the machine refuses it (409 past-pivot) and
    the order goes on to Processed; the checks take that as correct."""
    policy = a_policy(step_timeout=4)
    started = start(an_order("x-cx"), EXPRESS_DELIVERY, T0)
    final, effects, alerts = _drive(replace(started.process, history=started.history), None)
    assert final.state.process_state is ProcessState.PROCESSED
    # Rewind to just after the pivot completed (the notification still running) and cancel.
    with pytest.raises(PastPivot):
        cancel(
            replace(final, state=replace(final.state, process_state=ProcessState.PROCESSING)),
            EXPRESS_DELIVERY,
            policy,
            T0,
        )
    obs = observe([final], effects, alerts=alerts, cancels={"x-cx": ("409 past-pivot",)})
    assert failing(invariants.check_all(obs)) == {}


def test_an_extra_charge_refunded_at_a_second_provider_is_not_an_undo_past_the_pivot() -> None:
    """`applied-at-two-providers`: the charge applied at payment-secondary too and was
    refunded there; the order's own charge stays in force, nothing of it was undone (the
    compensations check still reports the refund call on a Processed order)."""
    effects = [
        *(effect("x-ok", s) for s in EXPRESS_STEPS),
        effect("x-ok", "charge-payment", service="payment-secondary"),
        effect("x-ok", "refund-payment", service="payment-secondary"),
    ]
    obs = observe([express_processed("x-ok")], effects)
    assert invariants.forward_only_past_the_pivot(obs).passed
    assert invariants.net_effect_judged(obs).passed
    refunded_too = observe(
        [express_processed("x-ok")], [*effects, effect("x-ok", "refund-payment")]
    )
    assert invariants.forward_only_past_the_pivot(refunded_too).violations == (
        "x-ok: pivot create-shipment applied, yet undid ['charge-payment']",
    )


def test_a_step_that_fails_again_after_an_operators_resubmit_is_no_stale_reply() -> None:
    again = a_process(
        "held-1",
        ProcessState.ERROR,
        [
            ("step-failed", "create-shipment: rejected"),
            ("resubmitted", "by chaos"),
            ("step-failed", "create-shipment: rejected"),
        ],
    )
    assert invariants.stale_replies_ignored(observe([again])).violations == ()
    twice = a_process(
        "held-2",
        ProcessState.ERROR,
        [("step-failed", "create-shipment: rejected"), ("step-failed", "create-shipment: x")],
    )
    result = invariants.stale_replies_ignored(observe([twice]))
    assert result.violations == ("held-2: 2 x step-failed for create-shipment",)


# -- events: a reviewer's approval, kept and taken exactly once ----------------------------


def _settle(
    process: OrderProcess,
    workflow: Workflow,
    transitions: list[Transition],
    history: list[HistoryEntry],
    effects: list[Effect],
) -> OrderProcess:
    """Carry the transitions out against a tiny provider that applies every request."""
    policy = a_policy(step_timeout=4)
    undo_of = {s.name: s.compensation for s in workflow.steps if s.compensation}
    while transitions:
        transition = transitions.pop(0)
        history += transition.history
        process = transition.process
        for out in transition.outgoing:
            body = out.body
            if body.get("reason") == "event":  # a nudge: the wait takes its event
                woken = wake(process, workflow, policy, T0)
                if woken is not None:
                    transitions.append(woken)
                continue
            if "action" not in body or "step" not in body:
                continue
            undo = body["action"] != "do"
            operation = undo_of[body["step"]] if undo else body["step"]
            effects.append(effect(process.order_id, operation))
            reply = apply_reply(process, workflow, policy, a_reply(out), T0)
            if reply is not None:
                transitions.append(reply)
    return process


def reviewed(
    order_id: str, approved: bool, *, early: bool, second: bool = False
) -> tuple[OrderProcess, list[Effect], list[SentEvent]]:
    """A reviewed-order through the real state machine: its approval received early
    (before the claim) or once it waits, twice with one eventId, maybe then a second
    eventId with the opposite answer."""
    policy = a_policy(step_timeout=4)
    started = start(an_order(order_id), REVIEWED_ORDER, T0)
    history = list(started.history)
    effects: list[Effect] = []
    process = started.process
    answers = [(f"{order_id}.review-1", approved)] * 2
    if second:
        answers.append((f"{order_id}.review-2", not approved))
    sent: list[SentEvent] = []

    def answer(process: OrderProcess) -> OrderProcess:
        for event_id, ok in answers:
            data = {"approved": ok}
            try:
                got = receive_event(process, REVIEWED_ORDER, policy, event_id, "review", data, T0)
            except InvalidTransition:
                continue  # 409: the order is final, nothing kept (nor recorded)
            if all(e.event_id != event_id for e in sent):
                sent.append(SentEvent(order_id, event_id, "review", ok, 1.0, early))
            if got is not None:
                process = _settle(process, REVIEWED_ORDER, [got], history, effects)
        return process

    if early:
        process = answer(process)
    claimed = claim(process, REVIEWED_ORDER, policy, "i-1", T0)
    assert claimed is not None
    process = _settle(process, REVIEWED_ORDER, [claimed], history, effects)
    if not early:
        assert process.state.process_state is ProcessState.PROCESSING
        process = answer(process)
    return replace(process, history=tuple(history)), effects, sent


def observe_reviews(
    runs: Iterable[tuple[OrderProcess, list[Effect], list[SentEvent]]],
) -> Observations:
    runs = list(runs)
    obs = observe([p for p, _, _ in runs], [e for _, found, _ in runs for e in found])
    return replace(
        obs,
        workflows={REVIEWED_ORDER.name: REVIEWED_ORDER},
        events=tuple(e for _, _, sent in runs for e in sent),
    )


REVIEWS = [
    reviewed("r-early-yes", True, early=True),
    reviewed("r-early-no", False, early=True, second=True),
    reviewed("r-late-yes", True, early=False, second=True),
    reviewed("r-late-no", False, early=False),
]


def test_reviewed_orders_through_the_real_state_machine_pass_every_invariant() -> None:
    obs = observe_reviews(REVIEWS)
    assert failing(invariants.check_all(obs)) == {}
    states = {p.order_id: p.state.process_state for p in obs.processes.values()}
    assert states == {
        "r-early-yes": ProcessState.PROCESSED,
        "r-early-no": ProcessState.COMPENSATED,
        "r-late-yes": ProcessState.PROCESSED,
        "r-late-no": ProcessState.COMPENSATED,
    }
    # r-late-yes's second eventId came once it was Processed: 409, not accepted
    assert invariants.accepted_events_kept(obs).checked == 5


def test_an_accepted_event_the_order_does_not_keep_is_lost() -> None:
    process, effects, sent = reviewed("r-lost", True, early=True, second=True)
    dropped = replace(process.state, events=process.state.events[:1])
    obs = observe_reviews([(replace(process, state=dropped), effects, sent)])
    assert invariants.accepted_events_kept(obs).violations == (
        "r-lost: event review (r-lost.review-2, sent early) accepted (202) at 1.0 s "
        "but not kept by the order (Processed): LOST",
    )


def test_an_early_event_dropped_leaves_the_review_unanswered() -> None:
    """An order that reached its review and ended without taking the early event kept
    for it (say it was dropped and the order expired at its deadline)."""
    process, effects, sent = reviewed("r-early", True, early=True)
    history = tuple(h for h in process.history if h.event != "event-consumed")
    state = replace(process.state, events=())
    obs = observe_reviews([(replace(process, state=state, history=history), effects, sent)])
    assert invariants.accepted_events_kept(obs).violations == (
        "r-early: event review (r-early.review-1, sent early) accepted (202) at 1.0 s but "
        "not kept by the order (Processed): LOST",
        "r-early: reached manual-review, ended Processed without taking an event "
        "(accepted: ['r-early.review-1'])",
    )


def test_a_second_event_taken_or_the_wrong_one_taken_fails() -> None:
    process, effects, sent = reviewed("r-two", True, early=True, second=True)
    taken = tuple(replace(e, consumed_by="manual-review") for e in process.state.events)
    twice = observe_reviews(
        [(replace(process, state=replace(process.state, events=taken)), effects, sent)]
    )
    assert invariants.accepted_events_kept(twice).violations == (
        "r-two: manual-review took 1 event(s) by its history (['manual-review: review "
        "(r-two.review-1)']), 2 by its events (['r-two.review-1', 'r-two.review-2']): "
        "exactly one expected",
    )
    swapped = tuple(
        replace(e, consumed_by=None if e.event_id.endswith("1") else "manual-review")
        for e in process.state.events
    )
    wrong = observe_reviews(
        [(replace(process, state=replace(process.state, events=swapped)), effects, sent)]
    )
    assert invariants.accepted_events_kept(wrong).violations == (
        "r-two: manual-review took r-two.review-2, not the first accepted r-two.review-1",
        "r-two: manual-review took rejection r-two.review-2, yet completed",
    )


def test_an_approved_order_must_go_through_and_a_rejected_one_compensate() -> None:
    yes, yes_effects, yes_sent = reviewed("r-yes", True, early=True)
    no, no_effects, no_sent = reviewed("r-no", False, early=True)
    # Each order's outcome paired with the other's answer.
    obs = observe_reviews([(yes, yes_effects, no_sent), (no, no_effects, yes_sent)])
    obs = replace(
        obs,
        events=tuple(
            replace(
                e,
                order_id="r-no" if e.order_id == "r-yes" else "r-yes",
                event_id=e.event_id.replace("r-yes", "r-no")
                if e.order_id == "r-yes"
                else e.event_id.replace("r-no", "r-yes"),
            )
            for e in obs.events
        ),
    )
    outcomes = invariants.outcomes_match_orders(obs).violations
    assert outcomes == (
        "r-no: approved, yet Compensated (failed steps ['manual-review'])",
        "r-yes: manual-review rejects it, yet Processed",
    )


def test_a_shipment_before_the_order_not_before_fails() -> None:
    order = replace(an_order("s-1"), not_before=T0 + timedelta(seconds=5))
    done = a_process(
        "s-1",
        ProcessState.PROCESSED,
        [("step-completed", s) for s in ("reserve-inventory", "charge-payment")]
        + [("timer-fired", "wait-for-ship-date"), ("step-completed", "wait-for-ship-date")]
        + [("step-completed", "create-shipment"), ("processed", "")],
        workflow=SCHEDULED_DELIVERY.name,
    )
    done = replace(done, order=order)
    on_time = [effect("s-1", s) for s in STEPS]
    ship = on_time[-1]
    late_enough = replace(
        ship, first_call_at=T0 + timedelta(seconds=5), applied_at=T0 + timedelta(seconds=6)
    )
    obs = replace(
        observe([done], [*on_time[:-1], late_enough]),
        workflows={SCHEDULED_DELIVERY.name: SCHEDULED_DELIVERY},
    )
    assert failing(invariants.check_all(obs)) == {}
    early = replace(
        ship, first_call_at=T0 + timedelta(seconds=1), applied_at=T0 + timedelta(seconds=2)
    )
    obs = replace(obs, effects=(*on_time[:-1], early))
    assert invariants.shipments_wait_for_not_before(obs).violations == (
        "s-1: create-shipment called at 00:00:01.000000, before its notBefore 00:00:05.000000",
        "s-1: create-shipment applied at 00:00:02.000000, before its notBefore 00:00:05.000000",
    )


def test_a_wait_that_keeps_its_event_without_taking_it_fails() -> None:
    """What chaos found: the nudge that has the wait take an early event was lost and
    the order kept waiting (for its deadline a day later) with the event kept."""
    process, effects, sent = reviewed("r-stuck", True, early=True)
    waiting = replace(
        process.state,
        process_state=ProcessState.PROCESSING,
        current_step=1,
        locked_by="i-1",
        events=tuple(replace(e, consumed_by=None) for e in process.state.events),
    )
    history = tuple(h for h in process.history if h.event != "event-consumed")
    stuck = replace(process, state=waiting, history=history)
    obs = observe_reviews([(stuck, effects[:1], sent)])
    assert invariants.accepted_events_kept(obs).violations == (
        "r-stuck: still waits at manual-review though it keeps ['r-stuck.review-1']: the "
        "accepted event was never taken",
    )


def test_a_failed_check_prints_the_story_of_the_orders_it_names() -> None:
    """A flake found once must be readable without running it again."""
    held = a_process("held", ProcessState.ERROR, [("timed-out", "charge-payment late")])
    obs = observe([held, processed("ok-1")])
    check = Check(
        "after the load",
        obs,
        (invariants.no_error_from_an_outage(obs),),
        Figures(),
        Convergence(None, None, 0, 0.0),
    )
    printed = "".join(str(part) for part in stories([check]))
    assert "story of held (after the load)" in printed
    assert "timed-out: charge-payment late" in printed
    assert "ok-1" not in printed


# The residual risk (docs/in-doubt.md): a charge held on the network reaches payment (no
# abandon) after the order settled its key as not applied and moved the charge to
# payment-secondary, or cancelled without it. Healed means alerted and undone there.


def _with_steps(process: OrderProcess, charge_at: str) -> OrderProcess:
    steps = tuple(
        StepRecord(
            name,
            agent=charge_at if name == "charge-payment" else SERVICE[name],
            tried=("payment", charge_at) if name == "charge-payment" else (),
        )
        for name in STEPS
    )
    return replace(process, steps=steps)


def _late(e: Effect) -> Effect:
    return replace(e, arrived_late=True)


def moved_and_healed(
    *, alerted: bool = True, undone: bool = True, late: bool = True
) -> Observations:
    """`o-1` Processed with its charge at payment-secondary; the first charge arrived late
    at payment and applied there, then reconciliation undid it and alerted."""
    process = _with_steps(processed("o-1"), "payment-secondary")
    first = effect("o-1", "charge-payment", service="payment")
    found = [
        effect("o-1", "reserve-inventory"),
        effect("o-1", "charge-payment", service="payment-secondary"),
        effect("o-1", "create-shipment"),
        _late(first) if late else first,
    ]
    if undone:
        found.append(effect("o-1", "refund-payment", service="payment"))
    alerts = [Alert("o-1", "applied-at-two-providers", 0, "charge at two")] if alerted else []
    return observe([process], found, alerts=alerts)


def test_a_late_charge_undone_and_alerted_is_healed() -> None:
    assert failing(invariants.check_all(moved_and_healed())) == {}


def test_a_late_charge_healed_without_an_alert_fails() -> None:
    failed = failing(invariants.check_all(moved_and_healed(alerted=False)))

    assert list(failed) == [invariants.late_applies_healed(moved_and_healed()).name]
    assert "without an operator alert" in failed[next(iter(failed))][0]


def test_a_late_charge_left_in_force_fails_even_when_alerted() -> None:
    failed = failing(invariants.check_all(moved_and_healed(undone=False)))

    late = invariants.late_applies_healed(moved_and_healed()).name
    assert "still in force, never undone" in failed[late][0]
    assert any(name.startswith("net effect") for name in failed)


def test_healing_a_charge_that_came_on_time_fails() -> None:
    """The Supervisor moved a charge whose request could still apply: no residual risk,
    a bug, and the judge must not take the heal as an excuse."""
    failed = failing(invariants.check_all(moved_and_healed(late=False)))

    late = invariants.late_applies_healed(moved_and_healed()).name
    assert any("which came on time" in v for v in failed[late])
    assert any("no request of the order arrived late" in v for v in failed[late])


def test_a_cancelled_order_whose_skipped_charge_applied_late_is_healed_by_reconciliation() -> None:
    events = [
        ("step-completed", "reserve-inventory"),
        ("cancel-requested", "chaos"),
        ("step-compensated", "reserve-inventory"),
        ("cancelled", ""),
    ]
    process = replace(
        _with_steps(a_process("c-1", ProcessState.CANCELLED, events), "payment"),
        steps=(
            StepRecord("reserve-inventory", agent="inventory"),
            StepRecord("charge-payment", agent="payment", tried=("payment",)),
            StepRecord("create-shipment"),
        ),
    )
    found = [
        effect("c-1", "reserve-inventory"),
        effect("c-1", "release-inventory"),
        _late(effect("c-1", "charge-payment")),
        effect("c-1", "refund-payment"),
    ]
    mismatch = Alert("c-1", MISMATCH_REASON, 0, "charge still applied")
    obs = observe([process], found, alerts=[mismatch])
    obs = replace(obs, reconcile_mismatches=(1, 0))

    assert failing(invariants.check_all(obs)) == {}
    still = invariants.finished_orders_reconcile(replace(obs, reconcile_mismatches=(1, 1)))
    assert not still.passed and "not healed" in still.violations[0]
    on_time = replace(obs, effects=tuple(replace(e, arrived_late=False) for e in found))
    assert not invariants.finished_orders_reconcile(on_time).passed


def test_a_charge_applied_after_its_refund_found_nothing_is_healed_under_the_heal_key() -> None:
    """The full run's c1-9748-00175: the charge's key expired, the cancel's refund found
    nothing to undo, then the held charge applied. Reconciliation's heal goes under a key
    of its own (the refund key is spent): a second key for refund-payment, and an undo the
    order's own compensation does not account for, both accepted as the heal they are."""
    events = [
        ("step-completed", "reserve-inventory"),
        ("cancel-requested", "chaos"),
        ("step-compensated", "charge-payment"),
        ("step-compensated", "reserve-inventory"),
        ("cancelled", ""),
    ]
    process = replace(
        a_process("c-1", ProcessState.CANCELLED, events),
        steps=(
            StepRecord("reserve-inventory", agent="inventory"),
            StepRecord("charge-payment", agent="payment", tried=("payment",)),
            StepRecord("create-shipment"),
        ),
    )
    found = [
        effect("c-1", "reserve-inventory"),
        effect("c-1", "refund-payment", undone=False),
        effect("c-1", "release-inventory"),
        _late(effect("c-1", "charge-payment")),
    ]
    mismatch = Alert("c-1", MISMATCH_REASON, 0, "charge applied after its refund")
    healed = [*found, effect("c-1", "refund-payment", key=heal_key("c-1:refund-payment"))]
    obs = replace(observe([process], healed, alerts=[mismatch]), reconcile_mismatches=(1, 0))

    assert failing(invariants.check_all(obs)) == {}
    left = failing(invariants.check_all(replace(obs, effects=tuple(found))))
    assert any("still in force, never undone" in v for v in left[_LATE_CHECK])
    other = replace(healed[-1], idempotency_key="c-1:refund-payment:2")
    wrong = failing(invariants.check_all(replace(obs, effects=(*found, other))))
    assert any("or a later round of it" in v for v in wrong[_ONE_KEY_CHECK])


_LATE_CHECK = "late applies healed: alerted and undone, or alerted and held; nothing else"
_ONE_KEY_CHECK = "one idempotency key per order and operation"


def test_an_event_sent_once_final_must_be_refused_and_not_kept() -> None:
    obs = observe([processed("ok-1")])
    refused = replace(obs, late_events=(LateEvent("ok-1", "ok-1.review-late", "409"),))
    taken = replace(obs, late_events=(LateEvent("ok-1", "ok-1.review-late", "202"),))

    assert invariants.late_events_refused(refused).passed
    assert invariants.late_events_refused(taken).violations == (
        "ok-1: event ok-1.review-late sent once final, answered 202",
    )


def test_a_limited_service_may_see_its_limit_plus_ten_percent_in_whole_calls_and_no_more() -> None:
    """10% of 3/s is less than a call: 4 in a second is 33% over; at 10/s it is one."""
    obs = replace(observe([processed("ok-1")]), limits={"notifications": 3, "shipping": 10})
    within = replace(obs, max_calls_in_one_second={"notifications": 3, "shipping": 11})
    over = replace(obs, max_calls_in_one_second={"notifications": 4, "shipping": 12})

    assert invariants.own_limits_hold(within).passed
    assert invariants.own_limits_hold(over).violations == (
        "notifications: 4 calls in one second, limit 3/s (at most 3)",
        "shipping: 12 calls in one second, limit 10/s (at most 11)",
    )


def test_a_late_step_nothing_undoes_must_at_least_be_alerted() -> None:
    """A pivot whose request arrived late after its order compensated: nothing can take
    it back (the net-effect and step-kind checks fail the order anyway), and the late
    check wants an operator told."""
    events = [
        ("step-completed", "reserve-inventory"),
        ("step-completed", "charge-payment"),
        ("step-failed", "create-shipment: not applied"),
        ("step-compensated", "charge-payment"),
        ("step-compensated", "reserve-inventory"),
        ("compensated", ""),
    ]
    process = replace(
        a_process("x-1", ProcessState.COMPENSATED, events, workflow=EXPRESS),
        steps=tuple(StepRecord(s, agent=SERVICE[s]) for s in EXPRESS_STEPS),
    )
    found = [
        effect("x-1", "reserve-inventory"),
        effect("x-1", "charge-payment"),
        effect("x-1", "refund-payment"),
        effect("x-1", "release-inventory"),
        _late(effect("x-1", "create-shipment")),
    ]
    silent = observe([process], found)
    told = replace(silent, alerts=(Alert("x-1", "applied-after-settled", 0, "shipment late"),))

    assert invariants.late_applies_healed(silent).violations == (
        "x-1: create-shipment (no undo) arrived late at shipping and applied; Compensated, "
        "never alerted: nothing can undo it, so an operator must be told",
    )
    assert invariants.late_applies_healed(told).passed


def test_a_final_only_client_must_hear_exactly_its_orders_final_status() -> None:
    obs = healthy()
    final = {"ok-1", "comp-0"}
    planned = {
        i: replace(p, body={**p.body, "notify": "final"}) if i in final else p
        for i, p in obs.planned.items()
    }
    obs = replace(obs, planned=planned)
    right = (
        Heard("ok-1", "Processed", "status:ok-1:Processed:4"),
        Heard("ok-1", "Processed", "status:ok-1:Processed:4"),  # a repeat: one message
        Heard("comp-0", "Compensated", "status:comp-0:Compensated:5"),
        Heard("comp-2", "Received", "status:comp-2:Received:1"),  # every status: not judged
    )
    check = invariants.final_only_clients_hear_one_final
    assert check(replace(obs, heard=right)).passed
    assert check(replace(obs, heard=right)).checked == 2
    wrong = (
        Heard("ok-1", "Received", "status:ok-1:Received:1"),
        Heard("ok-1", "Processed", "status:ok-1:Processed:4"),
    )
    assert check(replace(obs, heard=wrong)).violations == (
        "comp-0: Compensated, its client heard nothing",
        "ok-1: Processed, its client heard ['Processed', 'Received']",
    )
    held = {**obs.processes, "ok-1": a_process("ok-1", ProcessState.ERROR)}
    told = (Heard("ok-1", "Processed", "status:ok-1:Processed:4"), right[2])
    assert check(replace(obs, processes=held, heard=told)).violations == (
        "ok-1: Error, its client heard ['Processed']",
    )


def test_a_mismatch_left_for_an_operator_on_a_held_order_is_not_a_failure_to_heal() -> None:
    """The full run's c1-4abc-00825 (seed 1, 2026-11-29): held in Error, its charge
    settled "not applied" at payment, which then applied it late. Reconciliation alerts
    and leaves it (the order may still take that charge as its step's), run after run,
    until the operator resubmits; the judge takes that as the product's answer while the
    order is held, and as a failure for any order that is not."""
    held = a_process("h-1", ProcessState.ERROR, [("error", "retriable-step-failed")])
    obs = replace(observe([held]), reconciled=1, reconcile_mismatches=(1,), reconcile_left=("h-1",))

    assert invariants.finished_orders_reconcile(obs).passed
    unheld = replace(obs, reconcile_left=())
    assert "not healed" in invariants.finished_orders_reconcile(unheld).violations[0]
    moved = replace(
        obs,
        processes={
            "h-1": replace(held, state=replace(held.state, process_state=ProcessState.PROCESSED))
        },
    )
    assert "not held" in invariants.finished_orders_reconcile(moved).violations[0]
    another = replace(obs, reconcile_mismatches=(2,))
    assert "still finds 1 mismatch" in invariants.finished_orders_reconcile(another).violations[0]
