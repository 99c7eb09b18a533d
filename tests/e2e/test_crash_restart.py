"""The runtime is killed with SIGKILL mid-load and started again: every order finishes."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from devhost.broker import Broker
from devhost.simulator import SimulatorServer
from shared.contract import Setting
from tests.azurite import free_port
from tests.e2e.conftest import TERMINAL, e2e_settings

pytestmark = [pytest.mark.e2e, pytest.mark.azurite, pytest.mark.broker]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def durable_broker(tmp_path: Path) -> Iterator[Broker]:
    with Broker(
        port=0, control_port=0, db_path=str(tmp_path / "broker.sqlite3"), lock_seconds=4
    ) as b:
        yield b


def start_runtime(settings: dict[str, str], port: int, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "devhost", "--no-services", "--port", str(port)],
            cwd=ROOT,
            env={**os.environ, **settings},
            stdout=out,
            stderr=subprocess.STDOUT,
        )


async def wait_healthy(session: aiohttp.ClientSession, url: str) -> None:
    for _ in range(120):
        try:
            async with session.get(f"{url}/health") as r:
                if r.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.25)
    raise AssertionError("the runtime did not come up")


async def states(session: aiohttp.ClientSession, api: str, ids: list[str]) -> dict[str, str]:
    found = {}
    for order_id in ids:
        async with session.get(f"{api}/orders/{order_id}") as r:
            found[order_id] = (await r.json())["processState"] if r.status == 200 else "missing"
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
        api = f"http://127.0.0.1:{port}/api"
        log = tmp_path / "runtime.log"
        ids = [f"crash-{i:02d}" for i in range(30)]
        runtime = start_runtime(settings, port, log)
        try:
            async with aiohttp.ClientSession() as session:
                await wait_healthy(session, api)
                async with session.put(
                    f"{simulator.url}/_sim/faults/payment", json={"latencyMs": 1200}
                ) as r:
                    assert r.status == 200
                for order_id in ids:
                    body = {
                        "orderId": order_id,
                        "customerId": "c",
                        "items": [{"sku": "S", "quantity": 1, "unitPrice": 1.0}],
                    }
                    async with session.post(f"{api}/orders", json=body) as r:
                        assert r.status == 202
                await asyncio.sleep(0.5)
                before = await states(session, api, ids)
                runtime.send_signal(signal.SIGKILL)
                runtime.wait(10)
                assert any(s not in TERMINAL for s in before.values()), "killed too late"
                runtime = start_runtime(settings, port, log)
                await wait_healthy(session, api)
                for _ in range(240):
                    found = await states(session, api, ids)
                    if all(s in TERMINAL for s in found.values()):
                        break
                    await asyncio.sleep(0.5)
                assert all(s in TERMINAL for s in found.values()), found
                # On a loaded machine a few orders may exhaust their retries: an operator
                # resubmits them, and they finish without repeating completed steps.
                held = [order_id for order_id, s in found.items() if s == "Error"]
                for order_id in held:
                    async with session.post(f"{api}/orders/{order_id}/resubmit") as r:
                        assert r.status == 202, await r.text()
                for _ in range(240):
                    found = await states(session, api, ids)
                    if all(s in TERMINAL - {"Error"} for s in found.values()):
                        break
                    await asyncio.sleep(0.5)
                assert set(found.values()) == {"Processed"}, found
                async with session.get(f"{simulator.url}/_sim/effects") as r:
                    effects = await r.json()
                mine = [e for e in effects if e["orderId"] in ids]
                assert len(mine) == 3 * len(ids)
                assert all(e["applied"] == 1 for e in mine)
        finally:
            runtime.send_signal(signal.SIGTERM)
            try:
                runtime.wait(30)
            except subprocess.TimeoutExpired:
                runtime.kill()
        assert "devhost listening" in log.read_text()
