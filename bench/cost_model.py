"""Cost per million orders in Azure, from the counts `bench.cost_per_order` saves.

    python -m bench.cost_model [--fault-free FILE] [--faulty FILE]

Without files it takes the latest `bench/results/cost_per_order-*.json` run without faults
and the latest with them. It prints the Markdown table of bench/README.md ("Cost per
million orders in Azure"): this system on Flex Consumption, Service Bus Standard and Table
Storage, with Application Insights at the default sampling, beside Durable Functions on
the Azure Storage provider, Step Functions Standard and Temporal Cloud running the same
3-step order. Prices are list prices in USD for one region (`Prices`), each with where
it was read; the counts of the other three systems come from their documented billing
rules (`peer_*`), not from a measurement. Every number that is an assumption rather than
a count or a price is a field of `Assumptions`, printed with the table, so the table can
be recomputed with another.

Flex Consumption's memory line follows its billing rule: an on-demand instance is billed
its memory while at least one execution is active on it, each active period at least 1 s,
and executions on one instance share that time. What an order keeps active is measured
(`Activity`: `bench.throughput --instrument` at an offered load), not assumed per
execution; ``--activity FILE`` takes it from other saved runs.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from bench._activity import TIMER_MARK
from bench._common import RESULTS

MILLION = 1_000_000
GB = 1_000_000_000
STEPS = 3
"""Remote steps of the order (reserve inventory, charge payment, create shipment)."""

# ---------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Price:
    usd: float
    source: str
    verified: bool
    """False: the figure could not be confirmed through a stored copy of a price page."""


@dataclass(frozen=True)
class Prices:
    """List prices, pay-as-you-go, USD, East US (AWS: US East, N. Virginia)."""

    service_bus_per_million_ops: Price = Price(
        0.80,
        "Service Bus pricing page, Standard, 13M-100M operations/month tier",
        verified=False,
    )
    service_bus_base_per_hour: Price = Price(
        0.0135,
        "Service Bus pricing page, Standard base charge (13M operations/month included)",
        verified=False,
    )
    storage_per_10k_transactions: Price = Price(
        0.00036,
        "Table Storage pricing page, LRS, per 10,000 transactions",
        verified=False,
    )
    flex_per_million_executions: Price = Price(
        0.40,
        "Azure Functions pricing page, Flex Consumption on demand, per million executions",
        verified=False,
    )
    flex_per_gb_second: Price = Price(
        0.000026,
        "Flex Consumption on demand execution time, East US (modal.com/blog/"
        "azure-function-pricing-guide, 2025-05-22, quoting the Azure page)",
        verified=True,
    )
    flex_always_ready_baseline_per_gb_second: Price = Price(
        0.000004,
        "Azure Functions pricing page, Flex Consumption always ready baseline, East US; "
        "billed only for always-ready instances, of which infra/ configures none",
        verified=False,
    )
    log_analytics_per_gb: Price = Price(
        2.30,
        "Analytics Logs ingestion, pay-as-you-go (monitoringcost.com/azure-monitor-cost, "
        "2026; first 5 GB a month free)",
        verified=True,
    )
    step_functions_per_1k_transitions: Price = Price(
        0.025,
        "aws.amazon.com/step-functions/pricing, Standard, US East (N. Virginia)",
        verified=True,
    )
    step_functions_express_per_million_requests: Price = Price(
        1.00,
        "aws.amazon.com/blogs/compute/building-cost-effective-aws-step-functions-workflows "
        "($1.00 per million invocations); aws.amazon.com/step-functions/pricing, Express",
        verified=True,
    )
    step_functions_express_per_gb_second: Price = Price(
        0.00001667,
        "aws.amazon.com/step-functions/pricing, Express duration, first 1,000 GB-hours "
        "($0.06 per GB-hour), US East (N. Virginia)",
        verified=False,
    )
    temporal_per_million_actions: Price = Price(
        50.0,
        "docs.temporal.io/cloud/pricing, Pay-As-You-Go, first 5M actions",
        verified=True,
    )


@dataclass(frozen=True)
class Activity:
    """Flex Consumption instance time one order keeps billed, at one offered load.

    Summed over the scale groups an order runs in (the HTTP group and each Service Bus
    function alone): the time each group's instance had an execution active, and that
    time as billed (`bench._activity`: periods of at least 1 s, overlapping windows once).
    """

    orders_per_second: float
    active_seconds_per_order: float
    billed_seconds_per_order: float
    scale_groups: int
    """The scale groups an order runs in (each has its own instances)."""
    source: str


_RUN = "bench.throughput --orders 400 --faults 0 --instrument --rate"
BUSY = Activity(10.0, 0.210, 0.612, 6, f"{_RUN} 10, 2026-11-26 (throughput-20261126-121726)")
"""The headline load: one instance per scale group keeps up (peak 6 of 16 concurrent)."""
MEASURED: tuple[Activity, ...] = (
    Activity(0.25, 0.219, 6.189, 6, f"{_RUN} 0.25 --orders 100, 2026-11-26"),
    Activity(1.0, 0.234, 5.952, 6, f"{_RUN} 1, 2026-11-26"),
    BUSY,
    Activity(20.0, 0.186, 0.313, 6, f"{_RUN} 20, 2026-11-26; scheduler_reply at its cap of 16"),
)
"""One runtime on the shared 2-core machine (load 1.5 to 3.8), host.json's
maxConcurrentCalls=16, 20 ms simulated latency per remote call, orders evenly spaced,
sampled tracing; the code of 6c56beb."""


def _doc(default: Any, why: str) -> Any:
    """A field whose reason is printed beside its value under the table."""
    return field(default=default, metadata={"why": why})


@dataclass(frozen=True)
class Assumptions:
    activity: Activity = field(
        default=BUSY,
        metadata={
            "why": "instance time an order keeps billed, measured at a busy offered load "
            "(the load table shows the others)"
        },
    )
    retry_backoff_seconds: float = _doc(
        0.2,
        "an agent retries a failed call within its execution (shared/resilience.py), after "
        "RetryPolicy.initial_backoff: added to the billed time, as if no other execution "
        "kept the instance active meanwhile (an upper bound)",
    )
    memory_gb: float = _doc(
        2.0, "instanceMemoryMB=2048 (infra/main.bicep): the memory each active instance is billed"
    )
    always_ready_instances: int = _doc(
        0, "infra/app/function.bicep sets no alwaysReady: no baseline, all on demand"
    )
    service_bus_ops_per_message: float = _doc(
        3.0, "send, receive, complete; the triggers' empty receives are not per order"
    )
    sampling_ratio: float = _doc(
        0.1, "tracesSamplerArg: the share of orders traced; an order with a fault is kept whole"
    )
    bytes_per_span: float = _doc(
        1000.0, "billed size of one span record (dependency or request) in Log Analytics"
    )
    host_records_per_execution: float = _doc(
        1.0,
        "the Functions host's own request record per invocation; host.json keeps Request "
        "out of its sampling, so every one is ingested",
    )
    peer_storage_transactions_per_queue_message: float = _doc(
        3.0, "Durable Functions: put, get and delete of each Azure Storage queue message"
    )
    peer_durable_scale_groups: int = _doc(
        2,
        "Durable Functions: the HTTP starter's group and the Durable group (orchestrator and "
        "activities scale together); each billed per order as one of our groups is",
    )
    peer_express_seconds: float = _doc(
        0.4,
        "Step Functions Express: one order's workflow from start to end, rounded up to 100 ms "
        "(ours takes 0.36 s median at 10 orders/s, intake to Processed, 20 ms per remote call)",
    )
    peer_express_memory_gb: float = _doc(
        0.0625,
        "Step Functions Express: a small definition and payload, billed in 64 MB chunks: one",
    )
    peer_table_transactions_per_episode: float = _doc(
        3.0, "Durable Functions: the history query, the history batch and the instance update"
    )


@dataclass(frozen=True)
class OrderCounts:
    """One order's operations in this system, as `bench.cost_per_order` counts them."""

    state_store: float
    """Table Storage transactions: writes, queries and point reads."""
    messages: float
    executions: float
    remote_calls: float
    faults: float = 0.0

    @property
    def spans(self) -> float:
        """One per invocation, state-store call, message send and remote call."""
        return self.executions + self.state_store + self.messages + self.remote_calls


