"""The invariants of a chaos run: pure checks over what was collected.

Each check returns every violation it finds (order id and what is wrong) so that a
failure can be investigated from the report alone.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence

from chaos.model import Effect, InvariantResult, Observations, SentEvent
from devhost.simulator.judge import InForce, OrderToJudge, Step, in_force, judge
from shared.domain.failures import missed_complete_by
from shared.domain.limits import calls_allowed
from shared.domain.machine.dispatch import heal_key
from shared.domain.machine.forward import APPLIED_AFTER_SETTLED
from shared.domain.model import HistoryEntry, Notify, ProcessState
from shared.domain.outages import spared
from shared.domain.reconcile import FINISHED, HELD, MISMATCH_REASON
from shared.domain.workflow import StepKind, Workflow

IN_FLIGHT = (ProcessState.PROCESSING, ProcessState.COMPENSATING)
RETRIABLE_FAILED = "retriable-step-failed"
FAILED_PAST_PIVOT = "failed-past-pivot"
HOLD_REASONS = frozenset(
    {
        "max-failure-count-reached",
        "compensation-failed",
        "no-provider-left",
        "wait-expired",
        "applied-at-two-providers",
        "applied-after-settled",
        RETRIABLE_FAILED,
        FAILED_PAST_PIVOT,
    }
)
HEAL_REASONS = frozenset({APPLIED_AFTER_SETTLED, "applied-at-two-providers", MISMATCH_REASON})
"""The alerts that say an effect was found in force where the order says none should
be (a late success reply, or reconciliation), and that it was undone there or, with no
undo in the catalogue, left for an operator."""
PAST_PIVOT_ANSWER = "409 past-pivot"
"""An operator cancel refused because the order's pivot may have applied."""


def check_all(obs: Observations) -> tuple[InvariantResult, ...]:
    return tuple(check(obs) for check in CHECKS)


def no_accepted_order_lost(obs: Observations) -> InvariantResult:
    """Every order answered 202 is in the state store afterwards (a GET would not 404),
    whatever was killed meanwhile: Azurite included, it keeps every write it answered."""
    violations = [
        f"{order_id}: accepted (202) by runtime {a.runtime} at {a.at:.1f} s but not in the "
        "state store: LOST"
        for order_id, a in sorted(obs.accepted.items())
        if order_id not in obs.processes
    ]
    return _result("no accepted order lost", len(obs.accepted), violations)


def all_terminal_within_bound(obs: Observations) -> InvariantResult:
    """Every accepted order is stored and terminal, and was so within the stated bound."""
    violations: list[str] = []
    for order_id in sorted(obs.accepted):
        process = obs.processes.get(order_id)
        if process is None:
            violations.append(f"{order_id}: accepted (202) but not in the state store")
        elif not process.state.process_state.is_at_rest:
            violations.append(
                f"{order_id}: still {process.state.process_state.value} "
                f"(failures {process.state.failure_count}, step {process.state.current_step})"
            )
    violations += [
        f"{order_id}: in the state store but never submitted"
        for order_id in sorted(set(obs.processes) - set(obs.planned))
    ]
    if obs.terminal_at is None:
        violations.append("the run never saw every accepted order terminal")
    else:
        took = obs.terminal_at - obs.last_submission_at
        if took > obs.bound_seconds:
            violations.append(
                f"all terminal {took:.1f} s after the last submission, "
                f"beyond the bound of {obs.bound_seconds:.0f} s"
            )
    return _result("every accepted order terminal within the bound", len(obs.accepted), violations)


def effects_applied_at_most_once(obs: Observations) -> InvariantResult:
    violations = [
        f"{e.order_id}: {e.operation} applied {e.applied} times (key {e.idempotency_key})"
        for e in obs.effects
        if e.applied > 1
    ]
    return _result("no remote effect applied twice", len(obs.effects), violations)


def net_effect_judged(obs: Observations) -> InvariantResult:
    """What the orders leave in force at the providers, by the net-effect judge
    (devhost/simulator/judge.py, docs/simulator.md): a Processed order has each step in
    force at exactly one service (a step done at two providers would charge twice), a
    Compensated or Cancelled order nothing anywhere. The ledger's order counts: an undo
    that found nothing to undo before its do applied leaves the do in force.

    Every terminal order is judged: the checks run after convergence, the settle wait
    and every request held on the network has arrived, when no request sent for an
    order can still apply (the longest, a slow call, lasts seconds; a hang before
    applying never applies), and after reconciliation healed what it found."""
    by_workflow: dict[str, list[OrderToJudge]] = defaultdict(list)
    for order_id, p in sorted(obs.processes.items()):
        if p.state.process_state.is_at_rest:
            by_workflow[obs.workflow_name(order_id)].append(
                OrderToJudge(order_id, p.state.process_state.value)
            )
    entries = [e.ledger_entry for e in obs.effects]
    judged = 0
    violations: list[str] = []
    for name, orders in sorted(by_workflow.items()):
        ids = {o.order_id for o in orders}
        workflow = obs.workflow_of(orders[0].order_id)
        mine = (e for e in entries if e.order_id in ids)
        verdict = judge(mine, orders, judge_steps(workflow))
        judged += len(verdict.judged)
        violations += [f"{v} [{name}]" for v in verdict.violations]
    return _result(
        "net effect: Processed in force once, Compensated or Cancelled nothing in force",
        judged,
        sorted(violations),
    )


