"""The local OTLP receiver: what an exporter sends is what the trace query answers."""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult

from devhost.otlp.app import MAX_BODY, create_app
from devhost.otlp.decode import decode_traces
from devhost.otlp.store import SpanStore

TRACE = "0af7651916cd43dd8448eb211c80319c"
ROOT_SPAN = "b7ad6b7169203331"
CHILD_SPAN = "00f067aa0ba902b7"
START_NS = 1_795_000_000_123_456_789
PROTOBUF = {"Content-Type": "application/x-protobuf"}


def attribute(key: str, value: Any) -> KeyValue:
    any_value = (
        AnyValue(int_value=value) if isinstance(value, int) else AnyValue(string_value=value)
    )
    return KeyValue(key=key, value=any_value)


def span(span_id: str, name: str, *, parent: str = "", start: int = 0, trace: str = TRACE) -> Span:
    return Span(
        trace_id=bytes.fromhex(trace),
        span_id=bytes.fromhex(span_id),
        parent_span_id=bytes.fromhex(parent),
        name=name,
        kind=Span.SPAN_KIND_CONSUMER if parent else Span.SPAN_KIND_SERVER,
        start_time_unix_nano=START_NS + start,
        end_time_unix_nano=START_NS + start + 2_000_000,
        attributes=[attribute("order.id", "o-1"), attribute("attempt", 2)],
        status=Status(code=Status.STATUS_CODE_ERROR, message="declined") if parent else Status(),
        events=[Span.Event(name="retry", time_unix_nano=START_NS + start + 1000)],
    )


def request_of(*spans: Span) -> ExportTraceServiceRequest:
    resource = ResourceSpans(scope_spans=[ScopeSpans(spans=list(spans))])
    resource.resource.attributes.append(attribute("service.name", "orders-app"))
    return ExportTraceServiceRequest(resource_spans=[resource])


@pytest.fixture
async def client() -> AsyncIterator[TestClient[Any, Any]]:
    store = SpanStore(None)
    async with TestClient(TestServer(create_app(store))) as running:
        yield running
    store.close()


async def test_a_protobuf_export_is_answered_by_the_trace_query(
    client: TestClient[Any, Any],
) -> None:
    body = request_of(
        span(CHILD_SPAN, "agent payment", parent=ROOT_SPAN, start=5_000_000),
        span(ROOT_SPAN, "POST /api/orders"),
    ).SerializeToString()
    posted = await client.post("/v1/traces", data=body, headers=PROTOBUF)
    assert posted.status == 200
    assert posted.content_type == "application/x-protobuf"

    answer = await client.get(f"/api/traces/{TRACE}")
    assert answer.status == 200
    assert answer.headers["Access-Control-Allow-Origin"] == "*"
    spans = await answer.json()
    assert [s["spanId"] for s in spans] == [ROOT_SPAN, CHILD_SPAN]  # in start order
    root, child = spans
    assert set(root) >= {"traceId", "spanId", "parentSpanId", "name", "start", "end", "attributes"}
    assert root["parentSpanId"] is None
    assert root["start"] == "2026-11-18T11:06:40.123456Z"
    assert root["end"] == "2026-11-18T11:06:40.125456Z"
    assert root["attributes"] == {"order.id": "o-1", "attempt": 2}
    assert root["kind"] == "SERVER"
    assert root["service"] == "orders-app"
    assert child["traceId"] == TRACE
    assert child["parentSpanId"] == ROOT_SPAN
    assert child["status"] == {"code": "ERROR", "message": "declined"}
    assert child["events"] == [
        {"name": "retry", "time": "2026-11-18T11:06:40.128457Z", "attributes": {}}
    ]

    recent = await (await client.get("/api/traces?orderId=o-1")).json()
    assert [(t["traceId"], t["spans"], t["rootName"]) for t in recent] == [
        (TRACE, 2, "POST /api/orders")
    ]
    assert await (await client.get("/api/traces?orderId=other")).json() == []


async def test_a_gzipped_export_is_read_and_one_too_large_gunzipped_is_a_413(
    client: TestClient[Any, Any],
) -> None:
    """aiohttp gunzips the body before the receiver sees it, and bounds it gunzipped."""
    body = request_of(span(ROOT_SPAN, "POST /api/orders")).SerializeToString()
    gzipped = {**PROTOBUF, "Content-Encoding": "gzip"}
    assert (await client.post("/v1/traces", data=gzip.compress(body), headers=gzipped)).ok
    assert (await client.get(f"/api/traces/{TRACE}")).status == 200
    bomb = gzip.compress(bytes(MAX_BODY + 1))
    assert len(bomb) < MAX_BODY // 100
    answer = await client.post("/v1/traces", data=bomb, headers=gzipped)
    assert answer.status == 413
    assert answer.content_type == "application/problem+json"


