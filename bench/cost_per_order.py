"""State-store operations, messages and executions per order, per function and per step.

    python -m bench.cost_per_order [--orders 200] [--quick] [--faults 0.1]

The runtime runs as ``bench.instrumented_runtime``: the real Table adapter (against
Azurite) and the real Service Bus adapter (against the local broker), each wrapped in a
counting decorator that attributes every call to the function (and workflow step) that
made it. After a warm-up the counters are reset, ``--orders`` orders go through without
faults (or with ``--faults``: that share of remote calls failing transiently at all three
services, as ``bench.compare --faults`` does), and the counts are divided by the number of
orders. The adapter's own ``operations`` counter and the broker's per-queue counters are
printed beside them as a cross-check, and the result is set against the aim: at most 2
state-store writes per step plus 2 per order, and a claim that needs no query.
``python -m bench.cost_model`` turns the saved counts into a cost per million orders in Azure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from collections import Counter
from typing import Any

import aiohttp

from bench._common import RESULTS, console, fmt, print_machine, table
from bench._instrument import TABLE_KIND
from bench._stack import BenchStack, Timings, set_faults
from devhost.harness.load import Load, StatusQueue, run_load
from shared.catalogue import catalogue_file, load

ORDER_FULFILMENT = load(catalogue_file()).default_workflow()

STEPS = [s.name for s in ORDER_FULFILMENT.steps]
OPS = ("load", "create", "save", "watch", "reschedule", "unwatch")


def _group(role: str) -> str:
    """Which part of an order's life a function invocation belongs to."""
    if role == "submit_order_http":
        return "intake (POST /api/orders)"
    if role == "scheduler_nudge":
        return f"claim + dispatch of {STEPS[0]}"
    for step in STEPS:
        if role.endswith(f"({step})"):
            return f"step {step} (agent + reply)"
    return role


def _table_ops(role: dict[str, Any]) -> Counter[str]:
    out: Counter[str] = Counter()
    for op, s in role["ops"].items():
        out[TABLE_KIND.get(op, "other")] += int(s["table_ops"])
    return out


def _order_roles(roles: dict[str, Any]) -> list[str]:
    rank = ["submit_order_http", "scheduler_nudge"]
    for step in STEPS:
        rank += [r for r in roles if r.endswith(f"({step})") and "agent" in r]
        rank += [r for r in roles if r.endswith(f"({step})") and "agent" not in r]
    return [r for r in rank if r in roles] + sorted(r for r in roles if r not in rank)


def _orders_label(orders: int, faults: float) -> str:
    return f"{orders} fault-free orders" if not faults else f"{orders} orders, {faults:.0%} faults"


def function_table(roles: dict[str, Any], orders: int, faults: float = 0.0) -> Any:
    t = table(
        f"per order, by function (mean over {_orders_label(orders, faults)})",
        [
            "function (step)",
            "calls",
            *OPS,
            "TS writes",
            "TS queries",
            "TS point reads",
            "entities written",
            "messages sent",
        ],
    )
    for name in _order_roles(roles):
        role = roles[name]
        if name in ("supervisor", "health", "get_order"):
            continue
        ops = role["ops"]
        kinds = _table_ops(role)
        written = sum(int(s["entities"]) for op, s in ops.items() if TABLE_KIND.get(op) == "write")
        t.add_row(
            name,
            fmt(role["invocations"] / orders, 2),
            *(fmt(int(ops[op]["calls"]) / orders, 2) if op in ops else "" for op in OPS),
            fmt(kinds["write"] / orders, 2),
            fmt(kinds["query"] / orders, 2),
            fmt(kinds["point read"] / orders, 2),
            fmt(written / orders, 1),
            fmt(sum(role["sent"].values()) / orders, 2),
        )
    return t


