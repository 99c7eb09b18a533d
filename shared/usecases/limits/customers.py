"""The customer ledger as the intake, the unit of work and the Supervisor use it: the
quota check and the line an order waits in at the intake, the count and the promotion of
the next in line when an order comes to rest (docs/fairness.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from shared.domain.fairness import (
    Admission,
    CustomerLoad,
    CustomerPolicy,
    RefusalMemo,
)
from shared.domain.machine.line import promotion
from shared.domain.model import Order, OrderProcess, Priority
from shared.ports import CustomerLedger, Entered, MessageBus, WatchedOrders, WatchList
from shared.telemetry.logsafe import app_logger

log = app_logger("orders.customers")


RECHECK = timedelta(seconds=30)
"""When the Supervisor looks at a promoted order: the shortest step timeout."""


@dataclass(frozen=True)
class Customers:
    ledger: CustomerLedger
    policy: CustomerPolicy
    recheck: timedelta = RECHECK
    """When the Supervisor looks at a promoted order: the shortest step timeout."""
    memo: RefusalMemo = field(default_factory=RefusalMemo, compare=False)
    """This instance's recent refusals (the intake's)."""

    def held(self, customer: str, at: datetime) -> CustomerLoad | None:
        """The customer's load if the ledger refused it a moment ago: refused again
        without a store call."""
        return self.memo.holds(customer, at)

    def come_back(self, customer: str, load: CustomerLoad, at: datetime) -> int:
        """Seconds a refused POST is told to wait (its Retry-After)."""
        return self.memo.come_back(customer, load, at)

    async def enter(self, order: Order, at: datetime) -> Entered:
        high = order.priority is Priority.HIGH
        entered = await self.ledger.enter(
            order.customer_id, order.order_id, at, self.policy, high=high
        )
        if entered.admission is Admission.REFUSE:
            self.memo.refused(order.customer_id, entered.load, at)
        return entered

    async def standing(self, process: OrderProcess) -> Admission | None:
        return await self.ledger.standing(process.order.customer_id, process.order_id)

    async def rejoin(self, process: OrderProcess, at: datetime) -> None:
        await self.ledger.rejoin(process.order.customer_id, process.order_id, at)

    async def rested(self, process: OrderProcess, store: WatchList, bus: MessageBus) -> None:
        await self.forget(process.order, store, bus, process.state.updated_at)

    async def forget(self, order: Order, store: WatchList, bus: MessageBus, at: datetime) -> None:
        """Off the count, and the next order in the customer's line nudged, its check
        moved up first (a claimed order's step must not wait for its hold to be checked).
        A crash in between leaves that order Pending and watched: its hold passing, or
        the earlier check, nudges it."""
        await self.release(order.customer_id, order.order_id, store, bus, at)

    async def release(
        self, customer: str, order_id: str, store: WatchList, bus: MessageBus, at: datetime
    ) -> None:
        """The order leaves its customer's count; the next in line, if it promotes one,
        is due within `recheck` and then nudged. Only moved up: its entry may already
        hold an earlier check (the intake's first look, when the promotion comes between
        the ledger entry and the create), which a plain write would push back."""
        promoted = await self.ledger.leave(customer, order_id, self.policy, at)
        self.memo.forget(customer)
        if promoted is None:
            return
        log.info("order %s: next in line for customer %s", promoted.order_id, customer)
        await store.move_up(promoted.order_id, at + self.recheck)
        await bus.send((promotion(promoted),))

    async def never_created(
        self, customer: str, order_id: str, store: WatchedOrders, bus: MessageBus, at: datetime
    ) -> None:
        """The Supervisor found no order behind a watch entry that names its customer: a
        crash between the count and the create left a count with nothing to end it, so
        it is given back here (and the next in line goes). If a retry of that intake
        created the order meanwhile, it is counted again, as running. Left: a retry that
        entered before this release and creates after this load runs uncounted, so its
        customer may run one order over its share while that order lives (never a count
        that stays behind)."""
        await self.release(customer, order_id, store, bus, at)
        found = await store.load(order_id)
        if found is not None and not found.state.process_state.is_at_rest:
            await self.ledger.rejoin(customer, order_id, at)

    async def top(self, limit: int) -> tuple[tuple[str, CustomerLoad], ...]:
        return await self.ledger.loads(limit)
