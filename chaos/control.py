"""Switching faults on and off through the simulator's and the broker's control APIs."""

from __future__ import annotations

from chaos.config import ALL_SERVICES, ChaosConfig
from devhost.harness.clients import BrokerControl, SimulatorControl


async def switch_on(
    simulator: SimulatorControl, broker: BrokerControl, config: ChaosConfig
) -> None:
    for service in ALL_SERVICES:
        await simulator.set_faults(service, **config.remote.for_service(service))
    await broker.set_faults(config.broker.to_json(config.seed))


async def switch_off(
    simulator: SimulatorControl, broker: BrokerControl, config: ChaosConfig
) -> None:
    """Every fault off; the rejected SKUs stay rejected (a declined card stays declined)
    and a provider without the abandon route still lacks it."""
    for service in ALL_SERVICES:
        await simulator.set_faults(service, **config.remote.cleared(service))
    await broker.clear_faults()


async def slow_down(simulator: SimulatorControl, config: ChaosConfig, slow: bool) -> None:
    """The slow phase's provider: its faults with (or back without) `slowMs`."""
    phase = config.slow
    slow_ms = phase.slow_ms if slow else 0
    await simulator.set_faults(
        phase.service, **config.remote.for_service(phase.service, slow_ms=slow_ms)
    )
