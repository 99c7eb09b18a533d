"""RSS of the local runtime under mixed traffic for a long spell: does memory creep?

    python -m bench.soak [--minutes 30] [--seed-orders 3000] [--order-rate 2]
                         [--read-rate 1] [--sample-seconds 10] [--warmup-minutes 3]
                         [--tracemalloc] [--trim-probe] [--runtime-env NAME=VALUE]
                         [--quick]

Starts the local stack (Azurite, broker, simulator, OTLP receiver, one runtime as its
own process, every trace kept as locally), writes ``--seed-orders`` finished orders with
the table adapter so that the operator's reads are large (a page of 1,000 orders, a
count capped at 1,000), then for ``--minutes`` runs two loops side by side: orders
submitted open-loop at ``--order-rate`` per second (each goes through the agents at the
simulator, 2% transient faults, so retries happen too), and operator reads at
``--read-rate`` per second taking turns among ``/api/ops/data?countCap=1000``,
``/api/orders?state=Processed&pageSize=1000``, ``/api/orders?state=Error&pageSize=1000``
and ``/api/failures``. The runtime's RSS is sampled every ``--sample-seconds``.

Memory that grows for a while and then stays is caches filling and the allocator's
arenas reaching their working size; memory that keeps growing is a leak. So the figure
judged is the drift after the warm-up: the median of the last five samples against the
median of the first five after ``--warmup-minutes``, within 5% or not. The first, last
and largest samples are printed too. ``--tracemalloc`` runs the runtime under
tracemalloc (``bench.traced_runtime``), takes a snapshot after the warm-up and at the end
and prints the lines whose allocations grew most between them; its RSS figures include
tracemalloc's own memory, so judge creep without it. ``--trim-probe`` asks the runtime's
glibc at the end to give back the free memory it holds (``malloc_trim(0)``) and prints
RSS before and after: memory given back was free in the allocator, not a leak of
objects. ``--runtime-env MALLOC_ARENA_MAX=2`` and the like try allocator settings.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import random
import signal
import statistics
import tempfile
import time
import tracemalloc
import uuid
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import psutil

from bench._common import console, fmt, print_machine, table
from bench._stack import BenchStack
from bench.supervisor_scaling import finished, renamed
from bench.traced_runtime import PYMALLOC, SNAPSHOT, TRIMMED
from devhost.harness.load import order_body
from shared.adapters.table.client import table_service_client
from shared.adapters.table.store import TableStateStore
from shared.contract import Route

TRACED_RUNTIME = "bench.traced_runtime"
READS = (
    f"{Route.OPS_DATA}?countCap=1000",
    f"{Route.ORDERS}?state=Processed&pageSize=1000",
    f"{Route.ORDERS}?state=Error&pageSize=1000",
    Route.FAILURES,
)
FLAT_WITHIN = 0.05
EDGE_SAMPLES = 5
"""Samples whose median stands for the start and for the end of the measured spell."""


@dataclass
class Sample:
    seconds: float
    rss_mb: float
    orders: int
    reads: int


@dataclass
class SoakResult:
    minutes: float
    warmup_minutes: float
    seed_orders: int
    order_rate: float
    read_rate: float
    tracemalloc: bool
    trim_probe: bool
    runtime_env: dict[str, str]
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float] = (0.0, 0.0, 0.0)
    samples: list[Sample] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    read_statuses: dict[str, int] = field(default_factory=dict)
    grown: list[tuple[str, float, int]] = field(default_factory=list)
    trimmed: tuple[float, float] | None = None
    """RSS in MB before and after malloc_trim(0) at the end (`--trim-probe`)."""
    pymalloc: dict[str, float] = field(default_factory=dict)
    """MB in pymalloc's arenas and in the blocks used in them, at the trim."""

    def after_warmup(self) -> list[Sample]:
        return [s for s in self.samples if s.seconds >= 60 * self.warmup_minutes]

    def drift(self) -> tuple[float, float, float]:
        """(start MB, end MB, end/start - 1) over the samples after the warm-up."""
        kept = self.after_warmup()
        if len(kept) < 2:
            return (float("nan"), float("nan"), float("nan"))
        edge = min(EDGE_SAMPLES, len(kept) // 2)
        start = statistics.median(s.rss_mb for s in kept[:edge])
        end = statistics.median(s.rss_mb for s in kept[-edge:])
        return start, end, end / start - 1


async def seed(stack: BenchStack, count: int) -> float:
    """`count` orders walked to Processed, written as the runtime would have written them;
    seconds taken."""
    if count <= 0:
        return 0.0
    service = table_service_client(connection_string=stack.storage_connection_string)
    store = TableStateStore(service, stack.table_name)
    template = finished("template", datetime.now(UTC))
    tag = uuid.uuid4().hex[:4]
    gate = asyncio.Semaphore(16)
    started = time.monotonic()

    async def one(i: int) -> None:
        async with gate:
            t = renamed(template, f"seed-{tag}-{i:06d}")
            await store.create(t.process, t.history)

    try:
        await asyncio.gather(*(one(i) for i in range(count)))
    finally:
        await store.close()
    return time.monotonic() - started


async def submit_loop(
    session: aiohttp.ClientSession,
    api: str,
    rate: float,
    stop: asyncio.Event,
    counts: dict[str, int],
) -> None:
    """Open loop: one order every 1/rate s, whatever the answers take."""
    rng = random.Random(11)
    run = uuid.uuid4().hex[:6]
    pending: set[asyncio.Task[None]] = set()

    async def post(order_id: str) -> None:
        try:
            async with session.post(f"{api}/{Route.ORDERS}", json=order_body(order_id, rng)) as r:
                await r.read()
                key = "orders" if r.status == 202 else f"order answered {r.status}"
        except (aiohttp.ClientError, TimeoutError) as exc:
            key = f"order {type(exc).__name__}"
        counts[key] = counts.get(key, 0) + 1

    for i in itertools.count():
        if stop.is_set():
            break
        task = asyncio.create_task(post(f"soak-{run}-{i:07d}"))
        pending.add(task)
        task.add_done_callback(pending.discard)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1 / rate)
    await asyncio.gather(*pending, return_exceptions=True)


