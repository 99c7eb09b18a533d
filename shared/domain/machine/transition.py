"""What every rule of the state machine returns, the policy it reads, and the builder it
writes with: one transition is the next process, the messages to send once it is stored,
and the history to append."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import ClassVar

from shared.domain.messages import OperatorAlert, StatusNotification
from shared.domain.model import (
    ExhaustedPolicy,
    HistoryEntry,
    NotificationStatus,
    Order,
    OrderProcess,
    Outgoing,
    Priority,
    ProcessState,
    StateRecord,
    StepRecord,
)
from shared.domain.routing import PRIMARY_ONLY, Routing
from shared.domain.workflow import StepDefinition, Workflow


class InvalidTransition(Exception):
    """The operator asked for a move the order's state does not allow."""

    code: ClassVar[str | None] = None
    """A stable reason clients may branch on (`past-pivot`); None: the title says it."""


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
    clock_skew: timedelta = timedelta(seconds=5)
    """How long after its complete-by a request may still reach its provider and apply:
    the network's delay plus the clocks' disagreement. A request is live until then."""
    hold_max: timedelta = timedelta(minutes=5)
    """How far from its dispatch a limit's wait may restart a step's complete-by
    (machine/hold.py); past it the usual timeout applies."""

    def timeout(self, definition: StepDefinition, priority: Priority) -> timedelta:
        base = (
            timedelta(seconds=definition.timeout_seconds)
            if definition.timeout_seconds is not None
            else self.step_timeout
        )
        if priority is Priority.HIGH and self.high_priority_step_timeout is not None:
            return min(base, self.high_priority_step_timeout)
        return base

    def wait_timeout(self, definition: StepDefinition) -> timedelta:
        """A wait's complete-by from its start: the step's own timeout (hours or days for an
        approval), never shortened for priority; StepTimeoutSeconds when it has none."""
        if definition.timeout_seconds is not None:
            return timedelta(seconds=definition.timeout_seconds)
        return self.step_timeout

    def backoff(self, failure_count: int) -> timedelta:
        exponent = max(failure_count - 1, 0)
        delay: timedelta = self.backoff_base * (2**exponent)
        return min(delay, self.backoff_cap)


@dataclass(frozen=True)
class Transition:
    process: OrderProcess
    outgoing: tuple[Outgoing, ...]
    history: tuple[HistoryEntry, ...]
    check_at: datetime | None = None
    """When the Supervisor must look sooner than the order's watch entry may say: a
    compensation waiting for a step's request to settle (the unit of work moves it)."""
    rested_in: ProcessState | None = None
    """The rest (Error, Suspended) the order was in before: it may have no watch entry,
    and it has a rest entry there (shared/domain/rest_index.py)."""

    @property
    def is_at_rest(self) -> bool:
        """The order comes to (or stays at) rest with this change: nothing watches it."""
        return self.process.state.process_state.is_at_rest

    @property
    def was_at_rest(self) -> bool:
        return self.rested_in is not None

    @property
    def leaves_rest(self) -> bool:
        """The order starts moving again, so it must be watched before it is saved."""
        return self.was_at_rest and not self.is_at_rest

    @property
    def moves_rest(self) -> bool:
        """The order leaves the rest it was in (for a move or another rest): its entry
        there goes once the change is saved."""
        return self.rested_in not in (None, self.process.state.process_state)


class Builder:
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
        before = process.state.process_state
        self.rested_in: ProcessState | None = before if before.is_at_rest else None
        self.now = now
        self.cause = cause
        self.outgoing: list[Outgoing] = []
        self.history: list[HistoryEntry] = []
        self.check_at: datetime | None = None
        self.workflow: Workflow | None = None
        """The order's workflow, for rules that name its operations."""

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
        """Sent only if the client asked to hear it (`Order.notify`)."""
        if not self.order.notify.hears(status):
            return
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

    @property
    def high(self) -> bool:
        return self.order.priority is Priority.HIGH

    def build(self) -> Transition:
        outgoing = tuple(self.outgoing)
        state = replace(self.state, outbox=outgoing, outbox_cause=self.cause)
        process = OrderProcess(self.order, state, tuple(self.steps), self.etag)
        return Transition(process, outgoing, tuple(self.history), self.check_at, self.rested_in)
