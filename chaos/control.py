"""Switching faults on and off through the simulator's and the broker's control APIs."""

from __future__ import annotations

from typing import Any

import aiohttp

from chaos.config import ALL_SERVICES, ChaosConfig, RemoteFaults


class ControlError(RuntimeError):
    """A control API refused a fault setting."""


async def _put(session: aiohttp.ClientSession, url: str, body: Any) -> None:
    async with session.put(url, json=body) as r:
        if r.status >= 300:
            raise ControlError(f"PUT {url} answered {r.status}: {await r.text()}")


async def switch_on(
    session: aiohttp.ClientSession, simulator: str, broker: str, config: ChaosConfig
) -> None:
    for service in ALL_SERVICES:
        faults = config.remote.for_service(service)
        await _put(session, f"{simulator}/_sim/faults/{service}", faults)
    await _put(session, f"{broker}/_broker/faults", config.broker.to_json(config.seed))


async def switch_off(session: aiohttp.ClientSession, simulator: str, broker: str) -> None:
    """Every fault off; the rejected SKUs stay rejected (a declined card stays declined)."""
    for service in ALL_SERVICES:
        await _put(session, f"{simulator}/_sim/faults/{service}", RemoteFaults.cleared(service))
    async with session.delete(f"{broker}/_broker/faults") as r:
        if r.status >= 300:
            raise ControlError(f"DELETE {broker}/_broker/faults answered {r.status}")
