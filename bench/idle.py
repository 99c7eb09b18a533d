"""CPU of the local stack with no orders, and one order's latency after the idle spell.

    python -m bench.idle [--seconds 60] [--waiting 1000] [--profile] [--no-probe]

Starts Azurite (in memory, as bench and chaos run it), the broker, the simulator and the
runtime as separate processes through the harness's Stack, waits until the runtime is
healthy, sends one order (it opens the sender links) and lets start-up settle; then
submits nothing and reads each process's CPU seconds (children included) from the OS
over the window: an idle system should cost next to nothing, and what it does cost is
paid again on every test, demo and laptop. Then one order goes through, so a saving
bought with slower wake-ups shows up as latency. ``--profile`` samples the runtime and
the broker with py-spy during the window and prints their top frames. ``--waiting N``
first puts N orders of ``reviewed-order`` in their approval wait (a day long), so the
window shows what waiting costs: nothing per order, when it works.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench._common import CpuMeter, console, fmt, print_machine, table
from bench._profile import Recorder
from bench._stack import BenchStack
from devhost.harness.load import StatusQueue, parse_time

SETTLE_SECONDS = 10.0
PROBE_TIMEOUT = 60.0
SERVICES = ("runtime", "broker", "azurite")
"""What `python -m devhost` itself runs; the simulator stands in for remote services."""


@dataclass
class IdleResult:
    seconds: float
    waiting: int
    load_average: tuple[float, float, float]
    cpu_seconds: dict[str, float]
    machine_busy: float
    first: dict[str, Any] = field(default_factory=dict)
    probe: dict[str, Any] = field(default_factory=dict)
    frames: dict[str, dict[str, list[tuple[str, float]]]] = field(default_factory=dict)

    def percent(self, name: str) -> float:
        return 100 * self.cpu_seconds.get(name, 0.0) / max(self.seconds, 1e-9)

    @property
    def devhost_percent(self) -> float:
        return sum(self.percent(name) for name in SERVICES)


def top_frames(path: Path, top: int = 15) -> dict[str, list[tuple[str, float]]]:
    """The most sampled frames of a py-spy raw (collapsed) profile, as % of samples:
    "self" (the frame on top of the stack) and "cumulative" (anywhere on it)."""
    own: Counter[str] = Counter()
    anywhere: Counter[str] = Counter()
    samples = 0
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        lines = []
    for line in lines:
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        frames = [f for f in stack.split(";") if not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        count = int(count_text)
        samples += count
        own[frames[-1]] += count
        for frame in set(frames):
            anywhere[frame] += count
    total = max(samples, 1)
    return {
        "self": [(f, 100 * n / total) for f, n in own.most_common(top)],
        "cumulative": [(f, 100 * n / total) for f, n in anywhere.most_common(top)],
    }


async def probe_order(stack: BenchStack) -> dict[str, Any]:
    """One order from POST to the Processed notification read from ``order-status``."""
    order_id = f"idle-{uuid.uuid4().hex[:8]}"
    processed = asyncio.Event()
    stop = asyncio.Event()
    seen: dict[str, float] = {}

    def on_event(oid: str, status: str, at: object) -> None:
        if oid == order_id and status == "Processed":
            seen["observed"] = time.monotonic()
            processed.set()

    status = StatusQueue(stack.service_bus_connection_string)
    reader = asyncio.create_task(status.run(on_event, stop))
    try:
        await asyncio.sleep(1.0)  # the reader's link is open before the order goes out
        async with aiohttp.ClientSession() as session:
            app = stack.app(session)
            posted = time.monotonic()
            await app.submit_order(order_id)
            await asyncio.wait_for(processed.wait(), PROBE_TIMEOUT)
            view = await app.order(order_id)
    finally:
        stop.set()
        await asyncio.gather(reader, return_exceptions=True)
    created = view.get("createdAt")
    updated = view.get("updatedAt")
    result: dict[str, Any] = {"clientMs": 1000 * (seen["observed"] - posted)}
    if isinstance(created, str) and isinstance(updated, str):
        start = parse_time(created)
        result["serverMs"] = 1000 * (parse_time(updated) - start).total_seconds()
        result["timeline"] = [
            (entry["event"], round(1000 * (parse_time(entry["at"]) - start).total_seconds()))
            for entry in view.get("history", [])
        ]
    return result


def wait_settle_seconds(stack: BenchStack) -> float:
    """A new order's watch entry is first due a pending timeout after its submission; the
    sweep then moves a waiting order's entry to its wait's deadline. The window starts
    after that one look at every order (two Supervisor periods and a margin later)."""
    timings = stack.timings
    return timings.pending_timeout + 2 * timings.supervisor_period + 5


async def put_in_wait(stack: BenchStack, count: int) -> None:
    """`count` orders waiting for their approval, each confirmed at its wait."""
    run = uuid.uuid4().hex[:6]
    ids = [f"wait-{run}-{i:05d}" for i in range(count)]
    gate = asyncio.Semaphore(32)
    async with aiohttp.ClientSession() as session:
        app = stack.app(session)

        async def one(order_id: str) -> None:
            async with gate:
                status, answer = await app.submit(
                    {
                        "orderId": order_id,
                        "customerId": f"c-{int(order_id[-5:]) % 50}",
                        "items": [{"sku": "SKU-1", "quantity": 1, "unitPrice": 5}],
                        "workflow": "reviewed-order",
                    }
                )
                if status != 202:
                    raise RuntimeError(f"submit {order_id}: {status} {answer}")

        await asyncio.gather(*(one(i) for i in ids))
        started = time.monotonic()
        for order_id in ids:
            await app.wait_for(order_id, {"Processing"}, 300, currentStep=1)
        console.print(
            f"[dim]{count} orders waiting for approval "
            f"({time.monotonic() - started:.0f} s to confirm)[/]"
        )
    await asyncio.sleep(wait_settle_seconds(stack))


async def measure(args: argparse.Namespace) -> IdleResult:
    async with BenchStack("idle") as stack:
        async with aiohttp.ClientSession() as session:
            await stack.wait_healthy(session)
        console.print(f"[dim]{stack.describe()}[/]")
        # The first order opens the sender links; the probe after the window must not.
        first = {} if args.no_probe else await probe_order(stack)
        if args.waiting:
            await put_in_wait(stack, args.waiting)
        # Links open and the first heartbeats and sweeps are start-up, not idle.
        await asyncio.sleep(args.settle)
        pids = stack.pids()
        meter = CpuMeter(pids)
        recorders: list[Recorder] = []
        meter.start()
        if args.profile:
            for name in ("runtime", "broker"):
                out = stack.run_dir / f"pyspy-idle-{name}.txt"
                recorders.append(Recorder(name, pids[name], out, duration=int(args.seconds)))
        await asyncio.sleep(args.seconds)
        meter.stop()
        load = os.getloadavg()
        frames: dict[str, dict[str, list[tuple[str, float]]]] = {}
        for recorder in recorders:
            recorder.finish()
            frames[recorder.name] = top_frames(recorder.out)
        result = IdleResult(
            seconds=meter.wall,
            waiting=args.waiting,
            load_average=(load[0], load[1], load[2]),
            cpu_seconds=dict(meter.used),
            machine_busy=meter.machine_busy,
            frames=frames,
            first=first,
        )
        if not args.no_probe:
            result.probe = await probe_order(stack)
        save(stack.run_dir, result)
        return result


def save(run_dir: Path, result: IdleResult) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "idle.json").write_text(json.dumps(asdict(result), indent=2))


def report(result: IdleResult) -> None:
    cores = os.cpu_count() or 1
    t = table(
        f"CPU with {result.waiting or 'no'} orders waiting over {result.seconds:.0f} s"
        if result.waiting
        else f"CPU with no orders over {result.seconds:.0f} s",
        ["process", "CPU s", "% of one core"],
    )
    for name, used in result.cpu_seconds.items():
        t.add_row(name, fmt(used, 2), fmt(result.percent(name), 2))
    t.add_row("python -m devhost (runtime + broker + Azurite)", "", fmt(result.devhost_percent, 2))
    total = sum(result.cpu_seconds.values())
    t.add_row("all of the above", fmt(total, 2), fmt(100 * total / result.seconds, 2))
    other = max(result.machine_busy - total, 0.0)
    t.add_row("everything else on the machine", fmt(other, 1), fmt(100 * other / result.seconds, 0))
    console.print(t)
    l1, l5, l15 = result.load_average
    console.print(f"load average after the window: {l1:.2f} / {l5:.2f} / {l15:.2f} ({cores} cores)")
    for label, probe in (
        ("first order (opens links)", result.first),
        ("one order after the idle spell", result.probe),
    ):
        if probe:
            server = probe.get("serverMs")
            console.print(
                f"{label}: {probe['clientMs']:.0f} ms POST to Processed read"
                + (f", {server:.0f} ms intake to Processed on the server" if server else "")
            )
            timeline = ", ".join(f"{event} {ms}" for event, ms in probe.get("timeline", []))
            console.print(f"[dim]  ms since intake: {timeline}[/]")
    for name, kinds in result.frames.items():
        for kind, rows in kinds.items():
            ft = table(f"{name}: top frames ({kind}, % of samples)", ["frame", "%"])
            for frame, share in rows:
                ft.add_row(frame, fmt(share, 1))
            console.print(ft)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.idle", description=__doc__)
    parser.add_argument("--seconds", type=float, default=60.0, help="measured window")
    parser.add_argument(
        "--settle", type=float, default=SETTLE_SECONDS, help="wait after start-up first"
    )
    parser.add_argument("--profile", action="store_true", help="py-spy runtime and broker")
    parser.add_argument("--no-probe", action="store_true", help="skip the one-order probe")
    parser.add_argument(
        "--waiting", type=int, default=0, help="orders put in an approval wait first"
    )
    args = parser.parse_args(argv)
    print_machine("idle CPU of the local stack")
    report(asyncio.run(measure(args)))


if __name__ == "__main__":
    main()
