"""``python -m bench.traced_runtime [devhost options] --snapshot-dir DIR [--frames N]``.

The local runtime (``python -m devhost``) with tracemalloc on from the first import, so
memory that creeps can be traced to the line that allocated it inside the runtime that
served the traffic, not in a copy of it in another process. SIGUSR2 collects garbage and
writes ``snapshot-<n>.tracemalloc`` (``tracemalloc.Snapshot.load`` reads it) to
``--snapshot-dir``; two of them diffed (``bench.soak --tracemalloc`` prints the top
lines) show what grew between them. Tracing costs CPU and memory of its own, so RSS
figures are taken without it (``--frames 0``).

SIGUSR1 writes pymalloc's statistics to ``pymalloc.txt``, asks glibc to give back the
free memory it holds (``malloc_trim(0)``) and appends the RSS before and after to
``trim.txt``: what that gives back was free in the allocator, not held by Python
objects. Nothing in ``shared/`` or ``devhost/`` changes.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import itertools
import os
import signal
import sys
import tracemalloc
from pathlib import Path
from types import FrameType

SNAPSHOT = "snapshot-{n:03d}.tracemalloc"
TRIMMED = "trim.txt"
PYMALLOC = "pymalloc.txt"
"""`sys._debugmallocstats()` at the trim: pymalloc's arenas against the bytes in use in
them, which malloc_trim cannot give back (an arena goes back only when empty)."""


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _pymalloc_stats(path: Path) -> None:
    """`sys._debugmallocstats()` writes to the C stderr; it goes to `path` instead."""
    sys.stderr.flush()
    saved = os.dup(2)
    with path.open("a") as out:
        os.dup2(out.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.traced_runtime",
        usage="%(prog)s [devhost options] --snapshot-dir DIR [--frames N]",
        allow_abbrev=False,
        add_help=False,
    )
    parser.add_argument("--snapshot-dir", type=Path, required=True)
    parser.add_argument("--frames", type=int, default=8, help="0: no tracemalloc")
    known, rest = parser.parse_known_args(argv)
    folder: Path = known.snapshot_dir
    folder.mkdir(parents=True, exist_ok=True)
    numbers = itertools.count(1)

    def on_snapshot(signum: int, frame: FrameType | None) -> None:
        gc.collect()
        path = folder / SNAPSHOT.format(n=next(numbers))
        tracemalloc.take_snapshot().dump(str(path.with_suffix(".part")))
        path.with_suffix(".part").rename(path)

    def on_trim(signum: int, frame: FrameType | None) -> None:
        gc.collect()
        _pymalloc_stats(folder / PYMALLOC)
        before = _rss_mb()
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        with (folder / TRIMMED).open("a") as out:
            out.write(f"{before:.1f} {_rss_mb():.1f}\n")

    if known.frames > 0:
        tracemalloc.start(known.frames)
        signal.signal(signal.SIGUSR2, on_snapshot)
    signal.signal(signal.SIGUSR1, on_trim)
    from devhost.__main__ import main as devhost_main  # noqa: PLC0415 - traced from here on

    return devhost_main(rest)


if __name__ == "__main__":
    raise SystemExit(main())
