"""What one message costs to send, alone on a link and in a batch (supports bench/README).

    python -m bench.bus_sends [--messages 400] [--quick]

Against the local broker (its own process, SQLite store as under ``python -m devhost``):
``ServiceBusMessageBus.send`` one message at a time (what every transition does today),
the same from many tasks at once (they queue on the adapter's per-queue lock), and the
SDK's ``send_messages`` with a list of 20 messages on one link.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid

from azure.servicebus import ServiceBusMessage

from bench._common import console, fmt, print_machine, table
from bench._stack import BenchStack
from shared.adapters.servicebus_bus import ServiceBusMessageBus
from shared.domain.model import Outgoing

BATCH = 20


async def run(messages: int) -> list[tuple[str, float]]:
    out: list[tuple[str, float]] = []
    async with BenchStack("bus-sends", runtimes=()) as stack:
        bus = ServiceBusMessageBus.from_connection_string(stack.service_bus_connection_string)
        try:
            await bus.send([Outgoing("order-status", f"warm-{uuid.uuid4().hex}", {"x": 1})])
            started = time.perf_counter()
            for i in range(messages):
                body = {"orderId": f"o-{i}", "status": "Processed"}
                await bus.send([Outgoing("order-status", f"s-{uuid.uuid4().hex}", body)])
            out.append(("bus.send, one message at a time", time.perf_counter() - started))

            started = time.perf_counter()
            await asyncio.gather(
                *(
                    bus.send([Outgoing("agent-replies", f"c-{uuid.uuid4().hex}", {"i": i})])
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bus_sends", description=__doc__)
    parser.add_argument("--messages", type=int, default=400)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        args.messages = min(args.messages, 100)
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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
