"""One trace per order through the functions, recorded with the SDK's in-memory exporter."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest
from azure.functions.servicebus import ServiceBusMessage
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import SpanKind, StatusCode

from devhost.host.invoke import InvocationContext, TraceContext
from shared import bootstrap
from shared.adapters.clock import FakeClock
from shared.adapters.memory.store import InMemoryBus, InMemoryStateStore
from shared.adapters.queues import destination_of
from shared.adapters.traced import ETAG_OUTCOME, OrderTraces, TracedMessageBus, TracedStateStore
from shared.contract import Queue, agent_queue
from shared.domain.machine.forward import start
from shared.domain.model import HistoryEntry, OrderProcess, Outgoing, ProcessState
from shared.ports import ConcurrencyConflict, RemoteService, TransientRemoteError
from shared.settings import Settings
from shared.telemetry import metrics, setup, spans
from shared.telemetry.propagation import DIAGNOSTIC_ID, TRACEPARENT, trace_id_of
from shared.telemetry.sampling import KEEP
from tests.app_functions import registered_functions
from tests.builders import an_order
from tests.functions.conftest import SETTINGS, Harness, ScriptedRemote
from tests.workflows import AGENTS, CATALOGUE, ORDER_FULFILMENT, AgentName

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER = f"00-{CALLER_TRACE}-00f067aa0ba902b7-01"
ORDER = {
    "orderId": "tr-1",
    "customerId": "c-1",
    "items": [{"sku": "A", "quantity": 1, "unitPrice": 2.0}],
}


@pytest.fixture
async def traced(exporter: InMemorySpanExporter) -> AsyncIterator[Harness]:
    """The functions on in-memory adapters, with the ports traced as in Azure."""
    store, bus, clock = InMemoryStateStore(), InMemoryBus(), FakeClock()
    remotes = {name: ScriptedRemote() for name in AGENTS}
    ports: dict[AgentName, RemoteService] = dict(remotes)
    container = bootstrap.compose(
        Settings.from_env(SETTINGS, catalogue=CATALOGUE),
        store,
        bus,
        ports,
        clock,
        decorate=bootstrap.trace_ports,
    )
    bootstrap.use(container)
    try:
        functions = {f.name: f for f in registered_functions()}
        yield Harness(store, bus, clock, remotes, functions, container)
    finally:
        bootstrap.reset()


def a_process() -> OrderProcess:
    order = an_order()
    return start(order, ORDER_FULFILMENT, datetime(2026, 1, 1, tzinfo=UTC), cause="m-1").process


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def hex_trace(span: ReadableSpan) -> str:
    return format(span.context.trace_id, "032x")


def parent_of(traceparent: str) -> int:
    return int(traceparent.split("-")[2], 16)


async def deliver(harness: Harness, name: str, sent: Outgoing, host: str = "") -> None:
    """A message to its trigger as the host delivers it: its properties, a context."""
    msg = ServiceBusMessage(
        body=json.dumps(dict(sent.body)).encode(),
        message_id=sent.message_id,
        delivery_count=1,
        application_properties=dict(sent.properties),
        user_properties=dict(sent.properties),
    )
    context = InvocationContext("inv-1", name, trace_context=TraceContext(trace_parent=host))
    await harness.functions[name].func(msg, context=context)


async def test_intake_continues_the_callers_trace_stores_it_and_sends_it_on(
    traced: Harness, exporter: InMemorySpanExporter
) -> None:
    response = await traced.http(
        "submit_order_http", "POST", "orders", ORDER, headers={"traceparent": CALLER}
    )
    assert response.status_code == 202
    (intake,) = named(exporter, "submit_order_http")
    assert intake.kind is SpanKind.SERVER
    assert hex_trace(intake) == CALLER_TRACE
    assert intake.parent is not None and intake.parent.span_id == parent_of(CALLER)
    assert intake.attributes is not None and intake.attributes["order.id"] == "tr-1"

    stored = await traced.store.load("tr-1")
    assert stored is not None and trace_id_of(stored.order.trace_parent) == CALLER_TRACE
    shown = await traced.http("get_order", "GET", "orders/tr-1", route_params={"orderId": "tr-1"})
    assert json.loads(shown.get_body())["traceId"] == CALLER_TRACE

    # claimed at intake: the first request goes out with the intake's send
    (request,) = traced.bus.on(agent_queue("inventory"))
    (send,) = [s for s in exporter.get_finished_spans() if s.kind is SpanKind.PRODUCER]
    assert send.parent is not None and send.parent.span_id == intake.context.span_id
    assert send.attributes is not None
    destinations = str(send.attributes["messaging.destination.name"]).split(",")
    assert agent_queue("inventory") in destinations and Queue.ORDER_STATUS in destinations
    assert trace_id_of(request.properties[TRACEPARENT]) == CALLER_TRACE
    assert parent_of(request.properties[TRACEPARENT]) == send.context.span_id
    assert request.properties[DIAGNOSTIC_ID] == request.properties[TRACEPARENT]
    (create,) = named(exporter, "state create")
    assert create.attributes is not None and create.attributes[ETAG_OUTCOME] == "won"


async def test_each_trigger_continues_its_messages_trace_to_the_remote_call(
    traced: Harness, exporter: InMemorySpanExporter
) -> None:
    await traced.http("submit_order_http", "POST", "orders", ORDER)
    (intake,) = named(exporter, "submit_order_http")
    order_trace = hex_trace(intake)
    (request,) = traced.bus.take(agent_queue("inventory"))
    inventory = traced.remotes["inventory"]
    inventory.answers = [TransientRemoteError("http-503", "busy")]
    await deliver(traced, "inventory_agent", request)
    (agent,) = named(exporter, "inventory_agent")
    assert agent.kind is SpanKind.CONSUMER and hex_trace(agent) == order_trace
    assert agent.parent is not None
    assert agent.parent.span_id == parent_of(request.properties[TRACEPARENT])
    assert agent.attributes is not None
    assert agent.attributes["step.name"] == "reserve-inventory"
    assert agent.attributes["attempt"] == 1
    calls = named(exporter, "POST reserve-inventory")
    assert [c.kind for c in calls] == [SpanKind.CLIENT] * 2
    assert all(c.parent is not None and c.parent.span_id == agent.context.span_id for c in calls)
    assert calls[0].status.status_code is StatusCode.ERROR
    assert calls[1].attributes is not None
    assert calls[1].attributes["http.request.resend_count"] == 1
    assert calls[1].attributes["breaker.state"] == "closed"
    assert [e.name for e in agent.events] == ["retry"]
    (reply,) = traced.bus.take(Queue.AGENT_REPLIES)
    assert trace_id_of(reply.properties[TRACEPARENT]) == order_trace
    await deliver(traced, "scheduler_reply", reply)
    (scheduler,) = named(exporter, "scheduler_reply")
    assert scheduler.kind is SpanKind.CONSUMER and hex_trace(scheduler) == order_trace
    assert scheduler.parent is not None
    assert scheduler.parent.span_id == parent_of(reply.properties[TRACEPARENT])


async def test_the_hosts_context_is_the_parent_when_it_is_in_the_messages_trace(
    traced: Harness, exporter: InMemorySpanExporter
) -> None:
    await traced.http("submit_order_http", "POST", "orders", ORDER)
    (request,) = traced.bus.take(agent_queue("inventory"))
    order_trace = trace_id_of(request.properties[TRACEPARENT])
    host = f"00-{order_trace}-1111111111111111-01"
    await deliver(traced, "inventory_agent", request, host=host)
    (agent,) = named(exporter, "inventory_agent")
    assert agent.parent is not None and agent.parent.span_id == 0x1111111111111111

    exporter.clear()
    elsewhere = f"00-{'9' * 32}-2222222222222222-01"
    await deliver(traced, "inventory_agent", request, host=elsewhere)
    (again,) = named(exporter, "inventory_agent")
    assert hex_trace(again) == order_trace
    assert [link.context.span_id for link in again.links] == [0x2222222222222222]


async def test_a_lost_race_is_recorded_on_the_store_span(exporter: InMemorySpanExporter) -> None:
    inner, traces = InMemoryStateStore(), OrderTraces()
    store = TracedStateStore(inner, traces)
    process = a_process()
    with spans.tracer().start_as_current_span("invocation"):
        await store.create(process, [])
        loaded = await store.load(process.order_id)
        assert loaded is not None
        await store.save(loaded, [])
        with pytest.raises(ConcurrencyConflict):
            await store.save(loaded, [])
    outcomes = [s.attributes[ETAG_OUTCOME] for s in named(exporter, "state save") if s.attributes]
    assert outcomes == ["won", "lost"]


async def test_a_send_for_an_order_from_another_trace_rejoins_the_orders_trace(
    exporter: InMemorySpanExporter,
) -> None:
    order_root = f"00-{'a' * 32}-{'b' * 16}-01"
    process = a_process()
    process = replace(process, order=replace(process.order, trace_parent=order_root))
    traces, bus = OrderTraces(), InMemoryBus()
    traces.remember(process)
    traced_bus = TracedMessageBus(bus, traces)
    message = Outgoing(destination_of(Queue.SCHEDULER), "m-1", {"orderId": process.order_id})
    with spans.tracer().start_as_current_span("supervisor sweep") as sweep:
        await traced_bus.send([message])
    (sent,) = bus.on(Queue.SCHEDULER)
    assert trace_id_of(sent.properties[TRACEPARENT]) == "a" * 32
    (rejoin,) = [s for s in exporter.get_finished_spans() if s.name.endswith("rejoins order")]
    assert rejoin.parent is not None and rejoin.parent.span_id == 0xBBBBBBBBBBBBBBBB
    assert [link.context.span_id for link in rejoin.links] == [sweep.get_span_context().span_id]
    assert rejoin.attributes is not None and rejoin.attributes[KEEP] is True
    (producer,) = named(exporter, "send scheduler")
    assert producer.parent is not None and producer.parent.span_id == rejoin.context.span_id


async def test_an_error_in_a_trace_the_sampler_dropped_is_kept() -> None:
    recorded = InMemorySpanExporter()
    provider = TracerProvider(sampler=ALWAYS_OFF)
    provider.add_span_processor(SimpleSpanProcessor(recorded))
    setup.use_provider(provider)
    try:
        msg = ServiceBusMessage(
            body=b"{}", message_id="m-1", application_properties={}, user_properties={}
        )
        context = InvocationContext("inv-1", "scheduler_nudge")
        with pytest.raises(RuntimeError), spans.consuming(msg, context, Queue.SCHEDULER):
            raise RuntimeError("boom")
    finally:
        setup.forget()
    (kept,) = recorded.get_finished_spans()
    assert kept.name == "scheduler_nudge failed"
    assert kept.status.status_code is StatusCode.ERROR
    assert kept.parent is not None and kept.parent.trace_id == kept.context.trace_id


def test_log_records_carry_the_trace_and_span_ids(
    exporter: InMemorySpanExporter, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, "orders.test"):
        with spans.tracer().start_as_current_span("invocation") as span:
            logging.getLogger("orders.test").info("inside")
        logging.getLogger("orders.test").info("outside")
    inside, outside = caplog.records
    context = span.get_span_context()
    assert inside.trace_id == format(context.trace_id, "032x")  # type: ignore[attr-defined]
    assert inside.span_id == format(context.span_id, "016x")  # type: ignore[attr-defined]
    assert outside.trace_id == outside.span_id == ""  # type: ignore[attr-defined]


@pytest.mark.parametrize("end", [ProcessState.PROCESSED, ProcessState.ERROR])
async def test_an_order_reaching_an_end_state_is_counted_once(
    exporter: InMemorySpanExporter, end: ProcessState
) -> None:
    """Error included: the Azure Monitor alert on orders held in Error counts these."""
    reader = InMemoryMetricReader()
    metrics.use_meter_provider(MeterProvider(metric_readers=[reader]))
    try:
        store = TracedStateStore(InMemoryStateStore(), OrderTraces())
        process = a_process()
        etag = await store.create(process, [])
        state = replace(process.state, process_state=end)
        entry = HistoryEntry(state.updated_at, end.value.lower(), "", end, 0, 1)
        await store.save(replace(process, state=state, etag=etag), [entry])
        data = reader.get_metrics_data()
    finally:
        metrics.use_meter_provider(None)
    assert data is not None
    points: dict[str, list[Any]] = {
        m.name: list(m.data.data_points)
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }
    (counted,) = points[metrics.ORDERS_COMPLETED]
    assert counted.attributes == {metrics.OUTCOME: end.value}
    assert getattr(counted, "value", None) == 1
    assert "orders.duration" in points
