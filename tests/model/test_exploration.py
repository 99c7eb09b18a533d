"""Every interleaving of one order's life up to a depth, on the real domain code.

The CI bounds run in seconds; the deep bounds are marked slow and print their figures
(`.venv/bin/pytest tests/model -m slow -s`). `python -m tests.model core 10` prints
one bound's figures and every trace without pytest.
All of them assert that no invariant of tests/model/invariants.py is violated, and on
failure print each violation's shortest trace (see tests/model/report.py).
"""

from __future__ import annotations

import time

import pytest

from tests.model import report
from tests.model.explorer import explore
from tests.model.invariants import INVARIANTS, signature
from tests.model.world import BOUNDS, Bounds, OrderWorld

CORE = BOUNDS["core"]
"""Replies, rejections, sweeps with every truthful answer, two operator moves, a drain:
depth 10 takes a whole order through to Processed and past its windows."""
FAILED_SENDS = BOUNDS["failed-sends"]
"""Sends failing after the request went out or before it, then `undelivered`."""
EVERYTHING = BOUNDS["everything"]
"""Duplicated and lost replies as well."""

CI = [
    pytest.param("core", CORE, 10, id="core-depth-10"),
    pytest.param("failed-sends", FAILED_SENDS, 6, id="failed-sends-depth-6"),
]
DEEP = [
    pytest.param("core", CORE, 13, id="core-depth-13"),
    pytest.param("failed-sends", FAILED_SENDS, 8, id="failed-sends-depth-8"),
    pytest.param("everything", EVERYTHING, 8, id="everything-depth-8"),
]


def check(name: str, bounds: Bounds, depth: int) -> None:
    model = OrderWorld(bounds)
    started = time.perf_counter()
    found = explore(model, INVARIANTS, depth, signature)
    seconds = time.perf_counter() - started
    print(report.figures(name, found, depth, seconds))
    if found.violations:
        figures = report.figures(name, found, depth, seconds)
        pytest.fail(f"{figures}\n\n{report.traces(model, found)}", pytrace=False)


@pytest.mark.parametrize(("name", "bounds", "depth"), CI)
def test_no_interleaving_breaks_an_invariant(name: str, bounds: Bounds, depth: int) -> None:
    check(name, bounds, depth)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "bounds", "depth"), DEEP)
def test_no_interleaving_breaks_an_invariant_deep(name: str, bounds: Bounds, depth: int) -> None:
    check(name, bounds, depth)
