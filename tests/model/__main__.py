"""Explore one bound and print its figures and traces, outside pytest:

.venv/bin/python -m tests.model core 10
.venv/bin/python -m tests.model failed-sends 6 --max-states 200000
"""

from __future__ import annotations

import argparse
import time

from tests.model import report
from tests.model.explorer import explore
from tests.model.invariants import INVARIANTS, signature
from tests.model.world import BOUNDS, OrderWorld


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.model", description=__doc__)
    parser.add_argument("bound", choices=sorted(BOUNDS))
    parser.add_argument("depth", type=int)
    parser.add_argument("--max-states", type=int, default=None)
    args = parser.parse_args()
    model = OrderWorld(BOUNDS[args.bound])
    started = time.perf_counter()
    found = explore(model, INVARIANTS, args.depth, signature, args.max_states)
    print(report.figures(args.bound, found, args.depth, time.perf_counter() - started))
    if found.violations:
        print()
        print(report.traces(model, found, others=1000))


if __name__ == "__main__":
    main()
