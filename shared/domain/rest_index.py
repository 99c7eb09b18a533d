"""The rest index: one entry per order at rest (Processed, Cancelled, Compensated, Error,
Suspended), where one range read finds the orders of a state, so a view of them costs
what it shows and never the size of the table (Table Storage has no secondary index).

In-flight orders need no entry: they are on the Supervisor's watch list, which holds
nothing else, so their views read it (docs/history.md). An order gets its entry when it
comes to rest, once, in the write before its watch entry goes; a fault-free order thus
pays one index write in all.

Keys: the state names the partition, and the row key is `{created day}|{order id}`, so
the orders of a state created on some days are one range, oldest first. Each entry
carries what the views show: the customer (the bulk filter, server-side inside the
partition), an Error order's failure count, last error and error group (step x code).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Final

from shared.domain.failures import failure_of
from shared.domain.model import OrderProcess, Phase, ProcessState, StateRecord
from shared.domain.workflow import Workflow

SEP: Final = "|"
END: Final = "~"
"""Sorts after every character of a day and an order id's first character."""

REST_STATES: Final = tuple(s for s in ProcessState if s.is_at_rest)


@dataclass(frozen=True)
class RestEntry:
    """An order at rest as its views show it."""

    order_id: str
    state: ProcessState
    version: int
    """The state version it was written for: a drop for a later change leaves a newer
    entry alone."""
    created_at: datetime
    updated_at: datetime
    customer_id: str
    workflow: str
    workflow_version: int
    current_step: int
    failure_count: int = 0
    last_error: str | None = None
    step: str | None = None
    """Error only, with `error_code`: the error group (shared/domain/failures.py)."""
    error_code: str | None = None
    phase: Phase = Phase.FORWARD
    attempt: int = 0
    locked_by: str | None = None
    complete_by: datetime | None = None

    @property
    def key(self) -> str:
        return row_key(self.created_at, self.order_id)

    def state_record(self) -> StateRecord:
        """The order's state as a listing shows it (GET /api/orders?state=), read from
        the entry alone: an order at rest does not change until it leaves, and then its
        entry goes. No outbox or events: a listing never shows them."""
        return StateRecord(
            order_id=self.order_id,
            process_state=self.state,
            locked_by=self.locked_by,
            complete_by=self.complete_by,
            failure_count=self.failure_count,
            attempt=self.attempt,
            phase=self.phase,
            current_step=self.current_step,
            last_error=self.last_error,
            version=self.version,
            created_at=self.created_at,
            updated_at=self.updated_at,
            workflow=self.workflow,
            workflow_version=self.workflow_version,
        )


def rest_entry(process: OrderProcess, workflow: Workflow | None) -> RestEntry:
    """`workflow`: the one the order runs on (None when the catalogue lost it)."""
    state = process.state
    if not state.process_state.is_at_rest:
        raise ValueError(f"order {state.order_id} is {state.process_state.value}, not at rest")
    step = code = None
    if state.process_state is ProcessState.ERROR:
        failure = failure_of(state, workflow)
        step, code = failure.step, failure.error_code
    return RestEntry(
        order_id=state.order_id,
        state=state.process_state,
        version=state.version,
        created_at=state.created_at,
        updated_at=state.updated_at,
        customer_id=process.order.customer_id,
        workflow=state.workflow,
        workflow_version=state.workflow_version,
        current_step=state.current_step,
        failure_count=state.failure_count,
        last_error=state.last_error,
        step=step,
        error_code=code,
        phase=state.phase,
        attempt=state.attempt,
        locked_by=state.locked_by,
        complete_by=state.complete_by,
    )


def day_of(at: datetime) -> str:
    return f"{at.year:04d}{at.month:02d}{at.day:02d}"


def row_key(created_at: datetime, order_id: str) -> str:
    return f"{day_of(created_at)}{SEP}{order_id}"


@dataclass(frozen=True)
class RestRange:
    """The entries of one rest state, of one customer or any, created on the days that
    overlap [created_from, created_to): whole days, so a caller still checks the
    instants at the ends."""

    state: ProcessState
    customer_id: str | None = None
    created_from: datetime | None = None
    created_to: datetime | None = None
    changed_since: datetime | None = None
    """Only entries of orders come to rest at or after this instant (a property filter,
    like the customer's)."""
    changed_before: datetime | None = None
    """Only entries of orders come to rest before this instant (the archive's cutoff)."""

    @property
    def lo(self) -> str:
        return day_of(self.created_from) if self.created_from else ""

    @property
    def hi(self) -> str:
        return (day_of(self.created_to) + SEP + END) if self.created_to else END

    def start(self, cursor: str | None) -> tuple[str, bool]:
        """Where a read goes on: the key and whether it is read too (the range's start)
        or only what follows it (`cursor`, a key this range handed out)."""
        if cursor is None:
            return self.lo, True
        if not self.lo <= cursor < self.hi:
            raise ValueError("invalid continuation token")
        return cursor, False

    def holds(self, entry: RestEntry) -> bool:
        return (
            entry.state is self.state
            and (self.customer_id is None or entry.customer_id == self.customer_id)
            and (self.changed_since is None or entry.updated_at >= self.changed_since)
            and (self.changed_before is None or entry.updated_at < self.changed_before)
            and self.lo <= entry.key < self.hi
        )


@dataclass(frozen=True)
class RestPage:
    items: tuple[RestEntry, ...]
    continuation: str | None
    """The last key handed out, when the page is full: there may be more."""
