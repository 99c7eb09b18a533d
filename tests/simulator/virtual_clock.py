"""Virtual time for a burst of concurrent agent calls against a real (local) server.

FakeClock advances on each sleep at once, so concurrent sleepers add their waits up and
then all call at the same moment: useless for measuring a rate. Here time stands still
while any task is doing something else (an HTTP call), and moves to the earliest
sleeper's wake time only when every task still running is asleep, so each call happens
at exactly the virtual time its task woke at.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Awaitable, Iterable
from datetime import UTC, datetime, timedelta
from typing import TypeVar

T = TypeVar("T")


class VirtualClock:
    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 1, 1, tzinfo=UTC)
        self._sleepers: list[tuple[datetime, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    def now(self) -> datetime:
        return self._now

    def monotonic(self) -> float:
        return self._now.timestamp()

    async def sleep(self, seconds: float) -> None:
        future = asyncio.get_running_loop().create_future()
        wake = self._now + timedelta(seconds=max(seconds, 0.0))
        heapq.heappush(self._sleepers, (wake, next(self._order), future))
        await future

    async def run(self, work: Iterable[Awaitable[T]]) -> list[T]:
        """Run `work` concurrently on this clock until all of it is done."""
        tasks = [asyncio.ensure_future(w) for w in work]
        while not all(task.done() for task in tasks):
            running = sum(not task.done() for task in tasks)
            if self._sleepers and len(self._sleepers) == running:
                wake, _, future = heapq.heappop(self._sleepers)
                self._now = max(self._now, wake)
                future.set_result(None)
            await asyncio.sleep(0)
        return [task.result() for task in tasks]
