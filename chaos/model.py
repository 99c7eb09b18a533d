"""Plain data a chaos run collects and the invariants judge; no I/O here."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from devhost.simulator.judge import LedgerEntry
from shared.domain.model import OrderProcess, ProcessState
from shared.domain.workflow import Workflow


@dataclass(frozen=True)
class PlannedOrder:
    order_id: str
    body: Mapping[str, Any]
    failing_service: str | None
    """The service that rejects one of its SKUs for good, or None."""
    workflow: str | None = None
    """The workflow the order is submitted on; None: the catalogue's default."""
    not_before_after: float | None = None
    """For a workflow with a timer on `notBefore`: the order's notBefore is this many
    seconds after its slot in the load (set when it is submitted)."""


@dataclass(frozen=True)
class Accepted:
    order_id: str
    at: float
    """Seconds since the load started, when the 202 came back."""
    runtime: str
    tries: int


@dataclass(frozen=True)
class SentEvent:
    """An event the chaos reviewer got a 202 for: the system took it and must keep it."""

    order_id: str
    event_id: str
    name: str
    approved: bool
    at: float
    """Seconds since the load started, when the 202 came back."""
    early: bool
    """Sent right after the submission's 202 (else once the order was seen waiting)."""


@dataclass(frozen=True)
class LateEvent:
    """An event the chaos reviewer sent after its order was final: it must be refused."""

    order_id: str
    event_id: str
    answer: str
    """How the route answered ("409", "202", ...)."""


@dataclass(frozen=True)
class Effect:
    """A row of the simulator's ledger: one (service, idempotency key)."""

    service: str
    operation: str
    order_id: str
    idempotency_key: str
    calls: int
    applied: int
    applied_at: datetime | None = None
    first_call_at: datetime | None = None
    abandoned: bool = False
    undoes: str | None = None
    """A compensation's do key; None for a do."""
    undone: bool | None = None
    """A compensation's: True when it undid its do, False when it found nothing to undo."""
    arrived_late: bool = False
    """The call that settled the key had been held on the network past its caller's
    deadline (the simulator's `lateRate`): the residual risk of docs/in-doubt.md."""

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Effect:
        entry = LedgerEntry.from_json(data)
        return cls(
            service=entry.service,
            operation=entry.operation,
            order_id=entry.order_id,
            idempotency_key=entry.idempotency_key,
            calls=int(data["calls"]),
            applied=int(data["applied"]),
            applied_at=entry.applied_at,
            first_call_at=entry.first_call_at,
            abandoned=entry.abandoned,
            undoes=entry.undoes,
            undone=entry.undone,
            arrived_late=bool(data.get("arrivedLate", False)),
        )

    @property
    def ledger_entry(self) -> LedgerEntry:
        """The row as the net-effect judge reads it."""
        return LedgerEntry(
            self.service,
            self.operation,
            self.order_id,
            self.idempotency_key,
            self.applied > 0,
            self.applied_at,
            self.first_call_at,
            self.abandoned,
            self.undoes,
            self.undone,
        )


@dataclass(frozen=True)
class Heard:
    """A status notification on order-status, as a client that named no queue hears it."""

    order_id: str
    status: str
    message_id: str


@dataclass(frozen=True)
class Alert:
    order_id: str
    reason: str
    failure_count: int
    last_error: str | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Alert:
        last_error = data.get("lastError")
        return cls(
            order_id=str(data.get("orderId", "")),
            reason=str(data.get("reason", "")),
            failure_count=int(data.get("failureCount", 0)),
            last_error=None if last_error is None else str(last_error),
        )


@dataclass(frozen=True)
class Sample:
    """A state row seen by the monitor while the run was going."""

    at: float
    order_id: str
    process_state: ProcessState
    locked_by: str | None
    failure_count: int
    cancel_requested: bool = False


