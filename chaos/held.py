"""Why each order a chaos run leaves in Error is there, so a reader of the report need
not dig through histories: the step and error code an operator groups it by
(shared/domain/failures.py, `GET /api/failures`), the alerts it raised, whether the plan
meant it, and what the providers hold in force for it.

Some Error is the product doing what it should: the plan gives express-delivery one
order whose notification the provider rejects for good, and a retriable step's
permanent failure is held in Error with an alert, never compensated (docs/catalogue.md,
step kinds). An operator's resubmit sends the step again under the same idempotency key,
which the provider answers with the rejection it keeps for that key, so that order is
still in Error after the resubmit. The invariants judge whether each Error is right;
this only says why it is there.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from chaos.config import failing_sku
from chaos.invariants import judge_steps, planned_failure
from chaos.model import Observations
from devhost.simulator.judge import in_force
from shared.domain.failures import failure_of
from shared.domain.model import ProcessState

RESUBMITTED = "resubmitted"
"""The history event of an operator's resubmit (`by {operator}`); the requeue it makes
notes the same event (`nudge at ...`), which is not a second resubmit."""


@dataclass(frozen=True)
class HeldOrder:
    """One order in Error at the end of a check."""

    order_id: str
    workflow: str
    step: str
    """The step (or, for a failed undo, the undo operation) it is held at."""
    error_code: str
    alerts: tuple[str, ...]
    """The reasons of the alerts raised for it over the run, each once, with how many."""
    planned: str | None
    """The plan's rejection for the order (`notifications rejects PERM-NOTIFICATIONS at
    notify-customer`); None: the plan meant it to go through."""
    as_planned: bool
    """It is held at the very step the plan made fail."""
    resubmits: int
    in_force: tuple[str, ...]
    """The steps in force at the providers for it, as the net-effect judge reads the
    ledger: what the customer has, whatever the order's record says."""


def left_in_error(obs: Observations) -> list[HeldOrder]:
    """The orders in Error, by order id."""
    alerts: dict[str, Counter[str]] = {}
    for alert in obs.alerts:
        alerts.setdefault(alert.order_id, Counter())[alert.reason] += 1
    held = sorted(
        (order_id, p)
        for order_id, p in obs.processes.items()
        if p.state.process_state is ProcessState.ERROR
    )
    found: list[HeldOrder] = []
    for order_id, process in held:
        workflow = obs.workflow_of(order_id)
        failure = failure_of(process.state, workflow)
        planned, as_planned = None, False
        order = obs.planned.get(order_id)
        service = order.failing_service if order is not None else None
        index = planned_failure(workflow, service, obs.decision(order_id))
        if index is not None:
            step = workflow.steps[index]
            why = f"{service} rejects {failing_sku(service)}" if service else "the reviewer rejects"
            planned, as_planned = f"{why} at {step.name}", step.name == failure.step
        entries = (e.ledger_entry for e in obs.effects if e.order_id == order_id)
        forced = in_force(entries, judge_steps(workflow)).get(order_id, [])
        found.append(
            HeldOrder(
                order_id,
                workflow.name,
                failure.step,
                failure.error_code,
                tuple(
                    reason if n == 1 else f"{reason} x{n}"
                    for reason, n in sorted(alerts.get(order_id, Counter()).items())
                ),
                planned,
                as_planned,
                sum(h.event == RESUBMITTED and h.detail.startswith("by ") for h in process.history),
                tuple(f"{f.step} at {f.service}" for f in forced),
            )
        )
    return found
