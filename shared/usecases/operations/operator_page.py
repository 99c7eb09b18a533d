"""What the operator page shows: a bounded snapshot of orders, agents and sweeps.

The page refreshes every two seconds for as long as it is open, so a snapshot must cost
what it shows, never the size of the table (shared/usecases/operations/order_views.py). It
therefore never counts: per rest state it reads one range of at most `count_cap + 1`
rest entries (all in parallel), and for the in-flight states the first
`len(IN_FLIGHT) x (count_cap + 1)` entries of the watch list and those orders' state
rows. It reports `count_cap+` when there are more, or more may be. A refresh thus reads
at most `len(ProcessState) x (count_cap + 1)` entries and rows, plus one small ops
partition for agents and `sweep_limit` rows of sweeps and `RECONCILE_LIMIT`
reconciliation runs, whatever the table holds. The Error orders listed are the most
recently updated of those read, not of all Error orders past the cap.

Each section is read on its own: when one cannot be read, the others still show and the
snapshot names the missing one, because an operator page is most needed when something is
down.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final, TypeVar, cast

from shared.catalogue.running import workflow_of
from shared.domain.fairness import CustomerLoad
from shared.domain.health import AgentHealth, SweepRecord
from shared.domain.model import ProcessState, StateRecord
from shared.domain.reconcile import ReconcileRun
from shared.domain.rest_index import REST_STATES, RestEntry, RestPage, RestRange
from shared.domain.routing import STALE_AFTER
from shared.domain.workflow import Catalogue, Workflow
from shared.ports import HealthStore, ReconcileStore, StateStore
from shared.telemetry.logsafe import app_logger
from shared.usecases.flow.deps import ProcessDeps
from shared.usecases.operations.order_views import IN_FLIGHT, InFlight, in_flight

log = app_logger("orders.ops")

DEFAULT_COUNT_CAP: Final = 50
MAX_COUNT_CAP: Final = 1000
ERROR_LIMIT: Final = 20
SWEEP_LIMIT: Final = 10
RECENT_PER_STATE: Final = 5
RECONCILE_LIMIT: Final = 5
CUSTOMER_LIMIT: Final = 10

_T = TypeVar("_T")


@dataclass(frozen=True)
class StateCount:
    state: ProcessState
    count: int
    capped: bool
    """More orders may be in this state than `count` (display as `count+`)."""
    recent: tuple[str, ...]
    """Ids of the most recently updated orders among those read."""


@dataclass(frozen=True)
class AgentView:
    health: AgentHealth
    age: timedelta
    stale: bool


@dataclass(frozen=True)
class ErrorOrder:
    """An Error order as its rest entry shows it."""

    entry: RestEntry
    step: str
    """The name of the step it failed at (its index when the workflow is unknown)."""


@dataclass(frozen=True)
class WaitingOrder:
    """An order whose current step waits for the world: what for, and until when."""

    order_id: str
    process_state: ProcessState
    workflow: str
    workflow_version: int
    step: str
    event: str | None
    approval: bool
    complete_by: datetime | None


@dataclass(frozen=True)
class CustomerView:
    """The per-customer rules and the customers with the most open orders: one query of
    the customers' load rows (one per customer with open orders), never of the orders."""

    max_pending: int | None
    fair_share: int | None
    top: tuple[tuple[str, CustomerLoad], ...]


@dataclass(frozen=True)
class OperatorSnapshot:
    at: datetime
    count_cap: int
    counts: tuple[StateCount, ...]
    errors: tuple[ErrorOrder, ...]
    agents: tuple[AgentView, ...]
    sweeps: tuple[SweepRecord, ...]
    unavailable: tuple[str, ...]
    """Sections that could not be read this time: `orders`, `agents`, `sweeps`,
    `reconciliation`, `customers`."""
    reconciliation: tuple[ReconcileRun, ...] = ()
    """The last reconciliation runs, newest first."""
    waiting: tuple[WaitingOrder, ...] = ()
    """Processing orders whose current step is an event or timer wait, soonest complete-by
    first (from the rows the counts read: no extra query)."""
    customers: CustomerView | None = None
    """None when no customer rule is set (no count is kept) or it could not be read."""


