"""Which agent gets a step: the healthiest candidate with room, primary first.

Routing follows the pattern's guidance: health metrics detect a failing agent and
redirect its work, capacity metrics send work where there is room. Preference order is
kept among healthy agents, so work moves back to the primary as soon as it recovers.
An agent nobody has heard from yet is given the benefit of the doubt (a fresh
deployment must be able to start); one that stopped publishing is not.

An operator may drain an agent (a provider's maintenance window): it gets no new
dispatch; its steps go to another candidate, or wait when every candidate is drained.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import IntEnum

from shared.domain.health import AgentHealth, AgentRecords, BreakerState
from shared.domain.workflow import AgentName

STALE_AFTER = timedelta(seconds=60)
"""A heartbeat older than this means the agent may be gone: it gets no new work, and the
operator page flags it STALE."""


class Availability(IntEnum):
    """Lower is worse-ranked later; unknown ranks with healthy (see `Routing._rank`)."""

    HEALTHY = 0
    UNKNOWN = 1
    """Never published: a new deployment, or health publishing is off."""
    PROBE = 2
    """Breaker half-open (or its open period is over): one trial request may go."""
    FULL = 3
    """Healthy but every instance is at capacity."""
    UNAVAILABLE = 4
    """Breaker open, or heartbeat stale."""


@dataclass(frozen=True)
class AgentView:
    agent: str
    availability: Availability
    reason: str
    in_flight: int = 0
    capacity: int = 0
    success_rate: float = 1.0


def merge(observations: Iterable[AgentHealth], now: datetime) -> dict[str, AgentView]:
    """One view per agent from its instances' heartbeats.

    The freshest heartbeat decides the breaker (it is the latest news about the remote
    service); in-flight and capacity add up over the fresh instances.
    """
    by_agent: dict[str, list[AgentHealth]] = {}
    for health in observations:
        by_agent.setdefault(health.agent, []).append(health)
    views: dict[str, AgentView] = {}
    for agent, rows in by_agent.items():
        fresh = [h for h in rows if now - h.heartbeat_at <= STALE_AFTER]
        if not fresh:
            newest = max(h.heartbeat_at for h in rows)
            views[agent] = AgentView(
                agent, Availability.UNAVAILABLE, f"no heartbeat since {newest.isoformat()}"
            )
            continue
        latest = max(fresh, key=lambda h: h.heartbeat_at)
        in_flight = sum(h.in_flight for h in fresh)
        capacity = sum(h.capacity for h in fresh)
        calls = sum(h.calls for h in fresh)
        rate = (
            sum(h.success_rate * h.calls for h in fresh) / calls if calls else latest.success_rate
        )
        availability, reason = _classify(latest, in_flight, capacity, now)
        views[agent] = AgentView(agent, availability, reason, in_flight, capacity, rate)
    return views


def _classify(
    latest: AgentHealth, in_flight: int, capacity: int, now: datetime
) -> tuple[Availability, str]:
    if latest.breaker is BreakerState.OPEN:
        if latest.open_until is None or latest.open_until > now:
            return Availability.UNAVAILABLE, "circuit open"
        return Availability.PROBE, "circuit open period over"
    if latest.breaker is BreakerState.HALF_OPEN:
        return Availability.PROBE, "circuit half-open"
    if capacity and in_flight >= capacity:
        return Availability.FULL, f"{in_flight}/{capacity} in flight"
    return Availability.HEALTHY, "healthy"


@dataclass(frozen=True)
class Routing:
    """A snapshot of agent health the pure state machine routes on."""

    views: dict[str, AgentView] = field(default_factory=dict)
    drained: frozenset[str] = frozenset()
    """Agents an operator drained: no new dispatch goes to them."""

    def all_drained(self, candidates: Sequence[AgentName]) -> bool:
        """Must the step wait? Only when no candidate is open to new work."""
        return bool(candidates) and all(c in self.drained for c in candidates)

    def choose(
        self, candidates: Sequence[AgentName], avoid: str | None = None
    ) -> tuple[AgentName, str]:
        """The agent to dispatch to, and why not the first candidate ('' when it is).

        `avoid` is the agent whose attempt just timed out: the Supervisor's retry goes
        elsewhere when another candidate is at least as available. A drained candidate
        is never chosen while another is open (callers check `all_drained` first).
        """
        usable = [c for c in candidates if c not in self.drained] or list(candidates)
        chosen = self._best(usable, avoid)
        if chosen is candidates[0]:
            return chosen, ""
        skipped = candidates[0]
        if skipped in self.drained:
            return chosen, f"{skipped}: drained"
        why = self.views[skipped].reason if skipped in self.views else "not known"
        if skipped == avoid and self._rank(candidates[0]) <= self._rank(chosen):
            why = "its attempt timed out"
        return chosen, f"{skipped}: {why}"

    def _best(self, candidates: Sequence[AgentName], avoid: str | None) -> AgentName:
        if avoid is not None and not any(
            c != avoid and self._known(c) is Availability.HEALTHY for c in candidates
        ):
            avoid = None
        ranked = sorted(
            enumerate(candidates),
            key=lambda ic: (self._rank(ic[1]), ic[1] == avoid, ic[0]),
        )
        return ranked[0][1]

    def _known(self, agent: AgentName) -> Availability:
        view = self.views.get(agent)
        return view.availability if view else Availability.UNKNOWN

    def _rank(self, agent: AgentName) -> int:
        """Unknown ranks with healthy: silence alone must not move work away."""
        availability = self._known(agent)
        return Availability.HEALTHY if availability is Availability.UNKNOWN else availability


def routing_from(records: AgentRecords, now: datetime) -> Routing:
    """The snapshot the Scheduler routes on: merged health plus the drained agents."""
    return Routing(
        merge(records.health, now),
        frozenset(d.agent for d in records.drains if d.drained),
    )


PRIMARY_ONLY = Routing()
"""No health known: every step goes to its primary agent (or the untried candidate)."""
