"""How fast an agent may call its service, learnt from the service's `429`s (AIMD).

A provider's quota is not known in advance and changes (other tenants share it), so the
agent learns it the way TCP learns a link: halve the allowed rate when the provider
says "too many" (multiplicative decrease), add a little back with each call that goes
through (additive increase). The decrease happens once per congestion event: the
calls that were already in flight when the first `429` came back are answered `429`
too, and halving for each would drop the rate to the floor for one burst.

Calls are spaced rather than let through in bursts, and a second of spacing is a little
longer than a second (`margin`): a provider counts arrivals, and calls spaced exactly
`1/rate` apart can land `rate + 1` in one of its windows after a few milliseconds of
network jitter. `Retry-After` is a floor: no call starts before it, whatever the rate.

Pure: every method is given the time, so it is tested without a clock and the agent
reads its own injected one. One instance per agent per process, like the breaker; it
does not hold across instances (the shared limit of docs/limits.md is another part).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from datetime import datetime, timedelta

SECOND = timedelta(seconds=1)


@dataclass(frozen=True)
class ThrottleView:
    """What an operator sees of one agent's throttle in one process."""

    rate: float | None
    """Calls per second allowed now; None: not throttled (no `429` seen, no ceiling)."""
    ceiling: float | None
    """The most it climbs back to (a declared limit); None: no ceiling."""
    throttled: int
    """`429`s answered to this agent's calls."""
    last_limited_at: datetime | None
    """When the last `429` came back."""


class AdaptiveRate:
    def __init__(
        self,
        ceiling: float | None = None,
        *,
        floor: float = 0.5,
        decrease: float = 0.5,
        increase: float = 0.2,
        margin: float = 0.05,
    ) -> None:
        """`increase` is per call that goes through: the rate climbs back from half in
        about `0.7 / increase` seconds whatever the quota, since a bigger quota means
        more calls to climb on. `ceiling` caps it (and sets the starting rate)."""
        self._ceiling = ceiling
        self._floor = floor
        self._decrease = decrease
        self._increase = increase
        self._margin = margin
        self._rate = ceiling
        self._next_start: datetime | None = None
        self._last_start: datetime | None = None
        self._not_before: datetime | None = None
        self._decreased_at: datetime | None = None
        self._recent: deque[datetime] = deque()
        """Starts over the last second while unthrottled: the rate the first `429`
        halves, since there is no allowed rate yet to halve."""
        self.throttled = 0
        self.last_limited_at: datetime | None = None

    @property
    def rate(self) -> float | None:
        return self._rate

    def reserve(self, now: datetime) -> datetime:
        """When the next call may start, taken for it: the caller waits until then."""
        if self._rate is None:
            self._note_start(now)
            return now if self._not_before is None else max(now, self._not_before)
        start = now if self._next_start is None else max(now, self._next_start)
        if self._not_before is not None:
            start = max(start, self._not_before)
        self._last_start = start
        self._next_start = start + self._gap(self._rate)
        return start

    def succeeded(self) -> None:
        if self._rate is None:
            return
        raised = self._rate + self._increase
        self._rate = raised if self._ceiling is None else min(raised, self._ceiling)

    def limited(self, now: datetime, retry_after: float | None) -> None:
        """A `429`: halve the rate (once per event) and start no call before
        `retry_after` seconds from now."""
        self.throttled += 1
        self.last_limited_at = now
        if retry_after is not None and retry_after > 0:
            until = now + timedelta(seconds=retry_after)
            self._not_before = until if self._not_before is None else max(self._not_before, until)
        if self._decreased_at is not None and now - self._decreased_at < SECOND:
            return
        self._decreased_at = now
        current = self._rate if self._rate is not None else self._observed(now)
        self._rate = max(self._floor, current * self._decrease)
        self._recent.clear()
        if self._last_start is not None:
            # The next call keeps the new rate's distance from the last one already sent.
            self._next_start = self._last_start + self._gap(self._rate)

    def view(self) -> ThrottleView:
        return ThrottleView(self._rate, self._ceiling, self.throttled, self.last_limited_at)

    def _gap(self, rate: float) -> timedelta:
        return SECOND * ((1 + self._margin) / rate)

    def _note_start(self, now: datetime) -> None:
        self._recent.append(now)
        while self._recent and self._recent[0] <= now - SECOND:
            self._recent.popleft()

    def _observed(self, now: datetime) -> float:
        while self._recent and self._recent[0] <= now - SECOND:
            self._recent.popleft()
        return float(max(len(self._recent), 1))
