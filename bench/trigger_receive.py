"""CPU per message of a trigger's receiving: the host's own AMQP connection against the
SDK's receiver (issue #25 item 1).

    python -m bench.trigger_receive [--messages 4000] [--rounds 2]

Against a local broker (its own process, in memory), this process receives and completes
``--messages`` messages the way a queue trigger does (``maxConcurrentCalls`` 16: at most
16 held, each completed as soon as it is taken), once with each client, in the order
host, sdk, sdk, host, ... so that a drifting machine favours neither. The messages are
sent beforehand and not counted. It prints CPU milliseconds per message in this process
(the host's thread and the app's loop apart) and in the broker.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time

from azure.servicebus import ServiceBusMessage
from azure.servicebus.aio import ServiceBusClient

from bench._common import _tree_cpu, console, fmt, print_machine, table
from bench._host_share import thread_cpu
from devhost.harness.ports import free_port, port_open
from devhost.host.loader import HostConfig
from devhost.host.sb_connection import ConnectionInfo
from devhost.host.sb_links import RECEIVER_SETTING, Receivers

QUEUE = "order-status"
WINDOW = 16


async def fill(connection: str, count: int) -> None:
    async with (
        ServiceBusClient.from_connection_string(connection) as client,
        client.get_queue_sender(QUEUE) as sender,
    ):
        for start in range(0, count, 100):
            await sender.send_messages(
                [
                    ServiceBusMessage(b'{"orderId": "o-1", "status": "Processing"}' * 4)
                    for _ in range(min(100, count - start))
                ]
            )


async def drain(connection: str, client: str, count: int) -> float:
    """Receive and complete `count` messages; the host thread's CPU seconds meanwhile
    (read before the link closes: the thread's time goes with it)."""
    settings = {"Bus": connection, RECEIVER_SETTING: client}
    receivers = Receivers(settings, HostConfig())
    info = ConnectionInfo("Bus", connection_string=connection)
    link = await receivers.source(info).open(QUEUE, WINDOW, "bench")
    host_start = thread_cpu(os.getpid())
    done = 0
    settling: set[asyncio.Task[None]] = set()
    try:
        while done < count:
            free = WINDOW - len(settling)
            if free <= 0:
                _, pending = await asyncio.wait(settling, return_when=asyncio.FIRST_COMPLETED)
                settling = set(pending)
                continue
            for delivered in await link.receive(free, 5.0):
                settling.add(asyncio.ensure_future(link.complete(delivered)))
                done += 1
        await asyncio.gather(*settling)
        return thread_cpu(os.getpid()) - host_start
    finally:
        await link.close()
        await receivers.close()


def measure(connection: str, client: str, count: int, broker_pid: int) -> dict[str, float]:
    asyncio.run(fill(connection, count))
    me = os.getpid()
    start = (_tree_cpu(me, tree=False), _tree_cpu(broker_pid), time.monotonic())
    host = asyncio.run(drain(connection, client, count))
    end = (_tree_cpu(me, tree=False), _tree_cpu(broker_pid), time.monotonic())
    process, broker, wall = (b - a for a, b in zip(start, end, strict=True))
    per = 1000 / count
    return {
        "client": process * per,
        "host thread": host * per,
        "app loop": (process - host) * per,
        "broker": broker * per,
        "messages/s": count / wall,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.trigger_receive", description=__doc__)
    parser.add_argument("--messages", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=2, help="rounds of each client (2)")
    args = parser.parse_args(argv)
    print_machine("a trigger's receiving: the host's AMQP connection vs the SDK's receiver")
    port = free_port()
    broker = subprocess.Popen(
        [sys.executable, "-m", "devhost.broker", "--port", str(port), "--control-port", "0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while not port_open(port) and time.monotonic() < deadline:
            time.sleep(0.1)
        connection = (
            f"Endpoint=sb://127.0.0.1:{port};SharedAccessKeyName=k;SharedAccessKey=v;"
            "UseDevelopmentEmulator=true;"
        )
        order = [("host", "sdk")[(i + i // 2) % 2] for i in range(2 * args.rounds)]
        runs: dict[str, list[dict[str, float]]] = {"host": [], "sdk": []}
        for client in order:
            runs[client].append(measure(connection, client, args.messages, broker.pid))
            console.print(f"[dim]{client}: {runs[client][-1]}[/]")
    finally:
        broker.terminate()
        broker.wait(10)
    columns = ["client CPU ms/msg", "of it host thread", "of it app loop", "broker ms/msg"]
    t = table(
        f"receive + complete, {args.messages} messages, {WINDOW} held at most "
        f"(median of {args.rounds})",
        ["receiver", *columns, "messages/s"],
        right_from=1,
    )
    keys = ["client", "host thread", "app loop", "broker", "messages/s"]
    for client, label in (("host", "host's AMQP connection (proton)"), ("sdk", "SDK receiver")):
        medians = [statistics.median(r[k] for r in runs[client]) for k in keys]
        t.add_row(label, *(fmt(v, 3) for v in medians[:4]), fmt(medians[4], 0))
    console.print(t)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
