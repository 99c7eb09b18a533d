"""The trace context the Functions host hands a Python function, made the same way.

The host starts a span for every invocation, a child of the message's `traceparent`
(Service Bus, which also reads `Diagnostic-Id`) or of the HTTP request's header, a
root for a timer, and passes its context as `context.trace_context`. Here that span is
made with the process's OpenTelemetry provider (the app's, once it configured one) so
it is exported like the host's own, and the function's spans hang below it. Before the
app has configured a provider there is no span to make: the trigger's own context is
handed on as it came, as a host without tracing would.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Mapping
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from devhost.host.invoke import TraceContext

_W3C = TraceContextTextMapPropagator()
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
DIAGNOSTIC_ID = "Diagnostic-Id"


def _tracer() -> trace.Tracer:
    return _tracer_of(trace.get_tracer_provider())


@functools.lru_cache(maxsize=4)
def _tracer_of(provider: trace.TracerProvider) -> trace.Tracer:
    """The host's tracer, made once per provider: ``trace.get_tracer`` makes a new one on
    every call, and this runs for every invocation."""
    return provider.get_tracer("devhost.host")


def message_carrier(properties: Mapping[Any, Any] | None) -> dict[str, str]:
    """A message's W3C fields from its application properties (or `Diagnostic-Id`)."""
    found = {_text(k): _text(v) for k, v in (properties or {}).items()}
    parent = found.get(TRACEPARENT) or found.get(DIAGNOSTIC_ID)
    carrier = {TRACEPARENT: str(parent)} if parent else {}
    if parent and found.get(TRACESTATE):
        carrier[TRACESTATE] = str(found[TRACESTATE])
    return carrier


def _text(value: Any) -> Any:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def header_carrier(headers: Mapping[str, str]) -> dict[str, str]:
    lowered = {k.lower(): v for k, v in headers.items()}
    return {k: lowered[k] for k in (TRACEPARENT, TRACESTATE) if k in lowered}


@contextlib.contextmanager
def invocation_span(
    name: str, kind: SpanKind, carrier: Mapping[str, str], attributes: Mapping[str, Any]
) -> Iterator[TraceContext]:
    """The host's span for one invocation, as the trace context the function gets."""
    parent = _W3C.extract(dict(carrier), context=Context()) if carrier else Context()
    if _dropped(parent):
        # The sampler dropped this trace at its root: a host span would be dropped too,
        # so the function gets the trigger's context as it came, still marked dropped.
        yield TraceContext(
            trace_parent=carrier.get(TRACEPARENT, ""), trace_state=carrier.get(TRACESTATE, "")
        )
        return
    span = _tracer().start_span(
        f"host {name}", context=parent, kind=kind, attributes=dict(attributes)
    )
    try:
        if span.get_span_context().is_valid:
            handed: dict[str, str] = {}
            _W3C.inject(handed, context=trace.set_span_in_context(span))
        else:
            handed = dict(carrier)
        yield TraceContext(
            trace_parent=handed.get(TRACEPARENT, ""), trace_state=handed.get(TRACESTATE, "")
        )
    except Exception as exc:
        span.set_status(trace.Status(trace.StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
        raise
    finally:
        span.end()


def _dropped(parent: Context) -> bool:
    context = trace.get_current_span(parent).get_span_context()
    return context.is_valid and not context.trace_flags.sampled


def flush_exports(timeout_millis: int = 3_000) -> None:
    """End this process's telemetry while its local receiver is still up: the SDK would
    only flush at interpreter exit, after the services have stopped, and log each lost
    span and metric batch as an ERROR. Called once, as the process stops."""
    for provider in (trace.get_tracer_provider(), metrics.get_meter_provider()):
        shutdown = getattr(provider, "shutdown", None)
        if callable(shutdown):
            with contextlib.suppress(Exception):
                shutdown()
