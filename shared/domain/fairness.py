"""Customers sharing the system: the intake quota and the fair share of running orders.

Both rules read one small record per customer (how many of its orders run, how many wait
in its line), so they are decided together here, purely, and kept by one ledger
(shared/usecases/limits/customers.py). The design and its cost: docs/fairness.md. What the
machine does with an order waiting in its line is in shared/domain/machine/line.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from enum import StrEnum

RETRY_AFTER_SECONDS = 5
"""Retry-After on a refused submission while none of the customer's open orders has
ended yet (nothing to go by): orders end in seconds, so a slot frees soon."""
RETRY_AFTER_BOUNDS = (1, 60)
"""A refused client comes back within a minute at the latest, and not in a busy loop."""
PACE_WEIGHT = 0.25
"""How much the latest gap between two of a customer's orders ending moves its pace: a
few ends make it, one odd gap does not."""


@dataclass(frozen=True)
class CustomerPolicy:
    max_pending: int | None = None
    """IntakeMaxPendingPerCustomer: orders not at rest per customer; None: no limit."""
    fair_share: int | None = None
    """FairShareRunningPerCustomer: orders of one customer running at once while more of
    its orders wait; None: off (every order is nudged as it arrives)."""

    @property
    def active(self) -> bool:
        """With neither rule set, no customer record is kept at all: zero cost."""
        return self.max_pending is not None or self.fair_share is not None


@dataclass(frozen=True)
class CustomerLoad:
    """One customer's orders that are not at rest, as its ledger record counts them."""

    running: int = 0
    waiting: int = 0
    pace: float | None = field(default=None, compare=False)
    """Seconds between two of its orders ending, lately (a moving average kept on the
    same record, so it costs no extra operation); None until one has ended."""
    left_at: datetime | None = field(default=None, compare=False)
    """When one of its orders last ended."""

    @property
    def open(self) -> int:
        return self.running + self.waiting

    def ended(self, at: datetime) -> CustomerLoad:
        """The pace once one more of its orders has ended at `at` (counts unchanged)."""
        pace = self.pace
        if self.left_at is not None:
            gap = max((at - self.left_at).total_seconds(), 0.0)
            pace = gap if pace is None else pace + PACE_WEIGHT * (gap - pace)
        return replace(self, pace=pace, left_at=max(at, self.left_at or at))


def _within_bounds(seconds: float) -> int:
    low, high = RETRY_AFTER_BOUNDS
    return min(max(math.ceil(seconds), low), high)


MEMO_AT_MOST = timedelta(seconds=1)
"""The longest an instance refuses a customer from memory after the ledger refused it."""
KEPT = 1024
"""Customers an instance remembers (refusals, come-back times) before it drops the ones
whose time has passed: each refused customer leaves one entry until it is next seen."""


@dataclass
class RefusalMemo:
    """What an instance remembers of its intake's refusals, so that one customer's burst
    against its quota costs little and comes back spread out.

    A customer the ledger just refused is refused again from memory for a moment, no
    store call: each refusal otherwise costs a watch entry, a ledger transaction and a
    delete on the shared store, and those hold the other customers' store calls up
    (bench/README.md, "A 5,000-order burst"). The moment is the customer's pace (a slot
    frees each time one of its orders ends), at most MEMO_AT_MOST; a leave by this
    instance forgets it at once.

    The refused are told to come back one after another: each Retry-After is one more
    pace past the last one this instance gave that customer, as a slot frees per pace.
    Telling every refused POST the same second brings them all back together, where one
    finds a slot and the rest are refused again (64 concurrent POSTs made ~50 refusals a
    second). Per instance: with k instances up to k come back per slot."""

    held: dict[str, tuple[datetime, CustomerLoad]] = field(default_factory=dict)
    booked: dict[str, datetime] = field(default_factory=dict)
    """Per customer, the latest time this instance told a refused POST to come back."""

    def holds(self, customer: str, now: datetime) -> CustomerLoad | None:
        found = self.held.get(customer)
        if found is None:
            return None
        if now >= found[0]:
            del self.held[customer]
            return None
        return found[1]

    def refused(self, customer: str, load: CustomerLoad, now: datetime) -> None:
        pace = MEMO_AT_MOST if load.pace is None else timedelta(seconds=load.pace)
        if len(self.held) >= KEPT:
            self.held = {c: h for c, h in self.held.items() if h[0] > now}
        self.held[customer] = (now + min(pace, MEMO_AT_MOST), load)

    def forget(self, customer: str) -> None:
        self.held.pop(customer, None)

    def come_back(self, customer: str, load: CustomerLoad, now: datetime) -> int:
        """The Retry-After for this refusal, in seconds (within RETRY_AFTER_BOUNDS): at its
        quota, a slot frees each time one of the customer's orders ends, so its recent
        pace of ends is the expected wait."""
        if load.pace is None:
            return RETRY_AFTER_SECONDS
        last = max(self.booked.get(customer, now), now)
        latest = now + timedelta(seconds=RETRY_AFTER_BOUNDS[1])
        at = min(last + timedelta(seconds=load.pace), latest)
        if len(self.booked) >= KEPT:
            self.booked = {c: t for c, t in self.booked.items() if t > now}
        self.booked[customer] = at
        return _within_bounds((at - now).total_seconds())


@dataclass(frozen=True)
class Promoted:
    """The order a leave moved from its customer's line to running, to be nudged."""

    order_id: str
    high: bool = False
    """On the high-priority lane, as it would have been nudged at its intake."""


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