async def read_loop(
    session: aiohttp.ClientSession,
    api: str,
    rate: float,
    stop: asyncio.Event,
    counts: dict[str, int],
    statuses: dict[str, int],
) -> None:
    """The operator's large reads in turn, one at a time, every 1/rate s at most."""
    for path in itertools.cycle(READS):
        if stop.is_set():
            break
        begun = time.monotonic()
        try:
            async with session.get(f"{api}/{path}") as r:
                await r.read()
                statuses[f"{path.split('?')[0]} {r.status}"] = (
                    statuses.get(f"{path.split('?')[0]} {r.status}", 0) + 1
                )
                counts["reads"] = counts.get("reads", 0) + 1
        except (aiohttp.ClientError, TimeoutError) as exc:
            key = f"read {type(exc).__name__}"
            counts[key] = counts.get(key, 0) + 1
        left = 1 / rate - (time.monotonic() - begun)
        if left > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), left)


async def snapshot(stack: BenchStack, folder: Path, n: int) -> Path:
    """Ask the traced runtime for its `n`-th snapshot and wait until it is written."""
    pid = stack.pids()["runtime"]
    path = folder / SNAPSHOT.format(n=n)
    os.kill(pid, signal.SIGUSR2)
    for _ in range(1200):
        if path.exists():
            return path
        await asyncio.sleep(0.1)
    raise RuntimeError(f"the runtime wrote no {path}")


async def trim(stack: BenchStack, path: Path) -> tuple[float, float]:
    """RSS in MB before and after the runtime's malloc_trim(0)."""
    os.kill(stack.pids()["runtime"], signal.SIGUSR1)
    for _ in range(600):
        if (written := _written(path)) is not None:
            before, after = written.split()[:2]
            return float(before), float(after)
        await asyncio.sleep(0.1)
    raise RuntimeError(f"the runtime wrote no {path}")


def pymalloc_figures(path: Path) -> dict[str, float]:
    """From `sys._debugmallocstats()`: MB of arenas held and of blocks in use in them."""
    found: dict[str, float] = {}
    for line in path.read_text().splitlines():
        name, _, value = line.partition("=")
        number = value.strip().replace(",", "")
        if not number.isdigit():
            continue
        if "bytes/arena" in name:
            found["arenas MB"] = int(number) / 2**20
        elif name.strip() == "# bytes in allocated blocks":
            found["blocks in use MB"] = int(number) / 2**20
    return found


def _written(path: Path) -> str | None:
    text = path.read_text() if path.exists() else ""
    return text if text.endswith("\n") else None


