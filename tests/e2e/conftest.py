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
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

import aiohttp
import pytest
from azure.servicebus.aio import ServiceBusClient

import function_app
from devhost.broker import Broker
from devhost.harness.clients import TERMINAL as TERMINAL_STATES
from devhost.harness.clients import AppClient, SimulatorControl
from devhost.harness.process import Child
from devhost.host.loader import functions_of
from devhost.host.runtime import LocalHost
from devhost.simulator import SimulatorServer
from devhost.simulator.judge import LedgerEntry, OrderToJudge, Step, Verdict, judge
from shared import bootstrap
from shared.contract import Queue, Route, Setting
from shared.settings import azurite_connection_string
from tests.workflows import AGENTS, ORDER_FULFILMENT, WORKFLOWS

TERMINAL = set(TERMINAL_STATES)


T = TypeVar("T")


async def until(what: str, check: Callable[[], Awaitable[T]], timeout: float, child: Child) -> T:
    """Poll `check` until it answers something true (returned); a `child` that exits
    meanwhile ends the wait at once with its log tail."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        child.check()
        last = await check()
        if last:
            return last
        await asyncio.sleep(0.1)
    raise AssertionError(f"{what} not within {timeout:.0f} s (last: {last})")


def e2e_settings(table_port: int, broker: Broker, simulator_url: str) -> dict[str, str]:
    return {
        Setting.STORAGE: azurite_connection_string(table_port),
        Setting.SERVICE_BUS: broker.connection_string,
        Setting.STATE_TABLE: f"e2e{uuid.uuid4().hex[:12]}",
        Setting.SUPERVISOR_SCHEDULE: "*/1 * * * * *",
        Setting.RECONCILE_SCHEDULE: "0 0 * * * *",
        Setting.ARCHIVE_SCHEDULE: "0 0 0 1 1 *",
        Setting.AGENT_HEARTBEAT_SCHEDULE: "*/5 * * * * *",
        Setting.BULK_ACTIONS_SCHEDULE: "*/5 * * * * *",
        # Room for a step on a loaded 2-core machine, where broker, simulator and host
        # share one process; tests that need a timeout hang far longer than this.
        Setting.STEP_TIMEOUT_SECONDS: "6",
        Setting.PENDING_TIMEOUT_SECONDS: "8",
        Setting.MAX_FAILURE_COUNT: "3",
        Setting.EXHAUSTED_POLICY: "hold",
        Setting.REPLY_TO_ALLOW_LIST: Queue.ORDER_STATUS,
        **{spec.service_url_setting: f"{simulator_url}/{name}" for name, spec in AGENTS.items()},
        Setting.INSTANCE_ID: "e2e-host",
    }


@dataclass
class System:
    """The running system as the tests see it: the app's API and the simulator's
    control API through the harness clients, the in-process broker, the settings."""

    api: str
    simulator: str
    broker: Broker
    session: aiohttp.ClientSession
    settings: dict[str, str]
    app: AppClient = field(init=False)
    sim: SimulatorControl = field(init=False)

    def __post_init__(self) -> None:
        self.app = AppClient(self.session, self.api)
        self.sim = SimulatorControl(self.session, self.simulator)

    async def submit(
        self, order_id: str, skus: tuple[str, ...] = ("SKU-1",), workflow: str | None = None
    ) -> dict[str, Any]:
        return await self.app.submit_order(order_id, skus, workflow=workflow)

    async def order(self, order_id: str) -> dict[str, Any]:
        return await self.app.order(order_id)

    async def wait_for(
        self, order_id: str, states: set[str] = TERMINAL, timeout: float = 60, **fields: Any
    ) -> dict[str, Any]:
        return await self.app.wait_for(order_id, states, timeout, **fields)

    async def faults(self, service: str, **faults: Any) -> None:
        await self.sim.set_faults(service, **faults)

    async def clear_faults(self) -> None:
        await self.sim.clear_faults()

    async def effects(self, order_id: str) -> list[dict[str, Any]]:
        return await self.sim.effects(order_id)

    async def net_effect(self, order_id: str) -> Verdict:
        """The net-effect judge's verdict (docs/simulator.md) on the order as it stands.

        Meant for a terminal order whose requests can no longer apply: the tests' hangs
        never apply, and their latency or slowness is over before the order moves on.
        """
        view = await self.order(order_id)
        workflow = WORKFLOWS.get(str(view.get("workflow")), ORDER_FULFILMENT)
        steps = [Step(s.name, s.compensation) for s in workflow.steps]
        entries = [LedgerEntry.from_json(e) for e in await self.effects(order_id)]
        return judge(entries, [OrderToJudge(order_id, str(view["processState"]))], steps)

    async def assert_net_effect(self, order_id: str) -> None:
        """A Processed order has each step in force at one service, a Compensated or
        Cancelled one nothing in force; the judge's violations are the message."""
        verdict = await self.net_effect(order_id)
        assert verdict.judged == (order_id,), verdict
        assert verdict.passed, [str(v) for v in verdict.violations]

    async def sweeps_after(self, moment: datetime, count: int, timeout: float = 60) -> None:
        """Wait until the Supervisor has finished `count` sweeps that started after
        `moment`: the signal that it has looked at what was there by then."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            async with self.session.get(self.app.url(Route.OPS_DATA)) as response:
                data = await response.json()
            started = [datetime.fromisoformat(s["startedAt"]) for s in data.get("sweeps", [])]
            if sum(1 for at in started if at > moment) >= count:
                return
            await asyncio.sleep(0.2)
        raise TimeoutError(f"fewer than {count} sweeps after {moment}")

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
        await host.listening()
        async with aiohttp.ClientSession() as session:
            yield System(host.api_url, simulator.url, broker, session, settings)
    finally:
        await host.stop()
        await bootstrap.shutdown()