def remote_calls(faults: float, steps: int = STEPS) -> float:
    """Attempts when each fails with probability `faults` and is retried until it succeeds."""
    return steps / (1.0 - faults)


def retries(faults: float, steps: int = STEPS) -> float:
    return remote_calls(faults, steps) - steps


ORDER_PARTS = ("intake", "claim", "step ")
"""The parts of `bench.cost_per_order`'s summary that belong to an order's life."""


def counts_from_run(run: Mapping[str, Any]) -> OrderCounts:
    """Per-order counts from a saved `bench.cost_per_order` run (its `summary`)."""
    totals: dict[str, float] = {}
    for name, part in run["summary"].items():
        if not name.startswith(ORDER_PARTS):
            continue  # timers (agent heartbeat, bulk actions) run per time, not per order
        for key, value in part.items():
            totals[key] = totals.get(key, 0.0) + float(value)
    if "executions" not in totals:
        raise ValueError("the run predates execution counts: run bench.cost_per_order again")
    faults = float(run.get("faults", 0.0))
    return OrderCounts(
        state_store=totals.get("writes", 0.0)
        + totals.get("queries", 0.0)
        + totals.get("point reads", 0.0),
        messages=totals.get("messages", 0.0),
        executions=totals["executions"],
        remote_calls=remote_calls(faults),
        faults=faults,
    )


