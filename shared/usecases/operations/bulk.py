"""Bulk actions: preview what a filter matches, start a durable job, and work the jobs a
page at a time from a timer.

A job never holds its orders in memory: it stores a cursor into the scan of one process
state at a time and reads the next page of `PAGE_SIZE` orders when it needs it. Each
order goes through the same use case as the single operator action, so a bulk cancel
is exactly N single cancels. At most once per order: the page about to be acted on is
written into the job (ETag-conditional) before its first action, and the cursor moves
past it only with the page's counters, in one conditional write after its last action.
A run that dies in between leaves that page in the job; the next run re-reads each of
its orders' history and skips those this job already acted on.

Runs never overlap: the host's timer lock holds within one process only, so a run first
takes the bulk lease (shared/usecases/operations/bulk_lease.py), and an instance that finds it held
passes. A page is only as large as the run can act on at its pace before its deadline
(shared/usecases/operations/bulk_pace.py), so a run ends within its budget and its lease.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import Enum
from typing import Final

from shared.catalogue.running import workflow_of
from shared.domain.bulk import (
    BulkJob,
    Cursor,
    JobState,
    Preview,
    acted_by,
    matches,
    needs_steps,
    states_to_scan,
)
from shared.domain.bulk_request import BulkAction, BulkRequest
from shared.domain.machine.transition import InvalidTransition
from shared.domain.model import OrderProcess
from shared.domain.workflow import Catalogue, Workflow
from shared.ports import BulkStore, BusUnavailable, ConcurrencyConflict, StateStoreError
from shared.telemetry.logsafe import app_logger
from shared.usecases.flow.deps import ProcessDeps
from shared.usecases.operations import bulk_lease
from shared.usecases.operations.bulk_lease import HeldLease
from shared.usecases.operations.bulk_pace import Pacer
from shared.usecases.operations.operator import (
    OrderNotFound,
    cancel_order,
    migrate_order,
    resubmit_order,
    resume_order,
    suspend_order,
)

log = app_logger("orders.bulk")

PAGE_SIZE: Final = 100
"""Orders read per page at most: one query, and the most one page may act on; fewer when
the run's pace leaves room for fewer before its deadline."""
RUN_BUDGET: Final = timedelta(seconds=20)
"""How long one timer run works before it stops between pages: far inside any
function time limit, and short enough that a deploy or scale-in loses little."""

_ACTIONS: Final[dict[BulkAction, Callable[[ProcessDeps, str, str], Awaitable[OrderProcess]]]] = {
    BulkAction.RESUBMIT: resubmit_order,
    BulkAction.CANCEL: cancel_order,
    BulkAction.SUSPEND: suspend_order,
    BulkAction.RESUME: resume_order,
}
"""The single action per bulk action; a migrate (which needs the job's target version)
goes through `migrate_order` instead."""


class BulkJobNotFound(LookupError):
    """No bulk job with this id."""


class Acted(Enum):
    """What acting on one order came to (not a reply's or a service's outcome)."""

    DONE = "done"
    SKIPPED = "skipped"
    FAILED = "failed"


@dataclass(frozen=True)
class BulkDeps:
    process: ProcessDeps
    jobs: BulkStore
    actions_per_second: float = 50.0


def _target(
    catalogue: Catalogue, action: BulkAction, workflow: str | None, to_version: int | None
) -> Workflow | None:
    """A migrate's target as this instance's catalogue has it (None: nothing matches)."""
    if action is not BulkAction.MIGRATE or workflow is None:
        return None
    return catalogue.get(workflow, to_version)


