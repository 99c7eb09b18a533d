"""The customer ledger in memory (tests, tools): the same decisions as the table's."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import datetime

from shared.domain.fairness import (
    Admission,
    CustomerLoad,
    CustomerPolicy,
    Promoted,
    admit,
    promotes,
)
from shared.ports import Entered


@dataclass
class _Customer:
    running: dict[str, datetime] = field(default_factory=dict)
    waiting: dict[str, tuple[datetime, bool]] = field(default_factory=dict)
    """In arrival order (dicts keep insertion order): the head is promoted first; each
    with its lane."""
    paced: CustomerLoad = field(default_factory=CustomerLoad)
    """Only its pace and last end are read (the counts are the dicts')."""

    @property
    def load(self) -> CustomerLoad:
        return CustomerLoad(
            len(self.running), len(self.waiting), self.paced.pace, self.paced.left_at
        )


@dataclass
class InMemoryCustomerLedger:
    customers: dict[str, _Customer] = field(default_factory=dict)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def enter(
        self,
        customer: str,
        order_id: str,
        at: datetime,
        policy: CustomerPolicy,
        *,
        high: bool = False,
    ) -> Entered:
        async with self._lock:
            record = self.customers.setdefault(customer, _Customer())
            load = record.load
            if order_id in record.running:
                return Entered(Admission.RUN, load, known=True)
            if order_id in record.waiting:
                return Entered(Admission.WAIT, load, known=True)
            admission = admit(load, policy)
            if admission is Admission.RUN:
                record.running[order_id] = at
            elif admission is Admission.WAIT:
                record.waiting[order_id] = (at, high)
            elif not record.running and not record.waiting:
                del self.customers[customer]
            return Entered(admission, load)

    async def rejoin(self, customer: str, order_id: str, at: datetime) -> None:
        async with self._lock:
            record = self.customers.setdefault(customer, _Customer())
            record.waiting.pop(order_id, None)
            record.running.setdefault(order_id, at)

    async def leave(
        self, customer: str, order_id: str, policy: CustomerPolicy, at: datetime | None = None
    ) -> Promoted | None:
        async with self._lock:
            record = self.customers.get(customer)
            if record is None:
                return None
            was_running = record.running.pop(order_id, None) is not None
            was_waiting = record.waiting.pop(order_id, None) is not None
            if at is not None and (was_running or was_waiting):
                record.paced = record.paced.ended(at)
            promoted = None
            if was_running and promotes(record.load, policy):
                head = next(iter(record.waiting))
                since, high = record.waiting.pop(head)
                record.running[head] = since
                promoted = Promoted(head, high)
            if not record.running and not record.waiting:
                del self.customers[customer]
            return promoted

    async def standing(self, customer: str, order_id: str) -> Admission | None:
        record = self.customers.get(customer)
        if record is None:
            return None
        if order_id in record.running:
            return Admission.RUN
        return Admission.WAIT if order_id in record.waiting else None

    async def loads(self, limit: int) -> tuple[tuple[str, CustomerLoad], ...]:
        ranked = sorted(
            ((name, c.load) for name, c in self.customers.items()),
            key=lambda item: (-item[1].open, item[0]),
        )
        return tuple(ranked[:limit])
