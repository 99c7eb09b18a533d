"""The customer ledger as the intake, the unit of work and the Supervisor use it: the
quota check and the line an order waits in at the intake, the count and the promotion of
the next in line when an order comes to rest (docs/fairness.md)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from shared.domain.fairness import CustomerLoad, CustomerPolicy, promotion
from shared.domain.model import Order, OrderProcess
from shared.ports import CustomerLedger, Entered, MessageBus, StateStore

log = logging.getLogger("orders.customers")


@dataclass(frozen=True)
class Customers:
    ledger: CustomerLedger
    policy: CustomerPolicy
    recheck: timedelta = timedelta(seconds=30)
    """When the Supervisor looks at a promoted order: the shortest step timeout."""

    async def enter(self, order: Order, at: datetime) -> Entered:
        return await self.ledger.enter(order.customer_id, order.order_id, at, self.policy)

    async def rejoin(self, process: OrderProcess, at: datetime) -> None:
        await self.ledger.rejoin(process.order.customer_id, process.order_id, at)

    async def rested(self, process: OrderProcess, store: StateStore, bus: MessageBus) -> None:
        await self.forget(process.order, store, bus, process.state.updated_at)

    async def forget(self, order: Order, store: StateStore, bus: MessageBus, at: datetime) -> None:
        """Off the count, and the next order in the customer's line nudged, its check
        moved up first (a claimed order's step must not wait for its hold to be checked).
        A crash in between leaves that order Pending and watched: its hold passing, or
        the earlier check, nudges it."""
        promoted = await self.ledger.leave(order.customer_id, order.order_id, self.policy)
        if promoted is None:
            return
        log.info("order %s: next in line for customer %s", promoted, order.customer_id)
        await store.watch(promoted, at + self.recheck, replace=True)
        await bus.send((promotion(promoted),))

    async def top(self, limit: int) -> tuple[tuple[str, CustomerLoad], ...]:
        return await self.ledger.loads(limit)