# ---------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Line:
    """One meter: what an order uses of it, and what a million orders cost."""

    meter: str
    per_order: float
    unit: str
    usd_per_million_orders: float


@dataclass(frozen=True)
class Bill:
    system: str
    lines: list[Line] = field(default_factory=list)

    @property
    def total(self) -> float:
        return sum(line.usd_per_million_orders for line in self.lines)


def traced_share(faults: float, a: Assumptions, steps: int = STEPS) -> float:
    """Orders whose trace is ingested: the sampled ones, and every one with a fault."""
    with_fault = 1.0 - (1.0 - faults) ** steps
    return a.sampling_ratio + (1.0 - a.sampling_ratio) * with_fault


def flex_lines(executions: float, instance_seconds: float, p: Prices, a: Assumptions) -> list[Line]:
    """On demand: executions, and the memory of each instance for the time it is billed."""
    gb_seconds = instance_seconds * a.memory_gb
    return [
        Line(
            "Flex Consumption executions",
            executions,
            "executions",
            executions * p.flex_per_million_executions.usd,
        ),
        Line(
            "Flex Consumption memory",
            gb_seconds,
            "GB-s",
            gb_seconds * MILLION * p.flex_per_gb_second.usd,
        ),
    ]


def ours(counts: OrderCounts, p: Prices, a: Assumptions) -> Bill:
    ops = counts.messages * a.service_bus_ops_per_message
    span_bytes = counts.spans * a.bytes_per_span * traced_share(counts.faults, a)
    host_bytes = counts.executions * a.host_records_per_execution * a.bytes_per_span
    return Bill(
        "this system (Scheduler-Agent-Supervisor)",
        [
            Line(
                "Service Bus Standard operations",
                ops,
                "operations",
                ops * p.service_bus_per_million_ops.usd,
            ),
            Line(
                "Table Storage transactions",
                counts.state_store,
                "transactions",
                counts.state_store * MILLION / 10_000 * p.storage_per_10k_transactions.usd,
            ),
            *flex_lines(
                counts.executions,
                a.activity.billed_seconds_per_order
                + (counts.remote_calls - STEPS) * a.retry_backoff_seconds,
                p,
                a,
            ),
            Line(
                "Application Insights: the app's spans",
                span_bytes / 1000,
                "kB",
                span_bytes / GB * MILLION * p.log_analytics_per_gb.usd,
            ),
            Line(
                "Application Insights: the host's requests",
                host_bytes / 1000,
                "kB",
                host_bytes / GB * MILLION * p.log_analytics_per_gb.usd,
            ),
        ],
    )


def peer_durable_functions(faults: float, p: Prices, a: Assumptions) -> Bill:
    """The Azure Storage provider's documented mechanism, counted for one 3-step order.

    An HTTP starter enqueues ExecutionStarted on a control queue; each activity call is a
    work-item message, its result a control-queue message; every control message wakes
    the orchestrator for one episode (history query, history batch, instance update).
    A retry (CallActivityWithRetry) adds a durable timer message and its episode, the
    activity's work-item message and its result. On the same Flex plan its starter runs
    in the HTTP group and everything else in the one Durable group; each group's instance
    is assumed billed per order as one of ours is at the same load (not measured).
    """
    r = retries(faults)
    messages = 1 + 2 * STEPS + 3 * r
    episodes = 1 + STEPS + 2 * r
    transactions = (
        messages * a.peer_storage_transactions_per_queue_message
        + episodes * a.peer_table_transactions_per_episode
        + 1  # the starter's instance insert
    )
    executions = 1 + episodes + STEPS + r
    return Bill(
        "Durable Functions (Azure Storage provider)",
        [
            Line(
                "Storage queue and table transactions",
                transactions,
                "transactions",
                transactions * MILLION / 10_000 * p.storage_per_10k_transactions.usd,
            ),
            *flex_lines(
                executions,
                a.activity.billed_seconds_per_order
                * a.peer_durable_scale_groups
                / a.activity.scale_groups,
                p,
                a,
            ),
        ],
    )


