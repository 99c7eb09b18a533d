"""The Scheduler: claims Pending orders and walks their workflow as agents reply."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from shared.domain.machine.forward import apply_reply, claim
from shared.domain.machine.recovery import sooner_check, undelivered
from shared.domain.machine.transition import Transition
from shared.domain.machine.waits import wake
from shared.domain.messages import AgentReply
from shared.domain.model import OrderProcess
from shared.telemetry.logsafe import app_logger
from shared.usecases.flow.deps import ProcessDeps
from shared.usecases.flow.unit_of_work import Decide
from shared.usecases.limits.customers import RECHECK

log = app_logger("orders.scheduler")


class Handled(StrEnum):
    APPLIED = "applied"
    STALE = "stale"
    """Nothing to do: already claimed, an older attempt's reply, a duplicate."""
    UNKNOWN_ORDER = "unknown-order"
    UNKNOWN_STEP = "unknown-step"
    """A reply naming a step the order's workflow does not have: no retry can fix it."""


async def on_nudge(deps: ProcessDeps, order_id: str, message_id: str | None = None) -> Handled:
    """Claim the order (If-Match on the ETag read) and dispatch its next step."""
    routing = await deps.current_routing()

    def decide(process: OrderProcess) -> Transition | None:
        workflow = deps.find_workflow(process)
        if workflow is None:
            return None
        now = deps.clock.now()
        return claim(
            process, workflow, deps.policy, deps.instance_id, now, message_id, routing
        ) or wake(process, workflow, deps.policy, now, message_id, routing)

    return await _apply(deps, order_id, message_id, decide)


async def on_reply(deps: ProcessDeps, reply: AgentReply, message_id: str | None = None) -> Handled:
    """Accept an agent's reply only for the running step of the current attempt."""
    routing = await deps.current_routing()
    unknown_step = False

    def decide(process: OrderProcess) -> Transition | None:
        nonlocal unknown_step
        workflow = deps.find_workflow(process)
        if workflow is None:
            return None
        if workflow.index_of(reply.step) is None:
            unknown_step = True
            return None
        return apply_reply(
            process,
            workflow,
            deps.policy,
            reply,
            deps.clock.now(),
            message_id,
            routing,
        )

    handled = await _apply(deps, reply.order_id, message_id, decide)
    if unknown_step:
        return Handled.UNKNOWN_STEP
    if handled is Handled.STALE:
        log.info(
            "order %s stale reply ignored: %s %s attempt %d",
            reply.order_id,
            reply.step,
            reply.action.value,
            reply.attempt,
        )
    return handled


async def _apply(
    deps: ProcessDeps,
    order_id: str,
    message_id: str | None,
    decide: Decide,
) -> Handled:
    """Decide on the copy this instance last wrote when it has one, else on a read (the
    unit of work checks a kept copy's verdicts against the store), save, then send. A
    dispatch the bus refused is noted (shared/domain/machine/recovery.py:undelivered),
    so that its complete-by passing is not counted against the order. A change that
    may make the order due before its watch entry says moves the entry up
    (shared/domain/machine/recovery.py:sooner_check)."""
    cached = deps.cache.get(order_id) if deps.cache is not None else None

    def unsent(process: OrderProcess) -> Transition | None:
        return undelivered(process, deps.policy, deps.clock.now(), message_id)

    def sooner(read: OrderProcess, changed: OrderProcess) -> datetime | None:
        workflow = deps.find_workflow(changed)
        if workflow is None:
            return None
        recheck = deps.customers.recheck if deps.customers is not None else RECHECK
        return sooner_check(read, changed, workflow, deps.policy, deps.clock.now(), recheck)

    try:
        changed = await deps.work.change(
            order_id, decide, cause=message_id, cached=cached, unsent=unsent, sooner=sooner
        )
    except BaseException:
        _forget(deps, order_id)
        raise
    if changed is None:
        _forget(deps, order_id)
        return Handled.UNKNOWN_ORDER
    if changed.transition is None:
        _forget(deps, order_id)
        return Handled.STALE
    _remember(deps, changed.process, changed.transition)
    return Handled.APPLIED


def _remember(deps: ProcessDeps, stored: OrderProcess, transition: Transition) -> None:
    """A finished order gets no more replies (an operator's resubmit reads it afresh)."""
    if deps.cache is None:
        return
    if transition.is_at_rest:
        deps.cache.forget(stored.order_id)
    else:
        deps.cache.put(stored)


def _forget(deps: ProcessDeps, order_id: str) -> None:
    if deps.cache is not None:
        deps.cache.forget(order_id)
