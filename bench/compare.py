"""Ours and the DBOS peer in the same run, one side-by-side table.

    python -m bench.compare [--orders 2000] [--concurrency 64 | --rate 20] [--runtimes 1,2,4]
                            [--rounds 3] [--tracing sampled|all|off] [--notify final|all]
                            [--quick]

Runs ``bench.throughput`` (the local runtime with Azurite, the broker and the
simulator) and then ``bench.peer_dbos`` (DBOS Transact with SQLite, the same simulator
settings) with the same orders, load, remote latency and fault rates. With
``--runtimes 1,2,4`` ours runs once per count of runtime processes (competing for the
same queues), each row set against the same DBOS run.

``--rounds N`` repeats ours-then-DBOS N times and adds the median of each ratio over the
rounds: on a shared machine whose speed drifts over minutes (DBOS alone was seen at 42
and at 67 orders/s ten minutes apart), a ratio taken from neighbouring runs, repeated,
says more than one pair of runs.

Our client asks for the final status only (``"notify": "final"``, one notification per
order, as the DBOS peer's client reads only completions); the setup line says so, and
``--notify all`` measures the default's three.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
from collections.abc import Iterator, Mapping
from typing import NamedTuple

from bench._common import console, fmt, print_machine, ratio, table
from bench.order_counts import FINAL_ONLY, HEADERS, PINNED, OrderCounts, rows
from bench.peer_dbos import measure_peer
from bench.throughput import (
    RunSummary,
    add_load_options,
    add_runtimes_option,
    describe_setup,
    measure_ours,
    results_table,
    save,
)


def side_by_side(ours: list[RunSummary], peer: list[RunSummary]) -> object:
    t = table(
        "ours vs DBOS Transact (ratio = ours / DBOS)",
        [
            "faults",
            "runtimes",
            "ours orders/s",
            "DBOS orders/s",
            "ratio",
            "ours p50 ms",
            "DBOS p50 ms",
            "ratio",
            "ours p99 ms",
            "DBOS p99 ms",
            "ratio",
            "ours CPU ms/order",
            "DBOS CPU ms/order",
            "ratio",
            "simulator ms/order ours / DBOS",
            "CPU ratio, speed-corrected",
        ],
    )
    for o, p in pairs(ours, peer):
        ours_cpu, peer_cpu = cpu_ms_per_order(o), cpu_ms_per_order(p)
        t.add_row(
            f"{o.fault_rate:.0%}",
            str(o.runtimes),
            fmt(o.throughput, 1),
            fmt(p.throughput, 1),
            ratio(o.throughput, p.throughput),
            fmt(o.server.p50 * 1000, 0),
            fmt(p.server.p50 * 1000, 0),
            ratio(o.server.p50, p.server.p50),
            fmt(o.server.p99 * 1000, 0),
            fmt(p.server.p99 * 1000, 0),
            ratio(o.server.p99, p.server.p99),
            fmt(ours_cpu, 1),
            fmt(peer_cpu, 1),
            ratio(ours_cpu, peer_cpu),
            f"{fmt(simulator_ms(o), 2)} / {fmt(simulator_ms(p), 2)}",
            ratio(ours_cpu / simulator_ms(o), peer_cpu / simulator_ms(p)),
        )
    return t


class Cap(NamedTuple):
    """What bounds our throughput in one run, against the peer's in the same round."""

    busiest: str
    busiest_ms: float
    """CPU per order of our busiest process: one interpreter, at most one core."""
    machine_ms: float
    """CPU per order of everything on the machine during the run."""
    peer_throughput: float
    cores: int

    @property
    def busiest_cap(self) -> float:
        """Orders/s the busiest process allows at 100% of one core."""
        return 1000 / max(self.busiest_ms, 1e-9)

    @property
    def machine_cap(self) -> float:
        """Orders/s the machine allows at 100% of every core."""
        return self.cores * 1000 / max(self.machine_ms, 1e-9)

    @property
    def cores_at_peer_rate(self) -> float:
        """Cores our run's CPU per order would need at the peer's throughput."""
        return self.peer_throughput * self.machine_ms / 1000


def cap(ours: RunSummary, peer: RunSummary, cores: int) -> Cap:
    processed = max(ours.processed, 1)
    own = {k: v for k, v in ours.cpu.items() if not k.startswith(OUTSIDE)}
    busiest = max(own, key=own.__getitem__, default="-")
    return Cap(
        busiest,
        1000 * own.get(busiest, 0.0) / processed,
        1000 * ours.machine_busy / processed,
        peer.throughput,
        cores,
    )


def caps(ours: list[RunSummary], peer: list[RunSummary], cores: int) -> object:
    t = table(
        "what caps our throughput: one interpreter per process, and the machine's cores",
        [
            "faults",
            "runtimes",
            "busiest process",
            "its CPU ms/order",
            "its cap, orders/s at 100% of a core",
            "machine CPU ms/order (every process)",
            f"machine cap, orders/s at 100% of {cores} cores",
            "DBOS orders/s",
            "cores ours needs at DBOS's rate",
        ],
    )
    for o, p in pairs(ours, peer):
        c = cap(o, p, cores)
        t.add_row(
            f"{o.fault_rate:.0%}",
            str(o.runtimes),
            c.busiest,
            fmt(c.busiest_ms, 1),
            fmt(c.busiest_cap, 1),
            fmt(c.machine_ms, 1),
            fmt(c.machine_cap, 1),
            fmt(c.peer_throughput, 1),
            fmt(c.cores_at_peer_rate, 2),
        )
    return t


