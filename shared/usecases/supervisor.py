"""The Supervisor: finds orders whose complete-by has passed and recovers each exactly once."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from shared.domain import process as machine
from shared.domain.health import SweepRecord
from shared.domain.model import ProcessState
from shared.ports import ConcurrencyConflict, HealthStore, WatchEntry
from shared.usecases.commit import commit
from shared.usecases.deps import ProcessDeps

log = logging.getLogger("orders.supervisor")


@dataclass
class SweepReport:
    due: int = 0
    requeued: int = 0
    errored: int = 0
    compensating: int = 0
    rescheduled: int = 0
    finished: int = 0
    lost_races: int = 0
    failed: int = 0
    recovered_orders: list[str] = field(default_factory=list)

    @property
    def recovered(self) -> int:
        return self.requeued + self.errored + self.compensating


async def sweep(deps: ProcessDeps, limit: int = 500, concurrency: int = 16) -> SweepReport:
    """Reads only the watch entries that are due, so a sweep costs what is in flight.

    Every change is conditional on the ETag read: two Supervisors racing on one order
    recover it once, and the loser moves on silently.
    """
    now = deps.clock.now()
    entries = await deps.store.due(now, limit)
    report = SweepReport(due=len(entries))
    gate = asyncio.Semaphore(concurrency)

    async def check(entry: WatchEntry) -> None:
        async with gate:
            try:
                await _check(deps, entry, report)
            except Exception as exc:  # one order's failure must not stop the sweep
                report.failed += 1
                log.warning(
                    "order %s supervisor check failed (%s: %s); it stays due for the next sweep",
                    entry.order_id,
                    type(exc).__name__,
                    exc,
                )

    await asyncio.gather(*(check(e) for e in entries))
    if report.recovered or report.lost_races:
        log.info(
            "supervisor sweep: %d due, %d requeued, %d to Error, %d compensating, %d lost races",
            report.due,
            report.requeued,
            report.errored,
            report.compensating,
            report.lost_races,
        )
    return report


async def supervise(deps: ProcessDeps, health: HealthStore) -> SweepReport:
    """One sweep, then a SweepRecord so operators can see the Supervisor is alive.

    The record is best effort: failing to write it is logged and the sweep's work
    stands, because recovering orders matters more than reporting on it.
    """
    started_at = deps.clock.now()
    report = await sweep(deps)
    record = SweepRecord(
        instance=deps.instance_id,
        started_at=started_at,
        finished_at=deps.clock.now(),
        due=report.due,
        requeued=report.requeued,
        errored=report.errored,
        compensating=report.compensating,
        rescheduled=report.rescheduled,
        finished=report.finished,
        lost_races=report.lost_races,
        failed=report.failed,
    )
    try:
        await health.record_sweep(record)
    except Exception as exc:  # any failure: the sweep itself has succeeded
        log.warning("supervisor sweep not recorded (%s: %s)", type(exc).__name__, exc)
    return report


async def _check(deps: ProcessDeps, entry: WatchEntry, report: SweepReport) -> None:
    process = await deps.store.load(entry.order_id)
    if process is None:
        # The submission died between the watch entry and the order rows.
        await deps.store.unwatch(entry.order_id)
        return
    if process.state.process_state.is_terminal:
        # The Scheduler stopped before it unwatched: resend the last outbox, then forget it.
        await deps.bus.send(process.state.outbox)
        await deps.store.unwatch(entry.order_id, process.state.version)
        report.finished += 1
        return
    now = deps.clock.now()
    transition = machine.recover(process, deps.policy, now)
    if transition is None:
        check_at = machine.next_check(process, deps.workflow(process), deps.policy, now)
        if check_at is not None:
            await deps.store.reschedule(entry, check_at)
            report.rescheduled += 1
        return
    try:
        recovered = await commit(deps, transition)
    except ConcurrencyConflict:
        report.lost_races += 1
        return
    report.recovered_orders.append(entry.order_id)
    state = recovered.state.process_state
    if state is ProcessState.ERROR:
        report.errored += 1
    elif recovered.state.phase is not process.state.phase:
        report.compensating += 1
    else:
        report.requeued += 1
    check_at = machine.next_check(recovered, deps.workflow(recovered), deps.policy, now)
    if check_at is not None:
        await deps.store.reschedule(entry, check_at)
