"""Orders per second and intake-to-Processed latency on the local runtime.

    python -m bench.throughput [--orders 2000] [--concurrency 64 | --rate 20] [--runtimes 1,2,4]
                               [--quick]

Azurite, the local broker, the simulator and ``python -m devhost --no-services`` run as
separate processes on free ports; the driver submits orders over HTTP (closed loop: at
most ``--concurrency`` orders in flight; open loop: ``--rate`` orders per second) and
reads completions from the ``order-status`` queue, once without faults and once with
``--faults`` transient errors at every remote service. It prints throughput, latency
percentiles and the CPU each process took (``--profile`` adds a py-spy breakdown).
``--runtimes 1,2,4`` repeats it all with that many runtime processes competing for the
same queues and table (as Flex Consumption instances would), the driver's POSTs spread
round robin over their HTTP ports.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
import uuid
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

import aiohttp
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from bench._activity import TIMER_MARK
from bench._common import (
    RESULTS,
    CpuMeter,
    LatencySummary,
    Machine,
    console,
    cpu_table,
    fmt,
    print_machine,
    table,
)
from bench._host_share import HostShare, split_line
from bench._placement import PLACEMENTS, app_functions, runtime_settings, takes_orders
from bench._profile import Recorder
from bench._stack import BenchStack, Timings, set_faults
from devhost.harness.clients import AppClient, SimulatorControl
from devhost.harness.load import Load, LoadResult, StatusQueue, parse_time, run_load
from devhost.host.sb_links import RECEIVER_SETTING


@dataclass
class RunSummary:
    """One measured run; what compare.py and the README table are made of."""

    system: str
    fault_rate: float
    load: str
    orders: int
    processed: int
    unfinished: int
    seconds: float
    throughput: float
    submit_rate: float
    server: LatencySummary
    client: LatencySummary
    cpu: dict[str, float] = field(default_factory=dict)
    cpu_wall: float = 0.0
    machine_busy: float = 0.0
    retries: int = 0
    profiles: dict[str, Any] = field(default_factory=dict)
    hops: dict[str, Any] = field(default_factory=dict)
    functions: dict[str, Any] = field(default_factory=dict)
    runtimes: int = 1
    """Runtime processes serving the run (ours; the peer is one process)."""
    host_cpu: float = 0.0
    """CPU seconds of the runtimes' host threads (bench/_host_share.py); the rest of
    the runtimes' CPU is the app's."""

    @property
    def label(self) -> str:
        return self.system if self.runtimes == 1 else f"{self.system} x{self.runtimes}"

    @classmethod
    def of(
        cls,
        system: str,
        fault_rate: float,
        result: LoadResult,
        meter: CpuMeter | None,
        runtimes: int = 1,
    ) -> RunSummary:
        return cls(
            runtimes=runtimes,
            system=system,
            fault_rate=fault_rate,
            load=result.load.describe(),
            orders=len(result.orders),
            processed=result.processed,
            unfinished=len(result.orders) - len(result.finished),
            seconds=result.elapsed,
            throughput=result.throughput,
            submit_rate=result.submit_rate,
            server=LatencySummary.of(result.server_latencies),
            client=LatencySummary.of(result.client_latencies),
            cpu=dict(meter.used) if meter else {},
            cpu_wall=meter.wall if meter else 0.0,
            machine_busy=meter.machine_busy if meter else 0.0,
        )


def results_table(title: str, runs: list[RunSummary]) -> Any:
    t = table(
        title,
        [
            "system",
            "faults",
            "orders",
            "Processed",
            "unfinished",
            "orders/s",
            "submit/s",
            "p50 ms",
            "p95 ms",
            "p99 ms",
            "max ms",
            "client p50 ms",
            "client p99 ms",
            "remote retries",
        ],
        right_from=1,
    )
    for r in runs:
        t.add_row(
            r.label,
            f"{r.fault_rate:.0%}",
            str(r.orders),
            str(r.processed),
            str(r.unfinished),
            fmt(r.throughput, 1),
            fmt(r.submit_rate, 1),
            *r.server.cells(),
            fmt(r.client.p50 * 1000, 0),
            fmt(r.client.p99 * 1000, 0),
            str(r.retries),
        )
    return t


def progress_bar() -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )


HOPS = (
    ("intake -> claimed (scheduler queue hop)", "submitted", "claimed"),
    ("claimed -> inventory done (agent queue, call, reply queue)", "claimed", "step-completed:0"),
    ("inventory done -> payment done", "step-completed:0", "step-completed:1"),
    ("payment done -> shipping done = Processed", "step-completed:1", "step-completed:2"),
)


async def hop_breakdown(app: AppClient, order_ids: list[str]) -> dict[str, LatencySummary]:
    """Where an order's time goes, from the history of a sample of orders."""
    spans: dict[str, list[float]] = {name: [] for name, _, _ in HOPS}
    for order_id in order_ids:
        try:
            view = await app.order(order_id)
        except Exception:  # a sample: skip what cannot be read
            continue
        marks: dict[str, datetime] = {}
        completed = 0
        for entry in view.get("history", []):
            event = entry["event"]
            if event == "step-completed":
                event = f"step-completed:{completed}"
                completed += 1
            marks.setdefault(event, parse_time(entry["at"]))
        for name, start, end in HOPS:
            if start in marks and end in marks:
                spans[name].append((marks[end] - marks[start]).total_seconds())
    return {name: LatencySummary.of(values) for name, values in spans.items()}


