"""Customers sharing the system: the intake quota and the fair share of running orders.

Both rules read one small record per customer (how many of its orders run, how many wait
in its line), so they are decided together here, purely, and kept by one ledger
(shared/usecases/customers.py). The design and its cost: docs/fairness.md.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum

from shared.domain.machine.transition import Transition
from shared.domain.messages import Nudge
from shared.domain.model import HistoryEntry, OrderProcess, Outgoing, ProcessState

HOLD = timedelta(minutes=10)
"""How long an order waits in its customer's line before the Supervisor nudges it anyway:
the safety net if the chain of promotions breaks (a crash between an order's end and the
nudge of the next in line). Long, because each expiry is a claim that skips the line."""

RETRY_AFTER_SECONDS = 5
"""Retry-After on a refused submission: orders end in seconds, so a slot frees soon."""


@dataclass(frozen=True)
class CustomerPolicy:
    max_pending: int | None = None
    """IntakeMaxPendingPerCustomer: orders not terminal per customer; None: no limit."""
    fair_share: int | None = None
    """FairShareRunningPerCustomer: orders of one customer running at once while more of
    its orders wait; None: off (every order is nudged as it arrives)."""

    @property
    def active(self) -> bool:
        """With neither rule set, no customer record is kept at all: zero cost."""
        return self.max_pending is not None or self.fair_share is not None


@dataclass(frozen=True)
class CustomerLoad:
    """One customer's orders that are not terminal, as its ledger record counts them."""

    running: int = 0
    waiting: int = 0

    @property
    def open(self) -> int:
        return self.running + self.waiting


class Admission(StrEnum):
    RUN = "run"
    """Nudged now, as without the ledger."""
    WAIT = "wait"
    """Stored and watched, not nudged: it joins the end of its customer's line."""
    REFUSE = "refuse"
    """Over the quota: nothing is stored."""


def admit(load: CustomerLoad, policy: CustomerPolicy) -> Admission:
    """A customer's new order: refused at its quota, in line behind its own waiting
    orders (first in, first out within a customer), run while under its fair share."""
    if policy.max_pending is not None and load.open >= policy.max_pending:
        return Admission.REFUSE
    if policy.fair_share is not None and (load.waiting > 0 or load.running >= policy.fair_share):
        return Admission.WAIT
    return Admission.RUN


def promotes(load: CustomerLoad, policy: CustomerPolicy) -> bool:
    """After one of its orders stopped running (`load` as left): does the next in line go?
    With the fair share turned off, the whole line goes, one promotion per ending order."""
    if load.waiting == 0:
        return False
    return policy.fair_share is None or load.running < policy.fair_share


def wait_in_line(transition: Transition, now: datetime, hold: timedelta = HOLD) -> Transition:
    """The submission's transition without its nudge: the order stays Pending until a
    promotion nudges it, or its hold passes and the Supervisor does (next_deadline reads
    a Pending order's complete_by)."""
    process = transition.process
    kept = tuple(m for m in transition.outgoing if not _is_nudge(m, process.order_id))
    state = replace(process.state, outbox=kept, complete_by=now + hold)
    note = HistoryEntry(
        at=now,
        event="waiting-for-fair-share",
        detail="behind this customer's running orders",
        process_state=state.process_state,
        failure_count=state.failure_count,
        attempt=state.attempt,
    )
    return replace(
        transition,
        process=replace(process, state=state),
        outgoing=kept,
        history=(*transition.history, note),
    )


def in_line(process: OrderProcess) -> bool:
    """Waiting in its customer's line: Pending with no nudge of its own in its outbox
    (every other Pending state keeps the nudge that will bring it to the Scheduler)."""
    state = process.state
    if state.process_state is not ProcessState.PENDING or state.complete_by is None:
        return False
    return not any(_is_nudge(m, process.order_id) for m in state.outbox)


def promotion(order_id: str) -> Outgoing:
    """The nudge of the next order in line. One id per order: a promotion repeated after a
    crash is dropped by the broker's duplicate detection."""
    message = Nudge(order_id, "fair-share").outgoing(0)
    return replace(message, message_id=f"nudge:{order_id}:fair-share")


def _is_nudge(message: Outgoing, order_id: str) -> bool:
    return message.message_id.startswith(f"nudge:{order_id}:")
