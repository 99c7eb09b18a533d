"""The order going forward: its submission, the Scheduler's claim, and the agents'
answers, including the late ones, which are evidence about a key even when they can no
longer move the order."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime

from shared.domain.in_doubt import RemoteOutcome
from shared.domain.machine.dispatch import (
    HEAL,
    dispatch_compensation,
    dispatch_forward,
    drained_step,
    heal_key,
    hold_for_operator,
    requeue,
    round_heal_key,
    undo_at,
    wait_for_drained,
)
from shared.domain.machine.line import in_line
from shared.domain.machine.rekey import round_of
from shared.domain.machine.settle import forward_only, key_state, undone_by
from shared.domain.machine.transition import Builder, ProcessPolicy, Transition
from shared.domain.messages import AgentReply, Nudge, idempotency_key, undo_key
from shared.domain.model import (
    Action,
    ErrorInfo,
    JsonObject,
    KeyState,
    NotificationStatus,
    Order,
    OrderProcess,
    Outcome,
    Phase,
    ProcessState,
    StateRecord,
    StepRecord,
    StepStatus,
)
from shared.domain.routing import PRIMARY_ONLY, Routing
from shared.domain.workflow import StepDefinition, StepKind, Workflow


def start(order: Order, workflow: Workflow, now: datetime, cause: str | None = None) -> Transition:
    """The submission: order stored Pending, every step NotStarted, the Scheduler nudged."""
    b = _submitted(order, workflow, now, cause)
    b.send(Nudge(order.order_id, "submitted").outgoing(b.state.version, high=b.high))
    return b.build()


def start_claimed(
    order: Order,
    workflow: Workflow,
    policy: ProcessPolicy,
    instance_id: str,
    now: datetime,
    cause: str | None = None,
    routing: Routing = PRIMARY_ONLY,
) -> Transition | None:
    """The submission already claimed, in its one insert (issue #39): version 1 is what
    `start` and then the Scheduler's first `claim` would have stored as versions 1 and 2
    (attempt 1, `locked_by` the intake's instance, the first step dispatched or its wait
    begun, through the claim's own step `_claim_forward`), without the nudge, the read
    and the write between them. Its outbox holds
    `Received`, the first step's request (or a timer's wake-up) and `Processing`.

    None when the order must go through the Scheduler: the claim would not leave it
    Processing (its first step's agents are drained, so it would wait for them).
    """
    b = _submitted(order, workflow, now, cause, routing)
    _claim_forward(b, workflow, policy, instance_id, 0, where=", at intake")
    if b.state.process_state is not ProcessState.PROCESSING:
        return None
    return b.build()


def _submitted(
    order: Order,
    workflow: Workflow,
    now: datetime,
    cause: str | None,
    routing: Routing = PRIMARY_ONLY,
) -> Builder:
    state = StateRecord(
        order_id=order.order_id,
        process_state=ProcessState.PENDING,
        locked_by=None,
        complete_by=None,
        failure_count=0,
        attempt=0,
        phase=Phase.FORWARD,
        current_step=0,
        last_error=None,
        version=0,
        created_at=now,
        updated_at=now,
        workflow=workflow.name,
        workflow_version=workflow.version,
    )
    steps = tuple(StepRecord(name=s.name) for s in workflow.steps)
    b = Builder(OrderProcess(order, state, steps), now, cause, routing)
    b.note("submitted", f"{len(order.items)} item(s), priority {order.priority.value}")
    b.notify(NotificationStatus.RECEIVED)
    return b


def claim(
    process: OrderProcess,
    workflow: Workflow,
    policy: ProcessPolicy,
    instance_id: str,
    now: datetime,
    cause: str | None = None,
    routing: Routing = PRIMARY_ONLY,
) -> Transition | None:
    """The Scheduler takes a Pending order and dispatches its next step in the same write.

    An order claimed from its customer's line was watched at the line's hold, minutes
    away, and a promotion's earlier check may since have been written over (an event's
    save re-watches the order as its row reads, still in line): the claim names its
    step's complete-by as the order's check, so the unit of work moves it up before the
    save (chaos `c1-86cc-00133` sat unwatched until its hold)."""
    if process.state.process_state is not ProcessState.PENDING:
        return None
    forward = process.state.phase is Phase.FORWARD
    if forward:
        blocked = drained_step(process.steps, workflow, routing, process.state.current_step)
        if blocked is not None:
            b = Builder(process, now, cause, routing)
            wait_for_drained(b, policy, blocked)
            return b.build()
    b = Builder(process, now, cause, routing)
    if forward:
        _claim_forward(b, workflow, policy, instance_id, process.state.current_step)
    else:
        _lock(b, instance_id, ProcessState.COMPENSATING)
        dispatch_compensation(b, workflow, policy, process.state.current_step)
    if in_line(process):
        b.check_at = b.state.complete_by
    return b.build()


def _claim_forward(
    b: Builder,
    workflow: Workflow,
    policy: ProcessPolicy,
    instance_id: str,
    step: int,
    where: str = "",
) -> None:
    """The one way an order going forward is claimed, by the Scheduler (`claim`) or at
    intake (`start_claimed`): a change to how a claim is made reaches both. The request
    goes out before the client's Processing notification: it is on the order's critical
    path, the notification is not; and only the first attempt's claim tells the client."""
    _lock(b, instance_id, ProcessState.PROCESSING, where)
    dispatch_forward(b, workflow, policy, step)
    if b.state.attempt == 1 and b.state.process_state is ProcessState.PROCESSING:
        b.notify(NotificationStatus.PROCESSING)


def _lock(b: Builder, instance_id: str, state: ProcessState, where: str = "") -> None:
    """The next attempt, held by this instance."""
    b.set(locked_by=instance_id, attempt=b.state.attempt + 1, process_state=state)
    b.note("claimed", f"by {instance_id}, attempt {b.state.attempt}{where}")


def apply_reply(
    process: OrderProcess,
    workflow: Workflow,
    policy: ProcessPolicy,
    reply: AgentReply,
    now: datetime,
    cause: str | None = None,
    routing: Routing = PRIMARY_ONLY,
) -> Transition | None:
    """An agent's answer. The current attempt's answer moves the order on; any other
    changes nothing, unless it proves an effect the order believes absent (`_late_do`)."""
    state = process.state
    index = workflow.index_of(reply.step)
    if index is None or index >= len(process.steps):
        return None
    current = reply.attempt == state.attempt and index == state.current_step
    if reply.action is Action.DO and not (current and _awaits_do(process, index)):
        return _late_do(process, workflow, policy, reply, index, now, cause)
    if not current:
        return None
    b = Builder(process, now, cause, routing)
    if reply.action is Action.DO:
        take_answer(b, workflow, policy, reply, index)
    elif not _take_undo(b, workflow, policy, reply, index):
        return None
    return b.build()


def _awaits_do(process: OrderProcess, index: int) -> bool:
    """May a forward step's answer move the order? While it runs, also while Suspended
    (the step may finish) and while a cancel waits for the step that was running."""
    state = process.state
    if process.steps[index].status is not StepStatus.RUNNING:
        return False
    return state.process_state in (ProcessState.PROCESSING, ProcessState.SUSPENDED) or (
        state.process_state is ProcessState.COMPENSATING and state.cancel_requested
    )


def take_answer(
    b: Builder, workflow: Workflow, policy: ProcessPolicy, reply: AgentReply, index: int
) -> None:
    state = b.state
    step = b.steps[index]
    held = state.process_state is ProcessState.SUSPENDED
    if reply.outcome is Outcome.SUCCEEDED:
        result, oversize = bounded_result(reply.result or {}, workflow.steps[index])
        b.set_step(
            index,
            status=StepStatus.COMPLETED,
            key_state=KeyState.APPLIED,
            result=result,
            error=None,
        )
        b.note("step-completed", step.name)
        if oversize is not None:
            b.set(
                current_step=index,
                last_error=f"{step.name}: result-too-large: {oversize} bytes, at most "
                f"{MAX_RESULT_BYTES} are kept",
            )
            if not held:
                hold_for_operator(b, "result-too-large")
            return
        if held:
            return
        if state.cancel_requested:
            dispatch_compensation(b, workflow, policy, index)
        else:
            dispatch_forward(b, workflow, policy, index + 1)
        return
    error = reply.error or ErrorInfo("unknown", "the agent gave no reason")
    if error.code == KEY_ABANDONED and step.agent and not state.cancel_requested:
        _abandoned_there(b, policy, index, step.agent, held)
        return
    refusal = None if workflow.steps[index].waits else Action.DO
    b.set_step(
        index,
        status=StepStatus.FAILED,
        key_state=KeyState.NOT_APPLIED,
        error=error,
        refused=refusal,
    )
    b.note("step-failed", f"{step.name}: {error.code}")
    if not state.cancel_requested and forward_only(b.steps, workflow, index):
        b.set(last_error=refused(step.name, error, step.name, step.agent))
        if not held:
            hold_for_operator(b, _held_because(workflow, index))
        return
    if not state.cancel_requested:
        b.set(
            phase=Phase.COMPENSATE,
            process_state=state.process_state if held else ProcessState.COMPENSATING,
            last_error=f"{step.name}: {error.code}: {error.message}",
        )
        b.notify(NotificationStatus.FAILED, b.state.last_error)
    if not held:
        dispatch_compensation(b, workflow, policy, index - 1)


KEY_ABANDONED = "operation-abandoned"
"""A provider's answer to a key that was abandoned there: it never applied, never will."""


def _abandoned_there(b: Builder, policy: ProcessPolicy, index: int, agent: str, held: bool) -> None:
    """The key was abandoned at this provider (a Supervisor abandoned it, then lost its
    write to another's, so the order did not know): that is evidence, not the customer's
    failure. The step goes to another open provider, or waits for an operator when none
    is left; nothing is compensated for it."""
    step = b.steps[index]
    b.set_step(
        index,
        status=StepStatus.NOT_STARTED,
        key_state=KeyState.NOT_APPLIED,
        complete_by=None,
        abandoned_at=step.abandoned_at
        if agent in step.abandoned_at
        else (*step.abandoned_at, agent),
    )
    b.note("in-doubt-abandoned", f"{agent} says key of {step.name} was abandoned there")
    if not held:
        # A new claim, so the retry is a new attempt: the same attempt's request id
        # would be dropped by the broker's duplicate detection.
        requeue(b, policy, 0, "redispatch")


MAX_RESULT_BYTES = 16 * 1024
"""A step's result is stored with the order (one table property holds 64 KiB) and sent
to later steps and to its undo: big enough for ids and amounts, not for documents."""


def bounded_result(result: JsonObject, definition: StepDefinition) -> tuple[JsonObject, int | None]:
    """The result to keep, and its size when even its declared fields are too large.

    An oversize result keeps only the fields the catalogue declares; when those are too
    large as well the step is still recorded as applied (it is, at the provider) with no
    result, and the order is held for an operator."""
    size = len(json.dumps(result, separators=(",", ":")))
    if size <= MAX_RESULT_BYTES:
        return result, None
    declared = {k: v for k, v in result.items() if k in definition.results}
    if declared and len(json.dumps(declared, separators=(",", ":"))) <= MAX_RESULT_BYTES:
        return declared, None
    return {}, size


def _held_because(workflow: Workflow, index: int) -> str:
    if workflow.steps[index].kind is StepKind.RETRIABLE:
        return "retriable-step-failed"
    return "failed-past-pivot"


def _take_undo(
    b: Builder, workflow: Workflow, policy: ProcessPolicy, reply: AgentReply, index: int
) -> bool:
    state = b.state
    step = b.steps[index]
    held = state.process_state is ProcessState.SUSPENDED
    awaited = state.process_state is ProcessState.COMPENSATING or (
        held and state.phase is Phase.COMPENSATE
    )
    if not awaited or step.status is StepStatus.COMPENSATED or step.complete_by is None:
        return False
    if step.status is StepStatus.RUNNING:
        return False
    if reply.agent is not None and reply.agent != step.agent:
        return False  # an undo sent elsewhere (`undo_at`): the order's own went to the holder
    if reply.outcome is Outcome.SUCCEEDED:
        found_nothing = _found_nothing(reply)
        b.set_step(
            index,
            status=StepStatus.COMPENSATED,
            complete_by=None,
            key_state=undone_by(step, found_nothing),
        )
        b.note("step-compensated", step.name)
        if not held:
            dispatch_compensation(b, workflow, policy, index - 1)
        return True
    error = reply.error or ErrorInfo("unknown", "the agent gave no reason")
    undo = workflow.steps[index].compensation or ""
    b.set_step(index, refused=Action.COMPENSATE)
    b.set(last_error=refused(f"compensation of {step.name}", error, undo, step.agent))
    hold_for_operator(b, "compensation-failed")
    return True


def refused(what: str, error: ErrorInfo, operation: str, agent: str | None) -> str:
    """The words of an operation refused for good that the order is held on (a retriable
    step, a step past the pivot, an undo). The saga counts on these succeeding in the
    end, so only a person can mend what refused: the words name the operation and the
    provider to mend before the resubmit (docs/in-doubt.md). Shaped `{what}: {code}:
    {message} (...)`, the form `failures.failure_of` reads."""
    return (
        f"{what}: {error.code}: {error.message} ({operation} refused at {agent or 'its provider'})"
    )


def _found_nothing(reply: AgentReply) -> bool:
    """An undo's success that undid nothing (`{"undone": false, "reason":
    "nothing-to-undo"}`, docs/contract.md 8.1): its do had not applied there. Read as
    reconciliation reads the same answer to an outcome query."""
    return RemoteOutcome.applied(reply.result or {}).found_nothing_to_undo


def _late_do(
    process: OrderProcess,
    workflow: Workflow,
    policy: ProcessPolicy,
    reply: AgentReply,
    index: int,
    now: datetime,
    cause: str | None,
) -> Transition | None:
    """An answer the order is no longer waiting for: a stale attempt, a duplicate, or a
    step no longer running. It changes nothing (the key it speaks of settles by time or
    by asking), except when it proves an effect the order believes is not there:

    - a success at an agent the order moved away from, in a key space of its own: an
      operator is alerted and the effect is undone there (`_undo_extra`);
    - a success for the key the order settled as not applied (a request that reached a
      provider without `abandon` after its live time: the residual risk,
      docs/in-doubt.md). While the order still goes forward it is the step's answer: the
      step is recorded Completed there, so the retry never charges a second provider and
      a cancel undoes it (`_applied_after_settled`). An order already undoing, or
      finished, is past the step: the effect is undone there;
    - a success for a step the order compensated whose undo found nothing to undo (its
      key settled not applied by that answer): the do applied after the undo, so the
      effect is in force where the order says none is. It is undone there at once, under
      the heal key, since the order's undo key is spent (answered from its record);
    - a success of an earlier round of the step's key, wherever it landed, the step's
      holder included (`_earlier_round`): the order moved the key on after a refusal
      for good, so that effect is never the order's.

    Agents that share one key space (`retry_elsewhere`, two regions of one provider) hold
    one effect between them: a success from either is the same key's, never a second
    effect to undo.
    """
    if reply.outcome is not Outcome.SUCCEEDED:
        return _late_failure(process, workflow, policy, reply, index, now, cause)
    step = process.steps[index]
    agent = reply.agent or step.agent
    if agent is None:
        return None
    key_round = round_of(step, reply.attempt)
    if key_round != step.do_round:
        return _earlier_round(process, workflow, policy, reply, index, agent, key_round, now, cause)
    if not same_key_space(workflow.steps[index], agent, step.agent):
        if agent not in step.tried:
            return None
        return _undo_extra(process, workflow, policy, reply, index, agent, now, cause)
    if step.status is StepStatus.COMPLETED or key_state(step) is not KeyState.NOT_APPLIED:
        return None
    if step.status is StepStatus.COMPENSATED:
        return _undo_extra(process, workflow, policy, reply, index, agent, now, cause, spent=True)
    forward = process.state.phase is Phase.FORWARD and not process.state.process_state.is_final
    if forward:
        return _applied_after_settled(process, workflow, policy, reply, index, agent, now, cause)
    return _undo_extra(process, workflow, policy, reply, index, agent, now, cause)


def same_key_space(definition: StepDefinition, agent: str, holder: str | None) -> bool:
    """Is a key at `agent` the same key as at the step's holder? Only at the holder
    itself, or between candidates that share one idempotency-key space."""
    if agent == holder:
        return True
    shared = definition.retry_elsewhere and holder in definition.candidates
    return shared and agent in definition.candidates


APPLIED_AFTER_SETTLED = "applied-after-settled"
"""The alert for a key settled as not applied at its provider that applied there after
all: a request reached it after its live time (docs/in-doubt.md, the residual risk)."""


def _applied_after_settled(
    process: OrderProcess,
    workflow: Workflow,
    policy: ProcessPolicy,
    reply: AgentReply,
    index: int,
    agent: str,
    now: datetime,
    cause: str | None,
) -> Transition:
    """The key the order settled as not applied applied after all, and the order still
    goes forward: the success is the step's answer, as a retry there would have heard.
    Recorded Completed at that agent (so no retry charges another provider, and a cancel
    or a compensation undoes it like any applied step), an operator alerted; a Pending
    order goes on from the next step, a held or suspended one stays where it is."""
    definition = workflow.steps[index]
    state = process.state
    b = Builder(process, now, cause)
    result, oversize = bounded_result(reply.result or {}, definition)
    b.set_step(
        index,
        status=StepStatus.COMPLETED,
        key_state=KeyState.APPLIED,
        result=result,
        error=None,
        suspect=None,
        complete_by=None,
    )
    b.set(
        last_error=f"{definition.name}: {APPLIED_AFTER_SETTLED}: {agent} applied the key "
        "settled not applied there; recorded Completed there"
    )
    b.note(APPLIED_AFTER_SETTLED, f"{definition.name} at {agent}: recorded Completed")
    b.alert(APPLIED_AFTER_SETTLED)
    if state.process_state is not ProcessState.PENDING:
        return b.build()
    if oversize is not None:
        b.set(
            current_step=index,
            last_error=f"{definition.name}: result-too-large: {oversize} bytes, at most "
            f"{MAX_RESULT_BYTES} are kept",
        )
        hold_for_operator(b, "result-too-large")
        return b.build()
    b.set(locked_by=None)
    requeue(b, policy, 0, "resolved")
    return b.build()


def _late_failure(
    process: OrderProcess,
    workflow: Workflow,
    policy: ProcessPolicy,
    reply: AgentReply,
    index: int,
    now: datetime,
    cause: str | None,
) -> Transition | None:
    """A failure reply is the provider's last word on the key (agents reply failed only
    for a permanent answer, which the provider gives that key for good), whichever
    attempt it answers. An order waiting to retry the step takes it as the step's answer
    (the retry would meet the same one); a compensation waiting on the key goes on at
    once; otherwise the key is settled as not applied, so no undo is ever sent for it."""
    step = process.steps[index]
    state = process.state
    agent = reply.agent or step.agent
    if not same_key_space(workflow.steps[index], agent or "", step.agent):
        return None
    if round_of(step, reply.attempt) != step.do_round:
        return None  # an earlier round's key: it says nothing of the current one
    if step.status is StepStatus.RUNNING:
        return None
    doubted = key_state(step)
    if state.process_state.is_final or doubted not in (KeyState.UNSETTLED, KeyState.EXPIRED):
        return None
    error = reply.error or ErrorInfo("unknown", "the agent gave no reason")
    b = Builder(process, now, cause)
    b.note("in-doubt-not-applied", f"{step.agent} answered {step.name} late: {error.code}")
    retrying = state.process_state is ProcessState.PENDING and state.phase is Phase.FORWARD
    if retrying and state.current_step == index:
        take_answer(b, workflow, policy, reply, index)
        return b.build()
    if state.phase is not Phase.COMPENSATE:
        b.set_step(index, key_state=KeyState.NOT_APPLIED)
        return b.build()
    b.set_step(index, status=StepStatus.FAILED, key_state=KeyState.NOT_APPLIED, error=error)
    waiting = (
        doubted is KeyState.UNSETTLED
        and state.process_state is ProcessState.COMPENSATING
        and state.current_step == index
    )
    if waiting:
        dispatch_compensation(b, workflow, policy, index - 1)
    return b.build()


def _undo_extra(
    process: OrderProcess,
    workflow: Workflow,
    policy: ProcessPolicy,
    reply: AgentReply,
    index: int,
    agent: str,
    now: datetime,
    cause: str | None,
    *,
    spent: bool = False,
) -> Transition | None:
    """Alert, and send the undo to the provider that holds the extra effect. Its answer
    is not awaited (the order has moved on); reconciliation checks that provider again.
    Where the order's own undo key is `spent` there (it found nothing to undo), the undo
    goes under that key's heal key (the current undo round's, the one reconciliation
    names: one effect, one heal key), with an id of its own: the order's undo of the step may
    have gone out in the same attempt, and the broker would drop this as its duplicate.

    An order not yet finished never sends a do of the step there again (the key there is
    spent: a do with it would be answered with the effect just undone, and the order
    would record a charge that is no longer in force). With no undo in the catalogue
    (a pivot, a retriable step) nothing can take the effect back: such an order is held
    for an operator."""
    definition = workflow.steps[index]
    if agent not in definition.candidates:
        return None
    step = process.steps[index]
    b = Builder(process, now, cause)
    shared = same_key_space(definition, agent, step.agent)
    reason = APPLIED_AFTER_SETTLED if shared else "applied-at-two-providers"
    b.set(last_error=f"{definition.name} applied at {agent} after the order moved on")
    unfinished = not process.state.process_state.is_final
    if unfinished and agent not in step.abandoned_at:
        b.set_step(index, abandoned_at=(*step.abandoned_at, agent))
    if definition.compensation is None:
        return _nothing_undoes(b, process, reason, f"{definition.name} at {agent}")
    b.note(reason, f"{definition.name} at {agent}: undoing it there")
    b.alert(reason)
    if not spent:
        b.send(undo_at(process, definition, policy, agent, reply.attempt, reply.result, now))
        return b.build()
    key = heal_key(undo_key(process.order_id, definition.compensation, step))
    undo = undo_at(process, definition, policy, agent, reply.attempt, reply.result, now, key)
    b.send(replace(undo, message_id=f"{undo.message_id}:{HEAL}"))
    return b.build()


def _earlier_round(
    process: OrderProcess,
    workflow: Workflow,
    policy: ProcessPolicy,
    reply: AgentReply,
    index: int,
    agent: str,
    key_round: int,
    now: datetime,
    cause: str | None,
) -> Transition | None:
    """A success of a round of the step's key that the order moved on from: a request
    of that round held on the network past its live time at a provider without
    `abandon` (its key settled not applied there), while another provider refused the
    same key for good and the operator's resubmit sent the step under its next round.
    That effect is never the order's, wherever it landed: the order holds the step under
    its current round, or will. So it is alerted and undone there, naming that round's
    do key, under that round's own key (`round_heal_key`: the order's undo key at the
    holder is the current round's). Nothing else changes: the current round's key at
    that provider is not spent. With no undo in the catalogue (a do is refused and held
    only on a retriable step or past the pivot, which have none) nothing can take it
    back: an order not at rest is held for an operator, as for an effect at another
    provider (`_undo_extra`)."""
    definition = workflow.steps[index]
    step = process.steps[index]
    if agent not in step.tried or agent not in definition.candidates:
        return None
    b = Builder(process, now, cause)
    held_there = same_key_space(definition, agent, step.agent)
    reason = APPLIED_AFTER_SETTLED if held_there else "applied-at-two-providers"
    old = idempotency_key(process.order_id, definition.name, key_round)
    current = idempotency_key(process.order_id, definition.name, step.do_round)
    b.set(
        last_error=f"{definition.name} applied at {agent} under {old}, a key the order "
        f"moved on from to {current}"
    )
    if definition.compensation is None:
        return _nothing_undoes(b, process, reason, f"{definition.name} at {agent} under {old}")
    key = round_heal_key(process.order_id, definition.compensation, key_round)
    b.note(reason, f"{definition.name} at {agent} under {old}: undoing it there under {key}")
    b.alert(reason)
    undo = undo_at(
        process, definition, policy, agent, reply.attempt, reply.result, now, do_round=key_round
    )
    b.send(replace(undo, message_id=f"{undo.message_id}:{HEAL}-r{key_round + 1}"))
    return b.build()


def _nothing_undoes(b: Builder, process: OrderProcess, reason: str, effect: str) -> Transition:
    """An extra effect the catalogue has no undo for: only an operator can settle it, so
    an order not at rest is held for one; one at rest is alerted."""
    b.note(reason, f"{effect}: nothing undoes it")
    if not process.state.process_state.is_at_rest:
        hold_for_operator(b, reason)
    else:
        b.alert(reason)
    return b.build()
