"""HTTP triggers and timers through a real aiohttp client against ``LocalHost``."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from devhost.host import LocalHost, functions_of
from tests.devhost.conftest import HostFactory, Recorder, build_app

pytestmark = pytest.mark.e2e


@pytest.fixture
async def running(make_host: HostFactory) -> tuple[LocalHost, Recorder]:
    recorder = Recorder()
    host = make_host(build_app(recorder, timer=False, servicebus=False), {})
    await host.start()
    return host, recorder


async def test_route_parameter_query_and_headers(running: tuple[LocalHost, Recorder]) -> None:
    host, _ = running
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{host.api_url}/items/a%20b?q=1", headers={"X-Test": "yes"}) as response,
    ):
        assert response.status == 200
        assert response.content_type == "application/json"
        body = await response.json()
    assert body["itemId"] == "a b"
    assert body["q"] == "1"
    assert body["header"] == "yes"
    assert body["url"].endswith("/api/items/a%20b?q=1")


async def test_literal_segment_wins_and_sync_function_runs(
    running: tuple[LocalHost, Recorder],
) -> None:
    host, _ = running
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{host.api_url}/items/special") as response,
    ):
        assert response.status == 200
        assert response.headers["X-Route"] == "literal"
        assert response.headers["Content-Type"] == "text/plain; charset=utf-8"
        assert await response.text() == "literal"


async def test_post_body_reaches_function(running: tuple[LocalHost, Recorder]) -> None:
    host, _ = running
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{host.api_url}/items", json={"sku": "A-1"}) as response,
    ):
        assert response.status == 201
        assert await response.json() == {"received": {"sku": "A-1"}}


async def test_unknown_route_is_problem_404(running: tuple[LocalHost, Recorder]) -> None:
    host, _ = running
    async with aiohttp.ClientSession() as session:
        for url in (f"{host.api_url}/nothing/here", f"{host.http_url}/items/1"):
            async with session.get(url) as response:
                assert response.status == 404
                assert response.content_type == "application/problem+json"
                assert (await response.json())["status"] == 404


async def test_wrong_method_is_405_with_allow(running: tuple[LocalHost, Recorder]) -> None:
    host, _ = running
    async with (
        aiohttp.ClientSession() as session,
        session.delete(f"{host.api_url}/items") as response,
    ):
        assert response.status == 405
        assert response.headers["Allow"] == "POST"


async def test_function_exception_is_500_and_host_survives(
    running: tuple[LocalHost, Recorder], caplog: pytest.LogCaptureFixture
) -> None:
    host, _ = running
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{host.api_url}/broken") as response:
            assert response.status == 500
            problem = await response.json(content_type=None)
            assert problem["title"] == "Internal Server Error"
            assert "deliberately broken" not in problem["detail"]
        async with session.get(f"{host.api_url}/items/1") as response:
            assert response.status == 200
    assert any("deliberately broken" in (r.exc_text or "") for r in caplog.records)


async def test_oversized_body_is_413(running: tuple[LocalHost, Recorder]) -> None:
    host, _ = running
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{host.api_url}/items", data=b"x" * (1024 * 1024 + 1)) as response,
    ):
        assert response.status == 413


async def test_slow_timer_never_overlaps(make_host: HostFactory) -> None:
    recorder = Recorder(timer_delay=1.3)
    host = make_host(build_app(recorder, servicebus=False), {})
    await host.start()
    # A tick lands while the first 1.3 s run is still going: it must be skipped.
    for _ in range(60):
        if host.timers[0].skipped:
            break
        await asyncio.sleep(0.05)
    assert host.timers[0].skipped >= 1
    assert recorder.ticks == 1
    assert recorder.timer_max_running == 1


async def test_schedule_comes_from_setting(make_host: HostFactory) -> None:
    recorder = Recorder()
    app = build_app(recorder, schedule="%TickSchedule%", servicebus=False)
    host = make_host(app, {"TickSchedule": "*/1 * * * * *"})
    assert host.timers[0].schedule_text == "*/1 * * * * *"
    await host.start()
    await asyncio.wait_for(recorder.timer_started.wait(), 2)
    rows = {row.name: row for row in host.rows()}
    assert rows["tick"].detail == "*/1 * * * * *"
    assert rows["get_item"].detail.startswith(f"GET {host.api_url}/items/{{itemId}}")


async def test_stop_waits_for_running_invocation(make_host: HostFactory) -> None:
    recorder = Recorder(timer_delay=0.8)
    host = make_host(build_app(recorder, servicebus=False), {})
    await host.start()
    await asyncio.wait_for(recorder.timer_started.wait(), 3)
    await host.stop()
    assert recorder.timer_running == 0
    assert recorder.ticks == 1


async def test_shutdown_hooks_run_after_the_last_invocation() -> None:
    calls: list[str] = []

    async def close_app_clients() -> None:
        calls.append("closed")

    app = build_app(Recorder(), timer=False, servicebus=False)
    host = LocalHost(functions_of(app), {}, port=0, shutdown_hooks=[close_app_clients])
    await host.start()
    await host.stop()
    await host.stop()  # idempotent: the hook runs once
    assert calls == ["closed"]
