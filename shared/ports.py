"""The ports the use cases depend on; adapters implement them for Azure and for tests."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from typing import Protocol

from shared.domain.archive import ArchiveCursor, ArchivedEntry, ArchivedMark, ArchivedOrder
from shared.domain.bulk import BulkJob, JobState, Lease
from shared.domain.bulk_request import BulkFilter
from shared.domain.fairness import Admission, CustomerLoad, CustomerPolicy, Promoted
from shared.domain.health import AgentDrain, AgentHealth, AgentRecords, SeenOutages, SweepRecord
from shared.domain.in_doubt import RemoteOutcome
from shared.domain.limits import Claims, Schedule, SlotLease
from shared.domain.model import (
    HistoryEntry,
    JsonObject,
    OrderProcess,
    Outgoing,
    ProcessState,
    StateRecord,
)
from shared.domain.reconcile import ReconcileRun
from shared.domain.rest_index import RestEntry, RestPage, RestRange


class StateStoreError(Exception):
    """Base of what a state store raises; adapters translate driver errors into these."""


class ConcurrencyConflict(StateStoreError):
    """The record changed since it was read (ETag mismatch): someone else won the race."""


class AlreadyExists(StateStoreError):
    """An order with this id is already stored."""


class StoreUnavailable(StateStoreError):
    """The store could not be reached; the caller should retry later."""


class UnreadableOrder(Exception):
    """A stored order this code cannot read (a row written by hand or by a layout it does
    not know): reading it again finds it the same, so it is neither an outage to wait out
    nor a race to retry. A caller going through many orders skips it and names it."""


class BusUnavailable(Exception):
    """A message could not be sent; the triggering message should be retried."""


IN_PROGRESS_CODE = "operation-in-progress"
"""`409` with this code: an earlier call with the key is still running at the service."""
ABANDONED_CODE = "operation-abandoned"
"""`409` with this code: the key was abandoned at the service and can never apply."""


class RemoteError(Exception):
    """Base of what a remote service call raises."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class TransientRemoteError(RemoteError):
    """Worth retrying: timeouts, connection errors, 408, 429, 5xx, an open circuit."""

    def __init__(self, code: str, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(code, message)
        self.retry_after = retry_after
        """The service's own hint (`Retry-After`, seconds): a retry sooner is wasted on
        it, so the retry waits at least this long, or gives up if the deadline is nearer."""


class OperationInProgress(TransientRemoteError):
    """`409 operation-in-progress`: an earlier call with this key is still running at the
    service. The key is unsettled, never failed: the first call may yet apply, so only a
    retry with the same key (or the Supervisor's question) can learn how it ended. The
    service answered, so it is no evidence against the service's health."""

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(IN_PROGRESS_CODE, message, retry_after=retry_after)


class RateLimited(TransientRemoteError):
    """`429`: the service is over its quota. It answered, so this is no evidence against
    its health (the breaker does not count it) and never a failure of the order; the
    caller slows down (usecases.throttle), honouring `retry_after` when there is one."""


class PermanentRemoteError(RemoteError):
    """Retrying cannot help (out of stock, card declined): the step has failed."""


@dataclass(frozen=True)
class Page:
    items: tuple[StateRecord, ...]
    continuation: str | None


@dataclass(frozen=True)
class WatchEntry:
    """An in-flight order on the Supervisor's watch list, due to be checked at `check_at`."""

    order_id: str
    check_at: datetime
    etag: str
    version: int = 0
    """The state version the entry was written for (see `WatchList.unwatch`)."""
    customer: str = ""
    """Whose order, as the intake wrote it with a customer ledger on: the Supervisor that
    finds the order missing gives that customer's count back (docs/fairness.md)."""


@dataclass(frozen=True)
class WatchPage:
    items: tuple[WatchEntry, ...]
    continuation: str | None


class Clock(Protocol):
    def now(self) -> datetime: ...

    async def sleep(self, seconds: float) -> None: ...


class OrderRows(Protocol):
    """An order's own rows: its state, steps and history, written whole under one ETag,
    and the mark an archived order leaves under its key. The intake, the Scheduler and
    every reader of one order need these."""

    async def create(self, process: OrderProcess, history: Sequence[HistoryEntry]) -> str:
        """Store a new order's rows in one transaction; raises AlreadyExists, also for
        the id of an archived order (its mark holds the key). Returns the ETag."""
        ...

    async def load(self, order_id: str) -> OrderProcess | None:
        """None for an order never stored and for an archived one (only its mark is left)."""
        ...

    async def archived(self, order_id: str) -> ArchivedMark | None:
        """The mark an archived order left under its key (one point read); None when
        the id is free or holds a live order."""
        ...

    async def save(self, process: OrderProcess, history: Sequence[HistoryEntry]) -> str:
        """Replace state and step rows and append history in one transaction, conditional on
        `process.etag`; raises ConcurrencyConflict when it is stale. Returns the new ETag."""
        ...

    async def history(self, order_id: str) -> tuple[HistoryEntry, ...]: ...

    async def list_by_state(
        self, state: ProcessState | None, page_size: int, continuation: str | None
    ) -> Page: ...

    async def states(self, order_ids: Sequence[str]) -> tuple[StateRecord, ...]:
        """The state records of these orders, in that order (point reads, all at once);
        an order gone meanwhile is left out."""
        ...


MOVE_RACES = 5
"""Writes of the same watch entry in between, each read again, before `move_up` gives up
(ConcurrencyConflict): a few writers share an entry, each with one write at a time."""


class WatchList(Protocol):
    """The Supervisor's watch list: an entry per in-flight order, due at its check time
    (docs/architecture.md, "The Supervisor's paths")."""

    async def watch(
        self,
        order_id: str,
        check_at: datetime,
        *,
        replace: bool,
        version: int = 0,
        customer: str = "",
    ) -> str | None:
        """Put an order on the Supervisor's watch list for state `version`. Without
        `replace` an existing entry is kept as it is (its earlier check time must not be
        pushed back). The ETag of the entry this call wrote, None when it found one (a
        later `reschedule` of the entry as written then loses to anyone who wrote it
        since). `customer` is kept on the entry until it is replaced or rescheduled."""
        ...

    async def rewatch(self, order_id: str, check_at: datetime, *, version: int = 0) -> None:
        """Make every earlier read of the order's entry stale: an existing entry keeps
        its check time and version but gets a new ETag; a missing one is written. The
        intake calls it once its order is known to exist, so that a Supervisor that read
        the entry while the order was still missing cannot delete it (see
        `unwatch_entry`)."""
        ...

    async def move_up(self, order_id: str, check_at: datetime, *, version: int = 0) -> bool:
        """Make the order due by `check_at`, never later than its entry already says: the
        entry gets the earlier of its check and `check_at`, conditional on the ETag just
        read (a write in between: read again), keeping its version and customer; a
        missing one is inserted for `version`. The entry's ETag changes either way, so
        a writer holding an older read loses to this one (the intake's move of its own
        entry to a line's hold). True when the check moved.
        For a writer that knows of an earlier check but not of the entry (a promotion,
        the Scheduler's step due sooner than the one before it): an earlier check
        written by anyone else, before or at the same moment, survives. Raises
        ConcurrencyConflict after `MOVE_RACES` writes in between."""
        ...

    async def due(self, now: datetime, limit: int) -> tuple[WatchEntry, ...]:
        """Watch entries whose check time has passed: a query over in-flight orders only."""
        ...

    async def reschedule(self, entry: WatchEntry, check_at: datetime) -> None:
        """Move an entry's check time, conditional on its ETag; a lost race is ignored."""
        ...

    async def unwatch(self, order_id: str, version: int | None = None) -> None:
        """Take an order off the watch list. With `version`, only an entry written for
        that state version or an earlier one goes: an operator's resubmit that re-watched
        the order a moment after the Scheduler finished it keeps its entry."""
        ...

    async def unwatch_entry(self, entry: WatchEntry) -> None:
        """Delete the entry only as it was read, conditional on its ETag; a lost race is
        ignored. The Supervisor's way to drop the entry of an order it found missing."""
        ...

    async def watch_list(self, limit: int, continuation: str | None) -> WatchPage:
        """The watch list in key order, whatever the check times: the in-flight orders
        (and, until healed, an order whose delivery stopped short of its rest)."""
        ...


class RestIndex(Protocol):
    """The orders come to rest, one entry each, by state, day and customer
    (shared/domain/rest_index.py): what the views and the archive read instead of
    every order."""

    async def put_rest(self, entry: RestEntry) -> None:
        """Write (or replace) the rest entry of an order come to rest."""
        ...

    async def drop_rest(
        self, state: ProcessState, order_id: str, created_at: datetime, *, below: int | None = None
    ) -> None:
        """Delete the order's entry in `state`'s rest (with `below`, only one written for
        an earlier state version: the change that made it has been saved); one already
        gone is no error."""
        ...

    async def rest_entries(self, keys: RestRange, limit: int, continuation: str | None) -> RestPage:
        """Up to `limit` entries in the range, in key order, by one range read (the
        customer filtered server-side); raises ValueError for a cursor it did not hand
        out."""
        ...


class UnshardedRest(Protocol):
    """Rest entries a store still holds in the layout before its rest index was sharded
    (shared/adapters/table/rest.py): read with the others until the move
    (shared/usecases/history/rest_shards.py) has taken each to its shard."""

    async def unsharded_rest(
        self, state: ProcessState, limit: int, continuation: str | None
    ) -> RestPage:
        """Up to `limit` of the state's entries still unsharded, in key order."""
        ...

    async def drop_unsharded_rest(self, entry: RestEntry) -> None:
        """Delete the unsharded entry; one already gone is no error."""
        ...


class WatchedOrders(OrderRows, WatchList, Protocol):
    """The order rows and the watch list: a reader of what is in flight, or a promotion
    that watches the order it lets run."""


class OrdersAtRest(OrderRows, RestIndex, Protocol):
    """The order rows and the rest index: a reader of orders through their rest entries,
    or a writer of the entries of the rows it reads."""


class StateStore(OrderRows, WatchList, RestIndex, Protocol):
    """The whole state table, as the composition root builds and decorates it and the
    unit of work writes it (all three parts in one change). Any other caller names the
    part it uses."""

    async def ping(self) -> None:
        """Raise StoreUnavailable unless the store answers."""
        ...


class HealthStore(Protocol):
    """Where Agents publish heartbeats and the Supervisor logs its sweeps (ops records)."""

    async def publish_health(self, health: AgentHealth) -> None:
        """Upsert this instance's view of one agent (last write wins)."""
        ...

    async def agent_health(self) -> tuple[AgentHealth, ...]:
        """Every published (agent, instance) view: one small partition, no history."""
        ...

    async def forget_agents(self, silent_since: datetime) -> int:
        """Delete heartbeats older than `silent_since` (instances that scaled in), so the
        partition routing reads stays the size of the live fleet. Returns how many."""
        ...

    async def agent_records(self) -> AgentRecords:
        """Heartbeats and drain flags in one read: the routing refresh costs one query."""
        ...

    async def set_drain(self, drain: AgentDrain) -> None:
        """Store an agent's drain flag (last write wins); heartbeat sweeps never remove it."""
        ...

    async def record_sweep(self, sweep: SweepRecord) -> None: ...

    async def recent_sweeps(self, limit: int) -> tuple[SweepRecord, ...]:
        """Newest first."""
        ...

    async def share_outages(self, seen: SeenOutages) -> None:
        """Replace this instance's shared outages, and forget instances' that ended
        before `seen.at` minus the retention."""
        ...

    async def seen_outages(self) -> tuple[SeenOutages, ...]:
        """Every instance's shared outages (one small partition)."""
        ...


@dataclass(frozen=True)
class OrderPage:
    """A page of whole orders (state, steps and order) as a bulk job scans them."""

    items: tuple[OrderProcess, ...]
    continuation: str | None


class BulkStore(Protocol):
    """The durable bulk jobs (their own partition of the state table) and the scan of
    orders they work through, a page at a time."""

    async def create_job(self, job: BulkJob) -> str:
        """Store a new job; returns its ETag."""
        ...

    async def load_job(self, bulk_id: str) -> BulkJob | None: ...

    async def save_job(self, job: BulkJob) -> str:
        """Replace the job conditional on `job.etag`; raises ConcurrencyConflict when
        another run changed it first. Returns the new ETag."""
        ...

    async def jobs(self, state: JobState) -> tuple[BulkJob, ...]:
        """The jobs in one state (a query over the jobs' partition only)."""
        ...

    async def orders(
        self,
        state: ProcessState,
        page_size: int,
        continuation: str | None,
        flt: BulkFilter | None = None,
        *,
        whole: bool = True,
    ) -> OrderPage:
        """One page of the orders in `state`, in a stable key order, narrowed by the
        filter's customer and created days where the store can (the caller still checks
        every order); a page may be short. `whole=False`: orders at rest may come as
        their rest entries show them, without steps or items, and no order is read.
        Raises ValueError for a continuation it did not hand out."""
        ...

    async def lease(self) -> Lease | None:
        """The bulk runners' lease as last written, with its ETag; None before the first."""
        ...

    async def put_lease(self, lease: Lease, seen: Lease | None) -> Lease:
        """Write the lease conditional on `seen` (its ETag; None: that there is none yet);
        raises ConcurrencyConflict when it changed since. Returns it with its new ETag."""
        ...


class MessageBus(Protocol):
    async def send(self, messages: Sequence[Outgoing]) -> None:
        """Send in order within each queue (different queues may go concurrently);
        raises BusUnavailable when any of them failed. Duplicate message ids may be
        dropped."""
        ...

    async def ping(self) -> None: ...

    async def park(self, poison: Poison) -> None:
        """Put a message no retry can fix in its queue's dead-letter sub-queue, with the
        reason; raises BusUnavailable."""
        ...


@dataclass(frozen=True)
class Poison:
    """A message rejected on its first delivery, as it goes to the dead-letter queue."""

    queue: str
    message_id: str
    body: bytes
    reason: str
    """A short code: invalid-message, unknown-order, unknown-step."""
    detail: str
    delivery_count: int = 1


@dataclass(frozen=True)
class RemoteCall:
    order_id: str
    operation: str
    idempotency_key: str
    payload: JsonObject
    undoes: str | None = None
    """A compensation's do key: a provider applies an undo only once that key applied."""


class RemoteService(Protocol):
    async def invoke(self, call: RemoteCall, timeout: float) -> JsonObject:
        """Raise TransientRemoteError or PermanentRemoteError; return the result on success."""
        ...

    async def probe(self, timeout: float) -> None:
        """A cheap health call (no effect); raise TransientRemoteError unless it answers."""
        ...

    async def outcome(self, key: str, timeout: float) -> RemoteOutcome:
        """What the service did with `key` (its read API, no effect). Raise
        TransientRemoteError when asking again may help; an answer that cannot be read is
        RemoteOutcome.unknown, never a guess."""
        ...

    async def abandon(self, key: str, timeout: float) -> RemoteOutcome:
        """Settle `key` for good at the service: APPLIED (with its result) when it had
        applied, ABANDONED when it now never will, IN_PROGRESS while a call with it runs,
        NOT_SUPPORTED from a service without the route. Raise TransientRemoteError when
        asking again may help; an unreadable answer is RemoteOutcome.unknown."""
        ...


class ReconcileStore(Protocol):
    """The sample reconciliation checks and the runs it keeps for the operator page."""

    async def finished_sample(
        self, since: datetime, start: str, limit: int
    ) -> tuple[OrderProcess, ...]:
        """Up to `limit` orders at rest (Processed, Compensated, Cancelled, and held in
        Error or Suspended) and last changed at or after `since`, in key order from the
        order id `start` (wrapping round once), read by a server-filtered query whose
        pages are capped: never every order."""
        ...

    async def record_run(self, run: ReconcileRun) -> None: ...

    async def recent_runs(self, limit: int) -> tuple[ReconcileRun, ...]:
        """Newest first."""
        ...


@dataclass(frozen=True)
class Entered:
    """What the ledger did with a customer's order at the intake."""

    admission: Admission
    load: CustomerLoad
    """The customer's load as found, before this order."""
    known: bool = False
    """The order was already in the ledger (a repeat): `admission` is where it stands."""


class CustomerLedger(Protocol):
    """Per customer, its orders that are not at rest, running or waiting in its line.
    Entering and leaving are keyed by order id, so a repeat changes nothing: the
    Supervisor can repeat a leave that a crash may or may not have done."""

    async def enter(
        self,
        customer: str,
        order_id: str,
        at: datetime,
        policy: CustomerPolicy,
        *,
        high: bool = False,
    ) -> Entered:
        """Decide (fairness.admit) and record the order in one conditional write; a
        refused order is not recorded. `high`: its lane, for its promotion's nudge."""
        ...

    async def rejoin(self, customer: str, order_id: str, at: datetime) -> None:
        """An order that left a rest (an operator moved it on) runs again: counted,
        never refused or made to wait (the operator chose it)."""
        ...

    async def leave(
        self, customer: str, order_id: str, policy: CustomerPolicy, at: datetime | None = None
    ) -> Promoted | None:
        """The order came to rest (or was never stored). Returns the order of the same
        customer that it promotes out of the line (fairness.promotes), to be nudged. With
        `at`, the customer's pace of ends (fairness.CustomerLoad.ended) moves on."""
        ...

    async def standing(self, customer: str, order_id: str) -> Admission | None:
        """Where the order stands: RUN (counted running, promoted or not yet nudged),
        WAIT (in its customer's line) or None (not counted)."""
        ...

    async def loads(self, limit: int) -> tuple[tuple[str, CustomerLoad], ...]:
        """The customers with the most open orders, most first (the operator page)."""


class LimitStore(Protocol):
    """The shared rows that hold an agent's limits across instances (domain.limits):
    its rate schedule and its concurrency leases."""

    async def schedule(self, agent: str) -> Schedule | None:
        """The agent's rate row; None before the first call took a slot."""
        ...

    async def put_schedule(
        self, agent: str, next_start: datetime, seen: Schedule | None
    ) -> Schedule:
        """Write the rate row conditional on `seen` (its ETag; None: that there is none
        yet); raises ConcurrencyConflict when it changed since."""
        ...

    async def claims(self, agent: str) -> Claims | None:
        """The carried slots already used (domain.limits.claim); None before the first."""
        ...

    async def put_claims(
        self, agent: str, slots: tuple[datetime, ...], seen: Claims | None
    ) -> Claims:
        """Write the claimed slots conditional on `seen` (None: that there is no row
        yet); raises ConcurrencyConflict when it changed since."""
        ...

    async def leases(self, agent: str) -> tuple[SlotLease, ...]:
        """Every concurrency lease row of the agent, expired or not (one query)."""
        ...

    async def take(
        self, agent: str, slot: int, holder: str, expires: datetime, seen: SlotLease | None
    ) -> SlotLease:
        """Hold `slot` until `expires`, conditional on `seen` (None: the row must not
        exist); raises ConcurrencyConflict when another instance took it first."""
        ...

    async def release(self, agent: str, lease: SlotLease) -> None:
        """Give the slot back, conditional on its ETag; a lease already taken over or
        gone is left as it is."""
        ...


class ArchiveStore(Protocol):
    """The archiver's side of the state table: the candidates, its cursor row, the
    pointer from an archived order's id to its blob, and the purge of an order's rows."""

    async def candidates(
        self, cutoffs: Mapping[ProcessState, datetime], limit: int
    ) -> tuple[OrderProcess, ...]:
        """Up to `limit` orders in one of the cutoffs' states last changed before that
        state's cutoff, with their ETags, found through the rest index."""
        ...

    async def cursor(self) -> ArchiveCursor | None: ...

    async def put_cursor(self, cursor: ArchiveCursor, seen: ArchiveCursor | None) -> ArchiveCursor:
        """Write conditional on `seen` (None: that there is none yet); raises
        ConcurrencyConflict when it changed since. Returns it with its new ETag."""
        ...

    async def point(self, entry: ArchivedEntry) -> None:
        """Record (or replace) where an archived order's copy is."""
        ...

    async def pointer(self, order_id: str) -> str | None:
        """The blob holding the order's archive copy; None when it was never archived."""
        ...

    async def drop_pointer(self, order_id: str) -> None: ...

    async def pointers(
        self, limit: int, continuation: str | None
    ) -> tuple[tuple[ArchivedEntry, ...], str | None]:
        """A page of every archived order's pointer, and where the next goes on (the
        one-off backfill of marks: shared/usecases/history/archive_marks.py)."""
        ...

    async def mark(self, mark: ArchivedMark) -> bool:
        """Write the mark of an order archived before marks were kept, where no row holds
        its key; False when one does (its mark, or an order started under the id since)."""
        ...

    async def purge(self, mark: ArchivedMark, etag: str) -> bool:
        """Replace the order's state row by its `mark`, only at `etag`, then delete every
        other row of the order; False (nothing changed) when the state row changed since.
        A purge that finds the mark already there (a killed run's) deletes what is left."""
        ...


class ArchiveBlobs(Protocol):
    """The archive's pages: gzip JSON lines, one order a line, under `yyyy/mm/dd/`."""

    async def exists(self, name: str) -> bool: ...

    async def write(self, name: str, orders: Sequence[ArchivedOrder]) -> None:
        """Write (or overwrite) the whole page."""
        ...

    async def read(self, name: str) -> tuple[ArchivedOrder, ...]:
        """The page's orders; () when there is no such page."""
        ...

    async def pages(
        self, day: date, limit: int, continuation: str | None
    ) -> tuple[tuple[str, ...], str | None]:
        """Up to `limit` page names of one day, and where the next call goes on."""
        ...
