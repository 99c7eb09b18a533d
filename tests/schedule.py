"""The order the test files start in, heaviest first, so a parallel run does not end
with one worker busy on a long file that started late while the others sit idle.

bin/test runs pytest-xdist with `--dist loadfile` (a file's tests on one worker, where
they share their stack) and `--no-loadscope-reorder`: xdist then hands out the files in
collection order, which the root conftest sorts with `ordered` below. xdist's own
reorder, by number of tests per file, starts the e2e files (few tests, 20-80 s each)
last.

A file's weight is its seconds in tests/durations.txt, a measured run's per-file totals
(refresh: `pytest --junitxml=run.xml ...`, then `python -m tests.schedule run.xml >
tests/durations.txt`). A file missing from it (new since) is weighed by its number of
tests at its folder's rate, so a new e2e file still starts early; a file listed there
that no longer exists fails tests/unit/test_schedule.py.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

DURATIONS = Path(__file__).with_name("durations.txt")

SECONDS_PER_TEST = {"e2e": 10.0, "model": 2.0, "devhost": 1.0, "integration": 1.0}
"""A file missing from durations.txt (every file of the measured run is there, the
lightest with 0.0): seconds per test by its folder under tests/, about the measured
averages (an unknown e2e file is better started early)."""
DEFAULT_SECONDS_PER_TEST = 0.1

T = TypeVar("T")


def read_weights(text: str) -> dict[str, float]:
    """`seconds path` lines; blank lines and `#` comments are skipped."""
    weights: dict[str, float] = {}
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            seconds, path = line.split(maxsplit=1)
            weights[path] = float(seconds)
    return weights


def load_weights() -> dict[str, float]:
    return read_weights(DURATIONS.read_text()) if DURATIONS.exists() else {}


def guessed_weight(path: str, tests: int) -> float:
    parts = path.split("/")
    folder = parts[1] if len(parts) > 2 and parts[0] == "tests" else ""
    return tests * SECONDS_PER_TEST.get(folder, DEFAULT_SECONDS_PER_TEST)


def ordered(
    items: Sequence[T], path_of: Callable[[T], str], weights: Mapping[str, float]
) -> list[T]:
    """The items with their files' heaviest first; a file's items stay together and in
    their order, and files of equal weight keep their collection order (the sort is
    stable). `path_of` names an item's file, relative to the repository's root."""
    paths = [path_of(item) for item in items]
    counts: dict[str, int] = defaultdict(int)
    for path in paths:
        counts[path] += 1
    weight = {p: weights[p] if p in weights else guessed_weight(p, n) for p, n in counts.items()}
    first_seen: dict[str, int] = {}
    for index, path in enumerate(paths):
        first_seen.setdefault(path, index)
    order = sorted(range(len(items)), key=lambda i: (-weight[paths[i]], first_seen[paths[i]], i))
    return [items[i] for i in order]


def totals_from_junit(xml_files: Iterable[Path], root: Path) -> dict[str, float]:
    """Per-file seconds (setup, call and teardown) from pytest's JUnit XML; a test's
    file is found from its dotted classname, the longest prefix that is a file."""
    totals: dict[str, float] = defaultdict(float)
    for xml_file in xml_files:
        for case in ET.parse(xml_file).iter("testcase"):
            parts = (case.get("classname") or "").split(".")
            for end in range(len(parts), 0, -1):
                path = "/".join(parts[:end]) + ".py"
                if (root / path).is_file():
                    totals[path] += float(case.get("time") or 0)
                    break
    return dict(totals)


def as_text(totals: Mapping[str, float]) -> str:
    """The durations.txt lines, heaviest first: every file, so that a light one is not
    taken for a new one and guessed."""
    lines = [
        "# Seconds per test file in one measured run (tests/schedule.py: heaviest first).",
        "# Refresh: pytest --junitxml=run.xml ..., then python -m tests.schedule run.xml",
    ]
    for path, seconds in sorted(totals.items(), key=lambda kv: (-kv[1], kv[0])):
        lines.append(f"{seconds:7.1f} {path}")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    root = Path(__file__).resolve().parent.parent
    sys.stdout.write(as_text(totals_from_junit([Path(a) for a in argv], root)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
