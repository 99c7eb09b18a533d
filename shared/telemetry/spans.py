"""One span per function invocation, continuing the trace the trigger brought.

Which parent: the Functions host hands a Python function the trace context of its own
invocation span (`context.trace_context.trace_parent`), a child of the message's
`traceparent` or of the HTTP request's header. It is used whenever it is in the same
trace as what the trigger carried; when it is not (a host that did not parent on the
message), the message's trace wins, so the order keeps one trace, and the host's span
becomes a link. Without either, the invocation starts a trace (a timer, an intake
called without a traceparent).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from typing import Any, Protocol

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode, TracerProvider

from shared.telemetry import metrics, propagation, setup
from shared.telemetry.sampling import KEEP

ORDER_ID = "order.id"
STEP_NAME = "step.name"
ATTEMPT = "attempt"
FAILURE_COUNT = "failure_count"

# The tracer, with the test provider it was taken from (setup owns that provider).
_tracer: tuple[TracerProvider | None, trace.Tracer] | None = None
invocation_name: contextvars.ContextVar[str] = contextvars.ContextVar("invocation_name", default="")
"""The running function's name, for the spans that rejoin an order's trace."""


class _TraceContext(Protocol):
    @property
    def trace_parent(self) -> str: ...

    @property
    def trace_state(self) -> str: ...


class _Context(Protocol):
    @property
    def function_name(self) -> str: ...

    @property
    def invocation_id(self) -> str: ...

    @property
    def trace_context(self) -> _TraceContext: ...


@contextlib.contextmanager
def acting_as(name: str) -> Iterator[None]:
    """Name the work inside for the spans that rejoin an order's trace, with no span of
    its own: for a timer that mostly finds nothing to do (the bulk runner, every five
    seconds), where a span per run would be a trace of nothing."""
    token = invocation_name.set(name)
    try:
        yield
    finally:
        invocation_name.reset(token)


def tracer() -> trace.Tracer:
    global _tracer
    provider = setup.test_provider()
    if _tracer is None or _tracer[0] is not provider:
        _tracer = (provider, (provider or trace.get_tracer_provider()).get_tracer("orders"))
    return _tracer[1]


def active() -> bool:
    """Whether to trace at all; the first invocation of a process configures."""
    if not setup.tracing() and not setup.configured():
        setup.configure()
    return setup.tracing()


@contextlib.contextmanager
def consuming(msg: Any, context: _Context | None, queue: str) -> Iterator[None]:
    """A queue trigger's invocation (CONSUMER), continuing its message's trace."""
    if not active():
        yield
        return
    properties: Mapping[str, Any] = msg.application_properties or {}
    _record_lag(msg, queue)
    attributes: dict[str, Any] = {
        "messaging.system": "servicebus",
        "messaging.operation.type": "process",
        "messaging.destination.name": queue,
        "messaging.message.id": msg.message_id or "",
        "faas.trigger": "pubsub",
    }
    if (count := msg.delivery_count) is not None:
        attributes["messaging.servicebus.message.delivery_count"] = count
    if order_id := properties.get("orderId"):
        attributes[ORDER_ID] = str(order_id)
    incoming = propagation.from_properties(properties)
    with _invocation(context, SpanKind.CONSUMER, incoming, attributes):
        yield


@contextlib.contextmanager
def serving(req: Any, context: _Context | None) -> Iterator[None]:
    """An HTTP trigger's invocation (SERVER), continuing the caller's `traceparent`."""
    if not active():
        yield
        return
    headers = req.headers
    incoming = propagation.extract(headers.get("traceparent"), headers.get("tracestate"))
    attributes = {
        "http.request.method": req.method,
        "url.full": req.url,
        "faas.trigger": "http",
    }
    if order_id := req.route_params.get("orderId"):
        attributes[ORDER_ID] = order_id
    with _invocation(context, SpanKind.SERVER, incoming, attributes):
        yield


@contextlib.contextmanager
def timed(context: _Context | None) -> Iterator[None]:
    """A timer's invocation (INTERNAL): a trace of its own."""
    if not active():
        yield
        return
    with _invocation(context, SpanKind.INTERNAL, None, {"faas.trigger": "timer"}):
        yield


