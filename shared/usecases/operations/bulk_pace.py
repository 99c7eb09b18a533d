"""The pace of a bulk run: actions `1 / per_second` apart, across its pages, and how
many more fit before its deadline.

A page is claimed only as large as the run can finish at its pace before the deadline:
a page of 100 at 0.5 actions/s takes 200 s, far past a 20 s budget, and past the lease
(shared/usecases/operations/bulk_lease.py) that keeps other instances off it meanwhile.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from shared.ports import Clock


@dataclass
class Pacer:
    clock: Clock
    per_second: float
    deadline: datetime
    next_at: datetime | None = None
    """When the next action may start; None: at once."""

    def _start(self) -> datetime:
        now = self.clock.now()
        return now if self.next_at is None else max(self.next_at, now)

    def room(self) -> int:
        """How many more actions can start before the deadline."""
        seconds = (self.deadline - self._start()).total_seconds()
        if seconds <= 0:
            return 0
        return math.ceil(seconds * self.per_second - 1e-9)

    async def turn(self) -> bool:
        """Wait for the next action's turn; False, without waiting, when it would come at
        or after the deadline."""
        start = self._start()
        if start >= self.deadline:
            return False
        wait = (start - self.clock.now()).total_seconds()
        if wait > 0:
            await self.clock.sleep(wait)
        self.next_at = start + timedelta(seconds=1 / self.per_second)
        return True
