"""Telemetry's choices: where it exports, and what a remote call carries."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from devhost.host import tracing as host_tracing
from shared.adapters.http_remote import HttpRemoteService
from shared.ports import RemoteCall
from shared.telemetry import spans
from shared.telemetry.setup import Export, TelemetryConfig


@pytest.mark.parametrize(
    ("env", "export", "client_id"),
    [
        ({}, Export.OFF, None),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, Export.OTLP, None),
        (
            {
                "APPLICATIONINSIGHTS_CONNECTION_STRING": "InstrumentationKey=x",
                "AZURE_CLIENT_ID": "id-1",
            },
            Export.AZURE_MONITOR,
            "id-1",
        ),
        (
            {
                "APPLICATIONINSIGHTS_CONNECTION_STRING": "InstrumentationKey=x",
                "APPLICATIONINSIGHTS_AUTHENTICATION_STRING": "ClientId=id-2;Authorization=AAD",
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318",
            },
            Export.AZURE_MONITOR,
            "id-2",
        ),
        (
            {"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"},
            Export.OFF,
            None,
        ),
    ],
)
def test_the_export_follows_the_standard_settings(
    env: dict[str, str], export: Export, client_id: str | None
) -> None:
    config = TelemetryConfig.from_env(env)
    assert (config.export, config.client_id, config.service_name) == (export, client_id, "orders")


@pytest.fixture
async def service() -> AsyncIterator[tuple[str, list[dict[str, str]]]]:
    seen: list[dict[str, str]] = []

    async def answer(request: web.Request) -> web.Response:
        seen.append(dict(request.headers))
        return web.json_response({"result": {"ok": True}})

    app = web.Application()
    app.router.add_post("/inventory/reserve-inventory", answer)
    server = TestServer(app)
    await server.start_server()
    try:
        yield str(server.make_url("/inventory")), seen
    finally:
        await server.close()


async def test_a_remote_call_sends_the_current_traceparent(
    exporter: InMemorySpanExporter, service: tuple[str, list[dict[str, str]]]
) -> None:
    url, seen = service
    async with aiohttp.ClientSession() as session:
        remote = HttpRemoteService(url, session)
        call = RemoteCall("o-1", "reserve-inventory", "o-1:reserve-inventory", {})
        await remote.invoke(call, 5)
        with spans.tracer().start_as_current_span("call", kind=SpanKind.CLIENT) as span:
            await remote.invoke(call, 5)
    outside, inside = seen
    assert "traceparent" not in {k.lower() for k in outside}
    context = span.get_span_context()
    assert inside["traceparent"].startswith(f"00-{context.trace_id:032x}-{context.span_id:016x}-")


def test_the_local_host_hands_functions_a_child_of_the_messages_traceparent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    recorded = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(recorded))
    monkeypatch.setattr(host_tracing, "_tracer", lambda: provider.get_tracer("devhost.host"))
    sent = f"00-{'c' * 32}-{'d' * 16}-01"
    carrier = host_tracing.message_carrier({b"traceparent": sent.encode(), "orderId": "o-1"})
    with host_tracing.invocation_span("scheduler_nudge", SpanKind.CONSUMER, carrier, {}) as given:
        pass
    (host,) = recorded.get_finished_spans()
    assert host.parent is not None and host.parent.span_id == 0xDDDDDDDDDDDDDDDD
    assert given.trace_parent.startswith(f"00-{'c' * 32}-{host.context.span_id:016x}-")


def test_without_a_provider_the_local_host_hands_the_context_on_as_it_came() -> None:
    sent = f"00-{'c' * 32}-{'d' * 16}-01"
    carrier = host_tracing.header_carrier({"TraceParent": sent})
    with host_tracing.invocation_span("get_order", SpanKind.SERVER, carrier, {}) as given:
        assert given.trace_parent == sent
    with host_tracing.invocation_span("supervisor", SpanKind.INTERNAL, {}, {}) as given:
        assert given.trace_parent == ""
