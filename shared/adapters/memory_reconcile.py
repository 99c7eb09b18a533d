"""Reconciliation beside an in-memory state store (tests, tools): the same sample rule as
the Table adapter (finished, changed within the window, key order from `start`,
wrapping round once) and the runs, newest first."""

from __future__ import annotations

import asyncio
from datetime import datetime

from shared.adapters.memory import InMemoryStateStore
from shared.domain.model import OrderProcess
from shared.domain.reconcile import FINISHED, ReconcileRun

_PAGE = 1000


class InMemoryReconcileStore:
    def __init__(self, store: InMemoryStateStore, kept: int = 100) -> None:
        self._store = store
        self._runs: list[ReconcileRun] = []
        self._kept = kept

    async def finished_sample(
        self, since: datetime, start: str, limit: int
    ) -> tuple[OrderProcess, ...]:
        ids: list[str] = []
        for state in FINISHED:
            page = await self._store.list_by_state(state, _PAGE, None)
            ids += [s.order_id for s in page.items if s.updated_at >= since]
        ordered = sorted(i for i in ids if i >= start) + sorted(i for i in ids if i < start)
        found = [await self._store.load(i) for i in ordered[: max(limit, 0)]]
        return tuple(p for p in found if p is not None)

    async def record_run(self, run: ReconcileRun) -> None:
        await asyncio.sleep(0)
        self._runs = [run, *self._runs][: self._kept]

    async def recent_runs(self, limit: int) -> tuple[ReconcileRun, ...]:
        await asyncio.sleep(0)
        return tuple(sorted(self._runs, key=lambda r: r.started_at, reverse=True)[:limit])
