"""Watching the state table while the run goes: samples for the lock invariant, the
number of unfinished orders (the load's window), and the moment all are terminal."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Mapping

from chaos.collect import StoreReader
from chaos.model import Accepted, Sample
from shared.domain.model import ProcessState

SCAN_WAIT_SECONDS = 120.0


class Monitor:
    """Reads the unfinished orders' state rows every `interval` seconds."""

    def __init__(self, reader: StoreReader, interval: float) -> None:
        self._reader = reader
        self._interval = interval
        self.started = time.monotonic()
        """The run's clock starts with the monitor (and the load right after it)."""
        self._next = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.samples: list[Sample] = []
        self.unfinished: dict[str, ProcessState] = {}
        self.scan_started_at = -1.0
        self.scanned_at = -1.0
        self.scans = 0
        self.errors = 0

    def now(self) -> float:
        return time.monotonic() - self.started

    async def scan(self) -> None:
        at = self.now()
        found = await self._reader.in_flight()
        self.samples.extend(
            Sample(
                at, r.order_id, r.process_state, r.locked_by, r.failure_count, r.cancel_requested
            )
            for r in found
        )
        self.unfinished = {r.order_id: r.process_state for r in found}
        self.scan_started_at = at
        self.scanned_at = self.now()
        self.scans += 1
        done, self._next = self._next, asyncio.Event()
        done.set()

    async def _run(self) -> None:
        while True:
            try:
                await self.scan()
            except Exception:  # Azurite busy: the next scan tries again
                self.errors += 1
            await asyncio.sleep(self._interval)

    def start(self) -> None:
        self.started = time.monotonic()
        self._task = asyncio.create_task(self._run(), name="chaos-monitor")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def next_scan(self) -> float:
        await asyncio.wait_for(self._next.wait(), SCAN_WAIT_SECONDS)
        return self.scanned_at

    def in_flight(self, accepted: Mapping[str, Accepted]) -> int:
        """Accepted orders not known to be finished: unfinished at the last scan, or
        accepted since it began."""
        since = self.scan_started_at
        return sum(
            1 for order_id, a in accepted.items() if order_id in self.unfinished or a.at >= since
        )

    def counts(self) -> Counter[str]:
        return Counter(state.value for state in self.unfinished.values())

    async def wait_terminal(
        self, accepted: Mapping[str, Accepted], not_before: float, timeout: float
    ) -> float | None:
        """When a scan begun after `not_before` first found none of the accepted orders
        unfinished; None after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            at = await self.next_scan()
            if self.scan_started_at >= not_before and self.in_flight(accepted) == 0:
                return at
        return None