def one_key_per_order_and_operation(obs: Observations) -> InvariantResult:
    """One key per order and operation, but reconciliation's heal: an undo under the heal
    key of the order's own (`dispatch.heal_key`), sent where that key found nothing to
    undo and the do applied after it; and a later round (`{orderId}:{operation}:r2`, ...),
    sent by an operator's move only once every earlier round was never applied (refused
    for good: machine/rekey.py), so at most one round, the last, applied."""
    violations: list[str] = []
    rounds: dict[tuple[str, str], dict[int, bool]] = defaultdict(dict)
    for e in obs.effects:
        if e.order_id not in obs.planned:
            violations.append(f"{e.order_id}: {e.operation} for an order never submitted")
        if _is_heal(e):
            continue
        number = _round(e, e.idempotency_key)
        if number is None:
            violations.append(
                f"{e.order_id}: {e.operation} called with key {e.idempotency_key!r}, "
                f"not {f'{e.order_id}:{e.operation}'!r} or a later round of it"
            )
            continue
        used = rounds[(e.order_id, e.operation)]
        used[number] = used.get(number, False) or e.applied > 0
    for (order_id, operation), used in sorted(rounds.items()):
        last = max(used)
        if sorted(used) != list(range(last + 1)):
            violations.append(f"{order_id}: {operation} called under rounds {sorted(used)}")
        applied = [n for n in sorted(used) if used[n] and n != last]
        if applied:
            violations.append(
                f"{order_id}: {operation} sent under a later round after round {applied[0]} applied"
            )
    return _result("one idempotency key per order and operation", len(obs.effects), violations)


_ROUND = re.compile(r":r([1-9][0-9]*)")


def _round(e: Effect, key: str) -> int | None:
    """Which round of the order's key for its operation `key` is (0: `{orderId}:{operation}`,
    `messages.idempotency_key`), or None when it is none of them."""
    base = f"{e.order_id}:{e.operation}"
    if key == base:
        return 0
    found = _ROUND.fullmatch(key.removeprefix(base)) if key.startswith(base) else None
    number = int(found.group(1)) - 1 if found else 0
    return number if number >= 1 else None


def compensations_exactly_for_completed_steps(obs: Observations) -> InvariantResult:
    """Undo what completed, nothing else, last first: in the history and at the services.

    A cancelled order also undoes the steps in doubt (dispatched, never answered), so for
    it only the order is checked here; that nothing stays in force is the judge's
    (`net_effect_judged`). An undo that found nothing to undo did not undo.
    """
    effects = _effects_by_order(obs.effects)
    healed = _healed_late(obs)
    violations: list[str] = []
    for order_id, process in sorted(obs.processes.items()):
        workflow = obs.workflow_of(order_id)
        undo_step = _undo_steps(workflow)
        steps = [s.name for s in workflow.steps]
        state = process.state.process_state
        if process.state.cancel_requested:
            compensated = _compensated(process.history)
            in_reverse = sorted(set(compensated), key=steps.index, reverse=True)
            if compensated != in_reverse:
                violations.append(f"{order_id}: cancelled, history compensated {compensated}")
            continue
        acting = _acting(workflow)
        completed = [s for s in _completed(process.history) if s in acting]
        compensated = _compensated(process.history)
        expected = completed[::-1]
        calls = [
            e
            for e in effects.get(order_id, ())
            if e.operation in undo_step and (e.service, e.idempotency_key) not in healed
        ]
        undone = [undo_step[e.operation] for e in calls if e.applied == 1 and e.undone is not False]
        if compensated != expected[: len(compensated)]:
            violations.append(
                f"{order_id}: history compensated {compensated}, completed {completed}"
            )
        if undone != expected[: len(undone)]:
            violations.append(
                f"{order_id}: services undid {undone} (in this order), completed {completed}"
            )
        if compensated != undone[: len(compensated)]:
            violations.append(
                f"{order_id}: history compensated {compensated}, services undid {undone}"
            )
        if state is ProcessState.COMPENSATED and (compensated != expected or undone != expected):
            violations.append(
                f"{order_id}: Compensated with completed {completed}, history compensated "
                f"{compensated}, services undid {undone}"
            )
        if state is ProcessState.PROCESSED and calls:
            violations.append(
                f"{order_id}: Processed but compensations were called: "
                f"{[e.operation for e in calls]}"
            )
    return _result(
        "compensations exactly for the completed steps, in reverse order",
        len(obs.processes),
        violations,
    )


def effects_match_history(obs: Observations) -> InvariantResult:
    """What the services did agrees with what the order records: nothing done unrecorded
    in a finished order, nothing recorded that was not done."""
    effects = _effects_by_order(obs.effects)
    late = _late_dos(obs)
    heals = _healed_late(obs)
    healed = {(e.service, e.undoes) for e in obs.effects if (e.service, e.idempotency_key) in heals}
    violations: list[str] = []
    for order_id, process in sorted(obs.processes.items()):
        steps = _acting(obs.workflow_of(order_id))
        state = process.state.process_state
        applied = {
            e.operation
            for e in effects.get(order_id, ())
            if e.applied == 1
            and not (
                (e.service, e.idempotency_key) in late and (e.service, e.idempotency_key) in healed
            )
        }
        done = [s for s in steps if s in applied]
        completed = [s for s in _completed(process.history) if s in steps]
        if missing := [s for s in completed if s not in applied]:
            violations.append(f"{order_id}: {missing} completed but never applied by the service")
        if state is ProcessState.PROCESSED and (completed != steps or done != steps):
            violations.append(
                f"{order_id}: Processed with completed {completed}, services applied {done}"
            )
        if state is ProcessState.COMPENSATED and done != completed:
            violations.append(
                f"{order_id}: Compensated, services applied {done} but the order knows of "
                f"{completed}: an effect would stay without compensation"
            )
    return _result("remote effects match the order history", len(obs.processes), violations)


