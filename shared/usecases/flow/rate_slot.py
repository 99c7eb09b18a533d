"""A request whose rate slot is far waits for it in the broker, not in a handler.

The host serves an agent's queue with a fixed number of handlers (`maxConcurrentCalls`,
16). A handler that sleeps until a far slot of the agent's `callsPerSecond` keeps the
requests behind it in the broker, where nothing records that they wait for our own
limit: they reach the agent past their complete-by, and the Supervisor counts each one
as a failure and abandons its key (40 charges at 5/s with a 3 s step timeout: 9).

So a request whose slot would eat into its time (the rule that writes a hold,
usecases/flow/step_hold.py) writes its hold and is handed back: the agent sends the request
to its own queue again, delivered a little before the slot, carrying the slot
(`startAt`) and the complete-by the hold moved, and frees the handler. The copy's first
call takes that slot instead of booking another. A handler then waits only for slots
within half of a request's time (or the lead), so what waits behind it in the broker
reaches a handler with its time still ahead of it, and every longer wait is recorded
before the complete-by passes. The cost is paid only where the limit binds that much:
the hold's read and write, which the wait cost before, and one scheduled message.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from shared.domain.limits import SlotLease, slot_still_usable
from shared.domain.messages import AgentRequest
from shared.domain.workflow import AgentName
from shared.ports import Clock, MessageBus
from shared.resilience import Held
from shared.usecases.flow.step_hold import HeldCall
from shared.usecases.limits.limiter import AgentLimiter

LEAD = timedelta(seconds=1)
"""How long before its slot a handed-back request is delivered (at most half its wait):
a scheduled message comes in after its time, never before, and a copy that came after
its slot's margin would have to book again, at the back of the schedule."""


class HandedBack(Exception):
    """The request went back to the broker to wait for its slot; the handler is done."""

    def __init__(self, start: datetime) -> None:
        super().__init__(f"waits in the broker for its slot at {start.isoformat()}")
        self.start = start


@dataclass
class HandBack:
    """Hands one request back to the broker when its booked slot is far."""

    bus: MessageBus
    clock: Clock
    agent: AgentName
    request: AgentRequest
    held: HeldCall
    high: bool

    async def __call__(self, start: datetime) -> bool:
        """Whether the request was handed back to wait for `start`; False: the handler
        waits (the slot is near, or the hold could not be written: fenced, at its cap,
        the store down, and the call keeps the deadline it knows)."""
        now = self.clock.now()
        if start <= now or not self.held.matters(start):
            return False
        moved = await self.held.pay(start - now)
        if moved is None or moved <= start:
            return False
        copy = replace(self.request, complete_by=moved, start_at=start)
        sent = copy.outgoing(self.agent, high=self.high)
        lead = min(LEAD, (start - now) / 2)
        slot = f"{sent.message_id}:at:{int(start.timestamp() * 1000)}"
        await self.bus.send([replace(sent, message_id=slot, deliver_at=start - lead)])
        return True


@dataclass
class SlotGate:
    """The agent's limiter as one request meets it (resilience.Gate): the first call
    takes the slot the request carries while it is still usable, and a slot booked far
    hands the request back (HandedBack) instead of holding the handler."""

    limiter: AgentLimiter
    carried: datetime | None
    hand_back: HandBack | None
    missed: bool = False
    """The call came to a slot after its start window (a handed-back copy delivered
    late, a handler woken late): the time since that slot is written as a hold before
    it books again (`start_at`)."""

    @classmethod
    def for_request(
        cls, limiter: AgentLimiter, request: AgentRequest, now: datetime, hand_back: HandBack | None
    ) -> SlotGate:
        carried = request.start_at
        if carried is not None and not slot_still_usable(carried, now, limiter.limits):
            if hand_back is not None:
                hand_back.held.missed(carried)
            return cls(limiter, None, hand_back, missed=True)
        return cls(limiter, carried, hand_back)

    async def start_at(self) -> datetime:
        """A slot for the next call. A call that missed its slot writes its hold first:
        the time since the slot went to our own limit (a copy that waited in the broker
        past it, a handler woken late on a loaded host), and the booking and the hold
        still to come take store round trips that can outlast what the call has left;
        written after them, the hold found the complete-by passed, and the wait was
        counted as a failure (tests/e2e/test_limits.py beside a CPU hog)."""
        if self.missed and self.hand_back is not None:
            self.missed = False
            await self.hand_back.held.pay()
        carried, self.carried = self.carried, None
        if carried is not None and await self.limiter.claim(carried):
            return carried
        start = await self.limiter.start_at()
        if self.hand_back is not None and await self.hand_back(start):
            raise HandedBack(start)
        return start

    def on_time(self, start: datetime) -> bool:
        if self.limiter.on_time(start):
            return True
        if self.hand_back is not None:
            self.hand_back.held.missed(start)
            self.missed = True
        return False

    async def enter(self, lasts: timedelta, waiting: Held) -> SlotLease | None:
        return await self.limiter.enter(lasts, waiting)

    async def leave(self, lease: SlotLease | None) -> None:
        await self.limiter.leave(lease)
