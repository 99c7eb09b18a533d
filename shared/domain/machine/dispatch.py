"""The moves every rule ends with: dispatch the next step forward, undo the next step
back, wait for a step to settle or for a drained agent, requeue, hold for an operator."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta

from shared.domain.machine.settle import Undo, open_candidates, pinned, undo_of
from shared.domain.machine.transition import Builder, ProcessPolicy
from shared.domain.messages import AgentRequest, Nudge, do_key, idempotency_key, iso, undo_key
from shared.domain.model import (
    Action,
    JsonObject,
    KeyState,
    NotificationStatus,
    Order,
    OrderProcess,
    Outgoing,
    Priority,
    ProcessState,
    ReceivedEvent,
    StepRecord,
    StepStatus,
)
from shared.domain.routing import Routing
from shared.domain.workflow import StepDefinition, StepKind, Workflow

DRAIN_RECHECK = timedelta(seconds=10)
"""How often an order waiting for a drained agent looks again (at most)."""


def requeue(b: Builder, policy: ProcessPolicy, failures: int, reason: str) -> None:
    delay = policy.backoff(failures) if failures else timedelta(0)
    deliver_at = b.now + delay
    b.set(
        process_state=ProcessState.PENDING,
        locked_by=None,
        complete_by=deliver_at + policy.pending_timeout,
    )
    b.note(reason, f"nudge at {iso(deliver_at)}")
    b.send(
        Nudge(b.order.order_id, reason).outgoing(
            b.state.version, high=b.high, deliver_at=deliver_at if delay else None
        )
    )


def hold_for_operator(b: Builder, reason: str) -> None:
    b.set(process_state=ProcessState.ERROR, locked_by=None, complete_by=None)
    b.note("error", reason)
    b.alert(reason)


def drained_step(
    steps: Sequence[StepRecord], workflow: Workflow, routing: Routing, from_step: int
) -> int | None:
    """The next forward step, when every agent that may take it is drained.

    A retry that must stay with the agent that has its key waits for that agent alone;
    one whose key is settled not applied there may go to any open candidate.
    """
    index = from_step
    while index < len(steps) and steps[index].status is StepStatus.COMPLETED:
        index += 1
    if index >= len(workflow.steps):
        return None
    step, definition = steps[index], workflow.steps[index]
    stay = pinned(step, definition) if step.status is StepStatus.NOT_STARTED else None
    candidates = (stay,) if stay is not None else open_candidates(step, definition)
    return index if routing.all_drained(candidates) else None


def wait_for_drained(b: Builder, policy: ProcessPolicy, index: int) -> None:
    """Pending again, FailureCount unchanged, with a nudge to look later. Each look moves
    the Pending complete-by on, so the Supervisor counts nothing while the agent is drained.
    Only the first look of a wait is noted: a long drain must not grow the history."""
    recheck = min(DRAIN_RECHECK, policy.pending_timeout / 2)
    deliver_at = b.now + recheck
    b.set(
        process_state=ProcessState.PENDING,
        locked_by=None,
        current_step=index,
        complete_by=deliver_at + policy.pending_timeout,
    )
    if not any(m.body.get("reason") == "waiting" for m in b.state.outbox):
        every = f"{recheck.total_seconds():g} s"
        step = b.steps[index].name
        b.note("waiting", f"{step}: its agents are drained; looking again every {every}")
    b.send(
        Nudge(b.order.order_id, "waiting").outgoing(
            b.state.version, high=b.high, deliver_at=deliver_at
        )
    )


def dispatch_forward(b: Builder, workflow: Workflow, policy: ProcessPolicy, from_step: int) -> None:
    index = from_step
    while index < len(b.steps) and b.steps[index].status is StepStatus.COMPLETED:
        index += 1
    if index >= len(workflow.steps):
        b.set(
            process_state=ProcessState.PROCESSED,
            current_step=len(workflow.steps),
            locked_by=None,
            complete_by=None,
        )
        b.note("processed")
        b.notify(NotificationStatus.PROCESSED)
        return
    if drained_step(b.steps, workflow, b.routing, index) is not None:
        wait_for_drained(b, policy, index)
        return
    step, definition = b.steps[index], workflow.steps[index]
    if definition.waits:
        start_wait(b, policy, index, definition)
        return
    if not open_candidates(step, definition):
        b.set(current_step=index, last_error=f"{step.name}: abandoned at every provider")
        hold_for_operator(b, "no-provider-left")
        return
    payload = order_payload(b.order)
    if definition.inputs:
        payload = {**payload, "inputs": step_inputs(b.steps, workflow, definition)}
    _dispatch(b, workflow, policy, index, Action.DO, payload)
    b.set_step(index, status=StepStatus.RUNNING, attempts=step.attempts + 1)


def start_wait(b: Builder, policy: ProcessPolicy, index: int, definition: StepDefinition) -> None:
    """An event or timer step: no agent, no request. The step runs until its complete-by,
    which the Supervisor's watch list holds, so waiting costs nothing per order. A timer
    also sends its own wake-up, a nudge scheduled for its time; an event already received
    is taken at once, through a nudge (machine/waits.py `wake`), with the Supervisor
    looking again after the pending timeout should that nudge be lost."""
    step = b.steps[index]
    until = wait_until(b.order, definition, b.now)
    complete_by = until if until is not None else b.now + policy.wait_timeout(definition)
    b.set_step(
        index,
        status=StepStatus.RUNNING,
        attempts=step.attempts + 1,
        complete_by=complete_by,
        dispatched_at=b.now,
        error=None,
    )
    b.set(current_step=index, complete_by=complete_by)
    what = f"event {definition.event}" if definition.event else "its time"
    b.note("waiting", f"{definition.name}: for {what} until {iso(complete_by)}")
    if until is not None:
        nudge = Nudge(b.order.order_id, "timer")
        b.send(nudge.outgoing(b.state.version, high=b.high, deliver_at=until))
    elif pending_event(b.state.events, definition) is not None:
        b.send(Nudge(b.order.order_id, "event").outgoing(b.state.version, high=b.high))
        # The Supervisor is that nudge's backstop (it may be lost, or dead-lettered while
        # the store is down): it looks again after the pending timeout, not at the
        # wait's complete-by, and takes the event then (recovery.py `_wait_passed`).
        b.set(complete_by=min(complete_by, b.now + policy.pending_timeout))


def wait_until(order: Order, definition: StepDefinition, now: datetime) -> datetime | None:
    """A timer's time: the order's `notBefore` (not earlier than now), else now plus its
    duration; None for an event step."""
    if definition.kind is not StepKind.TIMER:
        return None
    if definition.until == "notBefore" and order.not_before is not None:
        return max(order.not_before, now)
    return now + timedelta(seconds=definition.wait_seconds or 0)


def pending_event(
    events: Sequence[ReceivedEvent], definition: StepDefinition
) -> ReceivedEvent | None:
    """The first received event this step waits for that no step took yet."""
    return next((e for e in events if e.name == definition.event and e.consumed_by is None), None)


def dispatch_compensation(
    b: Builder, workflow: Workflow, policy: ProcessPolicy, from_step: int
) -> None:
    """Undo the steps that may have taken effect, in reverse order, one complete-by-bound
    agent step at a time; a step whose request is still live is waited for first."""
    index = min(from_step, len(b.steps) - 1)
    while index >= 0:
        verdict = undo_of(b.steps[index], workflow.steps[index], b.now)
        if verdict is Undo.SEND:
            step = b.steps[index]
            payload = {"result": dict(step.result or {})}
            _dispatch(b, workflow, policy, index, Action.COMPENSATE, payload)
            b.set_step(index, compensation_attempts=step.compensation_attempts + 1)
            return
        if verdict is Undo.WAIT:
            wait_to_settle(b, index)
            return
        index -= 1
    cancelled = b.state.cancel_requested
    b.set(
        process_state=ProcessState.CANCELLED if cancelled else ProcessState.COMPENSATED,
        current_step=0,
        locked_by=None,
        complete_by=None,
    )
    b.note("cancelled" if cancelled else "compensated")
    b.notify(NotificationStatus.CANCELLED if cancelled else NotificationStatus.COMPENSATED)


def wait_to_settle(b: Builder, index: int) -> None:
    """Send nothing while the step's request may still apply: the Supervisor looks at
    the order when its call's complete-by or its live time passes, and settles the key
    by abandoning it there or asking (machine/recovery.py). A reply settles it sooner."""
    step = b.steps[index]
    running = step.status is StepStatus.RUNNING and step.complete_by is not None
    until = step.complete_by if running else step.live_until
    until = until if until is not None and until > b.now else b.now
    b.set(
        process_state=ProcessState.COMPENSATING,
        current_step=index,
        locked_by=None,
        complete_by=until,
    )
    b.note("waiting-to-settle", f"{step.name}: its request may still apply until {iso(until)}")
    b.check_at = until


def _dispatch(
    b: Builder,
    workflow: Workflow,
    policy: ProcessPolicy,
    index: int,
    action: Action,
    payload: JsonObject,
) -> None:
    """Give step `index` its complete-by (step and order alike) and ask its agent.

    A step goes to the healthiest of the agents it may go to; a retry whose key may still
    apply stays where the key is; an undo goes to the agent that did the step.
    High-priority orders use the agents' high-priority lanes and a tighter complete-by.
    """
    definition = workflow.steps[index]
    step = b.steps[index]
    compensate = action is Action.COMPENSATE
    operation = (definition.compensation if compensate else definition.name) or ""
    stay = pinned(step, definition)
    if compensate:
        agent, why = step.agent or definition.agent, ""
    elif stay is not None:
        agent, why = stay, ""
    else:
        candidates = open_candidates(step, definition)
        avoid = step.suspect or (step.agent if step.attempts > 0 else None)
        agent, why = b.routing.choose(candidates, avoid=avoid)
        if step.suspect:
            timed_out = f"{step.suspect}: its attempt timed out"
            why = why.replace(timed_out, f"{timed_out} and its key is settled not applied")
    complete_by = b.now + policy.timeout(definition, b.order.priority)
    done_key = do_key(b.order.order_id, definition.name, step)
    changes: dict[str, object] = {
        "complete_by": complete_by,
        "agent": agent,
        "suspect": None,
        "dispatched_at": b.now,
        "step_heartbeats": 0,
    }
    if not compensate:
        live_until = complete_by + policy.clock_skew
        if step.live_until is not None and step.key_state is KeyState.UNSETTLED:
            live_until = max(live_until, step.live_until)
        changes.update(
            key_state=KeyState.UNSETTLED,
            live_until=live_until,
            tried=step.tried if agent in step.tried else (*step.tried, agent),
        )
    b.set_step(index, **changes)
    b.set(current_step=index, complete_by=complete_by)
    b.note(
        "compensation-dispatched" if compensate else "step-dispatched",
        f"{operation} to {_agent_label(agent, b.high)}" + (f" (instead of {why})" if why else ""),
    )
    request = AgentRequest(
        order_id=b.order.order_id,
        step=definition.name,
        action=action,
        attempt=b.state.attempt,
        complete_by=complete_by,
        idempotency_key=undo_key(b.order.order_id, operation, step) if compensate else done_key,
        payload=payload,
        undoes=done_key if compensate else None,
        operation=operation,
    )
    b.send(request.outgoing(agent, high=b.high))


HEAL = "heal"
"""The last segment of a heal key (`heal_key`)."""


def heal_key(undo_key: str) -> str:
    """The key for undoing an effect whose order's undo key is spent: it found nothing to
    undo, the do applied after it, and the provider answers any repeat of that key from
    its record. One per order and undo (never per run or sender), so the Scheduler's heal
    on the late success, a reconciliation run's, or another instance's resend is
    answered from its record and the effect is undone once."""
    return f"{undo_key}:{HEAL}"


def round_heal_key(order_id: str, compensation: str, do_round: int) -> str:
    """The key for undoing an effect of an earlier round of a step's do key (a request
    of that round that applied after the order moved the key on: docs/in-doubt.md, "An
    operation refused for good"): `{orderId}:{undo}:heal-r1` for the first key,
    `heal-r2` for `...:r2`. One per order, undo and round, never the order's own undo
    key (a provider the order still holds the step at answers that key for the current
    round) nor the heal key (`heal_key`, the current round's), so the Scheduler's undo
    and every reconciliation run's resend are one request, undoing the effect once."""
    return f"{idempotency_key(order_id, compensation)}:{HEAL}-r{do_round + 1}"


def undo_at(
    process: OrderProcess,
    definition: StepDefinition,
    policy: ProcessPolicy,
    agent: str,
    attempt: int,
    result: JsonObject | None,
    now: datetime,
    key: str | None = None,
    do_round: int | None = None,
) -> Outgoing:
    """The undo of a step's effect found in force where the order says none should be (a
    late success at a provider the order left, or reconciliation finding it), sent
    outside any compensation the order runs. Like every undo it names the do key it
    undoes, so the provider applies it only against that do applied there; `result` is
    that provider's own, which is what its undo needs. The step must have a compensation.
    `key` is the step's undo key unless given: the heal key where that key is spent (it
    found nothing to undo before the do applied: `heal_key`). `do_round` names an earlier
    round's do key as the one undone, under that round's key (`round_heal_key`)."""
    assert definition.compensation is not None
    step = next(s for s in process.steps if s.name == definition.name)
    if do_round is not None and do_round != step.do_round:
        key = key or round_heal_key(process.order_id, definition.compensation, do_round)
        step = replace(step, do_round=do_round)
    request = AgentRequest(
        order_id=process.order_id,
        step=definition.name,
        action=Action.COMPENSATE,
        attempt=attempt,
        complete_by=now + policy.timeout(definition, process.order.priority),
        idempotency_key=key or undo_key(process.order_id, definition.compensation, step),
        payload={"result": dict(result or {})},
        undoes=do_key(process.order_id, definition.name, step),
        operation=definition.compensation,
    )
    return request.outgoing(agent, high=process.order.priority is Priority.HIGH)


def step_inputs(
    steps: Sequence[StepRecord], workflow: Workflow, definition: StepDefinition
) -> JsonObject:
    """The declared results of earlier steps, keyed as declared (`create-shipment.trackingId`);
    a result the earlier step did not return is null, for the agent to refuse or default."""
    inputs: dict[str, object] = {}
    for source in definition.inputs:
        name, _, field = source.partition(".")
        index = workflow.index_of(name)
        result = steps[index].result if index is not None and index < len(steps) else None
        inputs[source] = (result or {}).get(field)
    return inputs


def order_payload(order: Order) -> JsonObject:
    return {
        "customerId": order.customer_id,
        "priority": order.priority.value,
        "items": [
            {"sku": line.sku, "quantity": line.quantity, "unitPrice": line.unit_price}
            for line in order.items
        ],
    }


def _agent_label(agent: str, high: bool) -> str:
    """How the history names where a request went: `agent-{name}`, `-high` on the fast
    lane, the words its queue is named by too (docs/routing.md), so an operator reading
    the history finds the queue (tests/unit/test_queues.py keeps the two the same)."""
    return f"agent-{agent}-high" if high else f"agent-{agent}"