def peer_step_functions(faults: float, p: Prices) -> Bill:
    """Three Task states and a Succeed state; each retry is one more transition."""
    transitions = STEPS + 1 + retries(faults)
    return Bill(
        "Step Functions Standard",
        [
            Line(
                "state transitions",
                transitions,
                "transitions",
                transitions * MILLION / 1000 * p.step_functions_per_1k_transitions.usd,
            )
        ],
    )


def peer_step_functions_express(faults: float, p: Prices, a: Assumptions) -> Bill:
    """One request per order; its duration grows by each retry's backoff (a Retry field
    waits inside the execution). At-least-once, 5 minutes at most: no durable history."""
    gb_seconds = (a.peer_express_seconds + retries(faults) * a.retry_backoff_seconds) * (
        a.peer_express_memory_gb
    )
    return Bill(
        "Step Functions Express",
        [
            Line(
                "requests",
                1.0,
                "requests",
                p.step_functions_express_per_million_requests.usd,
            ),
            Line(
                "duration",
                gb_seconds,
                "GB-s",
                gb_seconds * MILLION * p.step_functions_express_per_gb_second.usd,
            ),
        ],
    )


def peer_temporal(faults: float, p: Prices) -> Bill:
    """Workflow started, each activity started or retried: one action each."""
    actions = 1 + remote_calls(faults)
    return Bill(
        "Temporal Cloud",
        [
            Line(
                "actions",
                actions,
                "actions",
                actions * p.temporal_per_million_actions.usd,
            )
        ],
    )


# ---------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------


def _usd(value: float) -> str:
    return f"${value:,.2f}"


def _quantity(value: float, unit: str) -> str:
    return f"{value:,.2f} {unit}"


def bills(
    fault_free: OrderCounts, faulty: OrderCounts, p: Prices, a: Assumptions
) -> list[tuple[Bill, Bill]]:
    """Each system's bill without faults and with `faulty.faults`: that share of remote
    calls failing transiently, each retried until it succeeds."""
    f = faulty.faults
    return [
        (ours(fault_free, p, a), ours(faulty, p, a)),
        (peer_durable_functions(0.0, p, a), peer_durable_functions(f, p, a)),
        (peer_step_functions(0.0, p), peer_step_functions(f, p)),
        (peer_step_functions_express(0.0, p, a), peer_step_functions_express(f, p, a)),
        (peer_temporal(0.0, p), peer_temporal(f, p)),
    ]


def markdown(pairs: Sequence[tuple[Bill, Bill]], faults: float) -> str:
    head = (
        f"| system | meter | per order, no faults | per order, {faults:.0%} faults "
        f"| USD per million orders, no faults | USD per million orders, {faults:.0%} faults |"
    )
    rows = [head, "|---|---|---:|---:|---:|---:|"]
    for clean, faulty in pairs:
        for line, other in zip(clean.lines, faulty.lines, strict=True):
            rows.append(
                f"| {clean.system} | {line.meter} | {_quantity(line.per_order, line.unit)} "
                f"| {_quantity(other.per_order, other.unit)} "
                f"| {_usd(line.usd_per_million_orders)} | {_usd(other.usd_per_million_orders)} |"
            )
        rows.append(
            f"| **{clean.system}** | **total** | | | **{_usd(clean.total)}** "
            f"| **{_usd(faulty.total)}** |"
        )
    return "\n".join(rows)


def price_notes(p: Prices) -> str:
    lines = []
    for name in Prices.__dataclass_fields__:
        price: Price = getattr(p, name)
        mark = "" if price.verified else " (not verified)"
        lines.append(f"- `{name}` = {price.usd:g}: {price.source}{mark}")
    return "\n".join(lines)


MONTH_SECONDS = 30 * 86_400


def always_ready_per_month(p: Prices, a: Assumptions) -> str:
    """Not per order: the baseline is billed whether the instances execute or not."""
    usd = (
        a.always_ready_instances
        * a.memory_gb
        * MONTH_SECONDS
        * p.flex_always_ready_baseline_per_gb_second.usd
    )
    return (
        f"Always-ready baseline, not per order: {a.always_ready_instances} instances x "
        f"{a.memory_gb:g} GB x 30 days = {_usd(usd)} a month"
    )


def assumption_notes(a: Assumptions) -> str:
    lines = []
    for f in fields(Assumptions):
        value = getattr(a, f.name)
        if isinstance(value, Activity):
            value = (
                f"{value.billed_seconds_per_order:.3g} billed instance-s per order at "
                f"{value.orders_per_second:g} orders/s ({value.source})"
            )
        lines.append(f"- `{f.name}` = {value}: {f.metadata['why']}")
    return "\n".join(lines)