def grown(first: Path, last: Path, top: int = 15) -> list[tuple[str, float, int]]:
    """The allocation sites that grew most between two snapshots: (where, KiB, blocks)."""
    before = tracemalloc.Snapshot.load(str(first))
    after = tracemalloc.Snapshot.load(str(last))
    ignore = [tracemalloc.Filter(False, tracemalloc.__file__)]
    stats = after.filter_traces(ignore).compare_to(before.filter_traces(ignore), "traceback")
    out = []
    total = sum(s.size for s in after.statistics("filename")) / 2**20
    before_total = sum(s.size for s in before.statistics("filename")) / 2**20
    out = [(f"all traced memory ({before_total:.1f} MB before)", (total - before_total) * 1024, 0)]
    for stat in stats[:top]:
        frames = [f"{f.filename.split('site-packages/')[-1]}:{f.lineno}" for f in stat.traceback]
        out.append((" < ".join(frames[-4:][::-1]), stat.size_diff / 1024, stat.count_diff))
    return out


async def soak(args: argparse.Namespace, load_before: tuple[float, float, float]) -> SoakResult:
    result = SoakResult(
        minutes=args.minutes,
        warmup_minutes=args.warmup_minutes,
        seed_orders=args.seed_orders,
        order_rate=args.order_rate,
        read_rate=args.read_rate,
        tracemalloc=args.tracemalloc,
        trim_probe=args.trim_probe,
        runtime_env=dict(e.split("=", 1) for e in args.runtime_env),
        load_before=load_before,
    )
    kwargs: dict[str, Any] = {"runtime_env": result.runtime_env}
    snapshots = Path()
    if args.tracemalloc or args.trim_probe:
        kwargs["runtime_module"] = TRACED_RUNTIME
        snapshots = Path(tempfile.mkdtemp(prefix=f"soak-{time.strftime('%Y%m%d-%H%M%S')}-"))
        frames = args.frames if args.tracemalloc else 0
        kwargs["runtime_extra"] = ("--snapshot-dir", str(snapshots), "--frames", str(frames))
    # One results directory per run, also for runs started in the same second.
    mode = "-traced" if args.tracemalloc else "-probe" if args.trim_probe else ""
    async with BenchStack(f"soak{mode}-{os.getpid()}", **kwargs) as stack:
        console.print(f"[dim]{stack.describe()}[/]")
        seconds = await seed(stack, args.seed_orders)
        console.print(f"[dim]seeded {args.seed_orders:,} finished orders in {seconds:.0f} s[/]")
        async with aiohttp.ClientSession() as session:
            await stack.simulator(session).set_faults("payment", transientErrorRate=0.02)
        runtime = psutil.Process(stack.pids()["runtime"])
        stop = asyncio.Event()
        counts: dict[str, int] = {}
        api = stack.api()
        connector = aiohttp.TCPConnector(limit=32)
        async with aiohttp.ClientSession(connector=connector) as session:
            loops = [
                asyncio.create_task(submit_loop(session, api, args.order_rate, stop, counts)),
                asyncio.create_task(
                    read_loop(session, api, args.read_rate, stop, counts, result.read_statuses)
                ),
            ]
            started = time.monotonic()
            end = started + 60 * args.minutes
            first_snapshot: Path | None = None
            try:
                while (now := time.monotonic()) < end:
                    sample = Sample(
                        now - started,
                        runtime.memory_info().rss / 2**20,
                        counts.get("orders", 0),
                        counts.get("reads", 0),
                    )
                    result.samples.append(sample)
                    console.print(
                        f"[dim]{sample.seconds / 60:5.1f} min  RSS {sample.rss_mb:6.1f} MB  "
                        f"orders {sample.orders:,}  reads {sample.reads:,}[/]"
                    )
                    if (
                        args.tracemalloc
                        and first_snapshot is None
                        and sample.seconds >= 60 * args.warmup_minutes
                    ):
                        first_snapshot = await snapshot(stack, snapshots, 1)
                    await asyncio.sleep(min(args.sample_seconds, max(end - now, 0.01)))
                result.samples.append(
                    Sample(
                        time.monotonic() - started,
                        runtime.memory_info().rss / 2**20,
                        counts.get("orders", 0),
                        counts.get("reads", 0),
                    )
                )
            finally:
                stop.set()
                await asyncio.gather(*loops, return_exceptions=True)
        if first_snapshot is not None:
            result.grown = grown(first_snapshot, await snapshot(stack, snapshots, 2))
        if args.trim_probe:
            result.trimmed = await trim(stack, snapshots / TRIMMED)
            result.pymalloc = pymalloc_figures(snapshots / PYMALLOC)
        result.errors = {k: v for k, v in counts.items() if k not in ("orders", "reads")}
        load = os.getloadavg()
        result.load_after = (load[0], load[1], load[2])
        stack.run_dir.mkdir(parents=True, exist_ok=True)
        (stack.run_dir / "soak.json").write_text(json.dumps(asdict(result), indent=2))
        console.print(f"[dim]saved {stack.run_dir / 'soak.json'}[/]")
    return result


