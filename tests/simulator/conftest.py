"""Fixtures: a real simulator on a free port and a small typed HTTP client for it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest

from devhost.simulator import SimulatorServer
from tests.simulator.scripted_provider import ScriptedProvider

SEED = 1234

ORDER: dict[str, Any] = {
    "customerId": "cust-1",
    "items": [
        {"sku": "SKU-1", "quantity": 2, "unitPrice": 10.5},
        {"sku": "SKU-2", "quantity": 1, "unitPrice": 4},
    ],
}
ORDER_AMOUNT = 25.0


@dataclass(frozen=True)
class Reply:
    status: int
    body: Any
    headers: dict[str, str]
    content_type: str


class SimClient:
    """Speaks the agents' side (service calls) and the operator's side (``/_sim``)."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str) -> None:
        self.session = session
        self.base_url = base_url

    async def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        data: str | None = None,
        headers: dict[str, str] | None = None,
        time_limit: float | None = None,
    ) -> Reply:
        client_timeout = aiohttp.ClientTimeout(total=time_limit) if time_limit else None
        async with self.session.request(
            method,
            self.base_url + path,
            json=json,
            data=data,
            headers=headers,
            timeout=client_timeout,
        ) as response:
            text = await response.text()
            return Reply(
                status=response.status,
                body=None if not text else await response.json(content_type=None),
                headers=dict(response.headers),
                content_type=response.content_type,
            )

    async def call(
        self,
        service: str,
        operation: str,
        order_id: str,
        key: str | None,
        payload: dict[str, Any] | None = None,
        *,
        headers: dict[str, str] | None = None,
        time_limit: float | None = None,
    ) -> Reply:
        body: dict[str, Any] = {
            "orderId": order_id,
            "payload": ORDER if payload is None else payload,
        }
        if key is not None:
            body["idempotencyKey"] = key
        return await self.request(
            "POST", f"/{service}/{operation}", json=body, headers=headers, time_limit=time_limit
        )

    async def outcome(self, service: str, key: str) -> Reply:
        """Ask ``GET /{service}/operations/{key}``, the key percent-encoded like a client must."""
        return await self.request("GET", f"/{service}/operations/{quote(key, safe='')}")

    async def outcome_when(self, service: str, key: str, status: int) -> Reply:
        """Ask until the answer has ``status``; for effects settling in the background."""
        for _ in range(50):
            reply = await self.outcome(service, key)
            if reply.status == status:
                return reply
            await asyncio.sleep(0.1)
        raise AssertionError(f"{service} {key}: still {reply.status} {reply.body}")

    async def put_faults(self, service: str, settings: Any) -> Reply:
        return await self.request("PUT", f"/_sim/faults/{service}", json=settings)

    async def effects(self, query: str = "") -> list[dict[str, Any]]:
        reply = await self.request("GET", "/_sim/effects" + query)
        assert reply.status == 200
        effects: list[dict[str, Any]] = reply.body
        return effects

    async def effect(self, key: str) -> dict[str, Any]:
        [effect] = [item for item in await self.effects() if item["idempotencyKey"] == key]
        return effect

    async def untimed_effect(self, key: str) -> dict[str, Any]:
        """The key's ledger entry without its times, which only ordering tests pin down;
        ``firstCallAt`` is always there, ``appliedAt`` exactly when something applied."""
        return untimed(await self.effect(key))

    async def abandon(self, service: str, key: str) -> Reply:
        return await self.request("POST", f"/{service}/operations/{quote(key, safe='')}/abandon")

    async def stats(self, service: str) -> dict[str, int]:
        reply = await self.request("GET", "/_sim/stats")
        stats: dict[str, int] = reply.body[service]
        return stats

    async def counted(self, service: str, stat: str, count: int = 1) -> bool:
        """Whether the service's counter `stat` reached `count`: for waiting until calls
        have arrived and begun to hang (``hangs``) or to be slow (``slowCalls``)."""
        return (await self.stats(service))[stat] >= count


def untimed(effect: dict[str, Any]) -> dict[str, Any]:
    assert isinstance(effect["firstCallAt"], str)
    assert (effect["appliedAt"] is not None) == bool(effect["applied"])
    return {k: v for k, v in effect.items() if k not in ("firstCallAt", "appliedAt")}


@pytest.fixture
def simulator() -> Iterator[SimulatorServer]:
    with SimulatorServer(seed=SEED) as server:
        yield server


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    # No connection cap: the concurrency tests open hundreds at once.
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        yield session


@pytest.fixture
def sim(simulator: SimulatorServer, session: aiohttp.ClientSession) -> SimClient:
    return SimClient(session, simulator.url)


@pytest.fixture
async def provider() -> AsyncIterator[ScriptedProvider]:
    """A scripted provider on a free port (see scripted_provider)."""
    started = ScriptedProvider()
    await started.start()
    try:
        yield started
    finally:
        await started.close()
