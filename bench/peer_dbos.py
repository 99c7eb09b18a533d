"""The same three-step workflow on DBOS Transact (SQLite system database), for comparison.

    python -m bench.peer_dbos [--orders 2000] [--concurrency 64 | --rate 20] [--quick]

The peer runs as its own process (``python -m bench.peer_dbos serve``): an aiohttp
intake ``POST /api/orders`` starts a durable workflow whose id is the order id (so a
repeated POST is idempotent); the workflow calls the same simulator as our agents, with
the same idempotency keys, the same latency and the same transient fault rate, one
``@DBOS.step`` per remote call, retried with exponential back-off; a permanent failure
compensates the completed steps in reverse order. ``GET /completions?after=N`` is the
client's view of finished orders. The driver, the measurements and the table are the
ones of ``bench.throughput``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from bench._common import RESULTS, CpuMeter, console, cpu_table, print_machine
from bench._profile import Recorder
from bench._stack import set_faults
from bench.throughput import (
    RunSummary,
    add_load_options,
    describe_setup,
    progress_bar,
    results_table,
    save,
)
from devhost.harness.clients import AppClient, SimulatorControl
from devhost.harness.load import CompletionsFeed, Load, run_load
from devhost.harness.ports import LOOPBACK, free_port
from devhost.harness.process import Child
from devhost.harness.services import simulator_command

# -- the peer application (runs in its own process) ----------------------------------------

STEPS: tuple[tuple[str, str, str], ...] = (
    ("inventory", "reserve-inventory", "release-inventory"),
    ("payment", "charge-payment", "refund-payment"),
    ("shipping", "create-shipment", "cancel-shipment"),
)
CALL_TIMEOUT = 10.0


class TransientError(Exception):
    """408, 429, 5xx, a timeout or a refused connection: retried by DBOS."""


class PermanentError(Exception):
    """Any other 4xx: the step failed; the workflow compensates."""


@dataclass
class PeerState:
    simulator: str
    session: aiohttp.ClientSession | None = None


STATE = PeerState(simulator="")


def _is_transient(exc: BaseException) -> bool:
    return isinstance(exc, TransientError)


async def _call(service: str, operation: str, order_id: str, payload: dict[str, Any]) -> Any:
    assert STATE.session is not None
    key = f"{order_id}:{operation}"
    body = {"orderId": order_id, "idempotencyKey": key, "payload": payload}
    try:
        async with STATE.session.post(
            f"{STATE.simulator}/{service}/{operation}",
            json=body,
            headers={"Idempotency-Key": key},
            timeout=aiohttp.ClientTimeout(total=CALL_TIMEOUT),
        ) as r:
            text = await r.text()
            status = r.status
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        raise TransientError(f"{operation}: {exc!r}") from None
    data = json.loads(text) if text else {}
    if status < 300:
        return data.get("result", data)
    if status in (408, 429) or status >= 500:
        raise TransientError(f"{operation}: {status}")
    raise PermanentError(f"{operation}: {status} {data.get('code', '')}")


def build_workflow() -> Any:
    """Register the step and the workflow with DBOS (imported only in the peer process)."""
    from dbos import DBOS  # noqa: PLC0415 - bench-only dependency

    @DBOS.step(
        retries_allowed=True,
        interval_seconds=0.2,
        backoff_rate=2.0,
        max_attempts=10,
        should_retry=_is_transient,
    )
    async def remote_step(
        service: str, operation: str, order_id: str, payload: dict[str, Any]
    ) -> Any:
        return await _call(service, operation, order_id, payload)

    @DBOS.workflow()
    async def fulfil(order: dict[str, Any]) -> str:
        order_id = str(order["orderId"])
        payload = {"customerId": order.get("customerId"), "items": order.get("items", [])}
        done: list[tuple[str, str, Any]] = []
        try:
            for service, operation, undo in STEPS:
                result = await remote_step(service, operation, order_id, payload)
                done.append((service, undo, result))
        except PermanentError:
            for service, undo, result in reversed(done):
                await remote_step(service, undo, order_id, {"result": result})
            return "Compensated"
        return "Processed"

    return fulfil


async def serve(port: int, db: Path, simulator: str) -> None:
    from dbos import DBOS, SetWorkflowID  # noqa: PLC0415 - bench-only dependency

    STATE.simulator = simulator.rstrip("/")
    fulfil = build_workflow()
    DBOS(
        config={
            "name": "bench-peer",
            "system_database_url": f"sqlite:///{db}",
            "log_level": "WARNING",
        }
    )
    DBOS.launch()
    STATE.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256))
    events: list[dict[str, str]] = []
    waiting: set[asyncio.Task[None]] = set()

    def iso(at: datetime) -> str:
        return at.isoformat().replace("+00:00", "Z")

    async def watch(handle: Any, order_id: str, created: datetime) -> None:
        try:
            state = str(await handle.get_result())
        except Exception:  # a failed workflow is an order in Error for the driver
            state = "Error"
        events.append(
            {
                "orderId": order_id,
                "state": state,
                "createdAt": iso(created),
                "finishedAt": iso(datetime.now(UTC)),
            }
        )

    async def submit(request: web.Request) -> web.Response:
        body = await request.json()
        order_id = str(body.get("orderId") or uuid.uuid4().hex)
        created = datetime.now(UTC)
        with SetWorkflowID(order_id):
            handle = await DBOS.start_workflow_async(fulfil, body)
        task = asyncio.create_task(watch(handle, order_id, created))
        waiting.add(task)
        task.add_done_callback(waiting.discard)
        return web.json_response({"orderId": order_id, "processState": "Pending"}, status=202)

    async def completions(request: web.Request) -> web.Response:
        after = int(request.query.get("after", "0"))
        chunk = events[after : after + 1000]
        return web.json_response({"events": chunk, "next": after + len(chunk)})

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.router.add_post("/api/orders", submit)
    app.router.add_get("/completions", completions)
    app.router.add_get("/api/health", health)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, LOOPBACK, port, backlog=1024).start()
    print(f"peer listening on http://{LOOPBACK}:{port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    import signal  # noqa: PLC0415

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
        for task in waiting:
            task.cancel()
        await STATE.session.close()
        DBOS.destroy()


# -- the benchmark (runs in the driver) ------------------------------------------------------


def _children(
    args: argparse.Namespace, run_dir: Path, work: Path, sim_port: int, peer_port: int
) -> tuple[Child, Child]:
    """The simulator and the DBOS peer, logging under `run_dir`."""
    simulator = Child(
        "simulator",
        simulator_command(port=sim_port, seed=args.seed),
        run_dir / "logs" / "simulator.log",
    )
    peer = Child(
        "dbos peer",
        [
            sys.executable,
            "-m",
            "bench.peer_dbos",
            "serve",
            "--port",
            str(peer_port),
            "--db",
            str(work / "dbos.sqlite"),
            "--simulator",
            f"http://{LOOPBACK}:{sim_port}",
        ],
        run_dir / "logs" / "peer.log",
    )
    return simulator, peer


async def measure_peer(args: argparse.Namespace) -> list[RunSummary]:
    load = Load(rate=args.rate) if args.rate else Load(concurrency=args.concurrency)
    run_dir = RESULTS / f"peer-{time.strftime('%Y%m%d-%H%M%S')}"
    work = Path(tempfile.mkdtemp(prefix="bench-peer-"))
    sim_port, peer_port = free_port(), free_port()
    base = f"http://{LOOPBACK}:{peer_port}"
    simulator, peer = _children(args, run_dir, work, sim_port, peer_port)
    runs: list[RunSummary] = []
    try:
        simulator.start()
        simulator.wait_ready(ports=(sim_port,))
        peer.start()
        async with aiohttp.ClientSession() as session:
            await AppClient(session, f"{base}/api").wait_healthy(child=peer)
            control = SimulatorControl(session, f"http://{LOOPBACK}:{sim_port}")
            for rate in args.fault_rates:
                summary = await _measure_rate(
                    args, rate, load, base, control, (peer, simulator), run_dir
                )
                runs.append(summary)
    finally:
        peer.stop()
        simulator.stop()
        shutil.rmtree(work, ignore_errors=True)
    return runs


async def _measure_rate(
    args: argparse.Namespace,
    rate: float,
    load: Load,
    base: str,
    control: SimulatorControl,
    children: tuple[Child, Child],
    run_dir: Path,
) -> RunSummary:
    """Warm-up, then one measured run at one fault rate; remote retries from the simulator."""
    await set_faults(control, rate, args.latency_ms)
    tag = uuid.uuid4().hex[:6]
    if args.warmup:
        await run_load(
            f"{base}/api",
            [f"warm-{tag}-{i:04d}" for i in range(args.warmup)],
            Load(concurrency=min(args.warmup, 16)),
            CompletionsFeed(base),
            timeout=120,
        )
    await control.clear_stats()
    summary = await _measure_one(args, rate, load, base, *children, tag, run_dir)
    stats = await control.stats()
    summary.retries = sum(
        int(s.get("transientErrors", 0)) for s in stats.values() if isinstance(s, dict)
    )
    return summary


async def _measure_one(
    args: argparse.Namespace,
    rate: float,
    load: Load,
    base: str,
    peer: Child,
    simulator: Child,
    tag: str,
    run_dir: Path,
) -> RunSummary:
    meter = CpuMeter(
        {"dbos peer": peer.pid, "simulator": simulator.pid, "driver (this process)": os.getpid()}
    )
    recorders: list[Recorder] = []

    async def begin() -> None:
        meter.start()
        if args.profile:
            out = run_dir / f"pyspy-peer-{rate:.2f}.txt"
            recorders.append(Recorder("the DBOS peer", peer.pid, out, duration=int(args.timeout)))

    with progress_bar() as progress:
        task = progress.add_task(f"DBOS, {rate:.0%} faults", total=args.orders)
        result = await run_load(
            f"{base}/api",
            [f"dbos-{tag}-{i:05d}" for i in range(args.orders)],
            load,
            CompletionsFeed(base),
            timeout=args.timeout,
            seed=args.seed,
            on_progress=lambda done, total: progress.update(task, completed=done),
            before_start=begin,
        )
    meter.stop()
    summary = RunSummary.of("DBOS", rate, result, meter)
    console.print(cpu_table(meter, f"CPU during the DBOS {rate:.0%} faults run"))
    for recorder in recorders:
        profile = recorder.finish()
        if profile is not None:
            summary.profiles[profile.name] = profile.to_json()
            console.print(profile.table())
    return summary


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.peer_dbos", description=__doc__)
    add_load_options(parser)
    parser.add_argument("--profile", action="store_true", help="py-spy the peer during runs")
    args = parser.parse_args(argv)
    if args.quick:
        args.orders = min(args.orders, 60)
        args.warmup = min(args.warmup, 5)
        args.timeout = min(args.timeout, 25)
    return args


def main(argv: list[str] | None = None) -> int:
    raw = sys.argv[1:] if argv is None else argv
    if raw[:1] == ["serve"]:
        serve_parser = argparse.ArgumentParser(prog="python -m bench.peer_dbos serve")
        serve_parser.add_argument("--port", type=int, required=True)
        serve_parser.add_argument("--db", type=Path, required=True)
        serve_parser.add_argument("--simulator", required=True)
        served = serve_parser.parse_args(raw[1:])
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve(served.port, served.db, served.simulator))
        return 0
    args = parse(raw)
    machine = print_machine("peer: DBOS Transact 3.4 (SQLite system database)")
    console.print(f"[dim]{describe_setup_peer(args)}[/]")
    runs = asyncio.run(measure_peer(args))
    console.print(results_table("DBOS: throughput and latency (intake -> Processed)", runs))
    save("peer_dbos", machine, args, runs)
    return 0 if all(r.unfinished == 0 for r in runs) else 1


def describe_setup_peer(args: argparse.Namespace) -> str:
    args.step_timeout = float("nan")
    return describe_setup(args).replace(", step timeout nan s", "")


if __name__ == "__main__":
    raise SystemExit(main())
