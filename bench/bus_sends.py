"""What one message costs to send, alone on a link and in a batch (supports bench/README).

    python -m bench.bus_sends [--messages 400] [--senders 64] [--seconds 5] [--quick]

Against the local broker (its own process, SQLite store as under ``python -m devhost``):
``ServiceBusMessageBus.send`` one message at a time (what every transition does today),
the same from many tasks at once (they queue on the adapter's per-queue lock), and the
SDK's ``send_messages`` with a list of 20 messages on one link.

Then lasting contention: ``--senders`` tasks each send to one queue, one message after
another, for ``--seconds``; printed, each send's time from the call to its return (the
wait for one of the queue's links included): p50, p99, the longest, and the fewest sends
any task got through. A pool that lets a newcomer pass a waiting caller shows here as a
longest wait of the whole run and tasks that sent nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid

from azure.servicebus import ServiceBusMessage

from bench._common import LatencySummary, console, fmt, print_machine, table
from bench._stack import BenchStack
from shared.adapters.queues import destination_of
from shared.adapters.servicebus_bus import ServiceBusMessageBus
from shared.domain.model import Outgoing

BATCH = 20


async def run(messages: int) -> list[tuple[str, float]]:
    out: list[tuple[str, float]] = []
    async with BenchStack("bus-sends", runtimes=()) as stack:
        bus = ServiceBusMessageBus.from_connection_string(stack.service_bus_connection_string)
        try:
            await bus.send(
                [Outgoing(destination_of("order-status"), f"warm-{uuid.uuid4().hex}", {"x": 1})]
            )
            started = time.perf_counter()
            for i in range(messages):
                body = {"orderId": f"o-{i}", "status": "Processed"}
                await bus.send(
                    [Outgoing(destination_of("order-status"), f"s-{uuid.uuid4().hex}", body)]
                )
            out.append(("bus.send, one message at a time", time.perf_counter() - started))

            started = time.perf_counter()
            await asyncio.gather(
                *(
                    bus.send(
                        [
                            Outgoing(
                                destination_of("agent-replies"), f"c-{uuid.uuid4().hex}", {"i": i}
                            )
                        ]
                    )
                    for i in range(messages)
                )
            )
            out.append(
                (
                    "bus.send from concurrent tasks (one link, one at a time)",
                    time.perf_counter() - started,
                )
            )
            sender = bus._client.get_queue_sender("scheduler")  # the adapter's own client
            async with sender:
                started = time.perf_counter()
                for _ in range(messages // BATCH):
                    await sender.send_messages(
                        [
                            ServiceBusMessage("{}", message_id=f"b-{uuid.uuid4().hex}")
                            for _ in range(BATCH)
                        ]
                    )
                out.append(
                    (f"send_messages with {BATCH} messages per call", time.perf_counter() - started)
                )
        finally:
            await bus.close()
    return out


async def contention(senders: int, seconds: float) -> tuple[LatencySummary, int, int]:
    """Each send's time under lasting contention, all sends, and the fewest by one task."""
    times: list[float] = []
    counts = [0] * senders
    async with BenchStack("bus-contention", runtimes=()) as stack:
        bus = ServiceBusMessageBus.from_connection_string(stack.service_bus_connection_string)
        try:
            await bus.send(
                [Outgoing(destination_of("scheduler"), f"warm-{uuid.uuid4().hex}", {"x": 1})]
            )
            stop = time.perf_counter() + seconds

            async def sender(n: int) -> None:
                while time.perf_counter() < stop:
                    started = time.perf_counter()
                    await bus.send(
                        [Outgoing(destination_of("scheduler"), f"n-{uuid.uuid4().hex}", {"n": n})]
                    )
                    times.append(time.perf_counter() - started)
                    counts[n] += 1

            await asyncio.gather(*(sender(n) for n in range(senders)))
        finally:
            await bus.close()
    return LatencySummary.of(times), len(times), min(counts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bus_sends", description=__doc__)
    parser.add_argument("--messages", type=int, default=400)
    parser.add_argument("--senders", type=int, default=64, help="tasks sending at once (64)")
    parser.add_argument("--seconds", type=float, default=5.0, help="how long they send (5)")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        args.messages = min(args.messages, 100)
        args.seconds = min(args.seconds, 2.0)
    args.messages = max(args.messages - args.messages % BATCH, BATCH)
    print_machine("sending on one link: alone vs batched")
    rows = asyncio.run(run(args.messages))
    t = table(
        f"{args.messages} messages to the local broker",
        ["how", "ms per message", "messages/s"],
    )
    for how, seconds in rows:
        t.add_row(how, fmt(1000 * seconds / args.messages, 2), fmt(args.messages / seconds, 0))
    console.print(t)
    summary, sends, fewest = asyncio.run(contention(args.senders, args.seconds))
    c = table(
        f"{args.senders} tasks sending to one queue for {args.seconds:g} s: time per send",
        ["sends", "p50 ms", "p95 ms", "p99 ms", "longest ms", "fewest sends by one task"],
    )
    c.add_row(str(sends), *summary.cells(), str(fewest))
    console.print(c)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
