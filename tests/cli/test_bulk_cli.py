"""`orders bulk` against a stand-in API: the preview first, the confirmation (refused
without a terminal unless --yes), the job's progress until Done, and the exit codes."""

from __future__ import annotations

import argparse
import io
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from shared.cli import commands
from shared.cli.args import parse
from shared.cli.commands import Console
from shared.cli.config import ApiConfig
from shared.cli.errors import Exit
from tests.cli.conftest import cli

PREVIEW = {
    "matched": 412,
    "sampleOrderIds": ["o-1", "o-2"],
    "effects": [{"operation": "refund-payment", "count": 412}],
}

MIGRATE_PREVIEW = {
    "matched": 3,
    "sampleOrderIds": ["n-1", "n-2", "n-3"],
    "effects": [],
    "refused": 1,
    "refusals": [{"orderId": "c-1", "reason": "order c-1: step 2 (charge-payment) differs"}],
}


@dataclass
class StandIn:
    url: str = ""
    posted: list[dict[str, Any]] = field(default_factory=list)
    operators: list[str] = field(default_factory=list)
    polls: int = 0
    failed: int = 0


@pytest.fixture
async def api() -> AsyncIterator[StandIn]:
    stand_in = StandIn()

    async def bulk(request: web.Request) -> web.Response:
        body = await request.json()
        stand_in.posted.append(body)
        stand_in.operators.append(request.headers.get("x-operator", ""))
        if not body.get("filter"):
            problem = {"title": "Empty filter", "status": 400, "detail": "name something"}
            return web.Response(
                status=400, text=json.dumps(problem), content_type="application/problem+json"
            )
        if body.get("dryRun"):
            if body.get("action") == "migrate":
                return web.json_response(MIGRATE_PREVIEW)
            return web.json_response(PREVIEW)
        return web.json_response(
            {"bulkId": "b" * 32, "matched": 412},
            status=202,
            headers={"Location": f"/api/bulk/{'b' * 32}"},
        )

    async def job(request: web.Request) -> web.Response:
        stand_in.polls += 1
        done = stand_in.polls >= 3
        return web.json_response(
            {
                "bulkId": request.match_info["bulkId"],
                "action": "cancel",
                "state": "Done" if done else "Running",
                "matched": 412,
                "done": 412 - stand_in.failed if done else 100 * stand_in.polls,
                "skipped": 0,
                "failed": stand_in.failed if done else 0,
            }
        )

    app = web.Application()
    app.router.add_post("/api/orders/bulk", bulk)
    app.router.add_get("/api/bulk/{bulkId}", job)
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


FILTER = ("--state", "Error", "--step", "charge-payment", "--error-code", "timeout")


async def test_a_dry_run_shows_the_preview_and_starts_nothing(api: StandIn) -> None:
    done = await cli("orders", "bulk", "cancel", *FILTER, "--dry-run", env=env(api))
    assert done.code == Exit.OK, done.err
    assert "cancel would act on 412 orders" in done.out
    assert "refund-payment" in done.out and "o-1 o-2" in done.out
    assert api.posted == [
        {
            "action": "cancel",
            "filter": {"state": "Error", "step": "charge-payment", "errorCode": "timeout"},
            "dryRun": True,
        }
    ]
    as_json = await cli("orders", "bulk", "cancel", *FILTER, "--dry-run", "--json", env=env(api))
    assert json.loads(as_json.out) == PREVIEW


async def test_without_yes_and_without_a_terminal_it_refuses_after_the_preview(
    api: StandIn,
) -> None:
    done = await cli("orders", "bulk", "cancel", *FILTER, env=env(api))
    assert done.code == Exit.FAILED
    assert "412 orders" in done.out
    assert "pass --yes" in done.err
    assert [p.get("dryRun") for p in api.posted] == [True]


async def test_with_yes_it_starts_the_job_and_follows_it_until_done(api: StandIn) -> None:
    done = await cli(
        "orders",
        "bulk",
        "cancel",
        *FILTER,
        "--limit",
        "500",
        "--yes",
        "--interval",
        "0.01",
        env=env(api),
    )
    assert done.code == Exit.OK, done.err
    assert api.posted == [
        {
            "action": "cancel",
            "filter": {"state": "Error", "step": "charge-payment", "errorCode": "timeout"},
            "limit": 500,
        }
    ]
    assert api.operators == ["alice"]
    lines = done.out.splitlines()
    assert "Running, 100 done" in lines[0] and "Done, 412 done" in lines[-1]


