"""The simulator and the trace receiver answer only loopback host names and take no
write from another origin (issue 27, item 7): a web page the developer opens can reach
loopback, and the simulator's ledger and faults are what the tests judge and inject."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from devhost.otlp.app import make_runner
from devhost.otlp.store import SpanStore
from devhost.simulator.server import SimulatorServer

pytestmark = pytest.mark.e2e

WRITES = {"simulator": "/_sim/faults/payment", "trace receiver": "/v1/traces"}
READS = {"simulator": "/_sim/health", "trace receiver": "/api/traces"}


@pytest.fixture(params=["simulator", "trace receiver"])
async def server(request: pytest.FixtureRequest) -> AsyncIterator[tuple[str, str]]:
    if request.param == "simulator":
        with SimulatorServer() as simulator:
            yield request.param, simulator.url
        return
    store = SpanStore(None)
    runner = make_runner(store)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        yield request.param, f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()
        store.close()


async def test_a_foreign_host_name_is_misdirected(server: tuple[str, str]) -> None:
    name, url = server
    async with aiohttp.ClientSession() as session:
        for host in ("attacker.example", "attacker.example:80", "127.0.0.1.nip.io"):
            async with session.get(url + READS[name], headers={"Host": host}) as r:
                assert r.status == 421, (host, await r.text())
                assert r.content_type == "application/problem+json"
        for host in ("localhost", "127.0.0.1", "LOCALHOST:1234"):
            async with session.get(url + READS[name], headers={"Host": host}) as r:
                assert r.status == 200, (host, await r.text())


async def test_a_write_from_another_origin_is_forbidden(server: tuple[str, str]) -> None:
    name, url = server
    async with aiohttp.ClientSession() as session:
        async with session.request(
            "PUT" if name == "simulator" else "POST",
            url + WRITES[name],
            json={},
            headers={"Origin": "https://attacker.example"},
        ) as r:
            assert r.status == 403, await r.text()
            assert r.content_type == "application/problem+json"
        async with session.get(
            url + READS[name], headers={"Origin": "https://attacker.example"}
        ) as r:
            assert r.status == 200, "a read is not a write (the operator page reads traces)"
        async with session.request(
            "PUT" if name == "simulator" else "POST", url + WRITES[name], json={}
        ) as r:
            assert r.status != 403, "no Origin: not a browser's cross-site request"
