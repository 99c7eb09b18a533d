"""``python -m devhost.simulator``: the simulator in the foreground for the local runtime.

The ready line on stdout is the contract a supervising script waits for.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from devhost.simulator.app import create_app
from devhost.simulator.server import start_site
from devhost.simulator.state import STATE
from shared.telemetry.logsafe import make_handlers_safe

log = logging.getLogger("devhost.simulator")


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m devhost.simulator",
        description="The catalogue's agents as remote services, with fault injection.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=7072, help="0 picks a free port")
    parser.add_argument("--db", default=None, help="SQLite file for the effect ledger")
    parser.add_argument("--seed", type=int, default=None, help="fault RNG seed")
    parser.add_argument("--log-level", default="INFO", help="stderr log level")
    return parser.parse_args(argv)


async def _serve(args: argparse.Namespace) -> None:
    app = create_app(db_path=args.db, seed=args.seed)
    runner, port = await start_site(app, args.host, args.port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    log.info("seed %d, ledger %s", app[STATE].seed, args.db or "in memory")
    print(f"simulator listening on http://{args.host}:{port}", flush=True)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    make_handlers_safe()
    asyncio.run(_serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
