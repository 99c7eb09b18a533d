"""The load driver against a stand-in app: pacing, retries across runtimes, following."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from devhost.harness.clients import TERMINAL
from devhost.harness.load import (
    Load,
    LoadRun,
    OnEvent,
    OrderPolling,
    Retry,
    SubmitError,
    SubmitRefused,
    plan,
)

FAST = Retry(attempts=3, step=0.01)


@dataclass
class FakeApp:
    """Accepts orders (after `fail_first` 503s per order); finishes each `finish_after` s
    later, reported through `events` (the stand-in for order-status)."""

    fail_first: int = 0
    throttle_first: int = 0
    """Answered 429 with Retry-After: 0.2 before anything else, per order."""
    refuse: bool = False
    finish_after: float = 0.05
    posts: list[str] = field(default_factory=list)
    posted_at: list[float] = field(default_factory=list)
    open_now: int = 0
    open_max: int = 0
    events: asyncio.Queue[tuple[str, str]] = field(default_factory=asyncio.Queue)
    states: dict[str, str] = field(default_factory=dict)

    async def post(self, request: web.Request) -> web.Response:
        body = await request.json()
        order_id = str(body["orderId"])
        self.posts.append(order_id)
        self.posted_at.append(asyncio.get_running_loop().time())
        if self.posts.count(order_id) <= self.throttle_first:
            return web.json_response({"title": "busy"}, status=429, headers={"Retry-After": "0.2"})
        if self.refuse:
            return web.json_response({"error": "bad"}, status=400)
        if self.posts.count(order_id) <= self.fail_first:
            return web.json_response({"error": "crash"}, status=503)
        if order_id not in self.states:
            self.states[order_id] = "Processing"
            self.open_now += 1
            self.open_max = max(self.open_max, self.open_now)
            asyncio.get_running_loop().call_later(self.finish_after, self._finish, order_id)
        return web.json_response({"orderId": order_id}, status=202)

    def _finish(self, order_id: str) -> None:
        self.open_now -= 1
        self.states[order_id] = "Processed"
        self.events.put_nowait((order_id, "Processed"))

    async def view(self, request: web.Request) -> web.Response:
        order_id = request.match_info["order_id"]
        now = datetime.now(UTC).isoformat()
        return web.json_response(
            {
                "orderId": order_id,
                "processState": self.states[order_id],
                "createdAt": now,
                "updatedAt": now,
            }
        )


class FakeStatusQueue:
    def __init__(self, app: FakeApp) -> None:
        self.app = app

    async def run(self, on_event: OnEvent, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                order_id, status = await asyncio.wait_for(self.app.events.get(), 0.05)
            except TimeoutError:
                continue
            on_event(order_id, status, datetime.now(UTC))


@pytest.fixture
async def served() -> AsyncIterator[tuple[FakeApp, str, aiohttp.ClientSession]]:
    fake = FakeApp()
    app = web.Application()
    app.router.add_post("/api/orders", fake.post)
    app.router.add_get("/api/orders/{order_id}", fake.view)
    async with TestServer(app) as server, aiohttp.ClientSession() as session:
        yield fake, str(server.make_url("/api")), session


async def test_closed_loop_keeps_at_most_concurrency_orders_unfinished(
    served: tuple[FakeApp, str, aiohttp.ClientSession],
) -> None:
    fake, api, session = served
    orders = plan([f"o-{i}" for i in range(12)])
    run = LoadRun(orders, Load(concurrency=3), [("a", api)], timeout=10, retry=FAST)

    result = await run.run(session, FakeStatusQueue(fake))

    assert fake.open_max == 3
    assert sorted(fake.posts) == sorted(o.order_id for o in orders)
    assert result.processed == 12
    assert all(o.client_latency is not None for o in result.orders)


async def test_orders_asking_for_the_final_status_only_still_get_a_server_latency(
    served: tuple[FakeApp, str, aiohttp.ClientSession],
) -> None:
    """No `Received` carries the intake's time: the time each POST left stands in."""
    fake, api, session = served
    orders = plan(["o-1", "o-2"], notify="final")
    assert all(o.body["notify"] == "final" for o in orders)
    assert "notify" not in plan(["o-1"])[0].body
    before = datetime.now(UTC)
    run = LoadRun(orders, Load(concurrency=2), [("a", api)], timeout=10, retry=FAST)

    result = await run.run(session, FakeStatusQueue(fake))

    assert result.processed == 2
    for order in result.orders:
        assert order.created_at is not None and order.created_at >= before
        assert order.server_latency is not None and order.server_latency >= 0.05


async def test_a_failed_post_goes_to_the_next_runtime(
    served: tuple[FakeApp, str, aiohttp.ClientSession],
) -> None:
    fake, api, session = served
    fake.fail_first = 1
    orders = plan(["o-1"])
    run = LoadRun(orders, Load(), [("a", api), ("b", api)], retry=FAST)

    await run.submit(session)

    assert (orders[0].runtime, orders[0].tries) == ("b", 2)


async def test_a_429_is_sent_again_after_its_retry_after_and_counted_apart(
    served: tuple[FakeApp, str, aiohttp.ClientSession],
) -> None:
    fake, api, session = served
    fake.throttle_first = 2
    orders = plan(["o-1"])
    run = LoadRun(orders, Load(), [("a", api)], retry=Retry(attempts=5, step=0.0))

    await run.submit(session)

    assert (orders[0].tries, orders[0].throttled) == (3, 2)
    first, second, third = fake.posted_at
    assert second - first >= 0.2 and third - second >= 0.2  # not the retry's 0 s step


async def test_a_refused_order_stops_the_load(
    served: tuple[FakeApp, str, aiohttp.ClientSession],
) -> None:
    fake, api, session = served
    fake.refuse = True
    run = LoadRun(plan(["o-1", "o-2"]), Load(), [("a", api)], retry=FAST)

    with pytest.raises(SubmitRefused):
        await run.submit(session)


async def test_an_order_never_accepted_is_a_submit_error(
    served: tuple[FakeApp, str, aiohttp.ClientSession],
) -> None:
    fake, api, session = served
    fake.fail_first = 5
    run = LoadRun(plan(["o-1"]), Load(), [("a", api)], retry=FAST)

    with pytest.raises(SubmitError, match="not accepted after 3 tries"):
        await run.submit(session)


async def test_polling_follows_orders_to_a_terminal_state(
    served: tuple[FakeApp, str, aiohttp.ClientSession],
) -> None:
    _, api, session = served
    orders = plan([f"o-{i}" for i in range(4)])
    run = LoadRun(orders, Load(rate=50), [("a", api)], timeout=10, done_states=TERMINAL)

    async def fetch(order_id: str) -> Mapping[str, Any] | None:
        async with session.get(f"{api}/orders/{order_id}") as r:
            data: dict[str, Any] = await r.json()
            return data

    polling = OrderPolling(fetch, run.pending, interval=0.05)
    result = await run.run(session, polling)

    assert [o.state for o in result.orders] == ["Processed"] * 4
    assert set(polling.views) == {o.order_id for o in orders}
