"""`python -m devhost demo`: a few hundred orders through faults, watched as they heal.

It talks to the system only the way a user would: HTTP to the app (7071), the
simulator's control API (7072) and the local broker's control API (7073).
"""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Awaitable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
TERMINAL = {"Processed", "Compensated", "Error"}
DECLINED_SKU = "CARD-DECLINED"

# Faults: remote transient errors and latency everywhere, hangs past the deadline at
# payment and shipping, permanent failures for one SKU, and duplicated deliveries.
SIM_FAULTS: dict[str, dict[str, Any]] = {
    "inventory": {"transientErrorRate": 0.15, "latencyMs": 20, "latencyJitterMs": 40},
    "payment": {
        "transientErrorRate": 0.10,
        "hangRate": 0.04,
        "latencyMs": 30,
        "permanentFailureSkus": [DECLINED_SKU],
    },
    "shipping": {"transientErrorRate": 0.10, "hangRate": 0.03, "latencyMs": 20},
}
SIM_FAULTS["payment-secondary"] = {
    "transientErrorRate": 0.05,
    "latencyMs": 40,
    "permanentFailureSkus": [DECLINED_SKU],
}
OUTAGE = {"transientErrorRate": 1.0, "latencyMs": 30, "permanentFailureSkus": [DECLINED_SKU]}
"""The primary payment provider fails every call for OUTAGE_SECONDS, a third of the way in."""
OUTAGE_SECONDS = 12.0
HIGH_PRIORITY_EVERY = 10
BROKER_FAULTS = {"duplicateRate": 0.05}
SUBMIT_RATE = 25.0
MAX_IN_FLIGHT = 60
"""Orders per second: a steady stream, as a shop sends them, rather than one burst."""
DEMO_TIMINGS = {
    "StepTimeoutSeconds": "8",
    "PendingTimeoutSeconds": "20",
    "SupervisorSchedule": "*/2 * * * * *",
    "MaxFailureCount": "3",
}


@dataclass
class Endpoints:
    app: str = "http://127.0.0.1:7071"
    simulator: str = "http://127.0.0.1:7072"
    broker: str = "http://127.0.0.1:7073"


@dataclass
class Tracked:
    order_id: str
    submitted_at: float
    state: str = "Pending"
    view: dict[str, Any] = field(default_factory=dict)


async def _up(session: aiohttp.ClientSession, url: str) -> bool:
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=2)) as r:
            return r.status == 200
    except (aiohttp.ClientError, TimeoutError, OSError):
        return False