def every_error_has_an_alert(obs: Observations) -> InvariantResult:
    alerted: dict[str, set[str]] = defaultdict(set)
    for alert in obs.alerts:
        alerted[alert.order_id].add(alert.reason)
    errors = sorted(
        order_id
        for order_id, p in obs.processes.items()
        if p.state.process_state is ProcessState.ERROR
    )
    violations = [
        f"{order_id}: Error ({obs.processes[order_id].state.last_error}) "
        f"without an operator alert (alerts: {sorted(alerted.get(order_id, ()))})"
        for order_id in errors
        if not alerted.get(order_id, set()) & HOLD_REASONS
    ]
    return _result("every Error order has an operator alert", len(errors), violations)


def no_error_from_an_outage(obs: Observations) -> InvariantResult:
    """No order ends in Error because the broker or Azurite was down: an Error order's
    counted timeouts all missed a complete-by outside the outages (and the grace after
    each), so what exhausted it was a remote-service fault of the plan (a hang), never
    the system's own outage. The rule is the Supervisor's (shared/domain/outages.py),
    on the outages as they really were; when the count happened does not matter."""
    errors = sorted(
        order_id
        for order_id, p in obs.processes.items()
        if p.state.process_state is ProcessState.ERROR
    )
    violations: list[str] = []
    for order_id in errors:
        for h in (h for h in obs.processes[order_id].history if h.event == "timed-out"):
            complete_by = missed_complete_by(h.detail)
            if complete_by is None:
                violations.append(f"{order_id}: a timeout that names no complete-by ({h.detail})")
                break
            if spared(complete_by, obs.outages, after=obs.outage_grace):
                violations.append(
                    f"{order_id}: Error, and a timeout counted at {h.at:%H:%M:%S} missed its "
                    f"complete-by {complete_by:%H:%M:%S} in an outage ({h.detail})"
                )
                break
    return _result("no order in Error because of an infrastructure outage", len(errors), violations)


def no_failure_counted_while_suspended(obs: Observations) -> InvariantResult:
    """A Suspended order's deadlines stop: no timeout is counted between a suspend and
    the resume or cancel that ends it."""
    violations: list[str] = []
    suspended = 0
    for order_id, p in sorted(obs.processes.items()):
        held = False
        suspended += any(h.event == "suspended" for h in p.history)
        for h in p.history:
            if h.event == "suspended":
                held = True
            elif h.event in ("resumed", "cancel-requested"):
                held = False
            elif held and h.event == "timed-out":
                violations.append(f"{order_id}: a timeout counted while Suspended ({h.detail})")
    return _result("no failure counted while Suspended", suspended, violations)


def locks_and_failure_counts(obs: Observations) -> InvariantResult:
    """In flight means locked; FailureCount never above MaxFailureCount (sampled during
    the run, in the final state and in every history entry)."""
    limit = obs.max_failure_count
    violations: list[str] = []
    for s in obs.samples:
        # A cancel waiting for the step of a Suspended order is Compensating, unlocked.
        waiting = s.process_state is ProcessState.COMPENSATING and s.cancel_requested
        if s.process_state in IN_FLIGHT and s.locked_by is None and not waiting:
            violations.append(
                f"{s.order_id}: {s.process_state.value} with no lockedBy (seen at {s.at:.1f} s)"
            )
        if s.failure_count > limit:
            violations.append(
                f"{s.order_id}: failureCount {s.failure_count} > {limit} (seen at {s.at:.1f} s)"
            )
    for order_id, p in sorted(obs.processes.items()):
        state = p.state
        if state.process_state in IN_FLIGHT and state.locked_by is None:
            violations.append(f"{order_id}: ends {state.process_state.value} with no lockedBy")
        if state.process_state.is_at_rest and state.locked_by is not None:
            violations.append(
                f"{order_id}: ends {state.process_state.value} locked by {state.locked_by}"
            )
        if state.failure_count > limit:
            violations.append(f"{order_id}: ends with failureCount {state.failure_count}")
        violations += [
            f"{order_id}: history '{h.event}' with failureCount {h.failure_count}"
            for h in p.history
            if h.failure_count > limit
        ]
    return _result(
        "no in-flight order unlocked; failureCount <= MaxFailureCount",
        len(obs.samples) + len(obs.processes),
        violations,
    )


def stale_replies_ignored(obs: Observations) -> InvariantResult:
    """Late, duplicated and older-attempt replies change nothing: each step completes,
    fails and is compensated at most once (by a reply, or by its service's answer to an
    outcome query: never both)."""
    violations: list[str] = []
    for order_id, p in sorted(obs.processes.items()):
        # An operator's resubmit runs the failed step again: it may fail again.
        since_resubmit = _since_last(p.history, "resubmitted")
        for event, steps in (
            ("step-completed", _completed(p.history)),
            ("step-failed", [_step_of(d) for d in _details(since_resubmit, "step-failed")]),
            ("step-compensated", _compensated(p.history)),
        ):
            counts = Counter(steps)
            violations += [
                f"{order_id}: {n} x {event} for {step}" for step, n in counts.items() if n > 1
            ]
    return _result("each stale reply ignored", len(obs.processes), violations)


