"""The limit rows in memory, with the Table adapter's ETag rules: one instance of it
shared by several limiters is several instances sharing one table (tests, bench)."""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from datetime import datetime
from typing import Protocol

from shared.domain.limits import Claims, Schedule, SlotLease
from shared.ports import ConcurrencyConflict


class _Row(Protocol):
    @property
    def etag(self) -> str: ...


class InMemoryLimitStore:
    def __init__(self) -> None:
        self._schedules: dict[str, Schedule] = {}
        self._claims: dict[str, Claims] = {}
        self._leases: dict[tuple[str, int], SlotLease] = {}
        self._etags = itertools.count(1)
        self.operations: Counter[str] = Counter()

    def _etag(self) -> str:
        return f'W/"{next(self._etags)}"'

    async def schedule(self, agent: str) -> Schedule | None:
        await asyncio.sleep(0)
        self.operations["read"] += 1
        return self._schedules.get(agent)

    async def put_schedule(
        self, agent: str, next_start: datetime, seen: Schedule | None
    ) -> Schedule:
        await asyncio.sleep(0)
        self.operations["write"] += 1
        current = self._schedules.get(agent)
        _as_seen(current, seen, f"rate row of {agent} changed")
        written = Schedule(next_start, self._etag())
        self._schedules[agent] = written
        return written

    async def claims(self, agent: str) -> Claims | None:
        await asyncio.sleep(0)
        self.operations["read"] += 1
        return self._claims.get(agent)

    async def put_claims(
        self, agent: str, slots: tuple[datetime, ...], seen: Claims | None
    ) -> Claims:
        await asyncio.sleep(0)
        self.operations["write"] += 1
        current = self._claims.get(agent)
        _as_seen(current, seen, f"claimed slots of {agent} changed")
        written = Claims(slots, self._etag())
        self._claims[agent] = written
        return written

    async def leases(self, agent: str) -> tuple[SlotLease, ...]:
        await asyncio.sleep(0)
        self.operations["read"] += 1
        return tuple(lease for (owner, _), lease in sorted(self._leases.items()) if owner == agent)

    async def take(
        self, agent: str, slot: int, holder: str, expires: datetime, seen: SlotLease | None
    ) -> SlotLease:
        await asyncio.sleep(0)
        self.operations["write"] += 1
        current = self._leases.get((agent, slot))
        _as_seen(current, seen, f"slot {slot} of {agent} taken")
        lease = SlotLease(slot, holder, expires, self._etag())
        self._leases[(agent, slot)] = lease
        return lease

    async def release(self, agent: str, lease: SlotLease) -> None:
        await asyncio.sleep(0)
        self.operations["write"] += 1
        current = self._leases.get((agent, lease.slot))
        if current is not None and current.etag == lease.etag:
            del self._leases[(agent, lease.slot)]


def _as_seen(current: _Row | None, seen: _Row | None, conflict: str) -> None:
    """The If-Match of a Table write: the row must be as the writer read it (absent, or
    with the ETag it read), or the write lost a race."""
    if (current is None) != (seen is None) or (
        current is not None and seen is not None and current.etag != seen.etag
    ):
        raise ConcurrencyConflict(conflict)
