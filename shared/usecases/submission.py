"""The submission process: store the order and its state atomically, then nudge the Scheduler."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from dataclasses import dataclass

from shared.domain import process as machine
from shared.domain.model import Order, OrderProcess
from shared.domain.workflow import ORDER_FULFILMENT, Workflow
from shared.ports import AlreadyExists, BusUnavailable, StoreUnavailable
from shared.usecases.commit import log_transition
from shared.usecases.deps import ProcessDeps

log = logging.getLogger("orders.submission")


class OrderConflict(Exception):
    """The order id is taken by an order with a different body."""


@dataclass(frozen=True)
class Submitted:
    process: OrderProcess
    created: bool


@dataclass(frozen=True)
class Budget:
    """How long a caller that must answer soon (HTTP intake) waits, in seconds.

    `store`: for the store's reads and writes; past it the submission fails with
    StoreUnavailable (the order may or may not be stored: the same body again is safe).
    `nudge`: for the Scheduler's nudge once the order is stored; past it the submission
    returns and the send goes on in the background. The order is on the Supervisor's
    watch list, so if that send fails too the Supervisor nudges it when it has been
    Pending too long.
    """

    store: float
    nudge: float


async def submit_order(
    deps: ProcessDeps,
    order: Order,
    *,
    cause: str | None = None,
    workflow: Workflow = ORDER_FULFILMENT,
    tolerate_bus_failure: bool = True,
    budget: Budget | None = None,
) -> Submitted:
    """Idempotent on the order id: the same body again gives the stored order back.

    The Supervisor's watch entry is written before the order so that an order can never
    exist unwatched: if the nudge is lost, the Supervisor nudges it again when it has
    been Pending too long. With a `budget`, a nudge that is late is never an error.
    """
    store_wait = budget.store if budget is not None else None
    try:
        async with asyncio.timeout(store_wait) as deadline:
            stored = await _store(deps, order, cause, workflow)
    except TimeoutError:
        if not deadline.expired():
            raise
        raise StoreUnavailable(f"no answer within {store_wait:g} s") from None
    if stored.nudge:
        nudge_wait = budget.nudge if budget is not None else None
        await _send(deps, stored.submitted.process, tolerate_bus_failure, nudge_wait)
    return stored.submitted


@dataclass(frozen=True)
class _Stored:
    submitted: Submitted
    nudge: bool
    """Whether the Scheduler still needs a nudge for it (a new order, or one never claimed)."""


async def _store(deps: ProcessDeps, order: Order, cause: str | None, workflow: Workflow) -> _Stored:
    existing = await deps.store.load(order.order_id)
    if existing is not None:
        return _repeat(existing, order)
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
        return _repeat(raced, order)
    log_transition(transition)
    return _Stored(Submitted(transition.process, created=True), nudge=True)


def _repeat(existing: OrderProcess, order: Order) -> _Stored:
    if existing.order.fingerprint != order.fingerprint:
        raise OrderConflict(f"order {order.order_id} exists with a different body")
    # Never claimed yet: the first submission may have died before its nudge went out.
    return _Stored(Submitted(existing, created=False), nudge=existing.state.version == 1)


_sending: set[asyncio.Task[None]] = set()
"""Nudges still going after their caller stopped waiting, referenced until done."""


async def _send(
    deps: ProcessDeps, process: OrderProcess, tolerate_bus_failure: bool, wait: float | None
) -> None:
    """With `wait`, the caller waits that long and no longer: the send goes on without it
    (a link that takes long to open is not opened twice) and a failure is only logged."""
    send: Awaitable[None] = deps.bus.send(process.state.outbox)
    try:
        if wait is None:
            await send
            return
        task = asyncio.ensure_future(send)
        try:
            await asyncio.wait_for(asyncio.shield(task), wait)
        except TimeoutError:
            _sending.add(task)
            task.add_done_callback(lambda done: _sent_late(done, process.order_id))
    except BusUnavailable as exc:
        if not tolerate_bus_failure:
            raise
        _log_unsent(process.order_id, exc)


def _sent_late(task: asyncio.Task[None], order_id: str) -> None:
    _sending.discard(task)
    if task.cancelled():
        return
    exc = task.exception()
    if isinstance(exc, BusUnavailable):
        _log_unsent(order_id, exc)
    elif exc is not None:
        log.error("order %s: its nudge failed", order_id, exc_info=exc)


def _log_unsent(order_id: str, exc: BusUnavailable) -> None:
    log.warning(
        "order %s stored but its nudge was not sent (%s); the Supervisor will nudge it",
        order_id,
        exc,
    )
