"""One Supervisor sweep with 1,000 in-flight orders, with 0 and with 100,000 finished ones.

    python -m bench.supervisor_scaling [--in-flight 1000] [--finished 100000] [--quick]

In-process against a fresh Azurite (in-memory persistence) through the real
``TableStateStore``, wrapped in the counting decorator. In-flight orders are stored the
way the Scheduler leaves them (claimed, first step running, on the watch list);
finished orders are written with the real adapter's ``create`` in a terminal state
(Processed, every step completed, the full history), so they are real rows in the same
table. ``shared.usecases.flow.supervisor.sweep`` runs with the Functions defaults (limit
500, 16 concurrent checks) on a clock past every deadline, until nothing is due; an
idle sweep (nothing due) is timed too, and, for contrast, the query a supervisor
without a watch list would need (every state row not yet finished).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from bench._common import RESULTS, console, fmt, print_machine, ratio, table
from bench._instrument import TABLE_KIND, CountingBus, CountingStore, Stats
from devhost.harness.stack import lone_azurite
from shared.adapters.clock import FakeClock
from shared.adapters.memory.store import InMemoryBus
from shared.adapters.table import rows as table_rows
from shared.adapters.table.client import table_service_client
from shared.adapters.table.store import TableStateStore
from shared.catalogue import catalogue_file, load
from shared.domain.machine.forward import apply_reply, claim, start
from shared.domain.machine.transition import ProcessPolicy, Transition
from shared.domain.messages import AgentReply
from shared.domain.model import (
    Action,
    Order,
    OrderLine,
    OrderProcess,
    Outcome,
    Priority,
    ProcessState,
)
from shared.ports import AlreadyExists, StoreUnavailable
from shared.settings import azurite_connection_string
from shared.usecases.flow.deps import ProcessDeps
from shared.usecases.flow.supervisor import sweep

CATALOGUE = load(catalogue_file())
ORDER_FULFILMENT = CATALOGUE.default_workflow()

POLICY = ProcessPolicy(
    step_timeout=timedelta(seconds=30), pending_timeout=timedelta(seconds=60), max_failure_count=3
)
MAX_SWEEPS = 20


def _order(order_id: str, now: datetime) -> Order:
    return Order(
        order_id=order_id,
        customer_id="cust-1",
        items=(OrderLine("SKU-001", 2, 12.5), OrderLine("SKU-017", 1, 40.0)),
        priority=Priority.NORMAL,
        reply_to=None,
        fingerprint=uuid.uuid4().hex,
        created_at=now,
    )


def in_flight(order_id: str, now: datetime) -> Transition:
    """Claimed by the Scheduler, first step dispatched: what a sweep finds in flight."""
    started = start(_order(order_id, now), ORDER_FULFILMENT, now)
    claimed = claim(started.process, ORDER_FULFILMENT, POLICY, "bench", now)
    assert claimed is not None
    return Transition(claimed.process, claimed.outgoing, started.history + claimed.history)


def finished(order_id: str, now: datetime) -> Transition:
    """Walked through every step to Processed, with its full history."""
    t = in_flight(order_id, now)
    history = list(t.history)
    process = t.process
    for step in ORDER_FULFILMENT.steps:
        reply = AgentReply(
            order_id, step.name, Action.DO, process.state.attempt, Outcome.SUCCEEDED, {"id": "x"}
        )
        nxt = apply_reply(process, ORDER_FULFILMENT, POLICY, reply, now)
        assert nxt is not None
        process = nxt.process
        history += nxt.history
    assert process.state.process_state is ProcessState.PROCESSED
    return Transition(process, (), tuple(history))


def renamed(t: Transition, order_id: str) -> Transition:
    process = t.process
    return Transition(
        OrderProcess(
            order=replace(process.order, order_id=order_id),
            state=replace(process.state, order_id=order_id),
            steps=process.steps,
        ),
        t.outgoing,
        t.history,
    )


async def gated(
    items: list[str], work: Any, concurrency: int, label: str, quiet: bool = False
) -> float:
    gate = asyncio.Semaphore(concurrency)
    started = time.monotonic()
    with Progress(
        TextColumn(f"[bold]{label}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=quiet,
    ) as progress:
        task = progress.add_task(label, total=len(items))
        done = 0
        step = max(len(items) // 10, 1)

        async def one(item: str) -> None:
            nonlocal done
            async with gate:
                for attempt in range(6):
                    try:
                        await work(item)
                        break
                    except AlreadyExists:
                        break
                    except StoreUnavailable:
                        # Azurite resets a connection now and then under load; a dead
                        # Azurite fails every attempt and ends the run here.
                        if attempt == 5:
                            raise
                        await asyncio.sleep(0.5 * (attempt + 1))
            progress.advance(task)
            done += 1
            if not console.is_terminal and done % step == 0:
                console.print(
                    f"[dim]{label}: {done:,}/{len(items):,} after "
                    f"{time.monotonic() - started:.0f} s[/]"
                )

        await asyncio.gather(*(one(i) for i in items))
    return time.monotonic() - started


@dataclass
class SweepFigures:
    finished_rows: int
    in_flight: int
    first_sweep_seconds: float
    first_sweep_due: int
    sweeps: int
    all_sweeps_seconds: float
    recovered: int
    ops: dict[str, int]
    ops_first: dict[str, int]
    op_ms: dict[str, float]
    idle_seconds: float
    idle_ops: dict[str, int]
    scan_seconds: float
    scan_rows: int
    table_rows: int
    probe_query_ms: float = 0.0
    probe_point_ms: float = 0.0


def _op_ms(stats: Stats) -> dict[str, float]:
    calls: dict[str, int] = {}
    seconds: dict[str, float] = {}
    for role in stats.roles.values():
        for op, s in role.ops.items():
            calls[op] = calls.get(op, 0) + s.calls
            seconds[op] = seconds.get(op, 0.0) + s.seconds
    return {op: 1000 * seconds[op] / calls[op] for op in sorted(calls) if calls[op]}


def _kinds(stats: Stats) -> dict[str, int]:
    out: dict[str, int] = {}
    for role in stats.roles.values():
        for op, s in role.ops.items():
            key = f"{TABLE_KIND.get(op, op)}s ({op})"
            out[key] = out.get(key, 0) + s.table_ops
    return dict(sorted(out.items()))


async def measure_sweeps(
    store: TableStateStore, ids: list[str], created: datetime, table_rows_now: int
) -> SweepFigures:
    # Idle: nothing is due yet (every deadline is 30 s ahead of `created`).
    idle_stats = Stats()
    idle_deps = ProcessDeps(
        CountingStore(store, idle_stats),
        CountingBus(InMemoryBus(), idle_stats),
        FakeClock(created),
        POLICY,
        "bench-supervisor",
        catalogue=CATALOGUE,
    )
    idle_times = []
    for _ in range(5):
        started = time.perf_counter()
        report = await sweep(idle_deps)
        idle_times.append(time.perf_counter() - started)
        assert report.due == 0, f"{report.due} due in the idle sweep"
    idle_ops = {k: v // 5 for k, v in _kinds(idle_stats).items()}

    # Every in-flight order past its complete-by: sweep until nothing is due.
    stats = Stats()
    deps = ProcessDeps(
        CountingStore(store, stats),
        CountingBus(InMemoryBus(), stats),
        FakeClock(created + timedelta(hours=1)),
        POLICY,
        "bench-supervisor",
        catalogue=CATALOGUE,
    )
    sweeps = 0
    recovered = 0
    total = 0.0
    first_seconds = 0.0
    first_due = 0
    ops_first: dict[str, int] = {}
    while sweeps < MAX_SWEEPS:
        started = time.perf_counter()
        report = await sweep(deps)
        elapsed = time.perf_counter() - started
        if sweeps == 0:
            first_seconds, first_due, ops_first = elapsed, report.due, _kinds(stats)
        if report.due == 0:
            break
        total += elapsed
        recovered += report.recovered
        sweeps += 1
    scan_seconds, scan_rows = await scan_in_flight(store)
    probe_query, probe_point = await probe(store, ids[:20])
    return SweepFigures(
        probe_query_ms=probe_query,
        probe_point_ms=probe_point,
        finished_rows=0,
        in_flight=len(ids),
        first_sweep_seconds=first_seconds,
        first_sweep_due=first_due,
        sweeps=sweeps,
        all_sweeps_seconds=total,
        recovered=recovered,
        ops=_kinds(stats),
        ops_first=ops_first,
        op_ms=_op_ms(stats),
        idle_seconds=sum(idle_times) / len(idle_times),
        idle_ops=idle_ops,
        scan_seconds=scan_seconds,
        scan_rows=scan_rows,
        table_rows=table_rows_now,
    )


async def probe(store: TableStateStore, ids: list[str]) -> tuple[float, float]:
    """Mean ms of one order load (what the app does: a point read of the state entity)
    and of one bare point read of the same row, one at a time: how the emulator scales."""
    table_client = store._table
    started = time.perf_counter()
    for order_id in ids:
        await store.load(order_id)
    query_ms = 1000 * (time.perf_counter() - started) / max(len(ids), 1)
    started = time.perf_counter()
    for order_id in ids:
        await table_client.get_entity(order_id, table_rows.STATE_ROW)
    point_ms = 1000 * (time.perf_counter() - started) / max(len(ids), 1)
    return query_ms, point_ms


async def scan_in_flight(store: TableStateStore) -> tuple[float, int]:
    """What a supervisor without a watch list would do: find unfinished state rows."""
    table_client = store._table  # the same client, a query the app never makes
    query = "RowKey eq @row and ProcessState ne @done and ProcessState ne @error"
    parameters = {"row": table_rows.STATE_ROW, "done": "Processed", "error": "Error"}
    started = time.perf_counter()
    rows = 0
    async for _ in table_client.query_entities(
        query, parameters=parameters, select=["PartitionKey"]
    ):
        rows += 1
    return time.perf_counter() - started, rows


async def finalize(store: TableStateStore, order_id: str) -> None:
    """An in-flight order of the first measurement becomes a finished one."""
    for _ in range(5):
        process = await store.load(order_id)
        assert process is not None
        done = replace(
            process,
            state=replace(process.state, process_state=ProcessState.PROCESSED, locked_by=None),
        )
        try:
            await store.save(done, ())
            break
        except Exception:  # a lost race with nothing else running: retry
            continue
    await store.unwatch(order_id)


async def run(args: argparse.Namespace) -> list[SweepFigures]:
    figures: list[SweepFigures] = []
    rows_per_finished = 0
    with lone_azurite("bench-supervisor-") as port:
        service = table_service_client(connection_string=azurite_connection_string(port))
        store = TableStateStore(service, f"sup{uuid.uuid4().hex[:10]}")
        await store.ensure_table()
        try:
            template_flight = in_flight("template", datetime.now(UTC))
            template_done = finished("template", datetime.now(UTC))
            # One state entity (order, state and steps) and the history rows per order.
            rows_per_finished = 1 + len(template_done.history)
            rows_per_flight = 1 + len(template_flight.history)

            async def add_in_flight(order_id: str, now: datetime) -> None:
                t = in_flight(order_id, now)
                assert t.process.state.complete_by is not None
                await store.watch(order_id, t.process.state.complete_by, replace=True)
                await store.create(t.process, t.history)

            tag = uuid.uuid4().hex[:4]
            batch_a = [f"fa-{tag}-{i:05d}" for i in range(args.in_flight)]
            created_a = datetime.now(UTC)
            await gated(batch_a, lambda o: add_in_flight(o, created_a), 32, "in-flight orders (A)")
            a = await measure_sweeps(store, batch_a, created_a, len(batch_a) * rows_per_flight)
            figures.append(a)
            console.print(sweep_line(a))

            await gated(batch_a, lambda o: finalize(store, o), 32, "A becomes finished")
            extra = max(args.finished - len(batch_a), 0)
            finished_ids = [f"done-{tag}-{i:06d}" for i in range(extra)]

            async def add_finished(order_id: str) -> None:
                t = renamed(template_done, order_id)
                await store.create(t.process, t.history)

            seconds = await gated(
                finished_ids, add_finished, args.write_concurrency, "finished orders"
            )
            if finished_ids:
                console.print(
                    f"[dim]wrote {len(finished_ids):,} finished orders "
                    f"({len(finished_ids) * rows_per_finished:,} rows, one entity-group "
                    f"transaction each) in {seconds:.0f} s: "
                    f"{len(finished_ids) / seconds:,.0f} transactions/s, "
                    f"{len(finished_ids) * rows_per_finished / seconds:,.0f} entities/s "
                    "into Azurite[/]"
                )
            batch_b = [f"fb-{tag}-{i:05d}" for i in range(args.in_flight)]
            created_b = datetime.now(UTC)
            await gated(batch_b, lambda o: add_in_flight(o, created_b), 32, "in-flight orders (B)")
            total_finished = len(batch_a) + len(finished_ids)
            rows_now = total_finished * rows_per_finished + len(batch_b) * rows_per_flight
            b = await measure_sweeps(store, batch_b, created_b, rows_now)
            b.finished_rows = total_finished
            figures.append(b)
            console.print(sweep_line(b))
        finally:
            await store.close()
    return figures


def sweep_line(f: SweepFigures) -> str:
    return (
        f"[dim]{f.finished_rows:,} finished: first sweep {f.first_sweep_seconds * 1000:.0f} ms "
        f"for {f.first_sweep_due} due, {f.sweeps} sweeps to recover {f.recovered}[/]"
    )


def report(figures: list[SweepFigures]) -> None:
    a, b = figures
    t = table(
        f"one Supervisor sweep, {a.in_flight:,} in-flight orders",
        ["", f"{a.finished_rows:,} finished", f"{b.finished_rows:,} finished", "ratio"],
    )
    t.add_row("rows in the table (about)", f"{a.table_rows:,}", f"{b.table_rows:,}", "")
    t.add_row(
        f"first sweep (limit 500): seconds for {a.first_sweep_due} / {b.first_sweep_due} due",
        fmt(a.first_sweep_seconds, 3),
        fmt(b.first_sweep_seconds, 3),
        ratio(b.first_sweep_seconds, a.first_sweep_seconds),
    )
    t.add_row(
        "sweeps until nothing is due / orders recovered",
        f"{a.sweeps} / {a.recovered}",
        f"{b.sweeps} / {b.recovered}",
        "",
    )
    t.add_row(
        "all those sweeps: seconds",
        fmt(a.all_sweeps_seconds, 3),
        fmt(b.all_sweeps_seconds, 3),
        ratio(b.all_sweeps_seconds, a.all_sweeps_seconds),
    )
    for key in sorted(set(a.ops) | set(b.ops)):
        t.add_row(
            f"  state-store {key.replace('querys', 'queries')}",
            str(a.ops.get(key, 0)),
            str(b.ops.get(key, 0)),
            ratio(b.ops.get(key, 0), a.ops.get(key, 0)),
        )
    for op in sorted(set(a.op_ms) | set(b.op_ms)):
        t.add_row(
            f"  mean ms per {op} call (concurrency 16)",
            fmt(a.op_ms.get(op, float("nan")), 1),
            fmt(b.op_ms.get(op, float("nan")), 1),
            ratio(b.op_ms.get(op, float("nan")), a.op_ms.get(op, float("nan"))),
        )
    t.add_row(
        "idle sweep (nothing due): seconds",
        fmt(a.idle_seconds, 4),
        fmt(b.idle_seconds, 4),
        ratio(b.idle_seconds, a.idle_seconds),
    )
    t.add_row(
        "  idle sweep ops",
        ", ".join(f"{k} {v}" for k, v in a.idle_ops.items()),
        ", ".join(f"{k} {v}" for k, v in b.idle_ops.items()),
        "",
    )
    t.add_row(
        "probe: one order load (point read of the state entity), ms",
        fmt(a.probe_query_ms, 1),
        fmt(b.probe_query_ms, 1),
        ratio(b.probe_query_ms, a.probe_query_ms),
    )
    t.add_row(
        "probe: one point read of the state row, ms",
        fmt(a.probe_point_ms, 1),
        fmt(b.probe_point_ms, 1),
        ratio(b.probe_point_ms, a.probe_point_ms),
    )
    t.add_row(
        "contrast, no watch list: query for unfinished state rows (s)",
        f"{fmt(a.scan_seconds, 3)} ({a.scan_rows} rows)",
        f"{fmt(b.scan_seconds, 3)} ({b.scan_rows} rows)",
        ratio(b.scan_seconds, a.scan_seconds),
    )
    console.print(t)
    console.print(
        "[dim]The sweep reads the watch list (16 partition-scoped queries on CheckAt) and then "
        "each due order's own partition; finished orders are off the watch list, so neither "
        "the number of reads nor, on real Table Storage, their cost grows with history. "
        "Azurite evaluates every query as a scan of the whole table (LokiJS "
        "chain().where(predicate) in LokiTableMetadataStore.queryTableEntities), so on the "
        "emulator each load and each watch-shard query gets slower as the table grows, while "
        "a point read (PartitionKey + RowKey) stays flat: see the probe rows.[/]"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.supervisor_scaling", description=__doc__)
    parser.add_argument("--in-flight", type=int, default=1000)
    parser.add_argument("--finished", type=int, default=100_000)
    parser.add_argument("--write-concurrency", type=int, default=64)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        args.in_flight = min(args.in_flight, 100)
        args.finished = min(args.finished, 1000)
    print_machine("supervisor scaling: one sweep vs history")
    figures = asyncio.run(run(args))
    report(figures)
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"supervisor_scaling-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps([asdict(f) for f in figures], indent=2))
    console.print(f"[dim]saved {path}[/]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