def pinned_counts(
    pinned: Mapping[str, OrderCounts] = PINNED, final_only: Mapping[str, OrderCounts] = FINAL_ONLY
) -> object:
    """What one fault-free order costs by workflow, as tests/integration/
    test_order_counts.py pins it: the hops behind the CPU figures (docs/capacity.md);
    then the same for a client that asks for the final status only, as ours does here."""
    t = table("per fault-free order, pinned (bench/order_counts.py)", HEADERS)
    t.columns[0].no_wrap = True
    for row in rows(pinned):
        t.add_row(*row)
    for row in rows({f"{name}, notify final": c for name, c in final_only.items()}):
        t.add_row(*row)
    return t


def pairs(
    ours: list[RunSummary], peer: list[RunSummary]
) -> Iterator[tuple[RunSummary, RunSummary]]:
    """Each of our runs with the peer's run at the same fault rate."""
    by_rate = {p.fault_rate: p for p in peer}
    for o in ours:
        if (p := by_rate.get(o.fault_rate)) is not None:
            yield o, p


def cpu_ms_per_order(run: RunSummary) -> float:
    return 1000 * system_cpu(run) / max(run.processed, 1)


def simulator_ms(run: RunSummary) -> float:
    """The simulator's CPU per order: the same calls, the same work on both sides, so it
    tells how fast the machine was during the run (on this shared machine it was seen to
    take twice as long for the same orders an hour apart)."""
    return max(1000 * run.cpu.get("simulator", 0.0) / max(run.processed, 1), 1e-6)


class Ratios(NamedTuple):
    """Ours / DBOS."""

    throughput: float
    p99: float
    cpu_per_order: float
    cpu_speed_corrected: float


def _ratios(ours: list[RunSummary], peer: list[RunSummary]) -> dict[tuple[float, int], Ratios]:
    out: dict[tuple[float, int], Ratios] = {}
    for o, p in pairs(ours, peer):
        ours_cpu, peer_cpu = cpu_ms_per_order(o), max(cpu_ms_per_order(p), 1e-9)
        out[(o.fault_rate, o.runtimes)] = Ratios(
            o.throughput / max(p.throughput, 1e-9),
            o.server.p99 / max(p.server.p99, 1e-9),
            ours_cpu / peer_cpu,
            (ours_cpu / simulator_ms(o)) / (peer_cpu / simulator_ms(p)),
        )
    return out


def medians(rounds: list[tuple[list[RunSummary], list[RunSummary]]]) -> object:
    """The median of each ratio over the rounds, with its spread (lowest..highest)."""
    per_round = [_ratios(ours, peer) for ours, peer in rounds]
    t = table(
        f"ours / DBOS over {len(rounds)} rounds: median (lowest..highest)",
        ["faults", "runtimes", "throughput", "p99", "CPU per order", "CPU, speed-corrected"],
    )
    for key in per_round[0]:
        seen = [r[key] for r in per_round if key in r]
        cells = [
            f"{statistics.median(values):.2f}x ({min(values):.2f}..{max(values):.2f})"
            for values in zip(*seen, strict=True)
        ]
        t.add_row(f"{key[0]:.0%}", str(key[1]), *cells)
    return t


def system_cpu(run: RunSummary) -> float:
    """CPU seconds of the system under test: everything but the driver, the simulator and
    the local OTLP receiver (it stands in for Application Insights; the runtime's cost of
    exporting is in the runtime's figure)."""
    return sum(v for k, v in run.cpu.items() if not k.startswith(OUTSIDE))


OUTSIDE = ("driver", "simulator", "otlp", "everything else")
"""The processes that are not the system under test."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__)
    add_load_options(parser)
    add_runtimes_option(parser)
    parser.add_argument("--step-timeout", type=float, default=30.0)
    parser.add_argument("--pending-timeout", type=float, default=60.0)
    parser.add_argument("--profile", action="store_true", help="py-spy both systems")
    # Like the DBOS peer's client, ours waits for the outcome only: one notification per
    # order, not three (issue #39); `--notify all` measures what the default costs.
    parser.set_defaults(notify="final")
    parser.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="ours then DBOS, this many times; the medians are the figures (default 3, "
        "1 with --quick)",
    )
    args = parser.parse_args(argv)
    if args.rounds is None:
        args.rounds = 1 if args.quick else 3
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    args.instrument = False
    if args.quick:
        args.orders = min(args.orders, 40)
        args.warmup = min(args.warmup, 5)
        args.timeout = min(args.timeout, 25)
        args.fault_rates = args.fault_rates[-1:]
    machine = print_machine("ours vs DBOS Transact, same run")
    console.print(f"[dim]{describe_setup(args)}[/]")
    console.print(pinned_counts())
    rounds: list[tuple[list[RunSummary], list[RunSummary]]] = []
    for number in range(1, args.rounds + 1):
        if args.rounds > 1:
            console.rule(f"round {number} of {args.rounds}")
        ours = asyncio.run(measure_ours(args))
        peer = asyncio.run(measure_peer(args))
        rounds.append((ours, peer))
        console.print(results_table("throughput and latency (intake -> Processed)", ours + peer))
        console.print(side_by_side(ours, peer))
        console.print(caps(ours, peer, machine.cores))
    console.print(
        "[dim]CPU ms/order: CPU of the system under test per Processed order (ours: runtime, "
        "broker, Azurite; DBOS: its one process with SQLite), without driver and simulator. "
        "Speed-corrected: each side's CPU per order over the simulator's CPU per order in the "
        "same run, so a machine that was slower for one side counts against neither.[/]"
    )
    if args.rounds > 1:
        console.print(medians(rounds))
    every = [run for ours, peer in rounds for run in ours + peer]
    save("compare", machine, args, every)
    return 0 if all(r.unfinished == 0 for r in every) else 1


if __name__ == "__main__":
    raise SystemExit(main())