async def test_otlp_json_is_accepted_too(client: TestClient[Any, Any]) -> None:
    document = {
        "resourceSpans": [
            {
                "scopeSpans": [
                    {
                        "spans": [
                            {
                                "traceId": TRACE,
                                "spanId": ROOT_SPAN,
                                "name": "sweep",
                                "kind": 1,
                                "startTimeUnixNano": str(START_NS),
                                "endTimeUnixNano": str(START_NS + 1000),
                                "attributes": [{"key": "n", "value": {"intValue": "3"}}],
                            }
                        ]
                    }
                ]
            }
        ]
    }
    posted = await client.post("/v1/traces", json=document)
    assert posted.status == 200
    assert await posted.json() == {}
    (only,) = await (await client.get(f"/api/traces/{TRACE}")).json()
    assert (only["spanId"], only["name"], only["attributes"]) == (ROOT_SPAN, "sweep", {"n": 3})


async def test_an_unknown_trace_is_404_and_garbage_is_400(client: TestClient[Any, Any]) -> None:
    assert (await client.get(f"/api/traces/{'1' * 32}")).status == 404
    assert (await client.get("/api/traces/not-hex")).status == 404
    bad = await client.post("/v1/traces", data=b"\xff\x00garbage", headers=PROTOBUF)
    assert bad.status == 400


async def test_metrics_and_logs_are_accepted_and_dropped(client: TestClient[Any, Any]) -> None:
    for path in ("/v1/metrics", "/v1/logs"):
        assert (await client.post(path, data=b"", headers=PROTOBUF)).status == 200


async def test_the_page_on_another_origin_may_query(client: TestClient[Any, Any]) -> None:
    preflight = await client.options(
        f"/api/traces/{TRACE}",
        headers={"Origin": "http://127.0.0.1:7071", "Access-Control-Request-Method": "GET"},
    )
    assert preflight.status == 204
    assert preflight.headers["Access-Control-Allow-Origin"] == "*"
    listed = await client.get("/api/traces?limit=5")
    assert listed.headers["Access-Control-Allow-Origin"] == "*"


async def test_the_sdk_exporter_delivers_to_the_receiver(client: TestClient[Any, Any]) -> None:
    exporter = OTLPSpanExporter(endpoint=str(client.make_url("/v1/traces")))
    provider = TracerProvider(resource=Resource.create({"service.name": "sdk-test"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    results: list[SpanExportResult] = []
    send = exporter.export

    def export(spans: Any) -> SpanExportResult:
        results.append(send(spans))
        return results[-1]

    exporter.export = export  # type: ignore[method-assign]

    def emit() -> str:
        with (
            tracer.start_as_current_span("intake") as parent,
            tracer.start_as_current_span("send orders", attributes={"order.id": "o-9"}),
        ):
            pass
        provider.shutdown()
        return f"{parent.get_span_context().trace_id:032x}"

    trace_id = await asyncio.to_thread(emit)
    assert results == [SpanExportResult.SUCCESS, SpanExportResult.SUCCESS]
    spans = await (await client.get(f"/api/traces/{trace_id}")).json()
    assert [s["name"] for s in spans] == ["intake", "send orders"]
    assert spans[1]["parentSpanId"] == spans[0]["spanId"]
    assert spans[0]["service"] == "sdk-test"


def test_the_bound_evicts_the_oldest_traces_whole(tmp_path: Path) -> None:
    now = [1000.0]
    store = SpanStore(tmp_path / "traces.sqlite", max_spans=10, clock=lambda: now[0])

    def add(trace: str) -> None:
        spans = [span(f"{i + 1:016x}", f"s{i}", trace=trace, start=i) for i in range(4)]
        store.add(decode_traces(request_of(*spans).SerializeToString(), "application/x-protobuf"))
        now[0] += 1

    traces = [f"{n:032x}" for n in range(1, 5)]
    for trace in traces:
        add(trace)
    assert store.span_count <= 10
    assert store.trace(traces[0]) == []
    assert len(store.trace(traces[-1])) == 4
    kept = [t for t in traces if store.trace(t)]
    assert all(len(store.trace(t)) == 4 for t in kept)  # never a partial trace
    store.close()

    reopened = SpanStore(tmp_path / "traces.sqlite", max_age=10, clock=lambda: now[0] + 60)
    assert reopened.span_count == len(kept) * 4
    reopened.add([])
    assert reopened.span_count == 0  # all older than max_age
    reopened.close()
