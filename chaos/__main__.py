"""``python -m chaos [--orders 1000] [--seed N] [--quick | --outage [--minutes M]]``:
prove it heals.

Exit code 0 when every invariant holds, 1 when one fails, 2 when the run itself could
not be carried out, 130 on Ctrl-C. Everything the run started is stopped in every case.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time
from pathlib import Path
from types import FrameType

from rich.console import Console

from chaos import config as presets
from chaos.report import print_report
from chaos.run import run_chaos
from devhost.harness.process import ROOT


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m chaos", description=__doc__)
    parser.add_argument("--orders", type=int, default=None, help="orders (default 1000)")
    parser.add_argument("--seed", type=int, default=1, help="seed of orders and faults")
    parser.add_argument(
        "--quick", action="store_true", help="the default test suite's run: 60 orders, one kill"
    )
    parser.add_argument(
        "--outage",
        action="store_true",
        help="the broker down 10 s, then for minutes with a runtime killed (400 orders)",
    )
    parser.add_argument(
        "--minutes", type=float, default=2.5, help="the long broker outage of --outage"
    )
    parser.add_argument("--rate", type=float, default=None, help="orders per second at most")
    parser.add_argument(
        "--max-in-flight",
        type=int,
        default=None,
        help="unfinished orders at most before the load waits (default 60; quick 40)",
    )
    parser.add_argument(
        "--workflows",
        default=None,
        help="the mix, in turn: name[:weight],... (default "
        "order-fulfilment:2,express-delivery: every third order on express-delivery)",
    )
    parser.add_argument(
        "--no-resubmit", action="store_true", help="do not resubmit Error orders at the end"
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="logs and broker db (default .devhost/chaos/<time>-seed<N>)",
    )
    return parser


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.orders is not None and args.orders < 1:
        raise SystemExit("--orders must be at least 1")
    if args.quick:
        config = presets.quick(seed=args.seed, orders=args.orders or 60)
    elif args.outage:
        config = presets.outage(orders=args.orders or 400, seed=args.seed, minutes=args.minutes)
    else:
        config = presets.full(orders=args.orders or 1000, seed=args.seed)
    if args.rate is not None:
        config = config.with_(submit_rate=args.rate)
    if args.max_in_flight is not None:
        config = config.with_(max_in_flight=args.max_in_flight)
    if args.workflows is not None:
        try:
            config = config.with_(workflows=presets.parse_mix(args.workflows))
        except ValueError as exc:
            raise SystemExit(f"--workflows: {exc}") from exc
    if args.no_resubmit:
        config = config.with_(resubmit_errors=False)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    workdir = args.workdir or ROOT / ".devhost" / "chaos" / f"{stamp}-seed{config.seed}"
    console = Console()
    if not console.is_terminal:
        console = Console(width=120)  # a log file or a pipe: wide enough for the tables
    signal.signal(signal.SIGTERM, _terminate)
    try:
        result = asyncio.run(run_chaos(config, workdir, console.log))
    except KeyboardInterrupt:
        console.print("[yellow]interrupted; everything started was stopped[/]")
        return 130
    except Exception as exc:
        console.print_exception()
        console.print(f"[red]the chaos run could not be carried out: {exc}[/]")
        return 2
    print_report(result, console)
    return 0 if result.passed else 1


if __name__ == "__main__":
    sys.exit(main())
