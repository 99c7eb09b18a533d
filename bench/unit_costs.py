"""What one message, one table request and one remote call cost in CPU, on both ends.

    python -m bench.unit_costs [--ops 2000] [--concurrency 16] [--quick] [--only message]

Against the services of ``python -m devhost`` (Azurite, the broker with its SQLite store,
the simulator; no runtime), this process does each kind of operation an order is made of,
through the app's own adapters and the Table client they are built with
(``table_service_client``), ``--concurrency`` at a time as a busy runtime would:

* a message: ``ServiceBusMessageBus.send`` of one message, received by a peek-lock
  receiver and completed (what a trigger does for every message it takes);
* the state store's calls: ``watch``, ``create``, ``load``, ``save`` (If-Match) and
  ``unwatch``;
* a remote call: ``HttpRemoteService.invoke`` (one POST to the simulator).

It prints CPU milliseconds per operation in this process (the client: what the runtime
would spend) and in the server process, then an order's bill: those unit costs times
what one fault-free order does (the counts of ``bench.cost_per_order``). The bill is
the floor of CPU per order that no change inside the app can go under while every
message crosses the broker and every state change is a request to the table service.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

import aiohttp
from azure.data.tables.aio import TableServiceClient
from azure.servicebus import ServiceBusReceiveMode
from azure.servicebus.aio import ServiceBusReceiver

from bench._common import CpuMeter, console, fmt, print_machine, table
from bench._stack import BenchStack, set_faults
from shared.adapters.clock import SystemClock
from shared.adapters.http_remote import HttpRemoteService
from shared.adapters.queues import destination_of
from shared.adapters.servicebus_bus import ServiceBusMessageBus
from shared.adapters.table.client import table_service_client
from shared.adapters.table.customers import TableCustomerLedger
from shared.adapters.table.limits import TableLimitStore
from shared.adapters.table.store import TableStateStore
from shared.catalogue import catalogue_file, load
from shared.domain.fairness import CustomerPolicy
from shared.domain.limits import AgentLimits
from shared.domain.machine import forward
from shared.domain.model import Order, OrderLine, OrderProcess, Outgoing, Priority
from shared.ports import RemoteCall
from shared.usecases.limits.limiter import AgentLimiter

ORDER_FULFILMENT = load(catalogue_file()).default_workflow()

QUEUE = "order-status"
PAYLOAD = {"customerId": "customer-1", "items": [{"sku": "sku-1", "quantity": 2, "unitPrice": 9.5}]}

PER_ORDER: tuple[tuple[str, int], ...] = (
    ("message", 10),
    ("table: watch", 1),
    ("table: create", 1),
    ("table: save", 4),
    ("table: unwatch", 1),
    ("remote call", 3),
)
"""What one fault-free order does (bench.cost_per_order): 10 messages (nudge, 3 agent
requests, 3 replies, 3 status messages), 7 table requests, 3 remote calls. Each message
is sent and received once; the 3 status messages are received by the client, not the
runtime, so the runtime's share of them is only the send."""

WITH_LEDGER: tuple[tuple[str, int], ...] = (("ledger: enter", 1), ("ledger: leave", 1))
"""What a customer ledger adds per order (either per-customer setting on): it enters at
the intake (1 point read, 1 entity-group transaction) and leaves when it rests (2 point
reads, 1 transaction), on the customer's partition (docs/fairness.md)."""
SKEW = timedelta(seconds=5)
"""ClockSkewSeconds' default: how long an expired lease is still honoured."""
CUSTOMERS = 64
"""Orders spread over this many customers: under the fair share, so no line forms and
every leave is the plain one (a promotion adds a one-row query, a watch and a send)."""


@dataclass(frozen=True)
class Cost:
    name: str
    ops: int
    client_s: float
    server_s: float
    server: str
    wall_s: float

    def client_ms(self) -> float:
        return 1000 * self.client_s / self.ops

    def server_ms(self) -> float:
        return 1000 * self.server_s / self.ops