async def operator_snapshot(
    deps: ProcessDeps,
    health: HealthStore,
    count_cap: int = DEFAULT_COUNT_CAP,
    error_limit: int = ERROR_LIMIT,
    sweep_limit: int = SWEEP_LIMIT,
    reconcile: ReconcileStore | None = None,
) -> OperatorSnapshot:
    """Never raises for an unavailable store: see the module docstring."""
    if not 1 <= count_cap <= MAX_COUNT_CAP:
        raise ValueError(f"count_cap must be from 1 to {MAX_COUNT_CAP}")
    orders, beats, sweeps, runs, customers = await asyncio.gather(
        _section("orders", _orders(deps.store, count_cap + 1)),
        _section("agents", health.agent_health()),
        _section("sweeps", health.recent_sweeps(sweep_limit)),
        _section("reconciliation", _runs(reconcile)),
        _section("customers", _customers(deps)),
    )
    now = deps.clock.now()
    counts: list[StateCount] = []
    errors: tuple[ErrorOrder, ...] = ()
    waiting: list[WaitingOrder] = []
    if orders is not None:
        moving, rests = orders
        counts.extend(_in_flight_counts(moving, count_cap))
        catalogue = deps.catalogue
        found = (waiting_order(catalogue, s) for s in moving.states)
        waiting.extend(w for w in found if w is not None)
        for state, page in zip(REST_STATES, rests, strict=True):
            newest = sorted(page.items, key=lambda e: e.updated_at, reverse=True)
            capped = len(page.items) > count_cap or page.continuation is not None
            recent = tuple(e.order_id for e in newest[:RECENT_PER_STATE])
            counts.append(StateCount(state, min(len(page.items), count_cap), capped, recent))
            if state is ProcessState.ERROR:
                errors = tuple(ErrorOrder(e, step_name(catalogue, e)) for e in newest)
                errors = errors[:error_limit]
            if state is ProcessState.SUSPENDED:
                held = (waiting_rest(catalogue, e) for e in page.items)
                waiting.extend(w for w in held if w is not None)
        order = {s: i for i, s in enumerate(ProcessState)}
        counts.sort(key=lambda c: order[c.state])
    agents = tuple(
        AgentView(h, age=now - h.heartbeat_at, stale=now - h.heartbeat_at > STALE_AFTER)
        for h in beats or ()
    )
    return OperatorSnapshot(
        at=now,
        count_cap=count_cap,
        counts=tuple(counts),
        errors=errors,
        agents=agents,
        sweeps=sweeps or (),
        unavailable=tuple(
            name
            for name, got in (
                ("orders", orders),
                ("agents", beats),
                ("sweeps", sweeps),
                ("reconciliation", runs),
                ("customers", customers if deps.customers is not None else ()),
            )
            if got is None
        ),
        reconciliation=runs or (),
        customers=customers or None,
        waiting=tuple(
            sorted(waiting, key=lambda w: (w.complete_by is None, w.complete_by or now))[
                :error_limit
            ]
        ),
    )


async def _orders(store: StateStore, size: int) -> tuple[InFlight, list[RestPage]]:
    """All reads run to the end (no orphaned task), then the first failure is raised."""
    moving, *rests = await asyncio.gather(
        in_flight(store, len(IN_FLIGHT) * size),
        *(store.rest_entries(RestRange(s), size, None) for s in REST_STATES),
        return_exceptions=True,
    )
    for got in (moving, *rests):
        if isinstance(got, BaseException):
            raise got
    return cast(InFlight, moving), cast(list[RestPage], rests)


def _in_flight_counts(moving: InFlight, cap: int) -> list[StateCount]:
    counts = []
    for state in IN_FLIGHT:
        found = sorted(
            (s for s in moving.states if s.process_state is state),
            key=lambda r: r.updated_at,
            reverse=True,
        )
        capped = len(found) > cap or moving.truncated
        recent = tuple(r.order_id for r in found[:RECENT_PER_STATE])
        counts.append(StateCount(state, min(len(found), cap), capped, recent))
    return counts


def waiting_order(catalogue: Catalogue, state: StateRecord) -> WaitingOrder | None:
    """An in-flight order read from its row, waiting until its complete-by."""
    return _waiting(
        state.order_id,
        state.process_state,
        workflow_of(catalogue, state),
        state.workflow,
        state.workflow_version,
        state.current_step,
        state.complete_by,
    )


def step_name(catalogue: Catalogue, entry: RestEntry) -> str:
    workflow = catalogue.get(entry.workflow, entry.workflow_version)
    if workflow is None or not 0 <= entry.current_step < len(workflow.steps):
        return str(entry.current_step)
    return workflow.steps[entry.current_step].name


def waiting_rest(catalogue: Catalogue, entry: RestEntry) -> WaitingOrder | None:
    """A Suspended order, from its rest entry: no complete-by runs while it is held."""
    return _waiting(
        entry.order_id,
        entry.state,
        catalogue.get(entry.workflow, entry.workflow_version),
        entry.workflow,
        entry.workflow_version,
        entry.current_step,
        None,
    )


def _waiting(
    order_id: str,
    state: ProcessState,
    workflow: Workflow | None,
    name: str,
    version: int,
    index: int,
    complete_by: datetime | None,
) -> WaitingOrder | None:
    if workflow is None or not 0 <= index < len(workflow.steps):
        return None
    definition = workflow.steps[index]
    if not definition.waits:
        return None
    return WaitingOrder(
        order_id,
        state,
        name,
        version,
        definition.name,
        definition.event,
        definition.approval,
        complete_by,
    )


async def _customers(deps: ProcessDeps) -> CustomerView | None:
    if deps.customers is None:
        return None
    policy = deps.customers.policy
    top = await deps.customers.top(CUSTOMER_LIMIT)
    return CustomerView(policy.max_pending, policy.fair_share, top)


async def _runs(reconcile: ReconcileStore | None) -> tuple[ReconcileRun, ...]:
    return () if reconcile is None else await reconcile.recent_runs(RECONCILE_LIMIT)


async def _section(name: str, reading: Awaitable[_T]) -> _T | None:
    try:
        return await reading
    except Exception as exc:  # an operator page reports every failure kind, like /health
        log.warning("ops page: %s unavailable (%s: %s)", name, type(exc).__name__, exc)
        return None
