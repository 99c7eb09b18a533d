"""What the app's own code costs per operation, with no service behind it.

    python -m bench.app_costs [--ops 5000]

The pieces of a fault-free order that run in the runtime's process around the SDKs'
calls, each timed alone in process CPU time (the median of 7 rounds of ``--ops``
runs) and multiplied by how often one order meets it: a remote call's retry wrapper
when the first attempt succeeds (3 per order), a message built for the SDK (9), the
tracing of a send in a trace the sampler dropped (9 of every 10 orders; counted per
message, though a send may carry two), a message parsed as a trigger parses it (6),
and a log line as the local runtime writes it (12). The remote call, the send and the
log handler are stubs or `/dev/null`: what is left is the app's bookkeeping, which the
py-spy profiles of `bench.throughput` spread too thin to compare. Run it on two trees
to compare them.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from opentelemetry.context import attach, detach
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ParentBasedTraceIdRatio

from bench._common import console, fmt, print_machine, table
from shared.adapters.clock import SystemClock
from shared.adapters.queues import destination_of
from shared.adapters.servicebus_bus import _body, _message
from shared.adapters.traced import OrderTraces, TracedMessageBus
from shared.contract import Queue
from shared.domain.messages import AgentReply, AgentRequest
from shared.domain.model import (
    Action,
    Order,
    OrderLine,
    OrderProcess,
    Outcome,
    Outgoing,
    Priority,
    StateRecord,
)
from shared.resilience import CircuitBreaker, RetryPolicy, call_until_deadline
from shared.telemetry import logs, propagation, setup
from shared.telemetry.logsafe import app_logger, make_handlers_safe

DROPPED = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"
"""A traceparent the sampler dropped: 9 of every 10 orders at the deployed 10%."""
PAYLOAD = {"customerId": "customer-1", "items": [{"sku": "sku-1", "quantity": 2, "unitPrice": 9.5}]}


REPEATS = 7
"""Each figure is the median of this many rounds of ``--ops`` runs: a round that another
process on the machine interrupted does not move it."""


def _cpu_us(ops: int, one: Callable[[], object]) -> float:
    rounds = []
    for _ in range(REPEATS):
        started = time.process_time()
        for _ in range(ops):
            one()
        rounds.append((time.process_time() - started) / ops * 1e6)
    return statistics.median(rounds)


async def _cpu_us_async(ops: int, one: Callable[[], Awaitable[object]]) -> float:
    rounds = []
    for _ in range(REPEATS):
        started = time.process_time()
        for _ in range(ops):
            await one()
        rounds.append((time.process_time() - started) / ops * 1e6)
    return statistics.median(rounds)


def _request() -> AgentRequest:
    return AgentRequest(
        "order-0001",
        "reserve-inventory",
        Action.DO,
        1,
        datetime.now(UTC) + timedelta(seconds=30),
        "order-0001:reserve-inventory",
        PAYLOAD,
        operation="reserve-inventory",
    )


def _outgoing() -> Outgoing:
    request = _request()
    return Outgoing(
        destination_of("agent-inventory"),
        "req:order-0001:reserve-inventory:do:1",
        request.to_body(),
        properties={"traceparent": DROPPED, "Diagnostic-Id": DROPPED},
    )


async def retry_wrapper(ops: int) -> float:
    clock = SystemClock()
    breaker = CircuitBreaker("inventory", clock)
    complete_by = clock.now() + timedelta(seconds=30)

    async def answered(timeout: float) -> dict[str, Any]:
        return {"reservationId": "r-1"}

    def one() -> Awaitable[dict[str, Any]]:
        return call_until_deadline(
            answered,
            deadline=lambda: complete_by,
            clock=clock,
            breaker=breaker,
            policy=RetryPolicy(),
            observe=lambda succeeded, seconds: None,
        )

    return await _cpu_us_async(ops, one)


class _Nowhere:
    """A bus that takes every send at once."""

    async def send(self, messages: Sequence[Outgoing]) -> None:
        return None


async def traced_send(ops: int) -> float:
    """One message's send through the tracing wrapper, inside an invocation in a
    dropped trace, the order's root remembered as a load of the order leaves it."""
    setup.use_provider(TracerProvider(sampler=ParentBasedTraceIdRatio(0.1)))
    try:
        traces = OrderTraces()
        bus = TracedMessageBus(_Nowhere(), traces)  # type: ignore[arg-type]
        order = Order(
            "order-0001",
            "customer-1",
            (OrderLine("sku-1", 2, 9.5),),
            Priority.NORMAL,
            Queue.ORDER_STATUS,
            "fp",
            datetime.now(UTC),
            trace_parent=DROPPED,
        )
        # `remember` reads the order alone.
        traces.remember(OrderProcess(order, cast(StateRecord, None), ()))
        messages = [_outgoing()]
        context = propagation.extract(DROPPED)
        assert context is not None
        token = attach(context)
        try:
            return await _cpu_us_async(ops, lambda: bus.send(messages))
        finally:
            detach(token)
    finally:
        setup.forget()


