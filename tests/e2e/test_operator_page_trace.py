"""The operator page's order view in headless Chromium: an order's state, steps, history
and the waterfall of its trace, read from the local OTLP receiver.

The whole system runs as processes (`Stack`), as under `python -m devhost`: the runtime
exports its spans to the receiver the stack started on a free port, and the page, served
by the runtime, reads them back cross-origin through `TraceQueryUrl`. The order is slow
on purpose: shipping hangs past its complete-by until the Supervisor has sent the step
again, so its timeline shows the recovery.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from devhost.harness.stack import Stack
from shared.contract import Setting
from tests.e2e.test_operator_page import WAIT_MS, assert_graph_shows, page

pytestmark = [pytest.mark.e2e, pytest.mark.azurite, pytest.mark.broker, pytest.mark.browser]

__all__ = ["page"]  # the fixture, reused
SCREENSHOT = Path(__file__).resolve().parents[2] / ".artifacts" / "ops-page-trace.png"
SETTINGS = {
    Setting.SUPERVISOR_SCHEDULE: "*/1 * * * * *",
    Setting.STEP_TIMEOUT_SECONDS: "4",
    Setting.MAX_FAILURE_COUNT: "5",
}
WAIT_S = WAIT_MS / 1000


async def recovered_once(stack: Stack, session: aiohttp.ClientSession, order_id: str) -> None:
    """Poll until the Supervisor has counted a failure on the order (its step timed out)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if (await stack.app(session).order(order_id))["failureCount"] >= 1:
            return
        await asyncio.sleep(0.5)
    pytest.fail(f"{order_id} was never recovered by the Supervisor")


async def test_an_operator_opens_a_slow_order_and_sees_its_trace(page: Any, tmp_path: Path) -> None:
    async with (
        Stack("tracepage", tmp_path, settings=SETTINGS) as stack,
        aiohttp.ClientSession() as session,
    ):
        app, simulator = stack.app(session), stack.simulator(session)
        await simulator.set_faults("shipping", hangRate=1.0, hangSeconds=30)
        await app.submit_order("slow-1")
        await recovered_once(stack, session, "slow-1")
        await simulator.clear_faults()
        done = await app.wait_for("slow-1", timeout=WAIT_S)
        assert done["processState"] == "Processed"
        trace_id = done["traceId"]

        await page.goto(f"{stack.api()}/ops")
        link = page.locator('.count[data-state="Processed"] a[data-open-order="slow-1"]')
        await link.click(timeout=WAIT_MS)
        await page.locator('#order[data-process-state="Processed"]').wait_for(timeout=WAIT_MS)
        steps = page.locator("#order-steps tr[data-step]")
        assert await steps.count() == 3
        shipping = steps.filter(has_text="create-shipment")
        assert "shipping" in await shipping.inner_text()
        assert await page.locator("#order-history tr").count() >= 5
        await assert_graph_shows(page, await app.order("slow-1"))
        statuses = await page.locator("#order-graph li[data-kind=step]").evaluate_all(
            "items => items.map((i) => i.dataset.status)"
        )
        assert statuses == ["Completed"] * 3

        # Spans arrive in the exporter's batches: wait for the hops after the recovery.
        recovery = page.locator("#waterfall .wf-row.recovery")
        await recovery.first.wait_for(timeout=WAIT_MS)
        await page.wait_for_function(
            """() => [...document.querySelectorAll('#waterfall .wf-row[data-span-id] .wf-label')]
                 .filter((e) => /create-shipment|shipping/.test(e.textContent)).length >= 2""",
            timeout=WAIT_MS,
        )
        # The queue hops: a consumer under its producer, whatever the clocks say of the wait
        # (a pickup may begin before the sender hears the broker's ack: a wait of 0).
        await page.wait_for_function(
            "() => document.querySelectorAll('#waterfall .wf-row[data-hop]').length >= 3",
            timeout=WAIT_MS,
        )
        async with session.get(f"{stack.trace_query_url}/{trace_id}") as answer:
            spans = await answer.json()
        rows = page.locator("#waterfall .wf-row[data-span-id]")
        shown = await rows.evaluate_all("rows => rows.map((r) => r.dataset.spanId)")
        assert set(shown) <= {s["spanId"] for s in spans}
        assert len(shown) >= 10
        hops = await page.locator("#waterfall .wf-row[data-hop]").evaluate_all(
            "rows => rows.map((r) => Number(r.dataset.hop))"
        )
        assert len(hops) >= 3 and all(wait >= 0 for wait in hops), hops
        assert await page.locator("#waterfall .wf-wait").count() == sum(w > 0 for w in hops)
        assert trace_id in await page.locator("#trace-note").inner_text()
        summary = await page.locator("#trace-summary").inner_text()
        assert "waiting in queues" in summary and "recovered" in summary

        SCREENSHOT.parent.mkdir(exist_ok=True)
        await page.screenshot(path=str(SCREENSHOT), full_page=True)
