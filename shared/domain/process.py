"""The order process state machine: pure functions from (process, event, now) to a Transition.

Every function either returns the next process plus the messages to send and the history
to append, or None when the event is stale or does not apply: a lost race, a late reply
from an older attempt, a duplicate. None is normal control flow, never an error.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from shared.domain.in_doubt import RemoteOutcome, RemoteOutcomeKind
from shared.domain.messages import (
    AgentReply,
    AgentRequest,
    Nudge,
    OperatorAlert,
    StatusNotification,
    idempotency_key,
    iso,
)
from shared.domain.model import (
    Action,
    ErrorInfo,
    ExhaustedPolicy,
    HistoryEntry,
    JsonObject,
    NotificationStatus,
    Order,
    OrderProcess,
    Outcome,
    Outgoing,
    Phase,
    Priority,
    ProcessState,
    StateRecord,
    StepRecord,
    StepStatus,
)
from shared.domain.routing import PRIMARY_ONLY, Routing
from shared.domain.workflow import AGENTS, WORKFLOWS, AgentName, StepDefinition, Workflow


class InvalidTransition(Exception):
    """The operator asked for a move the order's state does not allow."""


@dataclass(frozen=True)
class ProcessPolicy:
    step_timeout: timedelta
    pending_timeout: timedelta
    """How long an order may sit Pending before the Supervisor nudges it again."""
    max_failure_count: int
    exhausted_policy: ExhaustedPolicy = ExhaustedPolicy.HOLD
    backoff_base: timedelta = timedelta(seconds=1)
    backoff_cap: timedelta = timedelta(seconds=60)
    high_priority_step_timeout: timedelta | None = None
    """A tighter complete-by for high-priority orders; None: the same as the others."""
    step_heartbeat: timedelta = timedelta(seconds=10)
    """How far one step heartbeat moves a running step's complete-by (from the beat)."""
    step_max: timedelta | None = None
    """How long from its dispatch step heartbeats may keep a step running; None: no step
    runs past the complete-by it was dispatched with (step heartbeats are off)."""

    def timeout(self, definition: StepDefinition, priority: Priority) -> timedelta:
        base = (
            timedelta(seconds=definition.timeout_seconds)
            if definition.timeout_seconds is not None
            else self.step_timeout
        )
        if priority is Priority.HIGH and self.high_priority_step_timeout is not None:
            return min(base, self.high_priority_step_timeout)
        return base

    def backoff(self, failure_count: int) -> timedelta:
        exponent = max(failure_count - 1, 0)
        delay: timedelta = self.backoff_base * (2**exponent)
        return min(delay, self.backoff_cap)


@dataclass(frozen=True)
class Transition:
    process: OrderProcess
    outgoing: tuple[Outgoing, ...]
    history: tuple[HistoryEntry, ...]

    @property
    def is_terminal(self) -> bool:
        return self.process.state.process_state.is_terminal


class _Builder:
    """Accumulates one transition's changes so each rule reads as a few lines."""

    def __init__(
        self,
        process: OrderProcess,
        now: datetime,
        cause: str | None,
        routing: Routing = PRIMARY_ONLY,
    ) -> None:
        self.routing = routing
        self.order: Order = process.order
        self.state: StateRecord = replace(
            process.state, version=process.state.version + 1, updated_at=now
        )
        self.steps: list[StepRecord] = list(process.steps)
        self.etag = process.etag
        self.now = now
        self.cause = cause
        self.outgoing: list[Outgoing] = []
        self.history: list[HistoryEntry] = []

    def set(self, **changes: object) -> None:
        self.state = replace(self.state, **changes)  # type: ignore[arg-type]

    def set_step(self, index: int, **changes: object) -> None:
        self.steps[index] = replace(self.steps[index], **changes)  # type: ignore[arg-type]

    def note(self, event: str, detail: str = "") -> None:
        self.history.append(
            HistoryEntry(
                at=self.now,
                event=event,
                detail=detail,
                process_state=self.state.process_state,
                failure_count=self.state.failure_count,
                attempt=self.state.attempt,
            )
        )

    def send(self, message: Outgoing) -> None:
        self.outgoing.append(message)

    def notify(self, status: NotificationStatus, detail: str | None = None) -> None:
        notification = StatusNotification(self.order.order_id, status, self.now, detail or None)
        self.send(notification.outgoing(self.state.version, self.order.reply_to))

    def alert(self, reason: str) -> None:
        alert = OperatorAlert(
            order_id=self.order.order_id,
            reason=reason,
            failure_count=self.state.failure_count,
            last_error=self.state.last_error,
            at=self.now,
        )
        self.send(alert.outgoing(self.state.version))

    def build(self) -> Transition:
        outgoing = tuple(self.outgoing)
        state = replace(self.state, outbox=outgoing, outbox_cause=self.cause)
        process = OrderProcess(self.order, state, tuple(self.steps), self.etag)
        return Transition(process, outgoing, tuple(self.history))