def summarize(roles: dict[str, Any], orders: int) -> dict[str, dict[str, float]]:
    groups: dict[str, Counter[str]] = {}
    for name, role in roles.items():
        if name in ("supervisor", "health", "get_order"):
            continue
        group = groups.setdefault(_group(name), Counter())
        kinds = _table_ops(role)
        group["writes"] += kinds["write"]
        group["queries"] += kinds["query"]
        group["point reads"] += kinds["point read"]
        group["entities written"] += sum(
            int(s["entities"]) for op, s in role["ops"].items() if TABLE_KIND.get(op) == "write"
        )
        group["messages"] += sum(role["sent"].values())
        group["executions"] += role["invocations"]
        group["conflicts"] += sum(int(s["conflicts"]) for s in role["ops"].values())
    return {g: {k: v / orders for k, v in c.items()} for g, c in groups.items()}


def steps_table(summary: dict[str, dict[str, float]]) -> Any:
    t = table(
        "per order, by part of the workflow",
        [
            "part",
            "writes",
            "queries",
            "point reads",
            "entities written",
            "messages sent",
            "executions",
        ],
    )
    total: dict[str, float] = {}
    for group, values in summary.items():
        t.add_row(
            group,
            *(
                fmt(values.get(k, 0), 2)
                for k in (
                    "writes",
                    "queries",
                    "point reads",
                    "entities written",
                    "messages",
                    "executions",
                )
            ),
        )
        for k, v in values.items():
            total[k] = total.get(k, 0.0) + v
    t.add_row(
        "[bold]whole order[/]",
        *(
            f"[bold]{fmt(total.get(k, 0), 2)}[/]"
            for k in (
                "writes",
                "queries",
                "point reads",
                "entities written",
                "messages",
                "executions",
            )
        ),
    )
    return t


def aim_table(summary: dict[str, dict[str, float]], roles: dict[str, Any], orders: int) -> Any:
    steps = len(STEPS)
    intake = summary.get("intake (POST /api/orders)", {})
    writes = sum(v.get("writes", 0) for v in summary.values())
    step_writes = writes - intake.get("writes", 0)
    nudge = roles.get("scheduler_nudge", {"ops": {}, "invocations": 0})
    claims = max(int(nudge["invocations"]), 1)
    claim_queries = _table_ops(nudge)["query"] / claims
    claim_reads = _table_ops(nudge)["point read"] / claims
    t = table(
        "against the aim",
        ["aim", "measured", "where we stand"],
        right_from=3,
    )

    def verdict(ok: bool, gap: str) -> str:
        return "[green]met[/]" if ok else f"[yellow]gap: {gap}[/]"

    t.add_row(
        f"writes per order <= 2 x {steps} steps + 2 = {2 * steps + 2}",
        fmt(writes, 2),
        verdict(writes <= 2 * steps + 2, f"{writes - (2 * steps + 2):.2f} over"),
    )
    t.add_row(
        "writes per step <= 2 (claim, replies, unwatch / steps)",
        fmt(step_writes / steps, 2),
        verdict(step_writes / steps <= 2, f"{step_writes / steps - 2:.2f} over"),
    )
    t.add_row(
        "writes per order for intake and watch list <= 2",
        fmt(intake.get("writes", 0), 2),
        verdict(intake.get("writes", 0) <= 2, f"{intake.get('writes', 0) - 2:.2f} over"),
    )
    t.add_row(
        "claim without a query (a point read and one conditional write)",
        f"{claim_queries:.2f} queries, {claim_reads:.2f} point reads per claim",
        verdict(
            claim_queries == 0,
            "the claim's load queries (TableStateStore.load should be one point read)",
        ),
    )
    queries = sum(v.get("queries", 0) for v in summary.values())
    t.add_row(
        "queries per order (not in the aim; a load is a point read)",
        fmt(queries, 2),
        "-",
    )
    return t


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    timings = Timings(step_timeout=30, pending_timeout=60, supervisor_period=5)
    async with (
        BenchStack("cost", timings, seed=args.seed, instrument=True) as stack,
        aiohttp.ClientSession() as session,
    ):
        broker = stack.broker(session)
        await set_faults(stack.simulator(session), 0.0, args.latency_ms)
        tag = uuid.uuid4().hex[:6]
        await run_load(
            stack.api(),
            [f"warm-{tag}-{i}" for i in range(5)],
            Load(concurrency=5),
            StatusQueue(stack.service_bus_connection_string),
            timeout=60,
        )
        await asyncio.sleep(1.0)  # the last unwatch follows the Processed notification
        if args.faults:
            await set_faults(stack.simulator(session), args.faults, args.latency_ms)
        await stack.runtime_stats(reset=True)
        broker_before = await broker.stats()
        started = time.monotonic()
        result = await run_load(
            stack.api(),
            [f"cost-{tag}-{i:05d}" for i in range(args.orders)],
            Load(concurrency=args.concurrency),
            StatusQueue(stack.service_bus_connection_string),
            timeout=args.timeout,
        )
        await asyncio.sleep(1.5)
        elapsed = time.monotonic() - started
        stats = await stack.runtime_stats()
        broker_after = await broker.stats()
    sent_by_queue = {
        q: int(broker_after[q]["sent"]) - int(broker_before.get(q, {}).get("sent", 0))
        for q in broker_after
    }
    return {
        "faults": args.faults,
        "orders": len(result.orders),
        "processed": result.processed,
        "elapsed": elapsed,
        "stats": stats,
        "brokerSent": sent_by_queue,
    }