def outcomes_match_orders(obs: Observations) -> InvariantResult:
    """An order without a rejected SKU (nor a rejected review) is never compensated;
    one with a rejected SKU or review never completes, and fails at the first step that
    rejects it (a service's, or an approval step whose first accepted event said
    `approved: false`):
    compensated before the pivot (the pivot's own rejection included), held in Error at a
    retriable step or past the pivot (nothing there can be undone); one an operator
    cancelled ends Cancelled (or Error)."""
    violations: list[str] = []
    for order_id, planned in sorted(obs.planned.items()):
        process = obs.processes.get(order_id)
        if process is None or not process.state.process_state.is_at_rest:
            continue  # reported by the terminal check
        workflow = obs.workflow_of(order_id)
        state = process.state.process_state
        failed = [_step_of(d) for d in _details(process.history, "step-failed")]
        if process.state.cancel_requested:
            # An operator cancelled it: it ends Cancelled, or in Error if an undo failed.
            if state not in (ProcessState.CANCELLED, ProcessState.ERROR):
                violations.append(f"{order_id}: cancelled, yet {state.value}")
            continue
        if planned.failing_service is not None and planned.failing_service not in {
            s.agent for s in workflow.steps
        }:
            violations.append(
                f"{order_id}: planned to fail at {planned.failing_service}, which "
                f"{workflow.name} does not use"
            )
            continue
        index = planned_failure(workflow, planned.failing_service, obs.decision(order_id))
        if index is None:
            if state not in (ProcessState.PROCESSED, ProcessState.ERROR) or failed:
                why = "approved" if obs.decision(order_id) else "no rejected SKU"
                violations.append(f"{order_id}: {why}, yet {state.value} (failed steps {failed})")
            continue
        expected = workflow.steps[index].name
        if _held_at(workflow, index):
            # Nothing can undo a step past the pivot: the order is held for an operator.
            if state is not ProcessState.ERROR:
                violations.append(
                    f"{order_id}: {expected} ({workflow.name}, "
                    f"{workflow.steps[index].kind.value}) rejects it, so it is held in "
                    f"Error; yet {state.value}"
                )
            elif failed and set(failed) != {expected}:
                violations.append(
                    f"{order_id}: {expected} rejects it, yet failed steps are {failed}"
                )
            continue
        if state not in (ProcessState.COMPENSATED, ProcessState.ERROR):
            violations.append(f"{order_id}: {expected} rejects it, yet {state.value}")
        elif state is ProcessState.COMPENSATED and failed != [expected]:
            violations.append(f"{order_id}: {expected} rejects it, yet failed steps are {failed}")
    return _result("outcome matches the order", len(obs.planned), violations)


def each_order_runs_its_workflow(obs: Observations) -> InvariantResult:
    """Every order is stored with the workflow it was submitted on."""
    violations = [
        f"{order_id}: submitted on {obs.workflow_name(order_id)}, "
        f"stored on {process.state.workflow}"
        for order_id, process in sorted(obs.processes.items())
        if order_id in obs.planned and process.state.workflow != obs.workflow_name(order_id)
    ]
    return _result(
        "each order runs the workflow it was submitted on", len(obs.processes), violations
    )


def forward_only_past_the_pivot(obs: Observations) -> InvariantResult:
    """The step kinds: once a pivot applied nothing is undone and the order ends
    Processed or Error, never Compensated or Cancelled; a cancel refused as past the
    pivot (409 past-pivot) came for an order with a pivot and never made it Cancelled
    (Compensated only when the pivot itself was then rejected); an order held in Error at
    a retriable step or past the pivot has every step before it in force exactly once
    and nothing undone, and when the step it is held at failed for good, that step is in
    force nowhere (a provider keeps its rejection for the key, so a resubmit meets it
    again) and the alert says why.

    Judged from the services' ledger and the order's history only, never with the
    product's own rule (`past_pivot`), so a broken rule cannot vouch for itself."""
    effects = _effects_by_order(obs.effects)
    forces: dict[str, dict[str, list[InForce]]] = {}
    for name in {obs.workflow_name(order_id) for order_id in obs.processes}:
        ids = {i for i in obs.processes if obs.workflow_name(i) == name}
        workflow = obs.workflow_of(next(iter(ids)))
        mine = (e.ledger_entry for e in obs.effects if e.order_id in ids)
        forces[name] = in_force(mine, judge_steps(workflow))
    alerted: dict[str, set[str]] = defaultdict(set)
    for alert in obs.alerts:
        alerted[alert.order_id].add(alert.reason)
    violations: list[str] = []
    checked = 0
    for order_id, process in sorted(obs.processes.items()):
        workflow = obs.workflow_of(order_id)
        answers = obs.cancel_answers.get(order_id, ())
        first_held = _first_held(workflow)
        if first_held is None:
            if PAST_PIVOT_ANSWER in answers:
                violations.append(
                    f"{order_id}: a cancel was refused as past the pivot, but "
                    f"{workflow.name} has no pivot"
                )
            continue
        checked += 1
        state = process.state.process_state
        history = process.history
        completed = _completed(history)
        forced = forces[obs.workflow_name(order_id)].get(order_id, [])
        undo_ops = _undo_steps(workflow)
        # Undone: compensated in the history, or undone at the services and in force
        # nowhere (an extra effect undone at a second provider leaves the step in force).
        still = {f.step for f in forced}
        undone = sorted(
            set(_compensated(history))
            | {
                undo_ops[e.operation]
                for e in effects.get(order_id, ())
                if e.operation in undo_ops and e.applied and e.undone is not False
            }
            - still
        )
        pivot = workflow.pivot
        pivot_name = workflow.steps[pivot].name if pivot is not None else None
        pivot_applied = pivot_name is not None and (
            pivot_name in completed or any(f.step == pivot_name for f in forced)
        )
        if pivot_applied:
            if state in (ProcessState.COMPENSATED, ProcessState.CANCELLED):
                violations.append(f"{order_id}: pivot {pivot_name} applied, yet {state.value}")
            if undone:
                violations.append(f"{order_id}: pivot {pivot_name} applied, yet undid {undone}")
        if PAST_PIVOT_ANSWER in answers:
            pivot_failed = pivot_name in {_step_of(d) for d in _details(history, "step-failed")}
            if state is ProcessState.CANCELLED or any(
                h.event == "cancel-requested" for h in history
            ):
                violations.append(
                    f"{order_id}: a cancel was refused as past the pivot, yet the order "
                    f"took a cancel and is {state.value}"
                )
            elif state is ProcessState.COMPENSATED and not pivot_failed:
                violations.append(
                    f"{order_id}: a cancel was refused as past the pivot, yet Compensated "
                    f"without its pivot {pivot_name} failing"
                )
        index = process.state.current_step
        if state is ProcessState.ERROR and first_held <= index < len(workflow.steps):
            held_step = workflow.steps[index].name
            for step in workflow.steps[:index]:
                here = [f for f in forced if f.step == step.name]
                if len(here) != 1:
                    violations.append(
                        f"{order_id}: held in Error at {held_step}, yet {step.name} in force "
                        f"{len(here)} times ({'; '.join(str(f) for f in here) or 'nowhere'})"
                    )
            if undone:
                violations.append(f"{order_id}: held in Error at {held_step}, yet undid {undone}")
            failed = [_step_of(d) for d in _details(history, "step-failed")]
            if failed and failed[-1] == held_step:
                here = [f for f in forced if f.step == held_step]
                if here:
                    violations.append(
                        f"{order_id}: {held_step} failed for good, yet in force "
                        f"({'; '.join(str(f) for f in here)})"
                    )
                kind = workflow.steps[index].kind
                reason = RETRIABLE_FAILED if kind is StepKind.RETRIABLE else FAILED_PAST_PIVOT
                if reason not in alerted.get(order_id, set()):
                    violations.append(
                        f"{order_id}: {held_step} failed for good, held without a {reason} "
                        f"alert (alerts: {sorted(alerted.get(order_id, ()))})"
                    )
    return _result(
        "past the pivot only forward: nothing undone, no cancel, a held order keeps its steps",
        checked,
        violations,
    )


