"""Step heartbeats end to end: a call far longer than its step's timeout finishes with no
Supervisor recovery, because its agent keeps the step's complete-by moving."""

from __future__ import annotations

import pytest

from devhost.broker import Broker
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
