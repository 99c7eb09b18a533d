"""Composition root for the real adapters: built lazily, once per worker and event loop.

Nothing here runs at import time, so the Functions host can index the app even when a
setting is missing; the first invocation that needs a client builds them all. The
catalogue is read here too, and handed to whatever needs it: nothing else in the app
reads the file.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import aiohttp
from azure.identity.aio import DefaultAzureCredential

from shared.adapters.blob_archive import BlobArchive, blob_service_client
from shared.adapters.chaos import ChaosMessageBus, ChaosStateStore
from shared.adapters.clock import SystemClock
from shared.adapters.http_remote import HttpRemoteService
from shared.adapters.memory.customers import InMemoryCustomerLedger
from shared.adapters.memory.limits import InMemoryLimitStore
from shared.adapters.memory.reconcile import InMemoryReconcileStore
from shared.adapters.memory.store import InMemoryBulkStore, InMemoryHealthStore, InMemoryStateStore
from shared.adapters.servicebus_bus import ServiceBusMessageBus
from shared.adapters.table.archive import TableArchiveStore
from shared.adapters.table.bulk import TableBulkStore
from shared.adapters.table.client import table_service_client
from shared.adapters.table.customers import TableCustomerLedger
from shared.adapters.table.health import TableHealthStore
from shared.adapters.table.limits import TableLimitStore
from shared.adapters.table.reconcile import TableReconcileStore
from shared.adapters.table.store import TableStateStore
from shared.adapters.traced import traced, traced_remote
from shared.catalogue import catalogue_file, load
from shared.contract import Queue, agent_queue
from shared.domain.workflow import AgentName, Catalogue
from shared.gc_tuning import tune_for_long_lived_worker
from shared.ports import (
    ArchiveBlobs,
    ArchiveStore,
    BulkStore,
    Clock,
    CustomerLedger,
    HealthStore,
    LimitStore,
    MessageBus,
    ReconcileStore,
    RemoteService,
    StateStore,
)
from shared.resilience import CircuitBreaker
from shared.settings import Settings
from shared.telemetry import setup as telemetry
from shared.telemetry.logsafe import guard_root_handlers
from shared.usecases.flow.agent import AgentDeps
from shared.usecases.flow.agent_health import HealthMonitor
from shared.usecases.flow.deps import ProcessDeps
from shared.usecases.flow.outage import Outage, WitnessedBus
from shared.usecases.flow.outcomes import Asked, OutcomeQueries
from shared.usecases.flow.process_cache import ProcessCache
from shared.usecases.flow.routing import RoutingSource
from shared.usecases.flow.step_heartbeat import StepHeartbeats
from shared.usecases.flow.step_hold import StepHolds
from shared.usecases.limits.customers import Customers
from shared.usecases.limits.limiter import AgentLimiter
from shared.usecases.operations.health_check import HealthCheck, Probe


@dataclass
class Container:
    settings: Settings
    process: ProcessDeps
    remotes: dict[AgentName, RemoteService]
    monitors: dict[AgentName, HealthMonitor] = field(default_factory=dict)
    """Per agent: its circuit breaker, throttle and health, one each per instance."""
    session: aiohttp.ClientSession | None = None
    health: HealthStore = field(default_factory=InMemoryHealthStore)
    """Agent heartbeats and Supervisor sweeps (ops records; in the state table when built)."""
    bulk: BulkStore | None = None
    """Bulk jobs and their scan of orders; None when the store has no bulk adapter."""
    reconcile: ReconcileStore | None = None
    """Reconciliation's sample of finished orders and its runs; None as for `bulk`."""
    limits: LimitStore = field(default_factory=InMemoryLimitStore)
    """The rows that hold agents' limits across instances (in the state table when built)."""
    limiters: dict[AgentName, AgentLimiter | None] = field(default_factory=dict)

    archive: ArchiveStore | None = None
    """The archiver's rows in the state table; None without a table store or blobs."""
    archive_blobs: ArchiveBlobs | None = None
    """The archive's pages; None where no blob service is configured."""
    outage: Outage = field(default_factory=Outage)
    """What this instance has seen of its bus and store being down; the Supervisor's."""
    health_check: HealthCheck | None = None
    """`/api/health`'s probes of the store and the bus; None: built from `process`."""

    @property
    def catalogue(self) -> Catalogue:
        """The agents and workflows this instance runs (its settings were read against it)."""
        return self.settings.catalogue

    def probes(self) -> HealthCheck:
        if self.health_check is None:
            self.health_check = HealthCheck(
                {
                    "stateStore": Probe(self.process.store.ping),
                    "serviceBus": Probe(self.process.bus.ping),
                },
                self.process.clock,
            )
        return self.health_check

    async def close(self) -> None:
        """Release the clients (the local runtime and tests; the Functions host never stops)."""
        ledger = self.process.customers.ledger if self.process.customers is not None else None
        resources = (self.health, self.limits, self.process.store, self.process.bus, ledger)
        for resource in (*resources, self.archive_blobs):
            closer = getattr(resource, "close", None)
            if closer is not None:
                await closer()
        if self.session is not None:
            await self.session.close()

    def monitor(self, name: AgentName) -> HealthMonitor:
        monitor = self.monitors.get(name)
        if monitor is None:
            clock = self.process.clock
            monitor = self.monitors[name] = HealthMonitor(
                name,
                self.process.instance_id,
                CircuitBreaker(name, clock),
                clock,
                AGENT_CAPACITY,
                limits=self.settings.agent_limits.get(name),
            )
        return monitor

    def limiter(self, name: AgentName) -> AgentLimiter | None:
        """None for an agent without limits: its calls touch no limit row."""
        if name not in self.limiters:
            limits = self.settings.agent_limits.get(name)
            self.limiters[name] = (
                AgentLimiter(
                    name,
                    limits,
                    self.limits,
                    self.process.clock,
                    self.process.instance_id,
                    self.settings.clock_skew,
                )
                if limits is not None and limits.limited
                else None
            )
        return self.limiters[name]

    def outcome_queries(self) -> OutcomeQueries:
        """The Supervisor asks each agent's service through that agent's own breaker."""
        return OutcomeQueries(
            {
                name: Asked(
                    traced_remote(remote, name, self.monitor(name).breaker),
                    self.monitor(name).breaker,
                )
                for name, remote in self.remotes.items()
            },
            self.process.clock,
        )

    def agent(self, name: AgentName) -> AgentDeps:
        monitor = self.monitor(name)
        return AgentDeps(
            agent=name,
            bus=self.process.bus,
            clock=self.process.clock,
            remote=traced_remote(self.remotes[name], name, monitor.breaker),
            breaker=monitor.breaker,
            throttle=monitor.throttle,
            monitor=monitor,
            health=self.health,
            step_heartbeats=StepHeartbeats(
                self.process.work, self.process.clock, self.process.policy
            ),
            limiter=self.limiter(name),
            step_holds=StepHolds(self.process.work, self.process.clock, self.process.policy),
            catalogue=self.catalogue,
        )


