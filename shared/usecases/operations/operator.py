"""What operators and clients ask of an order: inspect, list, resubmit, cancel, suspend,
resume, migrate to another workflow version, health."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from shared.catalogue.running import workflow_of
from shared.domain import continuation as tokens
from shared.domain.machine.migrate import migrate
from shared.domain.machine.operator import cancel, resubmit, resume, suspend
from shared.domain.machine.recovery import next_check
from shared.domain.machine.transition import InvalidTransition, Transition
from shared.domain.model import OrderProcess, ProcessState
from shared.ports import ConcurrencyConflict, Page
from shared.usecases.flow.deps import ProcessDeps
from shared.usecases.flow.unit_of_work import MAX_RACES, Decide
from shared.usecases.limits.budget import Budget
from shared.usecases.operations.order_views import orders_in

RESUBMIT_CAUSE = "operator-resubmit"
CANCEL_CAUSE = "operator-cancel"
SUSPEND_CAUSE = "operator-suspend"
RESUME_CAUSE = "operator-resume"
MIGRATE_CAUSE = "operator-migrate"


class OrderNotFound(LookupError):
    """No order with this id."""


async def inspect_order(deps: ProcessDeps, order_id: str) -> OrderProcess:
    process = await deps.store.load(order_id)
    if process is None:
        raise OrderNotFound(order_id)
    return replace(process, history=await deps.store.history(order_id))


async def list_orders(
    deps: ProcessDeps, state: ProcessState | None, page_size: int, continuation: str | None
) -> Page:
    """A page of `GET /api/orders`, its continuation the API's token for this listing
    (every order, or one state's): a token from another listing, or junk, raises
    InvalidContinuation instead of reading a page from wherever it points."""
    listing = f"orders:{state.value}" if state else "orders"
    cursor = tokens.unwrap(continuation, listing)
    page = await orders_in(deps.store, state, page_size, cursor)
    return replace(page, continuation=tokens.wrap(listing, page.continuation))


async def resubmit_order(
    deps: ProcessDeps, order_id: str, operator: str, *, budget: Budget | None = None
) -> OrderProcess:
    """Error back to Pending at the failed step with FailureCount reset.

    Idempotent: asked again before the Scheduler has claimed the order, it sends the
    nudge again and answers as before. Raises InvalidTransition in any other state.
    """
    now = deps.clock.now()

    def decide(process: OrderProcess) -> Transition | None:
        state = process.state
        if state.process_state is ProcessState.PENDING and state.outbox_cause == RESUBMIT_CAUSE:
            return None  # a retried resubmit: the first stored it, and may have lost its nudge
        workflow = deps.find_workflow(process)  # None: held for its version gone
        return resubmit(process, deps.policy, now, operator, RESUBMIT_CAUSE, workflow)

    try:
        return await operate(deps, order_id, RESUBMIT_CAUSE, decide, budget, races=1)
    except ConcurrencyConflict:
        raise InvalidTransition(
            f"order {order_id} changed while it was being resubmitted"
        ) from None


async def cancel_order(
    deps: ProcessDeps,
    order_id: str,
    operator: str,
    reason: str | None = None,
    *,
    budget: Budget | None = None,
) -> OrderProcess:
    """Stop the order and undo whatever may have taken effect; it ends Cancelled.

    Idempotent: asked again while it is being cancelled, it changes nothing. Raises
    InvalidTransition once the order is Processed, Compensated or Cancelled.
    """
    now = deps.clock.now()
    return await operate(
        deps,
        order_id,
        CANCEL_CAUSE,
        lambda p: cancel(p, deps.workflow(p), deps.policy, now, operator, reason, CANCEL_CAUSE),
        budget,
    )


async def suspend_order(
    deps: ProcessDeps, order_id: str, operator: str, *, budget: Budget | None = None
) -> OrderProcess:
    """Stop dispatching and stop the deadlines; the order leaves the watch list (the
    commit unwatches it), so the Supervisor cannot count a failure against it."""
    now = deps.clock.now()
    return await operate(
        deps,
        order_id,
        SUSPEND_CAUSE,
        lambda p: suspend(p, now, operator, SUSPEND_CAUSE),
        budget,
    )


async def resume_order(
    deps: ProcessDeps, order_id: str, operator: str, *, budget: Budget | None = None
) -> OrderProcess:
    """Continue a Suspended order with fresh deadlines. Asked again before the Scheduler
    has claimed it, it sends the nudge again; otherwise it is InvalidTransition."""
    now = deps.clock.now()

    def decide(process: OrderProcess) -> Transition | None:
        state = process.state
        if state.process_state is not ProcessState.SUSPENDED and state.outbox_cause == RESUME_CAUSE:
            return None
        return resume(process, deps.policy, now, operator, RESUME_CAUSE)

    return await operate(deps, order_id, RESUME_CAUSE, decide, budget)


async def migrate_order(
    deps: ProcessDeps,
    order_id: str,
    operator: str,
    to_version: int,
    *,
    budget: Budget | None = None,
) -> OrderProcess:
    """Move the order to `to_version` of its workflow; it runs to its end there. Sends
    nothing: the order continues as it was (its running step's answer, its nudge, the
    Supervisor's watch), then on the new version's steps.

    Raises InvalidTransition when the order is final, its version or the target is not
    in the catalogue, and IncompatibleVersions when its steps done so far are not the
    same in both versions. Asked again once it is there, it changes nothing.
    """
    now = deps.clock.now()

    def decide(process: OrderProcess) -> Transition | None:
        state = process.state
        if state.workflow_version == to_version and not state.process_state.is_final:
            return None
        target = deps.catalogue.get(state.workflow, to_version)
        if target is None:
            raise InvalidTransition(f"{state.workflow} has no v{to_version} in the catalogue")
        source = workflow_of(deps.catalogue, state)
        if source is None:
            raise InvalidTransition(
                f"order {order_id} runs on {state.workflow} v{state.workflow_version}, "
                "which the catalogue no longer keeps"
            )
        return migrate(process, source, target, now, operator, MIGRATE_CAUSE)

    return await operate(deps, order_id, MIGRATE_CAUSE, decide, budget)


async def operate(
    deps: ProcessDeps,
    order_id: str,
    cause: str,
    decide: Decide,
    budget: Budget | None,
    *,
    races: int = MAX_RACES,
) -> OrderProcess:
    """The unit of work's change within `budget`, with the Supervisor's next check moved
    to what the changed order needs (a resumed order is watched before it is saved).
    None from `decide` means nothing to change. Without a budget a BusUnavailable is
    raised once the change is stored (the Supervisor sends what it decided). An order
    whose workflow version left the catalogue is refused (UnknownWorkflow, `version-gone`)
    before `decide` runs, also where the action would change nothing, so every action
    answers such an order alike."""
    now = deps.clock.now()

    def decide_known(process: OrderProcess) -> Transition | None:
        deps.workflow(process)
        return decide(process)

    def check_at(changed: OrderProcess) -> datetime | None:
        return next_check(changed, deps.workflow(changed), deps.policy, now)

    changed = await deps.work.change(
        order_id, decide_known, cause=cause, check_at=check_at, races=races, budget=budget
    )
    if changed is None:
        raise OrderNotFound(order_id)
    return changed.process
