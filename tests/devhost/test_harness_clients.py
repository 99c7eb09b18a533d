"""The control clients against the real simulator and broker, run in-process."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from devhost.broker import Broker
from devhost.harness.clients import (
    AppClient,
    BrokerControl,
    ControlError,
    SimulatorControl,
)
from devhost.harness.ports import free_port
from devhost.harness.process import StartError
from devhost.simulator import SimulatorServer


@pytest.fixture
def simulator_server() -> Iterator[SimulatorServer]:
    with SimulatorServer(port=0, seed=3) as running:
        yield running


@pytest.fixture
def broker_server() -> Iterator[Broker]:
    with Broker(port=0, control_port=0, lock_seconds=5) as running:
        yield running


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as opened:
        yield opened


async def test_simulator_faults_round_trip(
    simulator_server: SimulatorServer, session: aiohttp.ClientSession
) -> None:
    sim = SimulatorControl(session, simulator_server.url)
    assert (await sim.health())["seed"] == 3
    await sim.set_faults("payment", transientErrorRate=0.5, latencyMs=20)
    payment = (await sim.faults())["payment"]
    assert payment["transientErrorRate"] == 0.5 and payment["latencyMs"] == 20
    await sim.clear_faults()
    assert (await sim.faults())["payment"]["transientErrorRate"] == 0


async def test_simulator_refuses_an_unknown_knob(
    simulator_server: SimulatorServer, session: aiohttp.ClientSession
) -> None:
    sim = SimulatorControl(session, simulator_server.url)
    with pytest.raises(ControlError, match="answered 400"):
        await sim.set_faults("payment", transientErrorRat=0.5)
    with pytest.raises(ControlError, match="answered 404"):
        await sim.set_faults("teleport", hangRate=1)


async def test_simulator_effects_and_stats(
    simulator_server: SimulatorServer, session: aiohttp.ClientSession
) -> None:
    sim = SimulatorControl(session, simulator_server.url)
    payload = {"customerId": "c", "items": [{"sku": "A", "quantity": 1, "unitPrice": 2.0}]}
    body = {"orderId": "o-1", "idempotencyKey": "o-1:reserve", "payload": payload}
    async with session.post(f"{simulator_server.url}/inventory/reserve-inventory", json=body) as r:
        assert r.status < 300, await r.text()
    (effect,) = await sim.effects("o-1")
    assert effect["orderId"] == "o-1"
    assert await sim.effects("o-2") == []
    assert await sim.stats()
    await sim.clear_effects()
    await sim.clear_stats()
    assert await sim.effects() == []


async def test_broker_faults_and_stats(
    broker_server: Broker, session: aiohttp.ClientSession
) -> None:
    broker = BrokerControl(session, f"http://127.0.0.1:{broker_server.control_port}")
    await broker.set_faults({"duplicateRate": 0.25})
    assert (await broker.faults())["duplicateRate"] == 0.25
    await broker.clear_faults()
    assert (await broker.faults())["duplicateRate"] == 0
    assert "orders" in await broker.stats()
    with pytest.raises(ControlError, match="answered 400"):
        await broker.set_faults({"duplicateRat": 1})


def fake_app() -> web.Application:
    """A stand-in for the app's HTTP API: enough to check the client's calls."""
    seen: dict[str, int] = {}

    async def submit(request: web.Request) -> web.Response:
        body = await request.json()
        if body["orderId"] == "bad":
            return web.json_response({"title": "invalid"}, status=400)
        return web.json_response({"orderId": body["orderId"]}, status=202)

    async def order(request: web.Request) -> web.Response:
        order_id = request.match_info["orderId"]
        seen[order_id] = seen.get(order_id, 0) + 1
        state = "Processed" if seen[order_id] >= 3 else "Processing"
        return web.json_response({"orderId": order_id, "processState": state})

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "healthy"})

    app = web.Application()
    app.router.add_post("/api/orders", submit)
    app.router.add_get("/api/orders/{orderId}", order)
    app.router.add_get("/api/health", health)
    return app


async def test_app_client_submits_and_waits(session: aiohttp.ClientSession) -> None:
    async with TestServer(fake_app()) as server:
        app = AppClient(session, str(server.make_url("/api")))
        assert await app.wait_healthy(timeout=5) < 5
        assert await app.submit_order("o-1", ("A", "B"), priority="high") == {"orderId": "o-1"}
        with pytest.raises(ControlError, match="submit bad answered 400"):
            await app.submit_order("bad")
        view = await app.wait_for("o-1", timeout=5)
        assert view["processState"] == "Processed"
        with pytest.raises(TimeoutError, match="did not reach"):
            await app.wait_for("o-2", {"Error"}, timeout=0.3)


async def test_wait_healthy_gives_up(session: aiohttp.ClientSession) -> None:
    app = AppClient(session, f"http://127.0.0.1:{free_port()}/api")
    with pytest.raises(StartError, match="not healthy within"):
        await app.wait_healthy(timeout=0.3)