def hops_table(title: str, hops: dict[str, LatencySummary]) -> Any:
    t = table(title, ["hop", "orders", "mean ms", "p50 ms", "p95 ms", "p99 ms", "max ms"])
    for name, summary in hops.items():
        t.add_row(name, str(summary.count), fmt(summary.mean * 1000, 0), *summary.cells())
    return t


async def _sim_retries(simulator: SimulatorControl) -> int:
    stats = await simulator.stats()
    return sum(int(s.get("transientErrors", 0)) for s in stats.values() if isinstance(s, dict))


async def warm_up(stack: BenchStack, count: int, tag: str) -> None:
    """A few orders through first, so the run does not pay for links and caches."""
    if count:
        await run_load(
            apis(stack),
            [f"warm-{tag}-{i:04d}" for i in range(count)],
            Load(concurrency=min(count, 16)),
            StatusQueue(stack.service_bus_connection_string),
            timeout=120,
        )


def profilers(
    stack: BenchStack, args: argparse.Namespace, rate: float, recorders: list[Recorder]
) -> None:
    """py-spy on the runtime, the broker and the driver for the run (``--profile``)."""
    pids = stack.pids()
    runtimes = {name: pid for name, pid in pids.items() if name.startswith("runtime")}
    targets = {**runtimes, "broker": pids["broker"], "driver": os.getpid()}
    for name, pid in targets.items():
        out = stack.run_dir / f"pyspy-{name.replace(' ', '-')}-{rate:.2f}.txt"
        recorders.append(Recorder(name, pid, out, duration=int(args.timeout)))


async def measure_run(
    stack: BenchStack,
    session: aiohttp.ClientSession,
    args: argparse.Namespace,
    rate: float,
    load: Load,
) -> RunSummary:
    """One measured run at one fault rate on a running stack."""
    simulator = stack.simulator(session)
    instrument = getattr(args, "instrument", False)
    await set_faults(simulator, rate, args.latency_ms)
    tag = uuid.uuid4().hex[:6]
    await warm_up(stack, args.warmup, tag)
    await simulator.clear_stats()
    if instrument:
        await stack.runtime_stats(reset=True)
    meter = CpuMeter({**stack.pids(), "driver (this process)": os.getpid()})
    share = HostShare({n: pid for n, pid in stack.pids().items() if n.startswith("runtime")})
    recorders: list[Recorder] = []

    async def begin() -> None:
        meter.start()
        share.begin()
        if args.profile:
            profilers(stack, args, rate, recorders)

    with progress_bar() as progress:
        task = progress.add_task(f"{rate:.0%} faults", total=args.orders)
        result = await run_load(
            apis(stack),
            [f"tp-{tag}-{i:05d}" for i in range(args.orders)],
            load,
            StatusQueue(stack.service_bus_connection_string),
            timeout=args.timeout,
            seed=args.seed,
            on_progress=lambda done, total: progress.update(task, completed=done),
            before_start=begin,
            notify=notify_of(args),
        )
    meter.stop()
    share.end()
    profiles = [p for r in recorders if (p := r.finish()) is not None]
    summary = RunSummary.of("ours", rate, result, meter, len(stack.runtimes))
    summary.host_cpu = share.seconds()
    summary.retries = await _sim_retries(simulator)
    summary.profiles = {p.name: p.to_json() for p in profiles}
    if instrument:
        summary.functions = await stack.runtime_stats()
        console.print(collector_line(summary.functions, summary.processed))
        title = f"inside the runtime, {rate:.0%} faults"
        console.print(functions_table(title, summary.functions, result))
        console.print(activity_table(f"Flex Consumption activity, {rate:.0%} faults", summary))
    await print_hops(stack, session, rate, result, summary)
    console.print(cpu_table(meter, f"CPU during the {rate:.0%} faults run"))
    console.print(cpu_per_order_line(summary))
    for profile in profiles:
        console.print(profile.table())
    return summary


