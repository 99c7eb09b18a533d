"""The submission process: store the order and its state atomically, then nudge the Scheduler."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from shared.domain import process as machine
from shared.domain.model import Order, OrderProcess
from shared.domain.workflow import ORDER_FULFILMENT, Workflow
from shared.ports import AlreadyExists, BusUnavailable
from shared.usecases.commit import log_transition
from shared.usecases.deps import ProcessDeps

log = logging.getLogger("orders.submission")


class OrderConflict(Exception):
    """The order id is taken by an order with a different body."""


@dataclass(frozen=True)
class Submitted:
    process: OrderProcess
    created: bool


async def submit_order(
    deps: ProcessDeps,
    order: Order,
    *,
    cause: str | None = None,
    workflow: Workflow = ORDER_FULFILMENT,
    tolerate_bus_failure: bool = True,
) -> Submitted:
    """Idempotent on the order id: the same body again gives the stored order back.

    The Supervisor's watch entry is written before the order so that an order can never
    exist unwatched: if the nudge is lost, the Supervisor nudges it again when it has
    been Pending too long.
    """
    existing = await deps.store.load(order.order_id)
    if existing is not None:
        return await _repeat(deps, existing, order, tolerate_bus_failure)
    now = deps.clock.now()
    transition = machine.start(order, workflow, now, cause)
    check_at = machine.next_check(transition.process, workflow, deps.policy, now)
    assert check_at is not None
    await deps.store.watch(
        order.order_id, check_at, replace=False, version=transition.process.state.version
    )
    try:
        await deps.store.create(transition.process, transition.history)
    except AlreadyExists:
        raced = await deps.store.load(order.order_id)
        if raced is None:
            raise
        return await _repeat(deps, raced, order, tolerate_bus_failure)
    log_transition(transition)
    await _send(deps, transition.process, tolerate_bus_failure)
    return Submitted(transition.process, created=True)


async def _repeat(
    deps: ProcessDeps, existing: OrderProcess, order: Order, tolerate_bus_failure: bool
) -> Submitted:
    if existing.order.fingerprint != order.fingerprint:
        raise OrderConflict(f"order {order.order_id} exists with a different body")
    if existing.state.version == 1:
        # Never claimed yet: the first submission may have died before its nudge went out.
        await _send(deps, existing, tolerate_bus_failure)
    return Submitted(existing, created=False)


async def _send(deps: ProcessDeps, process: OrderProcess, tolerate_bus_failure: bool) -> None:
    try:
        await deps.bus.send(process.state.outbox)
    except BusUnavailable as exc:
        if not tolerate_bus_failure:
            raise
        log.warning(
            "order %s stored but its nudge was not sent (%s); the Supervisor will nudge it",
            process.order_id,
            exc,
        )
