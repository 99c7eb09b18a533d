"""The Scheduler: claims Pending orders and walks their workflow as agents reply."""

from __future__ import annotations

import logging
from collections.abc import Callable
from enum import StrEnum

from shared.domain import process as machine
from shared.domain.messages import AgentReply
from shared.domain.model import OrderProcess
from shared.domain.process import Transition
from shared.ports import BusUnavailable, ConcurrencyConflict, StateStoreError
from shared.usecases.commit import commit, log_transition
from shared.usecases.deps import ProcessDeps

log = logging.getLogger("orders.scheduler")

MAX_RACES = 5


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
        return machine.claim(
            process, workflow, deps.policy, deps.instance_id, now, message_id, routing
        ) or machine.wake(process, workflow, deps.policy, now, message_id, routing)

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
        return machine.apply_reply(
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
    decide: Callable[[OrderProcess], Transition | None],
) -> Handled:
    """Decide on the copy this instance last wrote when it has one, else on a read. A
    kept copy is never taken at its word: its transition is saved on its ETag (a lost
    race forgets it), and nothing to do on it is checked against a fresh read."""
    process = deps.cache.get(order_id) if deps.cache is not None else None
    fresh = process is None
    races = 0
    while races < MAX_RACES:
        if process is None:
            process, fresh = await deps.store.load(order_id), True
            if process is None:
                return Handled.UNKNOWN_ORDER
        transition = decide(process)
        if transition is None:
            if not fresh:
                process = None
                continue
            if message_id is not None and process.state.outbox_cause == message_id:
                # A redelivery of the message that made this state: its sends may be lost.
                await deps.bus.send(process.state.outbox)
            return Handled.STALE
        try:
            stored = await commit(deps, transition)
        except ConcurrencyConflict:
            _forget(deps, order_id)
            races += int(fresh)
            process = None
            continue
        except BusUnavailable:
            _forget(deps, order_id)
            await _undelivered(deps, transition, message_id)
            raise
        except BaseException:
            _forget(deps, order_id)
            raise
        _remember(deps, stored, transition)
        return Handled.APPLIED
    raise ConcurrencyConflict(f"order {order_id}: lost {MAX_RACES} races in a row")


def _remember(deps: ProcessDeps, stored: OrderProcess, transition: Transition) -> None:
    """A finished order gets no more replies (an operator's resubmit reads it afresh)."""
    if deps.cache is None:
        return
    if transition.is_terminal:
        deps.cache.forget(stored.order_id)
    else:
        deps.cache.put(stored)


def _forget(deps: ProcessDeps, order_id: str) -> None:
    if deps.cache is not None:
        deps.cache.forget(order_id)


async def _undelivered(deps: ProcessDeps, sent: Transition, message_id: str | None) -> None:
    """The transition is stored but its dispatch may not have gone out: note it, so the
    step's complete-by passing is not counted against the order. Best effort: if this
    fails too, the Supervisor counts one timeout, as after a crash."""
    try:
        process = await deps.store.load(sent.process.order_id)
        if process is None or process.state.version != sent.process.state.version:
            return  # not stored, or already moved on (an answer came, so it was sent)
        transition = machine.undelivered(process, deps.policy, deps.clock.now(), message_id)
        if transition is None:
            return
        await deps.store.save(transition.process, transition.history)
        log_transition(transition)
    except StateStoreError as exc:
        log.warning(
            "order %s: undelivered dispatch not noted (%s: %s)",
            sent.process.order_id,
            type(exc).__name__,
            exc,
        )
