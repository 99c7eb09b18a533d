"""What one instance has seen of its own infrastructure being down (the broker, the state
store), so the Supervisor counts no complete-by that passed in an outage against an order.

The Supervisor's sweeps see an outage when they fail; a broker outage can also pass
between two sweeps that never send, so the instance's bus also reports each failed send
(`WitnessedBus`) as a glimpse of one. Each instance shares what it saw through the health
store and learns what the others saw (`exchange`): a runtime that starts after an outage
(a restart, a scale-out) would otherwise count a complete-by that passed in it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from shared.domain.health import SeenOutages
from shared.domain.model import Outgoing
from shared.domain.outages import spared
from shared.ports import (
    BusUnavailable,
    Clock,
    HealthStore,
    MessageBus,
    Poison,
    StoreUnavailable,
)
from shared.telemetry.logsafe import app_logger

log = app_logger("orders.supervisor")

KEPT_OUTAGES = 8
GLIMPSES_MERGE = timedelta(seconds=30)
"""Failures this close together are one outage seen in pieces."""


@dataclass
class Outage:
    """The Supervisor's view of its dependencies across sweeps: while they are down it
    sweeps less often (doubling up to `cap`), logs the cause once, and says when they
    are back so the sweeps that follow catch up."""

    base: timedelta = timedelta(seconds=2)
    cap: timedelta = timedelta(seconds=15)
    since: datetime | None = None
    cause: BaseException | None = None
    retry_at: datetime | None = None
    delay: timedelta = timedelta(0)
    past: list[tuple[datetime, datetime]] = field(default_factory=list)
    """The last few outages this instance saw, from first failure to first success, and
    the glimpses: failures seen while the sweeps went through."""
    others: tuple[tuple[datetime, datetime], ...] = ()
    """What the instances (this one's name included) last shared."""
    shared: tuple[tuple[datetime, datetime], ...] = ()
    """What this instance last shared of its own."""

    def waiting(self, now: datetime) -> bool:
        return self.retry_at is not None and now < self.retry_at

    def covers(self, moment: datetime, before: timedelta, after: timedelta) -> bool:
        """Did `moment` fall in an outage, widened by `before` (an outage is seen a little
        after it begins) and `after` (the backlog it left takes a while to drain)?"""
        return spared(moment, [*self.seen(moment), *self.others], before=before, after=after)

    def seen(self, now: datetime) -> tuple[tuple[datetime, datetime], ...]:
        """This instance's own outages, the one going on (if any) up to `now`."""
        ongoing = [(self.since, now)] if self.since is not None else []
        return (*self.past, *ongoing)

    def learn(self, seen: Iterable[SeenOutages]) -> None:
        """Its own row included: a worker restarted under the same instance name (as in
        Azure) keeps what the one before it shared."""
        self.others = tuple(w for s in seen for w in s.windows)

    def glimpsed(self, at: datetime) -> None:
        """A bus or store call failed at `at` without stopping a sweep: a handler's send,
        or some checks of a sweep that went through. A broker outage can come and go
        between two sweeps that never touch the bus, and a complete-by that passed in it
        must not count either; a glimpse within `GLIMPSES_MERGE` of the last window
        extends it."""
        if self.since is not None:
            return
        if self.past and at - self.past[-1][1] <= GLIMPSES_MERGE:
            start, end = self.past[-1]
            self.past[-1] = (min(start, at), max(end, at))
            return
        self.past = [*self.past[-(KEPT_OUTAGES - 1) :], (at, at)]

    def failed(self, now: datetime, cause: BaseException) -> None:
        if self.since is None:
            self.since, self.cause, self.delay = now, cause, self.base
            log.warning(
                "supervisor: %s (%s: %s); sweeps back off up to %g s until it answers, "
                "no order is counted for it",
                _what_is_down(cause),
                type(cause).__name__,
                cause,
                self.cap.total_seconds(),
            )
        else:
            self.delay = min(self.delay * 2, self.cap)
        self.retry_at = now + self.delay

    def swept(self, now: datetime, due: int, sent: bool) -> None:
        """A sweep went through, with `due` checks. A bus outage is over only once
        something was `sent`: a sweep that only read and rescheduled proves nothing about
        the bus."""
        self.retry_at = None
        if self.since is None:
            return
        if isinstance(self.cause, BusUnavailable) and not sent:
            return
        log.warning(
            "supervisor: dependencies reachable again after %.0f s; catching up (%d due)",
            (now - self.since).total_seconds(),
            due,
        )
        self.past = [*self.past[-(KEPT_OUTAGES - 1) :], (self.since, now)]
        self.since = self.cause = None
        self.delay = timedelta(0)


async def exchange(
    outage: Outage, health: HealthStore, instance: str, now: datetime, timeout: float
) -> None:
    """Share this instance's outages if they changed, then learn the others'. Best effort
    and bounded: with the store down it is one more failed call, tried again next sweep,
    and the sweep goes on with what it knew."""
    mine = outage.seen(now)
    try:
        async with asyncio.timeout(timeout):
            if mine != outage.shared:
                await health.share_outages(SeenOutages(instance, mine, now))
                outage.shared = mine
            seen = await health.seen_outages()
    except Exception as exc:  # the sweep that follows meets the same failure and says so
        log.debug("supervisor: outages not exchanged (%s: %s)", type(exc).__name__, exc)
        return
    outage.learn(seen)


def _what_is_down(cause: BaseException) -> str:
    if isinstance(cause, BusUnavailable):
        return "the message bus is unreachable"
    if isinstance(cause, StoreUnavailable):
        return "the state store is unreachable"
    return "a bus or store call hung past the check's time limit"


@dataclass(frozen=True, eq=False)
class WitnessedBus:
    """The instance's bus, telling its Outage of every send that found the bus down."""

    bus: MessageBus
    outage: Outage
    clock: Clock

    async def send(self, messages: Sequence[Outgoing]) -> None:
        with self._witnessing():
            await self.bus.send(messages)

    async def ping(self) -> None:
        await self.bus.ping()

    async def park(self, poison: Poison) -> None:
        with self._witnessing():
            await self.bus.park(poison)

    @contextmanager
    def _witnessing(self) -> Iterator[None]:
        try:
            yield
        except BusUnavailable:
            self.outage.glimpsed(self.clock.now())
            raise

    async def close(self) -> None:
        closer = getattr(self.bus, "close", None)
        if closer is not None:
            await closer()
