"""Steps that wait for the world (an approval, an external event, a time): what ends a
wait takes the same path as an agent's answer (`take_answer`), so a rejected approval
or a fired timer settles, compensates and holds by the same rules as any step."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from shared.domain.machine.dispatch import pending_event
from shared.domain.machine.forward import take_answer
from shared.domain.machine.transition import Builder, ProcessPolicy, Transition
from shared.domain.messages import AgentReply, iso
from shared.domain.model import (
    Action,
    ErrorInfo,
    JsonObject,
    OrderProcess,
    Outcome,
    ProcessState,
    ReceivedEvent,
    StepStatus,
)
from shared.domain.routing import PRIMARY_ONLY, Routing
from shared.domain.workflow import StepKind, Workflow


def wake(
    process: OrderProcess,
    workflow: Workflow,
    policy: ProcessPolicy,
    now: datetime,
    cause: str | None = None,
    routing: Routing = PRIMARY_ONLY,
) -> Transition | None:
    """A waiting step's moment (a nudge `timer` or `event`): a timer whose time has
    come fires, an event already received is taken; anything else changes nothing."""
    index = waiting_step(process, workflow)
    if index is None:
        return None
    definition, step = workflow.steps[index], process.steps[index]
    b = Builder(process, now, cause, routing)
    if definition.kind is StepKind.TIMER:
        if step.complete_by is None or now < step.complete_by:
            return None
        fire_timer(b, workflow, policy, index)
        return b.build()
    event = pending_event(process.state.events, definition)
    if event is None:
        return None
    consume_event(b, workflow, policy, index, event)
    return b.build()


def waiting_step(process: OrderProcess, workflow: Workflow) -> int | None:
    """The index of the wait the order is in, if it is in one and may move on from it
    (Processing: a Suspended order keeps its events until it resumes)."""
    state = process.state
    index = state.current_step
    if state.process_state is not ProcessState.PROCESSING or index >= len(workflow.steps):
        return None
    if not workflow.steps[index].waits or process.steps[index].status is not StepStatus.RUNNING:
        return None
    return index


def fire_timer(b: Builder, workflow: Workflow, policy: ProcessPolicy, index: int) -> None:
    step = b.steps[index]
    b.note("timer-fired", step.name)
    take_answer(b, workflow, policy, wait_answer(b, step.name, {"firedAt": iso(b.now)}), index)


def consume_event(
    b: Builder, workflow: Workflow, policy: ProcessPolicy, index: int, event: ReceivedEvent
) -> None:
    """The step takes the event: an approval's `approved: false` fails it (a permanent
    failure: compensation, or held past the pivot); any other event completes it with
    the event's data as its result."""
    definition = workflow.steps[index]
    b.set(
        events=tuple(
            replace(e, consumed_by=definition.name) if e.event_id == event.event_id else e
            for e in b.state.events
        )
    )
    b.note("event-consumed", f"{definition.name}: {event.name} ({event.event_id})")
    data = dict(event.data or {})
    if definition.approval and data.get("approved") is not True:
        who = f" by {data['by']}" if isinstance(data.get("by"), str) else ""
        comment = data.get("comment") if isinstance(data.get("comment"), str) else "no reason"
        rejected = ErrorInfo("rejected", f"rejected{who}: {comment}")
        take_answer(b, workflow, policy, wait_answer(b, definition.name, None, rejected), index)
        return
    take_answer(b, workflow, policy, wait_answer(b, definition.name, data), index)


def wait_answer(
    b: Builder, step: str, result: JsonObject | None, error: ErrorInfo | None = None
) -> AgentReply:
    """What ends a wait, in the form every step's answer takes."""
    return AgentReply(
        order_id=b.order.order_id,
        step=step,
        action=Action.DO,
        attempt=b.state.attempt,
        outcome=Outcome.FAILED if error is not None else Outcome.SUCCEEDED,
        result=result if error is None else None,
        error=error,
    )
