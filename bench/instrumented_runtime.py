"""``python -m bench.instrumented_runtime [devhost options] --stats-file PATH``.

The local runtime (``python -m devhost``) with the counting decorators of
``bench._instrument`` around the state store, the message bus and every function.
SIGUSR1 writes the counters to ``--stats-file``; SIGUSR2 resets them; they are also
written at exit. ``--stats-file`` may stand anywhere, so the harness's Stack starts this
runtime like ``python -m devhost`` with it among the extra options. Nothing in
``shared/`` or ``devhost/`` changes.
"""

from __future__ import annotations

import argparse
import signal
from pathlib import Path
from types import FrameType

from bench._instrument import STATS, dump, install


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.instrumented_runtime",
        usage="%(prog)s [devhost options] --stats-file PATH",
        allow_abbrev=False,
        add_help=False,
    )
    parser.add_argument("--stats-file", type=Path, required=True)
    known, rest = parser.parse_known_args(argv)
    path: Path = known.stats_file

    def on_dump(signum: int, frame: FrameType | None) -> None:
        dump(path)

    def on_reset(signum: int, frame: FrameType | None) -> None:
        STATS.reset()
        dump(path)

    signal.signal(signal.SIGUSR1, on_dump)
    signal.signal(signal.SIGUSR2, on_reset)
    from devhost.__main__ import main as devhost_main  # noqa: PLC0415 - after the signals

    install()
    try:
        return devhost_main(rest)
    finally:
        dump(path)


if __name__ == "__main__":
    raise SystemExit(main())
