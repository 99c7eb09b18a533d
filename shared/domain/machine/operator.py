"""An operator's moves on one order: resubmit, cancel, suspend, resume.

None of them forgets a request it did not see answered: a step's key state and live
time survive every one of them, so a cancel after a resume still waits for the request
the suspend left running (machine/settle.py).
"""

from __future__ import annotations

from datetime import datetime

from shared.domain.machine.dispatch import requeue
from shared.domain.machine.rekey import rekey_refused
from shared.domain.machine.settle import past_pivot
from shared.domain.machine.transition import Builder, InvalidTransition, ProcessPolicy, Transition
from shared.domain.messages import iso
from shared.domain.model import NotificationStatus, OrderProcess, Phase, ProcessState, StepStatus
from shared.domain.workflow import Workflow


def resubmit(
    process: OrderProcess,
    policy: ProcessPolicy,
    now: datetime,
    operator: str = "operator",
    cause: str | None = None,
    workflow: Workflow | None = None,
) -> Transition:
    """An operator resumes an Error order at its failed step; completed steps stay done.
    An operation its provider refused for good goes under a fresh key (machine/rekey.py),
    which the history of the resubmit names (`workflow` gives the keys' words)."""
    if process.state.process_state is not ProcessState.ERROR:
        raise InvalidTransition(
            f"order {process.order_id} is {process.state.process_state.value}, not Error"
        )
    b = Builder(process, now, cause)
    b.set(failure_count=0, locked_by=None, complete_by=None)
    moved = rekey_refused(b, workflow)
    b.note("resubmitted", f"by {operator}" + (f"; {moved}" if moved else ""))
    requeue(b, policy, 0, "resubmitted")
    return b.build()


class PastPivot(InvalidTransition):
    """The pivot may have taken effect: its effect stays, so the order goes forward."""

    code = "past-pivot"


def cancel(
    process: OrderProcess,
    workflow: Workflow,
    policy: ProcessPolicy,
    now: datetime,
    operator: str = "operator",
    reason: str | None = None,
    cause: str | None = None,
) -> Transition | None:
    """An operator stops the order: nothing new is dispatched, every step that may have
    taken effect is undone in reverse order, and the order ends Cancelled.

    A step still running keeps its attempt, so its answer is taken (or its complete-by
    passes) before it is undone too. None: the order is already being cancelled.
    """
    state = process.state
    if state.process_state.is_final:
        raise InvalidTransition(
            f"order {process.order_id} is {state.process_state.value}: nothing to cancel"
        )
    if state.cancel_requested and not state.process_state.is_at_rest:
        return None
    if past_pivot(process.steps, workflow):
        pivot = workflow.steps[workflow.pivot or 0].name
        raise PastPivot(
            f"order {process.order_id} is past its pivot step {pivot}: what it did stays, "
            "so the order can no longer be cancelled"
        )
    b = Builder(process, now, cause)
    b.set(cancel_requested=True, phase=Phase.COMPENSATE, failure_count=0)
    moved = rekey_refused(b, workflow)
    said = f"by {operator}" + (f": {reason}" if reason else "")
    b.note("cancel-requested", said + (f"; {moved}" if moved else ""))
    _continue_cancel(b, process, policy, workflow)
    return b.build()


def suspend(
    process: OrderProcess,
    now: datetime,
    operator: str = "operator",
    cause: str | None = None,
) -> Transition | None:
    """An operator pauses the order: no further step is dispatched and no complete-by counts.

    A running step may still answer; its answer is recorded. An Error order is already
    held, so it is refused like a final one. None: already Suspended.
    """
    current = process.state.process_state
    if current is ProcessState.SUSPENDED:
        return None
    if current.is_at_rest:
        raise InvalidTransition(f"order {process.order_id} is {current.value}: cannot suspend")
    b = Builder(process, now, cause)
    b.set(process_state=ProcessState.SUSPENDED, locked_by=None, complete_by=None)
    b.note("suspended", f"by {operator}, was {current.value}")
    b.notify(NotificationStatus.SUSPENDED)
    return b.build()


def resume(
    process: OrderProcess,
    policy: ProcessPolicy,
    now: datetime,
    operator: str = "operator",
    cause: str | None = None,
) -> Transition:
    """A Suspended order continues where it stopped, with fresh deadlines.

    A step that had not answered is dispatched again (same idempotency key, the next
    claim's attempt number), as after a recovery; FailureCount is what it was.
    """
    if process.state.process_state is not ProcessState.SUSPENDED:
        raise InvalidTransition(
            f"order {process.order_id} is {process.state.process_state.value}, not Suspended"
        )
    b = Builder(process, now, cause)
    b.note("resumed", f"by {operator}")
    b.notify(NotificationStatus.RESUMED)
    if process.state.cancel_requested:
        _continue_cancel(b, process, policy)
        return b.build()
    index = process.state.current_step
    if index < len(b.steps) and b.steps[index].status is StepStatus.RUNNING:
        b.set_step(index, status=StepStatus.NOT_STARTED, complete_by=None)
    elif index < len(b.steps):
        b.set_step(index, complete_by=None)
    requeue(b, policy, 0, "resumed")
    return b.build()


def _continue_cancel(
    b: Builder, process: OrderProcess, policy: ProcessPolicy, workflow: Workflow | None = None
) -> None:
    """Wait for what is in flight (a step or a compensation whose complete-by has not
    passed), else go back to the Scheduler, which undoes from the current step down and
    waits there for any step whose request is still live."""
    state = process.state
    index = state.current_step
    step = process.steps[index] if index < len(process.steps) else None
    waiting = workflow is not None and index < len(workflow.steps) and workflow.steps[index].waits
    live = step is not None and step.complete_by is not None and step.complete_by > b.now
    live = live and not waiting  # a wait has nothing in flight: cancel ends it at once
    # A Compensating order's current step is the one whose compensation is out.
    in_flight = live and (
        (step is not None and step.status is StepStatus.RUNNING)
        or state.process_state is ProcessState.COMPENSATING
    )
    if in_flight and step is not None:
        b.set(process_state=ProcessState.COMPENSATING, complete_by=step.complete_by)
        b.note("cancelling", f"waiting for {step.name} until {iso(step.complete_by or b.now)}")
        return
    if step is not None and step.status is StepStatus.RUNNING:
        b.set_step(index, status=StepStatus.NOT_STARTED, complete_by=None)
    elif step is not None:
        b.set_step(index, complete_by=None)
    requeue(b, policy, 0, "cancelling")
