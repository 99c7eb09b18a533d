"""``python -m bench.instrumented_runtime --stats-file PATH [devhost options]``.

The local runtime (``python -m devhost``) with the counting decorators of
``bench._instrument`` around the state store, the message bus and every function.
SIGUSR1 writes the counters to ``--stats-file``; SIGUSR2 resets them; they are also
written at exit. Nothing in ``shared/`` or ``devhost/`` changes.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from types import FrameType

from bench._instrument import STATS, dump, install


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2 or args[0] != "--stats-file":
        print("usage: python -m bench.instrumented_runtime --stats-file PATH [devhost options]")
        return 2
    path = Path(args[1])
    rest = args[2:]

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
