"""What each blueprint is handed: its handler, built by the composition root.

`shared.bootstrap` builds the adapters into a Container, once per worker and event loop;
this module builds, from that container, the one handler each group of Functions needs:
the ports, the catalogue, the settings it reads, and nothing else. A blueprint holds its
provider from import and asks it on each invocation; no blueprint sees the container.

A handler is a few fields read off the container, so it is built on each call rather
than kept. Importing the app builds nothing (indexing never needs a setting), a setting
that is wrong still surfaces at the first invocation, and a container installed or
changed (tests, the local runtime) is seen by the very next call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from shared import bootstrap
from shared.bootstrap import Container
from shared.domain.workflow import AgentName, Catalogue
from shared.functions.poison import DeadLetters
from shared.functions.signin import Gate
from shared.ports import (
    ArchiveBlobs,
    ArchiveStore,
    Clock,
    HealthStore,
    ReconcileStore,
    StateStore,
)
from shared.usecases.flow.agent import AgentDeps
from shared.usecases.flow.agent_health import HealthMonitor, HealthProbe
from shared.usecases.flow.deps import ProcessDeps
from shared.usecases.flow.outage import Outage
from shared.usecases.flow.outcomes import OutcomeQueries
from shared.usecases.history.archive import Archiver
from shared.usecases.operations.bulk import BulkDeps
from shared.usecases.operations.health_check import HealthCheck
from shared.usecases.operations.reconcile import Reconciler

Handler = TypeVar("Handler")


def agents() -> tuple[AgentName, ...]:
    """The catalogue's agents: the app registers two triggers for each when it is
    indexed, so this is the one read of the catalogue at import."""
    return tuple(bootstrap.catalogue().agents)


class Provided(Generic[Handler]):
    """A blueprint's handler, built from the running loop's container when asked."""

    def __init__(self, build: Callable[[Container], Handler]) -> None:
        self._build = build

    async def __call__(self) -> Handler:
        return self._build(await bootstrap.container())


def _dead_letters(c: Container) -> DeadLetters:
    return DeadLetters(c.process.bus, c.process.clock)


def _gate(c: Container) -> Gate:
    return Gate(c.settings.operator_auth, c.settings.token_policy)


@dataclass(frozen=True)
class Intake:
    """`POST /api/orders` and the `orders` queue."""

    process: ProcessDeps
    catalogue: Catalogue
    reply_to_allow_list: frozenset[str]
    dead_letters: DeadLetters


@dataclass(frozen=True)
class Scheduling:
    """The Scheduler's nudges and the agents' replies, on both lanes."""

    process: ProcessDeps
    dead_letters: DeadLetters


@dataclass(frozen=True)
class AgentWork:
    """Each agent's two lanes and the agents' heartbeat timer."""

    deps: Callable[[AgentName], AgentDeps]
    """One agent's ports, breaker, throttle and limits (kept per agent by the container)."""
    dead_letters: DeadLetters
    watched: Callable[[], list[tuple[HealthMonitor, HealthProbe]]]
    """Every catalogue agent's monitor and service, for the heartbeat to probe."""
    health: HealthStore


@dataclass(frozen=True)
class Supervising:
    """The Supervisor's timer."""

    process: ProcessDeps
    health: HealthStore
    outage: Outage
    queries: OutcomeQueries


@dataclass(frozen=True)
class Orders:
    """One order at a time: inspect, list, the operator's actions, and `/api/health`."""

    process: ProcessDeps
    catalogue: Catalogue
    archive: ArchiveStore | None
    archive_blobs: ArchiveBlobs | None
    gate: Gate


@dataclass(frozen=True)
class Events:
    """An outside system's events and an operator's approvals."""

    process: ProcessDeps
    signing_secret: str | None
    archive: ArchiveStore | None
    gate: Gate


@dataclass(frozen=True)
class Fleet:
    """The agents (drain, undrain)."""

    health: HealthStore
    clock: Clock
    catalogue: Catalogue
    gate: Gate


