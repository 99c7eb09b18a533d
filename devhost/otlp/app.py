"""The receiver's HTTP surface: OTLP/HTTP in, the trace query out.

Traces are decoded and stored; metrics and logs are accepted (200) and dropped, so an
exporter configured for all three signals never retries or complains. The query
answers any origin (CORS): the operator page is served by the runtime on another port.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from aiohttp import web
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from devhost.loopback import guard_app
from devhost.malformed import ProblemAppRunner, RateLimitedLog
from devhost.otlp.decode import JSON, PROTOBUF, DecodeError, decode_traces
from devhost.otlp.store import SpanStore, iso_ns
from devhost.problem import http_errors_as_problems

log = logging.getLogger("devhost.otlp")

STORE: web.AppKey[SpanStore] = web.AppKey("store", SpanStore)
MAX_BODY = 32 * 1024 * 1024
DEFAULT_LIMIT = 20
MAX_LIMIT = 500
_TRACE_ID = re.compile(r"^[0-9a-fA-F]{32}$")
CORS = {
    "Access-Control-Allow-Origin": "*",
    "Access-Control-Allow-Methods": "GET, OPTIONS",
    "Access-Control-Allow-Headers": "*",
    "Access-Control-Max-Age": "600",
}


def create_app(store: SpanStore) -> web.Application:
    app = web.Application(client_max_size=MAX_BODY, middlewares=[http_errors_as_problems])
    app[STORE] = store
    app.router.add_post("/v1/traces", receive_traces)
    app.router.add_post("/v1/metrics", _accept(ExportMetricsServiceResponse().SerializeToString()))
    app.router.add_post("/v1/logs", _accept(ExportLogsServiceResponse().SerializeToString()))
    app.router.add_get("/api/traces", recent_traces)
    app.router.add_get("/api/traces/{traceId}", get_trace)
    app.router.add_route("OPTIONS", "/api/traces", preflight)
    app.router.add_route("OPTIONS", "/api/traces/{traceId}", preflight)
    return app


def make_runner(store: SpanStore, host: str = "127.0.0.1") -> web.AppRunner:
    """The runner ``python -m devhost.otlp`` serves ``create_app`` with on ``host``: only
    loopback host names (and ``host``) are answered, and no write from another origin."""
    app = create_app(store)
    guard_app(app, host)
    return ProblemAppRunner(app, refusals=RateLimitedLog(log), access_log=None)


def _answer(request: web.Request, empty_protobuf: bytes) -> web.Response:
    if request.content_type == JSON:
        return web.json_response({})
    return web.Response(body=empty_protobuf, content_type=PROTOBUF)


async def receive_traces(request: web.Request) -> web.Response:
    body = await request.read()  # gunzipped by aiohttp, within MAX_BODY once gunzipped
    try:
        spans = decode_traces(body, request.content_type)
    except DecodeError as exc:
        return web.json_response({"code": 3, "message": str(exc)}, status=400)
    evicted = request.app[STORE].add(spans)
    log.debug("stored %d spans, evicted %d", len(spans), evicted)
    return _answer(request, ExportTraceServiceResponse().SerializeToString())


def _accept(empty_protobuf: bytes) -> Any:
    async def accept(request: web.Request) -> web.Response:
        await request.read()
        return _answer(request, empty_protobuf)

    return accept


async def get_trace(request: web.Request) -> web.Response:
    trace_id = request.match_info["traceId"]
    spans = request.app[STORE].trace(trace_id) if _TRACE_ID.match(trace_id) else []
    if not spans:
        return web.json_response(
            {"title": "Not Found", "detail": f"no span of trace {trace_id} is kept here"},
            status=404,
            headers=CORS,
        )
    return web.json_response(spans, headers=CORS)


async def recent_traces(request: web.Request) -> web.Response:
    try:
        limit = min(max(int(request.query.get("limit", DEFAULT_LIMIT)), 1), MAX_LIMIT)
    except ValueError:
        return web.json_response(
            {"title": "Bad Request", "detail": "limit"}, status=400, headers=CORS
        )
    found = request.app[STORE].recent(limit, request.query.get("orderId") or None)
    return web.json_response(
        [
            {
                "traceId": t.trace_id,
                "spans": t.spans,
                "start": iso_ns(t.start_ns),
                "end": iso_ns(t.end_ns),
                "rootName": t.root_name,
                "orderId": t.order_id,
            }
            for t in found
        ],
        headers=CORS,
    )


async def preflight(request: web.Request) -> web.Response:
    return web.Response(status=204, headers=CORS)