class Meter:
    """CPU of this process (the client) and of one service process over one operation kind."""

    def __init__(self, server_pid: int) -> None:
        self.server_pid = server_pid

    async def measure(
        self, name: str, server: str, ops: int, work: Callable[[], Awaitable[None]]
    ) -> Cost:
        meter = CpuMeter({"client": os.getpid(), server: self.server_pid})
        meter.start()
        await work()
        meter.stop()
        return Cost(name, ops, meter.used["client"], meter.used[server], server, meter.wall)


async def spread(ops: int, concurrency: int, one: Callable[[int], Awaitable[None]]) -> None:
    """`ops` calls of `one`, at most `concurrency` at a time."""
    next_index = iter(range(ops))

    async def worker() -> None:
        for i in next_index:
            await one(i)

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def messages(stack: BenchStack, ops: int, concurrency: int) -> Cost:
    bus = ServiceBusMessageBus.from_connection_string(stack.service_bus_connection_string)
    run = uuid.uuid4().hex[:8]
    done = asyncio.Event()
    received = 0

    async def receive(receiver: ServiceBusReceiver) -> None:
        nonlocal received
        while received < ops:
            batch = await receiver.receive_messages(max_message_count=16, max_wait_time=1)
            for message in batch:
                await receiver.complete_message(message)
            received += len(batch)
        done.set()

    async def send(i: int) -> None:
        body = {"orderId": f"u-{run}-{i}", "status": "Processed", "at": "2026-11-24T00:00:00Z"}
        await bus.send([Outgoing(destination_of(QUEUE), f"u-{run}-{i}", body)])

    try:
        await bus.send([Outgoing(destination_of(QUEUE), f"warm-{run}", {"orderId": "warm"})])
        async with bus._client.get_queue_receiver(  # the adapter's own client
            QUEUE, receive_mode=ServiceBusReceiveMode.PEEK_LOCK
        ) as receiver:
            warm = await receiver.receive_messages(max_message_count=1, max_wait_time=5)
            for message in warm:
                await receiver.complete_message(message)
            pids = stack.pids()
            meter = Meter(pids["broker"])

            async def work() -> None:
                receiving = asyncio.ensure_future(receive(receiver))
                await spread(ops, concurrency, send)
                await asyncio.wait_for(done.wait(), timeout=120)
                await receiving

            return await meter.measure("message", "broker", ops, work)
    finally:
        await bus.close()


def an_order(order_id: str) -> Order:
    return Order(
        order_id,
        "customer-1",
        (OrderLine("sku-1", 2, 9.5), OrderLine("sku-2", 1, 20.0)),
        Priority.NORMAL,
        QUEUE,
        f"fp-{order_id}",
        datetime.now(UTC),
    )


def calls(
    one: Callable[[int], Awaitable[None]], start: int, ops: int, concurrency: int
) -> Callable[[], Awaitable[None]]:
    return lambda: spread(ops - start, concurrency, lambda i: one(i + start))