def report(data: dict[str, Any]) -> dict[str, Any]:
    orders = max(int(data["processed"]), 1)
    roles: dict[str, Any] = data["stats"]["roles"]
    console.print(function_table(roles, orders, float(data.get("faults", 0.0))))
    summary = summarize(roles, orders)
    console.print(steps_table(summary))
    console.print(aim_table(summary, roles, orders))

    sent: Counter[str] = Counter()
    for name, role in roles.items():
        if name not in ("supervisor", "health", "get_order"):
            sent.update(role["sent"])
    t = table("messages per order, by queue", ["queue", "sent (counting bus)", "accepted (broker)"])
    for queue in sorted(set(sent) | {q for q, n in data["brokerSent"].items() if n}):
        t.add_row(
            queue,
            fmt(sent.get(queue, 0) / orders, 2),
            fmt(data["brokerSent"].get(queue, 0) / orders, 2),
        )
    t.add_row("[bold]total[/]", fmt(sum(sent.values()) / orders, 2), "")
    console.print(t)

    adapter = data["stats"].get("adapterOperations", {})
    sweeps = roles.get("supervisor")
    console.print(
        "[dim]cross-check, TableStateStore.operations over the whole window (incl. "
        f"supervisor): {json.dumps(adapter)} = "
        + ", ".join(f"{k} {v / orders:.2f}/order" for k, v in adapter.items())
        + "[/]"
    )
    if sweeps:
        n = max(int(sweeps["invocations"]), 1)
        kinds = _table_ops(sweeps)
        console.print(
            f"supervisor: {sweeps['invocations']} sweeps in {data['elapsed']:.0f} s, "
            f"{kinds['query'] / n:.1f} queries, {kinds['write'] / n:.1f} writes per sweep "
            f"(the watch list's 16 shards are read every sweep, whatever the load: "
            f"{16 * 86400 // 30:,} queries a day at the Azure schedule of 30 s)"
        )
    return {"summary": summary}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cost_per_order", description=__doc__)
    parser.add_argument("--orders", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--latency-ms", type=int, default=20)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--faults",
        type=float,
        default=0.0,
        help="share of remote calls failing transiently after the warm-up (0.1: 10%%)",
    )
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        args.orders = min(args.orders, 40)
        args.timeout = min(args.timeout, 40)
    print_machine("cost per order: state-store operations and messages")
    data = asyncio.run(measure(args))
    console.print(
        f"[dim]{data['processed']} of {data['orders']} orders Processed "
        f"({args.faults:.0%} transient faults at the remote services); "
        "Table Storage kinds: write = one entity or one entity-group transaction; "
        "query = one query request (due = one per watch shard).[/]"
    )
    extra = report(data)
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"cost_per_order-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps({**data, **extra}, indent=2, default=str))
    console.print(f"[dim]saved {path}[/]")
    return 0 if data["processed"] == data["orders"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
