"""High-priority lanes: does a high-priority order stay fast while normal orders queue?

A backlog of ``--normal`` orders is POSTed as fast as the intake takes them while every
remote call takes ``--latency-ms`` (so the agents, not the runtime, are the bottleneck);
once the backlog is in, a trickle of ``--high`` orders with ``"priority": "high"`` follows,
one every ``--interval`` seconds, while the backlog drains. The same load runs twice on
one stack (each on a fresh table): with the lanes, and with the trickle sent as normal
orders (``no-lanes``), so the effect of the lanes shows as a ratio. Printed per class:
count, intake-to-Processed latency p50/p95/p99 (server clock), the ratio trickle p50 /
backlog p50, and how long the backlog took to drain; also the deepest backlog seen per
queue and the messages sent on the high-priority agent queues.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp

from bench._common import (
    RESULTS,
    CpuMeter,
    LatencySummary,
    Machine,
    console,
    cpu_table,
    divide,
    fmt,
    print_machine,
    ratio,
    table,
)
from bench._stack import BenchStack, Timings, set_latency
from bench.throughput import hop_breakdown, hops_table, progress_bar
from devhost.harness.clients import BrokerControl, ControlError
from devhost.harness.load import (
    DONE,
    Load,
    LoadRun,
    StatusQueue,
    Tracked,
    plan,
    run_load,
)
from shared.catalogue import catalogue_file, load
from shared.contract import Queue, Setting, agent_queue

MODES = ("lanes", "no-lanes")
WARMUP_LATENCY_MS = 20
WATCHED_QUEUES = (
    Queue.SCHEDULER,
    Queue.AGENT_REPLIES,
    *(agent_queue(name, high) for name in load(catalogue_file()).agents for high in (False, True)),
)


@dataclass
class ClassSummary:
    """One class of orders in one run: the backlog or the trickle."""

    name: str
    sent_as: str
    orders: int
    processed: int
    unfinished: int
    server: LatencySummary
    client: LatencySummary

    @classmethod
    def of(cls, name: str, sent_as: str, orders: list[Tracked]) -> ClassSummary:
        done = [o for o in orders if o.state == "Processed"]
        return cls(
            name=name,
            sent_as=sent_as,
            orders=len(orders),
            processed=len(done),
            unfinished=sum(1 for o in orders if o.state not in DONE),
            server=LatencySummary.of([v for o in done if (v := o.server_latency) is not None]),
            client=LatencySummary.of([v for o in done if (v := o.client_latency) is not None]),
        )


@dataclass
class PriorityRun:
    mode: str
    backlog: ClassSummary
    trickle: ClassSummary
    submit_seconds: float
    """First to last backlog POST accepted."""
    drain_seconds: float
    """Server clock: first backlog order's intake to the last one's Processed."""
    trickle_window: tuple[float, float]
    """Seconds after the first backlog intake when the first and last trickle order was
    taken in (server clock)."""
    high_lane_messages: dict[str, int] = field(default_factory=dict)
    peak_active: dict[str, int] = field(default_factory=dict)
    hops: dict[str, dict[str, Any]] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)
    cpu_wall: float = 0.0
    machine_busy: float = 0.0

    @property
    def p50_ratio(self) -> float:
        return divide(self.trickle.server.p50, self.backlog.server.p50)


async def _queue_counters(broker: BrokerControl) -> dict[str, Any]:
    return await broker.stats()


async def _watch_depths(broker: BrokerControl, peak: dict[str, int], stop: asyncio.Event) -> None:
    """The deepest backlog (ready messages) seen per queue, sampled twice a second."""
    while not stop.is_set():
        with contextlib.suppress(aiohttp.ClientError, TimeoutError, OSError, ControlError):
            stats = await _queue_counters(broker)
            for queue in WATCHED_QUEUES:
                active = int(stats.get(queue, {}).get("active", 0))
                peak[queue] = max(peak.get(queue, 0), active)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.5)


@dataclass
class Classes:
    """The two classes of a run: the backlog, and the trickle sent as `sent_as`."""

    backlog: list[Tracked]
    trickle: list[Tracked]
    sent_as: str

    @classmethod
    def plan(cls, args: argparse.Namespace, mode: str) -> Classes:
        tag = uuid.uuid4().hex[:6]
        ids = [f"prio-{tag}-n{i:04d}" for i in range(args.normal)]
        ids += [f"prio-{tag}-h{i:03d}" for i in range(args.high)]
        orders = plan(ids, args.seed)
        sent_as = "high" if mode == "lanes" else "normal"
        trickle = orders[args.normal :]
        for order in trickle:
            order.body["priority"] = sent_as
        return cls(orders[: args.normal], trickle, sent_as)


async def _submit_classes(run: LoadRun, args: argparse.Namespace, classes: Classes) -> float:
    """The backlog at once, then the trickle paced; returns the backlog's submit seconds."""
    # The backlog's client and the trickle's client are separate applications:
    # separate connection pools, so the trickle's POSTs do not queue behind 600.
    async with (
        aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=args.submit_concurrency),
            timeout=aiohttp.ClientTimeout(total=60),
        ) as bulk,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as urgent,
    ):
        await run.submit(bulk, classes.backlog)
        submit_seconds = run.submit_seconds
        await asyncio.sleep(args.delay)
        paced = Load(rate=1 / args.interval) if args.interval else Load()
        await run.submit(urgent, classes.trickle, load=paced)
    return submit_seconds


