"""The archive's throughput: finished orders per second copied to blobs and purged.

    python -m bench.archive [--orders 2000] [--page-size 100]

In-process against a fresh Azurite (table and blob services, in memory) through the real
adapters: `--orders` Processed orders, each with the history a fault-free order has (11
entries, in its state entity), 40 days old, are written with the real `create`; then one
`Archiver.run` with no pace limit archives them all (read, history query, blob page,
pointer row, purge of every row). The printed figure is orders per second of that run,
and the same with the default pace (50 orders a second), which is what a deployed timer
run does: the pace, not the store, is the bound there.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from azure.storage.blob.aio import BlobServiceClient

from devhost.harness.stack import lone_azurite, lone_azurite_blob
from shared.adapters.blob_archive import BlobArchive
from shared.adapters.clock import SystemClock
from shared.adapters.table.archive import TableArchiveStore
from shared.adapters.table.client import table_service_client
from shared.adapters.table.store import TableStateStore
from shared.catalogue import catalogue_file, load
from shared.domain.machine.forward import start
from shared.domain.model import HistoryEntry, Order, OrderLine, Priority, ProcessState, StepStatus
from shared.domain.rest_index import rest_entry
from shared.settings import azurite_connection_string
from shared.usecases.history.archive import Archiver

FINISHED = datetime.now(UTC) - timedelta(days=40)


async def fill(store: TableStateStore, count: int) -> None:
    workflow = load(catalogue_file()).workflows[0]
    gate = asyncio.Semaphore(32)

    async def one(i: int) -> None:
        order = Order(
            f"{i:08x}-bench",
            "c-1",
            (OrderLine("SKU", 1, 5.0),),
            Priority.NORMAL,
            None,
            "fp",
            FINISHED,
        )
        process = start(order, workflow, FINISHED).process
        steps = tuple(replace(s, agent="a", status=StepStatus.COMPLETED) for s in process.steps)
        state = replace(process.state, process_state=ProcessState.PROCESSED, updated_at=FINISHED)
        history = [
            HistoryEntry(FINISHED, f"e{j}", "", ProcessState.PROCESSING, 0, 1) for j in range(11)
        ]
        finished = replace(process, state=state, steps=steps)
        async with gate:
            await store.create(finished, history)
            await store.put_rest(rest_entry(finished, workflow))

    await asyncio.gather(*(one(i) for i in range(count)))


async def measure(
    orders: int, page_size: int, per_second: float, table_port: int, blob_port: int
) -> float:
    connection = azurite_connection_string(table_port, blob_port=blob_port)
    store = TableStateStore(
        table_service_client(connection_string=connection), f"b{uuid.uuid4().hex[:16]}"
    )
    blobs = BlobArchive(
        BlobServiceClient.from_connection_string(connection), f"b{uuid.uuid4().hex[:16]}"
    )
    try:
        await fill(store, orders)
        archiver = Archiver(
            store, TableArchiveStore(store), blobs, SystemClock(), "bench", page_size=page_size,
            per_second=per_second, budget=timedelta(hours=1), max_orders=orders,
        )  # fmt: skip
        started = time.perf_counter()
        run = await archiver.run()
        seconds = time.perf_counter() - started
        assert run.archived == orders, run
        return orders / seconds
    finally:
        await store.close()
        await blobs.close()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.archive", description=__doc__)
    parser.add_argument("--orders", type=int, default=2000)
    parser.add_argument("--page-size", type=int, default=100)
    args = parser.parse_args()
    with lone_azurite() as table_port, lone_azurite_blob() as blob_port:
        unpaced = asyncio.run(measure(args.orders, args.page_size, 1e9, table_port, blob_port))
        paced = asyncio.run(
            measure(min(args.orders, 500), args.page_size, 50, table_port, blob_port)
        )
    print(f"archive, {args.orders} Processed orders, page {args.page_size}, Azurite in memory:")
    print(f"  unpaced: {unpaced:.0f} orders/s")
    print(f"  default pace (50/s): {paced:.1f} orders/s")


if __name__ == "__main__":
    main()
