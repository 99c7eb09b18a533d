"""The fleet, not one order: the agents as an operator sees them (health, drained or
not, limits), and the drain switch (one order's actions are operator.py).

A drain is a row in the state table beside the heartbeats; every instance's Scheduler
reads it in its next routing refresh (shared/usecases/flow/routing.py), so a drain takes
effect everywhere within that period, with no message to lose.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from shared.domain.health import AgentDrain, AgentHealth, AgentRecords, BreakerState
from shared.domain.routing import STALE_AFTER, AgentView, merge
from shared.domain.workflow import AgentName, AgentSpec, Catalogue
from shared.ports import Clock, HealthStore
from shared.usecases.limits.budget import Budget, within_store_budget


class UnknownAgent(Exception):
    """No agent has this name."""


@dataclass(frozen=True)
class LimitsView:
    """What an operator sees of one agent's limits, fleet-wide."""

    max_concurrent: int | None
    calls_per_second: float | None
    rate: float
    """Calls per second the fresh instances made lately, added up."""
    throttled: int
    last_limited_at: datetime | None


@dataclass(frozen=True)
class AgentStatus:
    spec: AgentSpec
    view: AgentView | None
    """Merged over the fresh instances, as routing sees it; None: never heard from."""
    instances: tuple[AgentHealth, ...]
    drain: AgentDrain | None
    """The stored flag (drained or not); None: never drained."""

    @property
    def drained(self) -> bool:
        return self.drain is not None and self.drain.drained

    @property
    def latest(self) -> AgentHealth | None:
        return max(self.instances, key=lambda h: h.heartbeat_at, default=None)

    def latency_ms(self, now: datetime) -> float | None:
        """The mean latency over the fresh instances' recent calls."""
        fresh = [h for h in self.instances if now - h.heartbeat_at <= STALE_AFTER]
        calls = sum(h.calls for h in fresh)
        if calls:
            return sum(h.latency_ms * h.calls for h in fresh) / calls
        latest = self.latest
        return latest.latency_ms if latest else None

    def limits(self, now: datetime) -> LimitsView:
        """The agent's limits as its freshest instance runs them (the catalogue's when
        none is heard from), the call rate over the fresh instances, and the `429`s
        every instance still on record has seen."""
        fresh = [h for h in self.instances if now - h.heartbeat_at <= STALE_AFTER]
        latest = max(fresh, key=lambda h: h.heartbeat_at, default=None)
        declared = self.spec.limits
        limited = [h.last_limited_at for h in self.instances if h.last_limited_at is not None]
        return LimitsView(
            max_concurrent=latest.max_concurrent if latest else declared.max_concurrent,
            calls_per_second=latest.calls_per_second if latest else declared.calls_per_second,
            rate=sum(h.rate for h in fresh),
            throttled=sum(h.throttled for h in self.instances),
            last_limited_at=max(limited, default=None),
        )

    @property
    def breaker(self) -> BreakerState | None:
        latest = self.latest
        return latest.breaker if latest else None


async def list_agents(
    store: HealthStore, clock: Clock, catalogue: Catalogue
) -> tuple[AgentStatus, ...]:
    """Every agent of the workflows, in a fixed order, heard from or not."""
    return _statuses(catalogue, await store.agent_records(), clock.now())


async def set_drain(
    store: HealthStore,
    clock: Clock,
    catalogue: Catalogue,
    agent: str,
    drained: bool,
    reason: str | None = None,
    operator: str = "operator",
    *,
    budget: Budget | None = None,
) -> AgentStatus:
    """Raises UnknownAgent, and StoreUnavailable once `budget.store` has passed (the flag
    may be stored: setting it again is safe). Setting the same flag again only refreshes
    its reason and time."""
    name = _agent_name(catalogue, agent)
    drain = AgentDrain(name, drained, reason, clock.now(), operator)
    return await within_store_budget(
        _set_drain(store, clock, catalogue, drain),
        budget,
    )


async def _set_drain(
    store: HealthStore, clock: Clock, catalogue: Catalogue, drain: AgentDrain
) -> AgentStatus:
    await store.set_drain(drain)
    statuses = await list_agents(store, clock, catalogue)
    return next(s for s in statuses if s.spec.name == drain.agent)


def _agent_name(catalogue: Catalogue, agent: str) -> AgentName:
    if agent not in catalogue.agents:
        raise UnknownAgent(agent)
    return agent


def _statuses(
    catalogue: Catalogue, records: AgentRecords, now: datetime
) -> tuple[AgentStatus, ...]:
    views = merge(records.health, now)
    drains = {d.agent: d for d in records.drains}
    return tuple(
        AgentStatus(
            spec=spec,
            view=views.get(name),
            instances=tuple(h for h in records.health if h.agent == name),
            drain=drains.get(name),
        )
        for name, spec in catalogue.agents.items()
    )
