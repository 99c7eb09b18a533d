"""`/api/health`: each dependency proves that it answers, within a bound.

A load balancer or an operator trusts this answer to send work to the instance, so an
answer may only say what was proven: a round trip to the store and one to the broker.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from shared.ports import Clock

HEALTH_TTL = timedelta(seconds=5)
PROBE_TIMEOUT = 2.5
"""Seconds each dependency has to answer, both at once: `/api/health` answers within 3 s,
so a probe with a short timeout still learns which dependency is down."""


def _none_counted() -> int:
    return 0


@dataclass(frozen=True)
class Probe:
    """One dependency: a round trip it must answer (raising when it does not), and the
    count of the app's calls to it that failed, as its adapter keeps it."""

    ping: Callable[[], Awaitable[None]]
    failures: Callable[[], int] = _none_counted


@dataclass(frozen=True)
class _Answer:
    at: datetime
    report: dict[str, str]
    failures: tuple[int, ...]


@dataclass(eq=False)
class HealthCheck:
    """Probes every dependency at once; each answers "ok" or names its failure.

    An answer is reused for `ttl` per worker (the route is anonymous, and a flood of
    probes must not become a flood of store and broker calls), but an "ok" only while no
    call to any dependency has failed since it was proven: a failure that the app's own
    calls met shows at the next probe, not up to `ttl` later."""

    dependencies: Mapping[str, Probe]
    clock: Clock
    ttl: timedelta = HEALTH_TTL
    _last: _Answer | None = field(default=None, init=False)

    async def report(self) -> dict[str, str]:
        now = self.clock.now()
        failures = self._failures()
        last = self._last
        if last is not None and timedelta(0) <= now - last.at < self.ttl:
            healthy = all(v == "ok" for v in last.report.values())
            if not healthy or failures == last.failures:
                return dict(last.report)
        names = list(self.dependencies)
        answers = await asyncio.gather(*(_probe(self.dependencies[n].ping()) for n in names))
        report = dict(zip(names, answers, strict=True))
        self._last = _Answer(now, report, failures)
        return dict(report)

    def _failures(self) -> tuple[int, ...]:
        return tuple(d.failures() for d in self.dependencies.values())


async def _probe(ping: Awaitable[None]) -> str:
    try:
        await asyncio.wait_for(ping, PROBE_TIMEOUT)
    except TimeoutError:
        return f"unavailable: no answer within {PROBE_TIMEOUT:g} s"
    except Exception as exc:  # health reports every failure kind
        return f"unavailable: {type(exc).__name__}"
    return "ok"
