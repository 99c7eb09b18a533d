"""Switching faults on and off through the simulator's and the broker's control APIs."""

from __future__ import annotations

from chaos.config import ALL_SERVICES, ChaosConfig, RemoteFaults
from devhost.harness.clients import BrokerControl, SimulatorControl


async def switch_on(
    simulator: SimulatorControl, broker: BrokerControl, config: ChaosConfig
) -> None:
    for service in ALL_SERVICES:
        await simulator.set_faults(service, **config.remote.for_service(service))
    await broker.set_faults(config.broker.to_json(config.seed))


async def switch_off(simulator: SimulatorControl, broker: BrokerControl) -> None:
    """Every fault off; the rejected SKUs stay rejected (a declined card stays declined)."""
    for service in ALL_SERVICES:
        await simulator.set_faults(service, **RemoteFaults.cleared(service))
    await broker.clear_faults()
