"""Step heartbeats: an Agent whose remote call is still running keeps its step alive.

A beat is a conditional write by the agent, not a message: read the order, extend the
running step's complete-by and the order's (shared/domain/machine/heartbeat.py:extend_complete_by),
write it back If-Match on the ETag read. Cost per beat: 1 point read + 1 conditional
write, no broker hop and no change to the message contract. A beat on the replies lane
would cost a send, a receive and a settle on the broker, plus the Scheduler's own read
and write of the order: the same store work and three broker operations more, and a
beat queued behind a backlog of replies would arrive late, which is when it matters.

A fast call costs nothing: the first beat goes only once the call has run for half of
StepHeartbeatSeconds (or half the time left, if less), and no earlier than half of
StepHeartbeatSeconds before the complete-by it would move. The Supervisor's watch entry
is not moved: the sweep that finds the order at the old time sees the complete-by not yet
passed and reschedules to the new one (one read and one write per beaten period, paid
by long steps only, instead of a watch write on every beat).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar

from shared.domain.machine.heartbeat import extend_complete_by
from shared.domain.machine.transition import ProcessPolicy, Transition
from shared.domain.messages import AgentRequest
from shared.domain.model import OrderProcess
from shared.ports import Clock, ConcurrencyConflict, StateStoreError
from shared.resilience import DeadlinePassed
from shared.telemetry.logsafe import app_logger
from shared.usecases.flow.unit_of_work import UnitOfWork

log = app_logger("orders.agent")

T = TypeVar("T")


@dataclass
class KnownCompleteBy:
    """The complete-by this agent last knew to be stored for its step: the request's,
    then each beat's. Its calls stop there, whatever the store says meanwhile."""

    at: datetime


@dataclass(frozen=True)
class StepHeartbeats:
    work: UnitOfWork
    clock: Clock
    policy: ProcessPolicy

    @property
    def enabled(self) -> bool:
        return self.policy.step_max is not None

    async def beat(self, request: AgentRequest) -> datetime | None:
        """Extend the step's complete-by once; the stored complete-by, or None when
        nothing may be extended (fenced: another attempt, the step not Running, the order
        moved on; or the cap is reached), which ends the beats. A lost ETag race reads
        again once; losing twice ends the beats too."""

        def decide(process: OrderProcess) -> Transition | None:
            now = self.clock.now()
            return extend_complete_by(process, request.attempt, request.step, now, self.policy)

        try:
            changed = await self.work.change(request.order_id, decide, races=2)
        except ConcurrencyConflict:
            return None
        if changed is None or changed.transition is None:
            return None
        state = changed.process.state
        return changed.process.steps[state.current_step].complete_by

    async def keep_alive(
        self, request: AgentRequest, complete_by: KnownCompleteBy, call: Awaitable[T]
    ) -> T:
        """Run `call`, beating while it runs; raise DeadlinePassed (the call cancelled)
        once the known complete-by passes. A beat that cannot be written (store down,
        fenced, at the cap) ends the beats and the call keeps its last known complete-by."""
        task = asyncio.ensure_future(call)
        half = self.policy.step_heartbeat / 2
        started = self.clock.now()
        first = started + min(half, (complete_by.at - started) / 2)
        beating = True
        try:
            while True:
                now = self.clock.now()
                if now >= complete_by.at:
                    raise DeadlinePassed()
                beat_at = max(first, complete_by.at - half) if beating else complete_by.at
                if beating and now >= beat_at:
                    beating = await self._beat(request, complete_by)
                    continue
                wait = (min(beat_at, complete_by.at) - now).total_seconds()
                if await _done_within(task, self.clock, wait):
                    return task.result()
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _beat(self, request: AgentRequest, complete_by: KnownCompleteBy) -> bool:
        """One beat, bounded by the known complete-by; whether to go on beating."""
        remaining = (complete_by.at - self.clock.now()).total_seconds()
        try:
            async with asyncio.timeout(max(remaining, 0.001)):
                extended = await self.beat(request)
        except (StateStoreError, TimeoutError) as exc:
            log.info(
                "order %s %s: step heartbeat not written (%s); the call stops at %s",
                request.order_id,
                request.step,
                type(exc).__name__,
                complete_by.at.isoformat(),
            )
            return False
        if extended is None:
            log.debug(
                "order %s %s attempt %d: no step heartbeat taken (fenced or at the cap)",
                request.order_id,
                request.step,
                request.attempt,
            )
            return False
        complete_by.at = max(complete_by.at, extended)
        return True


async def _done_within(task: asyncio.Future[T], clock: Clock, seconds: float) -> bool:
    """Wait for `task` at most `seconds` on `clock` (a fake clock in tests)."""
    sleeper: asyncio.Future[object] = asyncio.ensure_future(clock.sleep(max(seconds, 0.0)))
    waited: set[asyncio.Future[object]] = {task, sleeper}  # type: ignore[arg-type]
    try:
        await asyncio.wait(waited, return_when=asyncio.FIRST_COMPLETED)
    finally:
        sleeper.cancel()
    return task.done()