AGENT_CAPACITY = 16
"""Requests one instance serves at once per agent queue: host.json maxConcurrentCalls."""


@dataclass(frozen=True)
class Ports:
    """The two ports every process use case writes through, as a decorator sees them."""

    store: StateStore
    bus: MessageBus


PortDecorator = Callable[[Ports], Ports]
"""Wraps the built ports without the use cases knowing: chaos faults, bench's counters."""

_current: tuple[asyncio.AbstractEventLoop, Container] | None = None
_decorate: PortDecorator | None = None


def catalogue() -> Catalogue:
    """The catalogue the app runs: the file the setting `CatalogueFile` names (by default
    catalogue.json beside function_app.py), read once per file. The agents' triggers are
    registered from it when the app is indexed, so it is the one thing read at import."""
    return _read(catalogue_file())


@cache
def _read(path: Path) -> Catalogue:
    return load(path)


async def container() -> Container:
    """Building has no awaits, so two invocations on one loop cannot both build."""
    global _current
    loop = asyncio.get_running_loop()
    if _current is None or _current[0] is not loop:
        _current = (loop, build(Settings.from_env(catalogue=catalogue()), _decorate))
    return _current[1]


def decorate_ports(decorator: PortDecorator | None) -> None:
    """Wrap the ports of every container built from now on (bench counts calls through
    the app's own functions this way); None stops it. Never called in a deployed app."""
    global _decorate
    _decorate = decorator


