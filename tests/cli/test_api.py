"""The HTTP side against a stand-in API: paging, the key header, and every error path.

A stand-in is needed for 401/403: the local runtime, like Core Tools, checks no keys.
"""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from aiohttp import web

from shared.cli.errors import Exit
from shared.contract import Setting
from shared.domain.event_signature import WINDOW_SECONDS, refusal
from tests.cli.conftest import cli

KEY = "admin-key-not-for-printing"


@dataclass
class StandIn:
    url: str
    seen: list[web.Request] = field(default_factory=list)
    bodies: list[Any] = field(default_factory=list)
    status: dict[str, int] = field(default_factory=dict)


def problem(status: int, detail: str) -> web.Response:
    body = {"title": "x", "status": status, "detail": detail}
    return web.Response(
        status=status, text=json.dumps(body), content_type="application/problem+json"
    )


@pytest.fixture
async def api() -> AsyncIterator[StandIn]:
    stand_in = StandIn("")
    orders = [{"orderId": f"o-{i}", "processState": "Error", "failureCount": 3} for i in range(5)]

    async def listing(request: web.Request) -> web.Response:
        stand_in.seen.append(request)
        if request.headers.get("x-functions-key") != KEY:
            return problem(403 if "x-functions-key" in request.headers else 401, "key")
        if request.query.get("state") == "Pending":
            return problem(503, "the state store is unavailable")
        start = int(request.query.get("continuation", "0"))
        size = int(request.query["pageSize"])
        end = start + size
        page = {"items": orders[start:end], "continuation": str(end) if end < 5 else None}
        return web.json_response(page)

    async def order(request: web.Request) -> web.Response:
        return problem(404, f"no order with id {request.match_info['orderId']!r}")

    async def resubmit(request: web.Request) -> web.Response:
        stand_in.seen.append(request)
        order_id = request.match_info["orderId"]
        if order_id == "busy":
            return problem(409, "order busy is Processing, not Error")
        if order_id == "gone":
            return problem(404, "no order with id 'gone'")
        return web.json_response(
            {"orderId": order_id, "processState": "Pending", "attempt": 2, "failureCount": 0},
            status=202,
        )

    async def act(request: web.Request) -> web.Response:
        stand_in.seen.append(request)
        stand_in.bodies.append(await request.json() if request.can_read_body else None)
        order_id, action = request.match_info["orderId"], request.match_info["action"]
        if order_id == "done":
            return problem(409, f"order done is Processed: cannot {action}")
        if order_id == "gone":
            return problem(404, "no order with id 'gone'")
        state = {"cancel": "Compensating", "suspend": "Suspended", "resume": "Pending"}[action]
        return web.json_response(
            {"orderId": order_id, "processState": state, "attempt": 1, "failureCount": 0},
            status=202,
        )

    async def event(request: web.Request) -> web.Response:
        stand_in.seen.append(request)
        stand_in.bodies.append(await request.read())
        order_id, name = request.match_info["orderId"], request.match_info["name"]
        return web.json_response({"orderId": order_id, "event": name, "eventId": "e-1"}, status=202)

    async def approval(request: web.Request) -> web.Response:
        stand_in.seen.append(request)
        sent = await request.json()
        stand_in.bodies.append(sent)
        order_id = request.match_info["orderId"]
        if order_id == "done":
            return problem(409, "order done is Processed: it waits for nothing")
        answer = {
            "orderId": order_id,
            "event": sent.get("event", "review"),
            "eventId": sent["eventId"],
            "approved": sent["approved"],
            "by": request.headers.get("x-operator"),
        }
        return web.json_response(answer, status=202)

    app = web.Application()
    app.router.add_get("/api/orders", listing)
    app.router.add_post("/api/orders/{orderId}/events/{name}", event)
    app.router.add_post("/api/orders/{orderId}/approval", approval)
    app.router.add_get("/api/orders/{orderId}", order)
    app.router.add_post("/api/orders/{orderId}/resubmit", resubmit)
    app.router.add_post("/api/orders/{orderId}/{action:cancel|suspend|resume}", act)
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


