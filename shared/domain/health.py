"""What Agents publish about themselves, and what the Scheduler routes on.

An agent's health is observed per instance (each instance has its own circuit breaker);
the Scheduler merges the fresh observations of one agent into one view.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half-open"


@dataclass(frozen=True)
class AgentHealth:
    """One instance's view of one agent, as last published (a heartbeat)."""

    agent: str
    """The agent's name, e.g. `payment` or `payment-secondary`."""
    instance: str
    breaker: BreakerState
    success_rate: float
    """Share of the recent remote calls that succeeded, 0..1 (1.0 with no calls)."""
    latency_ms: float
    """Mean latency of the recent remote calls."""
    in_flight: int
    capacity: int
    """How many requests this instance serves at once."""
    calls: int
    """Remote calls in the recent window."""
    heartbeat_at: datetime
    open_until: datetime | None = None
    max_concurrent: int | None = None
    """The agent's fleet-wide `maxConcurrent` as this instance runs it; None: no limit."""
    calls_per_second: float | None = None
    """The agent's fleet-wide `callsPerSecond` as this instance runs it; None: no limit."""
    rate: float = 0.0
    """Remote calls per second this instance made lately (over RATE_WINDOW)."""
    throttled: int = 0
    """`429`s this instance's calls were answered since it started."""
    last_limited_at: datetime | None = None
    """When this instance last saw a `429` from the service."""


@dataclass(frozen=True)
class SweepRecord:
    """One Supervisor sweep, kept so operators can see the Supervisor is alive and busy."""

    instance: str
    started_at: datetime
    finished_at: datetime
    due: int
    requeued: int
    errored: int
    compensating: int
    rescheduled: int
    finished: int
    lost_races: int
    failed: int


@dataclass(frozen=True)
class SeenOutages:
    """The outages of the broker or the state store one instance saw, as it last shared
    them: an instance started after an outage (a restart, a scale-out) learns of it here,
    and counts no complete-by that passed in it."""

    instance: str
    windows: tuple[tuple[datetime, datetime], ...]
    """From first failure to first success (or to `at`, while it lasts), oldest first."""
    at: datetime

    @property
    def until(self) -> datetime:
        """When its last outage ended: the record is kept a retention past it."""
        return max((end for _, end in self.windows), default=self.at)


@dataclass(frozen=True)
class AgentDrain:
    """An operator's drain flag on one agent, for a provider's maintenance window.

    Stored beside the heartbeats so the Scheduler reads both in its routing refresh; a
    drained agent gets no new dispatch, but still undoes what it did.
    """

    agent: str
    drained: bool
    reason: str | None
    since: datetime
    """When the flag was last set or cleared."""
    by: str = "operator"


@dataclass(frozen=True)
class AgentRecords:
    """Everything stored about the agents, read at once: what routing needs each refresh."""

    health: tuple[AgentHealth, ...]
    drains: tuple[AgentDrain, ...]
