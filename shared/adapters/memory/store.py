"""In-memory adapters with the same semantics as the Azure ones (ETags, duplicate ids).

They pass the same contract tests as Table Storage, so the use-case tests that run on
them at full speed exercise real concurrency rules, not a looser imitation.
"""

from __future__ import annotations

import asyncio
import bisect
import dataclasses
import itertools
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from shared.adapters import bulk_scan
from shared.adapters.queues import queue_of
from shared.domain.archive import ArchivedMark
from shared.domain.bulk import BulkJob, JobState, Lease
from shared.domain.bulk_request import BulkFilter
from shared.domain.health import AgentDrain, AgentHealth, AgentRecords, SeenOutages, SweepRecord
from shared.domain.model import HistoryEntry, OrderProcess, Outgoing, ProcessState, StateRecord
from shared.domain.rest_index import RestEntry, RestPage, RestRange, row_key
from shared.ports import (
    MOVE_RACES,
    AlreadyExists,
    BusUnavailable,
    ConcurrencyConflict,
    OrderPage,
    Page,
    Poison,
    WatchEntry,
    WatchPage,
)


class InMemoryStateStore:
    def __init__(self) -> None:
        self._records: dict[str, tuple[OrderProcess, str]] = {}
        self._history: dict[str, list[HistoryEntry]] = {}
        self._watch: dict[str, tuple[datetime, str, int]] = {}
        self._customers: dict[str, str] = {}
        """Whose order each entry is, as the intake wrote it (WatchEntry.customer)."""
        self._rest: dict[ProcessState, dict[str, RestEntry]] = {}
        self._rest_keys: dict[ProcessState, list[str]] = {}
        """Each rest's keys, sorted: a range read is a bisection."""
        self._marks: dict[str, ArchivedMark] = {}
        """Archived orders' marks: their ids stay taken (shared/domain/archive.py)."""
        self._etags = itertools.count(1)
        self.operations: Counter[str] = Counter()

    def _etag(self) -> str:
        return f'W/"{next(self._etags)}"'

    async def create(self, process: OrderProcess, history: Sequence[HistoryEntry]) -> str:
        await asyncio.sleep(0)
        self.operations["write"] += 1
        if process.order_id in self._records or process.order_id in self._marks:
            raise AlreadyExists(process.order_id)
        etag = self._etag()
        self._records[process.order_id] = (replace(process, etag=None, history=()), etag)
        self._history[process.order_id] = list(history)
        return etag

    async def load(self, order_id: str) -> OrderProcess | None:
        await asyncio.sleep(0)
        self.operations["read"] += 1
        found = self._records.get(order_id)
        if found is None:
            return None
        process, etag = found
        return replace(process, etag=etag)

    async def archived(self, order_id: str) -> ArchivedMark | None:
        await asyncio.sleep(0)
        self.operations["read"] += 1
        return self._marks.get(order_id)

    async def save(self, process: OrderProcess, history: Sequence[HistoryEntry]) -> str:
        await asyncio.sleep(0)
        self.operations["write"] += 1
        current = self._records.get(process.order_id)
        if current is None or current[1] != process.etag:
            raise ConcurrencyConflict(process.order_id)
        etag = self._etag()
        self._records[process.order_id] = (replace(process, etag=None, history=()), etag)
        self._history[process.order_id].extend(history)
        return etag

    async def history(self, order_id: str) -> tuple[HistoryEntry, ...]:
        self.operations["query"] += 1
        return tuple(self._history.get(order_id, ()))

    async def list_by_state(
        self, state: ProcessState | None, page_size: int, continuation: str | None
    ) -> Page:
        self.operations["query"] += 1
        ids = sorted(
            order_id
            for order_id, (process, _) in self._records.items()
            if (state is None or process.state.process_state is state)
            and (continuation is None or order_id > continuation)
        )
        chosen = ids[:page_size]
        items = tuple(self._records[i][0].state for i in chosen)
        more = len(ids) > page_size
        return Page(items, chosen[-1] if more and chosen else None)

    async def watch(
        self,
        order_id: str,
        check_at: datetime,
        *,
        replace: bool,
        version: int = 0,
        customer: str = "",
    ) -> str | None:
        await asyncio.sleep(0)
        self.operations["write"] += 1
        if replace or order_id not in self._watch:
            etag = self._etag()
            self._watch[order_id] = (check_at, etag, version)
            self._customers[order_id] = customer
            return etag
        return None

    async def rewatch(self, order_id: str, check_at: datetime, *, version: int = 0) -> None:
        await asyncio.sleep(0)
        self.operations["write"] += 1
        at, _, kept = self._watch.get(order_id, (check_at, "", version))
        self._watch[order_id] = (at, self._etag(), kept)

    async def move_up(self, order_id: str, check_at: datetime, *, version: int = 0) -> bool:
        """The Table adapter's read, then its conditional write: another writer may
        come in between (each `sleep(0)` is a point where the event loop switches)."""
        for _ in range(MOVE_RACES):
            await asyncio.sleep(0)
            self.operations["read"] += 1
            found = self._watch.get(order_id)
            if found is None:
                if await self.watch(order_id, check_at, replace=False, version=version):
                    return True
                continue
            await asyncio.sleep(0)
            self.operations["write"] += 1
            current = self._watch.get(order_id)
            if current is not None and current[1] == found[1]:
                self._watch[order_id] = (min(found[0], check_at), self._etag(), current[2])
                return check_at < found[0]
        raise ConcurrencyConflict(f"watch entry of {order_id}: lost {MOVE_RACES} races")

    async def due(self, now: datetime, limit: int) -> tuple[WatchEntry, ...]:
        await asyncio.sleep(0)
        self.operations["query"] += 1
        found = sorted(
            (self._entry(order_id) for order_id in self._watch),
            key=lambda e: (e.check_at, e.order_id),
        )
        return tuple(e for e in found if e.check_at <= now)[:limit]

    def _entry(self, order_id: str) -> WatchEntry:
        at, etag, version = self._watch[order_id]
        customer = self._customers.get(order_id, "")
        return WatchEntry(order_id, at, etag, version, customer)

    async def watch_list(self, limit: int, continuation: str | None) -> WatchPage:
        await asyncio.sleep(0)
        self.operations["query"] += 1
        ids = sorted(i for i in self._watch if continuation is None or i > continuation)
        chosen = ids[: max(limit, 0)]
        more = len(ids) > len(chosen) and bool(chosen)
        return WatchPage(tuple(map(self._entry, chosen)), chosen[-1] if more else None)

    async def states(self, order_ids: Sequence[str]) -> tuple[StateRecord, ...]:
        await asyncio.sleep(0)
        self.operations["read"] += len(order_ids)
        found = (self._records.get(i) for i in order_ids)
        return tuple(f[0].state for f in found if f is not None)

    async def put_rest(self, entry: RestEntry) -> None:
        await asyncio.sleep(0)
        self.operations["write"] += 1
        entries = self._rest.setdefault(entry.state, {})
        if entry.key not in entries:
            bisect.insort(self._rest_keys.setdefault(entry.state, []), entry.key)
        entries[entry.key] = entry

    async def drop_rest(
        self, state: ProcessState, order_id: str, created_at: datetime, *, below: int | None = None
    ) -> None:
        await asyncio.sleep(0)
        self.operations["write"] += 1
        key = row_key(created_at, order_id)
        entries = self._rest.get(state, {})
        found = entries.get(key)
        if found is None or (below is not None and found.version >= below):
            return
        del entries[key]
        keys = self._rest_keys[state]
        keys.pop(bisect.bisect_left(keys, key))

    async def rest_entries(self, keys: RestRange, limit: int, continuation: str | None) -> RestPage:
        await asyncio.sleep(0)
        self.operations["query"] += 1
        start, inclusive = keys.start(continuation)
        sorted_keys = self._rest_keys.get(keys.state, [])
        at = (bisect.bisect_left if inclusive else bisect.bisect_right)(sorted_keys, start)
        end = bisect.bisect_left(sorted_keys, keys.hi)
        entries = self._rest[keys.state] if sorted_keys else {}
        chosen: list[RestEntry] = []
        for key in sorted_keys[at:end]:
            if len(chosen) >= limit:
                return RestPage(tuple(chosen), chosen[-1].key if chosen else None)
            if keys.holds(entries[key]):
                chosen.append(entries[key])
        return RestPage(tuple(chosen), None)

    async def unsharded_rest(
        self, state: ProcessState, limit: int, continuation: str | None
    ) -> RestPage:
        """None: this store's index was never in another layout."""
        await asyncio.sleep(0)
        return RestPage((), None)

    async def drop_unsharded_rest(self, entry: RestEntry) -> None:
        await asyncio.sleep(0)

    async def reschedule(self, entry: WatchEntry, check_at: datetime) -> None:
        await asyncio.sleep(0)
        self.operations["write"] += 1
        current = self._watch.get(entry.order_id)
        if current is not None and current[1] == entry.etag:
            self._watch[entry.order_id] = (check_at, self._etag(), current[2])
            self._customers.pop(entry.order_id, None)  # as the table's replace drops it

    async def unwatch(self, order_id: str, version: int | None = None) -> None:
        await asyncio.sleep(0)
        self.operations["write"] += 1
        current = self._watch.get(order_id)
        if current is not None and (version is None or current[2] <= version):
            del self._watch[order_id]
            self._customers.pop(order_id, None)

    async def unwatch_entry(self, entry: WatchEntry) -> None:
        await asyncio.sleep(0)
        self.operations["write"] += 1
        current = self._watch.get(entry.order_id)
        if current is not None and current[1] == entry.etag:
            del self._watch[entry.order_id]
            self._customers.pop(entry.order_id, None)

    async def purge(self, mark: ArchivedMark, etag: str) -> bool:
        """The archive's purge (shared/adapters/memory/archive.py): the order's mark in
        place of every row of it, and its watch entry dropped, only at `etag`; one
        already marked is purged again."""
        await asyncio.sleep(0)
        self.operations["write"] += 1
        order_id = mark.order_id
        current = self._records.get(order_id)
        if current is not None and current[1] != etag:
            return False
        self._marks.setdefault(order_id, mark)
        self._records.pop(order_id, None)
        self._history.pop(order_id, None)
        self._watch.pop(order_id, None)
        self._customers.pop(order_id, None)
        return True

    async def put_mark(self, mark: ArchivedMark) -> bool:
        """A mark where no order is (the backfill of marks, memory_archive.py)."""
        await asyncio.sleep(0)
        if mark.order_id in self._records or mark.order_id in self._marks:
            return False
        self._marks[mark.order_id] = mark
        return True

    def forget_mark(self, order_id: str) -> None:
        """As a purge before marks were kept left the id: free (tests of the backfill)."""
        self._marks.pop(order_id, None)

    async def ping(self) -> None:
        return None

    def watched(self) -> dict[str, datetime]:
        return {order_id: at for order_id, (at, _, _) in self._watch.items()}


