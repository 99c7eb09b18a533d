"""The CLI acting as a signed-in operator (docs/cli.md#signing-in): a bearer token, or
locally a principal with roles; what it sends, what it says when refused, and that the
token is never printed."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from shared.cli.errors import Exit
from shared.domain.principal import PRINCIPAL_HEADER, Role
from tests.cli.conftest import cli

TOKEN = "eyJ.token-not-for-printing.sig"
ORDER = {
    "processState": "Processed",
    "attempt": 1,
    "failureCount": 0,
    "steps": [],
    "history": [],
}


@pytest.fixture
async def api() -> AsyncIterator[tuple[str, list[web.Request]]]:
    seen: list[web.Request] = []

    async def listing(request: web.Request) -> web.Response:
        seen.append(request)
        if request.headers.get("authorization") == "Bearer stale-token":
            body = {
                "title": "Unauthorized",
                "status": 401,
                "detail": "the bearer token has expired",
            }
            return web.json_response(body, status=401, content_type="application/problem+json")
        return web.json_response({"items": [], "continuation": None})

    async def order(request: web.Request) -> web.Response:
        seen.append(request)
        return web.json_response({"orderId": request.match_info["orderId"]} | ORDER)

    app = web.Application()
    app.router.add_get("/api/orders", listing)
    app.router.add_get("/api/ops/orders/{orderId}", order)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}", seen
    finally:
        await runner.cleanup()


def principal_of(request: web.Request) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(base64.b64decode(request.headers[PRINCIPAL_HEADER]))
    return document


async def test_a_token_goes_as_a_bearer_token_and_is_never_printed(
    api: tuple[str, list[web.Request]],
) -> None:
    url, seen = api
    assert (await cli("orders", "list", "--url", url, "--token", TOKEN)).code == 0
    assert seen[-1].headers["authorization"] == f"Bearer {TOKEN}"
    assert PRINCIPAL_HEADER not in seen[-1].headers
    from_env = await cli("orders", "list", env={"ORDERS_API_URL": url, "ORDERS_API_TOKEN": TOKEN})
    assert from_env.code == 0 and seen[-1].headers["authorization"] == f"Bearer {TOKEN}"


async def test_a_refused_token_exits_4_with_the_servers_reason(
    api: tuple[str, list[web.Request]],
) -> None:
    url, _ = api
    result = await cli("orders", "list", "--url", url, "--token", "stale-token")
    assert result.code == Exit.AUTH and "the bearer token has expired" in result.err


async def test_a_principal_goes_as_the_platforms_header_with_its_roles(
    api: tuple[str, list[web.Request]],
) -> None:
    url, seen = api
    result = await cli(
        "orders", "list", "--url", url, "--principal", "rita", "--role", "Orders.Read"
    )
    assert result.code == 0
    sent = principal_of(seen[-1])
    claims = {(c["typ"], c["val"]) for c in sent["claims"]}
    assert claims == {("name", "rita"), ("roles", Role.READ.value)}
    assert sent["name_typ"] == "name" and sent["role_typ"] == "roles"
    both = await cli("orders", "list", env={"ORDERS_API_URL": url, "ORDERS_PRINCIPAL": "oscar"})
    assert both.code == 0
    roles = {c["val"] for c in principal_of(seen[-1])["claims"] if c["typ"] == "roles"}
    assert roles == {r.value for r in Role}


async def test_a_token_and_a_principal_together_are_a_usage_error(
    api: tuple[str, list[web.Request]],
) -> None:
    url, seen = api
    result = await cli("orders", "list", "--url", url, "--token", TOKEN, "--principal", "rita")
    assert result.code == Exit.USAGE and "not both" in result.err and not seen
    assert TOKEN not in result.err


async def test_a_signed_in_operator_reads_an_order_from_the_operator_route(
    api: tuple[str, list[web.Request]],
) -> None:
    url, seen = api
    result = await cli("orders", "show", "o-1", "--url", url, "--token", TOKEN, "--json")
    assert result.code == 0, result
    assert seen[-1].path == "/api/ops/orders/o-1"