async def _load_classes(
    stack: BenchStack,
    broker: BrokerControl,
    args: argparse.Namespace,
    classes: Classes,
    run: LoadRun,
) -> tuple[float, dict[str, int], CpuMeter]:
    """Submit and follow both classes while watching queue depths and CPU."""
    peak: dict[str, int] = {}
    stop = asyncio.Event()
    depths = asyncio.create_task(_watch_depths(broker, peak, stop))
    meter = CpuMeter({**stack.pids(), "driver (this process)": os.getpid()})
    meter.start()
    submit_seconds = math.nan
    try:
        async with run.following(StatusQueue(stack.service_bus_connection_string)):
            submit_seconds = await _submit_classes(run, args, classes)
            await run.wait()
    finally:
        meter.stop()
        stop.set()
        try:
            await asyncio.wait_for(depths, 10)
        except (TimeoutError, asyncio.CancelledError):
            depths.cancel()
    return submit_seconds, peak, meter


def _drain(classes: Classes) -> tuple[float, tuple[float, float]]:
    """Backlog drain seconds and the trickle's intake window, on the server clock."""
    intake = [o.created_at for o in classes.backlog if o.created_at is not None]
    ends = [o.finished_at for o in classes.backlog if o.finished_at is not None]
    first = min(intake) if intake else None
    drain = (max(ends) - first).total_seconds() if first and ends else math.nan
    trickle_in = [o.created_at for o in classes.trickle if o.created_at is not None]
    window = (
        ((min(trickle_in) - first).total_seconds(), (max(trickle_in) - first).total_seconds())
        if first and trickle_in
        else (math.nan, math.nan)
    )
    return drain, window