async def print_hops(
    stack: BenchStack,
    session: aiohttp.ClientSession,
    rate: float,
    result: LoadResult,
    summary: RunSummary,
) -> None:
    step = max(1, len(result.orders) // 60)
    hops = await hop_breakdown(stack.app(session), [o.order_id for o in result.orders[::step]])
    summary.hops = {name: asdict(h) for name, h in hops.items()}
    console.print(hops_table(f"latency by hop, {rate:.0%} faults (sample)", hops))


def cpu_per_order_line(summary: RunSummary) -> str:
    """CPU per order of the three processes an order needs, and the runtime's split."""
    runtime = sum(v for k, v in summary.cpu.items() if k.startswith("runtime"))
    stack = runtime + summary.cpu.get("broker", 0.0) + summary.cpu.get("azurite", 0.0)
    n = max(summary.processed, 1)
    return f"CPU per order, runtime + broker + Azurite: {1000 * stack / n:.1f} ms; " + split_line(
        runtime, summary.host_cpu, summary.processed
    )


def functions_table(title: str, stats: dict[str, Any], result: LoadResult) -> Any:
    """Per function: invocations, time in the handler, queue wait, store and send time."""
    t = table(
        title,
        [
            "function [step]",
            "invocations",
            "mean handler ms",
            "mean queue wait ms",
            "store calls",
            "mean store ms",
            "messages sent",
            "mean send ms",
        ],
    )
    for name, role in sorted(stats.get("roles", {}).items()):
        n = max(int(role["invocations"]), 1)
        ops = role["ops"].values()
        store_calls = sum(int(o["calls"]) for o in ops)
        store_seconds = sum(float(o["seconds"]) for o in ops)
        sent = sum(role["sent"].values())
        waits = int(role["queueWaits"])
        t.add_row(
            name,
            str(role["invocations"]),
            fmt(1000 * role["seconds"] / n, 1),
            fmt(1000 * role["queueWait"] / waits, 1) if waits else "-",
            str(store_calls),
            fmt(1000 * store_seconds / store_calls, 1) if store_calls else "-",
            str(sent),
            fmt(1000 * role["sendSeconds"] / role["sendCalls"], 1) if role["sendCalls"] else "-",
        )
    return t


def activity_table(title: str, summary: RunSummary) -> Any:
    """Per scale group: how long its instance was active, and what Flex would bill."""
    orders = max(summary.processed, 1)
    t = table(
        f"{title} ({summary.processed} orders in {summary.seconds:.0f} s)",
        [
            "scale group",
            "executions",
            "peak concurrent",
            "active periods",
            "active s",
            "billed s",
            "billed s per order",
            "billed s per order, each execution alone",
        ],
    )
    groups = summary.functions.get("activity", {})
    totals = [0.0, 0.0]
    for name, clock in sorted(groups.items()):
        if not clock["executions"]:
            continue
        t.add_row(
            name,
            str(clock["executions"]),
            str(clock["peak"]),
            str(clock["periods"]),
            fmt(clock["active_seconds"], 1),
            fmt(clock["billed_seconds"], 1),
            fmt(clock["billed_seconds"] / orders, 3),
            fmt(clock["solo_billed_seconds"] / orders, 3),
        )
        if name.endswith(TIMER_MARK):
            continue
        totals[0] += clock["billed_seconds"]
        totals[1] += clock["solo_billed_seconds"]
    t.add_row(
        "[bold]per-order groups (timers left out)[/]",
        "",
        "",
        "",
        "",
        fmt(totals[0], 1),
        fmt(totals[0] / orders, 3),
        fmt(totals[1] / orders, 3),
    )
    return t


def collector_line(stats: dict[str, Any], processed: int) -> str:
    """The runtime's garbage collector over the run (shared.gc_tuning sets it up)."""
    gc_stats = stats.get("gc", {})
    seconds = [float(v) for v in gc_stats.get("seconds", [0, 0, 0])]
    counts = gc_stats.get("collections", [0, 0, 0])
    per_order = 1000 * sum(seconds) / max(processed, 1)
    return (
        f"garbage collector in the runtime: {sum(seconds):.2f} s ({per_order:.2f} ms per order); "
        f"collections by generation {counts[0]} / {counts[1]} / {counts[2]}, "
        f"seconds {seconds[0]:.2f} / {seconds[1]:.2f} / {seconds[2]:.2f}"
    )


def apis(stack: BenchStack) -> list[str]:
    """Every API that takes orders: the driver spreads its POSTs over them."""
    return [
        stack.api(name)
        for name in stack.runtimes
        if takes_orders(stack.runtime_settings.get(name, {}))
    ]


async def measure_ours(args: argparse.Namespace) -> list[RunSummary]:
    runs: list[RunSummary] = []
    for count in getattr(args, "runtimes", [1]):
        runs += await measure_with(args, count)
    return runs


async def measure_with(args: argparse.Namespace, runtimes: int) -> list[RunSummary]:
    """Every fault rate with `runtimes` runtime processes on one stack."""
    timings = Timings(
        step_timeout=args.step_timeout, pending_timeout=args.pending_timeout, supervisor_period=5
    )
    runs: list[RunSummary] = []
    load = Load(rate=args.rate) if args.rate else Load(concurrency=args.concurrency)
    async with BenchStack(
        "throughput",
        timings,
        seed=args.seed,
        instrument=getattr(args, "instrument", False),
        broker_db=not getattr(args, "broker_in_memory", False),
        runtimes=RUNTIME_NAMES[:runtimes],
        runtime_settings=runtime_settings(
            getattr(args, "placement", "all"), RUNTIME_NAMES[:runtimes], app_functions()
        ),
        runtime_env={
            **TRACING[getattr(args, "tracing", "sampled")],
            # The host's own AMQP connection (the default) unless --receiver sdk.
            RECEIVER_SETTING: getattr(args, "receiver", "host"),
        },
        settings=dict(getattr(args, "settings", [])),
    ) as stack:
        console.print(f"[dim]{stack.describe()}[/]")
        async with aiohttp.ClientSession() as session:
            for i, rate in enumerate(args.fault_rates):
                if i:
                    await stack.fresh_table()
                runs.append(await measure_run(stack, session, args, rate, load))
                broker_stats = await stack.broker(session).stats()
                dead = sum(int(q.get("deadLettered", 0)) for q in broker_stats.values())
                sent = sum(int(q.get("sent", 0)) for q in broker_stats.values())
                console.print(f"[dim]broker: {sent:,} messages so far, {dead} dead-lettered[/]")
    return runs


RUNTIME_NAMES = tuple("abcdefgh")

TRACING: dict[str, dict[str, str]] = {
    "off": {"OTEL_SDK_DISABLED": "true"},
    "sampled": {
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0.1",
    },
    "all": {},
}
"""What the runtimes trace: nothing; 10% of orders, as deployed (failed spans and
recovered orders are kept whatever the ratio); every order, as `python -m devhost`."""


def describe_setup(args: argparse.Namespace) -> str:
    load = f"rate {args.rate:g}/s" if args.rate else f"concurrency {args.concurrency}"
    runtimes = ", ".join(str(n) for n in getattr(args, "runtimes", [1]))
    return (
        f"{args.orders} orders per run, {load}, runtime processes {runtimes} "
        f"(placement {getattr(args, 'placement', 'all')}), "
        f"remote latency {args.latency_ms} ms per call, "
        f"faults {', '.join(f'{r:.0%}' for r in args.fault_rates)}, "
        f"step timeout {args.step_timeout:g} s, warm-up {args.warmup} orders, "
        f"tracing {getattr(args, 'tracing', 'sampled')}"
        + (", our client hears the final status only (notify final)" if notify_of(args) else "")
        + "".join(f", {name}={value}" for name, value in getattr(args, "settings", []))
    )


def save(name: str, machine: Machine, args: argparse.Namespace, runs: list[RunSummary]) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(
        json.dumps(
            {
                "machine": asdict(machine),
                "args": {k: v for k, v in vars(args).items() if not callable(v)},
                "runs": [asdict(r) for r in runs],
            },
            indent=2,
            default=str,
        )
    )
    console.print(f"[dim]saved {path}[/]")


def notify_of(args: argparse.Namespace) -> str | None:
    """What the load's orders ask to hear: None (the default, every status) or `final`."""
    notify: str = getattr(args, "notify", "all")
    return None if notify == "all" else notify


def add_load_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--orders", type=int, default=2000, help="orders per run (default 2000)")
    parser.add_argument(
        "--concurrency", type=int, default=64, help="closed loop: orders in flight (default 64)"
    )
    parser.add_argument("--rate", type=float, default=None, help="open loop: orders per second")
    parser.add_argument(
        "--faults",
        dest="fault_rates",
        type=lambda text: [float(x) for x in text.split(",")],
        default=[0.0, 0.1],
        help="comma-separated transient error rates (default 0,0.1)",
    )
    parser.add_argument(
        "--latency-ms", type=int, default=20, help="simulated remote latency per call (20)"
    )
    parser.add_argument("--warmup", type=int, default=30, help="orders before each run (30)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per run at most")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="a smoke run in under a minute")
    parser.add_argument(
        "--receiver",
        choices=("host", "sdk"),
        default="host",
        help="who receives for the triggers: the host's AMQP connection (default) or the SDK",
    )
    parser.add_argument(
        "--notify",
        choices=("all", "final"),
        default="all",
        help="what each order's client asks to hear on order-status: every status, or the "
        "final one only (default: all here, final in bench.compare)",
    )
    parser.add_argument(
        "--tracing",
        choices=sorted(TRACING),
        default="sampled",
        help="off: no OpenTelemetry; sampled: 10%% of orders, as the Bicep deploys (default); "
        "all: every order, as python -m devhost; spans go to the stack's OTLP receiver",
    )


