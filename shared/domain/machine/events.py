"""Events sent to an order from outside (docs/catalogue.md): kept, never dropped.

An event is stored with the order whatever step the order is at; a step waiting for it
takes it at once, a step reached later takes it then (dispatch.py `start_wait`), and a
Suspended order keeps it until it resumes. Its id makes a repeat change nothing.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Final

from shared.domain.machine.dispatch import pending_event
from shared.domain.machine.transition import Builder, InvalidTransition, ProcessPolicy, Transition
from shared.domain.machine.waits import consume_event, waiting_step
from shared.domain.model import JsonObject, OrderProcess, ProcessState, ReceivedEvent, StepStatus
from shared.domain.routing import PRIMARY_ONLY, Routing
from shared.domain.workflow import Workflow

MAX_EVENTS: Final = 50
"""Events kept per order: they live in the order's entity, which Table Storage caps."""


class NotAwaited(ValueError):
    """The order's workflow never waits for an event of this name."""


class InvalidEventData(ValueError):
    """An approval's data must say `approved: true|false`, with `by` and `comment` text."""


class TooManyEvents(InvalidTransition):
    """The order already keeps MAX_EVENTS events."""


class NotAnApproval(NotAwaited):
    """The operator named an event no approval step of the order's workflow waits for."""


class NoApprovalWaiting(InvalidTransition):
    """The operator named no event, and the order is not at an approval step."""


def receive_event(
    process: OrderProcess,
    workflow: Workflow,
    policy: ProcessPolicy,
    event_id: str,
    name: str,
    data: JsonObject | None,
    now: datetime,
    cause: str | None = None,
    routing: Routing = PRIMARY_ONLY,
) -> Transition | None:
    """None: an event with this id is already kept (a repeat: no second effect)."""
    state = process.state
    if any(e.event_id == event_id for e in state.events):
        return None
    _not_final(process)
    if name not in workflow.events:
        waited = ", ".join(sorted(workflow.events)) or "none"
        raise NotAwaited(
            f"workflow {workflow.name} v{workflow.version} never waits for event {name!r} "
            f"(its events: {waited})"
        )
    approval = any(s.approval for s in workflow.steps if s.event == name)
    if approval and not _is_approval(data or {}):
        raise InvalidEventData(
            f"event {name!r} is an approval: its data is "
            '{"approved": true|false, "by"?: string, "comment"?: string}'
        )
    if len(state.events) >= MAX_EVENTS:
        raise TooManyEvents(f"order {process.order_id} already keeps {MAX_EVENTS} events")
    event = ReceivedEvent(event_id, name, now, data)
    b = Builder(process, now, cause, routing)
    b.set(events=(*state.events, event))
    b.note("event-received", f"{name} ({event_id})")
    index = waiting_step(process, workflow)
    if index is not None and workflow.steps[index].event == name:
        # The first kept event of this name, which may be one received earlier whose
        # nudge is still on its way: each wait takes the first, never a later one.
        first = pending_event(b.state.events, workflow.steps[index]) or event
        consume_event(b, workflow, policy, index, first)
    return b.build()


def answer_approval(
    process: OrderProcess,
    workflow: Workflow,
    policy: ProcessPolicy,
    event_id: str,
    event: str | None,
    approved: bool,
    by: str,
    comment: str | None,
    now: datetime,
    cause: str | None = None,
    routing: Routing = PRIMARY_ONLY,
) -> Transition | None:
    """An operator answers an approval: the same event a signed client would send, its
    data `{"approved", "by", "comment"?}` with `by` the operator, so it is kept, taken
    and repeated exactly as one (`receive_event`). `event`: the approval to answer;
    None: the one the order is at now. Only approvals: an operator's key does not stand
    in for the outside system that sends the workflow's other events."""
    if any(e.event_id == event_id for e in process.state.events):
        return None
    _not_final(process)
    name = approval_event(process, workflow, event)
    data: dict[str, Any] = {"approved": approved, "by": by}
    if comment:
        data["comment"] = comment
    return receive_event(process, workflow, policy, event_id, name, data, now, cause, routing)


def approval_event(process: OrderProcess, workflow: Workflow, event: str | None) -> str:
    """The approval event an operator answers: `event` when an approval step waits for
    it, else the event of the approval step the order is at (running, while Processing
    or Suspended)."""
    if event is not None:
        if not any(s.approval and s.event == event for s in workflow.steps):
            approvals = sorted({s.event for s in workflow.steps if s.approval and s.event})
            raise NotAnApproval(
                f"workflow {workflow.name} v{workflow.version} has no approval {event!r} "
                f"(its approvals: {', '.join(approvals) or 'none'})"
            )
        return event
    state = process.state
    index = state.current_step
    at_rest = state.process_state not in (ProcessState.PROCESSING, ProcessState.SUSPENDED)
    if at_rest or index >= min(len(workflow.steps), len(process.steps)):
        raise NoApprovalWaiting(f"order {process.order_id} is not waiting for an approval")
    definition = workflow.steps[index]
    running = process.steps[index].status is StepStatus.RUNNING
    if not (definition.approval and definition.event and running):
        raise NoApprovalWaiting(
            f"order {process.order_id} is at {definition.name}, not waiting for an approval"
        )
    return definition.event


def _not_final(process: OrderProcess) -> None:
    state = process.state
    if state.process_state.is_final:
        raise InvalidTransition(
            f"order {process.order_id} is {state.process_state.value}: it waits for nothing"
        )


def _is_approval(data: JsonObject) -> bool:
    """`by` and `comment` are text when given (null is not given): the approver is shown
    on the order and the comment becomes a rejection's error, and an object or a number
    kept there was echoed back to every reader as if it were a name."""
    texts = (data.get("by"), data.get("comment"))
    return isinstance(data.get("approved"), bool) and all(
        t is None or isinstance(t, str) for t in texts
    )
