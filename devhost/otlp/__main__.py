"""``python -m devhost.otlp``: the OTLP receiver in the foreground for the local runtime.

The ready line on stdout is the contract a supervising script waits for.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from aiohttp import web

from devhost.otlp.app import make_runner
from devhost.otlp.store import MAX_AGE_SECONDS, MAX_SPANS, SpanStore
from shared.telemetry.logsafe import make_handlers_safe

log = logging.getLogger("devhost.otlp")
DEFAULT_PORT = 4318


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m devhost.otlp",
        description="OTLP/HTTP receiver keeping spans in SQLite, with the trace query.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="0 picks a free port")
    parser.add_argument("--db", default=None, help="SQLite file (default: in memory)")
    parser.add_argument("--max-spans", type=int, default=MAX_SPANS, help="oldest traces go first")
    parser.add_argument(
        "--max-age", type=float, default=MAX_AGE_SECONDS, help="seconds a trace is kept"
    )
    parser.add_argument("--log-level", default="INFO", help="stderr log level")
    return parser.parse_args(argv)


async def _serve(args: argparse.Namespace) -> None:
    store = SpanStore(args.db, max_spans=args.max_spans, max_age=args.max_age)
    runner = make_runner(store, args.host)
    await runner.setup()
    try:
        site = web.TCPSite(runner, args.host, args.port)
        await site.start()
        port = runner.addresses[0][1]
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        log.info(
            "spans in %s (%d kept now, at most %d)",
            args.db or "memory",
            store.span_count,
            store.max_spans,
        )
        print(f"otlp receiver listening on http://{args.host}:{port}", flush=True)
        await stop.wait()
    finally:
        await runner.cleanup()
        store.close()


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
