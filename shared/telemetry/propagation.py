"""W3C trace context in and out: HTTP headers, message application properties, the
traceparent stored with an order."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
DIAGNOSTIC_ID = "Diagnostic-Id"
"""The property the Service Bus trigger extension parents its invocation on (the Azure
SDKs write it beside `traceparent`, with the same value)."""

_W3C = TraceContextTextMapPropagator()


def extract(traceparent: str | None, tracestate: str | None = None) -> Context | None:
    """The context a traceparent names, or None when it is absent or malformed."""
    if not traceparent:
        return None
    carrier = {TRACEPARENT: traceparent}
    if tracestate:
        carrier[TRACESTATE] = tracestate
    context = _W3C.extract(carrier, context=Context())
    return context if trace.get_current_span(context).get_span_context().is_valid else None


def from_properties(properties: Mapping[str, Any] | None) -> Context | None:
    """A message's trace context, from its application properties."""
    if not properties:
        return None
    parent = properties.get(TRACEPARENT) or properties.get(DIAGNOSTIC_ID)
    state = properties.get(TRACESTATE)
    return extract(str(parent) if parent else None, str(state) if state else None)


def carrier(context: Context | None = None) -> dict[str, str]:
    """`traceparent` (and `tracestate`) of the context's span, the current one by
    default; empty when there is no valid span."""
    headers: dict[str, str] = {}
    _W3C.inject(headers, context=context)
    return headers


def message_properties(context: Context | None = None) -> dict[str, str]:
    """What a message carries: the W3C fields and, for the Functions host's Service Bus
    extension, the same traceparent as `Diagnostic-Id`."""
    properties = carrier(context)
    if TRACEPARENT in properties:
        properties[DIAGNOSTIC_ID] = properties[TRACEPARENT]
    return properties


def current_traceparent() -> str | None:
    return carrier().get(TRACEPARENT)


def trace_id_of(traceparent: str | None) -> str | None:
    """The 32 hex digits of a traceparent's trace id, or None when it has none."""
    context = extract(traceparent)
    if context is None:
        return None
    return format(trace.get_current_span(context).get_span_context().trace_id, "032x")
