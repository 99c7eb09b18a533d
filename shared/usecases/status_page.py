"""What the operator's status page shows: a bounded snapshot of orders, agents and sweeps.

The page refreshes every two seconds for as long as it is open, so a snapshot must cost
the same on a table of a thousand orders as on one of a hundred million. It therefore
never counts: per process state it reads one page of at most `count_cap + 1` state rows
(one server-filtered query each, all in parallel) and reports `count_cap+` when there
are more, or when the service stopped the page early. A refresh thus returns at most
`len(ProcessState) x (count_cap + 1)` rows, plus one small ops partition for agents and
`sweep_limit` rows of sweeps and `RECONCILE_LIMIT` reconciliation runs, whatever the
table holds. The Error orders listed are the
most recently updated of those read, not of all Error orders past the cap.

Each section is read on its own: when one cannot be read, the others still show and the
snapshot names the missing one, because a status page is most needed when something is
down.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final, TypeVar

from shared.catalogue.running import workflow_of
from shared.domain.fairness import CustomerLoad
from shared.domain.health import AgentHealth, SweepRecord
from shared.domain.model import ProcessState, StateRecord
from shared.domain.reconcile import ReconcileRun
from shared.domain.routing import STALE_AFTER
from shared.ports import HealthStore, Page, ReconcileStore
from shared.telemetry.logsafe import app_logger
from shared.usecases.deps import ProcessDeps

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
    state: StateRecord
    step: str
    """The name of the step it failed at (its index when the workflow is unknown)."""


@dataclass(frozen=True)
class WaitingOrder:
    """An order whose current step waits for the world: what for, and until when."""

    state: StateRecord
    step: str
    event: str | None
    approval: bool


@dataclass(frozen=True)
class CustomerView:
    """The per-customer rules and the customers with the most open orders: one query of
    the customers' load rows (one per customer with open orders), never of the orders."""

    max_pending: int | None
    fair_share: int | None
    top: tuple[tuple[str, CustomerLoad], ...]


@dataclass(frozen=True)
class OpsSnapshot:
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
    """Processing orders whose current step is an event or timer wait, soonest deadline
    first (from the rows the counts read: no extra query)."""
    customers: CustomerView | None = None
    """None when no customer rule is set (no count is kept) or it could not be read."""


async def ops_snapshot(
    deps: ProcessDeps,
    health: HealthStore,
    count_cap: int = DEFAULT_COUNT_CAP,
    error_limit: int = ERROR_LIMIT,
    sweep_limit: int = SWEEP_LIMIT,
    reconcile: ReconcileStore | None = None,
) -> OpsSnapshot:
    """Never raises for an unavailable store: see the module docstring."""
    if not 1 <= count_cap <= MAX_COUNT_CAP:
        raise ValueError(f"count_cap must be from 1 to {MAX_COUNT_CAP}")
    states = tuple(ProcessState)
    pages, beats, sweeps, runs, customers = await asyncio.gather(
        _section("orders", _first_pages(deps, states, count_cap + 1)),
        _section("agents", health.agent_health()),
        _section("sweeps", health.recent_sweeps(sweep_limit)),
        _section("reconciliation", _runs(reconcile)),
        _section("customers", _customers(deps)),
    )
    now = deps.clock.now()
    counts: list[StateCount] = []
    errors: tuple[ErrorOrder, ...] = ()
    waiting: list[WaitingOrder] = []
    for state, page in zip(states, pages or (), strict=False):
        newest = sorted(page.items, key=lambda r: r.updated_at, reverse=True)
        capped = len(page.items) > count_cap or page.continuation is not None
        counts.append(
            StateCount(
                state=state,
                count=min(len(page.items), count_cap),
                capped=capped,
                recent=tuple(r.order_id for r in newest[:RECENT_PER_STATE]),
            )
        )
        if state is ProcessState.ERROR:
            errors = tuple(ErrorOrder(r, step_name(r)) for r in newest[:error_limit])
        if state in (ProcessState.PROCESSING, ProcessState.SUSPENDED):
            waiting.extend(w for w in map(waiting_order, page.items) if w is not None)
    agents = tuple(
        AgentView(h, age=now - h.heartbeat_at, stale=now - h.heartbeat_at > STALE_AFTER)
        for h in beats or ()
    )
    return OpsSnapshot(
        at=now,
        count_cap=count_cap,
        counts=tuple(counts),
        errors=errors,
        agents=agents,
        sweeps=sweeps or (),
        unavailable=tuple(
            name
            for name, got in (
                ("orders", pages),
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
            sorted(waiting, key=lambda w: w.state.complete_by or w.state.updated_at)[:error_limit]
        ),
    )


def waiting_order(state: StateRecord) -> WaitingOrder | None:
    workflow = workflow_of(state)
    if workflow is None or not 0 <= state.current_step < len(workflow.steps):
        return None
    definition = workflow.steps[state.current_step]
    if not definition.waits:
        return None
    return WaitingOrder(state, definition.name, definition.event, definition.approval)


async def _customers(deps: ProcessDeps) -> CustomerView | None:
    if deps.customers is None:
        return None
    policy = deps.customers.policy
    top = await deps.customers.top(CUSTOMER_LIMIT)
    return CustomerView(policy.max_pending, policy.fair_share, top)


async def _runs(reconcile: ReconcileStore | None) -> tuple[ReconcileRun, ...]:
    return () if reconcile is None else await reconcile.recent_runs(RECONCILE_LIMIT)


def step_name(state: StateRecord) -> str:
    workflow = workflow_of(state)
    if workflow is None or not 0 <= state.current_step < len(workflow.steps):
        return str(state.current_step)
    return workflow.steps[state.current_step].name


async def _first_pages(
    deps: ProcessDeps, states: tuple[ProcessState, ...], size: int
) -> list[Page]:
    """All queries run to the end (no orphaned task), then the first failure is raised."""
    found = await asyncio.gather(
        *(deps.store.list_by_state(s, size, None) for s in states), return_exceptions=True
    )
    pages: list[Page] = []
    for page in found:
        if isinstance(page, BaseException):
            raise page
        pages.append(page)
    return pages


async def _section(name: str, reading: Awaitable[_T]) -> _T | None:
    try:
        return await reading
    except Exception as exc:  # a status page reports every failure kind, like /health
        log.warning("ops page: %s unavailable (%s: %s)", name, type(exc).__name__, exc)
        return None
