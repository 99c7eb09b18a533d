"""The ports as spans: every state-store call, message send and remote call of a
traced invocation is a child span of it, and every message carries its trace.

A call outside any trace (the operator page's reads, heartbeats) makes no span: only a
call whose current span is valid does. Messages for an order always travel in the
order's own trace: when the sender works in another one (the Supervisor's sweep, an
operator's request, a bulk job), the send rejoins the order's trace under a span that
links back to the sender's, and is kept by the sampler (the order is in trouble, or an
operator acted on it).
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanKind

from shared.adapters.queues import queue_of
from shared.domain.in_doubt import RemoteOutcome
from shared.domain.model import HistoryEntry, JsonObject, OrderProcess, Outgoing
from shared.intercept import Call, Intercepted
from shared.ports import (
    AlreadyExists,
    ConcurrencyConflict,
    MessageBus,
    RemoteCall,
    RemoteError,
    RemoteService,
    StateStore,
)
from shared.resilience import CircuitBreaker
from shared.telemetry import metrics, propagation, setup, spans
from shared.telemetry.sampling import KEEP

ETAG_OUTCOME = "db.etag.outcome"
"""`won`: the conditional write went through; `lost`: another writer changed it first."""
_DB = {"db.system": "azure_table", "db.system.name": "azure_table"}
ORDER_TRACES_KEPT = 10_000


class OrderTraces:
    """The root trace context of the orders this instance read or wrote lately, so a send
    can find the order's trace (a message names only its order).

    Kept parsed: every send of an order asks for it, and parsing its traceparent again
    each time was a fifth of a send's tracing in a dropped trace (bench/README.md, "The
    app's CPU outside the Table path")."""

    def __init__(self, size: int = ORDER_TRACES_KEPT) -> None:
        self._size = size
        self._parents: OrderedDict[str, tuple[str, Context | None]] = OrderedDict()

    def remember(self, process: OrderProcess | None) -> None:
        if process is None or not process.order.trace_parent:
            return
        order_id, traceparent = process.order_id, process.order.trace_parent
        known = self._parents.get(order_id)
        if known is None or known[0] != traceparent:
            self._parents[order_id] = (traceparent, propagation.extract(traceparent))
        self._parents.move_to_end(order_id)
        if len(self._parents) > self._size:
            self._parents.popitem(last=False)

    def context(self, order_id: str) -> Context | None:
        """The order's root context; None when unknown here or malformed."""
        known = self._parents.get(order_id)
        return known[1] if known is not None else None


def _in_trace() -> bool:
    return trace.get_current_span().get_span_context().is_valid


@contextlib.contextmanager
def _in_dropped_trace(name: str) -> Iterator[Span]:
    """A call in a dropped trace: no span of its own; a failure is kept as an error span
    of the current one (a lost race is no failure)."""
    span = trace.get_current_span()
    try:
        yield span
    except (ConcurrencyConflict, AlreadyExists):
        raise
    except Exception as exc:
        spans.failed(span, exc, name)
        raise