def start(order: Order, workflow: Workflow, now: datetime, cause: str | None = None) -> Transition:
    """The submission: order stored Pending, every step NotStarted, the Scheduler nudged."""
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
    )
    steps = tuple(StepRecord(name=s.name) for s in workflow.steps)
    b = _Builder(OrderProcess(order, state, steps), now, cause)
    b.note("submitted", f"{len(order.items)} item(s), priority {order.priority.value}")
    high = order.priority is Priority.HIGH
    b.send(Nudge(order.order_id, "submitted").outgoing(b.state.version, high=high))
    b.notify(NotificationStatus.RECEIVED)
    return b.build()


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

    The agent request goes out before the client's Processing notification: it is on the
    order's critical path, the notification is not.
    """
    if process.state.process_state is not ProcessState.PENDING:
        return None
    if process.state.phase is Phase.FORWARD:
        blocked = _drained_step(process.steps, workflow, routing, process.state.current_step)
        if blocked is not None:
            b = _Builder(process, now, cause, routing)
            _wait_for_drained(b, policy, blocked)
            return b.build()
    b = _Builder(process, now, cause, routing)
    forward = process.state.phase is Phase.FORWARD
    b.set(
        locked_by=instance_id,
        attempt=process.state.attempt + 1,
        process_state=ProcessState.PROCESSING if forward else ProcessState.COMPENSATING,
    )
    b.note("claimed", f"by {instance_id}, attempt {b.state.attempt}")
    if forward:
        _dispatch_forward(b, workflow, policy, process.state.current_step)
        if b.state.attempt == 1 and b.state.process_state is ProcessState.PROCESSING:
            b.notify(NotificationStatus.PROCESSING)
    else:
        _dispatch_compensation(b, workflow, policy, process.state.current_step)
    return b.build()


def apply_reply(
    process: OrderProcess,
    workflow: Workflow,
    policy: ProcessPolicy,
    reply: AgentReply,
    now: datetime,
    cause: str | None = None,
    routing: Routing = PRIMARY_ONLY,
) -> Transition | None:
    """An agent's answer, accepted only for the running step of the current attempt.

    A Suspended order records the answer and dispatches nothing; a cancelled order takes
    the answer of the step that was running when the cancel came, then undoes.
    """
    state = process.state
    index = state.current_step
    if (
        reply.attempt != state.attempt
        or index >= len(process.steps)
        or process.steps[index].name != reply.step
    ):
        return None
    step = process.steps[index]
    b = _Builder(process, now, cause, routing)
    held = state.process_state is ProcessState.SUSPENDED
    if reply.action is Action.DO:
        if step.status is not StepStatus.RUNNING or not _awaits_step(state):
            return None
        if reply.outcome is Outcome.SUCCEEDED:
            b.set_step(index, status=StepStatus.COMPLETED, result=reply.result or {}, error=None)
            b.note("step-completed", step.name)
            if held:
                pass
            elif state.cancel_requested:
                _dispatch_compensation(b, workflow, policy, index)
            else:
                _dispatch_forward(b, workflow, policy, index + 1)
        else:
            error = reply.error or ErrorInfo("unknown", "the agent gave no reason")
            b.set_step(index, status=StepStatus.FAILED, error=error)
            b.note("step-failed", f"{step.name}: {error.code}")
            if not state.cancel_requested:
                b.set(
                    phase=Phase.COMPENSATE,
                    process_state=state.process_state if held else ProcessState.COMPENSATING,
                    last_error=f"{step.name}: {error.code}: {error.message}",
                )
                b.notify(NotificationStatus.FAILED, b.state.last_error)
            if not held:
                _dispatch_compensation(b, workflow, policy, index - 1)
    else:
        awaited = state.process_state is ProcessState.COMPENSATING or (
            held and state.phase is Phase.COMPENSATE
        )
        if not awaited or not _undoable(step):
            return None
        if reply.outcome is Outcome.SUCCEEDED:
            b.set_step(index, status=StepStatus.COMPENSATED, complete_by=None)
            b.note("step-compensated", step.name)
            if not held:
                _dispatch_compensation(b, workflow, policy, index - 1)
        else:
            error = reply.error or ErrorInfo("unknown", "the agent gave no reason")
            b.set(last_error=f"compensation of {step.name}: {error.code}: {error.message}")
            _hold_for_operator(b, "compensation-failed")
    return b.build()


def _awaits_step(state: StateRecord) -> bool:
    """May a forward step's answer be taken in this state? Also while Suspended (the step
    may finish) and while a cancel waits for the step that was running."""
    return state.process_state in (ProcessState.PROCESSING, ProcessState.SUSPENDED) or (
        state.process_state is ProcessState.COMPENSATING and state.cancel_requested
    )


def _undoable(step: StepRecord) -> bool:
    """Completed, or in doubt: dispatched with no answer before its complete-by passed, so
    it may have taken effect. Compensations are idempotent, so undoing it is safe."""
    return step.status is StepStatus.COMPLETED or (
        step.status is StepStatus.NOT_STARTED and step.attempts > 0
    )


def recover(
    process: OrderProcess,
    policy: ProcessPolicy,
    now: datetime,
    cause: str | None = None,
    *,
    count: bool = True,
    outcome: RemoteOutcome | None = None,
) -> Transition | None:
    """The Supervisor's move for an order whose deadline has passed; None if it has not.

    FailureCount counts only what happened to the order's step: a complete-by that passed
    while an agent had the request. A Pending order whose deadline passed was never given
    to an agent (its nudge was lost or not sent, the broker was down), so it is nudged
    again and nothing is counted. Without `count` (the deadline passed while the system's
    own broker or store was down, so the agent may never have had the request) the step
    is dispatched again, uncounted.

    `outcome` is what the agent's remote service said about the in-doubt step's key
    (None: not asked). Applied: the step is recorded done (Completed, or Compensated for
    an undo) with nothing counted, since it did succeed, and the Scheduler goes on. Not
    applied or never seen: the timeout still counts one failure (the agent did not
    answer in time), and the retry avoids that agent when another is healthy, because a
    key known not applied cannot be applied twice. In progress or no answer: as without
    an outcome, the retry stays where the key lives.
    """
    deadline = next_deadline(process, policy)
    if deadline is None or deadline > now:
        return None
    state = process.state
    b = _Builder(process, now, cause)
    if state.process_state is ProcessState.PENDING:
        b.set(locked_by=None)
        _requeue(b, policy, 0, "renudged")
        return b.build()
    index = state.current_step
    step = process.steps[index] if index < len(process.steps) else None
    running = step is not None and step.status is StepStatus.RUNNING
    undoing = state.process_state is ProcessState.COMPENSATING and step is not None
    asked = step is not None and step.complete_by is not None and (running or undoing)
    applied = outcome is not None and outcome.kind is RemoteOutcomeKind.APPLIED
    if applied and asked and step is not None and outcome is not None:
        _record_applied(b, policy, index, step, undo=not running, outcome=outcome)
        return b.build()
    if running:
        # No answer by its complete-by: in doubt. A cancelling order undoes it next.
        b.set_step(index, status=StepStatus.NOT_STARTED, complete_by=None)
    elif undoing:
        b.set_step(index, complete_by=None)
    if not count:
        b.set(locked_by=None)
        b.note("expired-in-outage", f"{_step_label(process)}: not counted")
        _requeue(b, policy, 0, "redispatch")
        return b.build()
    failures = state.failure_count + 1
    b.set(
        failure_count=failures,
        locked_by=None,
        last_error=f"{_step_label(process)} not completed by {iso(deadline)}",
    )
    b.note("timed-out", b.state.last_error or "")
    known_not_applied = outcome is not None and asked and outcome.safe_to_move and running
    if outcome is not None and asked and step is not None:
        _note_outcome(b, step, outcome, moves=known_not_applied)
    if known_not_applied and step is not None:
        b.set_step(index, suspect=step.agent)
    if failures < policy.max_failure_count:
        _requeue(b, policy, failures, "requeued")
    elif policy.exhausted_policy is ExhaustedPolicy.COMPENSATE and state.phase is Phase.FORWARD:
        b.alert("max-failure-count-reached-compensating")
        b.notify(NotificationStatus.FAILED, b.state.last_error)
        # The step that timed out may have taken effect: it is undone first, unless its
        # service said it was not applied.
        undo_from = index - 1 if known_not_applied else index
        b.set(phase=Phase.COMPENSATE, current_step=undo_from, failure_count=0)
        _requeue(b, policy, 1, "compensation-requested")
    else:
        _hold_for_operator(b, "max-failure-count-reached")
    return b.build()


def extend_complete_by(
    process: OrderProcess,
    attempt: int,
    step: str,
    now: datetime,
    policy: ProcessPolicy,
) -> Transition | None:
    """A step heartbeat: the agent of `step` at `attempt` is still running its call, so
    the step's complete-by and the order's move to now + StepHeartbeatSeconds, never past
    StepMaxSeconds from the dispatch.

    None changes nothing and tells the agent to stop beating: another attempt holds the
    order, the step is no longer Running (answered, recovered), the order is Pending,
    held or finished, the complete-by has already passed (the step is in doubt, the
    Supervisor's to resolve), or the cap leaves nothing to extend. A beat sends nothing
    and keeps the outbox as it is (a dispatch message not yet sent must still be resent),
    and only the first beat of an attempt is noted in the history; the rest are counted.
    """
    state = process.state
    index = state.current_step
    if state.attempt != attempt or index >= len(process.steps):
        return None
    record = process.steps[index]
    if record.name != step or record.status is not StepStatus.RUNNING:
        return None
    if state.process_state not in (ProcessState.PROCESSING, ProcessState.COMPENSATING):
        return None
    if policy.step_max is None or record.dispatched_at is None or record.complete_by is None:
        return None
    if record.complete_by <= now:
        return None
    cap = record.dispatched_at + policy.step_max
    extended = min(now + policy.step_heartbeat, cap)
    if extended <= record.complete_by:
        return None
    beats = record.step_heartbeats + 1
    steps = list(process.steps)
    steps[index] = replace(record, complete_by=extended, step_heartbeats=beats)
    order_by = extended if state.complete_by is None else max(state.complete_by, extended)
    next_state = replace(state, version=state.version + 1, updated_at=now, complete_by=order_by)
    history: tuple[HistoryEntry, ...] = ()
    if beats == 1:
        history = (
            HistoryEntry(
                at=now,
                event="step-heartbeat",
                detail=f"{step}: {record.agent or 'the agent'} still runs its call; complete-by "
                f"moves with its heartbeats, at most to {iso(cap)}",
                process_state=state.process_state,
                failure_count=state.failure_count,
                attempt=state.attempt,
            ),
        )
    extended_process = OrderProcess(process.order, next_state, tuple(steps), process.etag)
    return Transition(extended_process, (), history)


def _record_applied(
    b: _Builder,
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
        # Compensated is not undoable: the next claim's undo walks on below it.
        b.set_step(index, status=StepStatus.COMPENSATED, complete_by=None)
        what = f"compensation of {step.name}"
        recorded, key = "Compensated", _key(b, step, undo=True)
    else:
        b.set_step(
            index,
            status=StepStatus.COMPLETED,
            result=dict(outcome.result or {}),
            error=None,
            complete_by=None,
        )
        what, recorded, key = step.name, "Completed", _key(b, step)
    b.set(locked_by=None)
    b.note(
        "in-doubt-applied",
        f"{agent} had applied key {key}: {what} recorded {recorded} without calling again",
    )
    _requeue(b, policy, 0, "resolved")


def _key(b: _Builder, step: StepRecord, *, undo: bool = False) -> str:
    """The idempotency key the step's request (or its undo's) carried."""
    workflow = WORKFLOWS.get(b.state.workflow)
    operation = workflow.operation(step.name, undo) if workflow else None
    return idempotency_key(b.order.order_id, operation or step.name)


def _note_outcome(b: _Builder, step: StepRecord, outcome: RemoteOutcome, *, moves: bool) -> None:
    """Why the retry goes where it goes, in the order's history."""
    agent = step.agent or "the agent"
    if outcome.safe_to_move:
        said = "had not applied" if outcome.kind is RemoteOutcomeKind.NOT_APPLIED else "never saw"
        where = "the retry avoids it when another agent is healthy" if moves else "retried"
        b.note("in-doubt-not-applied", f"{agent} {said} key {_key(b, step)}: {where}")
    elif outcome.kind is RemoteOutcomeKind.IN_PROGRESS:
        b.note("in-doubt-unanswered", f"{agent} still runs the call: retried at {agent}")
    else:
        why = f" ({outcome.detail})" if outcome.detail else ""
        b.note("in-doubt-unanswered", f"{agent} gave no answer{why}: retried at {agent}")