def env(api: StandIn, key: str | None = KEY) -> dict[str, str]:
    return {"ORDERS_API_URL": api.url, **({"ORDERS_API_KEY": key} if key else {})}


async def test_all_follows_continuation_and_sends_the_key(api: StandIn) -> None:
    result = await cli("orders", "list", "--page-size", "2", "--all", "--json", env=env(api))
    assert result.code == Exit.OK, result.err
    body = json.loads(result.out)
    assert [o["orderId"] for o in body["items"]] == [f"o-{i}" for i in range(5)]
    assert body["continuation"] is None
    assert [r.query.get("continuation") for r in api.seen] == [None, "2", "4"]


async def test_one_page_tells_how_to_get_the_next(api: StandIn) -> None:
    result = await cli("orders", "list", "--state", "ERROR", "--page-size", "2", env=env(api))
    assert result.code == Exit.OK
    assert result.out.splitlines()[-1] == "more orders: add --all, or --continuation 2"
    assert api.seen[0].query["state"] == "Error"


@pytest.mark.parametrize(("key", "status"), [(None, "401"), ("wrong-key-value", "403")])
async def test_a_missing_or_refused_key_exits_4_without_printing_it(
    api: StandIn, key: str | None, status: str
) -> None:
    result = await cli("orders", "list", env=env(api, key))
    assert result.code == Exit.AUTH
    assert f"HTTP {status}" in result.err and result.err.count("\n") == 1
    assert "wrong-key-value" not in result.err + result.out
    assert (key is None) == ("pass --key or set ORDERS_API_KEY" in result.err)


async def test_unknown_order_exits_3(api: StandIn) -> None:
    result = await cli("orders", "show", "nope", env=env(api))
    assert result.code == Exit.NOT_FOUND
    assert result.err == (
        "python -m shared.cli: error: order 'nope' not found (no order with id 'nope')\n"
    )


async def test_unavailable_api_exits_5(api: StandIn) -> None:
    result = await cli("orders", "list", "--state", "Pending", env=env(api))
    assert result.code == Exit.UNREACHABLE
    assert "unavailable (HTTP 503): the state store is unavailable" in result.err


async def test_unreachable_api_exits_5() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    result = await cli("orders", "show", "o-1", "--url", url, "--key", KEY)
    assert result.code == Exit.UNREACHABLE
    assert result.err.startswith(f"python -m shared.cli: error: cannot reach the API at {url}")
    assert KEY not in result.err


async def test_resubmit_reports_each_order_and_explains_409(api: StandIn) -> None:
    result = await cli(
        "orders", "resubmit", "o-1", "busy", "gone", "--operator", "ann", env=env(api)
    )
    assert result.code == Exit.FAILED
    rows = {line.split()[0]: line for line in result.out.splitlines()[1:]}
    assert "resubmitted  Pending, attempt 2, failures 0" in rows["o-1"]
    assert "refused" in rows["busy"]
    assert "only an order in Error can be resubmitted: order busy is Processing" in rows["busy"]
    assert "not found" in rows["gone"]
    assert {r.headers["x-operator"] for r in api.seen} == {"ann"}


async def test_resubmit_json_lists_each_answer(api: StandIn) -> None:
    result = await cli("orders", "resubmit", "gone", "o-2", "--json", env=env(api))
    assert result.code == Exit.NOT_FOUND
    answers: list[dict[str, Any]] = json.loads(result.out)
    assert [(a["orderId"], a["result"]) for a in answers] == [
        ("gone", "not found"),
        ("o-2", "resubmitted"),
    ]