async def table_calls(stack: BenchStack, ops: int, concurrency: int) -> list[Cost]:
    service = table_service_client(connection_string=stack.storage_connection_string)
    table = f"unit{uuid.uuid4().hex[:12]}"
    store = TableStateStore(service, table)
    await store.ensure_table()
    meter = Meter(stack.pids()["azurite"])
    run = uuid.uuid4().hex[:8]
    ids = [f"t-{run}-{i}" for i in range(ops)]
    now = datetime.now(UTC)
    transitions = [forward.start(an_order(i), ORDER_FULFILMENT, now) for i in ids]
    kept: dict[int, OrderProcess] = {}
    costs: list[Cost] = []
    try:

        async def watch(i: int) -> None:
            await store.watch(ids[i], now + timedelta(minutes=5), replace=False, version=1)

        async def create(i: int) -> None:
            t = transitions[i]
            kept[i] = replace(t.process, etag=await store.create(t.process, t.history))

        async def load(i: int) -> None:
            assert await store.load(ids[i]) is not None

        async def save(i: int) -> None:
            kept[i] = replace(kept[i], etag=await store.save(kept[i], ()))

        async def unwatch(i: int) -> None:
            await store.unwatch(ids[i])

        for warm in (watch, create, load):  # the connection pool, and the first order
            await warm(0)
        for name, one, start in (
            ("table: watch", watch, 1),
            ("table: create", create, 1),
            ("table: load", load, 0),
            ("table: save", save, 0),
            ("table: unwatch", unwatch, 0),
        ):
            costs.append(
                await meter.measure(
                    name, "azurite", ops - start, calls(one, start, ops, concurrency)
                )
            )
        costs += await ledger_calls(meter, service, table, ids, concurrency)
        costs += await limiter_calls(meter, service, table, len(ids), concurrency)
        return costs
    finally:
        await store.close()


async def ledger_calls(
    meter: Meter,
    service: TableServiceClient,
    table: str,
    ids: list[str],
    concurrency: int,
) -> list[Cost]:
    """The customer ledger on the state store's table, as the runtime wires it."""
    ledger = TableCustomerLedger(service, table)
    policy = CustomerPolicy(fair_share=8)
    now = datetime.now(UTC)

    async def enter(i: int) -> None:
        await ledger.enter(f"customer-{i % CUSTOMERS}", ids[i], now, policy)

    async def leave(i: int) -> None:
        await ledger.leave(f"customer-{i % CUSTOMERS}", ids[i], policy, now)

    ops = len(ids)
    await enter(0)
    return [
        await meter.measure("ledger: enter", "azurite", ops - 1, calls(enter, 1, ops, concurrency)),
        await meter.measure("ledger: leave", "azurite", ops, calls(leave, 0, ops, concurrency)),
    ]


async def limiter_calls(
    meter: Meter, service: TableServiceClient, table: str, ops: int, concurrency: int
) -> list[Cost]:
    """An agent's fleet-wide limits on the state store's table, as the runtime wires them,
    set high enough that no call waits: what a limit costs a call that it lets through.
    A rate slot is booked for every call waiting in this process in one write; a
    concurrency slot is a lease query, a take and a release (docs/limits.md)."""
    store = TableLimitStore(service, table)
    clock = SystemClock()
    rate = AgentLimiter(
        "bench-rate", AgentLimits(calls_per_second=100_000), store, clock, "bench", SKEW
    )
    slots = AgentLimiter(
        "bench-slots", AgentLimits(max_concurrent=4 * concurrency), store, clock, "bench", SKEW
    )

    async def slot(i: int) -> None:
        await rate.start_at()

    async def lease(i: int) -> None:
        async def never(until: datetime) -> None:
            raise AssertionError("a slot was free")

        await slots.leave(await slots.enter(timedelta(seconds=30), never))

    try:
        await slot(0)
        await lease(0)
        return [
            await meter.measure(
                "limit: rate slot", "azurite", ops, calls(slot, 0, ops, concurrency)
            ),
            await meter.measure(
                "limit: concurrency slot", "azurite", ops, calls(lease, 0, ops, concurrency)
            ),
        ]
    finally:
        await store.close()


async def remote_calls(stack: BenchStack, ops: int, concurrency: int) -> Cost:
    meter = Meter(stack.pids()["simulator"])
    run = uuid.uuid4().hex[:8]
    async with aiohttp.ClientSession() as session:
        remote = HttpRemoteService(f"{stack.simulator_url}/inventory", session)

        async def call(i: int) -> None:
            key = f"r-{run}-{i}:reserve-inventory"
            await remote.invoke(RemoteCall(f"r-{run}-{i}", "reserve-inventory", key, PAYLOAD), 10)

        await call(-1)
        return await meter.measure(
            "remote call", "simulator", ops, lambda: spread(ops, concurrency, call)
        )


