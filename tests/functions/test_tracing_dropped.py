"""A trace the sampler dropped costs no span after its root: the ports' calls, the sends
and the function's own invocation run in the dropped context, which every message
carries on (so the next hops are dropped too), and a failure is still kept."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest
from azure.functions.servicebus import ServiceBusMessage
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased, Sampler, SamplingResult
from opentelemetry.trace import NonRecordingSpan, SpanContext, StatusCode, TraceFlags

from devhost.host.invoke import InvocationContext
from shared.adapters.memory.store import InMemoryBus, InMemoryStateStore
from shared.adapters.queues import destination_of
from shared.adapters.traced import OrderTraces, TracedMessageBus, TracedStateStore
from shared.contract import Queue
from shared.domain.machine.forward import start
from shared.domain.model import HistoryEntry, OrderProcess, Outgoing
from shared.ports import ConcurrencyConflict
from shared.telemetry import setup, spans
from shared.telemetry.propagation import TRACEPARENT
from shared.telemetry.sampling import KEEP
from tests.builders import an_order
from tests.workflows import ORDER_FULFILMENT

DROPPED_TRACE = 0x0AF7651916CD43DD8448EB211C80319C


class Counting(Sampler):
    """Every sampling decision asked for: one per span started."""

    def __init__(self) -> None:
        self.inner = ParentBased(ALWAYS_ON)
        self.asked: list[str] = []

    def should_sample(
        self, parent_context: Any, trace_id: int, name: str, *args: Any, **kw: Any
    ) -> SamplingResult:
        self.asked.append(name)
        return self.inner.should_sample(parent_context, trace_id, name, *args, **kw)

    def get_description(self) -> str:
        return "Counting"


@pytest.fixture
def recorded() -> Iterator[tuple[InMemorySpanExporter, Counting]]:
    exporter, sampler = InMemorySpanExporter(), Counting()
    provider = TracerProvider(sampler=sampler)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    setup.use_provider(provider)
    try:
        yield exporter, sampler
    finally:
        setup.forget()


def dropped(sampled: bool = False) -> Context:
    flags = TraceFlags(TraceFlags.SAMPLED if sampled else TraceFlags.DEFAULT)
    parent = SpanContext(DROPPED_TRACE, 0x00F067AA0BA902B7, is_remote=True, trace_flags=flags)
    return trace.set_span_in_context(NonRecordingSpan(parent))


class Within:
    def __init__(self, context: Context) -> None:
        self.context = context

    def __enter__(self) -> None:
        self.token = otel_context.attach(self.context)

    def __exit__(self, *exc: object) -> None:
        otel_context.detach(self.token)


def a_process() -> OrderProcess:
    return start(
        an_order(), ORDER_FULFILMENT, datetime(2026, 1, 1, tzinfo=UTC), cause="m-1"
    ).process


class FailingStore(InMemoryStateStore):
    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error = error

    async def save(self, process: OrderProcess, history: Sequence[HistoryEntry]) -> str:
        raise self.error


class FailingBus(InMemoryBus):
    async def send(self, messages: Sequence[Outgoing]) -> None:
        raise ConnectionError("broker gone")


async def calls_in(context: Context) -> InMemoryBus:
    """One order's create, save and send, in `context`; the bus they sent to."""
    bus = InMemoryBus()
    store = TracedStateStore(InMemoryStateStore(), OrderTraces())
    process = a_process()
    with Within(context):
        etag = await store.create(process, [])
        await store.save(replace(process, etag=etag), [])
        await TracedMessageBus(bus, OrderTraces()).send(
            [Outgoing(destination_of(Queue.SCHEDULER), "m-1", {"orderId": process.order_id})]
        )
    return bus


async def test_calls_in_a_dropped_trace_start_no_span_and_carry_it_on(
    recorded: tuple[InMemorySpanExporter, Counting],
) -> None:
    exporter, sampler = recorded
    bus = await calls_in(dropped())
    assert sampler.asked == []
    assert exporter.get_finished_spans() == ()
    (sent,) = bus.on(Queue.SCHEDULER)
    assert sent.properties[TRACEPARENT] == f"00-{DROPPED_TRACE:032x}-00f067aa0ba902b7-00"


async def test_the_same_calls_in_a_sampled_trace_are_spans(
    recorded: tuple[InMemorySpanExporter, Counting],
) -> None:
    exporter, sampler = recorded
    await calls_in(dropped(sampled=True))
    names = ["state create", "state save", "send scheduler"]
    assert sampler.asked == names
    assert [s.name for s in exporter.get_finished_spans()] == names


async def test_a_failure_in_a_dropped_trace_is_kept_and_a_lost_race_is_not(
    recorded: tuple[InMemorySpanExporter, Counting],
) -> None:
    exporter, _ = recorded
    process = a_process()
    with Within(dropped()):
        with pytest.raises(ConcurrencyConflict):
            await TracedStateStore(FailingStore(ConcurrencyConflict("x")), OrderTraces()).save(
                process, []
            )
        assert exporter.get_finished_spans() == ()
        with pytest.raises(TimeoutError):
            await TracedStateStore(FailingStore(TimeoutError("slow")), OrderTraces()).save(
                process, []
            )
        with pytest.raises(ConnectionError):
            await TracedMessageBus(FailingBus(), OrderTraces()).send(
                [Outgoing(destination_of(Queue.SCHEDULER), "m-1", {"orderId": process.order_id})]
            )
    kept = exporter.get_finished_spans()
    assert [s.name for s in kept] == ["state save failed", "send failed"]
    for span in kept:
        assert span.context.trace_id == DROPPED_TRACE
        assert span.status.status_code is StatusCode.ERROR
        assert span.attributes is not None and span.attributes[KEEP] is True


async def test_a_function_in_a_dropped_trace_runs_in_it_without_a_span(
    recorded: tuple[InMemorySpanExporter, Counting],
) -> None:
    exporter, sampler = recorded
    parent = f"00-{DROPPED_TRACE:032x}-00f067aa0ba902b7-00"
    msg = ServiceBusMessage(
        body=b"{}",
        message_id="m-1",
        application_properties={TRACEPARENT: parent},
        user_properties={},
    )
    context = InvocationContext("inv-1", "scheduler_nudge")
    with spans.consuming(msg, context, Queue.SCHEDULER):
        current = trace.get_current_span().get_span_context()
    assert (current.trace_id, current.trace_flags.sampled) == (DROPPED_TRACE, False)
    assert sampler.asked == []
    with pytest.raises(RuntimeError), spans.consuming(msg, context, Queue.SCHEDULER):
        raise RuntimeError("boom")
    (kept,) = exporter.get_finished_spans()
    assert kept.name == "scheduler_nudge failed"
    assert kept.context.trace_id == DROPPED_TRACE
