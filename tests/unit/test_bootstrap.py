"""The composition root's one port hook: chaos faults and bench counters both go through
it, and the chaos fault rate comes from Settings like every other setting."""

from __future__ import annotations

from shared.adapters.chaos import ChaosMessageBus, ChaosStateStore
from shared.adapters.memory.store import InMemoryBus, InMemoryStateStore
from shared.adapters.servicebus_bus import ServiceBusMessageBus
from shared.adapters.table.store import TableStateStore
from shared.bootstrap import Ports, build, compose
from shared.contract import ChaosSetting, Setting
from shared.settings import Settings
from shared.usecases.flow.outage import WitnessedBus
from shared.usecases.flow.process_cache import ProcessCache
from tests.workflows import CATALOGUE

LOCAL = {
    Setting.STORAGE: "UseDevelopmentStorage=true",
    Setting.SERVICE_BUS: (
        "Endpoint=sb://127.0.0.1;SharedAccessKeyName=k;SharedAccessKey=v;"
        "UseDevelopmentEmulator=true;"
    ),
}


class Seen:
    """A decorator that records what it was given and wraps nothing."""

    def __init__(self) -> None:
        self.given: list[Ports] = []

    def __call__(self, ports: Ports) -> Ports:
        self.given.append(ports)
        return ports


def test_the_chaos_fault_rate_is_a_setting_off_by_default() -> None:
    assert Settings.from_env(LOCAL, catalogue=CATALOGUE).chaos_fault_rate == 0
    chaotic = Settings.from_env({**LOCAL, ChaosSetting.FAULT_RATE: "0.05"}, catalogue=CATALOGUE)
    assert chaotic.chaos_fault_rate == 0.05


def test_compose_hands_the_ports_to_the_decorator_before_any_use_case() -> None:
    store, bus = InMemoryStateStore(), InMemoryBus()
    wrapped = Ports(ChaosStateStore(store, 0.0), ChaosMessageBus(bus, 0.0))
    container = compose(
        Settings.from_env(LOCAL, catalogue=CATALOGUE), store, bus, {}, decorate=lambda _: wrapped
    )
    assert container.process.store is wrapped.store
    witness = container.process.bus
    assert isinstance(witness, WitnessedBus) and witness.bus is wrapped.bus
    assert witness.outage is container.outage, "the Supervisor reads what the bus witnessed"


def test_each_container_keeps_its_own_orders_for_the_scheduler() -> None:
    settings = Settings.from_env(LOCAL, catalogue=CATALOGUE)
    first = compose(settings, InMemoryStateStore(), InMemoryBus(), {})
    second = compose(settings, InMemoryStateStore(), InMemoryBus(), {})
    assert isinstance(first.process.cache, ProcessCache) and len(first.process.cache) == 0
    assert first.process.cache is not second.process.cache


async def test_without_a_fault_rate_build_decorates_the_real_adapters() -> None:
    seen = Seen()
    container = build(Settings.from_env(LOCAL, catalogue=CATALOGUE), seen)
    try:
        (ports,) = seen.given
        assert isinstance(ports.store, TableStateStore)
        assert isinstance(ports.bus, ServiceBusMessageBus)
    finally:
        await container.close()


async def test_chaos_faults_sit_beneath_the_decorator() -> None:
    seen = Seen()
    container = build(
        Settings.from_env({**LOCAL, ChaosSetting.FAULT_RATE: "0.5"}, catalogue=CATALOGUE), seen
    )
    try:
        (ports,) = seen.given
        assert isinstance(ports.store, ChaosStateStore)
        assert isinstance(ports.bus, ChaosMessageBus)
        assert container.process.store is ports.store
    finally:
        await container.close()