def report(result: SoakResult) -> bool:
    """Print the figures; True when RSS stayed within 5% after the warm-up."""
    samples = result.samples
    t = table(f"runtime RSS over {result.minutes:g} min of mixed traffic", ["", "MB", "at min"])
    first, last = samples[0], samples[-1]
    peak = max(samples, key=lambda s: s.rss_mb)
    for label, s in (("first", first), ("last", last), ("largest", peak)):
        t.add_row(label, fmt(s.rss_mb), fmt(s.seconds / 60))
    start, end, drift = result.drift()
    t.add_row(f"median of {EDGE_SAMPLES} after {result.warmup_minutes:g} min warm-up", fmt(start))
    t.add_row(f"median of the last {EDGE_SAMPLES}", fmt(end))
    console.print(t)
    flat = abs(drift) <= FLAT_WITHIN
    console.print(
        f"drift after the warm-up: {100 * drift:+.1f}% "
        f"({'within' if flat else 'NOT within'} {100 * FLAT_WITHIN:.0f}%); "
        f"{last.orders:,} orders submitted ({result.order_rate:g}/s), "
        f"{last.reads:,} operator reads ({result.read_rate:g}/s) "
        f"on {result.seed_orders:,} seeded finished orders"
        + (f"; runtime env {result.runtime_env}" if result.runtime_env else "")
    )
    console.print(f"read answers: {result.read_statuses}")
    if result.errors:
        console.print(f"[yellow]errors: {result.errors}[/]")
    l1, l5, l15 = result.load_after
    console.print(f"load average after the run: {l1:.2f} / {l5:.2f} / {l15:.2f}")
    if result.trimmed:
        before, after = result.trimmed
        console.print(
            f"malloc_trim(0) at the end: RSS {before:.1f} -> {after:.1f} MB "
            f"({before - after:.1f} MB was free memory the allocator held)"
        )
    if result.pymalloc:
        console.print(
            "pymalloc at the end: "
            + ", ".join(f"{k} {v:.1f}" for k, v in result.pymalloc.items())
            + " (an arena goes back to the OS only when all its blocks are free)"
        )
    if result.grown:
        g = table("tracemalloc: grew most after the warm-up", ["where", "KiB", "blocks"])
        for where, kib, blocks in result.grown:
            g.add_row(where, fmt(kib), f"{blocks:+,}")
        console.print(g)
    return flat


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--warmup-minutes", type=float, default=3.0)
    parser.add_argument("--seed-orders", type=int, default=3000)
    parser.add_argument("--order-rate", type=float, default=2.0, help="orders/s, open loop")
    parser.add_argument("--read-rate", type=float, default=1.0, help="operator reads/s at most")
    parser.add_argument("--sample-seconds", type=float, default=10.0)
    parser.add_argument("--tracemalloc", action="store_true", help="trace and diff allocations")
    parser.add_argument(
        "--trim-probe", action="store_true", help="malloc_trim(0) in the runtime at the end"
    )
    parser.add_argument(
        "--runtime-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="in the runtime's environment, e.g. MALLOC_ARENA_MAX=2 (repeatable)",
    )
    parser.add_argument("--frames", type=int, default=1, help="tracemalloc frames kept")
    parser.add_argument("--quick", action="store_true", help="3 minutes, 1 of warm-up")
    args = parser.parse_args(argv)
    if args.quick:
        args.minutes, args.warmup_minutes, args.sample_seconds = 3.0, 1.0, 5.0
        args.seed_orders = min(args.seed_orders, 1000)
    machine = print_machine("runtime RSS under a long spell of mixed traffic")
    result = asyncio.run(soak(args, machine.load_before))
    return 0 if report(result) else 1


if __name__ == "__main__":
    raise SystemExit(main())
