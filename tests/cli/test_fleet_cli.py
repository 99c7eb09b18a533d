"""`agents list|drain|undrain` and `failures` against a stand-in API: what is sent, what
is shown, and the exit codes."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from shared.cli.errors import Exit
from tests.cli.conftest import cli

AGENTS = ("inventory", "payment", "shipping", "payment-secondary")


@dataclass
class StandIn:
    url: str = ""
    drains: dict[str, dict[str, Any]] = field(default_factory=dict)
    operators: list[str] = field(default_factory=list)
    truncated: bool = False


def agent_view(stand_in: StandIn, name: str) -> dict[str, Any]:
    drain = stand_in.drains.get(name, {})
    return {
        "agent": name,
        "queue": f"agent-{name}",
        "highPriorityQueue": f"agent-{name}-high",
        "drained": drain.get("drained", False),
        "reason": drain.get("reason"),
        "since": "2026-11-24T09:00:00Z" if drain else None,
        "by": "ops" if drain else None,
        "health": None
        if name == "shipping"
        else {
            "status": "healthy",
            "detail": "healthy",
            "breaker": "closed",
            "successRate": 0.98,
            "latencyMs": 41.6,
            "inFlight": 2,
            "capacity": 16,
            "lastHeartbeat": "2026-11-24T09:00:01Z",
            "instances": 1,
        },
    }


@pytest.fixture
async def api() -> AsyncIterator[StandIn]:
    stand_in = StandIn()

    async def agents(request: web.Request) -> web.Response:
        return web.json_response({"agents": [agent_view(stand_in, a) for a in AGENTS]})

    async def drain(request: web.Request) -> web.Response:
        name = request.match_info["agent"]
        if name not in AGENTS:
            body = {"title": "Agent not found", "status": 404, "detail": f"no agent {name!r}"}
            return web.Response(
                status=404, text=json.dumps(body), content_type="application/problem+json"
            )
        stand_in.drains[name] = await request.json()
        stand_in.operators.append(request.headers.get("x-operator", ""))
        return web.json_response(agent_view(stand_in, name))

    async def failures(request: web.Request) -> web.Response:
        group = {
            "step": "charge-payment",
            "errorCode": "timeout",
            "count": 412,
            "firstAt": "2026-11-24T08:00:00Z",
            "lastAt": "2026-11-24T09:00:00Z",
            "sampleOrderIds": ["o-1", "o-2"],
        }
        return web.json_response(
            {"groups": [group], "scanned": 412, "scanCap": 10000, "truncated": stand_in.truncated}
        )

    app = web.Application()
    app.router.add_get("/api/agents", agents)
    app.router.add_put("/api/agents/{agent}/drain", drain)
    app.router.add_get("/api/failures", failures)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    stand_in.url = f"http://127.0.0.1:{port}"
    try:
        yield stand_in
    finally:
        await runner.cleanup()


def env(api: StandIn) -> dict[str, str]:
    return {"ORDERS_API_URL": api.url, "ORDERS_OPERATOR": "alice"}


async def test_agents_list_shows_a_table_and_json(api: StandIn) -> None:
    done = await cli("agents", "list", env=env(api))
    assert done.code == Exit.OK
    lines = done.out.splitlines()
    assert lines[0].split()[:3] == ["AGENT", "QUEUE", "DRAINED"]
    payment = next(line for line in lines if line.startswith("payment "))
    assert "98%" in payment and "42 ms" in payment and "2/16" in payment
    assert "never heard from" in next(line for line in lines if line.startswith("shipping"))
    as_json = await cli("agents", "list", "--json", env=env(api))
    assert [a["agent"] for a in json.loads(as_json.out)] == list(AGENTS)


async def test_drain_sends_the_flag_and_reason_then_undrain_clears_it(api: StandIn) -> None:
    done = await cli("agents", "drain", "payment", "--reason", "provider window", env=env(api))
    assert done.code == Exit.OK, done.err
    assert api.drains["payment"] == {"drained": True, "reason": "provider window"}
    assert "payment drained" in done.out and "provider window" in done.out
    listed = await cli("agents", "list", env=env(api))
    assert "yes since 2026-11-24 09:00:00Z" in listed.out
    undone = await cli("agents", "undrain", "payment", "--json", env=env(api))
    assert undone.code == Exit.OK
    assert json.loads(undone.out)["drained"] is False
    assert api.drains["payment"] == {"drained": False}
    assert api.operators == ["alice", "alice"]


async def test_an_unknown_agent_exits_3(api: StandIn) -> None:
    done = await cli("agents", "drain", "billing", env=env(api))
    assert done.code == Exit.NOT_FOUND
    assert "agent 'billing' not found" in done.err


async def test_failures_shows_the_groups_and_says_when_the_scan_was_capped(api: StandIn) -> None:
    done = await cli("failures", env=env(api))
    assert done.code == Exit.OK
    header, row = done.out.splitlines()[:2]
    assert header.split()[:4] == ["COUNT", "STEP", "ERROR", "CODE"]
    assert row.split()[:3] == ["412", "charge-payment", "timeout"] and "o-1 o-2" in row
    assert "cap" not in done.out
    api.truncated = True
    capped = await cli("failures", "--json", env=env(api))
    assert json.loads(capped.out)["truncated"] is True
    assert "only the first 412 Error orders" in (await cli("failures", env=env(api))).out


async def test_agents_needs_a_command() -> None:
    done = await cli("agents")
    assert done.code == Exit.USAGE
