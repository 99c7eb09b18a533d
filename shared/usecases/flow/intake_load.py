"""How many submissions one instance is storing at once: past a burst, a new order is
not claimed at intake but nudged, as before issue #39.

Why: a claimed order's first step has its complete-by from the moment it is stored. In
a burst, its request waits behind the other submissions and behind the agent's
handlers, and on a loaded instance it reached the agent after its complete-by (an e2e
burst of 40 orders with a 3 s step timeout on one runtime: `tests/e2e/test_limits.py`),
where it is ignored and the Supervisor counts a timeout. A nudged order's clock starts
when the Scheduler claims it, once the burst has passed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

BURST = 16
"""Submissions at once past which the next is nudged, not claimed: as many as an agent's
trigger serves at once (`maxConcurrentCalls` in host.json), so the requests the intake
sends in a burst find a handler each."""


class IntakeLoad:
    """Submissions in flight on this instance (one event loop: no lock needed)."""

    def __init__(self, burst: int = BURST) -> None:
        self.burst = burst
        self.storing = 0

    @contextlib.contextmanager
    def storing_one(self) -> Iterator[bool]:
        """Counts one submission while it is stored; yields whether it is within the
        burst, and so may be claimed at intake."""
        self.storing += 1
        try:
            yield self.storing <= self.burst
        finally:
            self.storing -= 1
