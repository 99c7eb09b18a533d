"""Holds: a step whose call waits for a limit gets its complete-by restarted from when
the call can start (domain/machine/hold.py), written like a step heartbeat through the
unit of work: 1 point read + 1 conditional write, no message.

Only a wait that would leave the call less than half of the time it arrived with is
written (`room`); shorter waits cost nothing, and a call that is held again and again
pays one write per half of its step's timeout at most.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from shared.catalogue.running import workflow_of
from shared.domain.messages import AgentRequest
from shared.domain.model import Action, OrderProcess
from shared.domain.process import ProcessPolicy, Transition, restart_complete_by
from shared.ports import Clock, ConcurrencyConflict, StateStoreError
from shared.telemetry.logsafe import app_logger
from shared.usecases.step_heartbeat import KnownDeadline
from shared.usecases.unit_of_work import UnitOfWork

log = app_logger("orders.agent")


@dataclass(frozen=True)
class StepHolds:
    work: UnitOfWork
    clock: Clock
    policy: ProcessPolicy

    def for_request(self, request: AgentRequest, known: KnownDeadline) -> HeldCall | None:
        """Only a do is held; an undo's timeout counts no failure against the order."""
        if request.action is not Action.DO:
            return None
        room = (request.complete_by - self.clock.now()) / 2
        return HeldCall(self, request, known, room)

    async def hold(self, request: AgentRequest, start: datetime) -> datetime | None:
        """Restart the step's complete-by from `start`; the stored complete-by, or None
        when it may not be (fenced, past it already, at the cap, or the store down)."""

        def decide(process: OrderProcess) -> Transition | None:
            workflow = workflow_of(process.state)
            index = None if workflow is None else workflow.index_of(request.step)
            if workflow is None or index is None:
                return None
            definition = workflow.steps[index]
            budget = self.policy.timeout(definition, process.order.priority)
            now = self.clock.now()
            return restart_complete_by(
                process, request.attempt, request.step, start, now, budget, self.policy
            )

        try:
            changed = await self.work.change(request.order_id, decide, races=2)
        except (ConcurrencyConflict, StateStoreError) as exc:
            log.info("order %s %s: hold not written (%s)", request.order_id, request.step, exc)
            return None
        if changed is None or changed.transition is None:
            return None
        state = changed.process.state
        return changed.process.steps[state.current_step].complete_by


@dataclass
class HeldCall:
    """One request's holds: writes one when a wait eats into its time, and moves the
    deadline the agent's calls stop at."""

    holds: StepHolds
    request: AgentRequest
    known: KnownDeadline
    room: timedelta

    async def __call__(self, start: datetime) -> None:
        if self.known.at - start >= self.room:
            return
        restarted = await self.holds.hold(self.request, start)
        if restarted is not None:
            self.known.at = max(self.known.at, restarted)