class InMemoryBulkStore:
    """Bulk jobs beside an in-memory state store, whose orders it scans."""

    def __init__(self, store: InMemoryStateStore) -> None:
        self._store = store
        self._jobs: dict[str, tuple[BulkJob, str]] = {}
        self._lease: Lease | None = None
        self._etags = itertools.count(1)

    def _etag(self) -> str:
        return f'W/"job-{next(self._etags)}"'

    async def create_job(self, job: BulkJob) -> str:
        await asyncio.sleep(0)
        if job.bulk_id in self._jobs:
            raise AlreadyExists(job.bulk_id)
        etag = self._etag()
        self._jobs[job.bulk_id] = (replace(job, etag=None), etag)
        return etag

    async def load_job(self, bulk_id: str) -> BulkJob | None:
        await asyncio.sleep(0)
        found = self._jobs.get(bulk_id)
        return None if found is None else replace(found[0], etag=found[1])

    async def save_job(self, job: BulkJob) -> str:
        await asyncio.sleep(0)
        current = self._jobs.get(job.bulk_id)
        if current is None or current[1] != job.etag:
            raise ConcurrencyConflict(job.bulk_id)
        etag = self._etag()
        self._jobs[job.bulk_id] = (replace(job, etag=None), etag)
        return etag

    async def jobs(self, state: JobState) -> tuple[BulkJob, ...]:
        await asyncio.sleep(0)
        return tuple(
            replace(job, etag=etag)
            for _, (job, etag) in sorted(self._jobs.items())
            if job.state is state
        )

    async def orders(
        self,
        state: ProcessState,
        page_size: int,
        continuation: str | None,
        flt: BulkFilter | None = None,
        *,
        whole: bool = True,
    ) -> OrderPage:
        return await bulk_scan.orders(self._store, state, page_size, continuation, flt, whole=whole)

    async def lease(self) -> Lease | None:
        await asyncio.sleep(0)
        return self._lease

    async def put_lease(self, lease: Lease, seen: Lease | None) -> Lease:
        await asyncio.sleep(0)
        current = self._lease.etag if self._lease else None
        if current != (seen.etag if seen else None):
            raise ConcurrencyConflict("bulk lease")
        self._lease = replace(lease, etag=self._etag())
        return self._lease


