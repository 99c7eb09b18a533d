"""What one message costs to send, alone on a link and in a batch (supports bench/README).

    python -m bench.bus_sends [--messages 400] [--senders 64] [--seconds 5] [--quick]

Against the local broker (its own process, SQLite store as under ``python -m devhost``):
``ServiceBusMessageBus.send`` one message at a time (what every transition does today),
the same from many tasks at once (they queue on the adapter's per-queue lock), and the
SDK's ``send_messages`` with a list of 20 messages on one link.

Each row also has the CPU per message of this process (the sender: what a runtime would
spend) and of the broker, which is what a shared machine leaves comparable between runs;
and how many messages went per transfer (concurrent callers of one queue that find its
links busy ride one transfer, shared/adapters/servicebus_bus.py).

Then lasting contention: ``--senders`` tasks each send to one queue, one message after
another, for ``--seconds``; printed, each send's time from the call to its return (the
wait for one of the queue's links included): p50, p99, the longest, and the fewest sends
any task got through, and the CPU per send. A pool that lets a newcomer pass a waiting
caller shows here as a longest wait of the whole run and tasks that sent nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from azure.servicebus import ServiceBusMessage

from bench._common import CpuMeter, LatencySummary, console, fmt, print_machine, table
from bench._stack import BenchStack
from shared.adapters.queues import destination_of
from shared.adapters.servicebus_bus import ServiceBusMessageBus
from shared.domain.model import Outgoing

BATCH = 20


@dataclass(frozen=True)
class Row:
    how: str
    seconds: float
    client_cpu: float
    broker_cpu: float
    transfers: int


async def measured(
    how: str, bus: ServiceBusMessageBus, broker: int, work: Callable[[], Awaitable[object]]
) -> Row:
    meter = CpuMeter({"client": os.getpid(), "broker": broker})
    transfers = bus.transfers
    meter.start()
    await work()
    meter.stop()
    return Row(
        how, meter.wall, meter.used["client"], meter.used["broker"], bus.transfers - transfers
    )


async def run(messages: int) -> list[Row]:
    out: list[Row] = []
    async with BenchStack("bus-sends", runtimes=()) as stack:
        bus = ServiceBusMessageBus.from_connection_string(stack.service_bus_connection_string)
        broker = stack.pids()["broker"]
        try:
            await bus.send(
                [Outgoing(destination_of("order-status"), f"warm-{uuid.uuid4().hex}", {"x": 1})]
            )

            async def one_at_a_time() -> None:
                for i in range(messages):
                    body = {"orderId": f"o-{i}", "status": "Processed"}
                    await bus.send(
                        [Outgoing(destination_of("order-status"), f"s-{uuid.uuid4().hex}", body)]
                    )

            out.append(
                await measured("bus.send, one message at a time", bus, broker, one_at_a_time)
            )

            def concurrently() -> Awaitable[object]:
                return asyncio.gather(
                    *(
                        bus.send(
                            [
                                Outgoing(
                                    destination_of("agent-replies"),
                                    f"c-{uuid.uuid4().hex}",
                                    {"i": i},
                                )
                            ]
                        )
                        for i in range(messages)
                    )
                )

            out.append(
                await measured(
                    "bus.send from concurrent tasks (one queue)", bus, broker, concurrently
                )
            )
            sender = bus._client.get_queue_sender("scheduler")  # the adapter's own client
            async with sender:

                async def batched() -> None:
                    for _ in range(messages // BATCH):
                        await sender.send_messages(
                            [
                                ServiceBusMessage("{}", message_id=f"b-{uuid.uuid4().hex}")
                                for _ in range(BATCH)
                            ]
                        )

                row = await measured(
                    f"send_messages with {BATCH} messages per call", bus, broker, batched
                )
                out.append(
                    Row(row.how, row.seconds, row.client_cpu, row.broker_cpu, messages // BATCH)
                )
        finally:
            await bus.close()
    return out


async def contention(
    senders: int, seconds: float
) -> tuple[LatencySummary, int, int, CpuMeter, int]:
    """Each send's time under lasting contention, all sends, the fewest by one task, the
    CPU used, and the transfers made."""
    times: list[float] = []
    counts = [0] * senders
    async with BenchStack("bus-contention", runtimes=()) as stack:
        bus = ServiceBusMessageBus.from_connection_string(stack.service_bus_connection_string)
        meter = CpuMeter({"client": os.getpid(), "broker": stack.pids()["broker"]})
        try:
            await bus.send(
                [Outgoing(destination_of("scheduler"), f"warm-{uuid.uuid4().hex}", {"x": 1})]
            )
            transfers = bus.transfers
            meter.start()
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
            meter.stop()
            transfers = bus.transfers - transfers
        finally:
            await bus.close()
    return LatencySummary.of(times), len(times), min(counts), meter, transfers


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
        [
            "how",
            "ms per message",
            "messages/s",
            "CPU ms per message: sender",
            "broker",
            "messages per transfer",
        ],
    )
    for row in rows:
        t.add_row(
            row.how,
            fmt(1000 * row.seconds / args.messages, 2),
            fmt(args.messages / row.seconds, 0),
            fmt(1000 * row.client_cpu / args.messages, 3),
            fmt(1000 * row.broker_cpu / args.messages, 3),
            fmt(args.messages / max(row.transfers, 1), 1),
        )
    console.print(t)
    summary, sends, fewest, meter, transfers = asyncio.run(contention(args.senders, args.seconds))
    c = table(
        f"{args.senders} tasks sending to one queue for {args.seconds:g} s: time per send",
        [
            "sends",
            "p50 ms",
            "p95 ms",
            "p99 ms",
            "longest ms",
            "fewest sends by one task",
            "CPU ms per send: sender",
            "broker",
            "sends per transfer",
        ],
    )
    c.add_row(
        str(sends),
        *summary.cells(),
        str(fewest),
        fmt(1000 * meter.used["client"] / max(sends, 1), 3),
        fmt(1000 * meter.used["broker"] / max(sends, 1), 3),
        fmt(sends / max(transfers, 1), 1),
    )
    console.print(c)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