async def test_a_job_with_failures_exits_1_and_no_wait_returns_at_once(api: StandIn) -> None:
    api.failed = 2
    done = await cli(
        "orders",
        "bulk",
        "resubmit",
        "--state",
        "Error",
        "--yes",
        "--interval",
        "0.01",
        "--json",
        env=env(api),
    )
    assert done.code == Exit.FAILED
    assert json.loads(done.out)["failed"] == 2
    quick = await cli(
        "orders", "bulk", "resubmit", "--customer", "c-1", "--yes", "--no-wait", env=env(api)
    )
    assert quick.code == Exit.OK and f"bulk {'b' * 32} started on 412 orders" in quick.out


async def test_a_confirmed_prompt_starts_it_and_a_no_does_not(api: StandIn) -> None:
    args = parse(["orders", "bulk", "suspend", "--state", "Pending", "--no-wait"])
    config = ApiConfig(url=api.url, key=None, operator="alice", timeout=5)
    out = io.StringIO()
    asked: list[str] = []

    def no(question: str) -> bool:
        asked.append(question)
        return False

    assert await commands.orders_bulk(args, config, Console(out, False), no) == Exit.FAILED
    assert asked == ["suspend 412 orders? [y/N] "] and "not started" in out.getvalue()
    assert await commands.orders_bulk(args, config, Console(out, False), lambda q: True) == 0
    assert [p.get("dryRun", False) for p in api.posted] == [True, True, False]


@pytest.mark.parametrize(
    "argv",
    [
        ("orders", "bulk", "resubmit"),
        ("orders", "bulk", "explode", "--state", "Error"),
        ("orders", "bulk", "cancel", "--state", "Nope"),
        ("orders", "bulk", "cancel", "--state", "Error", "--limit", "0"),
        ("orders", "bulk", "cancel", "--state", "Error", "--limit", "100001"),
        ("orders", "bulk", "migrate", "--workflow", "order-fulfilment"),
        ("orders", "bulk", "migrate", "--state", "Error", "--to-version", "2"),
        ("orders", "bulk", "cancel", "--state", "Error", "--to-version", "2"),
        ("orders", "bulk", "migrate", "--workflow", "w", "--to-version", "0"),
        ("orders", "bulk", "cancel", "--workflow", "w", "--workflow-version", "x"),
        ("orders", "bulk", "cancel", "--created-from", "2026-01-31T09:30:00"),
        ("orders", "bulk", "cancel", "--created-from", "2026-W05-1"),
        ("orders", "bulk", "cancel", "--created-to", "20260131"),
        ("orders", "bulk", "cancel", "--created-to", "2026-02-30"),
    ],
)
async def test_usage_errors_exit_2_before_any_call(api: StandIn, argv: tuple[str, ...]) -> None:
    done = await cli(*argv, env=env(api))
    assert done.code == Exit.USAGE, done.err
    assert api.posted == []


async def test_a_typed_date_is_sent_as_midnight_utc_and_a_date_time_as_given(
    api: StandIn,
) -> None:
    """The API takes only RFC 3339 date-times with an offset (issue 27)."""
    done = await cli(
        "orders",
        "bulk",
        "cancel",
        "--created-from",
        "2026-01-31",
        "--created-to",
        "2026-02-01T09:30:00+01:00",
        "--dry-run",
        env=env(api),
    )
    assert done.code == Exit.OK, done.err
    (sent,) = api.posted
    assert sent["filter"] == {
        "createdFrom": "2026-01-31T00:00:00Z",
        "createdTo": "2026-02-01T09:30:00+01:00",
    }


def test_the_namespace_has_every_flag() -> None:
    args = parse(
        ["orders", "bulk", "resume", "--created-from", "2026-01-01", "--created-to", "2026-02-01"]
    )
    assert isinstance(args, argparse.Namespace)
    assert (args.created_from, args.created_to, args.yes, args.no_wait) == (
        "2026-01-01T00:00:00Z",
        "2026-02-01T00:00:00Z",
        False,
        False,
    )


async def test_a_migrate_sends_its_target_and_the_preview_shows_the_refused(
    api: StandIn,
) -> None:
    argv = ("orders", "bulk", "migrate", "--workflow", "order-fulfilment")
    version = ("--workflow-version", "1", "--to-version", "2")
    done = await cli(*argv, *version, "--dry-run", env=env(api))
    assert done.code == Exit.OK, done.err
    assert api.posted == [
        {
            "action": "migrate",
            "filter": {"workflow": "order-fulfilment", "workflowVersion": 1},
            "toVersion": 2,
            "dryRun": True,
        }
    ]
    assert "migrate would act on 3 orders" in done.out and "no remote operation" in done.out
    assert "refused: 1 order" in done.out and "c-1: order c-1: step 2" in done.out
