"""How long Flex Consumption would bill instances, from when executions start and end.

On demand bills an instance's memory while at least one execution is active on it, each
active period at least 1 s and then rounded up to 100 ms; executions that overlap on one
instance share that time. A period shorter than the minimum is billed as a window of 1 s
from its start, and windows that overlap are billed once: an instance is never billed
more than the wall time it exists. Flex scales the HTTP functions as one group and every other
function on instances of its own, so each scale group has a clock here, and the local
runtime (one process, at most ``maxConcurrentCalls`` messages per function) stands for one
instance of each group. ``solo`` is the same time billed as if every execution had an
instance to itself (a per-instance concurrency of 1).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

MIN_PERIOD_SECONDS = 1.0
ROUNDING_SECONDS = 0.1
HTTP_GROUP = "HTTP functions"


def billed(seconds: float) -> float:
    """One active period as Flex bills it: at least 1 s, then whole 100 ms."""
    steps = math.ceil(round(seconds / ROUNDING_SECONDS, 6))
    return max(MIN_PERIOD_SECONDS, steps * ROUNDING_SECONDS)


TIMER_MARK = " (timer)"


def scale_group(function_name: str, trigger_type: str) -> str:
    """Timers are marked: they run per time, not per order."""
    if trigger_type == "httpTrigger":
        return HTTP_GROUP
    return function_name + (TIMER_MARK if trigger_type == "timerTrigger" else "")


@dataclass
class GroupClock:
    """One scale group's instance: active periods, and the executions inside them."""

    executions: int = 0
    active: int = 0
    peak: int = 0
    since: float = 0.0
    billed_until: float = 0.0
    periods: int = 0
    active_seconds: float = 0.0
    billed_seconds: float = 0.0
    execution_seconds: float = 0.0
    solo_billed_seconds: float = 0.0

    def begin(self, now: float) -> None:
        if self.active == 0:
            self.since = now
        self.active += 1
        self.peak = max(self.peak, self.active)

    def end(self, now: float, started: float) -> None:
        self.active -= 1
        self.executions += 1
        self.execution_seconds += now - started
        self.solo_billed_seconds += billed(now - started)
        if self.active == 0:
            self.periods += 1
            self.active_seconds += now - self.since
            window_end = self.since + billed(now - self.since)
            self.billed_seconds += max(0.0, window_end - max(self.since, self.billed_until))
            self.billed_until = max(self.billed_until, window_end)

    def reset(self, now: float) -> None:
        """Zero the totals; a period under way counts from now."""
        self.executions = self.periods = 0
        self.active_seconds = self.billed_seconds = 0.0
        self.execution_seconds = self.solo_billed_seconds = 0.0
        self.peak = self.active
        self.since = self.billed_until = now

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        del data["since"], data["active"], data["billed_until"]
        return data
