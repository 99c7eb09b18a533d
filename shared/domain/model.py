"""The order process as the pattern names it: order, state record, step records."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from shared.domain.destination import Destination

JsonObject = Mapping[str, Any]


class ProcessState(StrEnum):
    PENDING = "Pending"
    PROCESSING = "Processing"
    PROCESSED = "Processed"
    ERROR = "Error"
    COMPENSATING = "Compensating"
    COMPENSATED = "Compensated"
    SUSPENDED = "Suspended"
    CANCELLED = "Cancelled"

    @property
    def is_at_rest(self) -> bool:
        """Nothing runs until someone acts: no complete-by is watched. A final order, and
        Error and Suspended too, since only an operator moves them on."""
        return self.is_final or self in (ProcessState.ERROR, ProcessState.SUSPENDED)

    @property
    def is_final(self) -> bool:
        """The order is over (Processed, Compensated, Cancelled): nothing, not even an
        operator, moves it on."""
        return self in (ProcessState.PROCESSED, ProcessState.COMPENSATED, ProcessState.CANCELLED)


class StepStatus(StrEnum):
    NOT_STARTED = "NotStarted"
    RUNNING = "Running"
    COMPLETED = "Completed"
    FAILED = "Failed"
    COMPENSATED = "Compensated"


class KeyState(StrEnum):
    """What a step's provider did with the step's do key, as far as the order knows.

    Only a settled key (APPLIED or NOT_APPLIED) lets the order undo the step or send it
    to another provider: while a request is live and its key unsettled, the provider
    may still apply it (docs/in-doubt.md)."""

    UNSENT = "unsent"
    UNSETTLED = "unsettled"
    """A request went out; the provider may have applied it, or may still."""
    EXPIRED = "expired"
    """No request sent with it can still apply, and the provider could not say whether
    one did: an undo is safe (it meets the key as it stays), a move is not."""
    APPLIED = "applied"
    NOT_APPLIED = "not-applied"
    """Final: rejected, abandoned at the provider, or not applied once no request sent
    with it could still apply."""

    @property
    def settled(self) -> bool:
        return self in (KeyState.APPLIED, KeyState.NOT_APPLIED)


class Phase(StrEnum):
    """Which way the Scheduler walks the workflow when it next claims the order."""

    FORWARD = "forward"
    COMPENSATE = "compensate"


class Action(StrEnum):
    DO = "do"
    COMPENSATE = "compensate"


class Outcome(StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class Priority(StrEnum):
    NORMAL = "normal"
    HIGH = "high"


class NotificationStatus(StrEnum):
    RECEIVED = "Received"
    PROCESSING = "Processing"
    PROCESSED = "Processed"
    FAILED = "Failed"
    COMPENSATED = "Compensated"
    SUSPENDED = "Suspended"
    RESUMED = "Resumed"
    CANCELLED = "Cancelled"


FINAL_NOTIFICATIONS = frozenset(
    {NotificationStatus.PROCESSED, NotificationStatus.COMPENSATED, NotificationStatus.CANCELLED}
)
"""The statuses that end an order (a final process state): what a client that asked for
the final one only hears."""


class Notify(StrEnum):
    """What a client hears on its response queue, as it asked when it submitted."""

    ALL = "all"
    """Every status notification (the contract's default)."""
    FINAL = "final"
    """Only the one that ends the order (`FINAL_NOTIFICATIONS`): a client that polls or
    only waits for the outcome is spared the messages in between."""

    def hears(self, status: NotificationStatus) -> bool:
        return self is Notify.ALL or status in FINAL_NOTIFICATIONS


class ExhaustedPolicy(StrEnum):
    HOLD = "hold"
    COMPENSATE = "compensate"


@dataclass(frozen=True)
class OrderLine:
    sku: str
    quantity: int
    unit_price: float


@dataclass(frozen=True)
class Order:
    order_id: str
    customer_id: str
    items: tuple[OrderLine, ...]
    priority: Priority
    reply_to: str | None
    fingerprint: str
    """Hash of the canonical submitted body: the same id with another body is a conflict."""
    created_at: datetime
    trace_parent: str | None = None
    """The W3C traceparent of the intake that accepted the order: the root its trace
    continues from when the Supervisor or an operator acts on it."""
    not_before: datetime | None = None
    """The earliest time a timer step waiting for `notBefore` lets the order go on."""
    notify: Notify = Notify.ALL
    """Which status notifications the client asked for."""


@dataclass(frozen=True)
class ErrorInfo:
    code: str
    message: str


@dataclass(frozen=True)
class StepRecord:
    name: str
    status: StepStatus = StepStatus.NOT_STARTED
    attempts: int = 0
    complete_by: datetime | None = None
    result: JsonObject | None = None
    error: ErrorInfo | None = None
    compensation_attempts: int = 0
    agent: str | None = None
    """The agent the step was last dispatched to; its compensation goes to the same one."""
    suspect: str | None = None
    """An agent that timed out on this step and then said it had not applied the key: the
    next dispatch avoids it when another candidate is healthy (see process.recover)."""
    dispatched_at: datetime | None = None
    """When the current attempt was dispatched: step heartbeats never extend its
    complete-by past this plus StepMaxSeconds."""
    step_heartbeats: int = 0
    """Step heartbeats taken for the current attempt: counted here, since a history row
    per beat would grow the history with the length of a step."""
    key_state: KeyState = KeyState.UNSENT
    """The do key at the provider `agent`: never reset by resume, undelivered, cancel or
    resubmit, only by evidence (a reply, an answer, an abandon, the live time passing)."""
    live_until: datetime | None = None
    """When the last do request sent for this step stops being able to apply: its
    complete-by plus the clock-skew margin. Only ever moves later."""
    tried: tuple[str, ...] = ()
    """Every agent a do of this step was sent to, first first: reconciliation asks each."""
    abandoned_at: tuple[str, ...] = ()
    """Agents at which the do key was abandoned: no do of this step goes there again."""
    do_round: int = 0
    """Which of the step's do keys is current (`messages.idempotency_key`): 0, the order
    and operation, until an operator resubmits a do its provider refused for good; each
    such resubmit sends it under the next (machine/rekey.py, docs/in-doubt.md)."""
    rekeyed_at: tuple[int, ...] = ()
    """The order's attempt when each later do round began (the resubmit that moved the
    key), first first: a request carries its claim's attempt, and every request of an
    earlier round went out at or before the attempt its round ended at, so a late reply
    is known by its attempt for the round it answers (`round_of`). A step moved before
    this was kept has fewer entries than `do_round`: its replies read as the current
    round's."""
    undo_round: int = 0
    """The same for the step's undo: moved by a resubmit or a cancel of a compensation
    held on an undo refused for good."""
    refused: Action | None = None
    """The do or undo whose current key its provider refused for good: that key is
    settled not applied for good, so the operator's next move may send a fresh one."""


@dataclass(frozen=True)
class Outgoing:
    """A message a transition must send once its state change is stored.

    The body is already in wire form; the message id is deterministic so a re-send
    after a crash is dropped by the broker's duplicate detection. The destination is in
    the pattern's words; the bus adapter names its queue.
    """

    destination: Destination
    message_id: str
    body: JsonObject
    deliver_at: datetime | None = None
    properties: Mapping[str, str] = field(default_factory=dict)
    """Application properties besides the body (the trace context, added when sent)."""


@dataclass(frozen=True)
class HistoryEntry:
    at: datetime
    event: str
    detail: str
    process_state: ProcessState
    failure_count: int
    attempt: int


@dataclass(frozen=True)
class ReceivedEvent:
    """An event sent to the order (docs/catalogue.md), kept until and after a step
    consumes it: an early one waits for its step, a repeat of its id changes nothing."""

    event_id: str
    name: str
    at: datetime
    data: JsonObject | None = None
    consumed_by: str | None = None
    """The step that took it; None while it waits for one."""


@dataclass(frozen=True)
class StateRecord:
    """The pattern's state record. `attempt` is the fencing token of the current claim."""

    order_id: str
    process_state: ProcessState
    locked_by: str | None
    complete_by: datetime | None
    failure_count: int
    attempt: int
    phase: Phase
    current_step: int
    last_error: str | None
    version: int
    created_at: datetime
    updated_at: datetime
    workflow: str
    outbox: tuple[Outgoing, ...] = ()
    workflow_version: int = 1
    """The version of `workflow` the order started on and runs to its end on."""
    events: tuple[ReceivedEvent, ...] = ()
    outbox_cause: str | None = None
    cancel_requested: bool = False
    """An operator cancelled: the order compensates every step that may have taken effect,
    then ends Cancelled rather than Compensated."""


@dataclass(frozen=True)
class OrderProcess:
    """One order's rows as read together; `etag` guards the state record on save."""

    order: Order
    state: StateRecord
    steps: tuple[StepRecord, ...]
    etag: str | None = None
    history: tuple[HistoryEntry, ...] = field(default=())

    @property
    def order_id(self) -> str:
        return self.order.order_id
