"""The bulk runners' lease: at most one instance works the bulk jobs at a time.

The host's timer lock holds within one process only (the local runtime runs several,
and a scaled-out app several instances), so a tick on a second instance while the first
is mid-page would act on that page too, at twice the pace. A run first takes the lease,
one row written conditionally on the ETag it read, for its budget plus `GRACE`; the
others find it held and pass. It renews the lease (another conditional write) before
each page, so a run whose lease expired and was taken stops before claiming more, and
releases it when done, so the next tick anywhere can go on at once.

`GRACE` covers an action that began just before the run's deadline: the lease outlives
the last action a run can start, so the next holder's replay of an unfinished page
reads that action in the order's history instead of acting again.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Final

from shared.domain.bulk import Lease
from shared.ports import BulkStore, ConcurrencyConflict
from shared.telemetry.logsafe import app_logger

log = app_logger("orders.bulk")

GRACE: Final = timedelta(seconds=30)


@dataclass
class HeldLease:
    """The lease as this run last wrote it."""

    jobs: BulkStore
    lease: Lease

    async def renew(self) -> bool:
        """Write it again as it is; False: another run took it (this one's expired)."""
        try:
            self.lease = await self.jobs.put_lease(self.lease, self.lease)
        except ConcurrencyConflict:
            log.warning("bulk: the lease of %s was taken by another run", self.lease.holder)
            return False
        return True

    async def release(self, now: datetime) -> None:
        """Free it for the next tick; taken already, it is not ours to free."""
        try:
            await self.jobs.put_lease(replace(self.lease, until=now), self.lease)
        except ConcurrencyConflict:
            return


async def take(jobs: BulkStore, instance: str, now: datetime, until: datetime) -> HeldLease | None:
    """The lease until `until`, or None when another run holds it or took it first. The
    holder names the run, not only the instance: a restarted process waits out its dead
    predecessor's lease like any other instance."""
    seen = await jobs.lease()
    if seen is not None and not seen.free(now):
        log.debug("bulk: %s holds the lease until %s", seen.holder, seen.until.isoformat())
        return None
    holder = f"{instance}:{uuid.uuid4().hex[:8]}"
    try:
        return HeldLease(jobs, await jobs.put_lease(Lease(holder, until), seen))
    except ConcurrencyConflict:
        return None
