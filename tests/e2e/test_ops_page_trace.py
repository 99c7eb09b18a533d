"""The operator page's order view in headless Chromium: an order's state, steps, history
and the waterfall of its trace, read from the local OTLP receiver.

The whole system runs as processes (`Stack`): the runtime exports its spans to the
receiver the stack started on a free port, and the page, served by the runtime, reads
them back cross-origin through `TraceQueryUrl`.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from devhost.harness.stack import Stack
from shared.contract import Setting
from tests.e2e.test_ops_page import WAIT_MS, page

pytestmark = [pytest.mark.e2e, pytest.mark.azurite, pytest.mark.broker, pytest.mark.browser]

__all__ = ["page"]  # the fixture, reused
SCREENSHOT = Path(__file__).resolve().parents[2] / ".artifacts" / "ops-page-trace.png"
SETTINGS = {Setting.SUPERVISOR_SCHEDULE: "*/1 * * * * *", Setting.STEP_TIMEOUT_SECONDS: "4"}


def export_a_trace(stack: Stack, order_id: str) -> str:
    """An order's hops as the app would export them: the intake sends to the Scheduler,
    which sends to the payment agent, whose remote call is retried once; returns the
    trace id."""
    exporter = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{stack.otlp_port}/v1/traces")
    provider = TracerProvider(resource=Resource.create({"service.name": "orders"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    kind = trace.SpanKind
    order = {"order.id": order_id}

    def after(sent: trace.Span) -> Any:
        time.sleep(0.05)  # the message waits in its queue
        return trace.set_span_in_context(sent)

    with (
        tracer.start_as_current_span("POST /api/orders", kind=kind.SERVER, attributes=order),
        tracer.start_as_current_span("send orders", kind=kind.PRODUCER) as to_scheduler,
    ):
        pass
    with (
        tracer.start_as_current_span(
            "scheduler", kind=kind.CONSUMER, attributes=order, context=after(to_scheduler)
        ),
        tracer.start_as_current_span("send agent-payment", kind=kind.PRODUCER) as to_agent,
    ):
        pass
    with (
        tracer.start_as_current_span(
            "agent payment", kind=kind.CONSUMER, attributes=order, context=after(to_agent)
        ),
        tracer.start_as_current_span("POST payment/charge", kind=kind.CLIENT) as call,
    ):
        call.add_event("retry", {"attempt": 2})
    provider.shutdown()
    return f"{to_agent.get_span_context().trace_id:032x}"


async def test_an_operator_opens_an_order_and_sees_its_trace(page: Any, tmp_path: Path) -> None:
    async with (
        Stack("tracepage", tmp_path, settings=SETTINGS) as stack,
        aiohttp.ClientSession() as session,
    ):
        app = stack.app(session)
        await app.submit_order("trace-1")
        done = await app.wait_for("trace-1", timeout=WAIT_MS / 1000)
        assert done["processState"] == "Processed"
        trace_id = await asyncio.to_thread(export_a_trace, stack, "trace-1")

        await page.goto(f"{stack.api()}/ops")
        link = page.locator('.count[data-state="Processed"] a[data-open-order="trace-1"]')
        await link.click(timeout=WAIT_MS)
        view = page.locator("#order")
        await view.wait_for(state="visible")
        await page.locator('#order[data-process-state="Processed"]').wait_for(timeout=WAIT_MS)
        steps = page.locator("#order-steps tr[data-step]")
        assert await steps.count() == 3
        assert "Completed" in await steps.first.inner_text()
        assert await page.locator("#order-history tr").count() >= 3

        rows = page.locator("#waterfall .wf-row[data-span-id]")
        await rows.nth(5).wait_for(timeout=WAIT_MS)
        names = [
            n.strip()
            for n in await page.locator(
                "#waterfall .wf-row[data-span-id] .wf-label"
            ).all_inner_texts()
        ]
        assert names[0] == "POST /api/orders"
        assert {"scheduler", "agent payment", "POST payment/charge"} <= set(names)
        assert await page.locator("#waterfall .wf-mark[data-event='retry']").count() == 1
        assert await page.locator("#waterfall .wf-wait").count() == 2  # two queue hops
        assert trace_id in await page.locator("#trace-note").inner_text()
        summary = await page.locator("#trace-summary").inner_text()
        assert "1 retry" in summary and "waiting in queues" in summary
        assert "trace-1" in page.url  # the view can be linked to

        SCREENSHOT.parent.mkdir(exist_ok=True)
        await page.screenshot(path=str(SCREENSHOT), full_page=True)
