"""Sending an event to an order: stored with it at once, taken by the step that waits.

The answer comes once the event is stored (an early event is kept for its step); the
step it completes moves on in the same write (machine/events.py).
"""

from __future__ import annotations

from shared.domain import process as machine
from shared.domain.model import JsonObject, OrderProcess
from shared.usecases.budget import Budget
from shared.usecases.deps import ProcessDeps
from shared.usecases.operator import operate


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

    def decide(process: OrderProcess) -> machine.Transition | None:
        return machine.receive_event(
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
