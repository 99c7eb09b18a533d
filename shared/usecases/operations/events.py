"""Sending an event to an order: stored with it at once, taken by the step that waits.

The answer comes once the event is stored (an early event is kept for its step); the
step it completes moves on in the same write (machine/events.py).
"""

from __future__ import annotations

from shared.domain.machine import events
from shared.domain.machine.transition import Transition
from shared.domain.model import JsonObject, OrderProcess, ReceivedEvent
from shared.usecases.flow.deps import ProcessDeps
from shared.usecases.limits.budget import Budget
from shared.usecases.operations.operator import operate


def event_cause(event_id: str) -> str:
    return f"event:{event_id}"


async def send_event(
    deps: ProcessDeps,
    order_id: str,
    name: str,
    event_id: str,
    data: JsonObject | None,
    *,
    budget: Budget | None = None,
) -> OrderProcess:
    """Raises OrderNotFound, InvalidTransition (a final order, too many events),
    NotAwaited and InvalidEventData; the same `event_id` again changes nothing."""
    cause = event_cause(event_id)
    routing = await deps.current_routing()

    def decide(process: OrderProcess) -> Transition | None:
        return events.receive_event(
            process,
            deps.workflow(process),
            deps.policy,
            event_id,
            name,
            data,
            deps.clock.now(),
            cause,
            routing,
        )

    return await operate(deps, order_id, cause, decide, budget)


async def answer_approval(
    deps: ProcessDeps,
    order_id: str,
    event_id: str,
    approved: bool,
    operator: str,
    comment: str | None = None,
    event: str | None = None,
    *,
    budget: Budget | None = None,
) -> ReceivedEvent:
    """An operator's answer to an approval, recorded as the event a signed client would
    send, `by` the operator (the page cannot hold the signing secret; the operator's
    key and name stand in for it). Returns the event as kept: a repeat of `event_id`
    returns the first. Raises as `send_event`, and NoApprovalWaiting when `event` is
    None and the order is not at an approval, NotAnApproval for an event no approval
    step waits for."""
    cause = event_cause(event_id)
    routing = await deps.current_routing()

    def decide(process: OrderProcess) -> Transition | None:
        return events.answer_approval(
            process,
            deps.workflow(process),
            deps.policy,
            event_id,
            event,
            approved,
            operator,
            comment,
            deps.clock.now(),
            cause,
            routing,
        )

    stored = await operate(deps, order_id, cause, decide, budget)
    return next(e for e in stored.state.events if e.event_id == event_id)