def accepted_events_kept(obs: Observations) -> InvariantResult:
    """No event accepted with 202 is lost: every one is kept by its order with what it
    said, early or late, through the outages. A wait step takes exactly one event (the
    first accepted: a repeat of its eventId or a second eventId never counts twice); once
    an order reached its review, only a cancel may end it without one; an approval
    completes the step, a rejection fails it (`rejected`)."""
    violations: list[str] = []
    sent_by_order: dict[str, list[SentEvent]] = defaultdict(list)
    for e in obs.events:
        sent_by_order[e.order_id].append(e)
        process = obs.processes.get(e.order_id)
        when = "early" if e.early else "once waiting"
        if process is None:
            violations.append(f"{e.order_id}: event {e.event_id} accepted, order not stored")
            continue
        kept = next((k for k in process.state.events if k.event_id == e.event_id), None)
        if kept is None:
            violations.append(
                f"{e.order_id}: event {e.name} ({e.event_id}, sent {when}) accepted (202) at "
                f"{e.at:.1f} s but not kept by the order "
                f"({process.state.process_state.value}): LOST"
            )
        elif kept.name != e.name or (kept.data or {}).get("approved") is not e.approved:
            violations.append(
                f"{e.order_id}: event {e.event_id} kept as {kept.name} {kept.data}, "
                f"sent as {e.name} approved={e.approved}"
            )
    for order_id, sent in sorted(sent_by_order.items()):
        process = obs.processes.get(order_id)
        if process is None:
            continue
        workflow = obs.workflow_of(order_id)
        history = process.history
        for step in workflow.steps:
            if step.event is None:
                continue
            consumed = [k for k in process.state.events if k.consumed_by == step.name]
            noted = [
                h.detail
                for h in history
                if h.event == "event-consumed" and _step_of(h.detail) == step.name
            ]
            reached = any(h.event == "waiting" and _step_of(h.detail) == step.name for h in history)
            if len(noted) > 1 or len(consumed) > 1 or len(noted) != len(consumed):
                violations.append(
                    f"{order_id}: {step.name} took {len(noted)} event(s) by its history "
                    f"({noted}), {len(consumed)} by its events "
                    f"({[k.event_id for k in consumed]}): exactly one expected"
                )
                continue
            state = process.state
            waits_here = (
                state.process_state is ProcessState.PROCESSING
                and workflow.steps[state.current_step].name == step.name
                and reached
                and not consumed
            )
            untaken = [
                k.event_id for k in state.events if k.name == step.event and not k.consumed_by
            ]
            if waits_here and untaken:
                violations.append(
                    f"{order_id}: still waits at {step.name} though it keeps {untaken}: the "
                    "accepted event was never taken"
                )
            final = process.state.process_state.is_final
            if reached and final and not consumed and not process.state.cancel_requested:
                violations.append(
                    f"{order_id}: reached {step.name}, ended "
                    f"{process.state.process_state.value} without taking an event "
                    f"(accepted: {[e.event_id for e in sent]})"
                )
            if not consumed:
                continue
            taken = consumed[0]
            if taken.event_id != sent[0].event_id:
                violations.append(
                    f"{order_id}: {step.name} took {taken.event_id}, not the first accepted "
                    f"{sent[0].event_id}"
                )
            if not step.approval:
                continue
            completed = step.name in _completed(history)
            rejected = any(
                _step_of(d) == step.name and d.endswith(": rejected")
                for d in _details(history, "step-failed")
            )
            approved = (taken.data or {}).get("approved") is True
            if approved and (not completed or rejected):
                violations.append(
                    f"{order_id}: {step.name} took approval {taken.event_id}, yet "
                    f"{'rejected' if rejected else 'never completed'}"
                )
            if not approved and (completed or not rejected):
                violations.append(
                    f"{order_id}: {step.name} took rejection {taken.event_id}, yet "
                    f"{'completed' if completed else 'never failed as rejected'}"
                )
    return _result(
        "no accepted event lost; each wait takes exactly one, the first",
        len(obs.events),
        violations,
    )