def _start_runtime(console: Console, fresh: bool) -> subprocess.Popen[bytes]:
    log_path = ROOT / ".devhost" / "demo-runtime.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    console.print(f"[dim]starting the local runtime (log: {log_path.relative_to(ROOT)})[/]")
    env = {**os.environ, **{k: os.environ.get(k, v) for k, v in DEMO_TIMINGS.items()}}
    command = [sys.executable, "-m", "devhost", *(["--fresh"] if fresh else [])]
    with log_path.open("ab") as log:
        return subprocess.Popen(
            command,
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


async def _wait_until_up(
    session: aiohttp.ClientSession, url: str, child: subprocess.Popen[bytes] | None
) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if await _up(session, url):
            return
        if child is not None and child.poll() is not None:
            raise SystemExit(
                f"the local runtime exited with {child.returncode}; see .devhost/demo-runtime.log"
            )
        await asyncio.sleep(0.5)
    raise SystemExit("the local runtime did not answer on /api/health within 120 s")


def _order_body(
    order_id: str, rng: random.Random, declined: bool, high: bool = False
) -> dict[str, Any]:
    items = [
        {
            "sku": f"SKU-{rng.randint(1, 40):03d}",
            "quantity": rng.randint(1, 4),
            "unitPrice": round(rng.uniform(2, 80), 2),
        }
        for _ in range(rng.randint(1, 3))
    ]
    if declined:
        items.append({"sku": DECLINED_SKU, "quantity": 1, "unitPrice": 10.0})
    body = {"orderId": order_id, "customerId": f"cust-{rng.randint(1, 50)}", "items": items}
    return body | ({"priority": "high"} if high else {})


async def _submit(session: aiohttp.ClientSession, app: str, body: dict[str, Any]) -> None:
    for attempt in range(5):
        try:
            async with session.post(f"{app}/api/orders", json=body) as r:
                if r.status == 202:
                    return
                if r.status < 500:
                    raise SystemExit(
                        f"order {body['orderId']} refused: {r.status} {await r.text()}"
                    )
        except (aiohttp.ClientError, TimeoutError):
            pass
        await asyncio.sleep(0.5 * (attempt + 1))
    raise SystemExit(f"order {body['orderId']} could not be submitted")


async def _refresh(session: aiohttp.ClientSession, app: str, order: Tracked) -> None:
    try:
        async with session.get(f"{app}/api/orders/{order.order_id}") as r:
            if r.status == 200:
                order.view = await r.json()
                order.state = order.view["processState"]
    except (aiohttp.ClientError, TimeoutError):
        pass


def _counts_table(orders: list[Tracked]) -> Table:
    counts = Counter(o.state for o in orders)
    table = Table(title="orders by process state", show_edge=False)
    for state in ("Pending", "Processing", "Compensating", "Processed", "Compensated", "Error"):
        table.add_column(state, justify="right")
    table.add_row(
        *(
            str(counts.get(s, 0))
            for s in ("Pending", "Processing", "Compensating", "Processed", "Compensated", "Error")
        )
    )
    return table


def _latency(order: Tracked) -> float | None:
    view = order.view
    if not view or view.get("processState") not in TERMINAL:
        return None
    created = datetime.fromisoformat(view["createdAt"].replace("Z", "+00:00"))
    updated = datetime.fromisoformat(view["updatedAt"].replace("Z", "+00:00"))
    return (updated - created).total_seconds()


def _percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[index]


async def _json(session: aiohttp.ClientSession, url: str) -> Any:
    try:
        async with session.get(url) as r:
            return await r.json() if r.status == 200 else None
    except (aiohttp.ClientError, TimeoutError):
        return None


async def _put(session: aiohttp.ClientSession, url: str, body: Any) -> None:
    async with session.put(url, json=body) as r:
        if r.status >= 300:
            raise SystemExit(f"PUT {url} answered {r.status}: {await r.text()}")


async def _delete(session: aiohttp.ClientSession, url: str) -> None:
    try:
        async with session.delete(url):
            pass
    except (aiohttp.ClientError, TimeoutError):
        pass


async def run_demo(orders: int, seed: int, fresh: bool, keep: bool, timeout: float) -> int:
    console = Console()
    ends = Endpoints()
    rng = random.Random(seed)
    run = uuid.uuid4().hex[:6]
    child: subprocess.Popen[bytes] | None = None
    connector = aiohttp.TCPConnector(limit=64)
    async with aiohttp.ClientSession(connector=connector) as session:
        if not await _up(session, f"{ends.app}/api/health"):
            child = _start_runtime(console, fresh)
        await _wait_until_up(session, f"{ends.app}/api/health", child)
        try:
            return await _drive(console, session, ends, rng, run, orders, timeout)
        finally:
            await _delete(session, f"{ends.simulator}/_sim/faults")
            await _delete(session, f"{ends.broker}/_broker/faults")
            if child is not None and not keep:
                console.print("[dim]stopping the local runtime[/]")
                child.terminate()
                try:
                    child.wait(30)
                except subprocess.TimeoutExpired:
                    child.kill()


async def _drive(
    console: Console,
    session: aiohttp.ClientSession,
    ends: Endpoints,
    rng: random.Random,
    run: str,
    count: int,
    timeout: float,
) -> int:
    console.rule("[bold]Scheduler-Agent-Supervisor demo")
    console.print(
        "Faults switched on: 10-15% transient errors at every remote service, hangs past the "
        "step deadline at payment (4%) and shipping (3%), latency spikes, a SKU whose card is "
        f"always declined ({DECLINED_SKU}), and 5% of broker messages delivered twice. "
        f"A third of the way in, the primary payment provider fails every call for "
        f"{OUTAGE_SECONDS:.0f} s: new orders are routed to the secondary. Every "
        f"{HIGH_PRIORITY_EVERY}th order is high priority (its own agent queues)."
    )
    await _delete(session, f"{ends.simulator}/_sim/stats")
    for service, faults in SIM_FAULTS.items():
        await _put(session, f"{ends.simulator}/_sim/faults/{service}", faults)
    broker_before = await _json(session, f"{ends.broker}/_broker/stats") or {}
    broker_ok = True
    try:
        await _put(session, f"{ends.broker}/_broker/faults", BROKER_FAULTS)
    except (aiohttp.ClientError, SystemExit):
        broker_ok = False
        console.print("[yellow]no local broker control API: message duplication not injected[/]")

    tracked = [Tracked(f"demo-{run}-{i:04d}", 0.0) for i in range(count)]
    declined = set(rng.sample(range(count), max(1, count // 20)))
    gate = asyncio.Semaphore(16)
    # Closed loop: at most MAX_IN_FLIGHT orders open at once, so a slow machine shows the
    # pattern healing faults rather than a queue growing faster than it drains.
    room = asyncio.Semaphore(MAX_IN_FLIGHT)

    async def submit(i: int, order: Tracked) -> None:
        await asyncio.sleep(i / SUBMIT_RATE)
        await room.acquire()
        async with gate:
            high = i % HIGH_PRIORITY_EVERY == 0
            body = _order_body(order.order_id, rng, i in declined, high)
            await _submit(session, ends.app, body)
            order.submitted_at = time.monotonic()

    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    )
    submitted = progress.add_task("submitted", total=count)
    finished = progress.add_task("finished ", total=count)
    started = time.monotonic()

    async def submit_all() -> None:
        async def one(i: int, order: Tracked) -> None:
            await submit(i, order)
            progress.advance(submitted)

        await asyncio.gather(*(one(i, o) for i, o in enumerate(tracked)))

    with Live(
        Group(progress, _counts_table(tracked)), console=console, refresh_per_second=4
    ) as live:
        submitting = asyncio.create_task(submit_all())
        outage = asyncio.create_task(_payment_outage(session, ends, count, live.console))
        poll = asyncio.Semaphore(8)
        while time.monotonic() - started < timeout:
            await asyncio.sleep(1)
            pending = [o for o in tracked if o.state not in TERMINAL and o.submitted_at]
            await asyncio.gather(*(_gated(poll, _refresh(session, ends.app, o)) for o in pending))
            for _ in range(sum(o.state in TERMINAL for o in pending)):
                room.release()
            done = sum(o.state in TERMINAL for o in tracked)
            progress.update(finished, completed=done)
            live.update(Group(progress, _counts_table(tracked)))
            if submitting.done() and done == count:
                break
        await submitting
        outage.cancel()
    console.print()

    elapsed = time.monotonic() - started
    if broker_ok:
        await _delete(session, f"{ends.broker}/_broker/faults")
    errors = [o for o in tracked if o.state == "Error"]
    resubmitted = 0
    if errors:
        console.print(
            f"{len(errors)} order(s) in Error: an operator clears the faults and resubmits them"
        )
        await _delete(session, f"{ends.simulator}/_sim/faults")
        for order in errors:
            async with session.post(f"{ends.app}/api/orders/{order.order_id}/resubmit") as r:
                resubmitted += r.status == 202
        for _ in range(60):
            await asyncio.sleep(1)
            await asyncio.gather(*(_refresh(session, ends.app, o) for o in errors))
            if all(o.state in TERMINAL - {"Error"} for o in errors):
                break

    effects = await _json(session, f"{ends.simulator}/_sim/effects") or []
    mine = [e for e in effects if str(e.get("orderId", "")).startswith(f"demo-{run}-")]
    applied_twice = sum(1 for e in mine if int(e.get("applied", 0)) > 1)
    keys_per_step = Counter((e["orderId"], e["operation"]) for e in mine)
    sim_stats = await _json(session, f"{ends.simulator}/_sim/stats") or {}
    broker_after = await _json(session, f"{ends.broker}/_broker/stats") or {}

    recoveries = sum(
        sum(1 for h in o.view.get("history", []) if h.get("event") == "timed-out") for o in tracked
    )
    latencies = [v for o in tracked if (v := _latency(o)) is not None]
    high = [v for i, o in enumerate(tracked) if i % HIGH_PRIORITY_EVERY == 0 and (v := _latency(o))]
    normal = [v for i, o in enumerate(tracked) if i % HIGH_PRIORITY_EVERY and (v := _latency(o))]
    by_secondary = sum(
        1
        for e in mine
        if e.get("service") == "payment-secondary"
        and e.get("operation") == "charge-payment"
        and int(e.get("applied", 0)) == 1
    )
    counts = Counter(o.state for o in tracked)
    retries = sum(
        int(s.get("transientErrors", 0)) + int(s.get("transientErrorsAfterApply", 0))
        for s in sim_stats.values()
        if isinstance(s, dict)
    )
    duplicates = _broker_delta(broker_before, broker_after, "duplicatesSuppressed") + _broker_delta(
        broker_before, broker_after, "duplicated"
    )

    summary = Table(title=f"demo summary ({count} orders, {elapsed:.1f} s)", show_header=False)
    summary.add_column("what")
    summary.add_column("figure", justify="right")
    summary.add_row("Processed", str(counts.get("Processed", 0)))
    summary.add_row(
        f"Compensated (card declined: {len(declined)} orders)", str(counts.get("Compensated", 0))
    )
    summary.add_row("Error (operator alerted)", str(len(errors)))
    summary.add_row("  resubmitted by the operator and finished", str(resubmitted))
    summary.add_row("not finished", str(count - sum(counts[s] for s in TERMINAL)))
    summary.add_row("transient faults absorbed by agent retries", str(retries))
    summary.add_row("Supervisor recoveries (deadline passed, step retried)", str(recoveries))
    summary.add_row("duplicate deliveries injected / dropped by the broker", str(duplicates))
    summary.add_row("charged by the secondary payment provider (routing)", str(by_secondary))
    summary.add_row(
        "latency p50: high priority / normal (s)",
        f"{_percentile(high, 50):.2f} / {_percentile(normal, 50):.2f}",
    )
    summary.add_row(
        "latency p50 / p95 / p99 (s)",
        " / ".join(f"{_percentile(latencies, p):.2f}" for p in (50, 95, 99)),
    )
    summary.add_row("remote effects applied more than once", str(applied_twice))
    summary.add_row(
        "orders x operations with more than one idempotency key",
        str(sum(1 for n in keys_per_step.values() if n > 1)),
    )
    console.print(summary)
    unfinished = count - sum(1 for o in tracked if o.state in TERMINAL)
    return 1 if unfinished or applied_twice else 0


async def _payment_outage(
    session: aiohttp.ClientSession, ends: Endpoints, count: int, console: Console
) -> None:
    await asyncio.sleep(count / 3 / SUBMIT_RATE)
    console.print("[red]payment provider outage: every call fails[/]")
    await _put(session, f"{ends.simulator}/_sim/faults/payment", OUTAGE)
    await asyncio.sleep(OUTAGE_SECONDS)
    await _put(session, f"{ends.simulator}/_sim/faults/payment", SIM_FAULTS["payment"])
    console.print("[green]payment provider back: work moves back to it[/]")


async def _gated(gate: asyncio.Semaphore, work: Awaitable[None]) -> None:
    async with gate:
        await work


def _broker_delta(before: Any, after: Any, key: str) -> int:
    def total(stats: Any) -> int:
        queues = stats.get("queues", stats) if isinstance(stats, dict) else {}
        return sum(int(q.get(key, 0)) for q in queues.values() if isinstance(q, dict))

    return max(0, total(after) - total(before))


def main(
    orders: int = 200, seed: int = 7, fresh: bool = False, keep: bool = False, timeout: float = 300
) -> int:
    return asyncio.run(run_demo(orders, seed, fresh, keep, timeout))