@contextlib.contextmanager
def sweep() -> Iterator[Span]:
    """The Supervisor's sweep, inside its timer's invocation."""
    with tracer().start_as_current_span("supervisor sweep", kind=SpanKind.INTERNAL) as span:
        yield span


def annotate(
    *,
    order_id: str | None = None,
    step: str | None = None,
    attempt: int | None = None,
    failure_count: int | None = None,
) -> None:
    """The pattern's attributes on the running invocation, once the glue has parsed them."""
    span = trace.get_current_span()
    if not span.is_recording():
        return
    if order_id is not None:
        span.set_attribute(ORDER_ID, order_id)
    if step is not None:
        span.set_attribute(STEP_NAME, step)
    if attempt is not None:
        span.set_attribute(ATTEMPT, attempt)
    if failure_count is not None:
        span.set_attribute(FAILURE_COUNT, failure_count)


def failed(span: Span, exc: BaseException, name: str) -> None:
    """Mark `span` failed. In a trace the sampler dropped, the error is kept anyway as a
    span of its own (sampled whatever the parent said), a child of the dropped span, so
    the order's trace id still finds it."""
    description = f"{type(exc).__name__}: {exc}"
    if span.is_recording():
        span.record_exception(exc)
        span.set_status(Status(StatusCode.ERROR, description))
        return
    if not span.get_span_context().is_valid:
        return
    error = tracer().start_span(
        f"{name} failed",
        context=trace.set_span_in_context(span),
        attributes={KEEP: True, "error.type": type(exc).__name__},
    )
    error.record_exception(exc)
    error.set_status(Status(StatusCode.ERROR, description))
    error.end()


@contextlib.contextmanager
def _invocation(
    context: _Context | None,
    kind: SpanKind,
    incoming: Context | None,
    attributes: dict[str, Any],
) -> Iterator[None]:
    name = context.function_name if context is not None else "function"
    if context is not None:
        attributes["faas.invocation_id"] = context.invocation_id
    host = _host_context(context)
    parent, links = incoming, []
    if host is not None:
        if incoming is None or _trace_id(host) == _trace_id(incoming):
            parent = host
        else:
            links.append(Link(trace.get_current_span(host).get_span_context()))
    token = invocation_name.set(name)
    if parent is not None and not links and dropped(parent):
        # The sampler dropped this trace: a span of the function's would be dropped
        # too; the calls run in the parent's context, and a failure is still kept.
        span = trace.get_current_span(parent)
    else:
        span = tracer().start_span(
            name, context=parent or Context(), kind=kind, attributes=attributes, links=links
        )
    try:
        with trace.use_span(span, record_exception=False, set_status_on_exception=False):
            yield
    except Exception as exc:
        failed(span, exc, name)
        raise
    finally:
        span.end()
        invocation_name.reset(token)


def _host_context(context: _Context | None) -> Context | None:
    trace_context = getattr(context, "trace_context", None)
    if trace_context is None:
        return None
    return propagation.extract(
        getattr(trace_context, "trace_parent", None), getattr(trace_context, "trace_state", None)
    )


def dropped(context: Context | None = None) -> bool:
    """In a trace the sampler dropped (the current one by default): any span started in
    it would be dropped too, so none is, except the error spans `failed` keeps."""
    span_context = trace.get_current_span(context).get_span_context()
    return span_context.is_valid and not span_context.trace_flags.sampled


def _trace_id(context: Context) -> int:
    return trace.get_current_span(context).get_span_context().trace_id


def _record_lag(msg: Any, queue: str) -> None:
    """Enqueue to trigger; a scheduled message counts from when it was due."""
    since = [
        t
        for t in (msg.enqueued_time_utc, msg.scheduled_enqueue_time_utc)
        if isinstance(t, datetime)
    ]
    if since:
        due = max(t if t.tzinfo else t.replace(tzinfo=UTC) for t in since)
        metrics.queue_lag(queue, (datetime.now(UTC) - due).total_seconds())
