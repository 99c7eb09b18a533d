"""Reconciliation beside an in-memory state store (tests, tools): the same sample as the
Table adapter (shared/adapters/finished_sample.py) and the runs, newest first."""

from __future__ import annotations

import asyncio
from datetime import datetime

from shared.adapters.finished_sample import finished_sample
from shared.adapters.memory.store import InMemoryStateStore
from shared.domain.model import OrderProcess
from shared.domain.reconcile import ReconcileRun


class InMemoryReconcileStore:
    def __init__(self, store: InMemoryStateStore, kept: int = 100) -> None:
        self._store = store
        self._runs: list[ReconcileRun] = []
        self._kept = kept

    async def finished_sample(
        self, since: datetime, start: str, limit: int
    ) -> tuple[OrderProcess, ...]:
        return await finished_sample(self._store, since, start, limit)

    async def record_run(self, run: ReconcileRun) -> None:
        await asyncio.sleep(0)
        self._runs = [run, *self._runs][: self._kept]

    async def recent_runs(self, limit: int) -> tuple[ReconcileRun, ...]:
        await asyncio.sleep(0)
        return tuple(sorted(self._runs, key=lambda r: r.started_at, reverse=True)[:limit])