class InMemoryHealthStore:
    """Keeps sweeps for `retention` before the newest one, as the Table adapter does."""

    def __init__(self, retention: timedelta = timedelta(hours=1)) -> None:
        self._health: dict[tuple[str, str], AgentHealth] = {}
        self._drains: dict[str, AgentDrain] = {}
        self._sweeps: list[SweepRecord] = []
        self._outages: dict[str, SeenOutages] = {}
        self._retention = retention

    async def publish_health(self, health: AgentHealth) -> None:
        await asyncio.sleep(0)
        self._health[(health.agent, health.instance)] = health

    async def agent_health(self) -> tuple[AgentHealth, ...]:
        await asyncio.sleep(0)
        return tuple(self._health[k] for k in sorted(self._health))

    async def forget_agents(self, silent_since: datetime) -> int:
        await asyncio.sleep(0)
        gone = [k for k, h in self._health.items() if h.heartbeat_at < silent_since]
        for key in gone:
            del self._health[key]
        return len(gone)

    async def agent_records(self) -> AgentRecords:
        await asyncio.sleep(0)
        health = tuple(self._health[k] for k in sorted(self._health))
        return AgentRecords(health, tuple(self._drains[k] for k in sorted(self._drains)))

    async def set_drain(self, drain: AgentDrain) -> None:
        await asyncio.sleep(0)
        self._drains[drain.agent] = drain

    async def record_sweep(self, sweep: SweepRecord) -> None:
        await asyncio.sleep(0)
        cutoff = sweep.started_at - self._retention
        kept = [s for s in self._sweeps if s.started_at >= cutoff and not _same_sweep(s, sweep)]
        self._sweeps = [*kept, sweep]

    async def recent_sweeps(self, limit: int) -> tuple[SweepRecord, ...]:
        await asyncio.sleep(0)
        newest = sorted(self._sweeps, key=lambda s: s.instance)
        newest.sort(key=lambda s: s.started_at, reverse=True)  # stable: ties by instance
        return tuple(newest[:limit])

    async def share_outages(self, seen: SeenOutages) -> None:
        await asyncio.sleep(0)
        cutoff = seen.at - self._retention
        self._outages = {k: v for k, v in self._outages.items() if v.until >= cutoff}
        self._outages[seen.instance] = seen

    async def seen_outages(self) -> tuple[SeenOutages, ...]:
        await asyncio.sleep(0)
        return tuple(self._outages[k] for k in sorted(self._outages))


