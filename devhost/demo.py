"""`python -m devhost demo`: a few hundred orders through faults, watched as they heal.

It talks to the system only the way a user would: HTTP to the app (7071), the
simulator's control API (7072) and the local broker's control API (7073).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import os
import random
import sys
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import aiohttp
from rich.console import Console, Group
from rich.live import Live
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from devhost.harness.clients import (
    TERMINAL,
    AppClient,
    BrokerControl,
    ControlError,
    SimulatorControl,
)
from devhost.harness.load import (
    Fetch,
    Load,
    LoadRun,
    OrderPolling,
    Retry,
    SubmitError,
    Tracked,
    parse_time,
)
from devhost.harness.process import Child, StartError
from devhost.harness.services import trace_query_url
from devhost.services import OTLP_DEFAULT_PORT
from shared.catalogue import FILE_SETTING, catalogue_file
from shared.contract import Setting
from shared.domain.principal import PRINCIPAL_HEADER, Role, encode_client_principal

ROOT = Path(__file__).resolve().parent.parent
DECLINED_SKU = "CARD-DECLINED"
T = TypeVar("T")

# Faults: remote transient errors and latency everywhere, hangs past the deadline at
# payment and shipping (some at payment after charging, so the reply is lost), permanent
# failures for one SKU, and duplicated deliveries.
SIM_FAULTS: dict[str, dict[str, Any]] = {
    "inventory": {"transientErrorRate": 0.15, "latencyMs": 20, "latencyJitterMs": 40},
    "payment": {
        "transientErrorRate": 0.10,
        "hangRate": 0.04,
        "applyThenHangRate": 0.02,
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
SIM_FAULTS["notifications"] = {"transientErrorRate": 0.10, "latencyMs": 10}
EXPRESS = "express-delivery"
EXPRESS_EVERY = 4
"""Every fourth order runs the second shipped workflow: create-shipment is its pivot and
notify-customer, a retriable step, gets the tracking number the shipment returned."""
REVIEWED = "reviewed-order"
SCHEDULED = "scheduled-delivery"
WAIT_EVERY = 8
"""In every eight orders one waits for a person's approval (reviewed-order) and one for
its ship date (scheduled-delivery, notBefore 10-20 s after the order is planned)."""
EXPIRING = "quick-review"
"""The demo's own workflow: reviewed-order with a 20 s review that nobody answers for one
order, so a wait's deadline is seen passing (the shipped review waits a day). It exists
only in the catalogue the demo gives a runtime it starts (.devhost/demo-catalogue.json)."""
EXPIRING_SECONDS = 20
EXPIRING_ORDER = 13
REJECT_EVERY = 4
"""One approval in four is a rejection: the reservation is released."""
OUTAGE = {"hangRate": 1.0, "latencyMs": 30, "permanentFailureSkus": [DECLINED_SKU]}
"""A third of the way in, every charge at the primary payment provider hangs for
OUTAGE_SECONDS while its read API still answers (its breaker stays closed: hangs are cut
by the step's complete-by, not failures): the Supervisor asks about each in-flight
charge, hears "not applied" and retries it at the secondary."""
OUTAGE_SECONDS = 12.0
HIGH_PRIORITY_EVERY = 10
BROKER_FAULTS = {"duplicateRate": 0.05}
SUBMIT_RATE = 25.0
"""Orders per second: a steady stream, as a shop sends them, rather than one burst."""
MAX_IN_FLIGHT = 60
"""Closed loop: at most this many orders open at once, so a slow machine shows the
pattern healing faults rather than a queue growing faster than it drains."""
LOAD = Load(rate=SUBMIT_RATE, concurrency=MAX_IN_FLIGHT, submitting=16)
SUBMIT_RETRY = Retry(attempts=5, step=0.5)
STARTUP_SECONDS = 120.0
RESUBMIT_WAIT_SECONDS = 60
STATES = ("Pending", "Processing", "Compensating", "Processed", "Compensated", "Error")
DEMO_TIMINGS = {
    "StepTimeoutSeconds": "8",
    "PendingTimeoutSeconds": "20",
    "SupervisorSchedule": "*/2 * * * * *",
    "MaxFailureCount": "3",
}
QUIET = (aiohttp.ClientError, TimeoutError, OSError, ControlError)
"""What a control call may fail with when the demo can do without its answer."""


DEFAULT_APP_PORT = 7071


@dataclass
class Endpoints:
    app: str = f"http://127.0.0.1:{DEFAULT_APP_PORT}"
    simulator: str = "http://127.0.0.1:7072"
    broker: str = "http://127.0.0.1:7073"
    traces: str = trace_query_url(OTLP_DEFAULT_PORT)


@dataclass
class Demo:
    """One demo run: where it talks to, its orders, and what it saw of them."""

    console: Console
    app: AppClient
    simulator: SimulatorControl
    broker: BrokerControl
    api: str
    run: str
    orders: list[Tracked]
    declined: set[int]
    views: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    broker_before: dict[str, Any] = field(default_factory=dict)
    broker_faults: bool = False
    errors: int = 0
    resubmitted: int = 0
    elapsed: float = 0.0


async def _quiet(call: Awaitable[T], default: T) -> T:
    try:
        return await call
    except QUIET:
        return default


# -- the runtime -----------------------------------------------------------------------------


async def _up(app: AppClient) -> bool:
    try:
        status, _ = await asyncio.wait_for(app.health(), 2)
    except QUIET:
        return False
    return status == 200


def _demo_catalogue() -> Path:
    """The shipped catalogue plus EXPIRING, for a runtime the demo starts."""
    doc = json.loads(catalogue_file().read_text(encoding="utf-8"))
    reviewed = next(w for w in doc["workflows"] if w["name"] == REVIEWED)
    quick = copy.deepcopy(reviewed) | {"name": EXPIRING, "$comment": "demo only"}
    review = next(s for s in quick["steps"] if s.get("kind") == "event")
    review["timeoutSeconds"] = EXPIRING_SECONDS
    doc["workflows"].append(quick)
    path = ROOT / ".devhost" / "demo-catalogue.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2), encoding="utf-8")
    return path


@dataclass(frozen=True)
class Target:
    """The runtime the demo finds on ``port`` or starts there, with its state in
    ``state_dir`` (the runtime's default when None)."""

    port: int = DEFAULT_APP_PORT
    state_dir: Path | None = None

    @property
    def log_path(self) -> Path:
        return (self.state_dir or ROOT / ".devhost") / "demo-runtime.log"

    def command(self, fresh: bool) -> list[str]:
        state = ["--state-dir", str(self.state_dir)] if self.state_dir is not None else []
        fresh_flag = ["--fresh"] if fresh else []
        return [sys.executable, "-m", "devhost", *fresh_flag, "--port", str(self.port), *state]


def _start_runtime(console: Console, fresh: bool, target: Target) -> Child:
    console.print(f"[dim]starting the local runtime (log: {target.log_path})[/]")
    env = {k: os.environ.get(k, v) for k, v in DEMO_TIMINGS.items()}
    env.setdefault(FILE_SETTING, str(_demo_catalogue()))
    child = Child("runtime", target.command(fresh), target.log_path, env=env)
    child.start()
    return child


async def _wait_until_up(app: AppClient, child: Child | None) -> None:
    try:
        await app.wait_healthy(timeout=STARTUP_SECONDS, child=child)
    except StartError as exc:
        if child is not None and not child.alive():
            raise SystemExit(
                f"the local runtime exited with {child.returncode}; see {child.log_path}"
            ) from exc
        raise SystemExit(
            f"the local runtime did not answer on /api/health within {STARTUP_SECONDS:.0f} s"
        ) from exc


DEMO_READER = "reader@demo.local"
DEMO_OPERATOR = "operator@demo.local"


# -- plan and faults -------------------------------------------------------------------------


def _order_body(
    order_id: str,
    rng: random.Random,
    declined: bool,
    high: bool = False,
    workflow: str | None = None,
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
    return (
        body | ({"priority": "high"} if high else {}) | ({"workflow": workflow} if workflow else {})
    )


def _plan(run: str, count: int, rng: random.Random) -> tuple[list[Tracked], set[int]]:
    """One order in twenty has the declined card; every tenth is high priority."""
    declined = set(rng.sample(range(count), max(1, count // 20)))
    orders = []
    for i in range(count):
        order_id = f"demo-{run}-{i:04d}"
        high = i % HIGH_PRIORITY_EVERY == 0
        workflow = EXPRESS if i % EXPRESS_EVERY == 1 else None
        if i % WAIT_EVERY == 3:
            workflow = REVIEWED
        elif i % WAIT_EVERY == 7:
            workflow = SCHEDULED
        body = _order_body(order_id, rng, i in declined, high, workflow)
        if workflow == SCHEDULED:
            later = datetime.now(UTC) + timedelta(seconds=10 + i / SUBMIT_RATE + rng.uniform(0, 10))
            body["notBefore"] = later.isoformat()
        orders.append(Tracked(order_id, body))
    return orders, declined


def _announce(console: Console) -> None:
    console.rule("[bold]Scheduler-Agent-Supervisor demo")
    console.print(
        "Faults switched on: 10-15% transient errors at every remote service, hangs past the "
        "step deadline at payment (4%) and shipping (3%), latency spikes, a SKU whose card is "
        f"always declined ({DECLINED_SKU}), and 5% of broker messages delivered twice. "
        f"A third of the way in, every charge at the primary payment provider hangs for "
        f"{OUTAGE_SECONDS:.0f} s: the Supervisor asks it about each charge in doubt and, "
        "told it was not applied, retries it at the secondary provider. Every "
        f"{HIGH_PRIORITY_EVERY}th order is high priority (its own agent queues), and every "
        f"{EXPRESS_EVERY}th runs the {EXPRESS} workflow (a pivot, then a retriable "
        "notification that takes the shipment's tracking number). In every "
        f"{WAIT_EVERY} orders one waits for a reviewer's approval ({REVIEWED}; a reviewer "
        f"approves most, rejects one in {REJECT_EVERY}) and one for its ship date "
        f"({SCHEDULED})."
    )


async def _switch_on(demo: Demo) -> None:
    await _quiet(demo.simulator.clear_stats(), None)
    for service, faults in SIM_FAULTS.items():
        await _control(demo.simulator.set_faults(service, **faults))
    demo.broker_before = await _quiet(demo.broker.stats(), {})
    try:
        await demo.broker.set_faults(BROKER_FAULTS)
        demo.broker_faults = True
    except QUIET:
        demo.console.print(
            "[yellow]no local broker control API: message duplication not injected[/]"
        )


async def _control(call: Awaitable[object]) -> None:
    try:
        await call
    except ControlError as exc:
        raise SystemExit(str(exc)) from exc


async def _switch_off(simulator: SimulatorControl, broker: BrokerControl) -> None:
    await _quiet(simulator.clear_faults(), None)
    await _quiet(broker.clear_faults(), None)


async def _payment_outage(simulator: SimulatorControl, count: int, console: Console) -> None:
    await asyncio.sleep(count / 3 / SUBMIT_RATE)
    console.print("[red]payment provider outage: every charge hangs[/]")
    await _control(simulator.set_faults("payment", **OUTAGE))
    await asyncio.sleep(OUTAGE_SECONDS)
    await _control(simulator.set_faults("payment", **SIM_FAULTS["payment"]))
    console.print("[green]payment provider back: work moves back to it[/]")


async def _reviewer(
    demo: Demo, session: aiohttp.ClientSession, accepted: asyncio.Queue[Tracked]
) -> None:
    """A person at the review queue: each reviewed order is answered as it is accepted,
    half of them two seconds later, so some events arrive before the order reaches its
    review (kept for its step) and some while it waits; one in four is a rejection."""
    n = 0
    while True:
        order = await accepted.get()
        if order.body.get("workflow") != REVIEWED or order.accepted is None:
            continue
        n += 1
        if n % 2:
            await asyncio.sleep(2.0)
        approved = n % REJECT_EVERY != REJECT_EVERY - 1
        url = f"{demo.api}/orders/{quote(order.order_id)}/events/review"
        body = {"eventId": f"demo:{order.order_id}", "data": {"approved": approved, "by": "demo"}}
        with contextlib.suppress(*QUIET):
            async with session.post(url, json=body) as response:
                await response.read()


# -- the load, shown as it goes --------------------------------------------------------------


def _counts_table(orders: list[Tracked]) -> Table:
    counts = Counter(o.state or "Pending" for o in orders)
    table = Table(title="orders by process state", show_edge=False)
    for state in STATES:
        table.add_column(state, justify="right")
    table.add_row(*(str(counts.get(s, 0)) for s in STATES))
    return table


def _reader(app: AppClient) -> Fetch:
    async def read(order_id: str) -> Mapping[str, Any] | None:
        return await _quiet(app.order(order_id), None)

    return read


async def _show(live: Live, progress: Progress, task: TaskID, orders: list[Tracked]) -> None:
    while True:
        await asyncio.sleep(1)
        progress.update(task, completed=sum(o.state in TERMINAL for o in orders))
        live.update(Group(progress, _counts_table(orders)))


async def _run_load(demo: Demo, session: aiohttp.ClientSession, timeout: float) -> None:
    count = len(demo.orders)
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=demo.console,
    )
    submitted = progress.add_task("submitted", total=count)
    accepted: asyncio.Queue[Tracked] = asyncio.Queue()

    def on_submitted(order: Tracked) -> None:
        progress.advance(submitted)
        accepted.put_nowait(order)

    finished = progress.add_task("finished ", total=count)
    load = LoadRun(
        demo.orders,
        LOAD,
        [("app", demo.api)],
        timeout=timeout,
        done_states=TERMINAL,
        retry=SUBMIT_RETRY,
        on_submitted=on_submitted,
    )
    polling = OrderPolling(_reader(demo.app), load.pending)
    started = time.monotonic()
    with Live(
        Group(progress, _counts_table(demo.orders)), console=demo.console, refresh_per_second=4
    ) as live:
        jobs = [
            asyncio.create_task(_payment_outage(demo.simulator, count, live.console)),
            asyncio.create_task(_reviewer(demo, session, accepted)),
            asyncio.create_task(_show(live, progress, finished, demo.orders)),
        ]
        try:
            await load.run(session, polling)
        except SubmitError as exc:
            raise SystemExit(str(exc)) from exc
        finally:
            for job in jobs:
                job.cancel()
        progress.update(finished, completed=sum(o.state in TERMINAL for o in demo.orders))
        live.update(Group(progress, _counts_table(demo.orders)))
    demo.console.print()
    demo.elapsed = time.monotonic() - started
    demo.views = polling.views


def _signed_in() -> bool:
    """`OperatorAuth=dev-header bin/demo`: the runtime the demo starts checks roles, and
    the demo shows it (docs/sign-in.md)."""
    return os.environ.get(Setting.OPERATOR_AUTH, "").strip().lower() == "dev-header"


async def _reader_then_operator(demo: Demo, order_id: str) -> Mapping[str, str]:
    """A reader tries first and is refused; the headers of the operator who then acts."""
    reader = {PRINCIPAL_HEADER: encode_client_principal(DEMO_READER, [Role.READ.value])}
    status, answer = await demo.app.resubmit(order_id, reader)
    demo.console.print(
        f"  {DEMO_READER} ({Role.READ.value}) tries to resubmit {order_id}: HTTP {status}"
        + (f", {answer.get('detail')}" if status >= 400 else "")
    )
    demo.console.print(f"  {DEMO_OPERATOR} ({Role.OPERATE.value}) resubmits them")
    return {PRINCIPAL_HEADER: encode_client_principal(DEMO_OPERATOR, [Role.OPERATE.value])}


async def _operator_resubmits(demo: Demo) -> None:
    """Orders in Error wait for an operator: the faults are cleared and they go again."""
    errors = [o for o in demo.orders if o.state == "Error"]
    demo.errors = len(errors)
    if not errors:
        return
    demo.console.print(
        f"{len(errors)} order(s) in Error: an operator clears the faults and resubmits them"
    )
    await _quiet(demo.simulator.clear_faults(), None)
    operator: Mapping[str, str] = {}
    if _signed_in():
        operator = await _reader_then_operator(demo, errors[0].order_id)
    for order in errors:
        status, _ = await demo.app.resubmit(order.order_id, operator)
        demo.resubmitted += status == 202

    async def refresh(order: Tracked) -> None:
        view = await _reader(demo.app)(order.order_id)
        if view is not None:
            demo.views[order.order_id] = view
            order.state = str(view["processState"])

    for _ in range(RESUBMIT_WAIT_SECONDS):
        await asyncio.sleep(1)
        await asyncio.gather(*(refresh(o) for o in errors))
        if all(o.state in TERMINAL - {"Error"} for o in errors):
            break


# -- the summary -----------------------------------------------------------------------------


def _latency(view: Mapping[str, Any] | None) -> float | None:
    if not view or view.get("processState") not in TERMINAL:
        return None
    return (parse_time(view["updatedAt"]) - parse_time(view["createdAt"])).total_seconds()


def _percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[index]


def _broker_delta(before: Any, after: Any, key: str) -> int:
    def total(stats: Any) -> int:
        queues = stats.get("queues", stats) if isinstance(stats, dict) else {}
        return sum(int(q.get(key, 0)) for q in queues.values() if isinstance(q, dict))

    return max(0, total(after) - total(before))


@dataclass
class Figures:
    """What the summary reports, gathered from the app, the simulator and the broker."""

    counts: Counter[str]
    applied_twice: int
    by_two_providers: int
    """An order's operation applied at two services: a retry moved after a guess."""
    keys_twice: int
    by_secondary: int
    retries: int
    recoveries: int
    in_doubt: Counter[str]
    """In-doubt steps by how their service answered: applied, not-applied, unanswered."""
    duplicates: int
    latencies: list[float]
    high: list[float]
    normal: list[float]


async def _figures(demo: Demo) -> Figures:
    effects = await _quiet(demo.simulator.effects(), [])
    mine = [e for e in effects if str(e.get("orderId", "")).startswith(f"demo-{demo.run}-")]
    sim_stats = await _quiet(demo.simulator.stats(), {})
    broker_after = await _quiet(demo.broker.stats(), {})
    views = [demo.views.get(o.order_id) for o in demo.orders]
    latency = [_latency(v) for v in views]
    return Figures(
        counts=Counter(o.state or "Pending" for o in demo.orders),
        applied_twice=sum(1 for e in mine if int(e.get("applied", 0)) > 1),
        by_two_providers=sum(
            1
            for n in Counter(
                (e["orderId"], e["operation"]) for e in mine if int(e.get("applied", 0))
            ).values()
            if n > 1
        ),
        # A retry moved to another provider keeps its key: one key, two ledger rows.
        keys_twice=sum(
            1
            for n in Counter(
                (order, operation)
                for order, operation, _ in {
                    (e["orderId"], e["operation"], e["idempotencyKey"]) for e in mine
                }
            ).values()
            if n > 1
        ),
        by_secondary=sum(
            1
            for e in mine
            if e.get("service") == "payment-secondary"
            and e.get("operation") == "charge-payment"
            and int(e.get("applied", 0)) == 1
        ),
        retries=sum(
            int(s.get("transientErrors", 0)) + int(s.get("transientErrorsAfterApply", 0))
            for s in sim_stats.values()
            if isinstance(s, dict)
        ),
        recoveries=sum(
            1 for v in views for h in (v or {}).get("history", []) if h.get("event") == "timed-out"
        ),
        in_doubt=Counter(
            h["event"].removeprefix("in-doubt-")
            for v in views
            for h in (v or {}).get("history", [])
            if str(h.get("event", "")).startswith("in-doubt-")
        ),
        duplicates=_broker_delta(demo.broker_before, broker_after, "duplicatesSuppressed")
        + _broker_delta(demo.broker_before, broker_after, "duplicated"),
        latencies=[v for v in latency if v is not None],
        high=[v for i, v in enumerate(latency) if i % HIGH_PRIORITY_EVERY == 0 and v],
        normal=[v for i, v in enumerate(latency) if i % HIGH_PRIORITY_EVERY and v],
    )


def _summary(demo: Demo, f: Figures) -> Table:
    count = len(demo.orders)
    summary = Table(title=f"demo summary ({count} orders, {demo.elapsed:.1f} s)", show_header=False)
    summary.add_column("what")
    summary.add_column("figure", justify="right")
    rows = [
        ("Processed", f.counts.get("Processed", 0)),
        (f"  of them on {EXPRESS} (pivot, then notify-customer)", _processed_on(demo, EXPRESS)),
        (f"  of them on {REVIEWED} (approved by a reviewer)", _processed_on(demo, REVIEWED)),
        (f"  of them on {SCHEDULED} (shipped after notBefore)", _processed_on(demo, SCHEDULED)),
        (
            f"reviews rejected (compensated, 1 in {REJECT_EVERY})",
            _ended_on(demo, REVIEWED, "Compensated"),
        ),
        (
            f"reviews unanswered for {EXPIRING_SECONDS} s (wait-expired, compensated)",
            _ended_on(demo, EXPIRING, "Compensated"),
        ),
        (f"Compensated (card declined: {len(demo.declined)} orders)", f.counts["Compensated"]),
        ("Error (operator alerted)", demo.errors),
        ("  resubmitted by the operator and finished", demo.resubmitted),
        ("not finished", count - sum(f.counts[s] for s in TERMINAL)),
        ("transient faults absorbed by agent retries", f.retries),
        ("Supervisor recoveries (deadline passed, step retried)", f.recoveries),
        (
            "in-doubt steps resolved",
            f"{f.in_doubt.total()} (applied {f.in_doubt['applied']}, "
            f"abandoned {f.in_doubt['abandoned']}, not applied {f.in_doubt['not-applied']}, "
            f"no answer {f.in_doubt['unanswered']})",
        ),
        ("duplicate deliveries injected / dropped by the broker", f.duplicates),
        ("charged by the secondary payment provider", f.by_secondary),
        (
            "latency p50: high priority / normal (s)",
            f"{_percentile(f.high, 50):.2f} / {_percentile(f.normal, 50):.2f}",
        ),
        (
            "latency p50 / p95 / p99 (s)",
            " / ".join(f"{_percentile(f.latencies, p):.2f}" for p in (50, 95, 99)),
        ),
        ("remote effects applied more than once", f.applied_twice),
        ("orders x operations applied by two providers", f.by_two_providers),
        ("orders x operations with more than one idempotency key", f.keys_twice),
    ]
    for what, figure in rows:
        summary.add_row(what, str(figure))
    return summary


def _processed_on(demo: Demo, workflow: str) -> int:
    return _ended_on(demo, workflow, "Processed")


def _ended_on(demo: Demo, workflow: str, state: str) -> int:
    return sum(
        1
        for o in demo.orders
        if o.body.get("workflow") == workflow
        and (demo.views.get(o.order_id) or {}).get("processState") == state
    )


def _print_slowest(demo: Demo, traces: str = Endpoints.traces) -> None:
    """Name the slowest finished order and where to see why: the operator page's order
    view (its steps, history and trace waterfall) and the raw spans."""
    timed = [
        (latency, order.order_id)
        for order in demo.orders
        if (latency := _latency(demo.views.get(order.order_id))) is not None
    ]
    if not timed:
        return
    latency, order_id = max(timed)
    view = demo.views.get(order_id) or {}
    trace_id = view.get("traceId")
    spans = f"{traces}/{trace_id}" if trace_id else f"{traces}?orderId={quote(order_id)}"
    demo.console.print(
        f"slowest order: [bold]{order_id}[/] ({latency:.2f} s, {view.get('processState')}); "
        f"its timeline: {demo.api}/ops?order={quote(order_id)}\n"
        f"  its spans (JSON): {spans}"
    )


# -- the run ---------------------------------------------------------------------------------


async def _drive(demo: Demo, session: aiohttp.ClientSession, timeout: float) -> int:
    _announce(demo.console)
    await _switch_on(demo)
    await _run_load(demo, session, timeout)
    if demo.broker_faults:
        await _quiet(demo.broker.clear_faults(), None)
    await _operator_resubmits(demo)
    figures = await _figures(demo)
    demo.console.print(_summary(demo, figures))
    _print_slowest(demo)
    unfinished = sum(1 for o in demo.orders if o.state not in TERMINAL)
    return 1 if unfinished or figures.applied_twice or figures.by_two_providers else 0


async def run_demo(
    orders: int, seed: int, fresh: bool, keep: bool, timeout: float, target: Target = Target()
) -> int:
    console = Console()
    ends = Endpoints(app=f"http://127.0.0.1:{target.port}")
    run = uuid.uuid4().hex[:6]
    planned, declined = _plan(run, orders, random.Random(seed))
    connector = aiohttp.TCPConnector(limit=64)
    async with aiohttp.ClientSession(connector=connector) as session:
        api = f"{ends.app}/api"
        demo = Demo(
            console,
            AppClient(session, api),
            SimulatorControl(session, ends.simulator),
            BrokerControl(session, ends.broker),
            api,
            run,
            planned,
            declined,
        )
        child = None if await _up(demo.app) else _start_runtime(console, fresh, target)
        try:
            await _wait_until_up(demo.app, child)
            if child is not None and len(planned) > EXPIRING_ORDER:
                planned[EXPIRING_ORDER].body["workflow"] = EXPIRING
            return await _drive(demo, session, timeout)
        finally:
            await _switch_off(demo.simulator, demo.broker)
            if child is not None and not keep:
                console.print("[dim]stopping the local runtime[/]")
                child.stop(timeout=30)


def main(
    orders: int = 200,
    seed: int = 7,
    fresh: bool = False,
    keep: bool = False,
    timeout: float = 300,
    target: Target = Target(),
) -> int:
    return asyncio.run(run_demo(orders, seed, fresh, keep, timeout, target))
