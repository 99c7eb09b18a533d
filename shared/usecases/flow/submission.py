"""The submission process: store the order and its state atomically, already claimed
when it may start at once (its first step's request in the outbox), else Pending with
a nudge to the Scheduler; then send the outbox."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime

from shared.domain.archive import ArchivedMark
from shared.domain.fairness import Admission, CustomerLoad
from shared.domain.machine.forward import start, start_claimed
from shared.domain.machine.line import in_line, wait_in_line
from shared.domain.machine.recovery import next_check, next_complete_by
from shared.domain.machine.transition import ProcessPolicy, Transition
from shared.domain.model import Order, OrderProcess, ProcessState
from shared.domain.workflow import Workflow
from shared.ports import AlreadyExists, Entered, WatchEntry
from shared.usecases.flow.deps import ProcessDeps
from shared.usecases.flow.unit_of_work import log_transition
from shared.usecases.limits.budget import Budget, send_within_budget, within_store_budget


class OrderConflict(Exception):
    """The order id is taken by an order with a different body."""


class OverQuota(Exception):
    """The customer already has IntakeMaxPendingPerCustomer orders that are not at rest;
    nothing was stored."""

    def __init__(self, customer: str, load: CustomerLoad, limit: int, retry_after: int) -> None:
        super().__init__(
            f"customer {customer!r} has {load.open} orders not yet finished (limit {limit})"
        )
        self.load = load
        self.limit = limit
        self.retry_after = retry_after


@dataclass(frozen=True)
class Submitted:
    order_id: str
    process_state: ProcessState
    created: bool
    process: OrderProcess | None
    """The stored order; None for a repeat of an archived one, of which only its mark is
    left in the table (`GET /api/orders/{id}` answers it from the archive)."""

    @classmethod
    def of(cls, process: OrderProcess, *, created: bool) -> Submitted:
        return cls(process.order_id, process.state.process_state, created, process)


async def submit_order(
    deps: ProcessDeps,
    order: Order,
    *,
    cause: str | None = None,
    workflow: Workflow | None = None,
    tolerate_bus_failure: bool = True,
    budget: Budget | None = None,
) -> Submitted:
    """Idempotent on the order id: the same body again gives the stored order back.

    The Supervisor's watch entry is written before the order so that an order can never
    exist unwatched: if what it sends is lost, the Supervisor sends a claimed order's
    outbox again at its first look (`first_look`), or nudges a Pending one when it has
    been Pending too long. With a `budget`, a send that is late is never an error.
    """
    if workflow is None:
        workflow = deps.catalogue.default_workflow()
    stored = await within_store_budget(_store(deps, order, cause, workflow), budget)
    process = stored.submitted.process
    if stored.send and process is not None:
        await send_within_budget(
            deps.bus.send(process.state.outbox),
            budget,
            process.order_id,
            tolerate_bus_failure=tolerate_bus_failure,
        )
    return stored.submitted


@dataclass(frozen=True)
class _Stored:
    submitted: Submitted
    send: bool
    """Whether its outbox is still to send: a new order, or a repeat of one still as the
    intake stored it (version 1), whose first try may have died before its sends."""


async def _store(deps: ProcessDeps, order: Order, cause: str | None, workflow: Workflow) -> _Stored:
    """The create is the existence check: a new order costs two writes and no read.

    A repeat of an order still running keeps the check time of the entry it finds; a
    repeat of a finished one has just watched it again, and takes that entry back; so
    does a repeat of an archived one, whose mark the create met (`_repeat_archived`).

    An entry this call did not write may be one a Supervisor has already read, due, with
    no order behind it (an earlier try's create failed), and is about to delete. So once
    the order exists it is re-watched before the answer: the Supervisor deletes only the
    entry as it read it (ETag), and it read it before it found the order missing, so
    before this create; the re-watch comes after the create, so either it lands first
    and the delete misses, or the delete lands first and the re-watch writes the entry
    again. An entry this call wrote itself is not due before `check_at`, far past the
    create, so no Supervisor has read it: a new order keeps its two writes.
    """
    with deps.intake_load.storing_one() as place:
        return await _store_counted(deps, order, cause, workflow, place)


async def _store_counted(
    deps: ProcessDeps, order: Order, cause: str | None, workflow: Workflow, place: int
) -> _Stored:
    now = deps.clock.now()
    pending = start(order, workflow, now, cause)
    claimed = await _claimed(deps, order, workflow, now, cause, place)
    transition = claimed or pending
    version = transition.process.state.version
    check_at = (
        first_look(claimed.process, deps.policy, now)
        if claimed is not None
        else next_check(pending.process, workflow, deps.policy, now)
    )
    assert check_at is not None
    customer = order.customer_id if deps.customers is not None else ""
    if deps.customers is not None and (held := deps.customers.held(customer, now)) is not None:
        return await _over_quota(deps, order, check_at, held)
    wrote = await deps.store.watch(
        order.order_id, check_at, replace=False, version=version, customer=customer
    )
    entered = await _enter(deps, order, now, wrote is not None, version)
    if entered is not None and entered.admission is Admission.REFUSE:
        return await _over_quota(deps, order, check_at, entered.load)
    waiting = entered is not None and entered.admission is Admission.WAIT
    if waiting:
        transition = pending  # its turn has not come: a promotion nudges it
    if entered is not None and waiting and not entered.known:
        transition = wait_in_line(transition, now)
    try:
        etag = await deps.store.create(transition.process, transition.history)
    except AlreadyExists:
        existing = await deps.store.load(order.order_id)
        if existing is None:
            return await _repeat_archived(deps, order, now, version)
        if existing.state.process_state.is_at_rest:
            if deps.customers is not None:  # counted just now, or stale
                await deps.customers.forget(order, deps.store, deps.bus, now)
            await deps.store.unwatch(order.order_id, existing.state.version)
        elif not wrote:
            await deps.store.rewatch(order.order_id, check_at, version=existing.state.version)
        return _repeat(existing, order, waiting)
    if waiting:
        await _hold(deps, order.order_id, check_at, wrote, transition, version)
    elif not wrote:
        await deps.store.rewatch(order.order_id, check_at, version=version)
    log_transition(transition)
    if deps.cache is not None:
        deps.cache.put(replace(transition.process, etag=etag))  # the next change skips a read
    return _Stored(Submitted.of(transition.process, created=True), send=True)


async def _hold(
    deps: ProcessDeps,
    order_id: str,
    check_at: datetime,
    wrote: str | None,
    transition: Transition,
    version: int,
) -> None:
    """An order in line is checked when its hold passes, not within a step timeout: it
    cannot be claimed before a promotion, which moves the check up again
    (usecases/limits/customers.py). That promotion may already have come, between the
    ledger entry and the create (its nudge then found no order): so the hold goes only
    onto the entry as this call wrote it, and a promotion's check written since stays.
    An entry this call found is left at its time (re-watched, as below): the
    Supervisor's check there finds the order still in line and moves it to the hold."""
    if wrote is None:
        await deps.store.rewatch(order_id, check_at, version=version)
        return
    hold = transition.process.state.complete_by or check_at
    await deps.store.reschedule(WatchEntry(order_id, check_at, wrote, version), hold)


async def _claimed(
    deps: ProcessDeps,
    order: Order,
    workflow: Workflow,
    now: datetime,
    cause: str | None,
    place: int,
) -> Transition | None:
    """The order claimed at intake, when the deps say so, it may start at once, and its
    place in a burst leaves its first step time enough (`IntakeLoad.admits`)."""
    if not deps.claim_at_intake:
        return None
    routing = await deps.current_routing()
    claimed = start_claimed(order, workflow, deps.policy, deps.instance_id, now, cause, routing)
    if claimed is None:
        return None
    complete_by = next_complete_by(claimed.process, deps.policy)
    assert complete_by is not None
    return claimed if deps.intake_load.admits(place, complete_by - now) else None


def first_look(process: OrderProcess, policy: ProcessPolicy, now: datetime) -> datetime:
    """When the Supervisor first looks at an order claimed at intake: halfway to its
    first complete-by, and within the Pending timeout (a look at a Pending order would come
    no later). If the intake died between its insert and its sends, the order is still
    as stored (version 1) and the Supervisor sends its outbox again
    (shared/usecases/flow/supervisor.py `_as_stored_by_intake`): the request reaches the agent
    with half its time left or more, and nothing counts against the order. A fault-free
    order has moved on long before, and is unwatched when it ends."""
    complete_by = next_complete_by(process, policy)
    assert complete_by is not None
    return now + min((complete_by - now) / 2, policy.pending_timeout)


async def _repeat_archived(deps: ProcessDeps, order: Order, now: datetime, version: int) -> _Stored:
    """The id is taken and no order is there: archived, its mark in the order's place.
    Its id is never free again, so a new order under it never sends the archived one's
    idempotency keys; a repeat is answered as one of the finished order it was. No mark
    either (the create met a row the load does not see): a store fault, to try again."""
    mark = await deps.store.archived(order.order_id)
    if mark is None:
        raise AlreadyExists(order.order_id)
    if deps.customers is not None:  # counted just now
        await deps.customers.forget(order, deps.store, deps.bus, now)
    await deps.store.unwatch(order.order_id, version)
    return _repeat_mark(mark, order)


def _repeat_mark(mark: ArchivedMark, order: Order) -> _Stored:
    if mark.fingerprint != order.fingerprint:
        raise OrderConflict(
            f"order {order.order_id} exists with a different body (finished and archived)"
        )
    return _Stored(Submitted(mark.order_id, mark.process_state, False, None), send=False)


async def _over_quota(
    deps: ProcessDeps, order: Order, check_at: datetime, load: CustomerLoad
) -> _Stored:
    """A repeat of an order that has come to rest is not counted any more: the stored
    order is the answer, as below the quota (one read, on refusals only). The entry this
    call wrote is gone already; one still in flight keeps its own. Only a refusal is
    given a time to come back (each one moves the next one's later)."""
    existing = await deps.store.load(order.order_id)
    if existing is None and (mark := await deps.store.archived(order.order_id)) is not None:
        return _repeat_mark(mark, order)
    if existing is None:
        customers = deps.customers
        assert customers is not None and customers.policy.max_pending is not None
        retry = customers.come_back(order.customer_id, load, deps.clock.now())
        raise OverQuota(order.customer_id, load, customers.policy.max_pending, retry)
    if not existing.state.process_state.is_at_rest:
        await deps.store.rewatch(order.order_id, check_at, version=existing.state.version)
    return _repeat(existing, order, in_line(existing))


async def _enter(
    deps: ProcessDeps, order: Order, now: datetime, wrote: bool, version: int
) -> Entered | None:
    """Counted before the create, so concurrent submissions cannot all pass the quota; a
    refusal takes back the entry this call wrote (nothing is stored). A crash between the
    count and the create leaves a watch entry with no order: docs/fairness.md."""
    if deps.customers is None:
        return None
    entered = await deps.customers.enter(order, now)
    if entered.admission is Admission.REFUSE and wrote:
        await deps.store.unwatch(order.order_id, version)
    return entered


def _repeat(existing: OrderProcess, order: Order, waiting: bool = False) -> _Stored:
    if existing.order.fingerprint != order.fingerprint:
        raise OrderConflict(f"order {order.order_id} exists with a different body")
    # As the intake stored it: the first submission may have died before its sends (a
    # nudge, or a claim's request); unless it waits in its customer's line, where a
    # promotion nudges it.
    send = existing.state.version == 1 and not waiting
    return _Stored(Submitted.of(existing, created=False), send=send)
