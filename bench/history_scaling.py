"""What the operator's views cost as finished orders pile up: 0, 20,000, 200,000.

    python -m bench.history_scaling [--sizes 0,20000,200000] [--repeats 15]

In-process against a fresh Azurite through the real ``TableStateStore``, calling what
the routes call: ``operator_snapshot`` (GET /api/ops/data, default cap), ``group_failures``
(GET /api/failures) and a bulk dry run (``preview`` of a resubmit of the Error orders,
the route's ``dryRun``). The live orders stay the same at every size: 50 Error orders
(with their rest entries) and 20 Processing ones (on the watch list, as the intake
leaves them). The finished ones are Processed state rows inserted directly,
concurrently, and, where the commit has the rest index, their rest entries in batches
of 50, as the unit of work would have left them.

Each figure is the median of ``--repeats`` calls after two warm-ups; the ratio is to
the figure at the first size. The table requests one call makes are counted too, by the
adapter's own counter: on Azurite every query walks the whole table, so the count is
what shows the cost on Table Storage, where a range read is a seek. No assertion:
figures and ratios (bench/README.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from bench.supervisor_scaling import finished, in_flight
from devhost.harness.stack import lone_azurite
from shared.adapters.clock import FakeClock
from shared.adapters.memory.store import InMemoryBus, InMemoryHealthStore
from shared.adapters.table import rows as table_rows
from shared.adapters.table.bulk import TableBulkStore
from shared.adapters.table.client import table_service_client
from shared.adapters.table.store import TableStateStore
from shared.catalogue import catalogue_file, load
from shared.domain.bulk_request import BulkAction, BulkFilter, BulkRequest
from shared.domain.machine.transition import ProcessPolicy
from shared.domain.model import ProcessState
from shared.settings import azurite_connection_string
from shared.usecases.flow.deps import ProcessDeps
from shared.usecases.operations.bulk import BulkDeps, preview
from shared.usecases.operations.failures import group_failures
from shared.usecases.operations.operator_page import operator_snapshot

try:  # the rest index, on commits that have it
    from shared.adapters.table import rest as table_rest
    from shared.domain import rest_index
except ImportError:  # pragma: no cover - the commit before it
    table_rest = None  # type: ignore[assignment]
    rest_index = None  # type: ignore[assignment]

POLICY = ProcessPolicy(
    step_timeout=timedelta(seconds=30), pending_timeout=timedelta(seconds=60), max_failure_count=3
)
ERRORS = 50
PROCESSING = 20
CONCURRENCY = 48
BATCH = 50
"""Rest entries per transaction (the service allows 100; Azurite dropped the connection
on some of those in one partition under load)."""


async def add_live(store: TableStateStore, now: datetime) -> None:
    for n in range(ERRORS):
        t = in_flight(f"err-{n:04d}", now)
        state = replace(
            t.process.state,
            process_state=ProcessState.ERROR,
            locked_by=None,
            last_error="charge-payment: declined: card declined",
            current_step=1,
        )
        errored = replace(t.process, state=state)
        await store.create(errored, t.history)
        if rest_index is not None:
            await store.put_rest(rest_index.rest_entry(errored, None))
    for n in range(PROCESSING):
        t = in_flight(f"run-{n:04d}", now)
        await store.watch(t.process.order_id, now + timedelta(minutes=5), replace=True)
        await store.create(t.process, t.history)


async def add_finished(store: TableStateStore, start: int, count: int, now: datetime) -> None:
    """Processed state rows written directly, `CONCURRENCY` at a time, and their entries."""
    template = finished("fin-template", now)
    gate = asyncio.Semaphore(CONCURRENCY)
    by_partition: dict[str, list[dict[str, Any]]] = defaultdict(list)

    async def one(n: int) -> None:
        order_id = f"fin-{n:07d}"
        order = replace(template.process.order, order_id=order_id)
        state = replace(template.process.state, order_id=order_id)
        process = replace(template.process, order=order, state=state)
        entity = table_rows.state_entity(process)
        async with gate:
            await store.table.create_entity(entity)
        if table_rest is not None:
            entity = table_rest.entity(rest_index.rest_entry(process, None))
            by_partition[entity["PartitionKey"]].append(entity)

    await asyncio.gather(*(one(n) for n in range(start, start + count)))
    for entities in by_partition.values():
        for i in range(0, len(entities), BATCH):
            batch = [("create", e) for e in entities[i : i + BATCH]]
            await store.table.submit_transaction(batch)


async def timed(call: Callable[[], Awaitable[Any]], repeats: int) -> float:
    for _ in range(2):
        await call()
    samples = []
    for _ in range(repeats):
        began = time.perf_counter()
        await call()
        samples.append((time.perf_counter() - began) * 1000)
    return statistics.median(samples)


async def requests(store: TableStateStore, call: Callable[[], Awaitable[Any]]) -> float:
    """Table requests one call makes (queries, point reads, writes), by the adapter's own
    counter: what the service is asked, whatever the emulator does with it."""
    before = sum(store.operations.values())
    await call()
    return float(sum(store.operations.values()) - before)


async def run(sizes: list[int], repeats: int) -> list[dict[str, float]]:
    figures = []
    with lone_azurite("azurite-history-") as port:
        service = table_service_client(connection_string=azurite_connection_string(port))
        store = TableStateStore(service, f"h{uuid.uuid4().hex[:20]}")
        now = datetime.now(UTC)
        deps = ProcessDeps(
            store, InMemoryBus(), FakeClock(now), POLICY, "bench", catalogue=load(catalogue_file())
        )
        bulk = BulkDeps(deps, TableBulkStore(store))
        health = InMemoryHealthStore()
        request = BulkRequest(BulkAction.RESUBMIT, BulkFilter(state=ProcessState.ERROR), True)
        try:
            await store.ensure_table()
            await add_live(store, now)
            inserted = 0
            for size in sizes:
                began = time.perf_counter()
                await add_finished(store, inserted, size - inserted, now)
                load_s = time.perf_counter() - began
                inserted = size
                snapshot = await operator_snapshot(deps, health)
                counts = {c.state.value: c.count for c in snapshot.counts}
                assert counts["Error"] == min(ERRORS, snapshot.count_cap), counts
                assert (await preview(bulk, request)).matched == ERRORS
                figures.append(
                    {
                        "finished": size,
                        "insert_s": load_s,
                        "ops_ms": await timed(lambda: operator_snapshot(deps, health), repeats),
                        "failures_ms": await timed(lambda: group_failures(store), repeats),
                        "dry_run_ms": await timed(lambda: preview(bulk, request), repeats),
                        "ops_requests": await requests(
                            store, lambda: operator_snapshot(deps, health)
                        ),
                        "failures_requests": await requests(store, lambda: group_failures(store)),
                        "dry_run_requests": await requests(store, lambda: preview(bulk, request)),
                    }
                )
                print(json.dumps(figures[-1]), flush=True)
        finally:
            await store.close()
    return figures


def report(figures: list[dict[str, float]]) -> None:
    base = figures[0]
    print(f"\nload average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    print("| finished orders | ops data | failures | bulk dry run |")
    print("|---:|---:|---:|---:|")
    for f in figures:
        cells = [
            f"{f[k]:.1f} ms ({f[k] / base[k]:.2f}x)"
            for k in ("ops_ms", "failures_ms", "dry_run_ms")
        ]
        print(f"| {int(f['finished']):,} | " + " | ".join(cells) + " |")
    print("\ntable requests per call (the adapter's counter)")
    print("| finished orders | ops data | failures | bulk dry run |")
    print("|---:|---:|---:|---:|")
    for f in figures:
        keys = ("ops_requests", "failures_requests", "dry_run_requests")
        print(f"| {int(f['finished']):,} | " + " | ".join(f"{f[k]:.0f}" for k in keys) + " |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="0,20000,200000")
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args(argv)
    sizes = sorted(int(s) for s in args.sizes.split(","))
    report(asyncio.run(run(sizes, args.repeats)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