def undelivered(
    process: OrderProcess, policy: ProcessPolicy, now: datetime, cause: str | None = None
) -> Transition | None:
    """The stored dispatch of `process` could not be sent (the bus was unreachable): back
    to Pending with the step not started and FailureCount unchanged, so the next claim
    sends it again (same key, next attempt) and no deadline counts against the order.

    The send may have got through before it failed; a late answer is then fenced off by
    its attempt, and the repeat request is idempotent on the same key. None: the state
    awaits no agent request.
    """
    state = process.state
    index = state.current_step
    if state.process_state not in (ProcessState.PROCESSING, ProcessState.COMPENSATING):
        return None
    if index >= len(process.steps) or process.steps[index].complete_by is None:
        return None
    b = _Builder(process, now, cause)
    if process.steps[index].status is StepStatus.RUNNING:
        b.set_step(index, status=StepStatus.NOT_STARTED, complete_by=None)
    else:
        b.set_step(index, complete_by=None)
    b.set(locked_by=None)
    b.note("undelivered", f"{_step_label(process)}: its request could not be sent")
    _requeue(b, policy, 0, "redispatch")
    return b.build()


def resubmit(
    process: OrderProcess,
    policy: ProcessPolicy,
    now: datetime,
    operator: str = "operator",
    cause: str | None = None,
) -> Transition:
    """An operator resumes an Error order at its failed step; completed steps stay done."""
    if process.state.process_state is not ProcessState.ERROR:
        raise InvalidTransition(
            f"order {process.order_id} is {process.state.process_state.value}, not Error"
        )
    b = _Builder(process, now, cause)
    b.set(failure_count=0, locked_by=None, complete_by=None)
    b.note("resubmitted", f"by {operator}")
    _requeue(b, policy, 0, "resubmitted")
    return b.build()