@dataclass(frozen=True)
class Failures:
    """The Error orders grouped by failure."""

    store: StateStore
    gate: Gate


@dataclass(frozen=True)
class Bulk:
    """Bulk jobs; `deps` is None on a store without a bulk adapter."""

    deps: BulkDeps | None
    catalogue: Catalogue
    gate: Gate


@dataclass(frozen=True)
class Reconciling:
    """Reconciliation; `reconciler` is None on a store without a reconcile adapter."""

    reconciler: Reconciler | None
    gate: Gate


@dataclass(frozen=True)
class Archiving:
    """The archive; `archiver` is None without a table store and a blob service."""

    archiver: Archiver | None
    archive_blobs: ArchiveBlobs | None
    gate: Gate


@dataclass(frozen=True)
class OperatorPage:
    """The operator page and the snapshot it polls."""

    process: ProcessDeps
    health: HealthStore
    reconcile: ReconcileStore | None
    trace_query_url: str | None
    gate: Gate


@dataclass(frozen=True)
class Workflows:
    """The catalogue's workflows as the API shows them."""

    catalogue: Catalogue
    gate: Gate


def _agent_work(c: Container) -> AgentWork:
    return AgentWork(
        deps=c.agent,
        dead_letters=_dead_letters(c),
        watched=lambda: [(c.monitor(name), c.remotes[name]) for name in c.catalogue.agents],
        health=c.health,
    )


def _reconciler(c: Container) -> Reconciler | None:
    if c.reconcile is None:
        return None
    return Reconciler(
        store=c.reconcile,
        queries=c.outcome_queries(),
        bus=c.process.bus,
        clock=c.process.clock,
        instance=c.process.instance_id,
        policy=c.process.policy,
        sample_size=c.settings.reconcile_sample_size,
        catalogue=c.catalogue,
    )


def _archiver(c: Container) -> Archiver | None:
    if c.archive is None or c.archive_blobs is None:
        return None
    return Archiver(
        store=c.process.store,
        archive=c.archive,
        blobs=c.archive_blobs,
        clock=c.process.clock,
        instance=c.process.instance_id,
        policy=c.settings.retention,
    )


def _bulk(c: Container) -> BulkDeps | None:
    if c.bulk is None:
        return None
    return BulkDeps(c.process, c.bulk, c.settings.bulk_actions_per_second)


intake = Provided(
    lambda c: Intake(c.process, c.catalogue, c.settings.reply_to_allow_list, _dead_letters(c))
)
scheduling = Provided(lambda c: Scheduling(c.process, _dead_letters(c)))
agent_work = Provided(_agent_work)
supervising = Provided(lambda c: Supervising(c.process, c.health, c.outage, c.outcome_queries()))
orders = Provided(lambda c: Orders(c.process, c.catalogue, c.archive, c.archive_blobs, _gate(c)))
health: Provided[HealthCheck] = Provided(Container.probes)
"""`/api/health`'s probes of the store and the bus (kept by the container)."""
events = Provided(lambda c: Events(c.process, c.settings.event_signing_secret, c.archive, _gate(c)))
fleet = Provided(lambda c: Fleet(c.health, c.process.clock, c.catalogue, _gate(c)))
failures = Provided(lambda c: Failures(c.process.store, _gate(c)))
bulk = Provided(lambda c: Bulk(_bulk(c), c.catalogue, _gate(c)))
reconciling = Provided(lambda c: Reconciling(_reconciler(c), _gate(c)))
archiving = Provided(lambda c: Archiving(_archiver(c), c.archive_blobs, _gate(c)))
operator_page = Provided(
    lambda c: OperatorPage(c.process, c.health, c.reconcile, c.settings.trace_query_url, _gate(c))
)
workflows = Provided(lambda c: Workflows(c.catalogue, _gate(c)))
