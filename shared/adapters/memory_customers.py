"""The customer ledger in memory (tests, tools): the same decisions as the table's."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import datetime

from shared.domain.fairness import Admission, CustomerLoad, CustomerPolicy, admit, promotes
from shared.ports import Entered


@dataclass
class _Customer:
    running: dict[str, datetime] = field(default_factory=dict)
    waiting: dict[str, datetime] = field(default_factory=dict)
    """In arrival order (dicts keep insertion order): the head is promoted first."""

    @property
    def load(self) -> CustomerLoad:
        return CustomerLoad(len(self.running), len(self.waiting))


@dataclass
class InMemoryCustomerLedger:
    customers: dict[str, _Customer] = field(default_factory=dict)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def enter(
        self, customer: str, order_id: str, at: datetime, policy: CustomerPolicy
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
                record.waiting[order_id] = at
            return Entered(admission, load)

    async def rejoin(self, customer: str, order_id: str, at: datetime) -> None:
        async with self._lock:
            record = self.customers.setdefault(customer, _Customer())
            record.waiting.pop(order_id, None)
            record.running.setdefault(order_id, at)

    async def leave(self, customer: str, order_id: str, policy: CustomerPolicy) -> str | None:
        async with self._lock:
            record = self.customers.get(customer)
            if record is None:
                return None
            was_running = record.running.pop(order_id, None) is not None
            record.waiting.pop(order_id, None)
            promoted = None
            if was_running and promotes(record.load, policy):
                promoted = next(iter(record.waiting))
                record.running[promoted] = record.waiting.pop(promoted)
            if not record.running and not record.waiting:
                del self.customers[customer]
            return promoted

    async def loads(self, limit: int) -> tuple[tuple[str, CustomerLoad], ...]:
        ranked = sorted(
            ((name, c.load) for name, c in self.customers.items()),
            key=lambda item: (-item[1].open, item[0]),
        )
        return tuple(ranked[:limit])