def shipments_wait_for_not_before(obs: Observations) -> InvariantResult:
    """A step after a timer on the order's `notBefore` is never called, let alone
    applied, before that time (by the services' own clock, the ledger's)."""
    effects = _effects_by_order(obs.effects)
    violations: list[str] = []
    checked = 0
    for order_id, process in sorted(obs.processes.items()):
        workflow = obs.workflow_of(order_id)
        not_before = process.order.not_before
        timers = [
            i
            for i, s in enumerate(workflow.steps)
            if s.kind is StepKind.TIMER and s.until == "notBefore"
        ]
        if not_before is None or not timers:
            continue
        checked += 1
        later = {s.name for s in workflow.steps[timers[0] + 1 :] if not s.waits}
        for e in effects.get(order_id, ()):
            if e.operation not in later:
                continue
            for what, when in (("called", e.first_call_at), ("applied", e.applied_at)):
                if when is not None and when < not_before:
                    violations.append(
                        f"{order_id}: {e.operation} {what} at {when:%H:%M:%S.%f}, before "
                        f"its notBefore {not_before:%H:%M:%S.%f}"
                    )
    return _result("nothing after a timer before the order's notBefore", checked, violations)


def finished_orders_reconcile(obs: Observations) -> InvariantResult:
    """Reconciliation after the load (every finished order against the services' keys,
    through the app's own outcome queries) raises a mismatch alert only for an order one
    of whose requests arrived late (the residual risk it exists to heal), and once its
    undos applied, a later run finds nothing: what it found was healed. A mismatch it
    leaves for an operator on a held order (a step settled "not applied" whose provider
    has it after all) is the product's answer, not a failure to heal, while the order is
    held; the run after the operator's resubmits judges those orders again."""
    late = {e.order_id for e in _late_dos(obs).values()}
    violations = [
        f"{a.order_id}: reconciliation mismatch ({a.last_error}), and no request of the "
        "order arrived late"
        for a in obs.alerts
        if a.reason == MISMATCH_REASON and a.order_id not in late
    ]
    if obs.reconciled is None:
        violations.append("reconciliation could not be run after the load")
    finished = sum(1 for p in obs.processes.values() if p.state.process_state in FINISHED)
    if obs.reconciled is not None and obs.reconciled < min(finished, 1000):
        violations.append(f"reconciliation checked {obs.reconciled} of {finished} finished orders")
    left = len(obs.reconcile_left)
    if obs.reconcile_mismatches and obs.reconcile_mismatches[-1] > left:
        violations.append(
            f"reconciliation still finds {obs.reconcile_mismatches[-1] - left} mismatch(es) "
            f"after {len(obs.reconcile_mismatches)} runs (each run's: "
            f"{list(obs.reconcile_mismatches)}, {left} left for an operator on held orders)"
            ": what it found was not healed"
        )
    for order_id in obs.reconcile_left:
        process = obs.processes.get(order_id)
        if process is None or process.state.process_state not in HELD:
            violations.append(
                f"{order_id}: reconciliation left a mismatch for an operator, but the order "
                "is not held"
            )
    return _result(
        "finished orders agree with the services (reconciliation), once healed",
        obs.reconciled or 0,
        violations,
    )


def late_applies_healed(obs: Observations) -> InvariantResult:
    """The residual risk of docs/in-doubt.md, healed and nothing else: a request held on
    the network past its live time at a provider without `abandon` (the simulator marks
    the effect `arrivedLate`) may apply after the order settled its key as not applied.

    Accepted, exactly: such an effect is the order's own (it holds the step there and
    recorded it done), or it was undone there with an alert naming the order
    (applied-after-settled, applied-at-two-providers, reconciliation-mismatch), or, for
    a step nothing undoes, it is alerted and the order, if not finished, held in Error;
    or the order is held in Error (alerted, `every_error_has_an_alert`): reconciliation
    checks finished orders only, so its late effect is healed once an operator's resubmit
    or cancel finishes it, and the check after the resubmits judges it again.
    Refused: any of those alerts, or any undo the order's own compensation does not
    account for, on an order none of whose requests arrived late (the system moved or
    skipped a step whose request could still apply: that is no residual risk, it is a
    bug); and a late effect left in force and unalerted."""
    late = _late_dos(obs)
    late_orders = {e.order_id for e in late.values()}
    alerted: dict[str, set[str]] = defaultdict(set)
    for alert in obs.alerts:
        if alert.reason in HEAL_REASONS:
            alerted[alert.order_id].add(alert.reason)
    violations = [
        f"{order_id}: alerted {sorted(reasons)}, yet no request of the order arrived late"
        for order_id, reasons in sorted(alerted.items())
        if order_id not in late_orders
    ]
    for undo in _heal_undos(obs):
        do = late.get((undo.service, undo.undoes or ""))
        if do is None:
            violations.append(
                f"{undo.order_id}: {undo.operation} at {undo.service} undid {undo.undoes}, "
                "which the order does not account for and which came on time"
            )
        elif not alerted.get(undo.order_id):
            violations.append(
                f"{undo.order_id}: the late {do.operation} at {do.service} was undone "
                "without an operator alert"
            )
    undone = {(e.service, e.undoes) for e in obs.effects if e.undoes and e.undone}
    for (service, key), do in sorted(late.items()):
        process = obs.processes.get(do.order_id)
        if process is None or (service, key) in undone:
            continue
        workflow = obs.workflow_of(do.order_id)
        index = workflow.index_of(do.operation)
        if index is None or index >= len(process.steps):
            violations.append(f"{do.order_id}: a late {do.operation}, not a step of the order")
            continue
        holder = process.steps[index].agent
        state = process.state.process_state
        if holder == service and do.operation in _completed(process.history):
            continue  # the order's own effect: it holds the step there
        if state is ProcessState.ERROR:
            continue  # held, with its alert: judged again once an operator finishes it
        if workflow.steps[index].compensation is not None:
            violations.append(
                f"{do.order_id}: {do.operation} arrived late at {service} and applied "
                f"({state.value}, step held at {holder}); still in force, never undone "
                f"(alerts: {sorted(alerted.get(do.order_id, ()))})"
            )
        elif not alerted.get(do.order_id):
            violations.append(
                f"{do.order_id}: {do.operation} (no undo) arrived late at {service} and "
                f"applied; {state.value}, never alerted: nothing can undo it, so an "
                "operator must be told"
            )
    return _result(
        "late applies healed: alerted and undone, or alerted and held; nothing else",
        len(late),
        violations,
    )


