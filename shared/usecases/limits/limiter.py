"""An agent's fleet-wide limits, as one process takes its part of them.

The shared rows are in the LimitStore (domain.limits says why a schedule and leases).
Per process and agent, one booker takes rate slots for every call waiting here in one
conditional write, and reuses the row's ETag it wrote last, so a lone instance pays
one write per batch and only a race costs a read. A slot is a start window: a call
that comes to it too late (`on_time`) books another, since the provider counts calls as
they start, not as they were booked. Without a limit nothing here runs: the agent is
given no limiter at all, and its calls touch no store.
"""

from __future__ import annotations

import asyncio
import random
from collections import deque
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta

from shared.domain.limits import (
    SECOND,
    AgentLimits,
    Schedule,
    SlotLease,
    book,
    claim,
    free_slots,
    next_expiry,
    slot_still_usable,
)
from shared.ports import (
    Clock,
    ConcurrencyConflict,
    LimitStore,
    StateStoreError,
    TransientRemoteError,
)
from shared.telemetry.logsafe import app_logger
from shared.waiters import fail_all, hand_to_first

log = app_logger("orders.agent")

BOOKING_MAX = timedelta(seconds=1)
"""The most a booking's round trip is allowed for when slots are taken (`_book`)."""

POLL_FIRST = 0.05
POLL_MAX = 1.0
"""How often a call waiting for a concurrency slot looks again, doubling from the first
to the last: slots freed elsewhere send no signal."""


class LimitUnavailable(TransientRemoteError):
    """The limit rows could not be read or written: no call goes unmetered, so the
    attempt waits and retries like any transient failure (and is not the service's)."""

    def __init__(self, message: str) -> None:
        super().__init__("limit-store-unavailable", message)


Waiting = Callable[[datetime], Awaitable[None]]
"""Waits, for a call without a concurrency slot, until it looks again; may raise to
give up instead (the caller's deadline)."""


