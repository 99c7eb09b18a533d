"""How many submissions one instance is storing at once: past a burst, a new order is
not claimed at intake but nudged, as before issue #39.

Why: a claimed order's first step has its complete-by from the moment it is stored. In
a burst, its request waits behind the other submissions and behind the agent's
handlers, and on a loaded instance it reached the agent after its complete-by (an e2e
burst of 40 orders with a 3 s step timeout on one runtime: `tests/e2e/test_limits.py`),
where it is ignored and the Supervisor counts a timeout. A nudged order's clock starts
when the Scheduler claims it, once the burst has passed.

The burst grows with the time the first step has (`admits`): the wait behind the others
grows with an order's place in the burst, and what it may eat into is its step's
timeout. At the default 30 s, a closed loop's first 64 orders at once were 48 nudged
orders, whose claims waited for the Scheduler's turns and were the p99 of the whole run
(bench/README.md, "The first sends").
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import timedelta

BURST = 16
"""Submissions at once past which the next is nudged, not claimed, when its first step
has `BURST_STEP_TIME`: as many as an agent's trigger serves at once
(`maxConcurrentCalls` in host.json), so the requests the intake sends in a burst find a
handler each."""

BURST_STEP_TIME = timedelta(seconds=3)
"""The step timeout that `BURST` was shown to hold at: the e2e burst's, on a loaded
machine. A first step with more time allows a burst that much larger."""


class IntakeLoad:
    """Submissions in flight on this instance (one event loop: no lock needed)."""

    def __init__(self, burst: int = BURST) -> None:
        self.burst = burst
        self.storing = 0

    @contextlib.contextmanager
    def storing_one(self) -> Iterator[int]:
        """Counts one submission while it is stored; yields its place in the burst (1 for
        the only one), for `admits`."""
        self.storing += 1
        try:
            yield self.storing
        finally:
            self.storing -= 1

    def admits(self, place: int, step_time: timedelta) -> bool:
        """Whether the submission at `place` may be claimed at intake, its first step having
        `step_time` until its complete-by: within `burst`, scaled by that time against
        `BURST_STEP_TIME` and never below `burst`."""
        scale = max(1.0, step_time / BURST_STEP_TIME)
        return place <= self.burst * scale
