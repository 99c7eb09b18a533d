"""An agent's declared limits, and the two shared records that make them hold across
every instance (the contract, the argument and its numbers: docs/limits.md).

`callsPerSecond` is a schedule, not a counter: one shared row per agent holds the
earliest time the next call may start, and whoever takes slots moves it on by one gap
per slot (the generic cell rate algorithm with a burst of one). Calls spaced a gap
apart, whichever instance makes them, can never put more than the limit in any
one-second window, sliding or not; a per-second counter can (twice the limit across a
window's edge). A slot is taken for a call that is waiting now, never in advance, so
an idle instance holds nothing, and a killed one loses at most the slots it had taken.

`maxConcurrent` is a set of leases: rows `0 .. maxConcurrent - 1`, each held by one
call until its expiry, which is the longest the call can run plus the clock-skew
margin, so a killed instance's slots come back on their own.
A killed instance also loses the rate slots it had taken for its waiting calls: at most
one batch, a few gaps of the schedule, never more calls than the limit.

Pure: the times are given, the rows are values with their ETags.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

SECOND = timedelta(seconds=1)
MARGIN = 0.05
"""A second of spacing is a little longer than a second, as in the throttle: the
schedule's own pace stays under `callsPerSecond` however long it runs."""

TRIP = timedelta(milliseconds=100)
"""The most a call's way from its last check (`slot_still_usable`, right before it
starts) to the provider's count of it may take: our event loop's turns until the request
is written, the network, the provider's own turns before it counts the call. A provider
counts arrivals, so slots are spaced for this too (`AgentLimits.gap`); a call whose way
takes longer can land one call too many in the provider's second (docs/limits.md says
what was measured on a loaded machine)."""

LATE = timedelta(milliseconds=100)
"""The least lateness a slot allows at its check: a handler woken up to this late after
its slot (a loaded event loop) still calls in it. Later, it books another slot and its
step is held for the wait (usecases/flow/rate_slot.py)."""


@dataclass(frozen=True)
class AgentLimits:
    """What one agent may ask of its service, fleet-wide; None: no limit."""

    max_concurrent: int | None = None
    calls_per_second: float | None = None

    @property
    def limited(self) -> bool:
        return self.max_concurrent is not None or self.calls_per_second is not None

    @property
    def gap(self) -> timedelta | None:
        """The distance between two calls' slots under `calls_per_second`: n + 1 slots
        (n: `calls_allowed`) span n gaps, at least a second plus LATE plus TRIP, so n + 1
        calls each arriving at most that late after its slot never fall in one second at
        the provider, whichever instance booked them; and never less than MARGIN over
        the rate's own spacing. Where the contract's 10% is less than a call (below
        10/s), the guard band costs throughput: 2.5 calls a second at 3/s, 4.17 at 5/s,
        9.17 at 10/s (docs/limits.md)."""
        rate = self.calls_per_second
        return None if rate is None else _gap(rate)


def _gap(rate: float) -> timedelta:
    paced = SECOND * ((1 + MARGIN) / rate)
    guarded = (SECOND + LATE + TRIP) / calls_allowed(rate)
    return max(paced, guarded)


def calls_allowed(rate: float) -> int:
    """The most calls the contract lets a provider see in any one second:
    `callsPerSecond` plus 10%, in whole calls, so floor(callsPerSecond * 1.1): 3 at 3/s,
    5 at 5/s, 11 at 10/s, 2 at 2.5/s (contract section 14); one below 1/s, where no
    second may hold two."""
    return max(1, math.floor(rate * 11 / 10 + 1e-9))


def lateness_allowed(rate: float) -> timedelta:
    """How long after its slot a call may still start: what the gaps leave of the guard
    band once TRIP is set aside. That is LATE wherever the guard band sets the gap (from
    1/s up), more where the rate's own spacing is wider (1 s at 0.5/s). The first and
    last of n + 1 slots (n: `calls_allowed`) are n gaps apart; a call checked at most
    this late and arriving at most TRIP after its check keeps every n + 1 arrivals at
    least a second apart, whichever instance made them. A call that would start later
    gives its slot up and books another: started later, it would crowd the calls of the
    slots after it, another instance's included, past the contract's 10% in the
    provider's second (docs/limits.md). A host loaded enough to wake its calls later
    than this pays a booking and a hold per late call (usecases/flow/rate_slot.py),
    never a call too many, and never a failure: the wait for the new slot is the
    limit's."""
    return max(_gap(rate) * calls_allowed(rate) - SECOND - TRIP, timedelta(0))


def slot_still_usable(slot: datetime, now: datetime, limits: AgentLimits) -> bool:
    """Whether a call may start now in a slot taken earlier (a slot booked for it, or
    one a handed-back request carries, usecases/flow/rate_slot.py): until
    `lateness_allowed` past it. Later, the caller books another slot instead."""
    rate = limits.calls_per_second
    if rate is None:
        return False
    return now <= slot + lateness_allowed(rate)


@dataclass(frozen=True)
class Schedule:
    """The shared rate row of one agent as read, with its ETag."""

    next_start: datetime
    etag: str


@dataclass(frozen=True)
class Booking:
    """Slots taken in one conditional write: their start times, and the row's next value."""

    starts: tuple[datetime, ...]
    next_start: datetime


def book(next_start: datetime | None, now: datetime, wanted: int, gap: timedelta) -> Booking:
    """`wanted` consecutive slots from the schedule's next free one (or now). A slot far
    ahead is still taken: the caller then knows at once when its call can start, and
    its step's complete-by can start there too (machine/hold.py)."""
    first = now if next_start is None else max(now, next_start)
    starts = tuple(first + gap * i for i in range(max(wanted, 1)))
    return Booking(starts, first + gap * len(starts))


@dataclass(frozen=True)
class Claims:
    """The slots handed-back requests have started calls in, as read, with the row's
    ETag: a request delivered twice (the broker's at-least-once) carries one slot twice,
    and only its first copy may use it."""

    slots: tuple[datetime, ...]
    etag: str


def claim(
    held: Sequence[datetime], slot: datetime, now: datetime, keep: timedelta
) -> tuple[datetime, ...] | None:
    """The claimed slots with `slot` added, and those past `keep` dropped (no copy can
    use them any more); None when `slot` is claimed already."""
    if slot in held:
        return None
    return (*(s for s in held if s >= now - keep), slot)


@dataclass(frozen=True)
class SlotLease:
    """One of an agent's `maxConcurrent` slots as read: who holds it, until when."""

    slot: int
    holder: str
    expires: datetime
    etag: str


@dataclass(frozen=True)
class FreeSlot:
    slot: int
    seen: SlotLease | None
    """The expired lease to replace on its ETag; None: the row is not there (insert)."""


def free_slots(
    leases: Sequence[SlotLease], max_concurrent: int, now: datetime, skew: timedelta
) -> tuple[FreeSlot, ...]:
    """Slots no live call holds. A lease counts as held until its expiry plus the skew
    margin: its holder's clock may run behind ours."""
    by_slot = {lease.slot: lease for lease in leases}
    free = []
    for slot in range(max_concurrent):
        lease = by_slot.get(slot)
        if lease is None:
            free.append(FreeSlot(slot, None))
        elif lease.expires + skew <= now:
            free.append(FreeSlot(slot, lease))
    return tuple(free)


def next_expiry(
    leases: Sequence[SlotLease], max_concurrent: int, now: datetime, skew: timedelta
) -> datetime:
    """When the first held slot comes back if nobody releases it first (now: none is
    held, a race was lost)."""
    held = [lease.expires + skew for lease in leases if lease.slot < max_concurrent]
    return min(held, default=now)