async def run(ops: int, concurrency: int, only_messages: bool = False) -> list[Cost]:
    async with BenchStack("unit-costs", runtimes=()) as stack:
        # No remote latency: the simulator answers at once, so only CPU is measured.
        async with aiohttp.ClientSession() as session:
            await set_faults(stack.simulator(session), 0.0, 0)
        costs = [await messages(stack, ops, concurrency)]
        if only_messages:
            return costs
        costs += await table_calls(stack, ops, concurrency)
        costs.append(await remote_calls(stack, ops, concurrency))
        return costs


def report(costs: list[Cost], concurrency: int) -> None:
    t = table(
        f"CPU per operation, {concurrency} at a time",
        ["operation", "ops", "client ms/op", "server", "server ms/op", "both ms/op", "ops/s"],
    )
    for c in costs:
        t.add_row(
            c.name,
            str(c.ops),
            fmt(c.client_ms(), 3),
            c.server,
            fmt(c.server_ms(), 3),
            fmt(c.client_ms() + c.server_ms(), 3),
            fmt(c.ops / c.wall_s, 0),
        )
    console.print(t)
    by_name = {c.name: c for c in costs}
    if set(by_name) == {"message"}:
        return
    bill = table(
        "an order's bill (fault-free): unit costs x what one order does",
        ["operation", "per order", "client ms", "servers ms"],
    )
    client_total = server_total = 0.0
    for name, count in PER_ORDER:
        c = by_name[name]
        client, server = count * c.client_ms(), count * c.server_ms()
        client_total += client
        server_total += server
        bill.add_row(name, str(count), fmt(client, 1), fmt(server, 1))
    bill.add_row("total", "", fmt(client_total, 1), fmt(server_total, 1))
    console.print(bill)
    message = by_name["message"]
    ledger = [by_name[n] for n, _ in WITH_LEDGER if n in by_name]
    if ledger:
        client = sum(c.client_ms() for c in ledger)
        server = sum(c.server_ms() for c in ledger)
        console.print(
            f"with a customer ledger (IntakeMaxPendingPerCustomer or "
            f"FairShareRunningPerCustomer set): +{fmt(client, 1)} ms client, "
            f"+{fmt(server, 1)} ms Azurite per order = "
            f"{(client + server) / max(client_total + server_total, 1e-9):.0%} on the bill, "
            "and +3 point reads and +2 transactions per order"
        )
    for name in ("limit: rate slot", "limit: concurrency slot"):
        if name in by_name:
            c = by_name[name]
            console.print(
                f"{name} (an agent with callsPerSecond / maxConcurrent set): "
                f"+{fmt(c.client_ms(), 2)} ms client, +{fmt(c.server_ms(), 2)} ms Azurite "
                "per remote call; an agent without limits pays nothing"
            )
    console.print(
        f"floor of CPU per order (runtime + broker + Azurite, simulator left out): "
        f"{fmt(client_total + server_total - 3 * by_name['remote call'].server_ms(), 1)} ms; "
        f"of it messages {fmt(10 * (message.client_ms() + message.server_ms()), 1)} ms. "
        "The client column counts sending and receiving each message in one process; "
        "the HTTP intake and the app's own code come on top."
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", type=int, default=2000, help="operations of each kind")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--quick", action="store_true", help="200 of each, a smoke run")
    parser.add_argument(
        "--only",
        choices=["message"],
        help="measure only the message row (the broker's CPU per message), no order's bill",
    )
    args = parser.parse_args(argv)
    ops = 200 if args.quick else args.ops
    if ops < 2 or args.concurrency < 1:
        parser.error("--ops must be at least 2 and --concurrency at least 1")
    print_machine("unit costs: CPU per message, table request and remote call")
    costs = asyncio.run(run(ops, args.concurrency, only_messages=args.only == "message"))
    report(costs, args.concurrency)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