def _same_sweep(a: SweepRecord, b: SweepRecord) -> bool:
    """One record per (instance, started_at): recording it again replaces it."""
    return (a.instance, a.started_at) == (b.instance, b.started_at)


@dataclass(frozen=True)
class Sent(Outgoing):
    """A message as the bus sent it: with the queue it named for its destination."""

    queue: str = ""

    @classmethod
    def of(cls, message: Outgoing) -> Sent:
        fields = {f.name: getattr(message, f.name) for f in dataclasses.fields(Outgoing)}
        return cls(**fields, queue=queue_of(message.destination))


class InMemoryBus:
    """Records what was sent per queue; drops a repeated message id like the broker does."""

    def __init__(self) -> None:
        self.sent: list[Sent] = []
        self.parked: list[Poison] = []
        self.duplicates = 0
        self._ids: set[str] = set()
        self.fail_next = 0
        self.failures = 0
        """Injected failures that were used up, as the real bus counts its failed calls."""

    def _fail_if_asked(self, what: str) -> None:
        if self.fail_next:
            self.fail_next -= 1
            self.failures += 1
            raise BusUnavailable(f"injected {what} failure")

    async def send(self, messages: Sequence[Outgoing]) -> None:
        await asyncio.sleep(0)
        self._fail_if_asked("bus")
        for message in messages:
            if message.message_id in self._ids:
                self.duplicates += 1
                continue
            self._ids.add(message.message_id)
            self.sent.append(Sent.of(message))

    async def park(self, poison: Poison) -> None:
        await asyncio.sleep(0)
        self._fail_if_asked("send")
        self.parked.append(poison)

    async def ping(self) -> None:
        """Fails like a send: an injected failure is used up by whichever comes first."""
        await asyncio.sleep(0)
        self._fail_if_asked("bus")

    def on(self, queue: str) -> list[Sent]:
        return [m for m in self.sent if m.queue == queue]

    def take(self, queue: str) -> list[Sent]:
        """Remove and return what was sent to a queue, as a consumer would."""
        taken = self.on(queue)
        self.sent = [m for m in self.sent if m.queue != queue]
        return taken