def cancel(
    process: OrderProcess,
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
    if state.cancel_requested and not state.process_state.is_terminal:
        return None
    b = _Builder(process, now, cause)
    b.set(cancel_requested=True, phase=Phase.COMPENSATE, failure_count=0)
    b.note("cancel-requested", f"by {operator}" + (f": {reason}" if reason else ""))
    _continue_cancel(b, process, policy)
    return b.build()


def suspend(
    process: OrderProcess,
    now: datetime,
    operator: str = "operator",
    cause: str | None = None,
) -> Transition | None:
    """An operator pauses the order: no further step is dispatched and no deadline counts.

    A running step may still answer; its answer is recorded (see apply_reply). An Error
    order is already held, so it is refused like a final one. None: already Suspended.
    """
    current = process.state.process_state
    if current is ProcessState.SUSPENDED:
        return None
    if current.is_terminal:
        raise InvalidTransition(f"order {process.order_id} is {current.value}: cannot suspend")
    b = _Builder(process, now, cause)
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
    b = _Builder(process, now, cause)
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
    _requeue(b, policy, 0, "resumed")
    return b.build()


def _continue_cancel(b: _Builder, process: OrderProcess, policy: ProcessPolicy) -> None:
    """Wait for what is in flight (a step or a compensation whose complete-by has not
    passed), else go back to the Scheduler, which undoes from the current step down.

    A step is undone only once its answer is in or its complete-by has passed: undone
    earlier, a late request could still apply it after its undo."""
    state = process.state
    index = state.current_step
    step = process.steps[index] if index < len(process.steps) else None
    live = step is not None and step.complete_by is not None and step.complete_by > b.now
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
    _requeue(b, policy, 0, "cancelling")


def next_check(
    process: OrderProcess, workflow: Workflow, policy: ProcessPolicy, now: datetime
) -> datetime | None:
    """When the Supervisor's watch entry should come due; never after a real deadline.

    A Pending order may be claimed at any moment and its step's complete-by then starts
    running, so a Pending order is checked again within the shortest step timeout.
    Checking early only costs a read; checking late would delay recovery.
    """
    deadline = next_deadline(process, policy)
    if deadline is None or process.state.process_state is not ProcessState.PENDING:
        return deadline
    timeouts = [policy.timeout(s, process.order.priority) for s in workflow.steps]
    return min(deadline, now + min(timeouts, default=policy.step_timeout))


def next_deadline(process: OrderProcess, policy: ProcessPolicy) -> datetime | None:
    """When the Supervisor must look at this order next; None when nothing can expire."""
    state = process.state
    if state.process_state.is_terminal:
        return None
    if state.process_state is ProcessState.PENDING:
        return state.complete_by or state.updated_at + policy.pending_timeout
    candidates = [d for d in (state.complete_by, _running_step_deadline(process)) if d]
    return min(candidates) if candidates else state.updated_at + policy.step_timeout


def _running_step_deadline(process: OrderProcess) -> datetime | None:
    index = process.state.current_step
    if index < len(process.steps):
        return process.steps[index].complete_by
    return None


def _step_label(process: OrderProcess) -> str:
    index = process.state.current_step
    name = process.steps[index].name if index < len(process.steps) else "workflow"
    return f"compensation of {name}" if process.state.phase is Phase.COMPENSATE else name


def _requeue(b: _Builder, policy: ProcessPolicy, failures: int, reason: str) -> None:
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
            b.state.version,
            high=b.order.priority is Priority.HIGH,
            deliver_at=deliver_at if delay else None,
        )
    )


