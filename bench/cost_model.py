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
a count or a price is a field of `Assumptions`, so the table can be recomputed with
another.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
    temporal_per_million_actions: Price = Price(
        50.0,
        "docs.temporal.io/cloud/pricing, Pay-As-You-Go, first 5M actions",
        verified=True,
    )


@dataclass(frozen=True)
class Assumptions:
    seconds_per_execution: float = 0.1
    """Billed active time per execution: awaiting the store, the broker and a remote call."""
    retry_backoff_seconds: float = 0.2
    """An agent retries a failed call within its execution (shared/resilience.py), after
    RetryPolicy.initial_backoff: billed time on Flex Consumption."""
    memory_gb: float = 2.0
    """instanceMemoryMB=2048; on demand bills it per instance while it executes, so
    concurrent executions share it: one at a time is the upper bound used here."""
    service_bus_ops_per_message: float = 3.0
    """Send, receive, complete; the triggers' empty receives are not per order."""
    sampling_ratio: float = 0.1
    """tracesSamplerArg: the share of orders traced; an order with a fault is kept whole."""
    bytes_per_span: float = 1000.0
    """Billed size of one span record (dependency or request) in Log Analytics."""
    host_records_per_execution: float = 1.0
    """The Functions host's own request record per invocation; host.json keeps Request
    out of its sampling, so every one is ingested."""
    peer_storage_transactions_per_queue_message: float = 3.0
    """Durable Functions: put, get and delete of each Azure Storage queue message."""
    peer_table_transactions_per_episode: float = 3.0
    """Durable Functions: the history query, the history batch and the instance update."""


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


def flex_lines(
    executions: float, p: Prices, a: Assumptions, extra_seconds: float = 0.0
) -> list[Line]:
    gb_seconds = (executions * a.seconds_per_execution + extra_seconds) * a.memory_gb
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
                p,
                a,
                (counts.remote_calls - STEPS) * a.retry_backoff_seconds,
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
    activity's work-item message and its result.
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
            *flex_lines(executions, p, a),
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
    args = parser.parse_args(argv)
    clean_path = args.fault_free or _latest(faulty=False)
    faulty_path = args.faulty or _latest(faulty=True)
    clean = counts_from_run(json.loads(clean_path.read_text()))
    faulty = counts_from_run(json.loads(faulty_path.read_text()))
    prices, assumptions = Prices(), Assumptions()
    print(f"<!-- from {clean_path.name} and {faulty_path.name} -->")
    print(markdown(bills(clean, faulty, prices, assumptions), faulty.faults))
    print()
    print(price_notes(prices))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
