"""The Supervisor's moves: an order whose complete-by passed, a dispatch that could not be
sent, and when to look at an order next."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from shared.domain.failures import WAIT_EXPIRED, timed_out
from shared.domain.in_doubt import RemoteOutcome, RemoteOutcomeKind
from shared.domain.machine.dispatch import (
    hold_for_operator,
    pending_event,
    requeue,
    wait_to_settle,
)
from shared.domain.machine.forward import take_answer
from shared.domain.machine.line import in_line
from shared.domain.machine.settle import forward_only, key_state, settled_by, undone_by
from shared.domain.machine.transition import Builder, ProcessPolicy, Transition
from shared.domain.machine.waits import consume_event, fire_timer, wait_answer, waiting_step
from shared.domain.messages import do_key, iso, undo_key
from shared.domain.model import (
    ErrorInfo,
    ExhaustedPolicy,
    KeyState,
    NotificationStatus,
    OrderProcess,
    Phase,
    ProcessState,
    StepRecord,
    StepStatus,
)
from shared.domain.routing import PRIMARY_ONLY, Routing
from shared.domain.workflow import OnDeadline, StepKind, Workflow


def recover(
    process: OrderProcess,
    workflow: Workflow,
    policy: ProcessPolicy,
    now: datetime,
    cause: str | None = None,
    *,
    count: bool = True,
    outcome: RemoteOutcome | None = None,
    routing: Routing = PRIMARY_ONLY,
) -> Transition | None:
    """The Supervisor's move for an order whose complete-by has passed; None if it has not.

    FailureCount counts only what happened to the order's step: a complete-by that passed
    while an agent had the request. A Pending order whose complete-by passed was never given
    to an agent (its nudge was lost or not sent, the broker was down), so it is nudged
    again and nothing is counted. Without `count` (the complete-by passed while the system's
    own broker or store was down) the step is dispatched again, uncounted.

    `outcome` is what the step's provider said about the in-doubt key (None: not asked);
    it settles the key only as far as it proves (machine/settle.py). A compensation that
    waits for a step to settle counts nothing: it is waiting on evidence, not failing.

    `routing`: the agents' health and drains now. A wait whose deadline passes (a timer
    fired, a kept event taken) dispatches the next step here, which, like the Scheduler's
    dispatch, must not go to a drained agent.
    """
    complete_by = next_complete_by(process, policy)
    if complete_by is None or complete_by > now:
        return None
    state = process.state
    b = Builder(process, now, cause, routing)
    b.workflow = workflow
    if state.process_state is ProcessState.PENDING:
        b.set(locked_by=None)
        requeue(b, policy, 0, "renudged")
        return b.build()
    index = state.current_step
    step = process.steps[index] if index < len(process.steps) else None
    if step is None:
        b.set(locked_by=None)
        requeue(b, policy, 0, "redispatch")
        return b.build()
    running = step.status is StepStatus.RUNNING
    if running and waiting_step(process, workflow) == index:
        _wait_passed(b, workflow, policy, index)
        return b.build()
    undo_out = state.process_state is ProcessState.COMPENSATING and not running
    undo_out = undo_out and step.complete_by is not None
    if not running and not undo_out:
        return _settle_wait(b, policy, index, step, outcome)
    if outcome is not None and outcome.kind is RemoteOutcomeKind.APPLIED:
        _record_applied(b, policy, index, step, undo=undo_out, outcome=outcome)
        return b.build()
    if running:
        _in_doubt(b, index, step, outcome)
    else:
        b.set_step(index, complete_by=None)
    if not count:
        b.set(locked_by=None)
        b.note("expired-in-outage", f"{_step_label(process)}: not counted")
        requeue(b, policy, 0, "redispatch")
        return b.build()
    failures = state.failure_count + 1
    b.set(
        failure_count=failures,
        locked_by=None,
        last_error=timed_out(_step_label(process), complete_by),
    )
    b.note("timed-out", b.state.last_error or "")
    if outcome is not None:
        _note_outcome(b, step, outcome, undo=undo_out)
    if failures < policy.max_failure_count and _leaving(b, index):
        wait_to_settle(b, index)
    elif failures < policy.max_failure_count:
        requeue(b, policy, failures, "requeued")
    elif _exhaustion_compensates(state.phase, b.steps, workflow, index, policy):
        b.alert("max-failure-count-reached-compensating")
        b.notify(NotificationStatus.FAILED, b.state.last_error)
        # The step that timed out is undone too once its key settles as applied.
        b.set(phase=Phase.COMPENSATE, current_step=index, failure_count=0)
        if _leaving(b, index):
            wait_to_settle(b, index)
        else:
            requeue(b, policy, 1, "compensation-requested")
    else:
        hold_for_operator(b, "max-failure-count-reached")
    return b.build()


def exhaustion_undoes(process: OrderProcess, workflow: Workflow, policy: ProcessPolicy) -> bool:
    """Would one more counted timeout make the order undo its current step? Only when it
    exhausts the count, the policy compensates, and the order may still be undone: past
    the pivot, or at a retriable step, it is held instead, and its provider keeps the key
    (abandoning it there would leave a resubmit no provider)."""
    state = process.state
    return state.failure_count + 1 >= policy.max_failure_count and _exhaustion_compensates(
        state.phase, process.steps, workflow, state.current_step, policy
    )


def _exhaustion_compensates(
    phase: Phase,
    steps: Sequence[StepRecord],
    workflow: Workflow,
    index: int,
    policy: ProcessPolicy,
) -> bool:
    return (
        policy.exhausted_policy is ExhaustedPolicy.COMPENSATE
        and phase is Phase.FORWARD
        and not forward_only(steps, workflow, index)
    )


def _leaving(b: Builder, index: int) -> bool:
    """Is the order undoing, with this step's key not settled? Then it waits for the key
    here, with the Supervisor, rather than going through the Scheduler to find out."""
    step = b.steps[index]
    undoing = b.state.phase is Phase.COMPENSATE and step.status is not StepStatus.COMPENSATED
    return undoing and key_state(step) is KeyState.UNSETTLED


def _in_doubt(b: Builder, index: int, step: StepRecord, outcome: RemoteOutcome | None) -> None:
    """No answer by its complete-by: the step goes back to NotStarted with its key as the
    answer proves it (still unsettled unless applied, abandoned, or past its live time)."""
    changes: dict[str, object] = {"status": StepStatus.NOT_STARTED, "complete_by": None}
    if outcome is not None:
        settled = settled_by(step, outcome, b.now)
        changes["key_state"] = settled
        if outcome.kind is RemoteOutcomeKind.ABANDONED and step.agent:
            changes["abandoned_at"] = (*step.abandoned_at, step.agent)
        if settled is KeyState.NOT_APPLIED:
            changes["suspect"] = step.agent
        if outcome.kind is RemoteOutcomeKind.IN_PROGRESS:
            changes["live_until"] = _extended(step, b.now)
    b.set_step(index, **changes)


def _extended(step: StepRecord, now: datetime) -> datetime:
    """An "in progress" answer is evidence the request is live: it stays live at least
    as long again as the margin that was left when it was sent."""
    margin = (step.live_until - step.complete_by) if step.live_until and step.complete_by else None
    later = now + margin if margin is not None else now
    return max(step.live_until or now, later)


def _settle_wait(
    b: Builder,
    policy: ProcessPolicy,
    index: int,
    step: StepRecord,
    outcome: RemoteOutcome | None,
) -> Transition:
    """A compensation waited for a step's request: the answer settles its key (or, past
    its live time with no answer, leaves it expired, which an undo may meet), and the
    Scheduler goes on; an "in progress" answer, or a request still live, waits on."""
    b.set(locked_by=None)
    unasked = RemoteOutcome.unknown("not asked")
    settled = settled_by(step, outcome or unasked, b.now)
    changes: dict[str, object] = {"key_state": settled}
    if outcome is not None and outcome.kind is RemoteOutcomeKind.APPLIED:
        changes.update(status=StepStatus.COMPLETED, result=dict(outcome.result or {}))
    if outcome is not None and outcome.kind is RemoteOutcomeKind.ABANDONED and step.agent:
        changes["abandoned_at"] = (*step.abandoned_at, step.agent)
    if outcome is not None and outcome.kind is RemoteOutcomeKind.IN_PROGRESS:
        changes["live_until"] = _extended(step, b.now)
    b.set_step(index, **changes)
    if outcome is not None:
        _note_outcome(b, step, outcome, undo=False)
    if settled is KeyState.UNSETTLED:
        until = b.steps[index].live_until
        b.set(
            complete_by=until if until is not None and until > b.now else b.now + policy.backoff(1)
        )
        b.note("waiting-to-settle", f"{step.name}: its request may still apply")
        return b.build()
    requeue(b, policy, 0, "settled")
    return b.build()


def undelivered(
    process: OrderProcess, policy: ProcessPolicy, now: datetime, cause: str | None = None
) -> Transition | None:
    """The stored dispatch of `process` could not be sent (the bus was unreachable): back
    to Pending with FailureCount unchanged, so the next claim sends it again (same key,
    next attempt) and no complete-by counts against the order.

    The send may have got through before it failed, so the step's key stays as it was
    (unsettled, live until its complete-by plus the skew margin): a cancel meanwhile
    waits for it like for any live request. None: the state awaits no agent request.
    """
    state = process.state
    index = state.current_step
    if state.process_state not in (ProcessState.PROCESSING, ProcessState.COMPENSATING):
        return None
    if index >= len(process.steps) or process.steps[index].complete_by is None:
        return None
    b = Builder(process, now, cause)
    if process.steps[index].status is StepStatus.RUNNING:
        b.set_step(index, status=StepStatus.NOT_STARTED, complete_by=None)
    else:
        b.set_step(index, complete_by=None)
    b.set(locked_by=None)
    b.note(
        "undelivered",
        f"{_step_label(process)}: the bus refused the send, which may have got through in part",
    )
    requeue(b, policy, 0, "redispatch")
    return b.build()


def next_check(
    process: OrderProcess, workflow: Workflow, policy: ProcessPolicy, now: datetime
) -> datetime | None:
    """When the Supervisor's watch entry should come due; never after a real complete-by.

    A Pending order may be claimed at any moment and its step's complete-by then starts
    running, so a Pending order is checked again within the shortest step timeout.
    Checking early only costs a read; checking late would delay recovery. An order in
    its customer's line is the exception: only a promotion, which moves its check up
    again, or its hold passing lets it be claimed (shared/domain/machine/line.py).
    """
    complete_by = next_complete_by(process, policy)
    if complete_by is None or process.state.process_state is not ProcessState.PENDING:
        return complete_by
    if in_line(process):
        return complete_by
    timeouts = [policy.timeout(s, process.order.priority) for s in workflow.steps]
    return min(complete_by, now + min(timeouts, default=policy.step_timeout))


def sooner_check(
    read: OrderProcess,
    changed: OrderProcess,
    workflow: Workflow,
    policy: ProcessPolicy,
    now: datetime,
    recheck: timedelta,
) -> datetime | None:
    """The changed order's next check, where it may come before the one its watch entry
    holds; None where the entry stands (its check is no later than the change's).

    A change the Scheduler makes writes no check: an order moving forward keeps its
    entry, which holds a check no later than the order as it was read needs (its
    complete-by; Pending, within the shortest step timeout from then; in its customer's
    line, the promotion's `recheck` at most, since only a promotion or the Supervisor
    brings it to the Scheduler). That is enough while each step comes due after the one
    before it. A step due sooner (a shorter timeout after a migrate, a timer whose time
    has passed) needs its entry moved up, or the Supervisor looks at it up to a step
    timeout late. Judged from the two rows alone, so a fault-free order, whose every
    next step is due later, costs no request for it."""
    due = next_check(changed, workflow, policy, now)
    if due is None:
        return None
    watched = now + recheck if in_line(read) else next_check(read, workflow, policy, now)
    return due if watched is None or due < watched else None


def next_complete_by(process: OrderProcess, policy: ProcessPolicy) -> datetime | None:
    """When the Supervisor must look at this order next; None when nothing can expire."""
    state = process.state
    if state.process_state.is_at_rest:
        return None
    if state.process_state is ProcessState.PENDING:
        return state.complete_by or state.updated_at + policy.pending_timeout
    candidates = [d for d in (state.complete_by, _running_step_complete_by(process)) if d]
    return min(candidates) if candidates else state.updated_at + policy.step_timeout


def _running_step_complete_by(process: OrderProcess) -> datetime | None:
    index = process.state.current_step
    if index < len(process.steps):
        return process.steps[index].complete_by
    return None


def _step_label(process: OrderProcess) -> str:
    index = process.state.current_step
    step = process.steps[index] if index < len(process.steps) else None
    if step is None:
        return "workflow"
    undoing = process.state.phase is Phase.COMPENSATE and step.status is not StepStatus.RUNNING
    return f"compensation of {step.name}" if undoing else step.name


def _record_applied(
    b: Builder,
    policy: ProcessPolicy,
    index: int,
    step: StepRecord,
    *,
    undo: bool,
    outcome: RemoteOutcome,
) -> None:
    """The service applied the in-doubt key: record it as if the reply had come, and let
    the Scheduler's next claim go on from there (next step, next undo, or the end)."""
    agent = step.agent or "the agent"
    if undo:
        state = undone_by(step, outcome.found_nothing_to_undo)
        b.set_step(index, status=StepStatus.COMPENSATED, complete_by=None, key_state=state)
        what, recorded, key = f"compensation of {step.name}", "Compensated", _key(b, step, True)
    else:
        b.set_step(
            index,
            status=StepStatus.COMPLETED,
            key_state=KeyState.APPLIED,
            result=dict(outcome.result or {}),
            error=None,
            complete_by=None,
        )
        what, recorded, key = step.name, "Completed", _key(b, step, False)
    b.set(locked_by=None)
    b.note(
        "in-doubt-applied",
        f"{agent} had applied key {key}: {what} recorded {recorded} without calling again",
    )
    requeue(b, policy, 0, "resolved")


def _key(b: Builder, step: StepRecord, undo: bool) -> str:
    """The idempotency key the step's request (or its undo's) carried: its current round."""
    operation = b.workflow.operation(step.name, undo) if b.workflow else None
    key = undo_key if undo else do_key
    return key(b.order.order_id, operation or step.name, step)


def _note_outcome(b: Builder, step: StepRecord, outcome: RemoteOutcome, *, undo: bool) -> None:
    """Why the retry goes where it goes, in the order's history."""
    agent = step.agent or "the agent"
    key = _key(b, step, undo)
    kind = outcome.kind
    settled = key_state(b.steps[b.state.current_step]) if not undo else None
    if kind is RemoteOutcomeKind.APPLIED:
        # Only a settle wait gets here (recover's own applied answers: _record_applied).
        recorded = f"{step.name} recorded Completed without calling again"
        b.note("in-doubt-applied", f"{agent} had applied key {key}: {recorded}")
    elif kind is RemoteOutcomeKind.ABANDONED:
        b.note("in-doubt-abandoned", f"{agent} abandoned key {key}: it can never apply there")
    elif outcome.safe_to_move:
        said = "had not applied" if kind is RemoteOutcomeKind.NOT_APPLIED else "never saw"
        final = settled is KeyState.NOT_APPLIED
        why = "settled: no request can still apply" if final else "a request may still apply"
        b.note("in-doubt-not-applied", f"{agent} {said} key {key} ({why})")
    elif kind is RemoteOutcomeKind.IN_PROGRESS:
        b.note("in-doubt-unanswered", f"{agent} still runs key {key}")
    else:
        why = f" ({outcome.detail})" if outcome.detail else ""
        b.note("in-doubt-unanswered", f"{agent} gave no answer about key {key}{why}")


def version_gone(process: OrderProcess, now: datetime, cause: str | None = None) -> Transition:
    """The order pins a workflow version the running catalogue no longer keeps: nothing
    can say what its next step is, so it is held for an operator (put the version back,
    then resubmit), never guessed at on another version."""
    b = Builder(process, now, cause)
    state = process.state
    b.set(last_error=f"workflow {state.workflow} v{state.workflow_version} is not in the catalogue")
    hold_for_operator(b, "workflow-version-gone")
    return b.build()


def _wait_passed(b: Builder, workflow: Workflow, policy: ProcessPolicy, index: int) -> None:
    """A wait's complete-by: a timer fires (the Supervisor is the backstop of its scheduled
    nudge); an event wait takes an event that is there, else follows its policy. Nothing
    is counted: an approval that does not come is not a failure of the system."""
    definition, step = workflow.steps[index], b.steps[index]
    if definition.kind is StepKind.TIMER:
        fire_timer(b, workflow, policy, index)
        return
    event = pending_event(b.state.events, definition)
    if event is not None:
        consume_event(b, workflow, policy, index, event)
        return
    complete_by = step.complete_by or b.now
    final = (
        step.dispatched_at + timedelta(seconds=definition.final_deadline_seconds)
        if definition.final_deadline_seconds is not None and step.dispatched_at is not None
        else None
    )
    if definition.on_deadline is OnDeadline.ALERT and final is not None and complete_by < final:
        b.set_step(index, complete_by=final)
        b.set(complete_by=final)
        b.note("wait-overdue", f"{definition.name}: no {definition.event} by {iso(complete_by)}")
        b.alert("wait-overdue")
        return
    missing = f"no {definition.event} by {iso(complete_by)}"
    if definition.on_deadline is OnDeadline.COMPENSATE:
        expired = wait_answer(b, definition.name, None, ErrorInfo(WAIT_EXPIRED, missing))
        take_answer(b, workflow, policy, expired, index)
        return
    b.set(locked_by=None, last_error=f"{definition.name}: {WAIT_EXPIRED}: {missing}")
    hold_for_operator(b, WAIT_EXPIRED)
