"""OTLP trace export requests, protobuf or JSON, as plain span records.

The protobuf classes come from ``opentelemetry-proto``, so the wire format is never
hand-parsed; OTLP/JSON differs from protobuf's own JSON mapping only in its hex-encoded
ids, which are turned into base64 before the same classes parse it.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

from google.protobuf import json_format  # type: ignore[import-untyped]
from google.protobuf.message import DecodeError as ProtobufError  # type: ignore[import-untyped]
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan
from opentelemetry.proto.trace.v1.trace_pb2 import Status

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
_ID_FIELDS = ("traceId", "spanId", "parentSpanId")
_KINDS = {
    ProtoSpan.SPAN_KIND_UNSPECIFIED: "UNSPECIFIED",
    ProtoSpan.SPAN_KIND_INTERNAL: "INTERNAL",
    ProtoSpan.SPAN_KIND_SERVER: "SERVER",
    ProtoSpan.SPAN_KIND_CLIENT: "CLIENT",
    ProtoSpan.SPAN_KIND_PRODUCER: "PRODUCER",
    ProtoSpan.SPAN_KIND_CONSUMER: "CONSUMER",
}
_STATUS = {
    Status.STATUS_CODE_UNSET: "UNSET",
    Status.STATUS_CODE_OK: "OK",
    Status.STATUS_CODE_ERROR: "ERROR",
}


class DecodeError(ValueError):
    """The body is not an OTLP trace export request (answered 400)."""


@dataclass(frozen=True)
class SpanRecord:
    """One span as stored and answered; times are nanoseconds since the epoch."""

    trace_id: str
    span_id: str
    parent_span_id: str | None
    name: str
    kind: str
    start_ns: int
    end_ns: int
    service: str | None
    attributes: dict[str, Any]
    status: dict[str, str]
    events: list[dict[str, Any]]
    links: list[dict[str, Any]]


def decode_traces(body: bytes, content_type: str) -> list[SpanRecord]:
    request = ExportTraceServiceRequest()
    try:
        if content_type.startswith(JSON):
            document = json.loads(body)
            _hex_ids_to_base64(document)
            json_format.ParseDict(document, request, ignore_unknown_fields=True)
        else:
            request.ParseFromString(body)
    except (ValueError, json_format.ParseError, ProtobufError) as exc:
        raise DecodeError(f"not an ExportTraceServiceRequest: {exc}") from None
    return list(_spans(request))


def _spans(request: ExportTraceServiceRequest) -> Any:
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        service = resource.get("service.name")
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                yield SpanRecord(
                    trace_id=span.trace_id.hex(),
                    span_id=span.span_id.hex(),
                    parent_span_id=span.parent_span_id.hex() or None,
                    name=span.name,
                    kind=_KINDS.get(span.kind, "UNSPECIFIED"),
                    start_ns=span.start_time_unix_nano,
                    end_ns=span.end_time_unix_nano,
                    service=str(service) if service is not None else None,
                    attributes=_attributes(span.attributes),
                    status={
                        "code": _STATUS.get(span.status.code, "UNSET"),
                        "message": span.status.message,
                    },
                    events=[
                        {
                            "name": event.name,
                            "timeNs": event.time_unix_nano,
                            "attributes": _attributes(event.attributes),
                        }
                        for event in span.events
                    ],
                    links=[
                        {
                            "traceId": link.trace_id.hex(),
                            "spanId": link.span_id.hex(),
                            "attributes": _attributes(link.attributes),
                        }
                        for link in span.links
                    ],
                )


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_value(item) for item in value.array_value.values]
    if kind == "kvlist_value":
        return _attributes(value.kvlist_value.values)
    if kind == "bytes_value":
        return value.bytes_value.hex()
    return getattr(value, kind)


def _hex_ids_to_base64(node: Any) -> None:
    """OTLP/JSON writes ids in hex where protobuf's JSON mapping expects base64."""
    if isinstance(node, list):
        for item in node:
            _hex_ids_to_base64(item)
    elif isinstance(node, dict):
        for key, item in node.items():
            if key in _ID_FIELDS and isinstance(item, str):
                try:
                    node[key] = base64.b64encode(bytes.fromhex(item)).decode()
                except ValueError:
                    raise DecodeError(f"{key} is not hex: {item!r}") from None
            elif key != "attributes":
                _hex_ids_to_base64(item)
