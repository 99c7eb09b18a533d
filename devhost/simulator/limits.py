"""A provider's quotas (``rateLimitPerSecond``, ``maxConcurrent``) and what they measured.

A real payment API refuses calls past its quota with ``429`` rather than queueing them,
so a client that ignores backpressure shows up as refusals, not as slowness. The same
meter feeds ``maxCallsInOneSecond`` and ``maxConcurrentSeen``, the figures a limit on
the calling side is judged by (docs/limits.md: never more than the limit plus 10% in
any one-second window).

A window is any half-open second ``(t - 1 s, t]`` on the simulator's monotonic clock,
not a calendar second: a burst straddling a second boundary counts whole. Every
operation call that arrives counts in the measured figures, refused or not, because
they measure what the caller sent; the quota itself counts only the calls it let in,
as a sliding-window limiter at a provider does. Outcome queries, abandons and health
probes are neither limited nor counted: a provider's read API has its own quota.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from devhost.simulator.faults import FaultSettings

Monotonic = Callable[[], float]
WINDOW_SECONDS = 1.0


class Refusal(Enum):
    RATE = "rate-limit"
    CONCURRENCY = "concurrency-limit"


@dataclass
class ServiceLoad:
    """One service's recent arrivals and calls running; bounded by one second's calls."""

    arrived: deque[float] = field(default_factory=deque)
    admitted: deque[float] = field(default_factory=deque)
    running: int = 0

    def forget_before(self, now: float) -> None:
        for times in (self.arrived, self.admitted):
            while times and times[0] <= now - WINDOW_SECONDS:
                times.popleft()


@dataclass(frozen=True)
class Admission:
    refusal: Refusal | None
    calls_in_window: int
    """Calls that arrived in the second ending now, this one included."""
    concurrent: int
    """Calls running at the service as this one arrived, this one included."""


class LoadMeter:
    """Admits or refuses each operation call; ``begin`` must be paired with ``end`` when
    it admits, as the call's slot is held until its work ends."""

    def __init__(self, services: tuple[str, ...], monotonic: Monotonic) -> None:
        self._monotonic = monotonic
        self._load = {name: ServiceLoad() for name in services}

    def begin(self, service: str, settings: FaultSettings) -> Admission:
        load = self._load[service]
        now = self._monotonic()
        load.forget_before(now)
        load.arrived.append(now)
        calls, concurrent = len(load.arrived), load.running + 1
        most, per_second = settings.max_concurrent, settings.rate_limit_per_second
        if most is not None and load.running >= most:
            return Admission(Refusal.CONCURRENCY, calls, concurrent)
        if per_second is not None and len(load.admitted) >= per_second:
            return Admission(Refusal.RATE, calls, concurrent)
        load.admitted.append(now)
        load.running += 1
        return Admission(None, calls, concurrent)

    def end(self, service: str) -> None:
        load = self._load[service]
        load.running = max(load.running - 1, 0)
