"""Limits on local runtimes sharing one table, one broker and one simulator
(docs/limits.md): an agent's `callsPerSecond` holds across two, a provider's `429`s slow
the agents without a failure counted against any order, and a burst waiting for our
own limit is never counted either."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from devhost.broker import Broker
from devhost.harness.clients import AppClient, SimulatorControl
from devhost.harness.ports import LOOPBACK, free_port
from devhost.harness.process import Child
from devhost.harness.services import runtime_command
from devhost.harness.stack import Stack
from devhost.simulator import SimulatorServer
from shared.contract import Setting
from tests.e2e.conftest import TERMINAL, e2e_settings

pytestmark = [pytest.mark.e2e, pytest.mark.azurite, pytest.mark.broker]

ORDERS = 16
ROOMY_STEP_TIMEOUT = "30"
"""The step timeout of the two tests whose orders must count no failure for reasons other
than a deadline: the e2e default (6 s) is room for one step, but here 16 orders queue for 5
calls a second, or for a provider that answers 3 a second, and a busy machine then delivers a
request past 6 s, a timeout the product must count. Those tests are about the limit holding
and the 429s slowing the agents; the one about waiting past a complete-by keeps its 3 s."""


@contextlib.asynccontextmanager
async def runtimes(
    settings: dict[str, str],
    tmp_path: Path,
    session: aiohttp.ClientSession,
    names: tuple[str, ...] = ("a", "b"),
) -> AsyncIterator[list[AppClient]]:
    children: list[Child] = []
    apps = []
    try:
        for name in names:
            port = free_port()
            env = {**settings, Setting.INSTANCE_ID: f"e2e-{name}"}
            command = runtime_command(port=port, state_dir=tmp_path / name)
            child = Child(f"runtime-{name}", command, tmp_path / f"{name}.log", env=env)
            children.append(child.start())
            apps.append(AppClient(session, f"http://{LOOPBACK}:{port}/api"))
        for app, child in zip(apps, children, strict=True):
            await app.wait_healthy(60, child)
        yield apps
    finally:
        for child in children:
            child.stop(timeout=30)


async def run_orders(apps: list[AppClient], prefix: str) -> list[dict[str, Any]]:
    """Submit ORDERS orders through both runtimes at once; each one's final view."""
    ids = [f"{prefix}-{i:02d}" for i in range(ORDERS)]
    await asyncio.gather(
        *(
            apps[i % 2].submit_order(order_id, ("S",), customer_id="c", unit_price=1.0)
            for i, order_id in enumerate(ids)
        )
    )
    return list(
        await asyncio.gather(*(apps[0].wait_for(order_id, TERMINAL, 90) for order_id in ids))
    )


@pytest.fixture
def simulator() -> Any:
    with SimulatorServer(port=0, seed=11) as running:
        yield running


@pytest.fixture
def broker() -> Any:
    with Broker(port=0, control_port=0, lock_seconds=10) as running:
        yield running


async def test_a_calls_per_second_limit_on_payment_holds_across_two_runtimes(
    azurite_table_port: int, broker: Broker, simulator: SimulatorServer, tmp_path: Path
) -> None:
    settings = e2e_settings(azurite_table_port, broker, simulator.url)
    settings["AgentLimits__payment__callsPerSecond"] = "5"
    settings[Setting.STEP_TIMEOUT_SECONDS] = ROOMY_STEP_TIMEOUT
    async with (
        aiohttp.ClientSession() as session,
        runtimes(settings, tmp_path, session) as apps,
    ):
        views = await run_orders(apps, "rate")
        stats = (await SimulatorControl(session, simulator.url).stats())["payment"]

    assert stats["maxCallsInOneSecond"] <= 5, stats  # 5/s plus 10%: 5 whole calls
    assert [v["processState"] for v in views] == ["Processed"] * ORDERS
    assert [v["failureCount"] for v in views] == [0] * ORDERS


async def test_a_providers_429s_on_shipping_leave_every_order_processed_with_no_failure(
    azurite_table_port: int, broker: Broker, simulator: SimulatorServer, tmp_path: Path
) -> None:
    settings = e2e_settings(azurite_table_port, broker, simulator.url)
    settings[Setting.STEP_TIMEOUT_SECONDS] = ROOMY_STEP_TIMEOUT
    async with (
        aiohttp.ClientSession() as session,
        runtimes(settings, tmp_path, session) as apps,
    ):
        sim = SimulatorControl(session, simulator.url)
        await sim.set_faults("shipping", rateLimitPerSecond=3)
        views = await run_orders(apps, "quota")
        stats = (await sim.stats())["shipping"]

    assert stats["rateLimited"] > 0, "the provider did refuse calls"
    assert [v["processState"] for v in views] == ["Processed"] * ORDERS
    assert [v["failureCount"] for v in views] == [0] * ORDERS


async def test_orders_waiting_for_our_own_calls_per_second_count_no_failure(
    tmp_path: Path,
) -> None:
    """More charges at once than payment's `callsPerSecond` lets through in a step
    timeout: most wait for their slot past the complete-by they were sent with, and with
    the agent's 16 handlers taken, the rest would wait in the broker. A wait for our own
    limit is no failure (docs/limits.md): every order ends Processed with nothing
    counted, and payment never sees more in a second than the contract allows: its
    limit plus 10% in whole calls, at 5/s none (docs/limits.md). Calls woken later
    than their slot allows book another slot and hold their step for it.

    The whole stack runs as processes (`Stack`): the simulator that counts the calls
    shares no interpreter with the broker, so its clock reads arrivals, not a GIL."""
    orders, limit = 40, 5
    settings = {
        Setting.SUPERVISOR_SCHEDULE: "*/1 * * * * *",
        Setting.STEP_TIMEOUT_SECONDS: "3",
        "AgentLimits__payment__callsPerSecond": str(limit),
    }
    ids = [f"wait-{i:02d}" for i in range(orders)]
    async with (
        Stack("limitwait", tmp_path, settings=settings) as stack,
        aiohttp.ClientSession() as session,
    ):
        app = stack.app(session)
        # One order through first, so the burst meets open links, not a cold start.
        await app.submit_order("warm-up", ("S",), customer_id="c", unit_price=1.0)
        await app.wait_for("warm-up", {"Processed"}, 120)
        await asyncio.gather(
            *(
                app.submit_order(order_id, ("S",), customer_id=f"c-{i}", unit_price=1.0)
                for i, order_id in enumerate(ids)
            )
        )
        # One order polled at a time: 40 pollers would load the runtime they watch, and
        # its own steps have a 3 s timeout.
        views = [await app.wait_for(o, TERMINAL, 300) for o in ids]
        stats = (await stack.simulator(session).stats())["payment"]

    counted = {
        v["orderId"]: [h["detail"] for h in v["history"] if h["event"] == "timed-out"]
        for v in views
        if v["failureCount"]
    }
    assert counted == {}, "a wait for our own limit was counted"
    assert [v["processState"] for v in views] == ["Processed"] * orders
    assert stats["maxCallsInOneSecond"] <= limit, stats