@contextlib.contextmanager
def _span(name: str, kind: SpanKind, attributes: dict[str, Any]) -> Iterator[Span]:
    if spans.dropped():
        with _in_dropped_trace(name) as current:
            yield current
        return
    with trace.use_span(
        spans.tracer().start_span(name, kind=kind, attributes=attributes),
        end_on_exit=True,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        try:
            yield span
        except (ConcurrencyConflict, AlreadyExists):
            span.set_attribute(ETAG_OUTCOME, "lost")
            raise
        except Exception as exc:
            spans.failed(span, exc, name)
            raise


OPERATIONS = {"list_by_state": "list", "unwatch_entry": "unwatch"}
"""Store methods whose span is not named after the method (`state put rest` is `put_rest`)."""
UNTRACED = frozenset({"ping"})
"""Store methods that make no span: the health probe's, outside any order."""


def _store_span(call: Call) -> contextlib.AbstractContextManager[Any]:
    if not _in_trace():
        return contextlib.nullcontext()
    operation = OPERATIONS.get(call.name, call.name.replace("_", " "))
    if spans.dropped():
        return _in_dropped_trace(f"state {operation}")
    attributes: dict[str, Any] = {**_DB, "db.operation.name": operation}
    order_id = _order_id(call)
    if order_id is not None:
        attributes[spans.ORDER_ID] = order_id
    return _span(f"state {operation}", SpanKind.CLIENT, attributes)


def _order_id(call: Call) -> str | None:
    """The one order a store call is about: its `order_id`, or that of the order or
    entry it writes; None for a call over many."""
    order_id = call.argument("order_id")
    if order_id is not None:
        return str(order_id)
    for parameter in ("process", "entry"):
        named = call.argument(parameter)
        if named is not None:
            return str(named.order_id)
    return None


class TracedStateStore(Intercepted[StateStore]):
    """A span per store call (`state <operation>`, with the order's id where the call
    names one order), and the traces of the orders it reads and writes remembered."""

    def __init__(self, inner: StateStore, traces: OrderTraces) -> None:
        super().__init__(inner, StateStore)
        self._traces = traces

    async def around(self, call: Call) -> Any:
        if call.name in UNTRACED:
            return await call.proceed()
        process = call.argument("process")
        with _store_span(call) as span:
            result = await call.proceed()
            if process is not None:
                _won(span, process)
        if process is not None:
            self._traces.remember(process)
        elif isinstance(result, OrderProcess):
            self._traces.remember(result)
        if call.name == "save":
            _finished(process, call.argument("history"))
        return result


def _won(span: Any, process: OrderProcess) -> None:
    if isinstance(span, Span) and span.is_recording():
        state = process.state
        span.set_attribute(ETAG_OUTCOME, "won")
        span.set_attribute(spans.FAILURE_COUNT, state.failure_count)
        span.set_attribute(spans.ATTEMPT, state.attempt)
        span.set_attribute("order.state", state.process_state.value)


def _finished(process: OrderProcess, history: Sequence[HistoryEntry]) -> None:
    """Count an order when the save that takes it to an end state goes through."""
    state = process.state
    if not state.process_state.is_at_rest or not history:
        return
    if history[-1].process_state is not state.process_state:
        return
    seconds = (state.updated_at - process.order.created_at).total_seconds()
    metrics.order_finished(state.process_state.value, seconds)


class TracedMessageBus(Intercepted[MessageBus]):
    """A PRODUCER span per order's messages of a send, its context on each message;
    the bus's other calls go straight through."""

    def __init__(self, inner: MessageBus, traces: OrderTraces) -> None:
        super().__init__(inner, MessageBus)
        self._traces = traces

    async def around(self, call: Call) -> Any:
        if call.name != "send":
            return await call.proceed()
        await self._send(call.argument("messages"))
        return None

    async def _send(self, messages: Sequence[Outgoing]) -> None:
        if not messages:
            await self.inner.send(messages)
            return
        by_order: dict[str, list[int]] = {}
        for i, message in enumerate(messages):
            by_order.setdefault(str(message.body.get("orderId", "")), []).append(i)
        sending = [
            self._producer(order_id, [messages[i] for i in ids])
            for order_id, ids in by_order.items()
        ]
        if not any(sending):
            await self.inner.send(messages)
            return
        current = trace.get_current_span()
        started = [span for span in sending if span is not None and span is not current]
        carried = list(messages)
        for span, ids in zip(sending, by_order.values(), strict=True):
            if span is None:
                continue
            properties = propagation.message_properties(trace.set_span_in_context(span))
            for i in ids:
                carried[i] = replace(carried[i], properties={**carried[i].properties, **properties})
        first = next(s for s in sending if s is not None)
        try:
            with trace.use_span(first, end_on_exit=False):
                await self.inner.send(carried)
        except Exception as exc:
            for span in sending:
                if span is not None:
                    spans.failed(span, exc, "send")
            raise
        finally:
            for span in started:
                span.end()

    def _producer(self, order_id: str, messages: list[Outgoing]) -> Span | None:
        """The PRODUCER span of one order's messages, in the order's trace; in a trace
        the sampler dropped, the current span itself, whose context the messages carry
        so that the next hops are dropped too."""
        current = trace.get_current_span().get_span_context()
        context: Context | None = None
        order_trace = self._traces.context(order_id) if order_id else None
        if order_trace is not None and (
            not current.is_valid
            or trace.get_current_span(order_trace).get_span_context().trace_id != current.trace_id
        ):
            context = _rejoin(order_id, order_trace, current)
        elif not current.is_valid:
            return None
        elif spans.dropped():
            return trace.get_current_span()
        queues = list(dict.fromkeys(queue_of(m.destination) for m in messages))
        attributes: dict[str, Any] = {
            "messaging.system": "servicebus",
            "messaging.operation.type": "send",
            "messaging.destination.name": ",".join(queues),
        }
        if order_id:
            attributes[spans.ORDER_ID] = order_id
        if len(messages) == 1:
            attributes["messaging.message.id"] = messages[0].message_id
        else:
            attributes["messaging.batch.message_count"] = len(messages)
        return spans.tracer().start_span(
            f"send {','.join(queues)}",
            context=context,
            kind=SpanKind.PRODUCER,
            attributes=attributes,
        )


def _rejoin(order_id: str, order_trace: Context, sender: trace.SpanContext) -> Context:
    """A span in the order's trace for work another trace does on it, linked back."""
    by = spans.invocation_name.get() or "rejoin"
    attributes: dict[str, Any] = {spans.ORDER_ID: order_id, KEEP: True, "order.rejoined_by": by}
    span = spans.tracer().start_span(
        f"{by} rejoins order",
        context=order_trace,
        kind=SpanKind.INTERNAL,
        attributes=attributes,
        links=[Link(sender)] if sender.is_valid else None,
    )
    span.end()
    return trace.set_span_in_context(span)


class TracedRemote:
    """One agent's remote service for one invocation: it counts the calls, so a retry
    is known as one (an event on the invocation and `http.request.resend_count`)."""

    def __init__(self, inner: RemoteService, agent: str, breaker: CircuitBreaker) -> None:
        self._inner = inner
        self._agent = agent
        self._breaker = breaker
        self._calls = 0
        self._base_url = str(getattr(inner, "base_url", ""))

    async def invoke(self, call: RemoteCall, timeout: float) -> JsonObject:
        if not _in_trace():
            return await self._inner.invoke(call, timeout)
        self._calls += 1
        state = self._breaker.state
        metrics.breaker(self._agent, state)
        attributes: dict[str, Any] = {
            "http.request.method": "POST",
            "url.full": f"{self._base_url}/{call.operation}",
            "server.address": self._agent,
            spans.ORDER_ID: call.order_id,
            "breaker.state": state.value,
            "agent": self._agent,
        }
        if self._calls > 1:
            attributes["http.request.resend_count"] = self._calls - 1
            metrics.retried(self._agent)
            trace.get_current_span().add_event(
                "retry", {"attempt": self._calls, "operation": call.operation}
            )
        with _span(f"POST {call.operation}", SpanKind.CLIENT, attributes) as span:
            try:
                return await self._inner.invoke(call, timeout)
            except RemoteError as exc:
                span.set_attribute("error.type", exc.code)
                raise

    async def outcome(self, key: str, timeout: float) -> RemoteOutcome:
        """The Supervisor's question about an in-doubt step, asked in its trace."""
        if not _in_trace():
            return await self._inner.outcome(key, timeout)
        attributes = {
            "http.request.method": "GET",
            "url.full": f"{self._base_url}/operations/{key}",
            "agent": self._agent,
            "breaker.state": self._breaker.state.value,
        }
        with _span("GET operations", SpanKind.CLIENT, attributes):
            return await self._inner.outcome(key, timeout)

    async def abandon(self, key: str, timeout: float) -> RemoteOutcome:
        """The Supervisor settling a key for good, in the order's trace."""
        if not _in_trace():
            return await self._inner.abandon(key, timeout)
        attributes = {
            "http.request.method": "POST",
            "url.full": f"{self._base_url}/operations/{key}/abandon",
            "agent": self._agent,
            "breaker.state": self._breaker.state.value,
        }
        with _span("POST operations abandon", SpanKind.CLIENT, attributes):
            return await self._inner.abandon(key, timeout)

    async def probe(self, timeout: float) -> None:
        await self._inner.probe(timeout)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def traced(store: StateStore, bus: MessageBus) -> tuple[StateStore, MessageBus]:
    """The state store and the bus as spans, sharing what they learn of orders' traces."""
    traces = OrderTraces()
    return TracedStateStore(store, traces), TracedMessageBus(bus, traces)


def traced_remote(remote: RemoteService, agent: str, breaker: CircuitBreaker) -> RemoteService:
    """For one invocation of an agent; the remote itself while tracing is off."""
    return TracedRemote(remote, agent, breaker) if setup.tracing() else remote
