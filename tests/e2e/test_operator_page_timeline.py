"""The operator page's timeline in headless Chromium says which work on an order came
from another trace, and why: the Supervisor's recovery, an operator's action, or an
event from outside such as an approval. An approval used to be highlighted and summed
up as a recovery "after the step's complete-by running out" (issue 41): every span that
rejoins an order's trace looked like one.

The order runs through the functions on in-memory adapters with the ports traced, as
in Azure: it waits for its review, is approved (a request of its own trace), then
misses charge-payment's complete-by (the Supervisor recovers it), is suspended by an
operator and resumed by a bulk job. Its spans go through the OTLP encoding into the local
receiver's store, and the page, served by the real function, reads them back as it
reads `TraceQueryUrl`; every request the page makes is answered by the functions.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest
from azure.functions.timer import TimerRequest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from devhost.otlp.decode import decode_traces
from devhost.otlp.store import SpanStore
from shared import bootstrap
from shared.adapters.clock import FakeClock
from shared.adapters.memory.store import InMemoryBus, InMemoryStateStore
from shared.contract import Queue, Setting, agent_queue
from shared.ports import RemoteService
from shared.settings import Settings
from tests.app_functions import registered_functions
from tests.e2e.test_operator_page import WAIT_MS, page
from tests.functions.conftest import SETTINGS, Harness, ScriptedRemote, context_for
from tests.functions.test_tracing import deliver
from tests.workflows import AGENTS, CATALOGUE, AgentName

pytestmark = [pytest.mark.browser]

__all__ = ["page"]  # the fixture, reused
ORIGIN = "http://ops.test"
TRACES = "http://traces.test/api/traces"
ORDER = {
    "orderId": "tl-1",
    "customerId": "c-1",
    "items": [{"sku": "SKU-1", "quantity": 1, "unitPrice": 5.0}],
    "workflow": "reviewed-order",
}
LANES = {
    Queue.SCHEDULER: "scheduler_nudge",
    agent_queue("inventory"): "inventory_agent",
    Queue.AGENT_REPLIES: "scheduler_reply",
}


@pytest.fixture
async def traced(exporter: InMemorySpanExporter) -> AsyncIterator[Harness]:
    store, bus, clock = InMemoryStateStore(), InMemoryBus(), FakeClock()
    remotes = {name: ScriptedRemote() for name in AGENTS}
    ports: dict[AgentName, RemoteService] = dict(remotes)
    settings = Settings.from_env({**SETTINGS, Setting.TRACE_QUERY_URL: TRACES}, catalogue=CATALOGUE)
    container = bootstrap.compose(
        settings, store, bus, ports, clock, decorate=bootstrap.trace_ports
    )
    bootstrap.use(container)
    try:
        functions = {f.name: f for f in registered_functions()}
        yield Harness(store, bus, clock, remotes, functions, container)
    finally:
        bootstrap.reset()


async def settle(harness: Harness) -> None:
    """Deliver what is on the scheduler's, inventory's and the replies' queues, to the end."""
    for _ in range(10):
        sent = [(q, m) for q in LANES for m in harness.bus.take(q)]
        if not sent:
            return
        for queue, message in sent:
            await deliver(harness, LANES[queue], message)


async def recovered_approved_and_resumed(harness: Harness) -> str:
    """The order's trace id once it has been approved, recovered, suspended and resumed."""
    assert (await harness.http("submit_order_http", "POST", "orders", ORDER)).status_code == 202
    await settle(harness)
    route = {"orderId": "tl-1", "eventName": "review"}
    approval = {"eventId": "ok-1", "data": {"approved": True, "by": "alice"}}
    approved = await harness.http("send_event_http", "POST", "x", approval, route_params=route)
    assert approved.status_code == 202, approved.get_body()
    harness.clock.advance(31)  # past charge-payment's complete-by (StepTimeoutSeconds 30)
    supervisor = harness.functions["supervisor"]
    await supervisor.func(TimerRequest(past_due=False), **context_for(supervisor))
    suspended = await harness.http(
        "suspend_order_http", "POST", "x", route_params={"orderId": "tl-1"}
    )
    assert suspended.status_code == 202, suspended.get_body()
    resume = {"action": "resume", "filter": {"state": "Suspended"}}
    job = await harness.http("bulk_orders", "POST", "orders/bulk", resume)
    assert job.status_code == 202, job.get_body()
    await harness.functions["bulk_actions"].func(None)
    view = json.loads(
        (await harness.http("get_order", "GET", "x", route_params={"orderId": "tl-1"})).get_body()
    )
    assert view["failureCount"] == 1, "the Supervisor recovered it once"
    assert view["processState"] == "Pending", "resumed by the bulk job"
    trace_id: str = view["traceId"]
    return trace_id