async def test_cancel_sends_the_reason_and_reports_each_order(api: StandIn) -> None:
    result = await cli(
        "orders",
        "cancel",
        "o-1",
        "done",
        "--reason",
        "customer asked",
        "--operator",
        "ann",
        env=env(api),
    )
    assert result.code == Exit.FAILED
    rows = {line.split()[0]: line for line in result.out.splitlines()[1:]}
    assert "cancelling  Compensating, attempt 1, failures 0" in rows["o-1"]
    assert "cannot be cancelled: order done is Processed" in rows["done"]
    assert api.bodies == [{"reason": "customer asked"}] * 2
    assert {r.headers["x-operator"] for r in api.seen} == {"ann"}


async def test_cancel_without_a_reason_sends_no_body(api: StandIn) -> None:
    result = await cli("orders", "cancel", "o-1", "--json", env=env(api))
    assert result.code == Exit.OK, result.err
    assert api.bodies == [None]
    (answer,) = json.loads(result.out)
    assert (answer["result"], answer["state"]["processState"]) == ("cancelling", "Compensating")


@pytest.mark.parametrize(
    ("action", "result", "state"),
    [("suspend", "suspended", "Suspended"), ("resume", "resumed", "Pending")],
)
async def test_suspend_and_resume_json_and_exit_codes(
    api: StandIn, action: str, result: str, state: str
) -> None:
    done = await cli("orders", action, "o-1", "gone", "--json", env=env(api))
    assert done.code == Exit.NOT_FOUND
    answers: list[dict[str, Any]] = json.loads(done.out)
    assert [(a["orderId"], a["result"]) for a in answers] == [
        ("o-1", result),
        ("gone", "not found"),
    ]
    assert answers[0]["state"]["processState"] == state
    refused = await cli("orders", action, "done", env=env(api))
    assert refused.code == Exit.FAILED
    assert "refused" in refused.out


async def test_send_event_signs_for_its_order_and_event_at_the_time_of_sending(
    api: StandIn,
) -> None:
    """What the CLI sends verifies as the server checks it, and only for that order and
    event: a captured request replayed to another order does not (docs/events.md)."""
    secret = "cli-signing-secret"
    before = datetime.now(UTC)
    result = await cli(
        "orders",
        "send-event",
        "o-1",
        "review",
        "--event-id",
        "e-1",
        "--approve",
        env={**env(api), Setting.EVENT_SIGNING_SECRET: secret},
    )
    assert result.code == Exit.OK, result.err
    (request,) = api.seen
    (raw,) = api.bodies
    signature = request.headers["x-signature"]
    t = int(signature.split(",")[0].removeprefix("t="))
    assert int(before.timestamp()) <= t <= int(datetime.now(UTC).timestamp())
    assert refusal(signature, secret, "o-1", "review", raw, datetime.now(UTC)) is None
    assert refusal(signature, secret, "o-2", "review", raw, datetime.now(UTC)) is not None
    assert refusal(signature, secret, "o-1", "other", raw, datetime.now(UTC)) is not None
    later = before + timedelta(seconds=WINDOW_SECONDS + 5)
    assert refusal(signature, secret, "o-1", "review", raw, later) is not None


async def test_approve_and_reject_go_to_the_operator_route_as_the_operator(
    api: StandIn,
) -> None:
    approved = await cli(
        "orders", "approve", "o-1", "--event-id", "a-1", "--operator", "ann", env=env(api)
    )
    assert approved.code == Exit.OK, approved.err
    assert approved.out == "o-1: review (a-1) approved by ann\n"
    rejected = await cli(
        "orders",
        "reject",
        "o-2",
        "--event-id",
        "r-1",
        "--comment",
        "wrong address",
        "--event",
        "review",
        "--json",
        env=env(api),
    )
    assert rejected.code == Exit.OK, rejected.err
    assert json.loads(rejected.out)["approved"] is False
    refused = await cli("orders", "approve", "done", "--event-id", "a-2", env=env(api))
    assert refused.code == Exit.FAILED and "waits for nothing" in refused.err
    assert api.bodies == [
        {"eventId": "a-1", "approved": True},
        {"eventId": "r-1", "approved": False, "comment": "wrong address", "event": "review"},
        {"eventId": "a-2", "approved": True},
    ]
    assert "x-signature" not in api.seen[0].headers