async def preview(deps: BulkDeps, request: BulkRequest) -> Preview:
    """Count what the action would act on (up to `limit`) and what it would cause; a
    read of the accepted states, a page at a time, that changes nothing (a resubmit's
    or a resume's from the rest entries alone). Orders the action would refuse (a
    migrate's incompatible ones) are counted apart."""
    found = Preview()
    cap = request.limit
    catalogue = deps.process.catalogue
    target = _target(catalogue, request.action, request.filter.workflow, request.to_version)
    whole = needs_steps(request.action)
    for state in states_to_scan(request.action, request.filter):
        continuation: str | None = None
        while cap is None or found.matched < cap:
            page = await deps.jobs.orders(
                state, PAGE_SIZE, continuation, request.filter, whole=whole
            )
            for process in page.items:
                workflow = workflow_of(catalogue, process.state)
                counted = found.consider(request.action, request.filter, process, workflow, target)
                if counted and cap is not None and found.matched >= cap:
                    break
            continuation = page.continuation
            if continuation is None:
                break
    return found


async def start_job(deps: BulkDeps, request: BulkRequest, operator: str) -> BulkJob:
    """Count the matches (the job acts on at most that many) and store the job; the
    timer does the work. A job that matches nothing is stored Done."""
    counted = await preview(deps, request)
    now = deps.process.clock.now()
    job = BulkJob(
        bulk_id=uuid.uuid4().hex,
        action=request.action,
        filter=request.filter,
        matched=counted.matched,
        created_at=now,
        updated_at=now,
        operator=operator,
        to_version=request.to_version,
        state=JobState.RUNNING if counted.matched else JobState.DONE,
    )
    etag = await deps.jobs.create_job(job)
    log.info("bulk %s %s: %d orders match %s", job.bulk_id, job.action, job.matched, job.filter)
    return replace(job, etag=etag)


async def job_status(deps: BulkDeps, bulk_id: str) -> BulkJob:
    job = await deps.jobs.load_job(bulk_id)
    if job is None:
        raise BulkJobNotFound(bulk_id)
    return job


async def work_jobs(deps: BulkDeps, budget: timedelta = RUN_BUDGET) -> int:
    """The timer's run: take the bulk lease, then work the Running jobs, oldest first,
    until `budget` is spent; another instance's run holding the lease means nothing to
    do. Returns how many orders were acted on (done, skipped or failed)."""
    clock = deps.process.clock
    started = clock.now()
    deadline = started + budget
    running = sorted(await deps.jobs.jobs(JobState.RUNNING), key=lambda j: j.created_at)
    if not running:
        return 0
    lease = await bulk_lease.take(
        deps.jobs, deps.process.instance_id, started, deadline + bulk_lease.GRACE
    )
    if lease is None:
        return 0
    pacer = Pacer(clock, deps.actions_per_second, deadline)
    acted = 0
    try:
        for job in running:
            if pacer.room() == 0:
                break
            acted += await work_job(deps, job.bulk_id, deadline, pacer, lease)
    finally:
        await lease.release(clock.now())
    return acted


async def work_job(
    deps: BulkDeps,
    bulk_id: str,
    deadline: datetime,
    pacer: Pacer | None = None,
    lease: HeldLease | None = None,
) -> int:
    """Page after page until the job is Done, the run has no room left for an action,
    the lease was lost, or another run changed the job first (a lost race: that run
    carries on)."""
    acted = 0
    pacer = pacer or Pacer(deps.process.clock, deps.actions_per_second, deadline)
    try:
        while (room := pacer.room()) > 0:
            if lease is not None and not await lease.renew():
                break
            job = await deps.jobs.load_job(bulk_id)
            if job is None or job.state is JobState.DONE:
                break
            if job.in_flight:
                acted += await _act_on_page(deps, job, pacer, replay=True)
                continue
            claimed = await _claim_next_page(deps, job, min(room, PAGE_SIZE))
            if claimed is None:
                break
            if claimed.in_flight:
                acted += await _act_on_page(deps, claimed, pacer, replay=False)
    except ConcurrencyConflict:
        log.info("bulk %s: another run changed the job first; leaving it to that run", bulk_id)
    return acted