def use(container: Container) -> None:
    """Install a container (tests, the local runtime) for the running loop."""
    global _current
    _current = (asyncio.get_running_loop(), container)


def reset() -> None:
    global _current
    _current = None


async def shutdown() -> None:
    """Close the running loop's container, if any, and forget it."""
    global _current
    if _current is not None and _current[0] is asyncio.get_running_loop():
        await _current[1].close()
    _current = None


def compose(
    settings: Settings,
    store: StateStore,
    bus: MessageBus,
    remotes: dict[AgentName, RemoteService],
    clock: Clock | None = None,
    health: HealthStore | None = None,
    decorate: PortDecorator | None = None,
    ledger: CustomerLedger | None = None,
    limits: LimitStore | None = None,
    blobs: ArchiveBlobs | None = None,
    probes: Mapping[str, Probe] | None = None,
) -> Container:
    """Without a health store the ops records stay in memory (tests, tools), and so does
    the customer ledger without one. `decorate` wraps the store and the bus before any
    use case sees them. `probes`: what `/api/health` asks (by default the store's and the
    bus's pings, with no count of failed calls)."""
    health = health if health is not None else InMemoryHealthStore()
    clock = clock or SystemClock()
    ports = Ports(store, bus)
    if decorate is not None:
        ports = decorate(ports)
    outage = Outage()
    process = ProcessDeps(
        store=ports.store,
        bus=WitnessedBus(ports.bus, outage, clock),
        clock=clock,
        policy=settings.policy,
        instance_id=settings.instance_id,
        routing=RoutingSource(health, clock),
        cache=ProcessCache(),
        customers=_customers(settings, ledger),
        catalogue=settings.catalogue,
    )
    return Container(
        settings=settings,
        process=process,
        remotes=remotes,
        health=health,
        bulk=_bulk_store(store),
        reconcile=_reconcile_store(store),
        limits=limits if limits is not None else InMemoryLimitStore(),
        archive=TableArchiveStore(store)
        if blobs is not None and isinstance(store, TableStateStore)
        else None,
        archive_blobs=blobs,
        outage=outage,
        health_check=HealthCheck(probes, clock) if probes is not None else None,
    )


def _customers(settings: Settings, ledger: CustomerLedger | None) -> Customers | None:
    """None unless a customer rule is set: with neither, no customer record is kept."""
    policy = settings.customer_policy
    if not policy.active:
        return None
    recheck = min(settings.step_timeout, settings.high_priority_step_timeout)
    return Customers(ledger or InMemoryCustomerLedger(), policy, recheck)


def _bulk_store(store: StateStore) -> BulkStore | None:
    """Bulk jobs live beside the orders they scan, in the same store (undecorated: a
    job's own records are not an order's state)."""
    if isinstance(store, TableStateStore):
        return TableBulkStore(store)
    if isinstance(store, InMemoryStateStore):
        return InMemoryBulkStore(store)
    return None


def _reconcile_store(store: StateStore) -> ReconcileStore | None:
    """Beside the orders it samples, undecorated like the bulk store."""
    if isinstance(store, TableStateStore):
        return TableReconcileStore(store)
    if isinstance(store, InMemoryStateStore):
        return InMemoryReconcileStore(store)
    return None


