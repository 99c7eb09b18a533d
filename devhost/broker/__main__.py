"""Command line: ``python -m devhost.broker`` runs a broker in the foreground until a signal."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType

from shared.contract import QUEUE_PROPERTIES
from shared.gc_tuning import tune_for_long_lived_worker
from shared.telemetry.logsafe import make_handlers_safe

from .broker import Broker
from .faults import FaultConfig, FaultConfigError


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m devhost.broker", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=5672)
    parser.add_argument("--db", default=None, help="SQLite file; default keeps messages in memory")
    parser.add_argument("--control-port", type=int, default=7073, help="0 disables the HTTP API")
    parser.add_argument("--queue", action="append", default=[], metavar="EXTRA", nargs="+")
    parser.add_argument("--faults", default=None, metavar="JSON", help="initial fault config")
    parser.add_argument(
        "--lock-seconds", type=float, default=QUEUE_PROPERTIES.lock_duration_seconds
    )
    parser.add_argument("--max-delivery", type=int, default=QUEUE_PROPERTIES.max_delivery_count)
    parser.add_argument("--log-level", default="INFO")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    make_handlers_safe()
    try:
        faults = FaultConfig.from_json(json.loads(args.faults)) if args.faults else None
    except (json.JSONDecodeError, FaultConfigError) as exc:
        print(f"invalid --faults: {exc}", file=sys.stderr)
        return 2
    extra = [name for group in args.queue for name in group]
    broker = Broker(
        host=args.host,
        port=args.port,
        db_path=args.db,
        control_port=args.control_port or None,
        lock_seconds=args.lock_seconds,
        max_delivery_count=args.max_delivery,
        extra_queues=extra,
        faults=faults,
    )
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        broker.start()
    except OSError as exc:
        print(f"broker could not start: {exc}", file=sys.stderr)
        return 1
    # A process of its own, like the runtime: the same collector settings, for the same reason.
    tune_for_long_lived_worker()
    control = f"http://{args.host}:{broker.control_port}" if broker.control_port else "disabled"
    print(f"broker listening on amqp://{args.host}:{broker.port} (control {control})", flush=True)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        broker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