DRAIN_RECHECK = timedelta(seconds=10)
"""How often an order waiting for a drained agent looks again (at most)."""


def _drained_step(
    steps: Sequence[StepRecord], workflow: Workflow, routing: Routing, from_step: int
) -> int | None:
    """The next forward step, when every agent that may take it is drained.

    A retry that must stay with the agent that has its key waits for that agent alone.
    """
    index = from_step
    while index < len(steps) and steps[index].status is StepStatus.COMPLETED:
        index += 1
    if index >= len(workflow.steps):
        return None
    step, definition = steps[index], workflow.steps[index]
    pinned = step.attempts > 0 and step.status is StepStatus.NOT_STARTED and step.agent
    if pinned and step.agent and not definition.retry_elsewhere:
        candidates: tuple[AgentName, ...] = (AgentName(step.agent),)
    else:
        candidates = definition.candidates
    return index if routing.all_drained(candidates) else None


def _wait_for_drained(b: _Builder, policy: ProcessPolicy, index: int) -> None:
    """Pending again, FailureCount unchanged, with a nudge to look later. Each look moves
    the Pending deadline on, so the Supervisor counts nothing while the agent is drained.
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
            b.state.version, high=b.order.priority is Priority.HIGH, deliver_at=deliver_at
        )
    )


def _hold_for_operator(b: _Builder, reason: str) -> None:
    b.set(process_state=ProcessState.ERROR, locked_by=None, complete_by=None)
    b.note("error", reason)
    b.alert(reason)


def _dispatch_forward(
    b: _Builder, workflow: Workflow, policy: ProcessPolicy, from_step: int
) -> None:
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
    if _drained_step(b.steps, workflow, b.routing, index) is not None:
        _wait_for_drained(b, policy, index)
        return
    step = b.steps[index]
    _dispatch(b, workflow, policy, index, Action.DO, _order_payload(b.order))
    b.set_step(index, status=StepStatus.RUNNING, attempts=step.attempts + 1)


def _dispatch_compensation(
    b: _Builder, workflow: Workflow, policy: ProcessPolicy, from_step: int
) -> None:
    """Undo the completed steps in reverse order, one deadline-bound agent step at a time."""
    index = min(from_step, len(b.steps) - 1)
    while index >= 0 and not (_undoable(b.steps[index]) and workflow.steps[index].compensation):
        index -= 1
    if index < 0:
        cancelled = b.state.cancel_requested
        b.set(
            process_state=ProcessState.CANCELLED if cancelled else ProcessState.COMPENSATED,
            current_step=0,
            locked_by=None,
            complete_by=None,
        )
        b.note("cancelled" if cancelled else "compensated")
        b.notify(NotificationStatus.CANCELLED if cancelled else NotificationStatus.COMPENSATED)
        return
    step = b.steps[index]
    payload = {"result": dict(step.result or {})}
    _dispatch(b, workflow, policy, index, Action.COMPENSATE, payload)
    b.set_step(index, compensation_attempts=step.compensation_attempts + 1)


def _dispatch(
    b: _Builder,
    workflow: Workflow,
    policy: ProcessPolicy,
    index: int,
    action: Action,
    payload: JsonObject,
) -> None:
    """Give step `index` its complete-by (step and order alike) and ask its agent.

    A step goes to the healthiest of its agents; its undo goes to the agent that did it.
    High-priority orders use the agents' high-priority lanes and a tighter complete-by.
    """
    definition = workflow.steps[index]
    step = b.steps[index]
    compensate = action is Action.COMPENSATE
    operation = (definition.compensation if compensate else definition.name) or ""
    if compensate:
        agent, why = AgentName(step.agent or definition.agent), ""
    elif step.attempts > 0 and step.status is StepStatus.NOT_STARTED and step.suspect:
        # Its service said the key was not applied: moving cannot apply it twice.
        agent, why = b.routing.choose(definition.candidates, avoid=step.suspect)
        timed_out = f"{step.suspect}: its attempt timed out"
        why = why.replace(timed_out, f"{timed_out} and it had not applied the key")
    elif step.attempts > 0 and step.status is StepStatus.NOT_STARTED and step.agent:
        if definition.retry_elsewhere:
            agent, why = b.routing.choose(definition.candidates, avoid=step.agent)
        else:
            agent, why = AgentName(step.agent), ""
    else:
        agent, why = b.routing.choose(definition.candidates)
    high = b.order.priority is Priority.HIGH
    queue = AGENTS[agent].queue_for(high)
    deadline = b.now + policy.timeout(definition, b.order.priority)
    b.set_step(
        index,
        complete_by=deadline,
        agent=agent.value,
        suspect=None,
        dispatched_at=b.now,
        step_heartbeats=0,
    )
    b.set(current_step=index, complete_by=deadline)
    b.note(
        "compensation-dispatched" if compensate else "step-dispatched",
        f"{operation} to {queue}" + (f" (instead of {why})" if why else ""),
    )
    request = AgentRequest(
        order_id=b.order.order_id,
        step=definition.name,
        action=action,
        attempt=b.state.attempt,
        complete_by=deadline,
        idempotency_key=idempotency_key(b.order.order_id, operation),
        payload=payload,
    )
    b.send(request.outgoing(agent, high=high))


def _order_payload(order: Order) -> JsonObject:
    return {
        "customerId": order.customer_id,
        "priority": order.priority.value,
        "items": [
            {"sku": line.sku, "quantity": line.quantity, "unitPrice": line.unit_price}
            for line in order.items
        ],
    }