def build(settings: Settings, decorate: PortDecorator | None = None) -> Container:
    """The real adapters; with a chaos fault rate set, crashes are injected beneath
    `decorate`, and with telemetry configured the ports are traced above it all. The
    clients' timeouts are the adapters' (table_client, servicebus_bus)."""
    tracing = telemetry.configure()
    guard_root_handlers()
    credentials: dict[str | None, DefaultAzureCredential] = {}

    def identity(client_id: str | None) -> DefaultAzureCredential:
        """One credential per identity: storage and Service Bus may use different ones."""
        if client_id not in credentials:
            credentials[client_id] = DefaultAzureCredential(managed_identity_client_id=client_id)
        return credentials[client_id]

    if settings.storage.connection_string:
        tables = table_service_client(connection_string=settings.storage.connection_string)
    else:
        tables = table_service_client(
            endpoint=settings.storage.endpoint, credential=identity(settings.storage.client_id)
        )
    if settings.service_bus.connection_string:
        bus = ServiceBusMessageBus.from_connection_string(settings.service_bus.connection_string)
    else:
        assert settings.service_bus.endpoint is not None
        bus = ServiceBusMessageBus.from_namespace(
            settings.service_bus.endpoint, identity(settings.service_bus.client_id)
        )
    bus.open_early(opened_at_start(settings.catalogue))
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256))
    remotes: dict[AgentName, RemoteService] = {
        name: HttpRemoteService(url, session) for name, url in settings.service_urls.items()
    }
    store = TableStateStore(tables, settings.state_table)
    health = TableHealthStore(tables, settings.state_table)
    blobs = _archive_blobs(settings, identity)
    if settings.chaos_fault_rate > 0:
        decorate = _then(_chaos(settings.chaos_fault_rate), decorate)
    if tracing:
        decorate = trace_ports if decorate is None else _then(decorate, trace_ports)
    active = settings.customer_policy.active
    ledger = TableCustomerLedger(tables, settings.state_table) if active else None
    limits = TableLimitStore(tables, settings.state_table)
    built = compose(
        settings,
        store,
        bus,
        remotes,
        health=health,
        decorate=decorate,
        ledger=ledger,
        limits=limits,
        blobs=blobs,
        probes={
            "stateStore": Probe(store.ping, lambda: store.failures),
            "serviceBus": Probe(bus.ping, lambda: bus.failures),
        },
    )
    built.session = session
    tune_for_long_lived_worker()
    return built


def opened_at_start(catalogue: Catalogue) -> tuple[str, ...]:
    """The queues an order's messages go to when nothing goes wrong, the intake's first:
    their links open as the worker starts (`ServiceBusMessageBus.open_early`), not under
    its first burst. The high lanes and the alerts open when first used."""
    return (
        Queue.SCHEDULER,
        Queue.ORDER_STATUS,
        *(agent_queue(name) for name in catalogue.agents),
        Queue.AGENT_REPLIES,
    )


def _archive_blobs(
    settings: Settings, identity: Callable[[str | None], DefaultAzureCredential]
) -> BlobArchive | None:
    """The archive's container in the tables' own account, by the same identity."""
    found = settings.archive_storage
    if found is None:
        return None
    if found.connection_string:
        return BlobArchive(blob_service_client(connection_string=found.connection_string))
    return BlobArchive(
        blob_service_client(endpoint=found.endpoint, credential=identity(found.client_id))
    )


def _chaos(rate: float) -> PortDecorator:
    def inject(ports: Ports) -> Ports:
        return Ports(ChaosStateStore(ports.store, rate), ChaosMessageBus(ports.bus, rate))

    return inject


def trace_ports(ports: Ports) -> Ports:
    """Spans for every store call and send, and the trace context on every message."""
    return Ports(*traced(ports.store, ports.bus))


def _then(inner: PortDecorator, outer: PortDecorator | None) -> PortDecorator:
    return inner if outer is None else lambda ports: outer(inner(ports))