OLD_SECONDS_PER_EXECUTION = 0.1
"""What the model assumed before it measured: 0.1 s billed per execution, one at a time."""


def load_table(counts: OrderCounts, p: Prices, a: Assumptions, measured: Sequence[Activity]) -> str:
    """The Flex memory line, and the totals it moves, by offered load (no faults)."""
    rows = [
        "| offered load | active instance-s per order | billed instance-s per order "
        "| GB-s per order | Flex memory, USD per million orders "
        "| this system's total, USD per million orders "
        "| Durable Functions' total, USD per million orders |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    old = counts.executions * OLD_SECONDS_PER_EXECUTION
    cases = [
        (
            f"before: {OLD_SECONDS_PER_EXECUTION:g} s per execution, assumed",
            # As many groups as Durable Functions has: its line is then the old rule's too
            # (its 8 executions x 0.1 s, as ours).
            Activity(0.0, math.nan, old, a.peer_durable_scale_groups, "assumed"),
        )
    ]
    cases += [
        (f"{m.orders_per_second:g} orders/s, measured", m)
        for m in sorted(measured, key=lambda m: m.orders_per_second)
    ]
    for label, activity in cases:
        at_load = replace(a, activity=activity)
        bill = ours(counts, p, at_load)
        durable = peer_durable_functions(0.0, p, at_load)
        memory = next(line for line in bill.lines if line.meter == "Flex Consumption memory")
        active = activity.active_seconds_per_order
        rows.append(
            f"| {label} | {'-' if math.isnan(active) else f'{active:.3f}'} "
            f"| {activity.billed_seconds_per_order:.3f} "
            f"| {memory.per_order:.2f} | {_usd(memory.usd_per_million_orders)} "
            f"| {_usd(bill.total)} | {_usd(durable.total)} |"
        )
    return "\n".join(rows)


def activity_from_run(run: Mapping[str, Any], source: str) -> Activity:
    """What one saved `bench.throughput --instrument` run measured (its first run)."""
    first = run["runs"][0]
    groups = first.get("functions", {}).get("activity")
    if not groups:
        raise ValueError("the run has no activity: run bench.throughput with --instrument")
    orders = max(int(first["processed"]), 1)
    per_order = {k: v for k, v in groups.items() if not k.endswith(TIMER_MARK)}
    return Activity(
        orders_per_second=float(run["args"]["rate"] or first["throughput"]),
        active_seconds_per_order=sum(g["active_seconds"] for g in per_order.values()) / orders,
        billed_seconds_per_order=sum(g["billed_seconds"] for g in per_order.values()) / orders,
        scale_groups=sum(1 for g in per_order.values() if g["executions"]),
        source=source,
    )


def _latest(faulty: bool) -> Path:
    for path in sorted(RESULTS.glob("cost_per_order-*.json"), reverse=True):
        run = json.loads(path.read_text())
        if (
            "executions" in json.dumps(run.get("summary", {}))
            and (float(run.get("faults", 0.0)) > 0) == faulty
        ):
            return path
    raise SystemExit(f"no saved bench.cost_per_order run {'with' if faulty else 'without'} faults")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cost_model", description=__doc__)
    parser.add_argument("--fault-free", type=Path, help="a cost_per_order result without faults")
    parser.add_argument("--faulty", type=Path, help="a cost_per_order result with --faults")
    parser.add_argument(
        "--activity",
        type=Path,
        action="append",
        help="a bench.throughput --instrument result, instead of the built-in measurements "
        "(repeatable: one per offered load)",
    )
    args = parser.parse_args(argv)
    clean_path = args.fault_free or _latest(faulty=False)
    faulty_path = args.faulty or _latest(faulty=True)
    clean = counts_from_run(json.loads(clean_path.read_text()))
    faulty = counts_from_run(json.loads(faulty_path.read_text()))
    measured, headline = MEASURED, BUSY
    if args.activity:
        measured = tuple(
            activity_from_run(json.loads(path.read_text()), path.name) for path in args.activity
        )
        headline = max(measured, key=lambda m: m.orders_per_second)
    prices, assumptions = Prices(), Assumptions(activity=headline)
    print(f"<!-- from {clean_path.name} and {faulty_path.name} -->")
    print(markdown(bills(clean, faulty, prices, assumptions), faulty.faults))
    print()
    print(load_table(clean, prices, assumptions, measured))
    print()
    print(always_ready_per_month(prices, assumptions))
    print()
    print(price_notes(prices))
    print()
    print(assumption_notes(assumptions))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