@dataclass(frozen=True)
class Observations:
    """Everything the invariants look at, collected after the system converged."""

    workflow: Workflow
    """The default workflow: an order planned without one runs on it."""
    max_failure_count: int
    planned: Mapping[str, PlannedOrder]
    accepted: Mapping[str, Accepted]
    processes: Mapping[str, OrderProcess]
    """Final state of each stored order, with its full history."""
    effects: tuple[Effect, ...]
    """In ledger order (first call first)."""
    alerts: tuple[Alert, ...]
    samples: tuple[Sample, ...]
    last_submission_at: float
    terminal_at: float | None
    """When every accepted order was first seen terminal (seconds since the load began)."""
    bound_seconds: float
    outages: tuple[tuple[datetime, datetime], ...] = ()
    """When the broker or Azurite was down (wall clock, UTC): from its kill until it was
    ready again."""
    outage_grace: timedelta = timedelta(0)
    """How long after an outage a step's complete-by may still pass because of it."""
    reconciled: int | None = None
    """Finished orders a reconciliation run checked after the load (`POST
    /api/reconcile`; its mismatches are alerts); None when it could not run."""
    workflows: Mapping[str, Workflow] = field(default_factory=dict)
    """The other workflows orders were planned on, by name."""
    cancel_answers: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Per order, the operator's cancels by answer: "202", "409" (finished), "409
    past-pivot" (refused: the pivot may have applied), "failed"..."""
    events: tuple[SentEvent, ...] = ()
    """Every event answered 202 (each eventId once, first 202 first)."""
    rest_index: Mapping[str, tuple[ProcessState, ...]] | None = None
    """The rest index at the end: per order, the rest states it has an entry in (None:
    not read)."""
    reconcile_mismatches: tuple[int, ...] = ()
    """Mismatches found by each reconciliation run after the load, in order: the run is
    repeated while it finds some (its undos are not awaited), so the last one says
    whether what it found was healed."""
    reconcile_left: tuple[str, ...] = ()
    """Of the last run's mismatches, the orders it left for an operator because they were
    held (Error or Suspended) with a step settled "not applied" that its provider now has
    in force: the order may still take that effect as its step's, so nothing undoes it
    until an operator moves the order on (docs/in-doubt.md)."""
    late_events: tuple[LateEvent, ...] = ()
    """Events sent after their order was final."""
    limits: Mapping[str, int] = field(default_factory=dict)
    """The agents' `callsPerSecond` the runtimes were given, by agent."""
    max_calls_in_one_second: Mapping[str, int] = field(default_factory=dict)
    """The most calls each service saw in one second (the simulator's count)."""
    heard: tuple[Heard, ...] | None = None
    """The status notifications on order-status over the run, drained at the end (None:
    not read)."""

    def decision(self, order_id: str) -> bool | None:
        """The approval the order's first accepted event carries (the one its review
        step must take); None when no event of the order was accepted."""
        return next((e.approved for e in self.events if e.order_id == order_id), None)

    def workflow_name(self, order_id: str) -> str:
        """The workflow the order was submitted on (or stored with, if never planned)."""
        planned = self.planned.get(order_id)
        if planned is not None:
            return planned.workflow or self.workflow.name
        process = self.processes.get(order_id)
        return process.state.workflow if process is not None else self.workflow.name

    def workflow_of(self, order_id: str) -> Workflow:
        """The workflow the order is judged against: the one it was submitted on."""
        name = self.workflow_name(order_id)
        return self.workflows.get(name, self.workflow)


@dataclass(frozen=True)
class InvariantResult:
    name: str
    passed: bool
    checked: int
    """How many things (orders, effects, samples...) were looked at."""
    violations: tuple[str, ...] = ()


@dataclass
class Figures:
    """Counts for the report; none of them decides PASS or FAIL."""

    states: dict[str, int] = field(default_factory=dict)
    states_by_workflow: dict[str, dict[str, int]] = field(default_factory=dict)
    """Final states of the accepted orders, per workflow they were submitted on."""
    recoveries: int = 0
    """History `timed-out` and `expired-in-outage` events: the Supervisor recovered an
    expired attempt."""
    recoveries_in_outage: int = 0
    """Of those, the ones not counted: the deadline passed while the bus or store was down."""
    alerts_by_reason: dict[str, int] = field(default_factory=dict)
    simulator: dict[str, int] = field(default_factory=dict)
    broker: dict[str, int] = field(default_factory=dict)
    log_counts: dict[str, int] = field(default_factory=dict)
    events: dict[str, int] = field(default_factory=dict)
    """Events sent by the chaos reviewer (answers, retries) and what the orders did
    with them (consumed, kept unconsumed)."""
    limits: dict[str, int] = field(default_factory=dict)
    """What our own limits did (holds, customers' lines, calls in a second)."""


@dataclass(frozen=True)
class Convergence:
    terminal_after: float | None
    """Seconds from the last submission until every order was seen terminal."""
    settled_after: float | None
    """Seconds from then until the Supervisor's watch list was empty (outboxes sent)."""
    still_watched: int
    collect_seconds: float


@dataclass(frozen=True)
class Check:
    """One pass of the invariants over one collection."""

    title: str
    observations: Observations
    results: tuple[InvariantResult, ...]
    figures: Figures
    convergence: Convergence

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)