def late_events_refused(obs: Observations) -> InvariantResult:
    """An event sent after its order was final is refused (409) and never kept."""
    violations: list[str] = []
    for e in obs.late_events:
        if e.answer != "409":
            violations.append(
                f"{e.order_id}: event {e.event_id} sent once final, answered {e.answer}"
            )
        process = obs.processes.get(e.order_id)
        if process is not None and any(k.event_id == e.event_id for k in process.state.events):
            violations.append(f"{e.order_id}: event {e.event_id} sent once final, yet kept")
    return _result(
        "events sent after the order was final refused", len(obs.late_events), violations
    )


def own_limits_hold(obs: Observations) -> InvariantResult:
    """Each limited agent's service never saw more than its `callsPerSecond` in one
    second, plus 10% in whole calls (`calls_allowed`: 3 at 3/s, 11 at 10/s), as contract
    section 14 allows."""
    violations = [
        f"{agent}: {seen} calls in one second, limit {rate}/s (at most {_allowed(rate)})"
        for agent, rate in sorted(obs.limits.items())
        if (seen := obs.max_calls_in_one_second.get(agent, 0)) > _allowed(rate)
    ]
    return _result("our own callsPerSecond limits hold", len(obs.limits), violations)


def _allowed(rate: int) -> int:
    return calls_allowed(rate)


def rest_index_agrees_with_state_rows(obs: Observations) -> InvariantResult:
    """At the end, every order at rest has one rest entry, in its state, and nothing
    else has one: every crash between a state write and its rest entry's write or drop
    (the chaos store injects them there) was healed (docs/history.md)."""
    if obs.rest_index is None:
        return _result("the rest index agrees with the state rows", 0, [])
    violations: list[str] = []
    for order_id, process in sorted(obs.processes.items()):
        state = process.state.process_state
        wanted = (state,) if state.is_at_rest else ()
        held = tuple(sorted(obs.rest_index.get(order_id, ())))
        if held != wanted:
            filed = ", ".join(s.value for s in held) or "no entry"
            violations.append(f"{order_id}: {state.value} in its row, but filed as {filed}")
    for order_id in sorted(set(obs.rest_index) - set(obs.processes)):
        violations.append(f"{order_id}: a rest entry but no row")
    return _result("the rest index agrees with the state rows", len(obs.processes), violations)


def final_only_clients_hear_one_final(obs: Observations) -> InvariantResult:
    """A client that asked for the final status only (`notify: final`) hears exactly one,
    the state its order ended in, and nothing while the order is not final (Error, or
    still moving). A message id heard twice is one message (the broker drops a repeat
    within its window, and the client would too)."""
    name = "final-only clients hear one final status"
    if obs.heard is None:
        return _result(name, 0, [])
    heard: dict[str, dict[str, str]] = defaultdict(dict)
    for h in obs.heard:
        heard[h.order_id][h.message_id] = h.status
    checked = 0
    violations = []
    for order_id, planned in sorted(obs.planned.items()):
        process = obs.processes.get(order_id)
        if planned.body.get("notify") != Notify.FINAL.value or process is None:
            continue
        checked += 1
        state = process.state.process_state
        told = sorted(heard.get(order_id, {}).values())
        if told != ([state.value] if state.is_final else []):
            violations.append(f"{order_id}: {state.value}, its client heard {told or 'nothing'}")
    return _result(name, checked, violations)


CHECKS: tuple[Callable[[Observations], InvariantResult], ...] = (
    no_accepted_order_lost,
    all_terminal_within_bound,
    effects_applied_at_most_once,
    net_effect_judged,
    one_key_per_order_and_operation,
    compensations_exactly_for_completed_steps,
    effects_match_history,
    every_error_has_an_alert,
    no_error_from_an_outage,
    no_failure_counted_while_suspended,
    locks_and_failure_counts,
    stale_replies_ignored,
    outcomes_match_orders,
    each_order_runs_its_workflow,
    forward_only_past_the_pivot,
    accepted_events_kept,
    shipments_wait_for_not_before,
    finished_orders_reconcile,
    late_applies_healed,
    late_events_refused,
    own_limits_hold,
    rest_index_agrees_with_state_rows,
    final_only_clients_hear_one_final,
)


def _result(name: str, checked: int, violations: Sequence[str]) -> InvariantResult:
    return InvariantResult(name, not violations, checked, tuple(violations))