def received(exporter: InMemorySpanExporter) -> SpanStore:
    """The spans as the local receiver keeps them, through the OTLP encoding."""
    store = SpanStore(None)
    body = encode_spans(exporter.get_finished_spans()).SerializeToString()
    store.add(decode_traces(body, "application/x-protobuf"))
    return store


async def answer(harness: Harness, traces: SpanStore, route: Any) -> None:
    """Every request of the page, answered by the function the host would call."""
    url = urlsplit(route.request.url)
    params = dict(parse_qsl(url.query))
    if url.netloc == "traces.test":
        trace_id = url.path.rsplit("/", 1)[-1]
        await route.fulfill(
            status=200,
            content_type="application/json",
            headers={"Access-Control-Allow-Origin": "*"},
            body=json.dumps(traces.trace(trace_id)),
        )
        return
    path = url.path.removeprefix("/api/")
    names = {"ops": "ops_page", "ops/data": "ops_data", "agents": "agents_http"}
    names |= {"failures": "failures_http"}
    if path in names:
        name, route_params = names[path], {}
    elif path.startswith("ops/orders/"):
        name, route_params = "ops_order", {"orderId": path.removeprefix("ops/orders/")}
    else:
        await route.fulfill(status=404, content_type="application/json", body="{}")
        return
    response = await harness.http(name, "GET", path, params=params, route_params=route_params)
    await route.fulfill(
        status=response.status_code,
        headers=dict(response.headers),
        content_type=response.mimetype,
        body=response.get_body(),
    )


async def test_an_approval_is_not_shown_as_a_recovery(
    traced: Harness, exporter: InMemorySpanExporter, page: Any
) -> None:
    trace_id = await recovered_approved_and_resumed(traced)
    traces = received(exporter)
    rejoins = {
        s["attributes"]["order.rejoined_by"]: s["spanId"]
        for s in traces.trace(trace_id)
        if "order.rejoined_by" in s["attributes"]
    }
    operator = {"suspend_order_http", "bulk_actions"}
    assert set(rejoins) == {"send_event_http", "supervisor", *operator}, rejoins

    async def handler(route: Any) -> None:
        await answer(traced, traces, route)

    await page.route("**/*", handler)
    await page.goto(f"{ORIGIN}/api/ops?order=tl-1")

    def row(by: str) -> Any:
        return page.locator(f'#waterfall .wf-row[data-span-id="{rejoins[by]}"]')

    for by in rejoins:
        await row(by).wait_for(timeout=WAIT_MS)

    assert "outside" in (await row("send_event_http").get_attribute("class") or "")
    assert "recovery" not in (await row("send_event_http").get_attribute("class") or "")
    assert "recovery" in (await row("supervisor").get_attribute("class") or "")
    for by in operator:
        assert "operator" in (await row(by).get_attribute("class") or "")
    assert await page.locator("#waterfall .wf-row.recovery").count() == 1

    lines = await page.locator("#trace-summary li").all_inner_texts()
    (recovered,) = [line for line in lines if line.startswith("recovered")]
    assert "supervisor" in recovered and "send_event_http" not in recovered
    assert not any(by in recovered for by in operator)
    assert any(line.startswith("from outside") and "send_event_http" in line for line in lines)
    (actions,) = [line for line in lines if line.startswith("operator actions")]
    assert all(by in actions for by in operator)
