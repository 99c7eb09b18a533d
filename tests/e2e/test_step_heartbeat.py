"""Step heartbeats end to end: a call far longer than its step's timeout finishes with no
Supervisor recovery, because its agent keeps the step's complete-by moving."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiohttp
import pytest

from devhost.broker import Broker
from devhost.harness.clients import AppClient, SimulatorControl
from devhost.harness.ports import LOOPBACK, free_port
from devhost.harness.process import Child
from devhost.harness.services import runtime_command
from devhost.simulator import SimulatorServer
from shared.contract import Setting
from tests.e2e.conftest import e2e_settings, running_system

pytestmark = [pytest.mark.e2e, pytest.mark.azurite, pytest.mark.broker]


async def test_a_call_three_times_the_step_timeout_completes_without_recovery(
    azurite_table_port: int,
    broker: Broker,
    simulator: SimulatorServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = e2e_settings(azurite_table_port, broker, simulator.url)
    settings[Setting.STEP_HEARTBEAT_SECONDS] = "3"
    settings[Setting.STEP_MAX_SECONDS] = "120"
    timeout = float(settings[Setting.STEP_TIMEOUT_SECONDS])
    async with running_system(settings, broker, simulator, monkeypatch) as system:
        await system.faults("inventory", slowMs=int(3 * timeout * 1000))
        await system.submit("slow-1")
        view = await system.wait_for("slow-1", timeout=120)
    assert view["processState"] == "Processed"
    assert view["failureCount"] == 0
    events = [entry["event"] for entry in view["history"]]
    assert "timed-out" not in events
    assert events.count("step-heartbeat") == 1
    reserve = next(s for s in view["steps"] if s["name"] == "reserve-inventory")
    assert reserve["attempts"] == 1


async def test_a_runtime_killed_mid_call_is_recovered_within_the_heartbeat_bound(
    azurite_table_port: int,
    broker: Broker,
    simulator: SimulatorServer,
    tmp_path: Path,
) -> None:
    """The call would take a minute: without heartbeats the step's complete-by would have
    to cover that minute, and a dead agent would be noticed only after it. With them the
    stored complete-by is at most StepHeartbeatSeconds past the kill, and the Supervisor
    (back as soon as the runtime is) recovers the step one period after that."""
    heartbeat, period, call_seconds = 3.0, 1.0, 60.0
    settings = e2e_settings(azurite_table_port, broker, simulator.url)
    settings[Setting.STEP_HEARTBEAT_SECONDS] = str(heartbeat)
    settings[Setting.STEP_MAX_SECONDS] = "120"
    port = free_port()
    command = runtime_command(port=port, state_dir=tmp_path / "devhost")
    runtime = Child("runtime", command, tmp_path / "runtime.log", env=settings)
    runtime.start()
    try:
        async with aiohttp.ClientSession() as session:
            app = AppClient(session, f"http://{LOOPBACK}:{port}/api")
            await app.wait_healthy(60, runtime)
            sim = SimulatorControl(session, simulator.url)
            await sim.set_faults("inventory", slowMs=int(call_seconds * 1000))
            await app.submit_order("killed-1", ("S",), customer_id="c", unit_price=1.0)
            beaten = await app.wait_for("killed-1", {"Processing"}, 60)
            for _ in range(120):
                events = [h["event"] for h in beaten["history"]]
                if "step-heartbeat" in events:
                    break
                await asyncio.sleep(0.25)
                beaten = await app.order("killed-1")
            assert "step-heartbeat" in events, beaten["history"]
            runtime.kill()
            killed_at = datetime.now(UTC)
            runtime.start()
            await app.wait_healthy(60, runtime)
            restarted_at = datetime.now(UTC)
            view = await app.wait_for("killed-1", {"Pending", "Processing"}, 60, failureCount=1)
    finally:
        runtime.stop(timeout=30)
    timed_out = next(h for h in view["history"] if h["event"] == "timed-out")
    deadline = datetime.fromisoformat(timed_out["detail"].rsplit(" by ", 1)[1])
    recovered_at = datetime.fromisoformat(timed_out["at"])
    dispatched_at = datetime.fromisoformat(
        next(h for h in view["history"] if h["event"] == "step-dispatched")["at"]
    )
    slack = timedelta(seconds=5)
    assert deadline <= killed_at + timedelta(seconds=heartbeat) + timedelta(seconds=0.5)
    bound = max(killed_at + timedelta(seconds=heartbeat), restarted_at)
    assert recovered_at <= bound + timedelta(seconds=period) + slack
    assert recovered_at < dispatched_at + timedelta(seconds=call_seconds)
