"""The whole system on the local runtime: real Azurite, the local broker, the simulator.

Everything runs on free ports, so the suite never collides with a developer's running
`python -m devhost`; the test goes through HTTP and the real SDK only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from azure.servicebus.aio import ServiceBusClient

import function_app
from devhost.broker import Broker
from devhost.host.loader import functions_of
from devhost.host.runtime import LocalHost
from devhost.simulator import SimulatorServer
from shared import bootstrap
from shared.contract import Queue, Setting
from shared.domain.workflow import AGENTS
from shared.settings import azurite_connection_string

TERMINAL = {"Processed", "Compensated", "Error"}


def e2e_settings(table_port: int, broker: Broker, simulator_url: str) -> dict[str, str]:
    return {
        Setting.STORAGE: azurite_connection_string(table_port),
        Setting.SERVICE_BUS: broker.connection_string,
        Setting.STATE_TABLE: f"e2e{uuid.uuid4().hex[:12]}",
        Setting.SUPERVISOR_SCHEDULE: "*/1 * * * * *",
        Setting.STEP_TIMEOUT_SECONDS: "2",
        Setting.PENDING_TIMEOUT_SECONDS: "8",
        Setting.MAX_FAILURE_COUNT: "3",
        Setting.EXHAUSTED_POLICY: "hold",
        Setting.REPLY_TO_ALLOW_LIST: Queue.ORDER_STATUS,
        **{
            spec.service_url_setting: f"{simulator_url}/{name.value}"
            for name, spec in AGENTS.items()
        },
        Setting.INSTANCE_ID: "e2e-host",
    }


@dataclass
class System:
    api: str
    simulator: str
    broker: Broker
    session: aiohttp.ClientSession
    settings: dict[str, str]

    async def submit(self, order_id: str, skus: tuple[str, ...] = ("SKU-1",)) -> dict[str, Any]:
        body = {
            "orderId": order_id,
            "customerId": "c-1",
            "items": [{"sku": s, "quantity": 1, "unitPrice": 5.0} for s in skus],
        }
        async with self.session.post(f"{self.api}/orders", json=body) as r:
            assert r.status == 202, await r.text()
            answer: dict[str, Any] = await r.json()
            return answer

    async def order(self, order_id: str) -> dict[str, Any]:
        async with self.session.get(f"{self.api}/orders/{order_id}") as r:
            assert r.status == 200, await r.text()
            view: dict[str, Any] = await r.json()
            return view

    async def wait_for(
        self, order_id: str, states: set[str] = TERMINAL, timeout: float = 60, **fields: Any
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        view: dict[str, Any] = {}
        while time.monotonic() < deadline:
            view = await self.order(order_id)
            if view["processState"] in states and all(view.get(k) == v for k, v in fields.items()):
                return view
            await asyncio.sleep(0.2)
        raise AssertionError(f"order {order_id} did not reach {states} {fields}: {view}")

    async def faults(self, service: str, **faults: Any) -> None:
        async with self.session.put(f"{self.simulator}/_sim/faults/{service}", json=faults) as r:
            assert r.status == 200, await r.text()

    async def clear_faults(self) -> None:
        async with self.session.delete(f"{self.simulator}/_sim/faults"):
            pass

    async def effects(self, order_id: str) -> list[dict[str, Any]]:
        url = f"{self.simulator}/_sim/effects?orderId={order_id}"
        async with self.session.get(url) as r:
            found: list[dict[str, Any]] = await r.json()
            return found

    async def drain(self, queue: str, order_id: str) -> list[dict[str, Any]]:
        """Receive (and complete) what is on a queue for one order, with the real SDK."""
        found: list[dict[str, Any]] = []
        async with (
            ServiceBusClient.from_connection_string(self.broker.connection_string) as client,
            client.get_queue_receiver(queue, max_wait_time=1) as receiver,
        ):
            for _ in range(20):
                batch = await receiver.receive_messages(max_message_count=50, max_wait_time=0.5)
                if not batch:
                    break
                for message in batch:
                    body = json.loads(b"".join(message.body))
                    await receiver.complete_message(message)
                    if body.get("orderId") == order_id:
                        found.append(body)
        return found


@pytest.fixture
def broker() -> Iterator[Broker]:
    with Broker(port=0, control_port=0, lock_seconds=10) as running:
        yield running


@pytest.fixture
def simulator() -> Iterator[SimulatorServer]:
    with SimulatorServer(port=0, seed=11) as running:
        yield running


@pytest.fixture
async def system(
    azurite_table_port: int,
    broker: Broker,
    simulator: SimulatorServer,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[System]:
    settings = e2e_settings(azurite_table_port, broker, simulator.url)
    async with running_system(settings, broker, simulator, monkeypatch) as started:
        yield started


@contextlib.asynccontextmanager
async def running_system(
    settings: dict[str, str],
    broker: Broker,
    simulator: SimulatorServer,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[System]:
    """The local runtime on a free port with these settings (also set in the env)."""
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    bootstrap.reset()
    host = LocalHost(functions_of(function_app.app), settings, port=0, drain_timeout=5)
    await host.start()
    try:
        async with aiohttp.ClientSession() as session:
            yield System(host.api_url, simulator.url, broker, session, settings)
    finally:
        await host.stop()
        await bootstrap.shutdown()