def message_built(ops: int) -> float:
    message = _outgoing()
    return _cpu_us(ops, lambda: _message(message, _body(message)))


def messages_parsed(ops: int) -> float:
    request = _request()
    as_sent = _body(Outgoing(destination_of("agent-inventory"), "r", request.to_body())).encode()
    reply = request.answer(Outcome.SUCCEEDED, result={"reservationId": "r-1"}, agent="inventory")
    replied = _body(Outgoing(destination_of(Queue.AGENT_REPLIES), "p", reply.to_body())).encode()
    return _cpu_us(ops, lambda: (AgentRequest.parse(as_sent), AgentReply.parse(replied))) / 2


def log_line(ops: int) -> float:
    """As `python -m devhost` writes it (its format, the escaping formatter), to
    /dev/null, in a span."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    with open(os.devnull, "w") as sink:
        handler = logging.StreamHandler(sink)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s %(message)s"))
        root.handlers, root.level = [handler], logging.INFO
        make_handlers_safe()
        logs.install()
        log = app_logger("orders")
        context = propagation.extract(DROPPED)
        assert context is not None
        token = attach(context)
        try:
            return _cpu_us(
                ops,
                lambda: log.info(
                    "order %s %s%s [%s, attempt %d, failures %d]",
                    "order-0001",
                    "step-dispatched",
                    ": reserve-inventory to agent-inventory",
                    "Processing",
                    1,
                    0,
                ),
            )
        finally:
            detach(token)
            root.handlers, root.level = saved


PER_ORDER = {
    "retry wrapper, first attempt succeeds": 3,
    "message built for the SDK": 9,
    "tracing of one message's send, dropped trace": 9,
    "message parsed by its trigger": 6,
    "log line": 12,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.app_costs", description=__doc__)
    parser.add_argument("--ops", type=int, default=5000, help="runs of each operation per round")
    args = parser.parse_args(argv)
    print_machine("app costs: the app's bookkeeping per operation, no services")
    costs = {
        "retry wrapper, first attempt succeeds": asyncio.run(retry_wrapper(args.ops)),
        "message built for the SDK": message_built(args.ops),
        "tracing of one message's send, dropped trace": asyncio.run(traced_send(args.ops)),
        "message parsed by its trigger": messages_parsed(args.ops),
        "log line": log_line(args.ops),
    }
    out = table("CPU per operation (process time)", ["operation", "µs", "per order", "µs/order"])
    total = 0.0
    for name, us in costs.items():
        total += us * PER_ORDER[name]
        out.add_row(name, fmt(us), str(PER_ORDER[name]), fmt(us * PER_ORDER[name]))
    out.add_row("[bold]total[/]", "", "", f"[bold]{fmt(total)}[/]")
    console.print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
