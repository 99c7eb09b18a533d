"""Workflows are data: an ordered table of steps, each with its agent, kind, undo and inputs.

The catalogue file (`catalogue.json`, read by `shared.catalogue`) is where a team declares
its agents and workflows; these are the pure types the state machine walks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from shared.domain.limits import AgentLimits

AgentName = str
"""An agent's name as the catalogue declares it; also its simulated service's name."""


class StepKind(StrEnum):
    """Saga step kinds (Garcia-Molina and Salem): where a step sits decides what a failure
    after it may still undo."""

    COMPENSATABLE = "compensatable"
    """Has an undo: a later failure or a cancel runs it."""
    PIVOT = "pivot"
    """No undo: once it completes the order can only go forward."""
    RETRIABLE = "retriable"
    """No undo, after the pivot: retried until it succeeds; its permanent failure holds
    the order for an operator instead of compensating."""
    EVENT = "event"
    """Waits for a named event from outside (an approval, a webhook) until its complete-by;
    no agent, nothing to undo."""
    TIMER = "timer"
    """Waits until a time from the order (`notBefore`) or for a duration; no agent."""

    @property
    def waits(self) -> bool:
        return self in (StepKind.EVENT, StepKind.TIMER)


class OnDeadline(StrEnum):
    """What a wait whose complete-by passed does (docs/catalogue.md)."""

    COMPENSATE = "compensate"
    """As a permanent failure of the step: undo what came before (held past the pivot)."""
    HOLD = "hold"
    """Error and an operator alert; the order keeps its place."""
    ALERT = "alert"
    """An operator alert, then keep waiting until `finalDeadlineSeconds`, then hold."""


@dataclass(frozen=True)
class AgentRetry:
    initial_backoff: float = 0.2
    max_backoff: float = 5.0
    call_timeout: float = 10.0


@dataclass(frozen=True)
class AgentSpec:
    """One remote service and the Agent that wraps it."""

    name: AgentName
    service_url_setting: str
    local_service_url: str = ""
    capacity: int = 16
    outcome_queries: bool = True
    """The service answers `GET operations/{key}` (contract section 8)."""
    abandon: bool = True
    """The service answers `POST operations/{key}/abandon` (section 11); without it the
    app learns the 404 per call and falls back to waiting out the key."""
    alternatives: tuple[AgentName, ...] = ()
    """Agents that can do this agent's steps when it is unhealthy, drained or full, in
    preference order. Their services must honour the same operations and undo."""
    retry_elsewhere: bool = False
    """May a timed-out attempt's retry go to an alternative? Only when they share one
    idempotency-key space (two regions of one provider); otherwise only new dispatches
    move."""
    retry: AgentRetry = field(default_factory=AgentRetry)
    limits: AgentLimits = field(default_factory=AgentLimits)
    """`maxConcurrent` and `callsPerSecond` as declared; app settings may override them
    (settings.agent_limits)."""


@dataclass(frozen=True)
class StepDefinition:
    name: str
    """Also the remote operation the agent performs."""
    agent: AgentName
    compensation: str | None
    """The undo operation; None for pivot and retriable steps."""
    timeout_seconds: float | None = None
    """None: the app setting StepTimeoutSeconds."""
    alternatives: tuple[AgentName, ...] = ()
    """From the agent's declaration; see `AgentSpec.alternatives`."""
    retry_elsewhere: bool = False
    kind: StepKind = StepKind.COMPENSATABLE
    inputs: tuple[str, ...] = ()
    """Results of earlier steps this step's request carries, as `step.field`."""
    results: tuple[str, ...] = ()
    """The result fields later steps may take as input."""
    event: str | None = None
    """An event step: the event's name (`POST /api/orders/{id}/events/{event}`)."""
    approval: bool = False
    """An event step whose data is `{"approved": bool}`: a rejection fails the step."""
    on_deadline: OnDeadline = OnDeadline.HOLD
    final_deadline_seconds: float | None = None
    """With OnDeadline.ALERT: how long from the start of the wait it may go on."""
    until: str | None = None
    """A timer step: the order field it waits for (`notBefore`)."""
    wait_seconds: float | None = None
    """A timer step: how long it waits (when `until` is unset, or the order has none)."""

    @property
    def candidates(self) -> tuple[AgentName, ...]:
        return (self.agent, *self.alternatives) if self.agent else ()

    @property
    def waits(self) -> bool:
        return self.kind.waits

    @property
    def undoable(self) -> bool:
        return self.kind is StepKind.COMPENSATABLE and self.compensation is not None


@dataclass(frozen=True)
class Workflow:
    name: str
    steps: tuple[StepDefinition, ...]
    version: int = 1

    def index_of(self, step: str) -> int | None:
        for i, definition in enumerate(self.steps):
            if definition.name == step:
                return i
        return None

    def operation(self, step: str, compensate: bool) -> str | None:
        """The remote operation behind a step's do or undo; None when there is none."""
        index = self.index_of(step)
        if index is None:
            return None
        definition = self.steps[index]
        return definition.compensation if compensate else definition.name

    @property
    def pivot(self) -> int | None:
        """The index of the pivot step, if the workflow has one."""
        for i, definition in enumerate(self.steps):
            if definition.kind is StepKind.PIVOT:
                return i
        return None

    @property
    def agents(self) -> frozenset[AgentName]:
        return frozenset(a for s in self.steps for a in s.candidates)

    @property
    def events(self) -> frozenset[str]:
        """The events some step of this workflow waits for."""
        return frozenset(s.event for s in self.steps if s.event is not None)


@dataclass(frozen=True)
class WorkflowRef:
    """What an order pins: the workflow and the version it started on."""

    name: str
    version: int


@dataclass(frozen=True)
class Catalogue:
    """The agents and every kept version of every workflow."""

    agents: Mapping[AgentName, AgentSpec]
    workflows: tuple[Workflow, ...]
    default: str

    def get(self, name: str, version: int | None = None) -> Workflow | None:
        """A workflow's given version, or its newest when `version` is None."""
        found = [w for w in self.workflows if w.name == name]
        if version is not None:
            found = [w for w in found if w.version == version]
        return max(found, key=lambda w: w.version) if found else None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(w.name for w in self.workflows))

    def latest(self) -> tuple[Workflow, ...]:
        """The version of each workflow that new orders start on."""
        found = (self.get(name) for name in self.names)
        return tuple(w for w in found if w is not None)

    def default_workflow(self) -> Workflow:
        found = self.get(self.default)
        assert found is not None, "validated when the catalogue was loaded"
        return found

    def steps_named(self, step: str) -> tuple[StepDefinition, ...]:
        return tuple(s for w in self.workflows for s in w.steps if s.name == step)