class AgentLimiter:
    def __init__(
        self,
        agent: str,
        limits: AgentLimits,
        store: LimitStore,
        clock: Clock,
        holder: str,
        skew: timedelta,
        rng: random.Random | None = None,
    ) -> None:
        self.agent = agent
        self.limits = limits
        self._store = store
        self._clock = clock
        self._holder = holder
        self._skew = skew
        self._rng = rng or random.Random()
        self._waiting: deque[asyncio.Future[datetime]] = deque()
        self._booker: asyncio.Task[None] | None = None
        self._seen: Schedule | None = None
        self._seen_valid = False
        self._booking = timedelta(0)
        """How long the last booking's write took: an idle schedule's first slot starts
        no earlier than that after the booking began (`_book`)."""
        self._local = (
            asyncio.Semaphore(limits.max_concurrent) if limits.max_concurrent is not None else None
        )
        self.rebooked = 0
        """Calls that came to their slot too late to use it and booked another."""

    async def start_at(self) -> datetime:
        """A rate slot for one call: the time it may start (now when there is no rate
        limit). Raises LimitUnavailable when the schedule cannot be reached."""
        if self.limits.gap is None:
            return self._clock.now()
        slot: asyncio.Future[datetime] = asyncio.get_running_loop().create_future()
        self._waiting.append(slot)
        if self._booker is None or self._booker.done():
            self._booker = asyncio.create_task(self._book())
        return await slot

    async def claim(self, start: datetime) -> bool:
        """Whether this copy of a handed-back request may start its call in the slot it
        carries: the broker may deliver a request twice, and both copies carry one slot;
        the first to claim it uses it, the other books its own. Raises LimitUnavailable
        when the row cannot be reached."""
        keep = SECOND + 2 * self._skew
        while True:
            try:
                seen = await self._store.claims(self.agent)
                slots = claim(seen.slots if seen else (), start, self._clock.now(), keep)
                if slots is None:
                    return False
                await self._store.put_claims(self.agent, slots, seen)
                return True
            except ConcurrencyConflict:
                continue
            except StateStoreError as exc:
                raise LimitUnavailable(f"{self.agent} claimed slots: {exc}") from None

    def on_time(self, start: datetime) -> bool:
        """Whether a call whose rate slot is `start` may start now, right before it does
        (always without a rate limit). A call woken later than its slot allows (a
        loaded event loop, a wait for a concurrency slot, a handed-back request
        delivered late) would crowd the slots after it, another instance's too, into
        the provider's second: the caller books another slot instead."""
        now = self._clock.now()
        if self.limits.gap is None or slot_still_usable(start, now, self.limits):
            return True
        self.rebooked += 1
        late = (now - start).total_seconds() * 1000
        log.info(
            "agent %s: a call came %.0f ms after its rate slot; it books another", self.agent, late
        )
        return False

    async def enter(self, lasts: timedelta, waiting: Waiting) -> SlotLease | None:
        """Hold one of the agent's concurrency slots for a call that lasts at most
        `lasts`; None without a concurrency limit. Release it with `leave`."""
        limit = self.limits.max_concurrent
        if limit is None or self._local is None:
            return None
        await self._local.acquire()
        try:
            return await self._take(limit, lasts, waiting)
        except BaseException:
            self._local.release()
            raise

    async def leave(self, lease: SlotLease | None) -> None:
        """Never raises: a lease not given back expires on its own."""
        if lease is None or self._local is None:
            return
        self._local.release()
        try:
            await self._store.release(self.agent, lease)
        except StateStoreError as exc:
            log.warning(
                "agent %s slot %d not released (%s); it expires", self.agent, lease.slot, exc
            )

    async def _take(self, limit: int, lasts: timedelta, waiting: Waiting) -> SlotLease:
        pause = POLL_FIRST
        while True:
            now = self._clock.now()
            try:
                leases = await self._store.leases(self.agent)
                free = list(free_slots(leases, limit, now, self._skew))
                self._rng.shuffle(free)
                for slot in free:
                    try:
                        return await self._store.take(
                            self.agent, slot.slot, self._holder, now + lasts, slot.seen
                        )
                    except ConcurrencyConflict:
                        continue
            except StateStoreError as exc:
                raise LimitUnavailable(f"{self.agent} concurrency slots: {exc}") from None
            back = next_expiry(leases, limit, now, self._skew)
            wait = max(min(pause, (back - now).total_seconds()), POLL_FIRST)
            pause = min(pause * 2, POLL_MAX)
            await waiting(now + timedelta(seconds=wait))

    async def _book(self) -> None:
        """Take slots for every call waiting here, a batch per write, until none waits.

        On an idle schedule the first slot is "now", but the call learns of it only once
        the write is back: on a loaded host that takes longer than a slot's start window
        (100 ms), and a slot taken at the write's start was already too late to use, so
        each booking was given up and taken again, a slot of the schedule spent each
        time. The slots start instead no earlier than the last booking's round trip
        after this one begins (at most BOOKING_MAX)."""
        gap = self.limits.gap
        assert gap is not None
        while True:
            while self._waiting and self._waiting[0].done():
                self._waiting.popleft()
            if not self._waiting:
                return
            now = self._clock.now()
            try:
                if not self._seen_valid:
                    self._seen, self._seen_valid = await self._store.schedule(self.agent), True
                    now = self._clock.now()
                seen = self._seen
                after = now + self._booking
                booking = book(seen.next_start if seen else None, after, len(self._waiting), gap)
                self._seen = await self._store.put_schedule(self.agent, booking.next_start, seen)
                self._booking = min(self._clock.now() - now, BOOKING_MAX)
            except ConcurrencyConflict:
                self._seen_valid = False
                continue
            except StateStoreError as exc:
                self._seen_valid = False
                self._fail(LimitUnavailable(f"{self.agent} rate schedule: {exc}"))
                return
            for start in booking.starts:
                hand_to_first(self._waiting, start)

    def _fail(self, exc: Exception) -> None:
        fail_all(self._waiting, exc)
