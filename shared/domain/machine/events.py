"""Events sent to an order from outside (DESIGN section 13): kept, never dropped.

An event is stored with the order whatever step the order is at; a step waiting for it
takes it at once, a step reached later takes it then (dispatch.py `start_wait`), and a
Suspended order keeps it until it resumes. Its id makes a repeat change nothing.
"""

from __future__ import annotations

from datetime import datetime
from typing import Final

from shared.domain.machine.transition import Builder, InvalidTransition, ProcessPolicy, Transition
from shared.domain.machine.waits import consume_event, waiting_step
from shared.domain.model import JsonObject, OrderProcess, ReceivedEvent
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
    if state.process_state.is_final:
        raise InvalidTransition(
            f"order {process.order_id} is {state.process_state.value}: it waits for nothing"
        )
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
        consume_event(b, workflow, policy, index, event)
    return b.build()


def _is_approval(data: JsonObject) -> bool:
    """`by` and `comment` are text when given (null is not given): the approver is shown
    on the order and the comment becomes a rejection's error, and an object or a number
    kept there was echoed back to every reader as if it were a name."""
    texts = (data.get("by"), data.get("comment"))
    return isinstance(data.get("approved"), bool) and all(
        t is None or isinstance(t, str) for t in texts
    )