async def _claim_next_page(deps: BulkDeps, job: BulkJob, size: int) -> BulkJob | None:
    """Read the next `size` orders and write which of them this run is about to act on.
    None: the job is Done now."""
    now = deps.process.clock.now()
    states = states_to_scan(job.action, job.filter)
    cursor = job.cursor
    if job.remaining == 0 or cursor.state_index >= len(states):
        done = job.finished(now)
        await deps.jobs.save_job(done)
        log.info(
            "bulk %s done: %d matched, %d done, %d skipped, %d failed",
            done.bulk_id,
            done.matched,
            done.done,
            done.skipped,
            done.failed,
        )
        return None
    try:
        page = await deps.jobs.orders(
            states[cursor.state_index], size, cursor.continuation, job.filter
        )
    except ValueError:
        log.warning("bulk %s: its cursor is no longer valid; the state is skipped", job.bulk_id)
        page = None
    if page is None or page.continuation is None:
        after = Cursor(cursor.state_index + 1, None)
    else:
        after = Cursor(cursor.state_index, page.continuation)
    catalogue = deps.process.catalogue
    target = _job_target(catalogue, job)
    chosen = tuple(
        p.order_id
        for p in (page.items if page else ())
        if matches(job.action, job.filter, p, workflow_of(catalogue, p.state), target)
    )[: job.remaining]
    if not chosen:
        changed = replace(job, cursor=after, updated_at=now)
        return replace(changed, etag=await deps.jobs.save_job(changed))
    claimed = replace(job, in_flight=chosen, next_cursor=after, updated_at=now)
    return replace(claimed, etag=await deps.jobs.save_job(claimed))


async def _act_on_page(deps: BulkDeps, job: BulkJob, pacer: Pacer, *, replay: bool) -> int:
    """Act on the claimed page at the run's pace, then store the counters and move the
    cursor past the page in one conditional write. A page the deadline cuts short (its
    actions ran slower than the pace) stays in flight for the next run's replay."""
    outcomes = {o: 0 for o in Acted}
    for order_id in job.in_flight:
        if not await pacer.turn():
            log.info(
                "bulk %s: the run's deadline came mid-page; the next run replays it", job.bulk_id
            )
            return sum(outcomes.values())
        outcomes[await _act(deps.process, job, order_id, replay=replay)] += 1
    now = deps.process.clock.now()
    finished = replace(
        job.counted(outcomes[Acted.DONE], outcomes[Acted.SKIPPED], outcomes[Acted.FAILED], now),
        cursor=job.next_cursor or job.cursor,
        in_flight=(),
        next_cursor=None,
    )
    await deps.jobs.save_job(finished)
    return len(job.in_flight)


def _job_target(catalogue: Catalogue, job: BulkJob) -> Workflow | None:
    return _target(catalogue, job.action, job.filter.workflow, job.to_version)


async def _act(deps: ProcessDeps, job: BulkJob, order_id: str, *, replay: bool) -> Acted:
    """The single action on one order, as the operator's own route would do it. An order
    that no longer matches (someone else moved it on) is skipped, not forced."""
    try:
        process = await deps.store.load(order_id)
        if process is None:
            return Acted.SKIPPED
        if replay:
            history = await deps.store.history(order_id)
            if acted_by((h.detail for h in history), job.actor):
                return Acted.DONE
        catalogue = deps.catalogue
        workflow = workflow_of(catalogue, process.state)
        if not matches(job.action, job.filter, process, workflow, _job_target(catalogue, job)):
            return Acted.SKIPPED
        if job.action is BulkAction.MIGRATE:
            assert job.to_version is not None, "parse_request requires it"
            await migrate_order(deps, order_id, job.actor, job.to_version)
        else:
            await _ACTIONS[job.action](deps, order_id, job.actor)
    except (InvalidTransition, OrderNotFound):
        return Acted.SKIPPED
    except BusUnavailable:
        # Stored; the order is on the watch list, so the Supervisor sends the nudge.
        return Acted.DONE
    except (StateStoreError, ConcurrencyConflict) as exc:
        log.warning("bulk %s: %s on order %s failed: %s", job.bulk_id, job.action, order_id, exc)
        return Acted.FAILED
    return Acted.DONE