def _since_last(history: Sequence[HistoryEntry], event: str) -> list[HistoryEntry]:
    """The history after the last `event` (all of it when there is none)."""
    starts = [i for i, h in enumerate(history) if h.event == event]
    return list(history[starts[-1] + 1 :] if starts else history)


def _details(history: Iterable[HistoryEntry], event: str) -> list[str]:
    return [h.detail for h in history if h.event == event]


_IN_DOUBT_APPLIED = re.compile(
    r"had applied key \S+: (?P<undo>compensation of )?(?P<step>\S+) recorded"
)
"""An in-doubt step its service said was applied (shared/domain/machine/recovery.py): recorded
Completed (or, for an undo, Compensated) without a reply."""


def _completed(history: Iterable[HistoryEntry]) -> list[str]:
    """Steps recorded Completed, by a reply or by an outcome query, in history order."""
    return _recorded(history, "step-completed", undo=False)


def _compensated(history: Iterable[HistoryEntry]) -> list[str]:
    return _recorded(history, "step-compensated", undo=True)


def _recorded(history: Iterable[HistoryEntry], event: str, *, undo: bool) -> list[str]:
    steps: list[str] = []
    for h in history:
        if h.event == event:
            steps.append(h.detail)
        elif (
            h.event == "in-doubt-applied"
            and (m := _IN_DOUBT_APPLIED.search(h.detail))
            and bool(m.group("undo")) is undo
        ):
            steps.append(m.group("step"))
    return steps


def _step_of(detail: str) -> str:
    """`step-failed` details read `{step}: {code}`; the others are the step name."""
    return detail.split(":", 1)[0]


def judge_steps(workflow: Workflow) -> list[Step]:
    """The workflow's steps as the net-effect judge reads them: a pivot or a retriable
    step has no undo, so once applied it stays in force; an event or timer step has no
    service and leaves nothing anywhere."""
    return [
        Step(s.name, s.compensation if s.undoable else None) for s in workflow.steps if not s.waits
    ]


def _acting(workflow: Workflow) -> list[str]:
    """The steps a service performs (an event or timer step has none), in order."""
    return [s.name for s in workflow.steps if not s.waits]


def _first_held(workflow: Workflow) -> int | None:
    """The first step whose failure holds the order rather than compensating it: the one
    after the pivot, or the first retriable step; None when every failure compensates."""
    held = [i for i in range(len(workflow.steps)) if _held_at(workflow, i)]
    return held[0] if held else None


def _held_at(workflow: Workflow, index: int) -> bool:
    """Is a permanent failure of this step held in Error (nothing before it undone)?"""
    pivot = workflow.pivot
    kind = workflow.steps[index].kind
    return kind is StepKind.RETRIABLE or (pivot is not None and index > pivot)


def planned_failure(
    workflow: Workflow, failing_service: str | None, approved: bool | None
) -> int | None:
    """The step an order is planned to fail at: the first one whose service rejects its
    SKU, or an approval step its reviewer rejected; None: it should go through."""
    for i, step in enumerate(workflow.steps):
        if step.agent and step.agent == failing_service:
            return i
        if step.approval and approved is False:
            return i
    return None


def _undo_steps(workflow: Workflow) -> dict[str, str]:
    return {s.compensation: s.name for s in workflow.steps if s.compensation}


def _late_dos(obs: Observations) -> dict[tuple[str, str], Effect]:
    """Do effects applied by a request that arrived late, by (service, key)."""
    return {
        (e.service, e.idempotency_key): e
        for e in obs.effects
        if e.arrived_late and e.applied and e.undoes is None
    }


def _heal_undos(obs: Observations) -> list[Effect]:
    """Undos that undid something and that the order's own compensation does not account
    for: under reconciliation's heal key, at a provider other than the one holding the
    step, on a Processed order, or on a Compensated or Cancelled order whose history
    never compensated that step. (An undo on an order in Error at its holder is its own
    compensation's.)"""
    found: list[Effect] = []
    for e in obs.effects:
        if not (e.undoes and e.applied and e.undone):
            continue
        process = obs.processes.get(e.order_id)
        if process is None:
            continue
        workflow = obs.workflow_of(e.order_id)
        step = _undo_steps(workflow).get(e.operation)
        index = workflow.index_of(step) if step is not None else None
        if step is None or index is None or index >= len(process.steps):
            continue
        state = process.state.process_state
        holder = process.steps[index].agent
        own = step in _compensated(process.history)
        if (
            _is_heal(e)
            or holder != e.service
            or state is ProcessState.PROCESSED
            or (state in (ProcessState.COMPENSATED, ProcessState.CANCELLED) and not own)
        ):
            found.append(e)
    return found


def _is_heal(e: Effect) -> bool:
    """An undo under reconciliation's heal key, not the order's own undo key."""
    if e.undoes is None or not e.idempotency_key.endswith(heal_key("")):
        return False
    return _round(e, e.idempotency_key.removesuffix(heal_key(""))) is not None


def _healed_late(obs: Observations) -> set[tuple[str, str]]:
    """(service, key) of the heal undos of late dos: left out of the checks that compare
    an order's compensations with its history (the late check judges them)."""
    late = _late_dos(obs)
    return {
        (e.service, e.idempotency_key)
        for e in _heal_undos(obs)
        if (e.service, e.undoes or "") in late
    }


def _effects_by_order(effects: Iterable[Effect]) -> dict[str, list[Effect]]:
    by_order: dict[str, list[Effect]] = defaultdict(list)
    for e in effects:
        by_order[e.order_id].append(e)
    return by_order
