"""Holds: a step whose call waits for a limit gets its complete-by moved later by the
wait (domain/machine/hold.py), written like a step heartbeat through the unit of work:
1 point read + 1 conditional write, no message.

Waits are added up and written only once a wait would leave the call less than half of
the time it arrived with (`room`): short waits cost nothing until together they eat
into the call's time, and a call held again and again pays one write per half of its
step's timeout at most.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from shared.domain.machine.hold import hold_complete_by
from shared.domain.machine.transition import ProcessPolicy, Transition
from shared.domain.messages import AgentRequest
from shared.domain.model import OrderProcess
from shared.ports import Clock, ConcurrencyConflict, StateStoreError
from shared.telemetry.logsafe import app_logger
from shared.usecases.flow.step_heartbeat import KnownCompleteBy
from shared.usecases.flow.unit_of_work import UnitOfWork

log = app_logger("orders.agent")


@dataclass(frozen=True)
class StepHolds:
    work: UnitOfWork
    clock: Clock
    policy: ProcessPolicy

    def for_request(self, request: AgentRequest, known: KnownCompleteBy) -> HeldCall:
        """A do and an undo alike: an undo's timeout is counted against the order too."""
        room = (request.complete_by - self.clock.now()) / 2
        return HeldCall(self, request, known, room)

    async def hold(self, request: AgentRequest, waited: timedelta) -> datetime | None:
        """Move the step's complete-by later by `waited`; the stored complete-by, or None
        when it may not be (fenced, past it already, at the cap, or the store down)."""

        def decide(process: OrderProcess) -> Transition | None:
            now = self.clock.now()
            return hold_complete_by(
                process, request.attempt, request.step, waited, now, self.policy, request.action
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
    """One request's holds: adds up its waits, writes them once they eat into its time,
    and moves the complete-by the agent's calls stop at."""

    holds: StepHolds
    request: AgentRequest
    known: KnownCompleteBy
    room: timedelta
    unpaid: timedelta = field(default=timedelta(0))
    """Waits not yet written: counted against the call until they are."""
    counted_to: datetime | None = None
    """Where the waits counted so far end: a missed slot counts only the time after."""

    async def __call__(self, start: datetime) -> None:
        self.unpaid += max(start - self.holds.clock.now(), timedelta(0))
        self.counted_to = start if self.counted_to is None else max(self.counted_to, start)
        if self.matters(start):
            await self.pay()

    def missed(self, slot: datetime) -> None:
        """The call was ready at its rate slot but came to it too late to start in it (a
        late wake, a handed-back copy delivered late): our own limit sends it to another
        slot, so the time since the missed one counts as waited too, and the hold for the
        new slot gives it back. A call rebooked again and again then comes to each new
        slot with the time it had at the first; counting only the wait from now, each
        rebook ate its lateness, until a copy handed back again reached the agent past
        its complete-by (tests/e2e/test_limits.py, a slot allowing 25 ms at 5/s). A
        wait counted since the slot (for a concurrency slot) is not counted twice."""
        now = self.holds.clock.now()
        since = slot if self.counted_to is None else max(slot, self.counted_to)
        self.unpaid += max(now - since, timedelta(0))
        self.counted_to = now

    def matters(self, start: datetime) -> bool:
        """Would a call starting then have less than half the time this one arrived with?"""
        return self.known.at - start < self.room

    async def pay(self, coming: timedelta = timedelta(0)) -> datetime | None:
        """Write the waits not yet written, and a `coming` one; the complete-by stored,
        or None (not moved: the waits stay unpaid, and `coming` is not among them)."""
        moved = await self.holds.hold(self.request, self.unpaid + coming)
        if moved is not None:
            self.unpaid = timedelta(0)
            self.known.at = max(self.known.at, moved)
        return moved
