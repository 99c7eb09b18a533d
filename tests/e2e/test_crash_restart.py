"""The runtime is killed with SIGKILL mid-load and started again: every order finishes."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from devhost.broker import Broker
from devhost.harness.clients import AppClient, ControlError, SimulatorControl
from devhost.harness.ports import LOOPBACK, free_port
from devhost.harness.process import Child
from devhost.harness.services import runtime_command
from devhost.simulator import SimulatorServer
from shared.contract import Setting
from tests.e2e.conftest import TERMINAL, e2e_settings, until

pytestmark = [pytest.mark.e2e, pytest.mark.azurite, pytest.mark.broker]


@pytest.fixture
def durable_broker(tmp_path: Path) -> Iterator[Broker]:
    with Broker(
        port=0, control_port=0, db_path=str(tmp_path / "broker.sqlite3"), lock_seconds=4
    ) as b:
        yield b


async def states(app: AppClient, ids: list[str]) -> dict[str, str]:
    found = {}
    for order_id in ids:
        try:
            found[order_id] = (await app.order(order_id))["processState"]
        except ControlError:
            found[order_id] = "missing"
    return found


async def test_killed_runtime_restarted_finishes_every_order_once(
    azurite_table_port: int, durable_broker: Broker, tmp_path: Path
) -> None:
    with SimulatorServer(port=0, seed=5) as simulator:
        settings = e2e_settings(azurite_table_port, durable_broker, simulator.url)
        # Room for 30 orders queueing behind 16 handler slots at 1.2 s a payment.
        settings[Setting.STEP_TIMEOUT_SECONDS] = "6"
        settings[Setting.MAX_FAILURE_COUNT] = "5"
        port = free_port()
        command = runtime_command(port=port, state_dir=tmp_path / "devhost")
        runtime = Child("runtime", command, tmp_path / "runtime.log", env=settings)
        ids = [f"crash-{i:02d}" for i in range(30)]
        runtime.start()
        try:
            async with aiohttp.ClientSession() as session:
                app = AppClient(session, f"http://{LOOPBACK}:{port}/api")
                await app.wait_healthy(30, runtime)
                sim = SimulatorControl(session, simulator.url)
                await sim.set_faults("payment", latencyMs=1200)
                for order_id in ids:
                    await app.submit_order(order_id, ("S",), customer_id="c", unit_price=1.0)

                async def charging() -> bool:
                    return any(e["operation"] == "charge-payment" for e in await sim.effects())

                # Mid-load: charges (1.2 s each) have reached the payment provider.
                await until("a charge under way", charging, 60, runtime)
                before = await states(app, ids)
                runtime.kill()
                assert any(s not in TERMINAL for s in before.values()), "killed too late"
                runtime.start()
                await app.wait_healthy(30, runtime)
                for _ in range(240):
                    found = await states(app, ids)
                    if all(s in TERMINAL for s in found.values()):
                        break
                    await asyncio.sleep(0.5)
                assert all(s in TERMINAL for s in found.values()), found
                # On a loaded machine a few orders may exhaust their retries: an operator
                # resubmits them, and they finish without repeating completed steps.
                held = [order_id for order_id, s in found.items() if s == "Error"]
                for order_id in held:
                    status, answer = await app.resubmit(order_id)
                    assert status == 202, answer
                for _ in range(240):
                    found = await states(app, ids)
                    if all(s in TERMINAL - {"Error"} for s in found.values()):
                        break
                    await asyncio.sleep(0.5)
                assert set(found.values()) == {"Processed"}, found
                effects = await SimulatorControl(session, simulator.url).effects()
                mine = [e for e in effects if e["orderId"] in ids]
                # Judged as the providers see it: each step in force once, at one provider.
                # A charge whose deadline passed while the runtime was down may have been
                # abandoned at the primary (a record with nothing applied) and made at the
                # secondary.
                applied = Counter((e["orderId"], e["operation"]) for e in mine if e["applied"])
                assert set(applied.values()) == {1} and len(applied) == 3 * len(ids), applied
                assert all(
                    e["applied"] == 1 or (e["applied"] == 0 and e["abandoned"]) for e in mine
                )
        finally:
            runtime.stop(timeout=30)
        assert "devhost listening" in runtime.output()
