"""CPU per message of a trigger's receiving: the host's own AMQP connection against the
SDK's receiver (issue #25 item 1).

    python -m bench.trigger_receive [--messages 4000] [--rounds 2] [--through trigger]

Against a local broker (its own process, in memory), this process receives and completes
``--messages`` messages the way a queue trigger does (``maxConcurrentCalls`` 16: at most
16 held, each completed as soon as it is taken), once with each client, in the order
host, sdk, sdk, host, ... so that a drifting machine favours neither. The messages are
sent beforehand and not counted. It prints CPU milliseconds per message in this process
(the host's thread and the app's loop apart) and in the broker.

``--through trigger`` takes each message through devhost's queue trigger instead, to a
function that does nothing: the host's whole part of an invocation (receive, the
``ServiceBusMessage`` the worker would build, the invocation span, the call, complete).
No tracer provider is set, so the span is OpenTelemetry's no-op one.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time

import azure.functions as func
from azure.servicebus import ServiceBusMessage
from azure.servicebus.aio import ServiceBusClient

from bench._common import _tree_cpu, console, fmt, print_machine, table
from bench._host_share import thread_cpu
from devhost.harness.ports import free_port, port_open
from devhost.host.loader import FunctionSpec, HostConfig
from devhost.host.sb_connection import ConnectionInfo
from devhost.host.sb_links import RECEIVER_SETTING, Receivers
from devhost.host.servicebus import QueueTrigger

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


async def through_trigger(connection: str, client: str, count: int) -> float:
    """Take `count` messages through a queue trigger to a function that does nothing;
    the host thread's CPU seconds meanwhile."""
    settings = {"Bus": connection, RECEIVER_SETTING: client}
    config = HostConfig(max_concurrent_calls=WINDOW)
    receivers = Receivers(settings, config)
    invoked = 0
    all_done = asyncio.Event()

    async def handler(msg: func.ServiceBusMessage) -> None:
        nonlocal invoked
        invoked += 1
        if invoked == count:
            all_done.set()

    trigger = {"type": "serviceBusTrigger", "name": "msg", "queueName": QUEUE, "connection": "Bus"}
    spec = FunctionSpec("bench", handler, (trigger,))
    queue_trigger = QueueTrigger(spec, trigger, receivers, settings, config)
    host_start = thread_cpu(os.getpid())
    queue_trigger.start()
    try:
        await all_done.wait()
        while queue_trigger.in_flight():  # the last completions
            await asyncio.wait(queue_trigger.in_flight())
        return thread_cpu(os.getpid()) - host_start
    finally:
        await queue_trigger.stop_receiving()
        await queue_trigger.close()
        await receivers.close()


def measure(
    connection: str, client: str, count: int, broker_pid: int, through: str = "link"
) -> dict[str, float]:
    asyncio.run(fill(connection, count))
    me = os.getpid()
    start = (_tree_cpu(me, tree=False), _tree_cpu(broker_pid), time.monotonic())
    receive = through_trigger if through == "trigger" else drain
    host = asyncio.run(receive(connection, client, count))
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
    parser.add_argument(
        "--through",
        choices=("link", "trigger"),
        default="link",
        help="receive and complete on the link (default), or through a queue trigger",
    )
    parser.add_argument(
        "--clients", default="host,sdk", help="which receivers, comma-separated (host,sdk)"
    )
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
        clients = [c.strip() for c in args.clients.split(",") if c.strip()]
        pair = (clients * 2)[:2]
        order = [pair[(i + i // 2) % 2] for i in range(2 * args.rounds)]
        if len(clients) == 1:
            order = order[: args.rounds]
        runs: dict[str, list[dict[str, float]]] = {client: [] for client in clients}
        for client in order:
            runs[client].append(
                measure(connection, client, args.messages, broker.pid, args.through)
            )
            console.print(f"[dim]{client}: {runs[client][-1]}[/]")
    finally:
        broker.terminate()
        broker.wait(10)
    columns = ["client CPU ms/msg", "of it host thread", "of it app loop", "broker ms/msg"]
    what = "through a queue trigger" if args.through == "trigger" else "receive + complete"
    t = table(
        f"{what}, {args.messages} messages, {WINDOW} held at most (median of {args.rounds})",
        ["receiver", *columns, "messages/s"],
        right_from=1,
    )
    keys = ["client", "host thread", "app loop", "broker", "messages/s"]
    for client, label in (("host", "host's AMQP connection (proton)"), ("sdk", "SDK receiver")):
        if not runs.get(client):
            continue
        medians = [statistics.median(r[k] for r in runs[client]) for k in keys]
        t.add_row(label, *(fmt(v, 3) for v in medians[:4]), fmt(medians[4], 0))
    console.print(t)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
