"""Agent health and drain flags as the Scheduler routes on them: one small read every few
seconds."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

from shared.domain.routing import PRIMARY_ONLY, Routing, routing_from
from shared.ports import Clock, HealthStore, StateStoreError
from shared.telemetry.logsafe import app_logger

log = app_logger("orders.scheduler")

REFRESH = timedelta(seconds=2)


class RoutingSource:
    """Caches the health snapshot per instance, so routing costs one partition read per
    refresh period rather than one per dispatch; a failed read keeps the last snapshot."""

    def __init__(self, store: HealthStore, clock: Clock, refresh: timedelta = REFRESH) -> None:
        self._store = store
        self._clock = clock
        self._refresh = refresh
        self._routing = PRIMARY_ONLY
        self._read_at: datetime | None = None
        self._lock = asyncio.Lock()

    async def current(self) -> Routing:
        if self._fresh():
            return self._routing
        async with self._lock:
            if self._fresh():
                return self._routing
            now = self._clock.now()
            try:
                records = await self._store.agent_records()
            except (StateStoreError, OSError) as exc:
                log.warning("agent health not read, routing on the last snapshot: %s", exc)
            else:
                self._routing = routing_from(records, now)
            self._read_at = now
        return self._routing

    def _fresh(self) -> bool:
        return self._read_at is not None and self._clock.now() - self._read_at < self._refresh