async def drive(
    stack: BenchStack, args: argparse.Namespace, mode: str, session: aiohttp.ClientSession
) -> PriorityRun:
    """The backlog, then the trickle while it drains; waits until every order finished."""
    classes = Classes.plan(args, mode)
    broker = stack.broker(session)
    with progress_bar() as progress:
        task = progress.add_task(mode, total=len(classes.backlog) + len(classes.trickle))
        run = LoadRun(
            [*classes.backlog, *classes.trickle],
            Load(),
            [("runtime", stack.api())],
            timeout=args.timeout,
        )
        run.on_finished = lambda _: progress.update(task, completed=run.finished)
        before = await _queue_counters(broker)
        submit_seconds, peak, meter = await _load_classes(stack, broker, args, classes, run)
    after = await _queue_counters(broker)
    sent = {
        q: int(after.get(q, {}).get("sent", 0)) - int(before.get(q, {}).get("sent", 0))
        for q in (agent_queue(name, high=True) for name in load(catalogue_file()).agents)
    }
    drain, window = _drain(classes)
    trickle_name = "high-priority trickle" if mode == "lanes" else "trickle, sent as normal"
    result = PriorityRun(
        mode=mode,
        backlog=ClassSummary.of("normal backlog", "normal", classes.backlog),
        trickle=ClassSummary.of(trickle_name, classes.sent_as, classes.trickle),
        submit_seconds=submit_seconds,
        drain_seconds=drain,
        trickle_window=window,
        high_lane_messages=sent,
        peak_active=peak,
        cpu=dict(meter.used),
        cpu_wall=meter.wall,
        machine_busy=meter.machine_busy,
    )
    sample = classes.backlog[:: max(1, len(classes.backlog) // 40)]
    for name, orders in (("backlog", sample), ("trickle", classes.trickle)):
        hops = await hop_breakdown(stack.app(session), [o.order_id for o in orders])
        result.hops[name] = {hop: asdict(h) for hop, h in hops.items()}
        console.print(hops_table(f"latency by hop, {mode}: {name} (sample)", hops))
    console.print(cpu_table(meter, f"CPU during the {mode} run"))
    return result


async def warm_high_lanes(
    stack: BenchStack, session: aiohttp.ClientSession, count: int, seed: int
) -> None:
    """A few high-priority orders through, so the run does not pay for opening the
    high lanes' sender links (the first send to a queue opens one, under a lock)."""
    orders = plan([f"warm-high-{uuid.uuid4().hex[:6]}-{i}" for i in range(count)], seed)
    for order in orders:
        order.body["priority"] = "high"
    await LoadRun(orders, Load(), [("runtime", stack.api())]).submit(session)
    app = stack.app(session)
    pending = {o.order_id for o in orders}
    end = time.monotonic() + 60
    while pending and time.monotonic() < end:
        await asyncio.sleep(0.2)
        for order_id in list(pending):
            view = await app.order(order_id)
            if view.get("processState") in DONE:
                pending.discard(order_id)
    if pending:
        console.print(f"[yellow]{len(pending)} high-priority warm-up orders did not finish[/]")


async def measure(args: argparse.Namespace) -> list[PriorityRun]:
    timings = Timings(
        step_timeout=args.step_timeout,
        pending_timeout=args.step_timeout,
        supervisor_period=5,
    )
    extra = {Setting.HIGH_PRIORITY_STEP_TIMEOUT_SECONDS: str(args.high_step_timeout)}
    runs: list[PriorityRun] = []
    async with BenchStack("priority", timings, seed=args.seed, settings=extra) as stack:
        console.print(f"[dim]{stack.describe()}[/]")
        async with aiohttp.ClientSession() as session:
            simulator = stack.simulator(session)
            for i, mode in enumerate(args.modes):
                if i:
                    await stack.fresh_table()
                if args.warmup:
                    # Quick calls for the warm-up; normal and high lanes (in both modes, so
                    # the runs differ only in how the trickle is sent) at the same time.
                    await set_latency(simulator, WARMUP_LATENCY_MS, 0)
                    await asyncio.gather(
                        run_load(
                            stack.api(),
                            [f"warm-{uuid.uuid4().hex[:6]}-{j:03d}" for j in range(args.warmup)],
                            Load(concurrency=min(args.warmup, 16)),
                            StatusQueue(stack.service_bus_connection_string),
                            timeout=120,
                        ),
                        warm_high_lanes(stack, session, min(args.warmup, 4), args.seed),
                    )
                await set_latency(simulator, args.latency_ms, args.jitter_ms)
                runs.append(await drive(stack, args, mode, session))
    return runs


def results_table(runs: list[PriorityRun]) -> Any:
    t = table(
        "intake -> Processed per class (server clock, ms)",
        [
            "run",
            "class",
            "sent as",
            "orders",
            "Processed",
            "unfinished",
            "p50 ms",
            "p95 ms",
            "p99 ms",
            "max ms",
            "client p50 ms",
        ],
        right_from=3,
    )
    for r in runs:
        for c in (r.backlog, r.trickle):
            t.add_row(
                r.mode,
                c.name,
                c.sent_as,
                str(c.orders),
                str(c.processed),
                str(c.unfinished),
                *c.server.cells(),
                fmt(c.client.p50 * 1000, 0),
            )
    return t


def summary_table(runs: list[PriorityRun]) -> Any:
    t = table(
        "per run",
        [
            "run",
            "trickle p50 / backlog p50",
            "backlog submitted in s",
            "backlog drained in s",
            "backlog orders/s",
            "trickle taken in at s",
            "messages on -high queues",
        ],
    )
    for r in runs:
        t.add_row(
            r.mode,
            ratio(r.trickle.server.p50, r.backlog.server.p50),
            fmt(r.submit_seconds, 1),
            fmt(r.drain_seconds, 1),
            fmt(divide(r.backlog.processed, r.drain_seconds), 1),
            f"{fmt(r.trickle_window[0], 1)}-{fmt(r.trickle_window[1], 1)}",
            str(sum(r.high_lane_messages.values())),
        )
    return t


def peaks_table(runs: list[PriorityRun]) -> Any:
    t = table("deepest backlog seen (ready messages)", ["queue", *(r.mode for r in runs)])
    for queue in WATCHED_QUEUES:
        if any(r.peak_active.get(queue) for r in runs):
            t.add_row(queue, *(str(r.peak_active.get(queue, 0)) for r in runs))
    return t


def effect_lines(runs: list[PriorityRun]) -> list[str]:
    by_mode = {r.mode: r for r in runs}
    lanes, plain = by_mode.get("lanes"), by_mode.get("no-lanes")
    if lanes is None or plain is None:
        return []
    out = []
    for name in ("p50", "p95", "p99"):
        a = float(getattr(lanes.trickle.server, name))
        b = float(getattr(plain.trickle.server, name))
        out.append(
            f"trickle {name}: {fmt(a * 1000, 0)} ms with lanes vs {fmt(b * 1000, 0)} ms "
            f"without = {ratio(a, b)}"
        )
    a, b = lanes.drain_seconds, plain.drain_seconds
    out.append(f"backlog drain: {fmt(a, 1)} s with lanes vs {fmt(b, 1)} s without = {ratio(a, b)}")
    return out


def save(machine: Machine, args: argparse.Namespace, runs: list[PriorityRun]) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"priority-{time.strftime('%Y%m%d-%H%M%S')}.json"
    data = {
        "machine": asdict(machine),
        "args": vars(args),
        "runs": [{**asdict(r), "p50_ratio": r.p50_ratio} for r in runs],
        "effect": effect_lines(runs),
    }
    path.write_text(json.dumps(data, indent=2, default=str))
    console.print(f"[dim]saved {path}[/]")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.priority", description=__doc__)
    parser.add_argument("--normal", type=int, default=600, help="backlog orders (600)")
    parser.add_argument("--high", type=int, default=40, help="trickle orders (40)")
    parser.add_argument(
        "--interval", type=float, default=0.25, help="seconds between trickle orders (0.25)"
    )
    parser.add_argument(
        "--delay", type=float, default=0.0, help="seconds from backlog submitted to trickle (0)"
    )
    parser.add_argument(
        "--latency-ms", type=int, default=2000, help="simulated latency per remote call (2000)"
    )
    parser.add_argument("--jitter-ms", type=int, default=0, help="extra random latency (0)")
    parser.add_argument(
        "--submit-concurrency", type=int, default=64, help="backlog POSTs in flight (64)"
    )
    parser.add_argument(
        "--mode",
        choices=(*MODES, "both"),
        default="both",
        help="lanes, no-lanes (trickle sent as normal) or both (default)",
    )
    parser.add_argument(
        "--step-timeout",
        type=float,
        default=600.0,
        help="StepTimeoutSeconds, longer than the backlog waits (600)",
    )
    parser.add_argument(
        "--high-step-timeout",
        type=float,
        default=60.0,
        help="HighPriorityStepTimeoutSeconds (60)",
    )
    parser.add_argument("--warmup", type=int, default=10, help="orders before each run (10)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per run at most")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run (120 + 10 orders) in about 1.5 minutes"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.normal = min(args.normal, 120)
        args.high = min(args.high, 10)
        args.warmup = min(args.warmup, 3)
        args.timeout = min(args.timeout, 60)
    if args.normal < 1 or args.high < 1 or args.interval < 0 or args.latency_ms < 0:
        parser.error("--normal and --high must be positive, --interval and --latency-ms not <0")
    args.modes = list(MODES) if args.mode == "both" else [args.mode]
    return args


def describe(args: argparse.Namespace) -> str:
    return (
        f"backlog {args.normal} normal orders ({args.submit_concurrency} POSTs in flight), "
        f"then {args.high} trickle orders every {args.interval:g} s; remote latency "
        f"{args.latency_ms} ms (+0-{args.jitter_ms} ms) per call; StepTimeoutSeconds "
        f"{args.step_timeout:g}, HighPriorityStepTimeoutSeconds {args.high_step_timeout:g}; "
        f"runs: {', '.join(args.modes)}"
    )


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    machine = print_machine("priority: high-priority lanes under a normal backlog")
    console.print(f"[dim]{describe(args)}[/]")
    runs = asyncio.run(measure(args))
    console.print(results_table(runs))
    console.print(summary_table(runs))
    console.print(peaks_table(runs))
    for line in effect_lines(runs):
        console.print(line)
    console.print(
        "[dim]latency: order createdAt to the Processed transition (server clock); client: "
        "POST sent to the Processed notification read. Drain: first backlog intake to the "
        "last backlog order Processed. peak: most ready messages seen in a queue.[/]"
    )
    save(machine, args, runs)
    unfinished = sum(r.backlog.unfinished + r.trickle.unfinished for r in runs)
    return 0 if unfinished == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
