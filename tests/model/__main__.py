"""Explore one bound and print its figures and traces, outside pytest:

.venv/bin/python -m tests.model core 10
.venv/bin/python -m tests.model core 9 --setup express-delivery/compensate
.venv/bin/python -m tests.model failed-sends 6 --max-states 200000
.venv/bin/python -m tests.model --list
"""

from __future__ import annotations

import argparse
import time

from tests.model import liveness, report
from tests.model.explorer import explore
from tests.model.invariants import INVARIANTS, signature
from tests.model.setups import DEFAULT, SETUPS
from tests.model.world import BOUNDS, OrderWorld


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.model", description=__doc__)
    parser.add_argument("bound", nargs="?", choices=sorted(BOUNDS))
    parser.add_argument("depth", nargs="?", type=int)
    parser.add_argument("--setup", default=DEFAULT.name, choices=sorted(SETUPS))
    parser.add_argument("--max-states", type=int, default=None)
    parser.add_argument("--list", action="store_true", help="name every setup and stop")
    args = parser.parse_args()
    if args.list or args.bound is None or args.depth is None:
        print("\n".join(sorted(SETUPS)))
        return
    model = OrderWorld(BOUNDS[args.bound], SETUPS[args.setup])
    started = time.perf_counter()
    invariants = (*INVARIANTS, liveness.invariant(model.setup))
    found = explore(model, invariants, args.depth, signature, args.max_states)
    name = f"{args.bound} {args.setup}"
    print(report.figures(name, found, args.depth, time.perf_counter() - started))
    if found.violations:
        print()
        print(report.traces(model, found, others=1000))


if __name__ == "__main__":
    main()