def _setting(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError("expected NAME=VALUE")
    return name, value


def add_runtimes_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--runtimes",
        type=_runtime_counts,
        default=[1],
        help="comma-separated runtime process counts, each run in turn (default 1; e.g. 1,2,4)",
    )
    parser.add_argument(
        "--placement",
        choices=PLACEMENTS,
        default="all",
        help="all: every runtime runs every function (default); roles: the front (HTTP, "
        "timers), the Scheduler and the Agents on separate runtimes, coarser than Flex "
        "Consumption's one scale group per function (1-3 runtimes)",
    )


def _runtime_counts(text: str) -> list[int]:
    counts = [int(x) for x in text.split(",")]
    if not counts or any(not 1 <= n <= len(RUNTIME_NAMES) for n in counts):
        raise argparse.ArgumentTypeError(f"each count must be 1 to {len(RUNTIME_NAMES)}")
    return counts


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.throughput", description=__doc__)
    add_load_options(parser)
    add_runtimes_option(parser)
    parser.add_argument(
        "--setting",
        dest="settings",
        action="append",
        type=_setting,
        default=[],
        metavar="NAME=VALUE",
        help="an app setting for the runtimes, e.g. FairShareRunningPerCustomer=8 (repeatable)",
    )
    parser.add_argument("--step-timeout", type=float, default=30.0)
    parser.add_argument("--pending-timeout", type=float, default=60.0)
    parser.add_argument(
        "--profile", action="store_true", help="py-spy the runtime and the broker during runs"
    )
    parser.add_argument(
        "--broker-in-memory",
        action="store_true",
        help="run the broker without its SQLite store (devhost runs it with one)",
    )
    parser.add_argument(
        "--instrument",
        action="store_true",
        help="run bench.instrumented_runtime: time per function, store call and send",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.orders = min(args.orders, 60)
        args.warmup = min(args.warmup, 5)
        args.timeout = min(args.timeout, 25)
    if args.orders < 1 or (args.rate is not None and args.rate <= 0) or args.concurrency < 1:
        parser.error("--orders, --concurrency and --rate must be positive")
    if args.instrument and max(args.runtimes) > 1:
        parser.error("--instrument reads one runtime's counters: use it with --runtimes 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    machine = print_machine("throughput: the local runtime")
    console.print(f"[dim]{describe_setup(args)}[/]")
    runs = asyncio.run(measure_ours(args))
    console.print(results_table("throughput and latency (intake -> Processed)", runs))
    console.print(
        "[dim]p50/p95/p99/max: server clock, order createdAt to the Processed transition; "
        "client: POST sent to the Processed notification read from order-status.[/]"
    )
    save("throughput", machine, args, runs)
    return 0 if all(r.unfinished == 0 for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
