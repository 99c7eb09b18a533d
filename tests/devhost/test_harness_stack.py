"""The whole system as processes: up on free ports, an order through, a runtime crash."""

from __future__ import annotations

import os
from pathlib import Path

import aiohttp
import pytest

from devhost.harness.stack import Stack
from shared.contract import Setting

pytestmark = [pytest.mark.e2e, pytest.mark.azurite, pytest.mark.broker]


async def test_stack_runs_orders_and_survives_a_killed_runtime(tmp_path: Path) -> None:
    settings = {Setting.SUPERVISOR_SCHEDULE: "*/1 * * * * *", Setting.STEP_TIMEOUT_SECONDS: "5"}
    async with (
        Stack("harness", tmp_path, settings=settings, broker_lock_seconds=3) as stack,
        aiohttp.ClientSession() as session,
    ):
        assert set(stack.pids()) == {"azurite", "broker", "simulator", "runtime"}
        assert stack.settings()[Setting.INSTANCE_ID] == "harness-a1"
        app = stack.app(session)
        await stack.simulator(session).set_faults("payment", latencyMs=50)
        await app.submit_order("h-1")
        assert (await app.wait_for("h-1", timeout=60))["processState"] == "Processed"
        assert len(await stack.simulator(session).effects("h-1")) == 3
        assert (await stack.broker(session).stats())["orders"]

        instance, pid = stack.kill_runtime("a")
        assert (instance, stack.runtime_alive("a")) == ("harness-a1", False)
        stack.start_runtime("a")
        await stack.wait_healthy(session, "a")
        assert stack.pids()["runtime"] != pid
        await app.submit_order("h-2")
        assert (await app.wait_for("h-2", timeout=60))["processState"] == "Processed"
        assert [p.name for p in stack.runtime_logs()] == ["runtime-a1.log", "runtime-a2.log"]
        pids = stack.pids()
    assert stack.pids() == {}
    assert all(not _alive(pid) for pid in pids.values())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
